"""A full disk ends a run in one line and loses nothing (docs/engineering.md §4.3): on a real size-limited filesystem
(a tmpfs this test mounts; skipped, with the reason, where the process cannot mount one), the write that does not fit
— a checkpoint, the final weights, a metrics line — stops the run with one line naming the folder, the bytes it
needed and those free, leaves no partial temporary file, and the last complete checkpoint resumes the run once there
is space (here: the folder copied to a disk with room)."""

import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from dppo.config import TrainConfig
from dppo.runfiles import RunError, read_metrics
from dppo.trainer import Trainer

TINY = dict(train_size=12, eval_size=2, eval_samples=1, prompts_per_step=3, group_size=4, max_new_tokens=16,
            eval_every=1000, max_steps=3, save_every=1, keep_checkpoints=2)


@pytest.fixture
def small_disk(tmp_path):
    """mount(size): a fresh tmpfs of `size` bytes under tmp_path (unmounted after the test)."""
    mounted = []

    def mount(size: int) -> Path:
        point = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
                              capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}): needs root or "
                        f"CAP_SYS_ADMIN")
        mounted.append(point)
        return point
    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def _checkpoint_bytes(tmp_path, embedded) -> int:
    """The bytes one checkpoint of TINY's run takes (the same run on an ample disk)."""
    out = tmp_path / "ample"
    Trainer(TrainConfig(output_dir=str(out), **{**TINY, "max_steps": 1})).fit()
    return sum(f.stat().st_size for f in (out / "checkpoints" / "step_1").rglob("*") if f.is_file())


