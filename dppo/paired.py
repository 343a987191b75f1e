"""Runs that share the machine's state: the runs of a comparison trained in turn, step by step, in one process
(docs/engineering.md §5.1).

A speed-up compares a run with its baseline; trained one after the other, a burst of load during one of them (another
job, thermal throttling, a noisy neighbour) lands on one side of the ratio only. Trained in turn — a step of the
first run, then a step of the second, ... — every burst longer than a few steps hits each run alike, and the ratio
of their summed step times holds. Each run keeps its own random streams (python, numpy, torch, CUDA): a run trained
in turn computes exactly what it computes alone (tested), only its clocks differ.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import numpy as np
import torch


class RandomStreams:
    """The process-global random states a run draws from, saved and restored around each of its turns."""

    def __init__(self) -> None:
        self.save()

    def save(self) -> None:
        self.state = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
                      torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None)

    def restore(self) -> None:
        py, npy, cpu, cuda = self.state
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def fit_in_turn(make_trainers: list[Callable[[], object]]) -> list[dict[str, float]]:
    """Build each trainer (`make_trainers`: functions returning a `dppo.trainer.Trainer`), then advance them one step
    each in turn until every one has finished; a finished run drops out and the others go on. Returns each run's
    final eval accuracies, in order. Each trainer is built in its own random streams (a Trainer seeds the globals
    when built), so building the next one does not move the previous one's."""
    outside = RandomStreams()
    runs: list[tuple[Iterator[int], RandomStreams]] = []
    for make in make_trainers:
        trainer = make()
        runs.append((trainer.steps(), RandomStreams()))
    results: list[dict[str, float] | None] = [None] * len(runs)
    with ExitStack() as stack:
        for steps, _ in runs:  # a run stopped by an error releases its folder's lock
            stack.callback(steps.close)
        active = list(range(len(runs)))
        while active:
            for i in list(active):
                steps, streams = runs[i]
                streams.restore()
                try:
                    next(steps)
                except StopIteration as done:
                    results[i] = done.value
                    active.remove(i)
                streams.save()
    outside.restore()
    return results
