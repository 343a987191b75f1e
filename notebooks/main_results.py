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
# # T1 and F2 — main results: GRPO, GRESO, CPPO and DPPO
# Trains the four methods from `experiments/cpu/*.yaml` (the same setup; only the pruner differs; DPPO
# includes Dense Prompt Packing), then writes table T1 (time, speed-up, six splits, average) and figure F2
# (accuracy and reward against training wall-clock). At paper scale, point `configs` at
# `experiments/paper/*.yaml` (Qwen3-4B/8B, MATH) on GPUs.

# %% tags=["parameters"]
import os

configs = {}  # {label: yaml} to replace the CPU-scale configs of T1 (e.g. paper scale)
overrides = {}  # TrainConfig fields applied to every run
launch = {}  # {accelerate_config, num_processes}: each run as its own `accelerate launch` (dppo.launch); {} = in this process
results_dir = ""  # root of the run folders ("" = experiments/results; the paper profile: experiments/results/paper/<study>)
smoke = os.environ.get("DPPO_SMOKE") == "1"

# %%
from pathlib import Path

while not (Path.cwd() / "experiments").is_dir():
    os.chdir("..")
from dppo import report

layout = report.study_layouts("main_results", configs=configs, overrides=overrides)["T1"]
runs = report.run_layout(layout, smoke=smoke, launch=launch, root=results_dir)

# %%
out = report.figures_dir(smoke)
t1 = report.table(runs, "GRPO", "T1_main_results", report.T1_CAPTION, "T1", out)
t1.round(3)

# %%
fig = report.figure_f2(runs, out=out)

# %%
for label, d in runs.items():
    m = report.load_run(d)
    assert (d / "final" / "model.safetensors").is_file() and "eval/avg" in m, label
dppo = report.load_run(runs["DPPO"])
assert (dppo["weights/mean"][dppo["step"] > 0] >= 1.0 - 1e-6).all()  # 1/pi weights are >= 1
assert all((out / f"{n}.{e}").is_file() for n, e in [("T1_main_results", "csv"), ("T1_main_results", "md"),
                                                     ("F2_training_curves", "png"), ("F2_training_curves", "pdf")])
