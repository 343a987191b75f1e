# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # T5 — the r_q x r_o sensitivity grid
# DPPO at every pair of prompt and completion pruning rates of a 3 x 3 grid (the paper-scale grid is
# {0.3, 0.5, 0.7, 0.9}^2; pass `rates` to change it), against GRPO. Short CPU-scale runs. The baseline and the
# r_q = r_o = 0.5 cell are T4's GRPO and DPPO (`notebooks/ablations.ipynb`): whichever of the two studies runs first
# trains them, the other finds them finished.

# %% tags=["parameters"]
import os

rates = [0.3, 0.5, 0.7]  # r_q and r_o of the grid
configs = {}  # YAML files by row label or by the CPU config they replace (paper profile: its Qwen3 recipes)
overrides = {}  # TrainConfig fields for every run where valid (what is left out is reported): not a pruning
# field the row's pruner ignores, nor a field the row sets beyond the study setup (the grid's rates)
launch = {}  # {accelerate_config, num_processes, launcher}: each run its own launched process group (dppo.launch); {}: in this process
results_dir = ""  # runs under <profile root>/results_dir (root: experiments/results, or .../paper),
# tables and figures in its figures/; "": the root, and figures/ (paper: figures/paper)
smoke = os.environ.get("DPPO_SMOKE") in ["1"]  # seconds-long sizes (the tests set DPPO_SMOKE to 1)
profile = "cpu"  # "paper": results under experiments/results/paper, tables and figures in figures/paper
seeds = [0]  # each run is trained once per seed (the real profile: studies.REAL_SEEDS)

# %%
import yaml
from IPython.display import Markdown, display

from dppo import figures, results, studies, tables

if smoke:
    rates = list(studies.T5_SMOKE_RATES)
out = results.figures_dir(results_dir, smoke, profile)
layout = studies.study_layouts("sensitivity", configs=configs, overrides=overrides, rates=rates)["T5"]
# a seed's runs train in turn, step by step, as many together as fit in memory: a wall-clock speed-up is paired only
# within a group, so a group of GRPO's rows without GRPO also trains GRPO's timing twin (docs/engineering.md §5.1)
runs = results.run_layout(layout, seeds=seeds, smoke=smoke, launch=launch, root=results_dir, profile=profile,
                          baseline=studies.TABLES["T5"].baseline)  # a run with its baseline (or its twin)
t5 = tables.build(studies.TABLES["T5"], layout, runs, out, profile)  # the registry's recipe (studies.Table)
display(Markdown((out / "T5_sensitivity.md").read_text()))
fig = figures.figure_t5(t5, rates, out=out)

# %% [markdown]
# ## What these runs show beside the paper
# Each cell against GRPO, computed from the table above; its intervals count the seeds it has.

# %%
cells = t5["speedup"].drop("GRPO")
display(Markdown(f"- Speed-up from {cells.min():.2f}x to {cells.max():.2f}x (highest at {cells.idxmax()}).\n"
                 + tables.sentences(t5, "GRPO", "T5")))

# %%
assert len(t5) == 1 + len(rates) ** 2
# every cell trained at the rates its label names, whatever `overrides` or `configs` say (a study-wide rate is not
# applied to a row that sets its own: studies.row_overrides)
for label, dirs in runs.items():
    if label.startswith("r_q="):
        want = {f"{k}_prune_rate": float(v) for k, v in (part.split("=") for part in label.split(", "))
                for k in [{"r_q": "prompt", "r_o": "completion"}[k]]}
        for run_dir in dirs:
            cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
            assert {k: cfg[k] for k in want} == want, (run_dir, want)
