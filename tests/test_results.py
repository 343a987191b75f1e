"""Run folders reused only for what trained them (dppo.results.run): the same config and the same code; a study's
overrides and results_dir (dppo.studies, dppo.results)."""

import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from dppo import results, studies
from dppo.config import TrainConfig
from dppo.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]


def test_a_finished_run_is_reused_only_with_the_same_config_and_code(tmp_path, monkeypatch, embedded):
    out, fits = tmp_path / "run", []
    fit = Trainer.fit

    def counted(self):
        fits.append((out / "final").exists())  # whether a final/ stood when training began
        return fit(self)
    monkeypatch.setattr(Trainer, "fit", counted)
    results.run("experiments/cpu/grpo.yaml", out, smoke=True)
    assert fits == [False] and (out / "final").is_dir()
    assert (out / results.CODE_FILE).read_text().strip() == results.code_hash()
    results.run("experiments/cpu/grpo.yaml", out, smoke=True)
    assert fits == [False]  # same config, same code: reused
    results.run("experiments/cpu/grpo.yaml", out, smoke=True, lr=2e-4)
    assert fits == [False, False]  # another config: trained again, from scratch
    monkeypatch.setattr(results, "code_hash", lambda: "0" * 64)  # the package's source changed since
    results.run("experiments/cpu/grpo.yaml", out, smoke=True, lr=2e-4)
    assert fits == [False, False, False] and (out / "final").is_dir()
    assert (out / results.CODE_FILE).read_text().strip() == "0" * 64



def test_what_a_folder_keeps_does_not_retrain_it(tmp_path, monkeypatch, embedded):
    """A finished run serves a config that differs only in what the folder keeps (STORAGE_FIELDS), and then drops
    the checkpoints that config does not keep; one that needs checkpoints after final/ is trained again where they
    are gone (the case study reads them)."""
    out, fits = tmp_path / "run", []
    fit = Trainer.fit
    monkeypatch.setattr(Trainer, "fit", lambda self: (fits.append(1), fit(self))[1])
    results.run("experiments/cpu/grpo.yaml", out, smoke=True, keep_checkpoints_after_final=True)
    assert len(fits) == 1 and any((out / "checkpoints").glob("step_*"))
    results.run("experiments/cpu/grpo.yaml", out, smoke=True, keep_checkpoints_after_final=False, keep_checkpoints=1)
    assert len(fits) == 1 and not (out / "checkpoints").exists()  # reused, and as the trainer would leave it
    results.run("experiments/cpu/grpo.yaml", out, smoke=True, keep_checkpoints_after_final=True)
    assert len(fits) == 2 and any((out / "checkpoints").glob("step_*"))  # its checkpoints were gone: trained again


def test_the_code_hash_covers_the_code_that_trains(tmp_path):
    """Editing a module that only lays out or reports runs (REPORTING_MODULES) leaves trained runs valid; editing any
    other module, or adding one, does not."""
    import shutil

    pkg = tmp_path / "dppo"
    shutil.copytree(ROOT / "dppo", pkg, ignore=shutil.ignore_patterns("__pycache__", "*.safetensors", "*.json"))
    base = results.code_hash.__wrapped__(pkg)
    assert base == results.code_hash()
    for name, same in (("studies.py", True), ("tables.py", True), ("losses.py", False), ("trainer.py", False),
                       ("new_module.py", False)):
        path = pkg / name
        before = path.read_text() if path.is_file() else None
        path.write_text((before or "") + "\n# edited\n")
        assert (results.code_hash.__wrapped__(pkg) == base) == same, name
        path.write_text(before) if before is not None else path.unlink()



