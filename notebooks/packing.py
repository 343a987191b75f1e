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
# # F4 — Dense Prompt Packing: valid-token density and update throughput
# Runs `bench/packing.py` (padded vs packed forward+backward on the kept rows of a real DPPO step, side by
# side in one process), then plots valid-token density (non-padding tokens / token slots), loss-token
# density (completion tokens / slots) and update throughput for each layout. If the T1/T4 runs exist, the
# per-step density of DPPO with and without packing is shown too.

# %% tags=["parameters"]
import os

capacities = [128, 256, 512, 1024]  # packed row capacities C
reps = 5  # timed repetitions of each layout's forward and backward (their mean time is reported)
results_dir = ""  # results under <profile root>/results_dir (root: experiments/results, or .../paper):
# packing.csv in <...>/packing, F4 in <...>/figures (it reads T4's runs there); "": the root, and figures/
smoke = os.environ.get("DPPO_SMOKE") in ["1"]  # seconds-long sizes (the tests set DPPO_SMOKE to 1)
profile = "cpu"  # "paper": results under experiments/results/paper, tables and figures in figures/paper

# %%
import subprocess
import sys

import pandas as pd
from IPython.display import Markdown, display

from dppo import figures, results, studies

root = results.study_root(results_dir, smoke, profile)
data_dir = root / "packing"
data_dir.mkdir(parents=True, exist_ok=True)
cmd = [sys.executable, str(studies.ROOT / "bench" / "packing.py"), "--csv", str(data_dir / "packing.csv"), "--reps", str(1 if smoke else reps),
       "--capacity", *map(str, capacities[:2] if smoke else capacities)] + (["--smoke"] if smoke else [])
print(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
bench = pd.read_csv(data_dir / "packing.csv")
bench

# %%
fig = figures.figure_f4(data_dir, root, out=results.figures_dir(results_dir, smoke, profile))

# %% [markdown]
# ## What this shows beside the paper

# %%
b = bench.set_index("layout")
best = b["update_tokens_per_s"].idxmax()
display(Markdown(
    f"- Valid-token density: padded {b.loc['padded', 'valid_token_density']:.2f}, packed "
    f"{b.drop('padded')['valid_token_density'].min():.2f}-{b.drop('padded')['valid_token_density'].max():.2f}; loss-token "
    f"density padded {b.loc['padded', 'loss_token_density']:.2f} vs best {b['loss_token_density'].max():.2f}.\n"
    f"- Update throughput: {best} is {b.loc[best, 'update_tokens_per_s'] / b.loc['padded', 'update_tokens_per_s']:.2f}x "
    f"the padded layout.\n- *Paper:* {studies.PAPER['F4']}"))

# %%
# Every layout computes the padded layout's log-probs (float32 rounding apart): packing that let a sequence attend to
# another, or shifted a position, would move them by far more than 1e-4. Dense packing searches the row width
# including the longest sequence's (one row per sequence at worst), so it never processes more slots than padding,
# and on a real step (lengths differ) it is strictly denser; at C = 256 the rows are nearly full (full size: 16
# prompts' kept rows, >= 0.95; smoke size: 4 prompts' rows fill a few rows, the last one partly: >= 0.8). The shared
# layout computes each prompt once for its group's kept completions (several per group at r_o = 0.5, G = 8), so
# more of its slots carry loss tokens than the dense layout's at the same capacity.
assert (bench["max_logprob_diff_vs_padded"] < 1e-4).all(), bench
assert b.loc["padded", "valid_token_density"] < 1, b
for cap in (capacities[:2] if smoke else capacities):
    assert b.loc[f"packed C={cap}", "valid_token_density"] > b.loc["padded", "valid_token_density"], b
    assert b.loc[f"shared C={cap}", "loss_token_density"] > b.loc[f"packed C={cap}", "loss_token_density"], b
assert bench.loc[bench["layout"] == "packed C=256", "valid_token_density"].item() >= (0.8 if smoke else 0.95), bench
