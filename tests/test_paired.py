"""Runs trained in turn (dppo.paired) compute exactly what they compute alone, and really alternate; the load meter
(dppo.machine) sees a competing CPU-bound process and the tables flag the runs it slowed (docs/engineering.md §5.1)."""

import torch
from safetensors.torch import load_file

from dppo import seeding
from dppo.config import TrainConfig
from dppo.paired import fit_in_turn
from dppo.trainer import Trainer, read_metrics, run_metrics

SMALL = dict(train_size=16, epochs=100, eval_size=2, eval_samples=1, prompts_per_step=8, group_size=4,
             max_new_tokens=32, warmup_steps=1, lr=2e-4, save_every=1000)


def test_runs_trained_in_turn_equal_runs_trained_alone(tmp_path, embedded):
    """GRPO (3 steps) and DPPO (2 steps, both stages pruning) in turn: each one's metrics (clocks apart) and final
    weights equal its run alone, bit for bit, though the two draw from the same process-global random streams;
    their steps alternate until the shorter one ends."""
    configs = {"grpo": dict(max_steps=3, eval_every=2),
               "dppo": dict(max_steps=2, eval_every=2, pruner="dppo", prompt_prune_rate=0.5, completion_prune_rate=0.5)}
    for name, extra in configs.items():
        Trainer(TrainConfig(output_dir=str(tmp_path / "alone" / name), **SMALL, **extra)).fit()
    order = []
    real_step = Trainer.train_step

    def spy(self):
        order.append(self.out.name)
        return real_step(self)

    Trainer.train_step = spy
    try:
        accuracies = fit_in_turn([lambda name=name, extra=extra: Trainer(TrainConfig(
            output_dir=str(tmp_path / "turn" / name), **SMALL, **extra)) for name, extra in configs.items()])
    finally:
        Trainer.train_step = real_step
    assert order == ["grpo", "dppo"] * 2 + ["grpo"]
    for (name, _), acc in zip(configs.items(), accuracies):
        alone, turn = (tmp_path / x / name for x in ("alone", "turn"))
        assert [run_metrics(r) for r in read_metrics(turn / "metrics.jsonl")] == \
            [run_metrics(r) for r in read_metrics(alone / "metrics.jsonl")]
        a, b = (load_file(str(d / "final" / "model.safetensors")) for d in (alone, turn))
        assert all(torch.equal(a[k], b[k]) for k in a)
        assert acc == {k[5:]: v for k, v in read_metrics(alone / "metrics.jsonl")[-1].items() if k.startswith("eval/")}


