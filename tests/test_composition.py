"""Step composition with refill (SPEC §3.1): coverage, budgets, and exact unbiasedness over a whole epoch."""

import copy

import pytest
import torch

from dppo.composition import PromptStream, StepComposer, compose_step
from dppo.history import PromptHistory
from dppo.losses import grpo_advantages
from dppo.pruning import Selection, completion_candidates, make_pruner
from test_pruning import _subsets_with_prob

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
    pruner = make_pruner("dppo", prompt_rate=0.5)
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
    pruner = make_pruner("dppo", prompt_rate=0.5, sampling="fixed_count")
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


def _epoch_expectation(pruner, refill, rate_q, rate_o, mode, loss):
    """Enumerate every prompt and completion mask of every step of one epoch. Returns (E[sum over steps of
    normaliser_s * L_hat_s], the set of coverage partitions reached); checks E[L_hat_s | past] = L(S_s)
    at every step of every branch on the way."""
    rewards = {0: [1.0] * G, 1: [0.0] * G, 2: [1.0, 0.0, 0.0], 3: [0.0, 1.0, 1.0], 4: [1.0] * G, 5: [1.0, 0.0, 1.0]}
    partitions = set()

    def walk(comp, hist, covered_so_far):
        if comp.finished():
            partitions.add(tuple(covered_so_far))
            return 0.0
        keys = comp.next_keys(B, hist, pruner)
        cand_q = pruner.prompt_candidates(keys, hist)
        pi_q = pruner.prompt_inclusion(keys, hist)
        step_total, rest = 0.0, 0.0
        for keep_q, p_q in _subsets_with_prob(cand_q, rate_q, mode):
            rolled = [k for k, kept in zip(keys, keep_q.tolist()) if kept]
            r = torch.tensor([rewards[k] for k in rolled]).view(-1, G)
            a = grpo_advantages(r).double() if rolled else torch.zeros(0, G, dtype=torch.float64)
            l = loss[rolled] if rolled else torch.zeros(0, G, dtype=torch.float64)
            cand_o = completion_candidates(a, r)
            pi_o = pruner.select_completions(r, a, torch.Generator()).pi
            for keep_o, p_o in _subsets_with_prob(cand_o, rate_o, mode):
                w, norm = pruner.loss_weights(Selection(keep_q, pi_q), Selection(keep_o, pi_o), G)
                step_total += p_q * p_o * float((w.double() * l[keep_o]).sum()) / norm
            h2 = copy.deepcopy(hist)
            for k in rolled:
                h2.update(k, rewards[k], [0.0] * G, [LENGTHS[k]] * G, step=1)
            rest += p_q * walk(copy.deepcopy(comp), h2, covered_so_far + [tuple(keys)])
        full_step = float(loss[keys].sum()) / (len(keys) * G)  # L(S_s): the covered prompts' full batch
        assert step_total == pytest.approx(full_step, rel=1e-9, abs=1e-12)
        return step_total * len(keys) * G + rest

    total = walk(_composer(refill), _history(), [])
    return total, partitions


@pytest.mark.parametrize("mode", ["bernoulli", "fixed_count"])
@pytest.mark.parametrize("refill", ["prompts", "tokens"])
def test_refill_is_exactly_unbiased_over_an_epoch(mode, refill):
    loss = torch.randn(N, G, generator=torch.Generator().manual_seed(5), dtype=torch.float64)  # arbitrary l_{q,i}
    pruner = make_pruner("dppo", prompt_rate=0.5, completion_rate=0.5, sampling=mode)
    total, partitions = _epoch_expectation(pruner, refill, 0.5, 0.5, mode, loss)
    assert total == pytest.approx(float(loss.sum()), rel=1e-9)  # every prompt's G losses, once, unweighted
    if refill == "tokens":  # coverage of later steps depends on earlier masks (through the lengths seen)
        assert len(partitions) > 1