def test_runs_trained_in_turn_fit_in_memory():
    """A seed's runs are held in memory together only as many as fit: the real profile's 15 ablation runs of
    SmolLM2 (2.15 GB each) on a 24 GB machine go in balanced groups of at most 6 (one group would need 32 GB, and
    was the plan before); the embedded model's 18 stay one group; an unknown model's size keeps the group whole."""
    def group(model: str, n: int):
        return [(f"run{i}", TrainConfig(model_name_or_path=model)) for i in range(n)]

    gib = 2 ** 30
    chunks = results.in_turn_chunks(group("smollm2-135m", 15), 22 * gib)
    assert [len(c) for c in chunks] == [5, 5, 5] and [label for c in chunks for label, _ in c] == \
        [f"run{i}" for i in range(15)]
    held = max(len(c) for c in chunks) * 134.5e6 * results.IN_TURN_BYTES_PER_PARAM
    assert held <= 22 * gib * results.IN_TURN_MEMORY_FRACTION < 15 * 134.5e6 * results.IN_TURN_BYTES_PER_PARAM
    assert [len(c) for c in results.in_turn_chunks(group("smollm2-135m", 5), 22 * gib)] == [5]
    assert [len(c) for c in results.in_turn_chunks(group("embedded", 18), 4 * gib)] == [18]
    assert [len(c) for c in results.in_turn_chunks(group("smollm2-135m", 3), 1 * gib)] == [1, 1, 1]
    assert [len(c) for c in results.in_turn_chunks(group("./my_local_model", 7), 1 * gib)] == [7]


def test_a_baseline_and_its_rows_train_in_one_group_where_they_fit():
    """A wall-clock speed-up is paired only within a group trained in turn: the host's speed drifts between groups
    (measured: T5's DPPO cell 1.95x in GRPO's group, 1.66x in another; docs/results.md). T2's 6 SmolLM2 runs a seed, 5
    of which fit in 18 GB, go as each algorithm with its + DPPO row (4 and 2, in order); in balanced halves (3 and 3),
    as without the baselines, DAPO + DPPO would train apart from DAPO. A unit larger than a group (T4: one GRPO, 6
    rows) is split, GRPO in its first part; a baseline finished earlier (not in the group) leaves its rows free."""
    gib = 2 ** 30
    t2 = studies.TABLES["T2"].baseline

    def runs(labels):
        return [(label, TrainConfig(model_name_or_path="smollm2-135m")) for label in labels]

    def names(chunks):
        return [[label for label, _ in chunk] for chunk in chunks]
    chunks = names(results.in_turn_chunks(runs(studies.T2_RUNS), 18 * gib, t2))
    assert chunks == [["GRPO", "GRPO + DPPO", "DAPO", "DAPO + DPPO"], ["GSPO", "GSPO + DPPO"]], chunks
    apart = names(results.in_turn_chunks(runs(studies.T2_RUNS), 18 * gib))
    assert any(t2(label) not in chunk for chunk in apart for label in chunk), apart  # what the baselines prevent
    t4 = names(results.in_turn_chunks(runs(studies.T4_RUNS), 18 * gib, studies.TABLES["T4"].baseline))
    assert [len(c) for c in t4] == [5, 3] and t4[0][0] == "GRPO" and sum(t4, []) == list(studies.T4_RUNS), t4
    rows = [label for label in studies.T2_RUNS if label.endswith("DPPO")]  # their baselines trained earlier
    assert names(results.in_turn_chunks(runs(rows), 18 * gib, t2)) == [rows]


def test_rows_apart_from_their_baseline_train_beside_its_timing_twin():
    """Where a baseline cannot train with all its rows (T4: GRPO and 7 rows, 5 fit) or trained earlier (T5's cells
    after T4), each group of its rows holds the baseline's timing twin — the same run again, whose clock their
    wall-clock speed-ups divide — and never two of it."""
    gib = 2 ** 30
    twin = results.TWIN.format("GRPO")

    def runs(labels):
        return [(label, TrainConfig(model_name_or_path="smollm2-135m", seed=3)) for label in labels]

    def names(chunks):
        return [[label for label, _ in chunk] for chunk in chunks]
    t4, t5 = studies.TABLES["T4"].baseline, studies.TABLES["T5"].baseline
    every = dict(runs([*studies.T4_RUNS, *(f"r_q={a}, r_o={b}" for a in (0.3, 0.7) for b in (0.3, 0.5, 0.7))]))
    rows = list(studies.T4_RUNS)
    chunks = results.in_turn_chunks(runs(rows), 18 * gib, t4, every)
    assert names(chunks) == [rows[:5], [twin, *rows[5:]]], names(chunks)
    assert chunks[1][0][1] is every["GRPO"]  # the baseline's own config (its folder is set by run_layout)
    cells = [label for label in every if label.startswith("r_q")]  # GRPO and DPPO trained with T4
    assert names(results.in_turn_chunks(runs(cells), 18 * gib, t5, every)) == [[twin, *cells[:4]], [twin, *cells[4:]]]
    t2 = studies.TABLES["T2"].baseline
    done = [label for label in studies.T2_RUNS if label.endswith("DPPO")]
    assert names(results.in_turn_chunks(runs(done), 18 * gib, t2, dict(runs(studies.T2_RUNS)))) == [
        ["GRPO (timing twin)", "GRPO + DPPO", "DAPO (timing twin)", "DAPO + DPPO"],
        ["GSPO (timing twin)", "GSPO + DPPO"]]
    # a baseline with every row in one group needs no twin; one row per group (1 fits) cannot have one
    assert names(results.in_turn_chunks(runs(rows[:5]), 18 * gib, t4, every)) == [rows[:5]]
    assert names(results.in_turn_chunks(runs(rows[1:3]), 2 * gib, t4, every)) == [rows[1:2], rows[2:3]]


