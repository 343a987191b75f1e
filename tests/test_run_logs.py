"""Every number of a committed real-model table traces to committed run logs (docs/method.md §6.1): the runs behind it
keep, in git, their config, metrics, machine, in-turn record, code hash and commit (dppo.results.LOG_FILES; no
weights), and the table, P1 and the README's row rebuild from those logs alone, without training, to the same files."""

import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from dppo import readme, results, studies, tables

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "figures" / "real"
STUDY_OF = {t.key: s.name for s in studies.STUDIES for t in s.tables}


def _logged(recipe: studies.Table) -> bool:
    """Whether a committed real table says its runs recorded their commit (its per-seed CSV's `commit`)."""
    path = REAL / f"{recipe.name}_seeds.csv"
    if not path.is_file():
        return False
    seeds = pd.read_csv(path)
    return "commit" in seeds and (seeds["commit"] != "unrecorded").all()


LOGGED = [t for t in studies.TABLES.values() if _logged(t)]


def _runs(recipe: studies.Table) -> tuple[dict, dict[str, list[Path]]]:
    """The layout and run folders of a real table, as ./reproduce.sh --profile real trains them."""
    study = STUDY_OF[recipe.key]
    params = studies.real_params(study)
    layout = studies.study_layouts(study, **studies.layout_params(params), report=lambda *_: None)[recipe.key]
    return layout, studies.run_dirs(layout, params["seeds"], results.study_root("", False, "real"))


def _tracked() -> set[str]:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "experiments/results/real"], capture_output=True,
                         text=True, check=True).stdout
    return set(out.split())


# The real profile's tables still to be re-measured from the landed code with committed logs (trained before runs
# recorded their commit): a table leaves this set when its logs land, and every other table must have them.
NOT_YET_LOGGED: set[str] = set()


def test_the_main_table_is_one_of_them():
    """T1 (the README's) trained at a recorded commit with committed logs."""
    assert "T1" in {t.key for t in LOGGED}


def test_every_real_table_but_the_named_ones_traces_to_its_logs():
    """Every table the real profile builds has committed logs (and so the clock check below), but those named as not
    yet re-measured; a named one whose logs landed must leave the list."""
    real = {t.key for s in studies.STUDIES if s.name in studies.REAL_STUDIES for t in s.tables}
    assert NOT_YET_LOGGED <= real
    assert {t.key for t in LOGGED} == real - NOT_YET_LOGGED


@pytest.mark.parametrize("recipe", LOGGED, ids=[t.key for t in LOGGED])
def test_a_committed_table_rebuilds_from_its_committed_logs(recipe, tmp_path):
    layout, runs = _runs(recipe)
    tracked = _tracked()
    for label, dirs in runs.items():
        for d in dirs:
            assert results.finished(d), d
            rel = d.relative_to(ROOT).as_posix()
            for name in ("config.yaml", "metrics.jsonl", "machine.json", "in_turn.json", results.CODE_FILE,
                         results.COMMIT_FILE):
                assert f"{rel}/{name}" in tracked, f"{rel}/{name} is not committed"
    assert not [f for f in tracked if f.endswith((".safetensors", ".pt", ".bin"))]  # logs, never weights
    tables.build(recipe, layout, runs, tmp_path, "real")
    names = [f"{recipe.name}.csv", f"{recipe.name}_seeds.csv", f"{recipe.name}.md"]
    names += [f"{recipe.name}_equal_compute.csv", f"{recipe.name}_equal_compute_seeds.csv"] \
        if recipe.at_equal_compute else []
    for name in names:
        assert (tmp_path / name).read_text() == (REAL / name).read_text(), f"{name} differs from its rebuild"
    # the clock of every wall-clock speed-up: the row's own baseline or its timing twin, trained in turn with the row
    # in the same sittings (results.timed_with), never a run of another sitting; a twin's rows say so (§)
    seeds = pd.read_csv(tmp_path / f"{recipe.name}_seeds.csv")
    assert set(seeds["timed_with"]) <= {"self", "together", "twin"}, set(seeds["timed_with"])
    base_of = recipe.baselines(list(runs))
    base_of = base_of if isinstance(base_of, dict) else {label: base_of for label in runs}
    for label, dirs in runs.items():
        for d, base in zip(dirs, runs[base_of[label]]):
            if label != base_of[label]:
                clock, how = results.timed_with(d, base)
                assert how in ("together", "twin"), (d, how)
                ids = [s["id"] for s in results._in_turn(d)["sittings"]]
                assert [s["id"] for s in results._in_turn(clock)["sittings"]] == ids, (d, clock)
    twins = seeds[seeds["timed_with"] == "twin"]["label"].unique()
    table_md = (REAL / f"{recipe.name}.md").read_text()
    for label in twins:
        assert any(line.split("|")[1].strip() == label and " §" in line for line in table_md.splitlines()
                   if line.startswith("|")), label
    # the README's row (and docs/results.md's) from the rebuilt files: the same text
    figures = tmp_path / "rebuilt" / "real"  # (named as the real profile's folder: its rows give accuracies)
    shutil.copytree(REAL, figures)
    for name in names:
        shutil.copy(tmp_path / name, figures / name)
    assert readme.results_table(figures, (recipe.key,)) == readme.results_table(REAL, (recipe.key,))
    if recipe.key in readme.README_TABLES:
        row = next(line for line in readme.results_table(figures, (recipe.key,)).splitlines()
                   if line.startswith(f"| {recipe.key} |"))
        assert row in (ROOT / "README.md").read_text()


