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

    for f in (ROOT / "figures").glob("T*.csv"):
        shutil.copy(f, tmp_path / f.name)
    t1 = pd.read_csv(tmp_path / "T1_main_results.csv")
    t1.loc[t1["label"] == "DPPO", "speedup"] = 9.87
    t1.to_csv(tmp_path / "T1_main_results.csv", index=False)
    assert "9.87x" in results_table(tmp_path) and "9.87x" not in results_table()


def test_readme_is_short_and_its_links_resolve():
    assert len(README.encode()) <= 10 * 1024, len(README.encode())
    links = re.findall(r"\]\(([^)#]+)\)", README)
    assert links and all((ROOT / link).exists() for link in links), [x for x in links if not (ROOT / x).exists()]
    for needed in ("## Install", "## Quick start", "## Train on your own data", "./reproduce.sh", "./run_tests.sh"):
        assert needed in README