def test_a_speed_up_divides_the_clock_of_the_baseline_that_trained_beside_it(tmp_path, monkeypatch):
    """End to end (smoke runs): GRPO and two rows with room for two runs train as [GRPO, DPPO] and [GRPO's twin,
    CPPO]. Each run folder records its group; the twin computes exactly what GRPO computed (same config and seed);
    DPPO's wall-clock speed-up divides GRPO's clock, CPPO's its twin's; and without the twin CPPO's pair trained apart
    and its timed speed-ups are not reported (FLOPs still are)."""
    from dppo import readme, tables

    layout = {label: studies.T1_RUNS[label] for label in ("GRPO", "DPPO", "CPPO")}
    monkeypatch.setattr(results, "IN_TURN_BYTES_PER_PARAM", 1)
    monkeypatch.setattr(results.psutil, "virtual_memory", lambda: types.SimpleNamespace(
        available=2.5 * studies.model_params("embedded") / results.IN_TURN_MEMORY_FRACTION))
    runs = results.run_layout(layout, seeds=[0], smoke=True, root=tmp_path, baseline=studies.grpo_baseline)
    grpo, dppo, cppo = (runs[label][0] for label in layout)
    twin = grpo.with_name("seed0_timing_cppo")
    assert (twin / "final").is_dir()
    assert results.timed_with(dppo, grpo) == (grpo, "together")
    assert results.timed_with(cppo, grpo) == (twin, "twin")
    same = ["acc/avg", "tokens/trained", "train_flops", "steps"]
    assert [results.summarize(twin)[c] for c in same] == [results.summarize(grpo)[c] for c in same]
    seeds = tables.per_seed(runs, "GRPO").set_index("label")
    assert list(seeds["timed_with"]) == ["self", "together", "twin"]
    clock = {d: results.summarize(d)["train_s"] for d in (grpo, dppo, cppo, twin)}
    assert seeds.loc["DPPO", "speedup"] == clock[grpo] / clock[dppo]
    assert seeds.loc["CPPO", "speedup"] == clock[twin] / clock[cppo]
    (grpo / results.IN_TURN_FILE).unlink()  # a baseline of older dppo (no record): its twin still times CPPO
    assert results.timed_with(cppo, grpo) == (twin, "twin") and results.timed_with(dppo, grpo) == (grpo, "apart")
    shutil.rmtree(twin)
    apart = tables.per_seed(runs, "GRPO").set_index("label")
    assert apart.loc["CPPO", "timed_with"] == "apart" and apart.loc["CPPO", ["speedup", "speedup_cpu"]].isna().all()
    assert apart.loc["CPPO", "speedup_flops"] == seeds.loc["CPPO", "speedup_flops"]
    summary = tables.aggregate(apart.reset_index())
    assert summary.loc["CPPO", ["apart", "seeds_timed"]].tolist() == [1, 0] and summary.loc["DPPO", "apart"] == 1
    assert "‡1" in tables.markdown(summary).splitlines()[-1]  # CPPO's row says why its speed-up cell is empty
    assert readme._run(summary.loc["CPPO"]).startswith("not timed (trained apart), ")


