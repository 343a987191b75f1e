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
# # T3 — a larger model with and without DPPO
# The paper adds DPPO to larger models (Qwen3-8B, a ~30B MoE). At CPU scale the larger model is
# `embedded-large`: the embedded Qwen3 architecture with twice the depth (8 layers, 1.6 M parameters, about
# twice the parameters as 4B -> 8B), built and warm-started locally with the same recipe. Each model's DPPO
# run is compared with GRPO on the same model, in the short setup of T2/T4/T5. At paper scale pass
# `overrides={"model_name_or_path": "hf:Qwen/Qwen3-8B", ...}` or the configs under `experiments/paper/`.

# %% tags=["parameters"]
import os

overrides = {}  # applied to every run (paper scale: the base model, data and setup)
large_model = "embedded-large"  # the larger model's model_name_or_path (paper scale: hf:Qwen/Qwen3-8B)
launch = {}  # {accelerate_config, num_processes}: each run as its own `accelerate launch` (dppo.launch); {} = in this process
results_dir = ""  # root of the run folders ("" = experiments/results; the paper profile: experiments/results/paper/<study>)
smoke = os.environ.get("DPPO_SMOKE") == "1"

# %%
from pathlib import Path

while not (Path.cwd() / "experiments").is_dir():
    os.chdir("..")
from dppo import report

if smoke:  # the larger model takes minutes to build: smoke runs use the small one for both rows
    large_model = "embedded"
layout = report.study_layouts("scale", overrides=overrides, large_model=large_model)["T3"]
runs = report.run_layout(layout, smoke=smoke, launch=launch, root=results_dir)
out = report.figures_dir(smoke)
t3 = report.table_t3(runs, out)
t3.round(3)

# %%
assert len(t3) == 4 and (out / "T3_scale.md").is_file()
assert (t3["speedup"] > 0).all()
