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
# # P1 — the real-model protocol: which setup lets GRPO vs DPPO accuracy resolve
# The paper's accuracy claim (DPPO keeps or raises GRPO's accuracy) needs a paired difference whose 95% interval is
# narrow enough to say so: ±5 points (`dppo.verdicts.MARGIN`). On SmolLM2-135M-Instruct the spread over seeds decides
# how many seeds that takes. Each lever (`dppo.studies.PROTOCOL_LEVERS`) is a setup trained as a GRPO-DPPO pair, in
# turn, per seed: (a) R1's (lr 3e-5, 64 problems x 2 epochs), (b) a lower, cosine-decaying rate over twice the
# problems. Every run evaluates every 2 steps on the seed's first 128 held-out problems and at its start and end on all
# 256. Read from the same runs: (c) the mean of each run's last 3 evaluations, (d) more evaluation samples (projected
# from each evaluation's sampling variance), (e) the spread at half the run against the end. Table P1: per lever and
# reading, the paired s.d. with its 95% interval, the seeds a ±5 half-width needs, minutes a pair, GRPO's learning;
# then the protocol chosen (`dppo.protocol.choose`, docs/method.md §6.4). About 4 hours on 2 cores
# (`./reproduce.sh --study protocol`); the committed run logs make it minutes (`dppo.results.prepare`).

# %% tags=["parameters"]
import os

levers = {}  # {lever: fields} to replace dppo.studies.PROTOCOL_LEVERS ({}: those)
seeds = [0, 1, 2, 3]  # each lever's pair is trained once per seed
results_dir = ""  # runs under experiments/results/real/<results_dir>, P1 in its figures/; "": the root, figures/real
smoke = os.environ.get("DPPO_SMOKE") in ["1"]  # seconds-long sizes (the tests set DPPO_SMOKE to 1)
budget_hours = 3.0  # what the headline pair may take on this machine (docs/method.md §6.4)

# %%
from IPython.display import Markdown, display

from dppo import protocol, results, studies

levers = levers or studies.PROTOCOL_LEVERS
if smoke:
    levers, seeds = dict(list(levers.items())[:1]), seeds[:2]  # one lever, two seeds: an s.d. and its interval
    levers = {k: {**v, "max_steps": 1} for k, v in levers.items()}  # one step a run: the readings' plumbing
layout = studies.protocol_runs(levers)
runs = results.run_layout(layout, seeds=seeds, smoke=smoke, root=results_dir, profile="real",
                          baseline=studies.protocol_baseline)  # each lever's pair in turn, a seed's levers together
out = results.figures_dir(results_dir, smoke, "real")
pairs = protocol.pairs(runs, levers)
table = protocol.readings(pairs)
chosen = protocol.write(runs, levers, pairs, table, out, budget_hours)
display(Markdown((out / "P1_protocol.md").read_text()))

# %%
assert len(pairs) == len(levers) * len(seeds), pairs
assert set(table["reading"]) == set(protocol.READINGS)  # (at smoke size, 1 step: nothing at half the run)
assert (table.loc[table["reading"].isin(["final", "last_k"]), "seeds"] == len(seeds)).all()
assert (pairs["pair_min"] > pairs["pair_train_min"]).all()  # evaluations are counted in what a pair costs
assert chosen["reading"] in ("final", "last_k") and not chosen["projected"]
for label, dirs in runs.items():
    assert all(results.finished(d) for d in dirs), label