def _rate(label: str, name: str) -> float:
    return float(dict(kv.split("=") for kv in label.split(", "))[name])


def test_study_overrides_apply_only_where_valid_and_every_run_stays_a_valid_config():
    """A study's `overrides` reach every run except a pruning field the row's pruner does not read (a rate on the GRPO
    row would stop the study) and a field the row sets beyond the study setup (T5's grid, T4's ablated stage)."""
    notes: list[str] = []
    over = {"prompt_prune_rate": 0.3, "completion_prune_rate": 0.6, "epochs": 1, "lr": 2e-4}
    layouts = {**studies.study_layouts("main_results", overrides=over, report=notes.append),
               **studies.study_layouts("ablations", overrides=over, report=notes.append),
               **studies.study_layouts("sensitivity", overrides=over, report=notes.append)}
    for table, layout in layouts.items():
        for label, (config, fields, _) in layout.items():
            cfg = TrainConfig.load(ROOT / config, fields)  # raised ConfigError before: a rate on the GRPO row
            assert cfg.lr == 2e-4 and cfg.epochs == (8 if "8 epochs" in label else 1), (table, label)
            if label.startswith("r_q="):  # T5's grid stays the grid
                assert (cfg.prompt_prune_rate, cfg.completion_prune_rate) == (_rate(label, "r_q"), _rate(label, "r_o"))
    t1, t4 = layouts["T1"], layouts["T4"]
    assert (t1["DPPO"][1]["prompt_prune_rate"], t1["DPPO"][1]["completion_prune_rate"]) == (0.3, 0.6)
    assert t1["CPPO"][1]["completion_prune_rate"] == 0.6 and "prompt_prune_rate" not in t1["CPPO"][1]
    assert not {"prompt_prune_rate", "completion_prune_rate"} & (set(t1["GRPO"][1]) | set(t1["GRESO"][1]))
    for label, rates in (("prompt stage only", (0.3, 0.0)), ("completion stage only", (0.0, 0.6))):  # the ablated stage
        assert (t4[label][1]["prompt_prune_rate"], t4[label][1]["completion_prune_rate"]) == rates
    # what is left out is said, a line per field and reason, naming the rows
    for row, pruner in (("GRPO", "none"), ("GRESO", "greso"), ("CPPO", "cppo")):
        assert f"overrides: prompt_prune_rate not applied to {row} (pruner {pruner} does not read it)" in notes, notes
    assert any("completion stage only" in n and "the row sets it" in n for n in notes), notes
    assert not any("lr" in n or "epochs" in n for n in notes), notes
    with pytest.raises(ValueError, match="'pruner' is what a study's rows differ in"):
        studies.study_layouts("main_results", overrides={"pruner": "cppo"})


def test_results_dir_takes_the_tables_and_figures_along():
    assert results.figures_dir() == results.FIGURES
    assert results.figures_dir(profile="paper") == results.FIGURES / "paper"
    assert results.figures_dir("mine", False, "cpu") == results.RESULTS / "mine" / "figures"
    assert results.figures_dir("mine", False, "paper") == results.RESULTS / "paper" / "mine" / "figures"
    assert results.figures_dir("/abs/mine", True, "cpu") == Path("/abs/mine/figures")


def test_a_notebook_with_results_dir_leaves_the_default_figures_alone(tmp_path):
    """The packing notebook (smoke size) with results_dir: its CSV and F4 go there, nothing to the default figures."""
    default = results.figures_dir(smoke=True) / "F4_packing.png"
    before = default.stat().st_mtime_ns if default.exists() else None
    done = subprocess.run([str(Path(sys.executable).with_name("papermill")), "notebooks/packing.ipynb",
                           str(tmp_path / "packing.ipynb"), "-p", "results_dir", str(tmp_path / "mine"),
                           "--no-progress-bar"], cwd=ROOT, env={**os.environ, "DPPO_SMOKE": "1"},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "mine" / "packing" / "packing.csv").is_file()
    assert (tmp_path / "mine" / "figures" / "F4_packing.png").is_file()
    assert (default.stat().st_mtime_ns if default.exists() else None) == before


