"""The README a newcomer reads: at most 10 KB, its links resolve, and its results tables are exactly the ones generated
from the committed tables (`figures/real/*.csv` in the README, `figures/*.csv` in docs/results.md; `python -m
dppo.readme`), so the pages and the tables cannot drift apart."""

import re
from pathlib import Path

import numpy as np

from dppo.readme import README_TABLES, REAL_BEGIN, blocks, results_table, with_table

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_results_table_is_generated_from_the_figures_tables():
    """README.md carries the real model's main table and where it comes from (figures/real/), docs/results.md every
    real table and the embedded default's (figures/), each block exactly as generated; the embedded one has every table
    and figure row of the registry."""
    from dppo.studies import TABLES

    for page, begin, end, text in blocks():
        page_text = (ROOT / page).read_text()
        assert page_text.count(begin) == 1 and page_text.count(end) == 1, page
        assert with_table(page_text, text, begin, end) == page_text, f"{page}'s block differs: run `python -m dppo.readme`"
    embedded = results_table(ROOT / "figures")
    assert all(f"| {key} |" in embedded for key in [*TABLES, "F3", "F4"])
    real = results_table(ROOT / "figures" / "real", README_TABLES)
    assert "| T1 |" in real and "Pass@1 over seeds: GRPO" in real and README.index(REAL_BEGIN) < README.index("## Train")
    assert "| T2 |" not in real and "Provenance: T1 (" in README


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
             "F4_packing.csv": ("layout", "shared C=256", "speedup_vs_padded", 6.54, "6.54x (shared)"),
             "T2_algorithms.csv": ("label", "GRPO + DPPO", "contended", 1, "wall (0 seeds: 1 contended)")}
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


def _table(gains: list[float], starts: list[float], finals: list[float], speedups: list[float]):
    """A summary and per-seed frame of a two-row table (GRPO, DPPO) from per-seed numbers."""
    import pandas as pd

    from dppo.tables import aggregate

    rows = [{"label": "GRPO", "seed": s, "acc/avg": f, "acc/start": a, "acc_gain": 0.0, "speedup": 1.0, "speedup_cpu": 1.0}
            for s, (a, f) in enumerate(zip(starts, finals))]
    rows += [{"label": "DPPO", "seed": s, "acc/avg": f + g, "acc/start": a, "acc_gain": g, "speedup": sp, "speedup_cpu": sp}
             for s, (a, f, g, sp) in enumerate(zip(starts, finals, gains, speedups))]
    seeds = pd.DataFrame(rows)
    return aggregate(seeds.assign(contended=False, pair_contended=False)), seeds


def test_verdict_is_not_drawn_when_the_baseline_did_not_learn():
    """The README's verdict words follow docs/method.md §6.3 (dppo.verdicts), on per-seed tables built here."""
    from dppo.readme import learning, verdict

    # GRPO learned (+10, +12, +11 points), DPPO's gain within noise of 0 and above -5: accuracy kept, margin stated
    summary, seeds = _table([1.0, -1.0, 0.5], [20, 22, 21], [30, 34, 32], [1.8, 1.9, 2.0])
    assert verdict(summary, seeds, "DPPO", "GRPO") == "faster, accuracy kept (lower bound -2.4 > -5 points)"
    assert learning(seeds, ["GRPO"]) == "learned: GRPO +11.0 ± 2.5"
    # the same DPPO gains, but GRPO's final accuracy is its start give or take noise: no accuracy verdict, and GRPO is
    # not listed as having learned (the old page printed "learned: GRPO +0.3 ± 7.6" here)
    summary, seeds = _table([1.0, -1.0, 0.5], [20, 22, 21], [23, 19, 22], [1.8, 1.9, 2.0])
    assert verdict(summary, seeds, "DPPO", "GRPO") == "faster, accuracy not compared (baseline did not learn)"
    assert learning(seeds, ["GRPO"]) == "GRPO +0.3 ± 7.6: did not learn resolvably"
    assert learning(seeds, ["GRPO", "X"]).startswith("GRPO +0.3 ± 7.6: did not learn resolvably; X ")
    # a learning baseline and a clearly lower DPPO; a speed-up whose interval holds 1 (neither faster nor slower),
    # then one below 1
    summary, seeds = _table([-5.0, -6.0, -5.5], [20, 22, 21], [30, 34, 32], [0.8, 1.3, 1.0])
    assert verdict(summary, seeds, "DPPO", "GRPO") == "speed unresolved, accuracy lower"
    summary, seeds = _table([-5.0, -6.0, -5.5], [20, 22, 21], [30, 34, 32], [0.8, 0.85, 0.82])
    assert verdict(summary, seeds, "DPPO", "GRPO") == "slower, accuracy lower"
    # a gain interval that holds 0 but also losses of more than 5 points: not "kept", and the seeds a 5-point
    # difference needs at 80% power (paired t, noncentral: s.d. 10.97 from 3 seeds, so 'rough')
    summary, seeds = _table([9.0, -12.0, 4.0], [20, 22, 21], [30, 34, 32], [1.8, 1.9, 2.0])
    said = verdict(summary, seeds, "DPPO", "GRPO")
    assert said.startswith("faster, accuracy unresolved; 40 seeds for 80% power at ±5 points (rough: s.d. 11.0 from 3 "
                           "seeds; "), said
    # a narrow interval whose lower bound is below -5 (the old rule called it "kept": half-width 4.4 <= 5)
    summary, seeds = _table([-0.2, -3.8, -2.0], [20, 22, 21], [30, 34, 32], [1.8, 1.9, 2.0])
    assert summary.loc["DPPO", "acc_gain_ci"] <= 5 and verdict(summary, seeds, "DPPO", "GRPO").startswith(
        "faster, accuracy unresolved")


