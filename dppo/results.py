"""Training the runs of a study and reading them back (docs/method.md §6). Nothing here trains by itself except
`run`, which is `dppo train` with a smoke switch and a skip for finished runs.

Train time is the sum of `timing_s/step` (training steps; evaluation excluded), so runs compare on the work they
do, not on how often they were evaluated; `cpu_s/step` and `flops/step` are the same sums in process CPU time and
FLOPs (docs/method.md §5). Reading runs (`load_run`, `summarize`, and `dppo.tables` over them) imports neither
torch nor the trainer: those are imported by the functions that train.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from typing import TYPE_CHECKING

import pandas as pd
import psutil
import yaml

from dppo import progress, toy
from dppo.runfiles import RunError, read_metrics
from dppo.studies import FIGURES, RESULTS, ROOT, runs_for

if TYPE_CHECKING:
    from dppo.config import TrainConfig
PROFILES = ("cpu", "paper", "real")  # real: the paper's tables on R1's real model (dppo.studies.real_params)
CODE_FILE = "code.sha256"  # in each run folder: the hash of the dppo source that trained it
COMMIT_FILE = "commit.txt"  # and the git commit of that source (`training_commit`): what tables name
# What a run folder of the real profile keeps in git (.gitignore; no weights): its log, enough to rebuild every table
# and figure without training (paper_figures) and to be reused by a study whose config and code match (`prepare`)
LOG_FILES = ("config.yaml", "metrics.jsonl", "machine.json", "in_turn.json", CODE_FILE, COMMIT_FILE)
RETRAIN_ENV = "DPPO_RETRAIN"  # "1" (./reproduce.sh --retrain): every run a study asks for trains again from scratch
# Other work beyond the cores a run left free that makes a step (or a run, on average) contended: a quiet machine reads
# a few hundredths of a core, one competing CPU-bound process about 1 (docs/engineering.md §5.1; dppo.tables reads it)
OTHER_CORES_LIMIT = 0.25
# Runs trained in turn (dppo.paired) are held in memory together: 16 bytes a parameter each (fp32 weights, gradients,
# AdamW's two moments; 6 SmolLM2 runs measured 11.6 GB resident, 14.4 a parameter), within this share of the memory
# available when a study starts.
IN_TURN_BYTES_PER_PARAM = 16
IN_TURN_MEMORY_FRACTION = 0.6
IN_TURN_FILE = "in_turn.json"  # in each run folder trained in turn: the groups it trained in (record_in_turn)
TWIN = "{} (timing twin)"  # the label of a baseline trained again beside rows it did not train with (in_turn_chunks)
# A study notebook at smoke size (tests): seconds per run, and no checkpoint left once final/ is written (a real
# model's is 1.6 GB with AdamW's state: R1's four smoke runs took 8.1 GB with theirs, 2.1 GB without; the 8.1 filled
# a CI machine's disk).
SMOKE = dict(train_size=24, epochs=1, max_steps=2, eval_size=4, eval_samples=1, eval_every=1000, save_every=1000,
             prompts_per_step=8, group_size=4, keep_checkpoints_after_final=False)


def _profile(profile: str) -> str:
    if profile not in PROFILES:
        raise ValueError(f"parameter 'profile' must be one of {list(PROFILES)}, got {profile!r}")
    return profile


def results_root(smoke: bool = False, profile: str = "cpu") -> Path:
    """Root of the run folders: experiments/results (the paper and real profiles: experiments/results/<profile>), or
    a scratch folder for smoke (test) runs, or the toy root (`dppo.toy`)."""
    root = RESULTS / "smoke" if smoke else toy.root() if toy.active() else RESULTS
    return root if _profile(profile) == "cpu" else root / profile


def study_root(results_dir: str | Path = "", smoke: bool = False, profile: str = "cpu") -> Path:
    """A study's run folders: `results_dir` under the profile's `results_root` (absolute: as given; "" = the root)."""
    return results_root(smoke, profile) / results_dir


def figures_dir(results_dir: str | Path = "", smoke: bool = False, profile: str = "cpu") -> Path:
    """Where a study's tables and figures go: with a `results_dir`, `<study_root(results_dir)>/figures` (beside the
    runs they come from; the committed figures/ stay as they are); else figures/ (the paper profile: figures/paper,
    so the CPU figures stay; the real profile: figures/real), or a scratch folder for smoke (test) runs, or the toy
    root's figures/."""
    if str(results_dir):
        return study_root(results_dir, smoke, profile) / "figures"
    out = RESULTS / "smoke" / "figures" if smoke else toy.root() / "figures" if toy.active() else FIGURES
    return out if _profile(profile) == "cpu" else out / profile


