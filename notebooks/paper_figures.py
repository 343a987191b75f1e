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
# # Every table and figure from stored results (no training)
# Rebuilds T1-T5 and F1-F5 (docs/method.md §6) from the run folders under `experiments/results/` (or `results`, e.g.
# results computed on a GPU cluster and copied here) in seconds, and shows each. What exists is read from the study
# registry (`dppo.studies`): each study's runs, seeds, tables and figures. Items whose runs are missing are listed and
# skipped.

# %% tags=["parameters"]
import os

results_dir = ""  # every study's results under <profile root>/results_dir, tables and figures in its figures/; "": the
# profile's (paper: the folder each experiments/paper/<study>.yaml names), and figures/ (paper: figures/paper)
smoke = os.environ.get("DPPO_SMOKE") in ["1"]  # seconds-long sizes (the tests set DPPO_SMOKE to 1)
profile = "cpu"  # "paper" / "real": results under experiments/results/<profile>, tables and figures in figures/<profile>
complete = True  # every study's results must be there (False, as after ./reproduce.sh --study X: what exists)

# %%
import time
from pathlib import Path

import pandas as pd
from IPython.display import Image, Markdown, display

from dppo import figures, results, studies, tables, toy

started = time.time() - 1  # what this execution writes is newer (a file's time is coarser than the clock's)
root = results.study_root(results_dir, smoke, profile)
out = results.figures_dir(results_dir, smoke, profile)
paper = profile != "cpu" and not results_dir  # each study's runs where its profile's parameters put them
# a study's parameters under the profile as ./reproduce.sh gave them (--toy: with experiments/paper/toy.yaml's)
params_of = toy.study_params if toy.active() else lambda study: studies.profile_params(study, profile)
# the studies ./reproduce.sh --profile P runs without --study: what a complete run must have made
ran = [s for s in studies.STUDIES if (s.name in studies.REAL_STUDIES if profile == "real" else s.in_default_run)]
seeds = {s.name: (s.seeds[:2] if smoke else params_of(s.name).get("seeds", s.seeds) if paper else s.seeds)
         for s in studies.STUDIES}
rates = list(studies.T5_SMOKE_RATES if smoke else params_of("sensitivity").get("rates", studies.T5_RATES)
             if paper else studies.T5_RATES)
missing = []


def layout(study: str, table: str) -> dict:
    """The table's runs and row labels as the study trained them (the paper profile: with its parameter file)."""
    params = studies.layout_params(params_of(study)) if paper else {}
    return studies.study_layouts(study, **{**params, **({"rates": rates} if study == "sensitivity" else {})})[table]


def root_of(study: str) -> Path:
    return results.study_root(params_of(study).get("results_dir", ""), smoke, profile) if paper else root


def have(layout, study):
    """{label: [run folder per seed]} when every run of the layout trained to its end (`results.finished`), else None
    (listed as missing, unless the study is one ./reproduce.sh runs only when named: the real model's)."""
    runs = studies.run_dirs(layout, seeds[study], root_of(study))
    gone = [str(d) for dirs in runs.values() for d in dirs if not results.finished(d)]
    missing.extend(gone if studies.BY_NAME[study] in ran else [])
    return runs if not gone else None


# smoke (tests): what the study notebooks just wrote, to compare with the tables rebuilt here (below)
before = {f.stem: (f.read_text(), f.stat().st_mtime) for f in out.glob("T*.csv")}
source_time = max(f.stat().st_mtime for f in Path(tables.__file__).parent.glob("*.py"))
compared = []


def table(recipe, layout, runs):
    """The registry's recipe (`tables.build` of a `studies.Table`, as the study notebooks build it) into `out`. At
    smoke size, where the test command has just run the study notebooks into a clean folder, a table of that name
    written after its runs and after the code that tabulates them was written by its study notebook: the rebuilt one
    must be the same file (what a study notebook showed is what this one shows). Full-size tables may come from other
    runs (results copied from elsewhere, another results_dir), so they are not compared."""
    name = recipe.name
    text, written = before.get(name, ("", 0.0))
    inputs = max(d.joinpath("metrics.jsonl").stat().st_mtime for dirs in runs.values() for d in dirs)
    result = tables.build(recipe, layout, runs, out, profile)
    if smoke and written > max(inputs, source_time):
        assert (out / f"{name}.csv").read_text() == text, f"{name}: rebuilt from the same runs, the table differs"
        if recipe.at_equal_compute:
            same = (out / f"{name}_equal_compute.csv").read_text() == before[f"{name}_equal_compute"][0]
            assert same, f"{name}: rebuilt from the same runs, the equal-compute table differs"
        compared.append(name)
    return result


