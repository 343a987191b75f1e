"""Exact unbiasedness of DPPO by enumerating every mask (docs/method.md §2.5-2.6), and the bias of the baselines."""

import itertools
import math
from unittest import mock

import pytest
import torch
from masks import expectation

from dppo.history import PromptHistory
from dppo.losses import grpo_advantages
from dppo.pruning import (CPPO, DPPO, GRESO, SIZE_PROXIES, BiasedDPPO, UnweightedDPPO, DAPOFilter, Selection, completion_candidates, cppo_keep,
                          draw_keep_mask, prune_step)

B, G = 3, 4


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (B, G), generator=g).float()
    rewards[0] = 1.0  # a zero-variance group (all correct)
    rewards[1, :2], rewards[1, 2:] = 1.0, 0.0  # an informative group
    loss = torch.randn(B, G, generator=g, dtype=torch.float64)  # arbitrary per-sample losses l_{b,i}
    lengths = torch.randint(1, 20, (B, G), generator=g)  # completion lengths T_{b,i}
    history = PromptHistory()
    history.update(0, [1.0] * G, [0.0] * G, [5] * G, step=0)  # zero variance when last seen: a candidate
    history.update(1, [0.0] * G, [0.0] * G, [9] * G, step=0)  # all wrong when last seen: a candidate
    # prompt 2 was never seen: never a candidate
    return rewards, loss, lengths, history


def _expected_loss(pruner, rewards, loss, lengths, history, logit_grad=None, **step_kw):
    """E[L_hat] over every prompt mask and, given it, every completion mask, through `prune_step`:
    L_hat = sum_kept w l / Z with the library's weights and normaliser Z."""
    def rollout(keys):
        return (rewards[keys], lengths[keys]) + (() if logit_grad is None else (logit_grad[keys],))

    def run():
        step = prune_step(pruner, list(range(rewards.shape[0])), history, rollout,
                          torch.Generator(), group_size=rewards.shape[1], **step_kw)
        kept_loss = loss[step.rolled].reshape(-1)[step.rows]
        return float((step.weights * kept_loss).sum()) / step.normaliser
    return expectation(run)


def _target_normaliser(pruner, lengths, history, agg, mode):
    """Z written from its definition (docs/method.md §2.6): covered prompts x G, or tokens with history
    lengths for the prompts that may be pruned; `fixed` scales by prompts_per_step / covered (here 2/B)."""
    n, g = lengths.shape
    pi_q = pruner.prompt_inclusion(list(range(n)), history)
    if agg == "token-mean":
        z = sum(float(lengths[b].sum()) if pi_q[b] == 1 else g * history.get(b).mean_length for b in range(n))
    else:
        z = n * g
    return z * (2 / n if mode == "fixed" else 1.0)


@pytest.mark.parametrize("mode", ["bernoulli", "fixed_count"])
@pytest.mark.parametrize("rates", [(0.5, 0.5), (0.3, 0.7), (0.9, 0.6), (0.0, 0.5), (0.5, 0.0)])
@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
@pytest.mark.parametrize("normaliser", ["covered", "fixed"])
@pytest.mark.parametrize("seed", [0, 1])
def test_dppo_is_exactly_unbiased(mode, rates, agg, normaliser, seed):
    """E[L_hat] = sum_{b,i} l_{b,i} / Z for every aggregation's Z, both sampling modes and both normalisers;
    with no prompt pruning the token-mean Z is the batch's token count (DAPO's normaliser)."""
    rewards, loss, lengths, history = _inputs(seed)
    pruner = DPPO(prompt_prune_rate=rates[0], completion_prune_rate=rates[1], prune_sampling=mode)
    full = float(loss.sum()) / _target_normaliser(pruner, lengths, history, agg, normaliser)
    expected = _expected_loss(pruner, rewards, loss, lengths, history, loss_agg=agg, loss_normaliser=normaliser,
                              prompts_per_step=2)
    assert expected == pytest.approx(full, rel=1e-9, abs=1e-12)
    if agg == "token-mean" and rates[0] == 0.0:
        assert _target_normaliser(pruner, lengths, history, agg, "covered") == float(lengths.sum())