def test_f3_draws_the_default_rule_and_writes_its_numbers_beside_it(tmp_path):
    """paper_figures redraws F3 without naming rules: the library's default proportional rule is still drawn, and the
    numbers the README quotes are written beside the figure."""
    import pandas as pd

    from dppo import figures

    rates = [0.0, 0.5]
    pd.DataFrame([{"estimator": "DPPO (r_q = r_o = r)", "rate": r, "bias": 0.0, "bias_se": 0.1, "variance": r,
                   "variance_rel": r, "closed_form_variance": r, "full_grad_sq": 1.0, "bias_in_se": 0.0}
                  for r in rates]).to_csv(tmp_path / "variance.csv", index=False)
    default = f"proportional, {TrainConfig.size_proxy}, mix {TrainConfig.uniform_mix:g}"  # the library's default
    pd.DataFrame([{"split": "report", "batch_seed": s, "rate": 0.5, "rule": rule, "ratio": ratio}
                  for s in (100, 101) for rule, ratio in ((default, 0.5 + s - 100), ("oracle", 0.1))]
                 ).to_csv(tmp_path / "proxies.csv", index=False)
    fig = figures.figure_f3(tmp_path, out=tmp_path / "out")
    assert default in [t.get_text() for t in fig.axes[2].get_legend().get_texts()]
    assert pd.read_csv(tmp_path / "out" / "F3_gradient_variance.csv")["variance_rel"].tolist() == rates
    summary = pd.read_csv(tmp_path / "out" / "F3_gradient_variance_proportional.csv").set_index("rule")
    assert summary.loc[default, ["median", "min", "max"]].tolist() == [1.0, 0.5, 1.5]
    assert summary.loc[default, ["batches_below_uniform", "batches_below_at_every_rate"]].tolist() == [1, 1]
    assert summary.loc["oracle", "batches_below_at_every_rate"] == 2 and (summary["batches"] == 2).all()


def test_papermill_reads_every_notebook_parameter_without_a_warning(caplog):
    """papermill parses a parameters cell line by line and warns 'Unable to parse line N' for a line with a second '='
    (an '==' or an '=' in the comment): `./reproduce.sh` printed one per such parameter, noise a newcomer reads as an
    error. Every parameter of every study notebook parses, with its comment as its help."""
    import logging

    import nbformat
    from papermill.translators import PythonTranslator

    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cell = next(c for c in nbformat.read(path, 4).cells if "parameters" in c.metadata.get("tags", []))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="papermill"):
            parsed = PythonTranslator.inspect(cell)
        assigned = [line for line in cell.source.splitlines() if line and not line[0].isspace()
                    and not line.startswith(("#", "import", "from", "}", "]")) and " = " in line]
        assert not caplog.records and len(parsed) == len(assigned), (path.name, caplog.text)
        assert all(p.help for p in parsed), (path.name, [p.name for p in parsed if not p.help])


