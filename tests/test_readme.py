"""The README a newcomer reads: at most 10 KB, its links resolve, and its results table is exactly the one generated
from the committed tables `figures/T*.csv` (`python -m dppo.readme`), so the two cannot drift apart."""

import re
from pathlib import Path

from dppo.readme import BEGIN, END, results_table, with_table

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_results_table_is_generated_from_the_figures_tables():
    assert README.count(BEGIN) == 1 and README.count(END) == 1
    assert with_table(README, results_table()) == README, "README's table differs: run `python -m dppo.readme`"


def test_results_table_carries_every_tables_numbers(tmp_path):
    """Changing one number in a figures CSV changes the table (it is read, not copied)."""
    import shutil

    import pandas as pd

    for f in (ROOT / "figures").glob("*.csv"):
        shutil.copy(f, tmp_path / f.name)
    edits = {"T1_main_results.csv": ("label", "DPPO", "speedup", 9.87, "9.87x"),
             "F3_gradient_variance.csv": ("estimator", "DPPO (r_q = r_o = r)", "variance_rel", 8.76, "8.76"),
             "F3_gradient_variance_proportional.csv": ("rule", "proportional, logit_rms, mix 0.25", "median", 7.65,
                                                      "7.65x the uniform"),
             "F4_packing.csv": ("layout", "shared C=256", "speedup_vs_padded", 6.54, "6.54x (shared)")}
    for name, (key, row, column, value, shown) in edits.items():
        df = pd.read_csv(tmp_path / name)
        df.loc[df[key] == row, column] = value
        df.to_csv(tmp_path / name, index=False)
        assert shown in results_table(tmp_path) and shown not in results_table(), name


def test_readme_is_short_and_its_links_resolve():
    assert len(README.encode()) <= 10 * 1024, len(README.encode())
    links = re.findall(r"\]\(([^)#]+)\)", README)
    assert links and all((ROOT / link).exists() for link in links), [x for x in links if not (ROOT / x).exists()]
    for needed in ("## Install", "## Quick start", "## Train on your own data", "./reproduce.sh", "./run_tests.sh"):
        assert needed in README
