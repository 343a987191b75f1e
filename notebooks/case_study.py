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
# # F5 — case study: one problem, each method's answers over training
# The paper follows one hard problem (a Cauchy-Schwarz problem) and shows CPPO and GRESO settling on a wrong
# answer while DPPO finds the right one. At CPU scale we take the hardest held-out split (`ood`, 7 operations),
# pick the problem whose answers differ most between methods at the end, and show, for each T1 method's
# checkpoints, the distribution of its sampled final answers (k samples per checkpoint).

# %% tags=["parameters"]
import os

samples = 32  # answers sampled per checkpoint
split = "ood"
smoke = os.environ.get("DPPO_SMOKE") == "1"

# %%
from pathlib import Path

while not (Path.cwd() / "experiments").is_dir():
    os.chdir("..")
from dppo import report

root = report.results_root(smoke)
runs = report.runs_of(report.T1_RUNS, root)
if smoke:
    samples = 4
    runs = {k: report.run(cfg, root / sub, smoke=True, **over) for k, (cfg, over, sub) in report.T1_RUNS.items()}
answers = report.case_study_answers(runs, split=split, samples=samples)
answers.to_csv(root / "case_study.csv", index=False)
answers.head(20)

# %%
fig = report.figure_f5(answers, out=report.figures_dir(smoke))

# %%
assert set(answers["method"]) == set(runs) and (answers["samples"] == samples).all()
assert (report.figures_dir(smoke) / "F5_case_study.png").is_file()
