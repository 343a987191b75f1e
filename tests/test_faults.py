"""kill -9 at the worst moments (tests/fault_worker.py): a resumed run's metrics and final weights equal an
uninterrupted run's (docs/method.md §4.3)."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dppo.trainer import read_metrics, run_metrics

WORKER = str(Path(__file__).with_name("fault_worker.py"))


def _run(out: Path, point: str) -> int:
    return subprocess.run([sys.executable, WORKER, str(out), point], capture_output=True, text=True,
                          timeout=600).returncode


def _metrics(out: Path) -> list[dict]:
    return [run_metrics(r) for r in read_metrics(out / "metrics.jsonl")]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("faults") / "full"
    assert _run(out, "none") == 0
    return out


@pytest.mark.parametrize("point", ["checkpoint:3", "update:4", "final"])
def test_kill_and_resume_reproduces_the_run(tmp_path, uninterrupted, point):
    out = tmp_path / "run"
    assert _run(out, point) == -9  # SIGKILL: no handler, no cleanup ran
    assert (out / ".lock").exists()  # the dead run's lock is left behind ...
    if point.startswith("checkpoint"):  # killed mid-write: only the temporary folder has the step's files
        assert (out / "checkpoints" / ".step_3.tmp" / "model.safetensors").is_file()
        assert not (out / "checkpoints" / "step_3").exists()
    if point == "final":
        assert (out / ".final.tmp").is_dir() and not (out / "final").exists()
    assert _run(out, "none") == 0  # ... and taken over
    assert _metrics(out) == _metrics(uninterrupted)
    a, b = (load_file(str(o / "final" / "model.safetensors")) for o in (out, uninterrupted))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
