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
# # T2 — generality: GRPO, DAPO and GSPO, each with and without DPPO
# The same short CPU-scale setup for each base algorithm (`algorithm` field: reward scaling, surrogate,
# aggregation and clip range from `dppo.config.ALGORITHMS`), with and without Dynamic Pruning Policy
# Optimization (DPPO includes Dense Prompt Packing). Every aggregation is exactly unbiased under DPPO
# (docs/method.md §2.6): DAPO's token-mean divides by the tokens of every rolled-out completion, with a
# prompt's last completion lengths standing in for the tokens of a prompt the prompt stage may prune.
# T3 (a larger model +- DPPO) is in `scale.ipynb`.

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
import pandas as pd
from IPython.display import Markdown, display

from dppo import results, studies, tables

layout = studies.study_layouts("algorithms", configs=configs, overrides=overrides)["T2"]
runs = results.run_layout(layout, seeds=seeds, smoke=smoke, launch=launch, root=results_dir, profile=profile,
                          baseline=studies.TABLES["T2"].baseline)  # a run with its baseline, where they fit
out = results.figures_dir(results_dir, smoke, profile)
t2 = tables.build(studies.TABLES["T2"], layout, runs, out, profile)  # each X + DPPO against X (dppo.studies.Table)
display(Markdown((out / "T2_algorithms.md").read_text()))

# %% [markdown]
# ## What these runs show beside the paper
# X + DPPO against X (the same algorithm without pruning), computed from the table above.

# %%
display(Markdown(tables.sentences(t2, studies.TABLES["T2"].baselines(layout), "T2")))

# %%
# GRPO and GSPO alone train every rolled-out row with weight 1 (trained tokens = generated tokens, every step); DAPO's
# dynamic sampling trains the informative groups of what it rolled out, unweighted (a step with none trains nothing);
# with DPPO each trains a strict subset re-weighted by 1/pi >= 1 (over the three algorithms' runs, no completion
# pruned at all has probability below 1e-9 at smoke size).
assert len(t2) == 6 and (out / "T2_algorithms.md").is_file()
with_dppo = []
for alg in ("GRPO", "DAPO", "GSPO"):
    base = results.load_run(runs[alg][0]).query("step > 0")
    if alg == "DAPO":
        assert (base["tokens/trained"] <= base["tokens/generated"]).all(), alg
        assert base["weights/max"].isin([0.0, 1.0]).all(), alg
    else:
        assert (base["tokens/trained"] == base["tokens/generated"]).all() and (base["weights/max"] == 1.0).all(), alg
    r = results.load_run(runs[f"{alg} + DPPO"][0]).query("step > 0")
    trained = r["kept/completion_frac"] > 0  # a step that kept nothing logs weights 0
    assert (r["weights/mean"][trained] >= 1.0 - 1e-6).all(), alg
    with_dppo.append(r)
with_dppo = pd.concat(with_dppo)
assert with_dppo["tokens/trained"].sum() < with_dppo["tokens/generated"].sum()