def test_verdict_higher_and_one_seed():
    """The branches the test above leaves: a gain interval above 0 ("higher"), and one seed (no interval: no accuracy
    verdict, the speed-up judged by its value and said to be one seed's)."""
    from dppo.readme import verdict

    summary, seeds = _table([5.0, 6.0, 5.5], [20, 22, 21], [30, 34, 32], [1.8, 1.9, 2.0])
    assert verdict(summary, seeds, "DPPO", "GRPO") == "faster, accuracy higher"
    summary, seeds = _table([5.0], [20], [30], [1.2])
    one = "accuracy not compared (one seed: the baseline's learning has no interval)"
    assert verdict(summary, seeds, "DPPO", "GRPO") == f"faster in 1 seed, {one}"
    summary, seeds = _table([5.0], [20], [30], [0.9])
    assert verdict(summary, seeds, "DPPO", "GRPO") == f"not faster in 1 seed, {one}"


def test_every_stated_model_size_is_counted_from_the_weights():
    """Every 'N M' parameter count in the README, docs, notebooks, library, benches and committed tables is one the
    weights give: the shipped embedded models' (`studies.model_size`, read from their safetensors), SmolLM2's
    134.5 M or Gemma 3's 268.1 M (tests/test_real_model.py counts their de-quantised parameters). A stale size (the docs once said 0.8 M for
    1,033,088 parameters) fails here."""
    from dppo.studies import model_size

    sizes = {model_size("embedded"), model_size("embedded-large"), "134.5 M", "268.1 M"}
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "notebooks").glob("*.py"),
             *(ROOT / "dppo").glob("*.py"), *(ROOT / "bench").glob("*.py"), *(ROOT / "figures").glob("*.md"),
             *(ROOT / "figures").glob("*.csv")]
    stated = {(f.relative_to(ROOT).as_posix(), m) for f in files
              for m in re.findall(r"(?<![\w.])\d+(?:\.\d+)? M\b", " ".join(f.read_text().split()))}
    assert {m for _, m in stated} >= {model_size("embedded"), model_size("embedded-large")}
    assert not {(f, m) for f, m in stated if m not in sizes}, sorted(stated)


def test_every_markdown_table_row_has_its_headers_cells():
    """A '|' inside a cell (|A|, a code span) splits it unless escaped (GitHub's tables): every row of every table in
    the README and docs/ has as many unescaped '|' as its header."""
    broken = []
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        header = None
        for number, line in enumerate(path.read_text().splitlines(), 1):
            cells = len(re.findall(r"(?<!\\)\|", line)) if line.startswith("|") else None
            header = None if cells is None else header or cells
            if cells is not None and cells != header:
                broken.append(f"{path.name}:{number}")
    assert not broken, broken