def run(config: str | Path, output_dir: str | Path, smoke: bool = False, launch: dict | None = None,
        **overrides) -> Path:
    """Train `config` (YAML; relative paths from the repository) into `output_dir` with field overrides; `smoke`
    shrinks it to seconds; under the toy profile `dppo.toy.apply` changes it. In this process, or, with `launch`
    ({accelerate_config, num_processes, launcher}; `dppo.launch`), as its own `accelerate launch` over the local
    GPUs. A finished run (its `final/` exists, its config is unchanged and `code_hash()` is the one it was trained
    with) is not trained again; a folder holding another config or trained by other code is started over, never
    resumed (an interrupted run of the same config and code resumes)."""
    cfg = prepare(config, output_dir, smoke, **overrides)
    if cfg is None:
        return Path(output_dir)
    if launch:
        from dppo.launch import launch_run

        launch_run(cfg, launch)
    else:
        _trainer_class()(cfg).fit()
    return Path(output_dir)


def _trainer_class():
    """dppo.trainer.Trainer, imported when a run is trained here (reading runs needs no torch), with transformers'
    per-load and per-save bars off: a study shows one bar per run."""
    from transformers.utils import logging as hf_logging

    from dppo.trainer import Trainer

    hf_logging.disable_progress_bar()
    return Trainer


def prepare(config: str | Path, output_dir: str | Path, smoke: bool = False, **overrides) -> TrainConfig | None:
    """The config `run` trains into `output_dir`, its folder made ready (`code.sha256` and `commit.txt` written; a
    stale final/ removed); None when the folder already holds this run finished by this code (`reusable`)."""
    cfg = _config(config, output_dir, smoke, **overrides)
    out = Path(output_dir)
    if reusable(cfg, out):
        if not cfg.keep_checkpoints_after_final:  # as the trainer does once final/ is written
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
        return None
    if not _same(cfg, out):  # another config or other code: start over, and no stale final/ may stand for the new run
        cfg = dataclasses.replace(cfg, resume=False)
        shutil.rmtree(out / "final", ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / CODE_FILE).write_text(code_hash() + "\n")
    (out / COMMIT_FILE).write_text(training_commit() + "\n")
    return cfg


def _same(cfg: TrainConfig, out: Path, weights: bool = True) -> bool:
    """Whether folder `out` was made for run `cfg` by this code (never under RETRAIN_ENV: trained again, not
    resumed; nothing of the folder stands for the run); `weights`: and holds the checkpoints it keeps (`_same_run`)."""
    before = _saved_config(out)
    code = (out / CODE_FILE).read_text().strip() if (out / CODE_FILE).is_file() else None
    return (before is not None and _same_run(before, cfg, out, weights) and code == code_hash()
            and os.environ.get(RETRAIN_ENV) != "1")


def reusable(cfg: TrainConfig, out: str | Path) -> bool:
    """Whether folder `out` holds run `cfg` finished by this code, so that a study skips it (read only): its weights
    are there, or, for a run that keeps nothing after final/ (nothing reads its weights), its log ends with its final
    evaluation — the committed run logs (LOG_FILES) of a fresh clone are such runs."""
    out = Path(out)
    return ((out / "final").is_dir() and _same(cfg, out)) or (not cfg.keep_checkpoints_after_final
                                                             and logged(cfg, out))


def logged(cfg: TrainConfig, out: str | Path) -> bool:
    """Whether folder `out` logs run `cfg` trained to its end by this code (`finished`, `_same`), its weights there or
    not: a fresh clone's committed logs (LOG_FILES) are such runs."""
    return finished(out) and _same(cfg, Path(out), weights=False)


