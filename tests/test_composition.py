"""Step composition with refill (docs/method.md §3.1): coverage, budgets, and exact unbiasedness over a whole epoch."""

import copy

import pytest
import torch

from dppo.composition import PromptStream, StepComposer, compose_step, exact_count_stretch
from masks import enumerate_draws

from dppo.history import PromptHistory
from dppo.pruning import DPPO, prune_step

N, G, B = 6, 3, 2
LENGTHS = [8.0, 2.0, 5.0, 9.0, 5.0, 12.0]  # completion length of each prompt when rolled out
LAST_LENGTHS = [2, 9, 6]  # ... and at the last visit, of the prompts seen before this epoch


def test_compose_step_is_greedy_by_length_within_the_expected_budget():
    est = [3.0, 10.0, 7.0, 1.0, 8.0]
    half = torch.tensor([0.5, 1.0, 1.0, 0.5, 0.5], dtype=torch.float64)  # items 0, 3, 4 are candidates at r = 0.5
    chosen = compose_step(est, lambda idx: half[idx], [1.0] * 5, budget=2.0)
    assert chosen == [1, 4, 0]  # 10 (cost 1), 8 (0.5), 7 would exceed, 3 (0.5): expected cost 2.0
    tokens = compose_step(est, lambda idx: half[idx], est, budget=12.0)
    assert tokens == [1, 0, 3]  # 10 (cost 10); 8 (+4) and 7 (+7) exceed 12; 3 (+1.5); 1 (+0.5) = 12
    assert compose_step([5.0, 2.0], lambda idx: torch.ones(len(idx)), [50.0, 20.0], budget=10.0) == [0]  # oversize


def _history():
    h = PromptHistory()
    h.update(0, [1.0] * G, [0.0] * G, [LAST_LENGTHS[0]] * G, step=0)  # zero variance when last seen: candidates
    h.update(1, [0.0] * G, [0.0] * G, [LAST_LENGTHS[1]] * G, step=0)
    h.update(2, [1.0, 0.0, 1.0], [0.7, 1.2, 0.7], [LAST_LENGTHS[2]] * G, step=0)  # informative: never a candidate
    return h  # prompts 3, 4, 5 were never seen: estimated by the mean recorded length


def _composer(refill, window=4, epochs=1):
    return StepComposer(PromptStream(N, seed=0, limit=int(epochs * N)), refill, window, G)


@pytest.mark.parametrize("refill", ["prompts", "tokens"])
def test_every_prompt_is_covered_once_per_epoch_and_windows_stay_in_their_epoch(refill):
    pruner = DPPO(prompt_prune_rate=0.5)
    comp, hist = _composer(refill, epochs=3), _history()
    for k in (3, 4):  # four of the six prompts are candidates
        hist.update(k, [0.0] * G, [0.0] * G, [4] * G, step=0)
    seen, steps = [], 0
    while not comp.finished():
        epoch = comp.covered // N
        keys = comp.next_keys(B, hist, pruner)
        assert keys and all(k in comp.stream.order(epoch) for k in keys)
        seen += keys
        steps += 1
        assert comp.covered <= (epoch + 1) * N  # a step never takes prompts of the next epoch
    for e in range(3):
        assert sorted(seen[e * N:(e + 1) * N]) == list(range(N))
    if refill == "prompts":  # pruning candidates frees budget: fewer steps than the 3 * N / B without refill
        assert steps < 3 * N / B


def test_fixed_count_prompt_budget_rolls_out_exactly_the_budget():
    pruner = DPPO(prompt_prune_rate=0.5, prune_sampling="fixed_count")
    hist = PromptHistory()
    for k in range(40):  # every other prompt was zero-variance last epoch
        hist.update(k, [float(k % 2)] * G if k % 4 < 2 else [1.0, 0.0, 0.0], [0.0] * G, [k % 7 + 1] * G, step=0)
    comp = StepComposer(PromptStream(40, seed=1, limit=40), "prompts", 16, G)
    gen = torch.Generator().manual_seed(0)
    rolled = []
    while not comp.finished():
        sel = pruner.select_prompts(comp.next_keys(8, hist, pruner), hist, gen)
        rolled.append(int(sel.keep.sum()))
    assert all(r == 8 for r in rolled[:-1]) and rolled[-1] <= 8
    assert len(rolled) < 40 / 8