figures.figure_f1(out=out)
built, trained = {}, {}  # table key -> its summary, its runs
for study in studies.STUDIES:  # every table of the registry whose runs are there
    for recipe in study.tables:
        if runs := have(recipe_layout := layout(study.name, recipe.key), study.name):
            built[recipe.key], trained[recipe.key] = table(recipe, recipe_layout, runs), runs
if "T1" in built:
    figures.figure_f2(trained["T1"], out=out)
if "T5" in built:
    figures.figure_t5(built["T5"], rates, out=out)
names = [s.name for s in ran]
if (root / "gradient_variance" / "variance.csv").is_file():
    figures.figure_f3(root / "gradient_variance", out=out)
elif "gradient_variance" in names:
    missing.append(str(root / "gradient_variance"))
if (root / "packing" / "packing.csv").is_file():
    figures.figure_f4(root / "packing", root, out=out)
elif "packing" in names:
    missing.append(str(root / "packing"))
protocol_runs = studies.run_dirs(studies.protocol_runs(), studies.PROTOCOL_SEEDS, results.study_root(results_dir, smoke,
                                                                                                  "real"))
if profile == "real" and all(results.finished(d) for dirs in protocol_runs.values() for d in dirs):  # P1, from its logs
    from dppo import protocol

    protocol_pairs = protocol.pairs(protocol_runs, studies.PROTOCOL_LEVERS)
    protocol.write(protocol_runs, studies.PROTOCOL_LEVERS, protocol_pairs, protocol.readings(protocol_pairs), out)
    built["P1"] = protocol_pairs
if (root / "case_study.csv").is_file():
    figures.figure_f5(pd.read_csv(root / "case_study.csv"), out=out)
elif "case_study" in names:
    missing.append(str(root / "case_study.csv"))
import matplotlib.pyplot as plt

plt.close("all")  # shown below, in the registry's order, from the files
here = os.path.relpath(out, studies.ROOT)
print("rebuilt here from their runs:", ", ".join(built) or "no table", "| runs missing (skipped):",
      f"{len(missing)}, e.g. {os.path.relpath(missing[0], studies.ROOT)}" if missing else "none")
if missing:  # what is shown below is what figures/ (or `out`) holds: the files of the last run that made them
    print(f"the tables and figures below are the files in {here}/ as they stand")

# %% [markdown]
# ## The tables and figures, study by study

# %%
for study in studies.STUDIES:
    display(Markdown(f"### {study.title} (`notebooks/{study.name}.ipynb`)"))
    for recipe in study.tables:
        if (out / f"{recipe.name}.md").is_file():
            display(Markdown((out / f"{recipe.name}.md").read_text()))
    for name in study.figures:
        if (out / f"{name}.png").is_file():
            display(Image(filename=str(out / f"{name}.png")))
    if study.name == "protocol" and (out / "P1_protocol.md").is_file():
        display(Markdown((out / "P1_protocol.md").read_text()))
display(Markdown("### F1: the method"), Image(filename=str(out / f"{studies.FIGURE_F1}.png")))

# %%
assert (out / f"{studies.FIGURE_F1}.png").is_file()
print("tables rebuilt identical to the study notebooks':", compared or "none written after their runs")
if smoke:  # the test command runs the study notebooks first (notebooks/conftest.py), each into a clean folder
    assert {t.name for s in ran for t in s.tables} <= set(compared), compared
if complete and not smoke:  # every table and figure of the studies ./reproduce.sh --profile P runs without --study
    assert not missing, missing  # (studies.DEFAULT_RUN; real: REAL_STUDIES), and of no other (R1's only when real_model is named):
    made = [f"{t.name}{end}" for s in ran for t in s.tables  # with every run there, this notebook
            for end in (".csv", ".md", "_seeds.csv") + (("_equal_compute.csv",) if t.at_equal_compute else ())]
    made += [f"{name}.png" for s in ran for name in s.figures]  # has just (re)written each of them
    stale = [name for name in made if not (out / name).is_file() or (out / name).stat().st_mtime < started]
    assert not stale, f"not written by this run into {here}/ (missing, or left by an earlier one): {stale}"
    print(f"complete: the {len(made)} tables and figures of {', '.join(s.name for s in ran)}, "
          f"written into {here}/ by this run")
