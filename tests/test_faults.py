"""kill -9 at the worst moments (tests/fault_worker.py): a resumed run's metrics and final weights equal an
uninterrupted run's (docs/engineering.md §4.3); also for one rank of a 2-process run killed, and for a metrics line cut by
a kill while it was appended."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
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


def test_a_metrics_line_cut_by_a_kill_is_dropped_by_readers_and_by_the_resumed_run(tmp_path, embedded):
    """A run killed while it appended step 3's line to metrics.jsonl leaves half a JSON object and no newline after
    the step-2 checkpoint (simulated here: the half line written after a 2-step run). Readers (`read_metrics`, and
    `run_metrics` on what it returns) drop that line with a warning instead of failing; the resumed run drops it
    too, trains step 3 and logs it exactly once, and the file is whole JSON lines again."""
    import warnings

    from dist_worker import FixedRollout

    from dppo.config import TrainConfig
    from dppo.runfiles import RunWarning, json_line
    from dppo.trainer import Trainer

    def config(max_steps):
        return TrainConfig(output_dir=str(tmp_path), train_size=8, eval_size=2, eval_samples=1, prompts_per_step=4,
                           group_size=4, max_new_tokens=16, max_steps=max_steps, eval_every=1000, save_every=1,
                           intra_op_threads=1)

    FixedRollout.install(Trainer(config(2))).fit()
    path = tmp_path / "metrics.jsonl"
    whole = path.read_text()
    assert [r["step"] for r in read_metrics(path)] == [0, 1, 2]
    cut = json_line({**read_metrics(path)[-1], "step": 3})
    path.write_text(whole + cut[: len(cut) // 2])  # no newline: the write stopped mid-line
    with pytest.warns(RunWarning, match="dropped its last line, cut short"):
        records = read_metrics(path)
    assert [r["step"] for r in records] == [0, 1, 2] and [run_metrics(r)["step"] for r in records] == [0, 1, 2]
    with pytest.warns(RunWarning, match=r"dropped 1 line\(s\) from line 4 on"):
        FixedRollout.install(Trainer(config(3))).fit()  # resumes from checkpoints/step_2
    text = path.read_text()
    assert text.endswith("\n") and text.startswith(whole)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # whole lines now: no warning
        assert [r["step"] for r in read_metrics(path)] == [0, 1, 2, 3]


def test_the_trainer_appends_a_metrics_line_in_one_write_of_the_whole_line(tmp_path, monkeypatch):
    """Trainer._log hands the kernel the whole line, newline included, in one write(2) on an O_APPEND descriptor (a
    buffered text-mode append may split it); a reader of the live file sees whole lines only."""
    import os
    from types import SimpleNamespace

    from dppo import runfiles
    from dppo.trainer import Trainer

    writes, real_write = [], os.write
    monkeypatch.setattr(runfiles.os, "write", lambda fd, data: (writes.append((fd, bytes(data))), real_write(fd, data))[1])
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n')
    record = {"step": 1, "loss": float("nan"), "long": "x" * 100_000}  # far beyond an 8 KiB buffer
    Trainer._log(SimpleNamespace(is_main=True, metrics_path=path), record)
    assert len(writes) == 1 and writes[0][1] == (runfiles.json_line(record) + "\n").encode()
    assert os.stat(path).st_size == len('{"step": 0}\n') + len(writes[0][1])
    assert [r["step"] for r in read_metrics(path)] == [0, 1] and read_metrics(path)[1]["loss"] is None


ROOT = Path(__file__).resolve().parents[1]
# a 2-process DPPO run in a few minutes of CPU: 5 steps of 4 prompts x 4 completions of <= 16 tokens, a checkpoint
# every step, one intra-op thread (the summation order, and so the weights, then do not depend on the machine's load)
TWO_RANKS = dict(train_size=12, epochs=2, eval_size=2, eval_samples=1, prompts_per_step=4, group_size=4,
                 max_new_tokens=16, max_steps=5, eval_every=1000, save_every=1, keep_checkpoints=2, lr=2e-4,
                 pruner="dppo", prompt_prune_rate=0.5, completion_prune_rate=0.5, intra_op_threads=1)


def _torchrun2(*args: str) -> subprocess.CompletedProcess:
    """Two ranks under torchrun (gloo on CPU), as tests/test_distributed.py starts them; the result, whatever it is."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def _processes_naming(text: str) -> list[str]:
    """The live processes whose command line contains `text` (a run's folder or config: its ranks, its torchrun)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # not a process, or gone meanwhile
            continue
        if proc.name.isdigit() and text in cmdline and int(proc.name) != os.getpid():
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


def test_a_rank_killed_mid_run_is_resumed_by_the_same_command_like_an_uninterrupted_run(tmp_path, embedded):
    """kill -9 of rank 1 of a 2-process DPPO run (torchrun, gloo) after its third step: torchrun ends the other rank
    (no process of the run is left), and `dppo train --config` run again resumes from the last checkpoint (taking
    over the lock if the dead run left it), logs every step exactly once and ends with the final weights of an
    uninterrupted 2-process run, bit for bit (one intra-op thread per rank)."""
    def config(name: str) -> str:
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**TWO_RANKS, "output_dir": str(tmp_path / name)}))
        return str(path)

    def train(name: str) -> subprocess.CompletedProcess:
        done = _torchrun2("-m", "dppo.cli", "train", "--config", config(name))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
        return done

    full, cut = tmp_path / "full", tmp_path / "cut"
    train("full")
    killed = _torchrun2(WORKER, str(cut), "rank1:step:3", config("cut"))
    assert killed.returncode != 0 and "Signal 9 (SIGKILL)" in killed.stderr, killed.stderr[-5000:]
    assert not _processes_naming(str(tmp_path)), _processes_naming(str(tmp_path))  # torchrun ended rank 0 too
    assert [r["step"] for r in read_metrics(cut / "metrics.jsonl")] == [0, 1, 2, 3]
    assert (cut / "checkpoints" / "step_3" / "trainer_state.json").is_file() and not (cut / "final").exists()
    stale = (cut / ".lock").exists()  # left when torchrun's SIGTERM ended rank 0 (no cleanup), not when it raised
    resumed = train("cut")  # the same command again
    said = resumed.stdout + resumed.stderr
    assert "resumed from" in said and "(step 3)" in said, said[-3000:]
    assert not stale or "took over the lock" in said, said[-3000:]
    assert not _processes_naming(str(tmp_path)) and not (cut / ".lock").exists()
    assert [r["step"] for r in read_metrics(cut / "metrics.jsonl")] == [0, 1, 2, 3, 4, 5]  # each step once
    assert _metrics(cut) == _metrics(full)
    a, b = (load_file(str(d / "final" / "model.safetensors")) for d in (full, cut))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