def test_reading_a_run_folder_imports_neither_torch_nor_the_trainer(tmp_path):
    """Tables, figures, benches and notebooks read metrics.jsonl through dppo.runfiles / dppo.results /
    dppo.tables: none of that imports torch (or the trainer, which does)."""
    import json

    lines = [{"step": 0, "eval/avg": 0.25, "eval/level1": 0.25}]
    lines += [{"step": s, "epoch": s / 2, "timing_s/step": 1.5, "cpu_s/step": 3.0, "flops/step": 1e9, "reward": 0.4,
               "tokens/generated": 100, "tokens/trained": 80, "kept/prompt_frac": 1.0, "kept/completion_frac": 0.8,
               "density/valid_token": 0.9, **({"eval/avg": 0.5, "eval/level1": 0.5} if s == 4 else {})}
              for s in range(1, 5)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    code = ("import sys; from dppo import results, runfiles, tables; "
            f"row = results.summarize({str(tmp_path)!r}); assert row['steps'] == 4 and row['acc/avg'] == 0.5, row; "
            f"assert len(runfiles.read_metrics({str(tmp_path / 'metrics.jsonl')!r})) == 5; "
            "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'dppo.trainer'))); "
            "assert not loaded, loaded")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_run_stopped_part_way_is_not_finished(tmp_path):
    """paper_figures builds a table only from runs trained to their end (a run killed mid-way has metrics, and
    summarising it raised a KeyError): the last metrics line carries the final evaluation, or the run is missing."""
    import json

    def run(name, records):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return tmp_path / name

    done = run("done", [{"step": 0, "eval/avg": 0.2}, {"step": 1, "loss": 0.1},
                        {"step": 2, "loss": 0.1, "eval/avg": 0.3}])
    killed = run("killed", [{"step": 0, "eval/avg": 0.2}, {"step": 1, "loss": 0.1}])
    assert results.finished(done) and not results.finished(killed) and not results.finished(tmp_path / "none")


def _imports(lazy: bool) -> dict[str, set[str]]:
    """dppo module -> the dppo modules it imports: at module level, or anywhere in it (`lazy`: imports inside
    functions too)."""
    import ast

    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / "dppo").glob("*.py")):
        tree = ast.parse(path.read_text())
        found = out.setdefault(path.stem, set())
        for node in (ast.walk(tree) if lazy else tree.body):
            if isinstance(node, ast.ImportFrom) and node.module == "dppo":
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dppo."):
                found.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("dppo.")}
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (a path that returns to its start), or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node, path):
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None
    return next((c for m in sorted(graph) if m not in state and (c := visit(m, [m]))), None)


def test_no_import_cycle():
    """No dppo module imports one that imports it back, at module level or inside a function: the rollout backends
    are named in a registry by import path (dppo.rollout), so dppo.rollout and dppo.vllm_rollout no longer import
    each other; the memory plan owns its sizes (dppo.budget reads them, not the other way). Negative control: the
    check finds a cycle added to the graph."""
    assert _cycle(_imports(lazy=False)) is None
    graph = _imports(lazy=True)
    assert _cycle(graph) is None, _cycle(graph)
    graph["vllm_rollout"].add("rollout")
    graph["rollout"].add("vllm_rollout")
    assert _cycle(graph) is not None


def _load_run(path, threads: list[int], other_cores: list[float], machine: dict | None = None,
              per_step: bool = True):
    """A run folder of len(threads) one-second steps that computed with `threads[i]` intra-op threads (CPU time: a
    core each) and met `other_cores[i]` cores of other work; `per_step` False: a run of earlier code that logged
    neither."""
    import json

    rows = [{"step": 0, "eval/avg": 0.2}]
    rows += [{"step": i + 1, "epoch": (i + 1) / len(threads), "timing_s/step": 1.0, "cpu_s/step": float(t),
              "flops/step": 1.0, "tokens/generated": 1, "tokens/trained": 1, "kept/prompt_frac": 1.0,
              "kept/completion_frac": 1.0, "density/valid_token": 1.0,
              **({"load/threads": t, "load/other_cores": o} if per_step else {}),
              **({"eval/avg": 0.3} if i == len(threads) - 1 else {})}
             for i, (t, o) in enumerate(zip(threads, other_cores))]
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "machine.json").write_text(json.dumps(machine or {"cores": 2, "threads": 2}))
    return path