@pytest.mark.parametrize("mode", ["bernoulli", "fixed_count"])
def test_biased_dppo_is_biased(mode):
    rewards, loss, lengths, history = _inputs(0)
    full = float(loss.sum()) / (B * G)
    expected = _expected_loss(BiasedDPPO(prompt_prune_rate=0.5, completion_prune_rate=0.5, prune_sampling=mode), rewards, loss, lengths,
                              history)
    assert abs(expected - full) > 1e-4 * max(1.0, abs(full))  # vs 1e-9 for DPPO on the same inputs


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_unweighted_dppo_removes_the_weights_and_nothing_else(agg):
    """T4's "without 1/pi weights" (dppo_unweighted) is one change: with the same random numbers it keeps exactly
    DPPO's rows and divides by DPPO's Z (unbiased_normaliser), every weight 1; dppo_biased changes Z too (a mean over
    the kept rows), so it is not that ablation."""
    rewards, loss, lengths, history = _inputs(1)

    def step(pruner):
        return prune_step(pruner, list(range(B)), history, lambda keys: (rewards[keys], lengths[keys]),
                          torch.Generator().manual_seed(0), group_size=G, loss_agg=agg)
    kw = dict(prompt_prune_rate=0.5, completion_prune_rate=0.5)
    full, unweighted, biased = step(DPPO(**kw)), step(UnweightedDPPO(**kw)), step(BiasedDPPO(**kw))
    assert full.rolled == unweighted.rolled and torch.equal(full.rows, unweighted.rows)
    assert unweighted.normaliser == full.normaliser
    assert (unweighted.weights == 1).all() and (full.weights > 1).any()
    assert biased.normaliser != full.normaliser


def test_kept_token_count_normaliser_is_biased():
    """The old token-mean rule (divide by the tokens of the kept rows) is biased even with completion
    pruning alone; the rolled-out token count is exact (docs/method.md §2.6)."""
    rewards, loss, lengths, history = _inputs(0)
    full = float(loss.sum()) / float(lengths.sum())

    def kept_tokens_rule():
        step = prune_step(DPPO(completion_prune_rate=0.5), list(range(B)), history,
                          lambda keys: (rewards[keys], lengths[keys]), torch.Generator(), group_size=G,
                          loss_agg="token-mean")
        kept = step.rows
        return float((step.weights * loss.reshape(-1)[kept]).sum()) / float(lengths.reshape(-1)[kept].sum())
    assert abs(expectation(kept_tokens_rule) / full - 1) > 0.05
    assert _expected_loss(DPPO(completion_prune_rate=0.5), rewards, loss, lengths, history,
                          loss_agg="token-mean") == pytest.approx(full, rel=1e-9)


def _one_step(pruner, rewards, lengths, history, gen=None):
    return prune_step(pruner, list(range(B)), history, lambda keys: (rewards[keys], lengths[keys]),
                      gen or torch.Generator(), group_size=G)


def test_cppo_dapo_greso_are_biased():
    rewards, loss, lengths, history = _inputs(0)
    full = float(loss.sum()) / (B * G)
    # CPPO: deterministic top-|A| selection, plain mean over what it keeps
    step = _one_step(CPPO(completion_prune_rate=0.5, cppo_allocation=False), rewards, lengths, history)
    assert int(step.completion.keep.sum()) == B * 2 and step.normaliser == B * 2 and (step.weights == 1).all()
    assert abs(float(loss.reshape(-1)[step.rows].sum()) / step.normaliser - full) > 1e-3
    # DAPO dynamic sampling: zero-variance groups dropped, plain mean
    step = _one_step(DAPOFilter(), rewards, lengths, history)
    assert not step.completion.keep[0].any() and step.completion.keep[1].all()
    assert abs(float(loss.reshape(-1)[step.rows].sum()) / step.normaliser - full) > 1e-3
    # GRESO: skip prob 1 - p^z for prompts with a zero-variance streak; expectation over its masks
    greso = GRESO()
    skip = (1 - greso.prompt_inclusion(list(range(B)), history)).tolist()
    assert skip == [0.5, 0.5, 0.0]
    expected = 0.0
    for keep in itertools.product([True, False], repeat=B):
        p = math.prod((1 - s) if k else s for k, s in zip(keep, skip))
        if p == 0:
            continue
        with mock.patch.object(GRESO, "select_prompts", lambda self, keys, h, g: Selection(torch.tensor(keep),
                                                                                          torch.ones(B))):
            step = _one_step(greso, rewards, lengths, history)
        expected += p * float((step.weights * loss[step.rolled].reshape(-1)[step.rows]).sum()) / step.normaliser
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


