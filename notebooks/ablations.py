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
# # T4 and T5 — ablations and the r_q x r_o sensitivity grid
# T4: DPPO with only the prompt stage, only the completion stage, both; without the 1/pi weights (biased
# DPPO); without Dense Prompt Packing. T5: a 3 x 3 grid of prompt and completion pruning rates (the paper
# scale grid is {0.3, 0.5, 0.7, 0.9}^2; pass `rates` to change it). All short CPU-scale runs.

# %% tags=["parameters"]
import os

rates = [0.3, 0.5, 0.7]  # r_q and r_o of the T5 grid
overrides = {}  # TrainConfig fields applied to every run (paper scale: model, data, setup)
launch = {}  # {accelerate_config, num_processes}: each run as its own `accelerate launch` (dppo.launch); {} = in this process
results_dir = ""  # root of the run folders ("" = experiments/results; the paper profile: experiments/results/paper/<study>)
smoke = os.environ.get("DPPO_SMOKE") == "1"

# %%
from pathlib import Path

while not (Path.cwd() / "experiments").is_dir():
    os.chdir("..")
from dppo import report

if smoke:
    rates = [0.5]
out = report.figures_dir(smoke)
layouts = report.study_layouts("ablations", overrides=overrides, rates=rates)
runs4 = report.run_layout(layouts["T4"], smoke=smoke, launch=launch, root=results_dir)
t4 = report.table(runs4, "GRPO", "T4_ablations", report.SHORT_CAPTION, "T4", out)
t4.round(3)

# %%
runs5 = report.run_layout(layouts["T5"], smoke=smoke, launch=launch, root=results_dir)
t5 = report.table(runs5, "GRPO", "T5_sensitivity", report.SHORT_CAPTION + f" Grid r_q, r_o in {rates}.", "T5", out)
fig = report.figure_t5(t5, rates, out=out)
t5.round(3)

# %%
assert {"prompt stage only", "completion stage only", "without 1/pi weights"} <= set(t4.index)
nopack = report.load_run(runs4["without Dense Prompt Packing"])
full = report.load_run(runs4["DPPO (prompt + completion, 1/pi, packing)"])
assert full["density/valid_token"].iloc[1:].mean() > nopack["density/valid_token"].iloc[1:].mean()
assert len(t5) == 1 + len(rates) ** 2
