# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Every table and figure from stored results (no training)
# Rebuilds T1-T5 and F1-F5 (docs/method.md §6) from the run folders under `experiments/results/` (or `results`, e.g.
# results computed on a GPU cluster and copied here) in seconds. Items whose runs are missing are listed
# and skipped.

# %% tags=["parameters"]
import os

results = "experiments/results"
smoke = os.environ.get("DPPO_SMOKE") == "1"

# %%
from pathlib import Path

import pandas as pd

while not (Path.cwd() / "experiments").is_dir():
    os.chdir("..")
from dppo import report

root = report.results_root(True) if smoke else Path(results)
out = report.figures_dir(smoke)
missing = []


def have(layout):
    runs = report.runs_of(layout, root)
    gone = [str(d) for d in runs.values() if not (d / "metrics.jsonl").is_file()]
    missing.extend(gone)
    return runs if not gone else None


report.figure_f1(out=out)
if runs := have(report.T1_RUNS):
    report.table(runs, "GRPO", "T1_main_results", report.T1_CAPTION, "T1", out)
    report.figure_f2(runs, out=out)
if runs := have(report.T2_RUNS):
    report.table_t2(runs, out)
if runs := have(report.T3_RUNS):
    report.table_t3(runs, out)
if runs := have(report.T4_RUNS):
    report.table(runs, "GRPO", "T4_ablations", report.SHORT_CAPTION, "T4", out)
if runs := have(report.T5_RUNS):
    t5 = report.table(runs, "GRPO", "T5_sensitivity", report.SHORT_CAPTION + f" Grid r_q, r_o in {list(report.T5_RATES)}.",
                      "T5", out)
    report.figure_t5(t5, report.T5_RATES, out=out)
if (root / "gradient_variance" / "variance.csv").is_file():
    report.figure_f3(root / "gradient_variance", out=out)
else:
    missing.append(str(root / "gradient_variance"))
if (root / "packing" / "packing.csv").is_file():
    report.figure_f4(root / "packing", root, out=out)
else:
    missing.append(str(root / "packing"))
if (root / "case_study.csv").is_file():
    report.figure_f5(pd.read_csv(root / "case_study.csv"), out=out)
else:
    missing.append(str(root / "case_study.csv"))
print("missing (skipped):", missing or "none")
written = sorted(p.name for p in out.iterdir())
print(written)

# %%
assert (out / "F1_method_overview.png").is_file()
if not smoke:
    assert not missing, missing