# ---------------------------------------------------------------- proportional inclusion (docs/method.md §2.10)
def _small_inputs(seed):
    """Two prompts x 3 completions (every Poisson mask of both stages is enumerated): a group that was zero-variance
    when last seen and still is, and a never-seen informative one; per-sample losses arbitrary."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, float(seed % 2)]])
    loss = torch.randn(2, 3, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, 20, (2, 3), generator=g)
    history = PromptHistory()
    history.update(0, [1.0] * 3, [0.0] * 3, [5] * 3, step=0, sizes=[0.0, 0.2, 0.1] if seed % 2 else None)
    return rewards, loss, lengths, history


@pytest.mark.parametrize("rates", [(0.5, 0.5), (0.3, 0.7), (0.9, 0.9), (0.0, 0.5), (0.5, 0.0)])
@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "seq-mean-token-sum-norm", "token-mean"])
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("proxy, mix", [("logit_sum", 0.0), ("logit_rms", 0.3), ("adv", 0.0), ("length", 0.3)])
def test_proportional_inclusion_is_exactly_unbiased(rates, agg, kl_coef, seed, proxy, mix):
    """E[L_hat] = L by enumerating every Poisson mask of both stages, for every size proxy, mixed with the uniform
    rule or not. Without KL, rows with A = 0 get pi = 0: exact because their loss is zero for every theta; with KL
    every row keeps pi >= the floor (arbitrary losses)."""
    rewards, loss, lengths, history = _small_inputs(seed)
    if kl_coef == 0:  # l = A u: zero exactly where A = 0, as every surrogate without a KL term
        loss = grpo_advantages(rewards).double() * loss
    logit_grad = torch.rand(2, 3, 2, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * lengths[..., None]
    pruner = DPPO(prompt_prune_rate=rates[0], completion_prune_rate=rates[1], inclusion="proportional", inclusion_floor=0.2,
                  size_proxy=proxy, uniform_mix=mix, kl_coef=kl_coef, kl_estimate=0.3, loss_agg=agg)
    full = float(loss.sum()) / _target_normaliser(pruner, lengths, history, agg, "covered")
    expected = _expected_loss(pruner, rewards, loss, lengths, history, logit_grad, loss_agg=agg)
    assert expected == pytest.approx(full, rel=1e-9, abs=1e-12)


def test_proportional_probabilities():
    from dppo.pruning import proportional_probs

    size = torch.tensor([0.0, 0.1, 0.2, 0.4, 1.0, 5.0, 0.0], dtype=torch.float64)
    pi = proportional_probs(size, budget=3.0, floor=0.05, exact_zeros=True)
    assert float(pi.sum()) == pytest.approx(3.0, rel=1e-12)
    assert pi[0] == 0 and pi[-1] == 0 and pi[5] == 1.0  # exact zeros dropped; the largest capped at 1
    assert torch.all(pi[1:6] >= 0.05) and torch.all(pi[1:5].diff() >= 0)  # floored, monotone in size
    ratio = pi[1:4] / size[1:4]  # sizes 0.1, 0.2, 0.4: neither floored nor capped
    assert torch.all(pi[1:4] < 1) and torch.allclose(ratio, ratio[0].expand(3))  # proportional
    floored = proportional_probs(size, budget=3.0, floor=0.05, exact_zeros=False)
    assert floored[0] == 0.05 and float(floored.sum()) == pytest.approx(3.0, rel=1e-12)
    assert torch.all(proportional_probs(size, 10.0, 0.05, True)[1:6] == 1.0)  # budget above what can be kept
    assert torch.all(proportional_probs(size, 0.1, 0.05, False) == 0.05)  # the floor above the budget


@pytest.mark.parametrize("rate", [0.3, 0.5, 0.7, 0.9])
def test_proportional_spends_the_uniform_budget(rate):
    """At equal rate the proportional rule's expected kept count equals the uniform rule's (the informative rows
    can absorb it here), and it drops the zero-advantage rows the uniform rule keeps with 1 - r."""
    rewards, _, lengths, _ = _inputs(0)
    adv = grpo_advantages(rewards)
    uniform = DPPO(completion_prune_rate=rate).completion_inclusion(rewards, adv, lengths)
    prop = DPPO(completion_prune_rate=rate, inclusion="proportional", size_proxy="adv",
                uniform_mix=0.0).completion_inclusion(rewards, adv, lengths)
    if float(uniform.sum()) < int((adv != 0).sum()):
        assert float(prop.sum()) == pytest.approx(float(uniform.sum()), rel=1e-9)
    else:
        assert torch.all(prop[adv != 0] == 1.0)
    assert torch.all(prop[adv == 0] == 0.0) and torch.all(uniform[adv == 0] == 1 - rate)


def test_size_proxies_follow_their_formulas():
    """logit_grad_sizes from the sampled log-probs, and size = sqrt(A^2 + 2 beta^2 k) F / (|o| for seq-mean-token-mean)
    for each proxy's sequence factor F (docs/method.md §2.10), written out by hand on one row."""
    from dppo.pruning import logit_grad_sizes

    probs = [torch.tensor([0.5, 0.9, 0.2]), torch.tensor([1.0])]
    grad = logit_grad_sizes([p.log() for p in probs], group_size=2)  # [1, 2, 2]
    assert grad[0, 0].tolist() == pytest.approx([0.5 + 0.1 + 0.8, (0.25 + 0.01 + 0.64) ** 0.5])
    assert grad[0, 1].tolist() == pytest.approx([0.0, 0.0])  # a certain token moves nothing
    adv, lengths = torch.tensor([[-1.5, 0.0]]), torch.tensor([[3, 1]])
    coef = [(1.5 ** 2 + 2 * 0.1 ** 2 * 0.2) ** 0.5, (2 * 0.1 ** 2 * 0.2) ** 0.5]
    factors = {"adv": [3.0, 1.0], "length": [3 ** 0.5, 1.0], "logit_sum": [1.4, 0.0], "logit_rms": [0.9 ** 0.5, 0.0]}
    for proxy, f in factors.items():
        for agg, per in (("seq-mean-token-mean", [3.0, 1.0]), ("token-mean", [1.0, 1.0])):
            size = DPPO(size_proxy=proxy, kl_coef=0.1, kl_estimate=0.2, loss_agg=agg).completion_size(adv, lengths, grad)
            assert size[0].tolist() == pytest.approx([c * x / p for c, x, p in zip(coef, f, per)]), (proxy, agg)
    with pytest.raises(ValueError, match="size_proxy 'logit_sum' needs the sampled tokens' log-probs"):
        DPPO(size_proxy="logit_sum").completion_size(adv, lengths, None)