def test_the_protocol_table_rebuilds_from_its_committed_logs(tmp_path):
    """P1 (docs/results.md's protocol table) from the levers' committed logs: the same CSVs and page."""
    from dppo import protocol

    if not (REAL / "P1_protocol.csv").is_file():
        pytest.fail("figures/real/P1_protocol.csv is not committed")
    runs = studies.run_dirs(studies.protocol_runs(), studies.PROTOCOL_SEEDS, results.study_root("", False, "real"))
    tracked = _tracked()
    assert all(f"{d.relative_to(ROOT).as_posix()}/metrics.jsonl" in tracked for dirs in runs.values() for d in dirs)
    pairs = protocol.pairs(runs, studies.PROTOCOL_LEVERS)
    protocol.write(runs, studies.PROTOCOL_LEVERS, pairs, protocol.readings(pairs), tmp_path)
    for name in ("P1_protocol.csv", "P1_protocol_pairs.csv", "P1_protocol.md"):
        assert (tmp_path / name).read_text() == (REAL / name).read_text(), f"{name} differs from its rebuild"
    # what T1 trains under is what P1 chose: its lever and its reading
    chosen = protocol.choose(pd.read_csv(REAL / "P1_protocol.csv"))
    assert (chosen["lever"], chosen["reading"]) == (studies.PROTOCOL_CHOICE, studies.PROTOCOL_READING), chosen


def test_the_logs_are_a_few_megabytes():
    sizes = [(ROOT / f).stat().st_size for f in _tracked()]
    assert sum(sizes) < 20e6, sum(sizes)


def test_a_row_pairs_with_a_timing_twin_that_did_other_work(tmp_path):
    """T4's proportional row of seed 0 trained beside GRPO's timing twin, which repeated GRPO's work (its FLOPs and
    tokens): the row's FLOPs speed-up and tokens share divide GRPO's. A twin whose work differs (trained on another host,
    other rollouts) makes the row pair with the twin in every column, not the twin's clock over GRPO's work (before:
    FLOPs and tokens from GRPO, the wall clock from the twin)."""
    import json

    for sub in ("ablations/grpo/seed0", "ablations/grpo/seed0_timing_dppo_proportional",
                "ablations/dppo_proportional/seed0"):
        shutil.copytree(ROOT / "experiments/results/real" / sub, tmp_path / sub)
    base, twin, row = (tmp_path / "ablations/grpo/seed0", tmp_path / "ablations/grpo/seed0_timing_dppo_proportional",
                       tmp_path / "ablations/dppo_proportional/seed0")
    runs = {"GRPO": [base], "DPPO, proportional": [row]}
    same = tables.per_seed(runs, "GRPO").set_index("label").loc["DPPO, proportional"]
    assert same["timed_with"] == "twin" and tables.twin_repeats(results.summarize(base), results.summarize(twin))
    grpo, mine = results.summarize(base), results.summarize(row)
    assert same["speedup_flops"] == pytest.approx(grpo["train_flops"] / mine["train_flops"])
    lines = [json.loads(line) for line in (twin / "metrics.jsonl").read_text().splitlines()]
    for rec in lines:  # the twin's work, 1.5 times GRPO's
        for key in ("flops/step", "tokens/trained"):
            if key in rec:
                rec[key] = rec[key] * 3 // 2 if key == "tokens/trained" else rec[key] * 1.5
    (twin / "metrics.jsonl").write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    other = results.summarize(twin)
    assert not tables.twin_repeats(grpo, other)
    moved = tables.per_seed(runs, "GRPO").set_index("label").loc["DPPO, proportional"]
    assert moved["speedup_flops"] == pytest.approx(other["train_flops"] / mine["train_flops"])
    assert moved["tokens_share"] == pytest.approx(mine["tokens/trained"] / other["tokens/trained"])
    assert moved["speedup"] == pytest.approx(same["speedup"])  # the twin's clock either way


def test_a_speed_up_timed_by_a_timing_twin_is_marked_and_explained():
    """A row whose wall-clock pairs divide a timing twin's clock carries §k in the table (before: nothing told it from
    a row timed with its own baseline, which carries none). No logged table has such a row yet (T1 and T3 train each
    pair together), so the rebuild test above cannot see a lost mark."""
    seeds = pd.DataFrame([dict(label=label, seed=s, speedup=sp, speedup_cpu=sp, speedup_flops=sp, contended=False,
                               pair_contended=False, timed_with=how)
                          for s in (0, 1) for label, sp, how in (("GRPO", 1.0, "self"), ("DPPO", 1.8, "together"),
                                                                 ("late row", 2.0, "twin"))])
    md = tables.markdown(tables.aggregate(seeds))
    rows = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("|")}
    assert " §2" in rows["late row"] and "§" not in rows["DPPO"]
