"""Exact enumeration of pruning masks for the tests: every keep mask with its probability, written from
the definition of each sampling mode (independent of dppo.pruning), and a depth-first walk over every
outcome of every mask a pruning step draws."""

import functools
import itertools
import math
from unittest import mock

import torch

from dppo import pruning


def mask_outcomes(candidates: torch.Tensor, rate: float, mode: str) -> list[tuple[torch.Tensor, float]]:
    """Every keep mask of the candidates with its probability: bernoulli keeps each candidate with 1 - r
    independently; fixed_count drops a uniformly random floor(r n)-subset of the n candidates."""
    idx = candidates.reshape(-1).nonzero().flatten().tolist()
    n = len(idx)
    out = []
    for kept in itertools.product([True, False], repeat=n):
        n_kept = sum(kept)
        if mode == "bernoulli":
            p = (1 - rate) ** n_kept * rate ** (n - n_kept)
        else:
            k = math.floor(rate * n)
            p = 1 / math.comb(n, n - k) if n_kept == n - k else 0.0
        if p == 0:
            continue
        keep = torch.ones(candidates.numel(), dtype=torch.bool)
        for j, flag in zip(idx, kept):
            keep[j] = flag
        out.append((keep.view_as(candidates), p))
    assert math.isclose(sum(p for _, p in out), 1.0)
    return out


def poisson_outcomes(pi: torch.Tensor) -> list[tuple[torch.Tensor, float]]:
    """Every keep mask of independent inclusion with probabilities pi (0 < pi < 1 enumerated; pi = 1 always
    kept, pi = 0 never) and its probability prod pi^k (1 - pi)^(1 - k)."""
    flat = pi.reshape(-1).tolist()
    free = [j for j, p in enumerate(flat) if 0.0 < p < 1.0]
    out = []
    for kept in itertools.product([True, False], repeat=len(free)):
        keep = torch.tensor([p >= 1.0 for p in flat], dtype=torch.bool)
        prob = 1.0
        for j, flag in zip(free, kept):
            keep[j] = flag
            prob *= flat[j] if flag else 1.0 - flat[j]
        out.append((keep.view(pi.shape), prob))
    assert math.isclose(sum(p for _, p in out), 1.0)
    return out


@functools.lru_cache(maxsize=None)
def _cached_outcomes(flat: tuple, shape: tuple, rate: float, mode: str):
    return mask_outcomes(torch.tensor(flat, dtype=torch.bool).view(shape), rate, mode)


def enumerate_draws(run):
    """[(probability, run())] over every outcome of every `dppo.pruning.draw_keep_mask` / `draw_poisson` call that
    `run` makes (later draws may depend on earlier outcomes: the walk is depth-first over that tree). Each draw
    returns one enumerated keep mask (and, for draw_keep_mask, the library's inclusion probabilities); the
    probabilities sum to 1."""
    results, pending = [], [()]
    while pending:
        prefix, taken, prob = pending.pop(), [], [1.0]

        def pick(options):  # the branch of this draw on the current path; queue the others
            if len(taken) < len(prefix):
                j = prefix[len(taken)]
            else:
                j = 0
                pending.extend(tuple(taken) + (k,) for k in range(1, len(options)))
            taken.append(j)
            prob[0] *= options[j][1]
            return options[j][0].clone()

        def draw(candidates, rate, mode, gen):
            options = _cached_outcomes(tuple(candidates.reshape(-1).tolist()), tuple(candidates.shape), rate, mode)
            return pick(options), pruning.inclusion_probs(candidates, rate, mode)

        def poisson(pi, gen):
            return pick(poisson_outcomes(pi))

        with mock.patch.object(pruning, "draw_keep_mask", draw), mock.patch.object(pruning, "draw_poisson", poisson):
            value = run()
        results.append((prob[0], value))
    assert math.isclose(sum(p for p, _ in results), 1.0, rel_tol=1e-12)
    return results


def expectation(run) -> float:
    """E[run()] over every mask outcome (run returns a float or a tensor)."""
    return sum(p * v for p, v in enumerate_draws(run))
