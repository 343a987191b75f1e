"""Exact unbiasedness of DPPO by enumerating every mask (SPEC §2), and the bias of the baselines."""

import itertools
import math

import pytest
import torch

from dppo.history import PromptHistory
from dppo.losses import grpo_advantages
from dppo.pruning import (GRESO, Selection, completion_candidates, cppo_keep, draw_keep_mask, make_pruner)

B, G = 3, 4


def _subsets_with_prob(candidates: torch.Tensor, rate: float, mode: str):
    """Every keep mask of the candidates with its probability, from the definition of each mode."""
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


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (B, G), generator=g).float()
    rewards[0] = 1.0  # a zero-variance group (all correct)
    rewards[1, :2], rewards[1, 2:] = 1.0, 0.0  # an informative group
    loss = torch.randn(B, G, generator=g, dtype=torch.float64)  # arbitrary per-sample losses l_{b,i}
    history = PromptHistory()
    history.update(0, [1.0] * G, [0.0] * G, [5] * G, step=0)  # zero variance when last seen: a candidate
    history.update(1, [0.0] * G, [0.0] * G, [5] * G, step=0)  # all wrong when last seen: a candidate
    # prompt 2 was never seen: never a candidate
    return rewards, grpo_advantages(rewards).double(), loss, history


def _expected_loss(pruner, rewards, adv, loss, history, rate_q, rate_o, mode):
    """E[L_hat] over every prompt mask and, given it, every completion mask; the masks' inclusion
    probabilities and the weights/normaliser come from the library."""
    keys = [0, 1, 2]
    cand_q = pruner.prompt_candidates(keys, history)
    _, pi_q = draw_keep_mask(cand_q, rate_q, mode, torch.Generator())
    total = 0.0
    for keep_q, p_q in _subsets_with_prob(cand_q, rate_q, mode):
        kept_rows = keep_q.nonzero().flatten()
        r, a, l = rewards[kept_rows], adv[kept_rows], loss[kept_rows]
        cand_o = completion_candidates(a, r)
        _, pi_o = draw_keep_mask(cand_o, rate_o, mode, torch.Generator())
        for keep_o, p_o in _subsets_with_prob(cand_o, rate_o, mode):
            w, norm = pruner.loss_weights(Selection(keep_q, pi_q), Selection(keep_o, pi_o), G)
            total += p_q * p_o * float((w.double() * l[keep_o]).sum()) / norm
    return total


@pytest.mark.parametrize("mode", ["bernoulli", "fixed_count"])
@pytest.mark.parametrize("rates", [(0.5, 0.5), (0.3, 0.7), (0.9, 0.6)])
@pytest.mark.parametrize("seed", [0, 1])
def test_dppo_is_exactly_unbiased(mode, rates, seed):
    rewards, adv, loss, history = _inputs(seed)
    full = float(loss.sum()) / (B * G)
    expected = _expected_loss(make_pruner("dppo", sampling=mode), rewards, adv, loss, history, *rates, mode)
    assert expected == pytest.approx(full, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("mode", ["bernoulli", "fixed_count"])
def test_biased_dppo_is_biased(mode):
    rewards, adv, loss, history = _inputs(0)
    full = float(loss.sum()) / (B * G)
    expected = _expected_loss(make_pruner("dppo_biased", sampling=mode), rewards, adv, loss, history, 0.5, 0.5, mode)
    assert abs(expected - full) > 1e-4 * max(1.0, abs(full))  # vs 1e-9 for DPPO on the same inputs


def test_cppo_dapo_greso_are_biased():
    rewards, adv, loss, history = _inputs(0)
    full = float(loss.sum()) / (B * G)
    all_prompts = Selection(torch.ones(B, dtype=torch.bool), torch.ones(B, dtype=torch.float64))
    # CPPO: deterministic top-|A| selection, plain mean over what it keeps
    cppo = make_pruner("cppo", completion_rate=0.5)
    sel = cppo.select_completions(rewards, adv, torch.Generator())
    w, norm = cppo.loss_weights(all_prompts, sel, G)
    assert abs(float((w.double() * loss[sel.keep]).sum()) / norm - full) > 1e-3
    # DAPO dynamic sampling: zero-variance groups dropped, plain mean
    dapo = make_pruner("dapo_filter")
    sel = dapo.select_completions(rewards, adv, torch.Generator())
    assert not sel.keep[0].any() and sel.keep[1].all()
    w, norm = dapo.loss_weights(all_prompts, sel, G)
    assert abs(float((w.double() * loss[sel.keep]).sum()) / norm - full) > 1e-3
    # GRESO: skip prob 1 - p^z for prompts with a zero-variance streak; expectation over its masks
    greso = GRESO()
    skip = [greso.state.skip_prob(history.get(k).easy_streak, history.get(k).hard_streak) if history.get(k) else 0.0
            for k in range(B)]
    assert skip == [0.5, 0.5, 0.0]
    expected = 0.0
    for keep in itertools.product([True, False], repeat=B):
        p = math.prod((1 - s) if k else s for k, s in zip(keep, skip))
        if p == 0:
            continue
        keep_q = torch.tensor(keep)
        sel = Selection(torch.ones(int(keep_q.sum()), G, dtype=torch.bool), torch.ones(int(keep_q.sum()), G))
        w, norm = greso.loss_weights(Selection(keep_q, torch.ones(B)), sel, G)
        expected += p * float((w.double() * loss[keep_q].reshape(-1)).sum()) / norm
    assert abs(expected - full) > 1e-3


def test_candidates_and_masks():
    rewards = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    adv = grpo_advantages(rewards)
    cand = completion_candidates(adv, rewards)
    assert cand[0].all()  # zero-variance group: every completion
    assert cand[1].tolist() == [False, True, True, True]  # |A| below the group's mean |A|
    top = cppo_keep(adv, 0.5)
    assert top[1, 0] and top.sum(1).tolist() == [2, 2]  # ceil(0.5 * 4) of largest |A| per group
    assert cppo_keep(adv, 0.75, per_group=False).sum() == 2 and cppo_keep(adv, 0.75, per_group=False)[1, 0]
    # fixed_count drops exactly floor(r n) candidates, uniformly: every subset equally often
    cand = torch.tensor([True, True, True, False])
    counts = {}
    gen = torch.Generator().manual_seed(0)
    for _ in range(3000):
        keep, pi = draw_keep_mask(cand, 0.5, "fixed_count", gen)
        assert keep[3] and int((~keep).sum()) == 1 and torch.allclose(pi, torch.tensor([2 / 3, 2 / 3, 2 / 3, 1.0],
                                                                                         dtype=torch.float64))
        counts[tuple(keep.tolist())] = counts.get(tuple(keep.tolist()), 0) + 1
    assert len(counts) == 3 and all(900 < c < 1100 for c in counts.values())
    # bernoulli keeps each candidate with probability 1 - r
    keeps = torch.stack([draw_keep_mask(cand, 0.3, "bernoulli", gen)[0] for _ in range(4000)]).float().mean(0)
    assert torch.allclose(keeps, torch.tensor([0.7, 0.7, 0.7, 1.0]), atol=0.03)
    with pytest.raises(ValueError, match="prune rate"):
        draw_keep_mask(cand, 1.0, "bernoulli", gen)
