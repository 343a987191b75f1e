"""Which prompts a step covers: the seeded per-epoch prompt stream and refill from a look-ahead window
(docs/method.md §3.1, the first half of Dense Prompt Packing).

Without refill a step covers the next B prompts of the stream. With refill the step reads a window of W
prompts and covers prompts from it, greedily by estimated completion length (longest first), while the
*expected* rollout cost of the covered set stays within the step's budget:

    cost(S) = sum_{q in S} pi_q(S) * c_q,   c_q = 1 (budget in prompts) or G * len_q (budget in tokens)

where pi_q(S) is the prompt stage's inclusion probability and len_q the prompt's mean completion length
at its last visit (never-seen prompts: the mean over all recorded prompts). Prompts not chosen stay in the
window for the next step; a window never spans two epochs, so every prompt is covered once per epoch and
an epoch takes about (1 - mean pruned fraction) as many steps.

Unbiasedness: the covered set S is decided from the history alone, *before* the step's masks are drawn,
so given the history it is fixed and so is the step's normaliser (|S| G, or B G with `loss_normaliser:
fixed`): E[L_hat | history] = L(S) exactly, for every step (docs/method.md §2.5-2.6). (Covering prompts until
a realised count of kept prompts is reached would make |S| depend on the masks and bias the covered-count
normaliser.) The rollout cost is then random around the budget; with `fixed_count` prompt sampling and a
prompt budget it is exact.
"""

from __future__ import annotations

import math
import random
from typing import Callable

import torch

REFILL_MODES = ("none", "prompts", "tokens")


class PromptStream:
    """The training prompts in a seeded permutation per epoch, read front to back across epochs."""

    def __init__(self, size: int, seed: int, limit: int):
        self.size, self.seed, self.limit = size, seed, limit  # limit: prompts in all epochs
        self.consumed = 0
        self._orders: dict[int, list[int]] = {}

    def order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            idx = list(range(self.size))
            random.Random(f"{self.seed}:epoch{epoch}").shuffle(idx)
            self._orders = {epoch: idx}
        return self._orders[epoch]

    def take(self, n: int) -> list[int]:
        """The next `n` prompt indices (may straddle an epoch boundary)."""
        keys = [self.order(c // self.size)[c % self.size] for c in range(self.consumed, self.consumed + n)]
        self.consumed += n
        return keys

    def left_in_epoch(self) -> int:
        """Prompts left before the next epoch boundary or the end of training."""
        return max(0, min(self.size - self.consumed % self.size, self.limit - self.consumed))


def compose_step(est_lengths: list[float], inclusion: Callable[[list[int]], torch.Tensor], costs: list[float],
                 budget: float) -> list[int]:
    """Greedy by estimated length (longest first): add window item j when the expected cost of the chosen
    set with j, sum_q pi_q(S) * costs[q], stays within `budget`. Returns window indices (at least one).

    `inclusion(S)` gives pi for the items of S (a set function: with fixed_count sampling pi depends on S)."""
    order = sorted(range(len(est_lengths)), key=lambda i: (-est_lengths[i], i))
    chosen: list[int] = []
    for j in order:
        trial = chosen + [j]
        pi = inclusion(trial).double()
        if float((pi * torch.tensor([costs[i] for i in trial], dtype=torch.float64)).sum()) <= budget + 1e-9:
            chosen = trial
    return chosen or order[:1]  # an item over the whole budget still gets a step of its own


class StepComposer:
    """Covered prompts per step, with or without refill; its state (stream position and window) is saved
    in checkpoints so a resumed run composes the same steps."""

    def __init__(self, stream: PromptStream, refill: str = "none", window: int = 32, group_size: int = 8,
                 token_budget: int = 0, default_length: float = 32.0):
        if refill not in REFILL_MODES:
            raise ValueError(f"config field 'refill' must be one of {list(REFILL_MODES)}, got {refill!r}")
        self.stream, self.refill, self.window_size = stream, refill, window
        self.group_size, self.token_budget, self.default_length = group_size, token_budget, default_length
        self.window: list[int] = []

    @property
    def covered(self) -> int:
        """Prompts covered so far (taken from the stream and no longer waiting in the window)."""
        return self.stream.consumed - len(self.window)

    def finished(self) -> bool:
        return self.covered >= self.stream.limit

    def next_keys(self, n_prompts: int, history, pruner) -> list[int]:
        """The prompts the next step covers. `n_prompts` is the budget in prompts (B, or CPPO's allocation)."""
        if self.refill == "none":
            return self.stream.take(n_prompts)
        if not self.window or self.stream.consumed % self.stream.size:  # never mix two epochs in the window
            self.window += self.stream.take(min(self.window_size - len(self.window), self.stream.left_in_epoch()))
        est = history.estimated_lengths(self.window, self.default_length)
        if self.refill == "prompts":
            costs, budget = [1.0] * len(est), float(n_prompts)
        else:  # tokens generated: G completions of len_q each; default budget = B groups of mean length
            costs = [self.group_size * x for x in est]
            budget = float(self.token_budget or n_prompts * self.group_size * history.mean_length(self.default_length))
        chosen = compose_step(est, lambda idx: pruner.prompt_inclusion([self.window[i] for i in idx], history),
                              costs, budget)
        keys = [self.window[i] for i in chosen]
        picked = set(chosen)
        self.window = [k for i, k in enumerate(self.window) if i not in picked]
        return keys

    def state_dict(self) -> dict:
        return {"consumed": self.stream.consumed, "window": list(self.window)}

    def load_state_dict(self, state: dict) -> None:
        self.stream.consumed, self.window = state["consumed"], list(state["window"])


def prompt_limit(epochs: float, size: int) -> int:
    """Prompts covered in `epochs` passes over `size` prompts."""
    return math.ceil(epochs * size)


def exact_count_stretch(candidates: list[bool], rate: float, target: int) -> int | None:
    """The shortest stretch of the stream (its first n prompts) in which the fixed_count prompt stage keeps exactly
    `target` prompts: n_other + n_cand - floor(rate n_cand) = target, the count `fixed_count` keeps of n_cand
    candidates at rate r (docs/method.md §3.1; dppo.trl keeps TRL's batch shapes with it). Adding one prompt to the
    stretch raises that count by 0 or 1, so the first n that reaches `target` exists whenever the whole stream
    reaches it; None when it does not. The stretch is decided from the candidates alone, before any mask."""
    n_cand = n_other = 0
    for n, cand in enumerate(candidates, start=1):
        n_cand, n_other = n_cand + cand, n_other + (not cand)
        if n_other + n_cand - math.floor(rate * n_cand) == target:
            return n
    return None
