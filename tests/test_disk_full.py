"""A full disk ends a run in one line and loses nothing (docs/engineering.md §4.3): on a real size-limited filesystem
(a tmpfs this test mounts; skipped, with the reason, where the process cannot mount one), the write that does not fit
— a checkpoint, the final weights, a metrics line — stops the run with one line naming the folder, the bytes it
needed and those free, leaves no partial temporary file, and the last complete checkpoint resumes the run once there
is space (here: the folder copied to a disk with room)."""

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