def keep_weights_only(run_dir: str | Path) -> None:
    """Drop all but the weights (model.safetensors) and trainer_state.json from a finished run's checkpoints: what the
    case study reads (F5). A checkpoint so trimmed no longer resumes a run; a finished run needs none."""
    if not (Path(run_dir) / "final").is_dir():
        raise ValueError(f"{run_dir}: not finished (no final/), so its checkpoints may still be needed to resume it")
    for ckpt in Path(run_dir).glob("checkpoints/step_*"):
        for path in ckpt.iterdir():
            if path.name not in ("model.safetensors", "trainer_state.json"):
                shutil.rmtree(path) if path.is_dir() else path.unlink()


# Config fields that say what a run folder keeps, not what is trained: a finished run serves a config that differs
# in these only, if it kept the checkpoints that config keeps after final/ (the case study reads them).
STORAGE_FIELDS = ("resume", "keep_checkpoints", "keep_checkpoints_after_final")
# Modules that lay out, read or report runs and never train one (the studies' configs are compared field by field):
# editing them leaves every trained run valid. Every other module (a new one too) is part of `code_hash`.
REPORTING_MODULES = ("budget.py", "case_study.py", "disk.py", "figures.py", "protocol.py", "readme.py", "reference.py",
                     "results.py", "studies.py", "tables.py", "variance.py", "verdicts.py")


def _config(config: str | Path, output_dir: str | Path, smoke: bool = False, **overrides) -> TrainConfig:
    """The config `run` trains into `output_dir` (`prepare` without touching the folder)."""
    from dppo.config import TrainConfig

    cfg = TrainConfig.load(ROOT / config, {**(SMOKE if smoke else {}), **overrides, "output_dir": str(output_dir)})
    return toy.apply(cfg) if toy.active() else cfg


def _same_run(before: TrainConfig, cfg: TrainConfig, out: Path, weights: bool = True) -> bool:
    """Whether the run saved in `out` with config `before` is the run `cfg` asks for (see STORAGE_FIELDS), with the
    checkpoints it keeps after final/ still there unless not `weights` (a log alone: `logged`)."""
    kept = any((out / "checkpoints").glob("step_*"))  # the folder is the run: where the clone lies does not matter
    return (dataclasses.replace(before, **{f: getattr(cfg, f) for f in (*STORAGE_FIELDS, "output_dir")}) == cfg
            and (kept or not cfg.keep_checkpoints_after_final or not weights))