def test_a_competing_process_is_caught_and_a_quiet_run_is_not(tmp_path, embedded):
    """Two runs of one config: a quiet one, and one beside which a CPU-bound process starts at its third step (one
    core of busy Python, not a child of this process: another job). The load meter reads most of a core during the
    contended steps and little during the quiet ones (time-weighted means: a single short step can catch a daemon);
    the table flags the busy run (and its pair), not the quiet one. The machine's load is read first, the test idle
    for 3 s: a developer training beside the suite makes no run quiet, so the test skips and says so (a meter that
    counted this process's own work as other work reads nothing then, and still fails below)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import pytest

    from dppo import tables
    from dppo.machine import LoadMeter

    meter = LoadMeter()
    meter.start()
    time.sleep(3)
    before_test = meter.stop()
    if before_test > tables.OTHER_CORES_LIMIT / 2:
        pytest.skip(f"the machine is busy before the test: {before_test:.2f} cores of other work over 3 s (a quiet "
                    f"run needs under {tables.OTHER_CORES_LIMIT / 2:.2f}); run it alone")

    competitor = []
    real_step = Trainer.train_step

    def step_with_competitor(self):
        if self.step == 2 and self.out.name == "busy":  # started by a child that exits: reparented, not ours
            spawn = ("import subprocess as s, sys; print(s.Popen([sys.executable, '-c', 'while True: pass'], "
                     "stdin=s.DEVNULL, stdout=s.DEVNULL, stderr=s.DEVNULL).pid)")
            competitor.append(int(subprocess.run([sys.executable, "-c", spawn], capture_output=True, text=True,
                                                 check=True).stdout))
        return real_step(self)

    Trainer.train_step = step_with_competitor
    try:
        for name in ("quiet", "busy"):
            Trainer(TrainConfig(output_dir=str(tmp_path / name), max_steps=5, eval_every=1000, **SMALL)).fit()
    finally:
        Trainer.train_step = real_step
        for pid in competitor:
            os.kill(pid, signal.SIGKILL)

    def mean_load(name, steps):  # time-weighted, as the tables do
        m = [r for r in read_metrics(tmp_path / name / "metrics.jsonl") if r["step"] in steps]
        return sum(r["load/other_cores"] * r["timing_s/step"] for r in m) / sum(r["timing_s/step"] for r in m)

    quiet, before, during = mean_load("quiet", range(1, 6)), mean_load("busy", (1, 2)), mean_load("busy", (3, 4, 5))
    assert max(quiet, before) < tables.OTHER_CORES_LIMIT < 0.5 < during, (quiet, before, during)
    seeds = tables.per_seed({"quiet": [tmp_path / "quiet"], "busy": [tmp_path / "busy"]}, "quiet")
    assert list(seeds["contended"]) == [False, True] and list(seeds["pair_contended"]) == [False, True]


def test_intra_op_threads_hold_while_the_run_computes_and_are_restored(tmp_path, embedded):
    """`intra_op_threads: 1`: every step computes with one thread; the process's own setting is back afterwards (runs
    trained in turn, or other work in the process, keep theirs)."""
    import os

    import pytest

    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: torch's default is already one thread")
    before, seen = torch.get_num_threads(), []
    real_step = Trainer.train_step

    def spy(self):
        seen.append(torch.get_num_threads())
        return real_step(self)

    Trainer.train_step = spy
    try:
        Trainer(TrainConfig(output_dir=str(tmp_path), max_steps=2, eval_every=1000, intra_op_threads=1, **SMALL)).fit()
    finally:
        Trainer.train_step = real_step
    assert seen == [1, 1] and torch.get_num_threads() == before > 1


def test_auto_threads_follow_the_cores_other_work_left_free(tmp_path, embedded, monkeypatch):
    """`intra_op_threads: -1` (the CPU experiments' setting): a step computes with a thread per core the previous step
    found free — all of them on a quiet machine, one fewer after a step in which another job took a core (the meter
    reads 1.0 for step 2 here), all again once it is gone; `load/threads` logs what each step used."""
    import os

    import pytest

    from dppo import machine, trainer

    cores = os.cpu_count() or 1
    if cores < 2:
        pytest.skip("one core: auto is always one thread")
    assert [machine.free_cores(o, 2) for o in (0.0, 0.2, 0.3, 0.9, 1.0, 1.9)] == [2, 2, 1, 1, 1, 1]
    assert [machine.free_cores(o, 8) for o in (0.0, 0.24, 0.26, 3.1, 9.0)] == [8, 8, 7, 5, 1]
    readings = iter([0.01, 1.0, 0.01, 0.01])

    class Meter(machine.LoadMeter):
        def stop(self):
            super().stop()
            return next(readings)

    monkeypatch.setattr(trainer, "LoadMeter", Meter)
    before = torch.get_num_threads()
    Trainer(TrainConfig(output_dir=str(tmp_path), max_steps=4, eval_every=1000, intra_op_threads=-1, **SMALL)).fit()
    used = [r["load/threads"] for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] > 0]
    assert used == [cores, cores, cores - 1, cores] and torch.get_num_threads() == before


def test_the_final_evaluations_stream_depends_only_on_the_runs_seed():
    """Common random numbers (docs/method.md §6.1): DPPO's last step is 15, GRPO's 16; their final evaluations sample
    on one stream (the initial evaluation's: step 0 of (seed, "evaluation")), periodic ones at one step on that
    step's, and two seeds never on one."""
    from dppo.trainer import eval_step

    assert eval_step(15, final=True) == eval_step(16, final=True) == eval_step(0, final=False) == 0
    assert eval_step(8, final=False) == 8
    streams = {(seed, step): seeding.stream_seed(seed, "evaluation", eval_step(step, final))
               for seed in (0, 1, 17) for step, final in ((0, False), (8, False), (16, True))}
    assert len(set(streams.values())) == 3 * 2  # per seed: the initial = the final one, and step 8's


def test_final_evaluations_of_one_seed_share_their_sampling_seed(tmp_path, embedded, monkeypatch):
    """Common random numbers (docs/method.md §6.1): two runs of seed 0, one ending at step 3 and one at step 2
    (DPPO ends before GRPO), evaluate their final models on one sampling stream (the initial evaluation's), whatever
    step they ended at; a periodic evaluation samples on its step's. Every evaluation logs the samples it graded
    (`eval_n`: 6 splits x 2 problems x 1 sample), which the equal-compute tolerance reads (docs/method.md §6.2)."""
    from dppo import trainer

    seeds: dict[str, list[tuple[int, int, int]]] = {}
    current: list[Trainer] = []  # the run being trained

    def recorded(engine, splits, k, temperature, max_new_tokens, seed=0, step=0, **kwargs):  # no sampling: its key
        seeds.setdefault(current[0].out.name, []).append((current[0].step, seed, step))
        return {**{name: 0.5 for name in splits}, "avg": 0.5}

    monkeypatch.setattr(trainer, "evaluate", recorded)
    for name, steps in (("long", 3), ("short", 2)):
        tr = Trainer(TrainConfig(output_dir=str(tmp_path / name), max_steps=steps, eval_every=2, seed=0, **SMALL))
        current[:] = [tr]
        tr.fit()
    assert seeds == {"long": [(0, 0, 0), (2, 0, 2), (3, 0, 0)], "short": [(0, 0, 0), (2, 0, 0)]}
    logged = [r.get("eval_n") for r in read_metrics(tmp_path / "long" / "metrics.jsonl") if "eval/avg" in r]
    assert logged == [6 * 2 * 1] * 3
