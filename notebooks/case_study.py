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
# # F5 — case study: one problem, each method's answers over training
# The paper follows one hard problem (a Cauchy-Schwarz problem) and shows CPPO and GRESO settling on a wrong
# answer while DPPO finds the right one. We take a held-out split (the embedded task's hardest, `ood` with 7
# operations; the arithmetic task's `heldout`), pick the problem whose answers differ most between methods at the
# end, and show, for each T1 method's checkpoints, the distribution of its sampled final answers (k samples per
# checkpoint, at the runs' training temperature, read as their reward reads them).

# %% tags=["parameters"]
import os

samples = 32  # answers sampled per checkpoint
split = ""  # the held-out split the problem is picked from ("": `ood` where the task has it, else its first split)
candidates = 0  # the problem is picked among the split's first `candidates` problems (0: all)
overrides = {}  # TrainConfig fields over T1's methods: given (the real profile: R1's model and task, a checkpoint every
# 4 steps), the notebook trains T1's methods itself, seed `seeds[0]`, under <profile root>/case_study (T1's real runs
# keep no checkpoint); {}: it reads main_results' seed-0 runs (the CPU profile keeps their checkpoints)
seeds = [0]  # the seed of the runs followed (the first)
results_dir = ""  # main_results' results_dir (T1's runs, read), case_study.csv beside them, F5 in its figures/;
# "": the profile's (paper: where experiments/paper/main_results.yaml put T1), and figures/ (paper: figures/paper)
smoke = os.environ.get("DPPO_SMOKE") in ["1"]  # seconds-long sizes (the tests set DPPO_SMOKE to 1)
profile = "cpu"  # "paper": results under experiments/results/paper, tables and figures in figures/paper

# %%
from IPython.display import Markdown, display

from dppo import figures, results, studies
from dppo.case_study import case_study_answers

t1_dir = results_dir or (studies.paper_params("main_results").get("results_dir", "") if profile == "paper" else "")
t1_root = results.study_root(t1_dir, smoke, profile)  # where main_results trained T1
out = results.figures_dir(results_dir, smoke, profile)
# T1's methods on its layout (not the shared-prompt rows: the same methods, another layout; the paper profile has none)
methods = {label: row for label, row in studies.T1_RUNS.items() if label not in studies.TABLES["T1"].layout_rows}
own = studies.study_layouts("case_study", overrides=overrides).get("F5", {})  # trained here (the real profile)
if smoke:
    samples = 4
    runs = {label: dirs[0] for label, dirs in results.run_layout(methods, smoke=True).items()}
elif own:
    runs = {}
    for label, row in own.items():  # one at a time, each kept as weights only once trained (a SmolLM2 checkpoint with
        # its optimizer state is 1.6 GB; its weights 0.54 GB)
        runs[label] = results.run_layout({label: row}, seeds=seeds[:1], root=results_dir, profile=profile)[label][0]
        results.keep_weights_only(runs[label])
else:
    runs = {label: dirs[0] for label, dirs in studies.run_dirs(methods, seeds=seeds[:1], root=t1_root).items()}
answers = case_study_answers(runs, split=split, samples=samples, candidates=candidates)
answers.to_csv(t1_root / "case_study.csv", index=False)
answers.head(20)

# %%
fig = figures.figure_f5(answers, out=out, seed=seeds[0])
answers.to_csv(out / "F5_case_study.csv", index=False)  # the figure's data beside it

# %% [markdown]
# ## What this shows beside the paper

# %%
last = answers[answers["step"] == answers.groupby("method")["step"].transform("max")]
right = last[last["correct"]].groupby("method")["count"].sum().reindex(list(runs), fill_value=0) / samples
display(Markdown(f"- Share of correct answers at each method's last checkpoint on this problem (gold "
                 f"{answers['gold'].iloc[0]}): " + ", ".join(f"{m} {v:.0%}" for m, v in right.items()) +
                 f".\n- *Paper:* {studies.PAPER['F5']}"))

# %%
assert set(answers["method"]) == set(runs) and (answers["samples"] == samples).all()
# every checkpoint's answers count its samples; step 0 is the same initial model sampled with the same seed for every
# method, so its answers are identical across methods (a checkpoint loaded into the wrong method would differ)
assert (answers.groupby(["method", "step"])["count"].sum() == samples).all()
first = {m: sorted(zip(a["answer"].astype(str), a["count"])) for m, a in answers[answers["step"] == 0].groupby("method")}
assert len({tuple(v) for v in first.values()}) == 1, first
assert (out / "F5_case_study.png").is_file()
