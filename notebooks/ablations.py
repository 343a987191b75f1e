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
configs = {}  # YAML files by row label or by the CPU config they replace (paper profile: its Qwen3 recipes)
overrides = {}  # TrainConfig fields for every run where valid (what is left out is reported): not a pruning
# field the row's pruner ignores, nor a field the row sets beyond the study setup (T4's stage, T5's rates, T2's algorithm)
launch = {}  # {accelerate_config, num_processes, launcher}: each run its own launched process group (dppo.launch); {}: in this process
results_dir = ""  # runs under <profile root>/results_dir (root: experiments/results, or .../paper),
# tables and figures in its figures/; "": the root, and figures/ (paper: figures/paper)
smoke = os.environ.get("DPPO_SMOKE") in ["1"]  # seconds-long sizes (the tests set DPPO_SMOKE to 1)
profile = "cpu"  # "paper": results under experiments/results/paper, tables and figures in figures/paper
seeds = [0]  # each run is trained once per seed (the real profile: studies.REAL_SEEDS)

# %%
from IPython.display import Markdown, display

from dppo import figures, results, studies, tables

if smoke:
    rates = list(studies.T5_SMOKE_RATES)
out = results.figures_dir(smoke, profile, results_dir)
layouts = studies.study_layouts("ablations", configs=configs, overrides=overrides, rates=rates)
# both tables' runs of a seed train in turn, step by step (one group): every speed-up meets its baseline's load
runs = results.run_layout({**layouts["T4"], **layouts["T5"]}, seeds=seeds, smoke=smoke, launch=launch,
                          root=results_dir, profile=profile)
runs4, runs5 = ({label: runs[label] for label in layouts[t]} for t in ("T4", "T5"))
t4 = tables.build(studies.TABLES["T4"], layouts["T4"], runs4, out, profile)  # the registry's recipe (studies.Table)
display(Markdown((out / "T4_ablations.md").read_text()))

# %%
t5 = tables.build(studies.TABLES["T5"], layouts["T5"], runs5, out, profile)
display(Markdown((out / "T5_sensitivity.md").read_text()))
fig = figures.figure_t5(t5, rates, out=out)

# %% [markdown]
# ## What these runs show beside the paper
# Each ablation and each grid cell against GRPO, computed from the tables above. One seed: a speed-up is one
# paired measurement (its runs trained in turn, step by step, on one layout), and an accuracy difference of a few
# points is within the seed-to-seed spread (T1's 3 seeds).

# %%
full = "DPPO (prompt + completion, 1/pi, packing)"
sp = t4["speedup"]
display(Markdown(
    f"- Speed-up of the full method {sp[full]:.2f}x; prompt stage alone {sp['prompt stage only']:.2f}x, "
    f"completion stage alone {sp['completion stage only']:.2f}x; without Dense Prompt Packing "
    f"{sp['without Dense Prompt Packing']:.2f}x.\n"
    f"- Grid: speed-up from {t5['speedup'].drop('GRPO').min():.2f}x to {t5['speedup'].drop('GRPO').max():.2f}x "
    f"(highest at {t5['speedup'].drop('GRPO').idxmax()}).\n" + tables.sentences(t4, "GRPO", "T4")))

# %%
assert {"prompt stage only", "completion stage only", "without 1/pi weights"} <= set(t4.index)
# without Dense Prompt Packing is DPPO without refill on the same layout: each step covers at most prompts_per_step
# prompts and rolls out what its prune left of them; refill covers more prompts a step where it pruned (when the epoch
# has more to take), so over the same epochs it takes no more steps
no_refill = results.load_run(runs4["without Dense Prompt Packing"][0]).query("step > 0")
refill = results.load_run(runs4[full][0]).query("step > 0")
per_step = results.load_run(runs4["GRPO"][0]).query("step > 0")["prompts/covered"].max()
assert (no_refill["prompts/covered"] <= per_step).all(), no_refill["prompts/covered"]
assert len(refill) <= len(no_refill), (len(refill), len(no_refill))
assert len(t5) == 1 + len(rates) ** 2
# each ablation does what its label says, at every step: one stage only prunes only at that stage; without 1/pi the
# kept rows weigh exactly 1
steps = {label: results.load_run(dirs[0]).query("step > 0") for label, dirs in runs4.items()}
prompt_only, completion_only = steps["prompt stage only"], steps["completion stage only"]
assert (prompt_only.query("`kept/prompt_frac` > 0")["kept/completion_frac"] == 1.0).all(), prompt_only
assert (completion_only["kept/prompt_frac"] == 1.0).all(), completion_only
assert (steps["without 1/pi weights"]["weights/max"] <= 1.0).all()
assert any((steps[k]["weights/max"] > 1.0).any() for k in (full, "prompt stage only", "completion stage only"))