def _completion_variance(pi: torch.Tensor, sq: torch.Tensor) -> float:
    """The completion stage's variance sum_i (1/pi_i - 1) ||g_i||^2 with independent inclusion (docs/method.md §2.7)."""
    return float(((1 / pi - 1) * sq).sum())


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("rate", [0.3, 0.5, 0.7, 0.9])
def test_uniform_mix_bounds_the_weights_and_the_variance(seed, rate):
    """pi = (1 - lambda) pi_proportional + lambda pi_uniform spends the same budget, keeps every pi >= lambda pi_uniform
    (weights <= 1/lambda times the uniform rule's), so for ANY true sizes ||g_i|| (here unrelated to the proxy) its
    variance V obeys V + sum ||g||^2 <= (V_uniform + sum ||g||^2) / lambda, and V <= (1 - lambda) V_prop + lambda V_uniform
    (1/pi is convex). docs/method.md §2.10."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (6, 8), generator=g).float()
    adv, lengths = grpo_advantages(rewards), torch.randint(1, 30, (6, 8), generator=g)
    logit_grad = torch.rand(6, 8, 2, generator=g, dtype=torch.float64) * lengths[..., None]
    sq = torch.rand(6, 8, generator=g, dtype=torch.float64) ** 4 * 10  # true squared norms, heavy-tailed
    kw = dict(completion_prune_rate=rate, kl_coef=0.1, kl_estimate=0.05)
    uniform = DPPO(**kw).completion_inclusion(rewards, adv, lengths)
    prop = DPPO(**kw, inclusion="proportional", uniform_mix=0.0).completion_inclusion(rewards, adv, lengths, logit_grad)
    for mix in (0.1, 0.25, 0.5):
        pi = DPPO(**kw, inclusion="proportional", uniform_mix=mix).completion_inclusion(rewards, adv, lengths, logit_grad)
        assert float(pi.sum()) == pytest.approx(float(uniform.sum()), rel=1e-9)
        assert torch.all(pi >= mix * uniform - 1e-12)
        v, v_u, v_p = (_completion_variance(p, sq) for p in (pi, uniform, prop))
        assert v + float(sq.sum()) <= (v_u + float(sq.sum())) / mix * (1 + 1e-9)
        assert v <= (1 - mix) * v_p + mix * v_u + 1e-9


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("rate", [0.3, 0.5, 0.7, 0.9])
def test_oracle_has_the_least_variance_at_the_budget(seed, rate):
    """pi = clamp(c ||g_i||, pi_min, 1) solves min sum_i ||g_i||^2 / pi_i s.t. sum pi = budget, pi_min <= pi <= 1 (KKT of
    a convex problem), so the oracle's completion-stage variance is below the uniform rule's and every proxy's (each
    within [pi_min, 1] at r <= 0.9) at the same budget, on any sizes."""
    from dppo.variance import OracleDPPO

    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (6, 8), generator=g).float()
    adv, lengths = grpo_advantages(rewards), torch.randint(1, 30, (6, 8), generator=g)
    logit_grad = torch.rand(6, 8, 2, generator=g, dtype=torch.float64) * lengths[..., None]
    sq = torch.rand(6, 8, generator=g, dtype=torch.float64) ** 4 * 10 + 1e-3
    kw = dict(completion_prune_rate=rate, kl_coef=0.1, kl_estimate=0.05)
    oracle_pi = OracleDPPO(**kw, inclusion="proportional").completion_inclusion(
        rewards, adv, lengths, torch.stack([sq.sqrt(), sq.sqrt()], -1))
    oracle = _completion_variance(oracle_pi, sq)
    inner = (oracle_pi > 0.1 + 1e-12) & (oracle_pi < 1)  # neither floored nor capped: pi_i / ||g_i|| = c (the KKT point)
    ratio = oracle_pi[inner] / sq[inner].sqrt()
    assert inner.sum() >= 2 and torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-9)
    rules = [DPPO(**kw)] + [DPPO(**kw, inclusion="proportional", size_proxy=p) for p in SIZE_PROXIES]
    for rule in rules:
        pi = rule.completion_inclusion(rewards, adv, lengths, logit_grad)
        assert float(oracle_pi.sum()) == pytest.approx(float(pi.sum()), rel=1e-9)
        assert oracle <= _completion_variance(pi, sq) * (1 + 1e-9), (rule.inclusion, rule.size_proxy)
        for t in (0.02, 0.1):  # and below every step from it toward another rule (the optimum, not merely better)
            assert oracle <= _completion_variance((1 - t) * oracle_pi + t * pi, sq) * (1 + 1e-9), (rule.size_proxy, t)


# ---------------------------------------------------------------- GRESO's adaptation, the abs_adv candidate rule
def test_greso_adapts_toward_the_zero_variance_targets():
    """GRESO (docs/method.md §2.9): after a step of a later epoch, each exploration probability moves by exactly the
    step size toward its zero-variance target: down when the step's fraction of all-correct (p_easy) / all-wrong
    (p_hard) groups is at or above the target (explore less), up when below; clipped to [0.05, 0.95]; never in the
    first epoch. The values returned for logging are the ones the next prompt stage uses."""
    easy, hard, mixed = [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 1.0]
    # 1 of 4 all-correct (0.25 >= 1/12) and 2 of 4 all-wrong (0.5 >= 1/6): both explore less
    above = torch.tensor([easy, hard, hard, mixed])
    greso = GRESO()
    assert greso.after_step(above, epoch=1) == {"greso/p_easy": 0.5 - 0.01, "greso/p_hard": 0.5 - 0.01}
    # every group informative: both below target, both explore more
    greso = GRESO()
    assert greso.after_step(torch.tensor([mixed, mixed]), epoch=1) == {"greso/p_easy": 0.51, "greso/p_hard": 0.51}
    # each on its own: all-correct above its target, all-wrong below its own (0 of 4)
    greso = GRESO()
    assert greso.after_step(torch.tensor([easy, mixed, mixed, mixed]), epoch=1) == {"greso/p_easy": 0.49,
                                                                                   "greso/p_hard": 0.51}
    assert (greso.state.p_easy, greso.state.p_hard) == (0.49, 0.51)
    # at the target exactly: explore less (frac >= target)
    greso = GRESO()
    greso.state.target_easy = greso.state.target_hard = 0.5
    greso.after_step(torch.tensor([easy, hard]), epoch=1)
    assert (greso.state.p_easy, greso.state.p_hard) == (0.49, 0.49)
    # the first epoch does not adapt
    greso = GRESO()
    assert greso.after_step(above, epoch=0) == {"greso/p_easy": 0.5, "greso/p_hard": 0.5}
    # clipped to [low, high]
    greso = GRESO()
    greso.state.p_easy, greso.state.p_hard = 0.95, 0.945
    greso.after_step(torch.tensor([mixed]), epoch=1)
    assert (greso.state.p_easy, greso.state.p_hard) == (0.95, 0.95)
    greso.state.p_easy, greso.state.p_hard = 0.05, 0.055
    greso.after_step(torch.tensor([easy, hard]), epoch=1)
    assert (greso.state.p_easy, greso.state.p_hard) == (0.05, 0.05)
    # the adapted p is the one the prompt stage uses: skip 1 - max(p^z, 0.01), z the recent streak
    greso = GRESO()
    logged = greso.after_step(torch.tensor([easy, mixed, mixed, mixed]), epoch=1)
    history = PromptHistory()
    for _ in range(2):
        history.update(0, easy, [0.0] * 3, [4] * 3, step=0)  # easy streak 2
    history.update(1, hard, [0.0] * 3, [4] * 3, step=0)  # hard streak 1
    history.update(2, mixed, [0.5] * 3, [4] * 3, step=0)  # no streak
    pi = greso.prompt_inclusion([0, 1, 2, 3], history).tolist()
    assert pi == [0.49 ** 2, 0.51, 1.0, 1.0] == [logged["greso/p_easy"] ** 2, logged["greso/p_hard"], 1.0, 1.0]
    # a long streak is skipped with probability at most 0.99: p^z floored at 0.01
    for _ in range(5):
        history.update(0, easy, [0.0] * 3, [4] * 3, step=0)  # easy streak 7: 0.49^7 < 0.01
    assert greso.prompt_inclusion([0], history).tolist() == [1.0 - (1.0 - 0.01)]
    history.records[0].easy_streak = 2
    # saved and restored with a checkpoint
    restored = GRESO()
    restored.load_state_dict(greso.state_dict())
    assert restored.prompt_inclusion([0, 1], history).tolist() == pi[:2]


def test_abs_adv_candidate_rule():
    """prompt_candidate_rule abs_adv (docs/method.md §2.3): a prompt is a candidate when its mean |A| at the last visit
    is below abs_adv_threshold (strictly), whatever its reward variance; never-seen prompts never are. The default
    rule (zero_variance) reads the variance instead. Candidates are kept with pi = 1 - r_q, the others with 1."""
    history = PromptHistory()
    history.update(0, [1.0, 0.0, 0.0, 0.0], [0.05] * 4, [5] * 4, step=0)  # informative, small |A|
    history.update(1, [1.0, 1.0, 1.0, 1.0], [0.5] * 4, [5] * 4, step=0)  # zero variance, large |A|
    history.update(2, [1.0, 0.0, 1.0, 0.0], [0.25] * 4, [5] * 4, step=0)  # mean |A| = the threshold: not below
    history.update(3, [0.0, 0.0, 0.0, 0.0], [0.0] * 4, [5] * 4, step=0)  # |A| = 0
    history.update(4, [1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 2.0, 1.0], [5] * 4, step=0)  # mean |A| 1: large
    keys = [0, 1, 2, 3, 4, 5]  # 5: never seen
    rule = DPPO(prompt_prune_rate=0.4, prompt_candidate_rule="abs_adv", abs_adv_threshold=0.25)
    assert rule.prompt_candidates(keys, history).tolist() == [True, False, False, True, False, False]
    assert rule.prompt_inclusion(keys, history).tolist() == [0.6, 1.0, 1.0, 0.6, 1.0, 1.0]
    zero_variance = DPPO(prompt_prune_rate=0.4, abs_adv_threshold=0.25)
    assert zero_variance.prompt_candidates(keys, history).tolist() == [False, True, False, True, False, False]


def test_every_pruner_field_reaches_its_pruner():
    """build_pruner hands each pruner its own config fields, every one set away from its default (an option no run
    turns on, e.g. prompt_candidate_rule abs_adv, would otherwise silently keep the default)."""
    from dppo.config import TrainConfig
    from dppo.pruning import build_pruner

    dppo_fields = dict(prompt_prune_rate=0.3, completion_prune_rate=0.4, prune_sampling="fixed_count",
                       prompt_candidate_rule="abs_adv", abs_adv_threshold=0.2, inclusion_floor=0.2, size_proxy="adv",
                       uniform_mix=0.5, kl_coef=0.07, loss_agg="token-mean")
    for name, cls in (("dppo", DPPO), ("dppo_biased", BiasedDPPO), ("dppo_unweighted", UnweightedDPPO)):
        pruner = build_pruner(TrainConfig(pruner=name, **dppo_fields))
        assert type(pruner) is cls
        assert pruner == cls(prompt_prune_rate=0.3, completion_prune_rate=0.4, prune_sampling="fixed_count", prompt_candidate_rule="abs_adv",
                             abs_adv_threshold=0.2, inclusion="uniform", inclusion_floor=0.2, size_proxy="adv",
                             uniform_mix=0.5, kl_coef=0.07, loss_agg="token-mean")
    pruner = build_pruner(TrainConfig(pruner="dppo", inclusion="proportional", size_proxy="length"))
    assert (pruner.inclusion, pruner.size_proxy) == ("proportional", "length")
    cppo = build_pruner(TrainConfig(pruner="cppo", completion_prune_rate=0.4, cppo_per_group=False,
                                    cppo_allocation=False))
    assert cppo == CPPO(completion_prune_rate=0.4, cppo_per_group=False, cppo_allocation=False)
    assert build_pruner(TrainConfig(pruner="dapo_filter", dapo_max_rounds=7)) == DAPOFilter(dapo_max_rounds=7)
    assert type(build_pruner(TrainConfig(pruner="greso"))) is GRESO


def test_dapo_filter_refills_and_trains_the_first_b_informative_groups():
    """DAPO dynamic sampling (docs/method.md §2.9) through prune_step, B = 2: rounds of B more prompts are rolled out
    while fewer than B groups are informative, at most max_rounds rounds in all; of the informative groups the first
    B train, unweighted, a plain mean over their rows (B G, or fewer when the rounds ran out)."""
    G = 3
    table = {0: [1.0, 1.0, 1.0], 1: [1.0, 0.0, 0.0], 2: [0.0, 1.0, 1.0], 3: [1.0, 0.0, 1.0], 4: [0.0, 0.0, 0.0],
             5: [1.0, 1.0, 1.0], 6: [0.0, 0.0, 0.0], 7: [0.0, 1.0, 0.0]}

    def run(keys, rounds, max_rounds):
        rolled_out, more = [], iter(rounds)

        def rollout(ks):
            rolled_out.append(list(ks))
            return torch.tensor([table[k] for k in ks]), torch.full((len(ks), G), 4)
        step = prune_step(DAPOFilter(dapo_max_rounds=max_rounds), keys, PromptHistory(), rollout, torch.Generator(),
                          group_size=G, more_keys=lambda n: next(more))
        return step, rolled_out

    no, yes = [False] * G, [True] * G
    # one informative group, then two more: the first B = 2 of the three train
    step, rolled_out = run([0, 1], [[2, 3], [7, 4]], 4)
    assert rolled_out == [[0, 1], [2, 3]] and step.covered == [0, 1, 2, 3]
    assert step.completion.keep.tolist() == [no, yes, yes, no]
    assert step.normaliser == 2 * G and step.weights.tolist() == [1.0] * (2 * G)
    # both informative at once: no refill
    step, rolled_out = run([1, 2], [[3, 7]], 4)
    assert rolled_out == [[1, 2]] and step.completion.keep.tolist() == [yes, yes] and step.normaliser == 2 * G
    # still short after max_rounds = 2: no third round; the one informative group trains alone
    step, rolled_out = run([0, 4], [[5, 1], [6, 2]], 2)
    assert rolled_out == [[0, 4], [5, 1]] and step.completion.keep.tolist() == [no, no, no, yes]
    assert step.normaliser == G and step.weights.tolist() == [1.0] * G
    step, rolled_out = run([0, 4], [[5, 1], [6, 2]], 3)
    assert rolled_out == [[0, 4], [5, 1], [6, 2]] and step.completion.keep.tolist() == [no, no, no, yes, no, yes]
