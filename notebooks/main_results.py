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
# # T1 and F2 — main results: GRPO, GRESO, CPPO and DPPO
# Trains the methods from `experiments/cpu/*.yaml` (the same setup; only the pruner differs; DPPO includes Dense
# Prompt Packing) over several seeds, then writes table T1 (per-split accuracy, average, time, speed-up in wall-clock,
# CPU time and FLOPs: mean ± 95% CI over seeds, paired by seed) and figure F2 (accuracy and reward against training
# wall-clock, mean with a 95% band). Then the same runs at equal compute: the time and FLOPs each method needs to
# reach GRPO's final accuracy, and, from a DPPO run trained on for about GRPO's time (`long_epochs`), DPPO's accuracy
# at GRPO's time budget. The estimator and each baseline's rule: `docs/method.md` §2; the speed-up currencies: §5.1;
# equal compute: §6.2. At paper scale, point `configs` at `experiments/paper/*.yaml` (Qwen3-4B/8B, MATH) on GPUs.

# %% tags=["parameters"]
import os

configs = {}  # {label: yaml} to replace the CPU-scale configs of T1 (e.g. paper scale)
overrides = {}  # TrainConfig fields for every run where valid (what is left out is reported): not a pruning
# field the row's pruner ignores, nor a field the row sets beyond the study setup (T4's stage, T5's rates, T2's algorithm)
seeds = [0, 1, 2]  # each method is trained once per seed (the seed sets its data, order and sampling streams)
launch = {}  # {accelerate_config, num_processes, launcher}: each run its own launched process group (dppo.launch); {}: in this process
results_dir = ""  # runs under <profile root>/results_dir (root: experiments/results, or .../paper),
# tables and figures in its figures/; "": the root, and figures/ (paper: figures/paper)
smoke = os.environ.get("DPPO_SMOKE") in ["1"]  # seconds-long sizes (the tests set DPPO_SMOKE to 1)
profile = "cpu"  # "paper": results under experiments/results/paper, tables and figures in figures/paper
long_epochs = 8  # epochs of the DPPO run trained for about GRPO's time (T1 at equal compute); 0: no such run
shared_rows = True  # also GRPO and DPPO on the shared-prompt layout (rows "X, shared prompts": what sharing gives each)
protocol_pair = ""  # a protocol lever whose GRPO and DPPO runs are T1's (the real profile: the chosen one; docs/method.md §6.4)
rows = []  # the rows of T1 to train ([]: every row; the real profile: its headline pair, dppo.studies.REAL_T1_ROWS)

# %%
import pandas as pd
from IPython.display import Markdown, display

from dppo import figures, results, studies, tables

if smoke:
    seeds = seeds[:2]  # two seeds still give intervals
layout = studies.study_layouts("main_results", configs=configs, overrides=overrides, long_epochs=long_epochs,
                                shared_rows=shared_rows, protocol_pair=protocol_pair, rows=rows)["T1"]
runs = results.run_layout(layout, seeds=seeds, smoke=smoke, launch=launch, root=results_dir, profile=profile,
                          baseline=studies.TABLES["T1"].baseline)  # a run with its baseline, where they fit
out = results.figures_dir(results_dir, smoke, profile)
t1 = tables.build(studies.TABLES["T1"], layout, runs, out, profile)  # its recipe: the registry's (dppo.studies.Table)
equal = pd.read_csv(out / "T1_main_results_equal_compute.csv", index_col=0)
display(Markdown((out / "T1_main_results.md").read_text()))

# %%
fig = figures.figure_f2(runs, out=out)

# %% [markdown]
# ## What these runs show beside the paper
# Each line is computed from the table above (intervals over the seeds; a difference whose interval holds 0 is not
# a difference at this number of seeds).

# %%
display(Markdown(tables.sentences(t1, studies.TABLES["T1"].baselines(t1.index), "T1")))
flops = pd.read_csv(out / f"{studies.TABLES['T1'].name}_seeds.csv").groupby("label")["speedup_flops"].apply(list)
display(Markdown(tables.equal_compute_sentences(equal, "GRPO", flops.to_dict())))

# %%
for label, dirs in runs.items():
    for d in dirs:
        m = results.load_run(d)
        assert results.finished(d) and "eval/avg" in m, d  # (its weights, or its committed log: results.prepare)
assert t1["seeds"].eq(len(seeds)).all() and list(t1.index) == [k for k in layout if k not in studies.longer_rows(layout)]
# the equal-compute table: every row against GRPO (the shared-prompt rows, on another layout, are not in it)
assert list(equal.index) == [k for k in layout if studies.TABLES["T1"].baseline(k) == "GRPO"]
assert equal.loc["GRPO", "reached"] == len(seeds)  # GRPO reaches its own accuracy
assert (equal["budget_frac"] > 0).all() and equal.loc["GRPO", "budget_frac"] == 1.0
assert (t1["speedup_ci"].notna() | (t1["seeds_timed"] < 2)).all()  # an interval over >= 2 quiet pairs (contended ones left out: dppo.tables; the paper profile runs 1 seed)
# What a wrong implementation would break, on every seed's steps: GRPO trains every rolled-out row with weight 1 (its
# trained tokens are exactly its generated ones); DPPO trains a strict subset (completion pruning: fewer tokens
# trained than generated over the run; with r_o = 0.5 no completion pruned in any step of any seed has probability
# below 1e-6 at smoke size) and re-weights what it keeps by 1/pi >= 1.
steps = {label: pd.concat([results.load_run(d) for d in dirs]).query("step > 0") for label, dirs in runs.items()}
grpo = steps["GRPO"]
assert (grpo["tokens/trained"] == grpo["tokens/generated"]).all() and (grpo["weights/max"] == 1.0).all(), grpo
dppo = steps["DPPO"]
assert dppo["tokens/trained"].sum() < dppo["tokens/generated"].sum(), dppo[["tokens/trained", "tokens/generated"]]
trained = dppo["kept/completion_frac"] > 0  # a step that kept nothing logs weights 0
assert (dppo["weights/mean"][trained] >= 1.0 - 1e-6).all() and (dppo["weights/max"] > 1.0).any()
assert all((out / f"{n}.{e}").is_file() for n, e in [("T1_main_results", "csv"), ("T1_main_results", "md"),
                                                     ("T1_main_results_seeds", "csv"),
                                                     ("F2_training_curves", "png"), ("F2_training_curves", "pdf")])