def _epoch_expectation(pruner, refill, normaliser, loss):
    """Enumerate every prompt and completion mask of every step of one epoch (through `prune_step`).
    Returns (E[sum over steps of c_s * L_hat_s], the coverage partitions reached), c_s = |S_s| G with the
    covered normaliser and 1 with the fixed one; checks E[L_hat_s | past] = sum_{S_s} l / Z_s at every step
    of every branch on the way (Z_s = |S_s| G, or B G)."""
    rewards = {0: [1.0] * G, 1: [0.0] * G, 2: [1.0, 0.0, 0.0], 3: [0.0, 1.0, 1.0], 4: [1.0] * G, 5: [1.0, 0.0, 1.0]}
    partitions = set()

    def walk(comp, hist, covered_so_far):
        if comp.finished():
            partitions.add(tuple(covered_so_far))
            return 0.0
        keys = comp.next_keys(B, hist, pruner)

        def one_step():
            step = prune_step(pruner, keys, hist, lambda ks: (torch.tensor([rewards[k] for k in ks]),
                                                             torch.tensor([[int(LENGTHS[k])] * G for k in ks])),
                              torch.Generator(), group_size=G, loss_normaliser=normaliser, prompts_per_step=B)
            value = float((step.weights * loss[step.rolled].reshape(-1)[step.rows]).sum()) / step.normaliser
            return value, tuple(step.rolled)
        outcomes = enumerate_draws(one_step)
        z = len(keys) * G if normaliser == "covered" else B * G
        step_mean = sum(p * v for p, (v, _) in outcomes)
        assert step_mean == pytest.approx(float(loss[keys].sum()) / z, rel=1e-9, abs=1e-12)
        by_rolled: dict[tuple, float] = {}
        for p, (_, rolled) in outcomes:  # the history after the step depends only on what was rolled out
            by_rolled[rolled] = by_rolled.get(rolled, 0.0) + p
        rest = 0.0
        for rolled, p in by_rolled.items():
            h2 = copy.deepcopy(hist)
            for k in rolled:
                h2.update(k, rewards[k], [0.0] * G, [LENGTHS[k]] * G, step=1)
            rest += p * walk(copy.deepcopy(comp), h2, covered_so_far + [tuple(keys)])
        return step_mean * (z if normaliser == "covered" else 1.0) + rest

    total = walk(_composer(refill), _history(), [])
    return total, partitions


@pytest.mark.parametrize("mode", ["bernoulli", "fixed_count"])
@pytest.mark.parametrize("refill", ["prompts", "tokens"])
@pytest.mark.parametrize("normaliser", ["covered", "fixed"])
def test_refill_is_exactly_unbiased_over_an_epoch(mode, refill, normaliser):
    """covered: every step unbiased for its covered prompts' mean loss, and sum_s |S_s| G L_hat_s for the
    epoch's summed loss; fixed (Z = B G): sum_s L_hat_s unbiased for sum of all losses / (B G), which is GRPO's
    summed step losses over the epoch (docs/method.md §2.6)."""
    loss = torch.randn(N, G, generator=torch.Generator().manual_seed(5), dtype=torch.float64)  # arbitrary l_{q,i}
    pruner = DPPO(prompt_prune_rate=0.5, completion_prune_rate=0.5, prune_sampling=mode)
    total, partitions = _epoch_expectation(pruner, refill, normaliser, loss)
    target = float(loss.sum()) if normaliser == "covered" else float(loss.sum()) / (B * G)
    assert total == pytest.approx(target, rel=1e-9)  # every prompt's G losses, once
    if refill == "tokens":  # coverage of later steps depends on earlier masks (through the lengths seen)
        assert len(partitions) > 1


def test_exact_count_stretch_keeps_exactly_the_target_by_hand():
    """fixed_count keeps n_other + n_cand - floor(r n_cand) of a stretch; the shortest stretch that keeps the target
    (dppo.trl's batches), or None when the whole stream cannot."""
    T, F = True, False
    assert exact_count_stretch([T, T, T, F], 0.5, 2) == 3  # 3 candidates, 1 dropped
    assert exact_count_stretch([T, F, T], 0.5, 2) == 2  # 1 candidate, none dropped, + 1 other
    assert exact_count_stretch([T, T, T, T, T], 0.7, 2) == 4  # floor(2.8) = 2 of 4 dropped; 3 gives 3 - 2 = 1
    assert exact_count_stretch([F, F, F], 0.9, 2) == 2  # no candidate: the next B prompts, as TRL's own batch
    assert exact_count_stretch([T, T], 0.5, 2) is None  # 2 candidates keep 1


def test_without_refill_a_step_takes_its_prompts_in_stream_order():
    """Refill groups a step's rollouts by length (longest first from its window: docs/method.md §3.1); a step without
    refill (GRPO, CPPO, GRESO) takes the next prompts of the stream in the stream's order, whatever the history says
    of their lengths — a length grouping there would give those methods a rollout-speed effect no row measures."""
    from dppo.history import PromptHistory
    from dppo.pruning import build_pruner
    from dppo.config import TrainConfig

    history = PromptHistory()
    for k in range(40):  # every prompt seen, lengths that would reorder any window
        history.update(k, [1.0, 0.0], [1.0, 1.0], [float((7 * k) % 29 + 1)] * 2, step=0)
    pruner = build_pruner(TrainConfig())
    composer = StepComposer(PromptStream(40, seed=3, limit=80), refill="none", window=16)
    reference = PromptStream(40, seed=3, limit=80)
    for _ in range(10):
        assert composer.next_keys(8, history, pruner) == reference.take(8)
    refilled = StepComposer(PromptStream(40, seed=3, limit=80), refill="prompts", window=16)
    keys = refilled.next_keys(8, history, pruner)
    lengths = history.estimated_lengths(keys, 1.0)
    assert lengths == sorted(lengths, reverse=True) and keys != PromptStream(40, seed=3, limit=80).take(8)
