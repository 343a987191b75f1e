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
# # T4 — DPPO's ablations
# DPPO with only the prompt stage, only the completion stage, both; without the 1/pi weights; without Dense Prompt
# Packing; with proportional inclusion at the same budget. Short CPU-scale runs. Its GRPO and DPPO are also T5's
# baseline and r_q = r_o = 0.5 cell (`notebooks/sensitivity.ipynb`): whichever of the two runs first trains them.

# %% tags=["parameters"]
import os

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

from dppo import results, studies, tables

out = results.figures_dir(results_dir, smoke, profile)
layout = studies.study_layouts("ablations", configs=configs, overrides=overrides)["T4"]
# a seed's runs train in turn, step by step, as many together as fit in memory: a wall-clock speed-up is paired only
# within a group, so a group of GRPO's rows without GRPO also trains GRPO's timing twin (docs/engineering.md §5.1)
runs4 = results.run_layout(layout, seeds=seeds, smoke=smoke, launch=launch, root=results_dir, profile=profile,
                           baseline=studies.TABLES["T4"].baseline)  # a run with its baseline (or its twin)
t4 = tables.build(studies.TABLES["T4"], layout, runs4, out, profile)  # the registry's recipe (studies.Table)
display(Markdown((out / "T4_ablations.md").read_text()))

# %% [markdown]
# ## What these runs show beside the paper
# Each ablation against GRPO, computed from the table above. With one seed a speed-up is one paired measurement
# (its runs trained in turn, step by step, on one layout), and an accuracy difference of a few points is within the
# seed-to-seed spread (T1's 3 seeds); the table's intervals count the seeds it has.

# %%
full = "DPPO (prompt + completion, 1/pi, packing)"
sp = t4["speedup"]
display(Markdown(
    f"- Speed-up of the full method {sp[full]:.2f}x; prompt stage alone {sp['prompt stage only']:.2f}x, "
    f"completion stage alone {sp['completion stage only']:.2f}x; without Dense Prompt Packing "
    f"{sp['without Dense Prompt Packing']:.2f}x.\n" + tables.sentences(t4, "GRPO", "T4")))

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
# each ablation does what its label says, at every step: one stage only prunes only at that stage; without 1/pi the
# kept rows weigh exactly 1
steps = {label: results.load_run(dirs[0]).query("step > 0") for label, dirs in runs4.items()}
prompt_only, completion_only = steps["prompt stage only"], steps["completion stage only"]
assert (prompt_only.query("`kept/prompt_frac` > 0")["kept/completion_frac"] == 1.0).all(), prompt_only
assert (completion_only["kept/prompt_frac"] == 1.0).all(), completion_only
assert (steps["without 1/pi weights"]["weights/max"] <= 1.0).all()
assert any((steps[k]["weights/max"] > 1.0).any() for k in (full, "prompt stage only", "completion stage only"))