def test_a_run_that_gave_up_a_thread_for_a_tenth_of_its_steps_is_contended(tmp_path):
    """Two runs on 2 cores, 2 threads planned: one quiet throughout, one that met a competing job at step 5 (0.9
    cores while computing with both threads) and so computed steps 6-7 with one thread (the auto policy) — 10% of
    its 20 steps at 1 thread of 2, about 15% of its time contended. Its whole-run means read quiet (1.9 threads,
    0.15 other cores: within the cores it left free + 0.25), so the old rule missed it; the step-level rule flags it. A
    one-thread run with another job on the core it leaves free is not contended; a run of earlier code that logged no
    per-step load still summarizes and is not flagged by the step rule."""
    import math

    import pandas as pd

    from dppo import tables

    quiet = [0.02] * 20
    busy_threads = [2] * 5 + [1, 1] + [2] * 13
    busy_other = [0.02] * 4 + [0.9, 0.9, 0.9] + [0.02] * 13
    runs = {"quiet": [_load_run(tmp_path / "quiet", [2] * 20, quiet)],
            "busy for a few steps": [_load_run(tmp_path / "busy", busy_threads, busy_other)],
            "one thread, a job on its free core": [_load_run(tmp_path / "one", [1] * 20, [0.9] * 20,
                                                             {"cores": 2, "threads": 1})],
            "earlier code": [_load_run(tmp_path / "old", [2] * 20, quiet, per_step=False)]}
    seeds = tables.per_seed(runs, "quiet").set_index("label")
    assert seeds["contended"].to_dict() == {"quiet": False, "busy for a few steps": True,
                                            "one thread, a job on its free core": False, "earlier code": False}
    # the whole-run rule alone: 0.152 other cores against 0.1 free + 0.25; the threads' core share equal to the others'
    assert not (seeds["load/other_cores"] > seeds["load/spare_cores"] + tables.OTHER_CORES_LIMIT).any()
    row = results.summarize(tmp_path / "busy")
    assert row["load/threads"] == pytest.approx(1.9) and row["load/other_cores"] == pytest.approx(0.152)
    assert row["load/contended_frac"] == pytest.approx(3 / 20)  # step 5 (0.9 cores, none free), steps 6-7 (1 thread)
    assert results.summarize(tmp_path / "quiet")["load/contended_frac"] == 0.0
    assert results.summarize(tmp_path / "one")["load/contended_frac"] == 0.0
    assert math.isnan(results.summarize(tmp_path / "old")["load/contended_frac"])
    steps = results.contended_steps(pd.Series([2, 1, 2, 2]), pd.Series([0.2, 0.0, 0.3, 0.1]), 2, 2)
    assert steps.tolist() == [False, True, True, False]  # 0.2 <= 0 free + 0.25; fewer threads; 0.3 > 0 free + 0.25
    one_thread = results.contended_steps(pd.Series([1, 1]), pd.Series([1.2, 1.3]), 1, 2)
    assert one_thread.tolist() == [False, True]  # 1 core free: 1.2 within it + 0.25, 1.3 beyond


def test_each_rows_training_time_is_split_by_phase(tmp_path):
    """Beside every speed-up, where the time went (docs/method.md §5): summarize sums each phase's timing_s/* over
    the training steps (rollout with its reward, the no-grad scoring passes, the update), and the markdown table shows
    the mean over seeds in minutes, per row."""
    import json

    from dppo import tables

    def run(path, rollout, update, scoring=0.0):
        rows = [{"step": 0, "eval/avg": 0.2}] + [
            {"step": i + 1, "epoch": (i + 1) / 4, "timing_s/step": rollout + update + scoring + 1.0, "cpu_s/step": 1.0,
             "flops/step": 1.0, "tokens/generated": 1, "tokens/trained": 1, "kept/prompt_frac": 1.0,
             "kept/completion_frac": 1.0, "density/valid_token": 1.0, "timing_s/rollout": rollout - 1.0,
             "timing_s/reward": 1.0, "timing_s/old_logprob": scoring, "timing_s/ref_logprob": 0.0,
             "timing_s/update": update, **({"eval/avg": 0.3} if i == 3 else {})} for i in range(4)]
        path.mkdir(parents=True)
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path
    grpo, dppo = run(tmp_path / "grpo", 15.0, 45.0), run(tmp_path / "dppo", 12.0, 18.0, scoring=3.0)
    row = results.summarize(dppo)
    assert (row["phase_s/rollout"], row["phase_s/scoring"], row["phase_s/update"]) == (48.0, 12.0, 72.0)
    summary = tables.aggregate(tables.per_seed({"GRPO": [grpo], "DPPO": [dppo]}, "GRPO"))
    md = tables.markdown(summary)
    assert "rollout / scoring / update (min)" in md
    assert "1.00 / 0.00 / 3.00" in md and "0.80 / 0.20 / 1.20" in md, md


