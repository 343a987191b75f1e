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
# # T3 — a larger model with and without DPPO
# The paper adds DPPO to larger models (Qwen3-8B, a ~30B MoE). At CPU scale the larger model is
# `embedded-large`: the embedded Qwen3 architecture with twice the depth (8 layers, 2.0 M parameters, about
# twice the parameters as 4B -> 8B), grown from the small one (each new layer starts as the identity) and warm-started further, so
# it starts where the small one is and moves ahead. Each model's DPPO
# run is compared with GRPO on the same model, in the short setup of T2/T4/T5. At paper scale
# (`experiments/paper/scale.yaml`): Qwen3-4B and Qwen3-8B with the paper's recipes.

# %% tags=["parameters"]
import os

configs = {}  # YAML files by row label or by the CPU config they replace (paper profile: its Qwen3 recipes)
overrides = {}  # TrainConfig fields for every run where valid (what is left out is reported): not a pruning
# field the row's pruner ignores, nor a field the row sets beyond the study setup (T4's stage, T5's rates, T2's algorithm)
large_model = "embedded-large"  # the larger model's model_name_or_path (paper scale: hf:Qwen/Qwen3-8B)
large_config = ""  # a YAML file whose fields the larger rows train with over every other (a model with its own
# prompt format or sampling: the real profile's Gemma 3, experiments/cpu/real_gemma_grpo.yaml); "": large_model alone
model_labels = ["embedded (1.0 M)", "embedded-large (2.0 M)"]  # the (small, large) models' names in the rows
seeds = [0]  # each run is trained once per seed (the real profile: studies.REAL_SEEDS)
launch = {}  # {accelerate_config, num_processes, launcher}: each run its own launched process group (dppo.launch); {}: in this process
results_dir = ""  # runs under <profile root>/results_dir (root: experiments/results, or .../paper),
# tables and figures in its figures/; "": the root, and figures/ (paper: figures/paper)
smoke = os.environ.get("DPPO_SMOKE") in ["1"]  # seconds-long sizes (the tests set DPPO_SMOKE to 1)
profile = "cpu"  # "paper": results under experiments/results/paper, tables and figures in figures/paper

# %%
from IPython.display import Markdown, display

from dppo import results, studies, tables

layout = studies.study_layouts("scale", configs=configs, overrides=overrides, large_model=large_model,
                               large_config=large_config, model_labels=model_labels)["T3"]
runs = results.run_layout(layout, seeds=seeds, smoke=smoke, launch=launch, root=results_dir, profile=profile,
                          baseline=studies.TABLES["T3"].baseline)  # a run with its baseline, where they fit
out = results.figures_dir(results_dir, smoke, profile)
small, large = model_labels
t3 = tables.build(studies.TABLES["T3"], layout, runs, out, profile)  # each DPPO against its model's GRPO
display(Markdown((out / "T3_scale.md").read_text()))

# %% [markdown]
# ## What these runs show beside the paper
# Before RL the larger model must already be at least as good as the small one (its warm start grows it from the
# small one: `dppo.model`), so the table compares two sizes, not two recipes. Then each size's DPPO against its GRPO.

# %%
start = t3["acc/start"]
display(Markdown(f"- Before RL: {large} {start[f'GRPO, {large}']:.1f}% vs {small} "
                 f"{start[f'GRPO, {small}']:.1f}% (held-out Pass@1, same problems).\n"
                 + tables.sentences(t3, studies.TABLES["T3"].baselines(layout), "T3")))

# %%
# The larger rows ran the larger model: its rollout FLOPs per generated token exceed the small model's by its share of
# extra parameters (embedded-large: twice the layers, 1.96x the FLOPs a token; Qwen3-8B / 4B: about 2x).
assert len(t3) == 4 and (out / "T3_scale.md").is_file()
per_token = {label: float((lambda m: m["flops/rollout"].sum() / m["tokens/generated"].sum())(
    results.load_run(dirs[0]).query("step > 0"))) for label, dirs in runs.items()}
for method in ("GRPO", "DPPO"):
    assert per_token[f"{method}, {large}"] > 1.5 * per_token[f"{method}, {small}"], per_token
# Before RL embedded-large, grown from the small model (function-preserving) and trained further, is at least as
# accurate: a statistical claim about the two models that 4 smoke problems cannot decide, so checked at full size.
if not smoke and profile == "cpu":
    assert start[f"GRPO, {large}"] >= start[f"GRPO, {small}"], start