@functools.lru_cache(maxsize=1)
def code_hash(pkg: Path = Path(__file__).resolve().parent) -> str:
    """sha256 of the dppo source that trains (every .py file of `pkg` but REPORTING_MODULES, by relative path and
    content): a run folder records the code that trained it, so tables are never made from runs of older code."""
    digest = hashlib.sha256()
    for path in sorted(pkg.rglob("*.py")):
        if path.relative_to(pkg).as_posix() not in REPORTING_MODULES:
            digest.update(str(path.relative_to(pkg)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def training_commit(pkg: Path = Path(__file__).resolve().parent) -> str:
    """The git commit of the training code (the files `code_hash` reads) this checkout runs: the last commit that
    changed any of them (so runs trained at later commits that changed only reports, docs or tests name the same
    one), with '+modified' when any of them differs from HEAD's (an edit or a new file not committed: the commit
    alone does not describe the code); 'unknown' outside a git checkout."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(pkg), *args], capture_output=True, text=True, check=True).stdout

    excluded = [f":(exclude){name}" for name in REPORTING_MODULES]
    try:
        last = git("log", "-1", "--format=%h", "--abbrev=12", "--", ".", *excluded).strip()
        changed = git("status", "--porcelain", "--untracked-files=all", "--", ".", *excluded).splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    modified = any(line.rstrip().endswith(".py") for line in changed)
    return (last or "uncommitted") + ("+modified" if modified else "")


def _saved_config(out: Path) -> TrainConfig | None:
    """The config a run folder was made with (None: no run, or one of an older dppo that no longer loads)."""
    from dppo.config import ConfigError, TrainConfig

    try:
        return TrainConfig.load(out / "config.yaml") if (out / "config.yaml").is_file() else None
    except ConfigError:
        return None


def run_layout(layout: dict, seeds=(0,), smoke: bool = False, launch: dict | None = None,
               root: str | Path = "", profile: str = "cpu",
               baseline: Callable[[str], str] | None = None) -> dict[str, list[Path]]:
    """Train every run of a study layout (`dppo.studies`) for every seed under `study_root(root, smoke, profile)`
    (finished runs are skipped); {label: [run folder per seed]}. On CPU in this process (no `launch`) the runs of one
    seed — every run a table compares with its baseline of that seed — are trained in turn, step by step
    (`dppo.paired`), so a burst of load hits both sides of each speed-up alike (held in memory together: as many as
    fit, `in_turn_chunks`, each run with its `baseline` where they fit; every embedded run of a seed, 5 of SmolLM2's
    on 24 GB); launched runs (one process group each), GPU runs and vLLM runs go one after the other. Progress goes to
    the progress file (`dppo.progress`)."""
    from dppo.disk import disk_shortfall, runs_at_once
    from dppo.rollout import rollout_backend

    root = study_root(root, smoke, profile)
    todo = [(label, cfg, over, root / sub) for label, specs in runs_for(layout, seeds).items() for cfg, over, sub in specs]
    out: dict[str, list[Path]] = {}
    for label, _, _, folder in todo:
        out.setdefault(label, []).append(folder)
    groups: dict[object, list[tuple[str, TrainConfig]]] = {}
    specs: dict[tuple[int, str], tuple[str, dict, Path]] = {}  # (seed, label) -> config, overrides, folder
    seen: set[Path] = set()
    for i, (label, config, over, folder) in enumerate(todo):
        specs[over["seed"], label] = (config, over, folder)
        if folder in seen:  # one run under two labels (T4's DPPO is T5's r_q = r_o = 0.5): it trains once
            continue
        seen.add(folder)
        cfg = prepare(config, folder, smoke, **over)
        if cfg is None:
            progress.note(f"{label}, seed {over['seed']}: finished earlier ({folder.relative_to(root)})")
            continue
        # in turn: CPU runs in this process (on a GPU each run needs the device's memory for itself)
        together = not launch and rollout_backend(cfg.rollout_backend).samples_training_model and not _cuda()
        groups.setdefault(("seed", cfg.seed) if together else ("alone", i), []).append((label, cfg))
    # the disk bounds a group too: runs in turn hold their checkpoints at once (the toy's stand-ins keep the names of
    # the models they stand for, not their sizes: no estimate there)
    at_most = None if toy.active() else runs_at_once([cfg for group in groups.values() for _, cfg in group], root)
    if at_most is not None and any(len(group) > at_most for key, group in groups.items() if key[0] == "seed"):
        progress.note(f"the disk under {root} holds {at_most} run(s) training at once beside what the study keeps "
                      f"(dppo.disk.runs_at_once): a seed's runs train in turn in groups of at most {at_most}")
    chunks, in_turn = [], []
    for key, group in groups.items():
        configs = {label: _config(c, f, smoke, **o) for (seed, label), (c, o, f) in specs.items()
                   if key[0] == "seed" and seed == key[1]}
        parts = in_turn_chunks(group, psutil.virtual_memory().available, baseline, configs, at_most)
        chunks += parts
        in_turn += [key[0] == "seed"] * len(parts)
    twin_of: dict[Path, Path] = {}
    twins = {(seed, TWIN.format(label)): label for seed, label in specs}
    for chunk in chunks:  # a timing twin trains in its own folder beside the baseline's, named for its first row
        for j, (label, cfg) in enumerate(chunk):
            if (cfg.seed, label) in twins:
                base = twins[cfg.seed, label]
                config, over, folder = specs[cfg.seed, base]
                row = next(Path(c.output_dir).parent.name for x, c in chunk
                           if baseline(x) == base and x not in (base, label))
                twin = folder.with_name(f"{folder.name}_timing_{row}")
                chunk[j] = (label, prepare(config, twin, smoke, **over))
                twin_of[twin] = folder
        chunk[:] = [(label, cfg) for label, cfg in chunk if cfg is not None]  # a twin finished earlier
    short = None if toy.active() else disk_shortfall([[cfg for _, cfg in chunk] for chunk in chunks], root,
                                                     "this study")
    if short:  # before any run starts: a full disk mid-run costs the run (runfiles.space_for says it in one line)
        raise RunError(short)
    trained = 0.0
    for n, group in enumerate(chunks, 1):
        names = ", ".join(f"{label}, seed {cfg.seed} -> {Path(cfg.output_dir).relative_to(root)}" for label, cfg in group)
        eta = f"; about {trained / (n - 1) * (len(chunks) - n + 1) / 60:.0f} min left" if n > 1 else ""
        progress.note(f"training {n}/{len(chunks)}: {names}" + (" (in turn, step by step)" if len(group) > 1 else "")
                      + eta)
        t0 = time.perf_counter()
        if launch:
            from dppo.launch import launch_run

            launch_run(group[0][1], launch)
        else:
            from dppo.paired import fit_in_turn

            if in_turn[n - 1]:  # which runs shared the machine's clock (tables pair wall-clock speed-ups within one)
                record_in_turn([Path(cfg.output_dir) for _, cfg in group], root, twin_of,
                               f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {n}/{len(chunks)}")
            trainer = _trainer_class()
            fit_in_turn([lambda cfg=cfg: trainer(cfg) for _, cfg in group])
        trained += time.perf_counter() - t0
        progress.note(f"training {n}/{len(chunks)} done in {time.perf_counter() - t0:.0f} s")
    return out


def in_turn_chunks(group: list[tuple[str, TrainConfig]], available_bytes: float,
                   baseline: Callable[[str], str] | None = None,
                   configs: dict[str, TrainConfig] | None = None,
                   at_most: int | None = None) -> list[list[tuple[str, TrainConfig]]]:
    """A seed's runs split into groups trained in turn that fit in memory, in order: each run held in turn keeps its
    fp32 weights, gradients and AdamW's moments (IN_TURN_BYTES_PER_PARAM), and all of them may take
    IN_TURN_MEMORY_FRACTION of `available_bytes` (rollouts, activations and evaluation beside). A wall-clock speed-up is
    paired only within a group (the host's speed drifts between groups: docs/results.md, T5 from a fresh clone), so
    with `baseline` (a row label -> the label it is compared with: `dppo.studies.Table.baseline`) a baseline and its
    rows are kept in one group where they fit, whole units packed in order (T2's 6 runs: X and X + DPPO together, 4
    and 2). Where a unit does not fit (T4: one GRPO, 7 rows) or its baseline trained earlier (T5's cells, after T4),
    each group of its rows without the baseline also trains the baseline's timing twin — label `TWIN.format(base)`,
    the baseline's config from `configs` (the seed's runs by label, finished ones too), its folder set by the caller —
    the same run again, whose clock the rows' speed-ups use (`timed_with`). Without `baseline`: as few groups as fit,
    of balanced sizes (15 SmolLM2 runs, 32 GB, on a 24 GB machine: 3 groups of 5). The embedded models' runs all fit
    in one group; a run whose model size the name does not give (`dppo.studies.model_params`) keeps the group whole.
    `at_most` caps a group's size beside memory: the runs whose checkpoints the disk holds at once
    (`dppo.disk.runs_at_once`)."""
    from dppo.studies import model_params

    try:
        per_run = max(model_params(cfg.model_name_or_path) for _, cfg in group) * IN_TURN_BYTES_PER_PARAM
    except ValueError:
        return [group]
    fit = max(1, int(available_bytes * IN_TURN_MEMORY_FRACTION // per_run))
    fit = min(fit, at_most or fit)
    configs = configs or {}
    labels = {label for label, _ in group}
    if baseline is None or (len(group) <= fit and all(baseline(label) in labels or baseline(label) not in configs
                                                      for label in labels)):
        parts = math.ceil(len(group) / fit)
        size = math.ceil(len(group) / parts)
        return [group[i:i + size] for i in range(0, len(group), size)]
    units: dict[str, list[tuple[str, TrainConfig]]] = {}  # baseline label -> it and its rows, in order
    for label, cfg in group:
        base = baseline(label)
        units.setdefault(base if base in labels or base in configs else label, []).append((label, cfg))
    chunks: list[list[tuple[str, TrainConfig]]] = []
    for base, unit in units.items():
        rows = sorted(unit, key=lambda run: run[0] != base)  # the baseline first, where it trains here
        pieces = []
        if rows[0][0] == base:
            pieces.append(rows[:fit])
            rows = rows[fit:]
        twin = [(TWIN.format(base), configs[base])] if base in configs and fit > 1 else []
        pieces += [twin + rows[i:i + fit - len(twin)] for i in range(0, len(rows), fit - len(twin))]
        for piece in pieces:
            timed = chunks and any(label in (base, TWIN.format(base)) for label, _ in chunks[-1])
            if twin and timed and piece[0] == twin[0] and len(chunks[-1]) + len(piece) - 1 <= fit:
                chunks[-1] += piece[1:]  # the group before holds the baseline (or its twin) already
            elif chunks and len(chunks[-1]) + len(piece) <= fit:
                chunks[-1] += piece
            else:
                chunks.append(list(piece))
    return chunks


def record_in_turn(group: list[Path], root: Path, twin_of: dict[Path, Path], sitting: str) -> None:
    """Write each run folder's IN_TURN_FILE: the sittings it trained in, each {"id", "runs": the group's folders
    relative to `root`}, appended (a resumed run trains in another sitting), and for a timing twin `twin_of` the
    baseline folder it times. `timed_with` reads them back."""
    runs = [str(d.relative_to(root)) for d in group]
    for d in group:
        path = d / IN_TURN_FILE
        rec = json.loads(path.read_text()) if path.is_file() else {"self": str(d.relative_to(root)), "sittings": []}
        rec["sittings"].append({"id": sitting, "runs": runs})
        if d in twin_of:
            rec["twin_of"] = str(twin_of[d].relative_to(root))
        path.write_text(json.dumps(rec, indent=1) + "\n")


def _in_turn(run_dir: Path) -> dict | None:
    path = Path(run_dir) / IN_TURN_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def timed_with(run_dir: str | Path, base_dir: str | Path) -> tuple[Path, str]:
    """The run whose clock a row's wall-clock and CPU speed-ups divide (docs/engineering.md §5.1), and how it trained
    beside the row (IN_TURN_FILE): ("together") its baseline, trained in turn with it in the same sittings;
    ("twin") the baseline's timing twin that did (`in_turn_chunks`); ("apart") neither: the pair's clocks ran at
    different times (or one of them has no record), and tables leave its timed speed-ups out; ("unrecorded") neither
    run has a record (GPU, launched and vLLM runs train one after the other; CPU runs of older dppo): the baseline."""
    run_dir, base_dir = Path(run_dir), Path(base_dir)
    mine, base = _in_turn(run_dir), _in_turn(base_dir)
    if mine is None:
        return base_dir, "unrecorded" if base is None else "apart"
    ids = [s["id"] for s in mine["sittings"]]
    if base is not None and [s["id"] for s in base["sittings"]] == ids:
        return base_dir, "together"
    root = Path(*run_dir.parts[:len(run_dir.parts) - len(Path(mine["self"]).parts)])
    for member in mine["sittings"][-1]["runs"]:
        twin = _in_turn(root / member)
        if twin and root / twin.get("twin_of", "") == base_dir and [s["id"] for s in twin["sittings"]] == ids:
            return root / member, "twin"
    return base_dir, "apart"


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def finished(run_dir: str | Path) -> bool:
    """Whether a run folder holds a run trained to its end: its metrics' last line carries the evaluation every run
    makes after its last step (a run stopped part-way ends on a training step; final/ need not be there: results
    copied from a cluster may leave the weights behind)."""
    path = Path(run_dir) / "metrics.jsonl"
    lines = read_metrics(path) if path.is_file() else []
    return bool(lines) and "eval/avg" in lines[-1]


def load_run(run_dir: str | Path) -> pd.DataFrame:
    """metrics.jsonl as a frame, with `wall_s` = cumulative training seconds at the end of each step."""
    df = pd.DataFrame(read_metrics(Path(run_dir) / "metrics.jsonl"))
    df["wall_s"] = df.get("timing_s/step", pd.Series(0.0, index=df.index)).fillna(0.0).cumsum()
    return df


def eval_splits(df: pd.DataFrame) -> list[str]:
    """The held-out splits a run evaluated, in order: its `eval/<split>` columns (not eval/avg, nor
    eval/<split>/pass@k)."""
    return [c[5:] for c in df.columns if c.startswith("eval/") and c != "eval/avg" and "/" not in c[5:]]


def graded_samples(run_dir: str | Path, splits: list[str]) -> float:
    """n of one evaluation of a run that did not log `eval_n`: from its config.yaml, sum over `splits` of eval_size x
    k (k = eval_samples_per_split.get(split, eval_samples)), as dppo.evaluation samples them — exact for the embedded
    and arithmetic tasks (eval_size problems per split), an upper bound for a file or hub split shorter than eval_size;
    NaN without a config.yaml."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file() or not splits:
        return float("nan")
    cfg = yaml.safe_load(path.read_text())
    per_split = cfg.get("eval_samples_per_split") or {}
    return float(sum(cfg["eval_size"] * per_split.get(s, cfg["eval_samples"]) for s in splits))


def eval_counts(run_dir: str | Path, df: pd.DataFrame) -> pd.Series:
    """Per metrics row: the samples its evaluation graded — `eval_n` where the run logged it (dppo.trainer), else
    `graded_samples` from its config.yaml (runs of earlier code)."""
    logged = df["eval_n"] if "eval_n" in df else pd.Series(float("nan"), index=df.index)
    return logged.astype(float).fillna(graded_samples(run_dir, eval_splits(df)))


# A step's phases (its timing_s/* columns, dppo.trainer): generation and its reward, the no-grad log-prob passes, and
# the update (forward, backward, optimizer); what is left of timing_s/step is the pruner's bookkeeping and the gather.
PHASES = {"rollout": ("timing_s/rollout", "timing_s/reward"), "scoring": ("timing_s/old_logprob", "timing_s/ref_logprob"),
          "update": ("timing_s/update",)}


LAST_K = 3  # the evaluations the "last k" accuracy reading averages (docs/method.md §6.4)


def last_evaluations(df: pd.DataFrame, k: int = LAST_K) -> float:
    """The mean of a run's last `k` evaluations on its evaluation subset during training (`eval_subset/avg`, the final
    evaluation's subset share included; docs/method.md §6.4), a fraction; NaN for a run that evaluated no subset."""
    if "eval_subset/avg" not in df:
        return float("nan")
    trained = df[df["step"] > 0].dropna(subset=["eval_subset/avg"])
    return float(trained["eval_subset/avg"].tail(k).mean()) if len(trained) else float("nan")


def run_commit(run_dir: str | Path) -> str:
    """The commit of the code that trained a run (its COMMIT_FILE, written by `prepare`), "unrecorded" for runs of
    code that did not record it."""
    path = Path(run_dir) / COMMIT_FILE
    return path.read_text().strip() if path.is_file() else "unrecorded"


def summarize(run_dir: str | Path) -> dict:
    """One row: final accuracy per split and average, the step-0 accuracy (NaN when the run skipped it; both on the
    evaluation subset too, `acc_subset/*`, where the run evaluated one), train
    seconds / CPU seconds / FLOPs, steps, epochs, tokens, kept fractions, the cores other work took meanwhile and the
    fraction of training time in contended steps (`contended_steps`)."""
    df = load_run(run_dir)
    machine = json.loads((Path(run_dir) / "machine.json").read_text()) if (Path(run_dir) / "machine.json").is_file() else {}
    evals = df.dropna(subset=["eval/avg"])
    train = df[df["step"] > 0]
    start = evals[evals["step"] == 0]
    splits = eval_splits(df)
    row = {f"acc/{s}": evals.iloc[-1].get(f"eval/{s}") for s in splits}  # every split the runs evaluated, in order
    if "eval_subset/avg" in evals:  # the subset every evaluation sampled (eval_subset_size): the curves' problems
        row.update({"acc_subset/avg": evals.iloc[-1]["eval_subset/avg"], "acc_last_k": last_evaluations(df),
                    "acc_subset/start": start["eval_subset/avg"].iloc[0] if len(start) else float("nan")})
    row.update({
        "acc/avg": evals.iloc[-1]["eval/avg"], "acc/start": start["eval/avg"].iloc[0] if len(start) else float("nan"),
        "eval_n": float(eval_counts(run_dir, df).loc[evals.index[-1]]),  # the samples the final evaluation graded
        # the commit of the code that trained it (`prepare`; tables name it), "unrecorded" for runs of earlier code
        "commit": run_commit(run_dir),
        "train_s": float(train["timing_s/step"].sum()), "steps": int(train["step"].max()),
        "train_cpu_s": float(train["cpu_s/step"].sum()) if "cpu_s/step" in train else float("nan"),
        "train_flops": float(train["flops/step"].sum()) if "flops/step" in train else float("nan"),
        "epochs": float(train["epoch"].max()), "tokens/generated": int(train["tokens/generated"].sum()),
        "tokens/trained": int(train["tokens/trained"].sum()),
        "kept/prompt_frac": float(train["kept/prompt_frac"].mean()),
        "kept/completion_frac": float(train["kept/completion_frac"].mean()),
        "density/valid_token": float(train["density/valid_token"].mean()),
        # cores other work took while this run trained, averaged over its training time (dppo.machine)
        "load/other_cores": _time_weighted(train, "load/other_cores"),
        # the intra-op threads it computed with (time-weighted) and the machine's cores (machine.json)
        "load/threads": _time_weighted(train, "load/threads", machine.get("threads")),
        "cores": float(machine.get("cores", float("nan"))),
        # the share of its training time spent in contended steps (a whole-run average hides a few of them)
        "load/contended_frac": contended_fraction(train, machine),
        # where the training time went (it decides where pruning can save: docs/method.md §5)
        **{f"phase_s/{phase}": float(sum(train[c].sum() for c in columns if c in train))
           for phase, columns in PHASES.items()},
    })
    return row


def contended_steps(threads: pd.Series, other_cores: pd.Series, planned_threads: float, cores: float,
                    limit: float = OTHER_CORES_LIMIT) -> pd.Series:
    """Per training step, whether it was contended (docs/engineering.md §5.1): it computed with fewer intra-op threads
    than the run planned (`load/threads` < planned: the auto policy gave a core up to other work), or other work took
    more than `limit` cores beyond those it left free (`load/other_cores` > max(cores - load/threads, 0) + limit; no
    free core when `cores` is unknown). A step that logged neither is not."""
    spare = (cores - threads).clip(lower=0.0).fillna(0.0)
    return (threads < planned_threads) | (other_cores > spare + limit)


def contended_fraction(train: pd.DataFrame, machine: dict) -> float:
    """The fraction of a run's training time (`timing_s/step`) spent in `contended_steps`, with the planned threads
    of machine.json ("threads"; else the most the run used) and its "cores"; NaN for a run that did not log
    `load/threads` and `load/other_cores` per step (runs of earlier code)."""
    if "load/threads" not in train or "load/other_cores" not in train:
        return float("nan")
    planned = machine.get("threads", train["load/threads"].max())
    hit = contended_steps(train["load/threads"], train["load/other_cores"], float(planned),
                          float(machine.get("cores", float("nan"))))
    return float(train["timing_s/step"][hit].sum() / train["timing_s/step"].sum())


def _time_weighted(train: pd.DataFrame, column: str, default=None) -> float:
    """A per-step metric averaged over the run's training time (`default` when the run did not log it)."""
    if column not in train:
        return float("nan") if default is None else float(default)
    return float((train[column] * train["timing_s/step"]).sum() / train["timing_s/step"].sum())