def test_a_committed_run_log_is_reused_without_its_weights_wherever_the_clone_lies(tmp_path, monkeypatch, embedded):
    """A fresh clone holds a real-profile run as its committed log (results.LOG_FILES; no final/, no checkpoints):
    a study whose config and code match reuses it instead of training again, wherever the clone lies (config.yaml's
    output_dir is another path there); other code, a log cut short, or a config that keeps checkpoints after final/
    (the case study reads them) trains again."""
    out, fits = tmp_path / "a" / "run", []
    fit = Trainer.fit
    monkeypatch.setattr(Trainer, "fit", lambda self: (fits.append(1), fit(self))[1])
    results.run("experiments/cpu/grpo.yaml", out, smoke=True)
    clone = tmp_path / "elsewhere" / "run"
    clone.mkdir(parents=True)
    for name in results.LOG_FILES:  # what git keeps of it
        if (out / name).is_file():
            shutil.copy(out / name, clone / name)
    assert {p.name for p in clone.iterdir()} >= {"config.yaml", "metrics.jsonl", "machine.json", results.CODE_FILE,
                                                 results.COMMIT_FILE}
    assert results.prepare("experiments/cpu/grpo.yaml", clone, smoke=True) is None  # reused: nothing to train
    assert len(fits) == 1
    monkeypatch.setenv(results.RETRAIN_ENV, "1")  # ./reproduce.sh --retrain: trained again, from scratch
    again = results.prepare("experiments/cpu/grpo.yaml", clone, smoke=True)
    assert again is not None and not again.resume
    assert results.prepare("experiments/cpu/grpo.yaml", out, smoke=True) is not None  # its weights do not stand either
    monkeypatch.delenv(results.RETRAIN_ENV)
    for name in results.LOG_FILES:  # (prepare rewrote the clone's code and commit files: the same values)
        if (out / name).is_file():
            shutil.copy(out / name, clone / name)
    cut = tmp_path / "cut" / "run"
    shutil.copytree(clone, cut)
    lines = (cut / "metrics.jsonl").read_text().splitlines(keepends=True)
    (cut / "metrics.jsonl").write_text("".join(lines[:-1]))  # the final evaluation's line lost: not finished
    assert results.prepare("experiments/cpu/grpo.yaml", cut, smoke=True) is not None
    assert results.prepare("experiments/cpu/grpo.yaml", clone, smoke=True, keep_checkpoints_after_final=True) \
        is not None  # needs checkpoints a log does not keep
    shutil.rmtree(clone)
    shutil.copytree(out, clone, ignore=shutil.ignore_patterns("final", "checkpoints"))
    monkeypatch.setattr(results, "code_hash", lambda: "0" * 64)  # the package's source changed since
    assert results.prepare("experiments/cpu/grpo.yaml", clone, smoke=True) is not None


def test_the_training_commit_says_when_the_training_code_differs_from_it(tmp_path):
    """commit.txt names the commit the training code comes from: the last that changed a module that trains (not a
    REPORTING_MODULES one), '+modified' when one is edited or added and not committed; 'unknown' outside git."""
    pkg = tmp_path / "repo" / "dppo"
    pkg.mkdir(parents=True)
    (pkg / "trainer.py").write_text("x = 1\n")
    (pkg / "tables.py").write_text("y = 1\n")

    def git(*args):
        subprocess.run(["git", "-C", str(pkg.parent), *args], check=True, capture_output=True)
    git("init", "-q")
    git("-c", "user.email=a@b", "-c", "user.name=a", "add", ".")
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "one")
    head = subprocess.run(["git", "-C", str(pkg), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True).stdout.strip()

    def commit():
        results.training_commit.cache_clear()
        return results.training_commit(pkg)
    assert commit() == head
    (pkg / "tables.py").write_text("y = 2\n")  # a reporting module: the training code is still HEAD's
    assert commit() == head
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qam", "reports only")
    assert commit() == head  # a later commit that changed no training code: the same one
    (pkg / "trainer.py").write_text("x = 2\n")
    assert commit() == f"{head}+modified"
    (pkg / "trainer.py").write_text("x = 1\n")
    (pkg / "new_module.py").write_text("z = 1\n")  # a new module trains until it is listed as reporting
    assert commit() == f"{head}+modified"
    results.training_commit.cache_clear()
    outside = tmp_path / "plain" / "dppo"
    outside.mkdir(parents=True)
    assert results.training_commit(outside) == "unknown"
    results.training_commit.cache_clear()
