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
# # One training run
# The building block the study notebooks and `reproduce.sh` call through papermill: train one config
# (fields of `dppo.config.TrainConfig`, overridable here) and show its curves and final accuracy.

# %% tags=["parameters"]
import os

config = "experiments/cpu/grpo.yaml"  # a YAML file of TrainConfig fields
output_dir = ""  # "": experiments/results/train/<config name>
overrides = {}  # any TrainConfig field: value
launch = {}  # {accelerate_config, num_processes, launcher}: each run its own launched process group (dppo.launch); {}: in this process
smoke = os.environ.get("DPPO_SMOKE") in ["1"]  # seconds-long run (tests)

# %%
from pathlib import Path

from dppo import results

output_dir = Path(output_dir or results.results_root(smoke) / "train" / Path(config).stem)
run_dir = results.run(config, output_dir, smoke=smoke, launch=launch, **overrides)
metrics = results.load_run(run_dir)
summary = results.summarize(run_dir)
print({k: round(v, 3) if isinstance(v, float) else v for k, v in summary.items()})

# %%
import matplotlib.pyplot as plt

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
train = metrics[metrics["step"] > 0]
ax1.plot(train["wall_s"], train["reward"].rolling(10, min_periods=1).mean())
ax1.set(xlabel="training wall-clock (s)", ylabel="mean reward (10-step avg)", title="reward")
evals = metrics.dropna(subset=["eval/avg"])
ax2.plot(evals["wall_s"], evals["eval/avg"], marker="o")
ax2.set(xlabel="training wall-clock (s)", ylabel="Pass@1, avg of the splits", title="held-out accuracy")
fig.tight_layout()

# %%
# the run trained what its config asked for: one metrics row per step, and final/ holds weights that moved away
# from the model it started from
import torch

from dppo.config import TrainConfig
from dppo.model import load_policy

cfg = TrainConfig.load(Path(run_dir) / "config.yaml")
assert summary["steps"] == (metrics["step"] > 0).sum() == metrics["step"].max() >= 1, summary
start, final = load_policy(cfg.model_name_or_path)[0], load_policy(str(Path(run_dir) / "final"))[0]
assert any(not torch.equal(a, b) for a, b in zip(start.parameters(), final.parameters()))
