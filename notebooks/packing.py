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
# # F4 — Dense Prompt Packing: valid-token density and update throughput
# Runs `bench/packing.py` (padded vs packed forward+backward on the kept rows of a real DPPO step, side by
# side in one process), then plots valid-token density (non-padding tokens / token slots), loss-token
# density (completion tokens / slots) and update throughput for each layout. If the T1/T4 runs exist, the
# per-step density of DPPO with and without packing is shown too.

# %% tags=["parameters"]
import os

capacities = [128, 256, 512, 1024]  # packed row capacities C
reps = 5
smoke = os.environ.get("DPPO_SMOKE") == "1"

# %%
import subprocess
import sys
from pathlib import Path

import pandas as pd

while not (Path.cwd() / "experiments").is_dir():
    os.chdir("..")
from dppo import report

results_dir = report.results_root(smoke) / "packing"
results_dir.mkdir(parents=True, exist_ok=True)
cmd = [sys.executable, "bench/packing.py", "--csv", str(results_dir / "packing.csv"), "--reps", str(1 if smoke else reps),
       "--capacity", *map(str, capacities[:2] if smoke else capacities)] + (["--smoke"] if smoke else [])
print(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
bench = pd.read_csv(results_dir / "packing.csv")
bench

# %%
fig = report.figure_f4(results_dir, report.results_root(smoke), out=report.figures_dir(smoke))

# %%
packed = bench[bench["layout"] != "padded"]
assert (packed["valid_token_density"] > bench.loc[bench["layout"] == "padded", "valid_token_density"].item()).all()
if not smoke:
    assert bench.loc[bench["layout"] == "packed C=256", "valid_token_density"].item() >= 0.95