def test_contradictions_with_the_paper_are_stated_from_the_intervals():
    """'against the paper' appears exactly where a table's intervals over seeds contradict the paper's claim: a mean
    above DPPO's whose paired interval holds 0 (T1's CPPO in the committed figures: +1.7 ± 9.1), or one seed,
    contradicts nothing."""
    import pandas as pd

    from dppo.readme import against_paper, paired

    def seeds(acc: dict[str, list[float]]) -> pd.DataFrame:
        return pd.DataFrame([{"label": k, "seed": s, "acc/avg": a} for k, v in acc.items() for s, a in enumerate(v)])

    t1 = pd.DataFrame({"acc_gain": [0.0, 3.0, 2.0]}, index=["GRPO", "CPPO", "DPPO"])
    clear = seeds({"GRPO": [30, 31, 32], "CPPO": [36, 37, 38], "DPPO": [33, 34, 35]})  # CPPO - DPPO = 3, 3, 3
    assert paired(clear, "CPPO", "DPPO") == (3.0, 0.0, 3)
    assert against_paper("T1", t1, clear) == "against the paper: CPPO more accurate than DPPO by +3.0 ± 0.0 points " \
                                             "(paired, 3 seeds)"
    noisy = seeds({"GRPO": [30, 31, 32], "CPPO": [40, 30, 38], "DPPO": [33, 34, 35]})  # +7, -4, +3: holds 0
    assert paired(noisy, "CPPO", "DPPO")[0] > 0 and against_paper("T1", t1, noisy) == ""
    assert against_paper("T1", t1, seeds({"GRPO": [30], "CPPO": [40], "DPPO": [33]})) == ""  # one seed
    t3 = pd.DataFrame({"acc_gain": [0.0, 1.0, 0.0, -2.5], "acc_gain_ci": [0.0, 1.0, 0.0, 1.0]},
                      index=["GRPO, small", "DPPO, small", "GRPO, embedded-large", "DPPO, embedded-large"])
    assert "-2.5 ± 1.0 points" in against_paper("T3", t3, clear)
    assert against_paper("T3", t3.assign(acc_gain_ci=3.0), clear) == ""  # the interval holds 0
    assert against_paper("T3", t3.assign(acc_gain_ci=float("nan")), clear) == ""  # one seed
    grid = {f"r_q={rq}, r_o={ro}": 1 + rq + ro for rq in (0.3, 0.5) for ro in (0.3, 0.5)}
    t5 = pd.DataFrame({"speedup_flops": list(grid.values()), "speedup": list(grid.values())}, index=list(grid))
    assert against_paper("T5", t5, clear) == ""
    t5.loc["r_q=0.5, r_o=0.5", "speedup"] = 1.0  # a wall-clock dip: that cell ran in another group (not said)
    assert against_paper("T5", t5, clear) == ""
    t5.loc["r_q=0.5, r_o=0.5", "speedup_flops"] = grid["r_q=0.5, r_o=0.3"] * 0.998  # within one cell's rollout spread
    assert against_paper("T5", t5, clear) == ""
    t5.loc["r_q=0.5, r_o=0.5", "speedup_flops"] = 1.0
    assert "not monotone" in against_paper("T5", t5, clear) and "0.5, 0.5: 1.00x" in against_paper("T5", t5, clear)


def test_provenance_names_the_commit_that_measured_f3(tmp_path):
    """F3 trains no run: the commit in its CSV is its provenance; a CSV from before F3 recorded one says so."""
    import shutil

    import pandas as pd

    from dppo.readme import provenance

    figures = tmp_path / "real"
    shutil.copytree(ROOT / "figures" / "real", figures)
    f3 = pd.read_csv(figures / "F3_gradient_variance.csv").drop(columns="commit", errors="ignore")
    f3.to_csv(figures / "F3_gradient_variance.csv", index=False)
    assert "F3: measured before F3 recorded its commit" in provenance(figures)
    f3.assign(commit="0123abcd4567").to_csv(figures / "F3_gradient_variance.csv", index=False)
    assert "F3: measured at commit 0123abcd4567 (no runs" in provenance(figures)


def test_provenance_names_the_commit_f5_trained_at(tmp_path):
    """F5's runs keep no per-seed table: their trace names each run's commit, and the provenance line says it; a trace
    without commits (written before it carried them) says the runs did not record one, and no trace says nothing."""
    import pandas as pd

    from dppo.readme import provenance

    figures = tmp_path / "real"
    figures.mkdir()
    trace = pd.DataFrame({"seed": [0, 0, 1, 2], "method": ["GRPO", "DPPO", "GRPO", "DPPO"]})
    assert "F5" not in provenance(figures)
    trace.assign(commit=["0123abcd4567"] * 3 + ["89abcdef0123"]).to_csv(figures / "F5_case_study_trace.csv", index=False)
    assert "F5 (3 seeds): trained at commit 0123abcd4567, 89abcdef0123 (run logs under experiments/results/real/)" in \
        provenance(figures)
    trace.to_csv(figures / "F5_case_study_trace.csv", index=False)
    assert "F5 (3 seeds): trained before runs recorded their commit" in provenance(figures)


def test_a_row_that_makes_fewer_training_steps_than_its_baseline_says_so():
    """CPPO's allocation rolls out more prompts a step: half GRPO's optimizer steps, stated beside its speed-up (before:
    a speed-up and a gain with no word of it); a row within half a step of its baseline's says nothing."""
    import pandas as pd

    from dppo.readme import _run

    base = pd.Series({"steps": 16.0})
    row = dict(speedup=1.6, speedup_ci=0.1, speedup_flops=1.7, speedup_flops_ci=0.1, acc_gain=2.0, acc_gain_ci=3.0,
               seeds=3)
    assert "8 training steps to 16" in _run(pd.Series({**row, "steps": 8.0}), base)
    assert "training steps" not in _run(pd.Series({**row, "steps": 15.6}), base)
    assert "14.9 training steps to 16" in _run(pd.Series({**row, "steps": 14.857}), base)