def test_a_checkpoint_that_does_not_fit_stops_in_one_line_and_the_last_one_resumes(tmp_path, small_disk, embedded):
    ckpt = _checkpoint_bytes(tmp_path, embedded)
    disk = small_disk(int(1.5 * ckpt) + 64 * 1024)  # one checkpoint and the logs fit, the second does not
    out = disk / "run"
    with pytest.raises(RunError) as stop:
        Trainer(TrainConfig(output_dir=str(out), **TINY)).fit()
    said = str(stop.value)
    assert "\n" not in said and said.startswith("checkpoint step 2: no space left on the device of ")
    assert str(out / "checkpoints") in said and "free" in said and "step_1" in said
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_1"]  # no .step_2.tmp left
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]  # whole lines only
    roomy = tmp_path / "roomy" / "run"
    shutil.copytree(out, roomy, ignore=shutil.ignore_patterns(".lock"))
    Trainer(TrainConfig(output_dir=str(roomy), **TINY)).fit()  # resumes from step_1, ends at step 3
    rows = read_metrics(roomy / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and (roomy / "final").is_dir()


def test_final_weights_that_do_not_fit_stop_in_one_line(tmp_path, small_disk, embedded):
    ckpt = _checkpoint_bytes(tmp_path, embedded)
    disk = small_disk(int(1.15 * ckpt) + 64 * 1024)  # the one checkpoint fits; the final weights after it do not
    out = disk / "run"
    with pytest.raises(RunError) as stop:
        Trainer(TrainConfig(output_dir=str(out), **{**TINY, "max_steps": 1, "keep_checkpoints": 1})).fit()
    said = str(stop.value)
    assert "\n" not in said and said.startswith("final weights: no space left on the device of ")
    assert not (out / ".final.tmp").exists() and not (out / "final").exists()
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_1"]


def test_a_study_short_of_disk_refuses_before_any_run_trains(tmp_path, small_disk, embedded):
    """A study laid out into a folder whose free space is under its runs' dry-run estimate (`dppo.disk.disk_plan`:
    final/ and checkpoints, the runs of a seed held at once as they train in turn) stops in one line with the numbers
    before any run trains; with room, the same estimate lets it pass."""
    from dppo import results, studies
    from dppo.disk import disk_plan, disk_shortfall, free_bytes

    layout = {"GRPO": studies.T1_RUNS["GRPO"], "DPPO": studies.T1_RUNS["DPPO"]}
    disk = small_disk(1024 * 1024)  # 1 MiB: the embedded model's runs need tens of MB
    with pytest.raises(RunError) as stop:
        results.run_layout(layout, seeds=[0], smoke=True, root=disk / "study")
    said = str(stop.value)
    assert "\n" not in said and said.startswith(f"this study: not enough disk in {str(disk / 'study')!r}")
    assert re.search(r"need up to [\d.,]+ [MG]B at once \([\d.,]+ [MG]B kept when done.*, [\d.,]+ [MG]B free;", said), said
    assert not any(disk.rglob("metrics.jsonl"))  # nothing trained
    configs = [results._config(c, tmp_path / label, True, **o) for label, (c, o, _) in layout.items()]
    kept, most = disk_plan([configs])
    assert most > kept > 0 and disk_plan([[c] for c in configs])[1] < most  # in turn: both runs' peaks at once
    assert free_bytes(disk / "not" / "made") == free_bytes(disk) < most
    assert disk_shortfall([configs], tmp_path, "this study") is None  # the test machine's disk has room


def test_a_disk_that_holds_one_run_at_a_time_trains_the_study_one_run_at_a_time(tmp_path, small_disk, embedded):
    """Runs trained in turn hold their checkpoints at once (a seed's 4 SmolLM2 smoke runs: 8.6 GB, where one at a
    time needs 3.8). Where the disk holds the study's kept files and one run's checkpoints but not two runs', the
    runs train in turn in smaller groups (`dppo.disk.runs_at_once`, `results.in_turn_chunks`'s `at_most`) and the
    study finishes, never over the disk; refusing it (the check alone) or filling the disk mid-run were the
    alternatives."""
    import json

    from dppo import progress, results, studies
    from dppo.disk import disk_plan, run_disk_bytes, runs_at_once

    layout = {"GRPO": studies.T1_RUNS["GRPO"], "DPPO": studies.T1_RUNS["DPPO"]}
    configs = [results._config(c, tmp_path / label, True, **o) for label, (c, o, _) in layout.items()]
    (kept, peak), together, apart = run_disk_bytes(configs[0]), disk_plan([configs])[1], disk_plan([[c] for c in configs])[1]
    assert apart < together and peak > kept  # the room this test needs: one run's checkpoints, not two
    disk = small_disk(int((apart + together) / 2))
    assert runs_at_once(configs, disk) == 1 and runs_at_once(configs, tmp_path) >= 2
    notes = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(progress, "note", notes.append)
        runs = results.run_layout(layout, seeds=[0], smoke=True, root=disk / "study")
    for label, (folder,) in runs.items():
        assert results.finished(folder), label
        groups = json.loads((folder / results.IN_TURN_FILE).read_text())["sittings"]
        assert [len(g["runs"]) for g in groups] == [1], (label, groups)  # one at a time
    assert any("holds 1 run(s) training at once" in n for n in notes), notes


def test_the_reproduction_checks_its_dry_runs_disk_before_training(tmp_path, small_disk):
    """`python -m dppo.budget --check-disk FOLDER` (what ./reproduce.sh runs before its first notebook): silent and
    0 where the studies' dry-run disk at most fits, one line and exit 3 where it does not."""
    import sys

    disk = small_disk(1024 * 1024)
    check = [sys.executable, "-m", "dppo.budget", "--profile", "cpu", "--study", "main_results", "--check-disk"]
    short = subprocess.run([*check, str(disk)], capture_output=True, text=True)
    assert short.returncode == 3 and short.stdout == "", short
    line = short.stderr.strip()
    assert "\n" not in line and line.startswith(f"reproduce.sh: not enough disk in {str(disk)!r} for main_results")
    room = subprocess.run([*check, str(tmp_path)], capture_output=True, text=True)
    assert (room.returncode, room.stdout, room.stderr) == (0, "", ""), room
    script = (Path(__file__).resolve().parents[1] / "reproduce.sh").read_text()
    assert script.index("--check-disk") < script.index("run_notebook \"$nb\"")  # before any notebook trains


def test_a_metrics_line_that_does_not_fit_leaves_the_log_whole(small_disk):
    """A line appended to metrics.jsonl on a full disk stops in one line and leaves no part of itself: the log keeps
    its whole lines (a cut line would be dropped by the readers, but a resumed run would append after it)."""
    from dppo.runfiles import append_line

    disk = small_disk(64 * 1024)
    log = disk / "metrics.jsonl"
    append_line(log, '{"step": 0}')
    (disk / "filler").write_bytes(b"\0" * (64 * 1024 - 4096 * 2))  # what is left: less than the next line
    before = log.read_bytes()
    with pytest.raises(RunError) as stop:
        append_line(log, '{"step": 1, "pad": "' + "x" * 20000 + '"}')
    said = str(stop.value)
    assert "\n" not in said and said.startswith("appending to metrics.jsonl: no space left on the device of ")
    assert log.read_bytes() == before and [r["step"] for r in read_metrics(log)] == [0]
