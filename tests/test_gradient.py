"""DPPO's gradient on the real embedded policy: Monte-Carlo mean of grad L_hat over mask draws equals
the full-batch grad L (clipped surrogate and KL included); its variance matches the closed form of
docs/method.md §2.7.

grad L_hat = sum_n c_n grad l_n with c_n = keep_n w_n / normaliser (masks never depend on theta), so
every statistic is computed exactly from the per-sample gradients' Gram matrix K = [<grad l_n, grad l_m>].
"""

import pytest
import torch

from dppo.history import PromptHistory
from dppo.losses import grpo_advantages
from dppo.pruning import DPPO, BiasedDPPO, completion_candidates, prune_step
from dppo.task import make_train
from dppo.variance import (CountSketch, bias_and_variance, closed_form_variance, coefficients, per_sample_gram,
                           rollout)
from masks import enumerate_draws, expectation

B, G = 4, 4
N = B * G


@pytest.fixture(scope="module")
def setup(embedded):
    model, tok = embedded
    problems = make_train(B, seed=11)
    batch, rewards = rollout(model, tok, [p.prompt for p in problems], [p.answer for p in problems], G, seed=3)
    # Rewards and lengths fixed by construction (the sampled completions only shape the gradients): the candidates,
    # and so every mask the pruners draw from a seeded generator, are the same on any machine. Group 0 is
    # zero-variance, groups 1-3 informative (group 3's three wrong completions are completion-stage candidates).
    rewards = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    adv = grpo_advantages(rewards)
    gram, _ = per_sample_gram(model, tok, batch, adv, kl_coef=0.1, seed=0)  # clipped surrogate + beta * k3 KL
    history = PromptHistory()
    for k in (0, 1):  # prompts 0 and 1 were zero-variance when last seen; 2 and 3 are new
        history.update(k, [1.0] * G, [0.0] * G, [10] * G, step=0)
    lengths = [6 + 5 * (n % 3) for n in range(N)]
    return rewards, adv, gram, history, lengths, batch


def _mc_check(coef, gram):
    """(cosine of MC mean with grad L, ||MC mean - grad L||, its standard error)."""
    st = bias_and_variance(coef, gram)
    return st["cosine"], st["bias"], st["bias_se"]


@pytest.mark.parametrize("mode", ["bernoulli", "fixed_count"])
def test_monte_carlo_gradient_matches_full_batch(setup, mode):
    """The masks as the trainer draws them: the mean of 4000 draws is within 3 Monte-Carlo standard errors of grad L.
    For an unbiased estimator E[err^2] = se^2 exactly, so err > 3 se has probability below 1/9 (Markov) on any batch
    and about 0.3% when one direction dominates (chi-square, 1 dof); the exact test below carries the verdict."""
    rewards, adv, gram, history, *_ = setup
    dppo = DPPO(prompt_prune_rate=0.5, completion_prune_rate=0.5, prune_sampling=mode)
    cos, err, se = _mc_check(coefficients(dppo, rewards, history, 4000), gram)
    assert cos > 0.99 and err < 3 * se, (cos, err, se)


def _expected_coefficients(pruner, rewards, history) -> torch.Tensor:
    """E[c] [N] over every outcome of every mask the step draws (tests/masks.py enumerates them from the sampling
    modes' definitions, not from dppo.pruning's sampler)."""
    return expectation(lambda: coefficients(pruner, rewards, history, 1)[0])


@pytest.mark.parametrize("mode", ["bernoulli", "fixed_count"])
def test_exact_expected_gradient_weighted_vs_unweighted(setup, mode):
    """Exact over all masks, so the verdict does not depend on the batch the machine happened to sample:
    E[grad L_hat] = (E c) @ grad l, and ||E c - 1/N||_K is the bias. DPPO's is zero up to float64 rounding (~1e-16 of
    ||grad L||). The unweighted estimator (BiasedDPPO: the same masks, no 1/pi, a plain mean over what it kept) has
    E c summing to 1 but smaller on candidates than on the items it always keeps, so its bias is the norm of a
    non-zero contrast of per-sample gradients: zero only if those gradients cancel exactly, which no real batch does.
    The margin, 1e-6 of ||grad L||, is ten orders of magnitude above the rounding floor and far below any real bias
    (0.03-0.8 of ||grad L|| over 12 rollout seeds of these prompts; the Monte-Carlo version of this check, 3 standard
    errors at 4000 draws, missed the one at 0.03: 2.2 standard errors)."""
    rewards, _, gram, history, *_ = setup
    full = torch.full((N,), 1.0 / N, dtype=torch.float64)
    full_norm = float(torch.sqrt(full @ gram @ full))

    def bias(expected):
        diff = expected - full
        return float(torch.sqrt(torch.clamp(diff @ gram @ diff, min=0.0)))

    unbiased = _expected_coefficients(DPPO(prompt_prune_rate=0.5, completion_prune_rate=0.5, prune_sampling=mode), rewards, history)
    torch.testing.assert_close(unbiased, full, rtol=0, atol=1e-12)
    assert bias(unbiased) < 1e-9 * full_norm
    biased = _expected_coefficients(BiasedDPPO(prompt_prune_rate=0.5, completion_prune_rate=0.5, prune_sampling=mode), rewards, history)
    assert float(biased.sum()) == pytest.approx(1.0, abs=1e-12)  # a plain mean over the kept rows
    assert bias(biased) > 1e-6 * full_norm, (bias(biased), full_norm)


def _exact_moments(pruner, rewards, history) -> tuple[torch.Tensor, torch.Tensor]:
    """(E c [N], Cov c [N, N]) over every mask outcome (tests/masks.py)."""
    outcomes = enumerate_draws(lambda: coefficients(pruner, rewards, history, 1)[0])
    mean = sum(p * c for p, c in outcomes)
    return mean, sum(p * torch.outer(c - mean, c - mean) for p, c in outcomes)


@pytest.mark.parametrize("rate", [0.3, 0.9])  # the closed form at a low and a high rate (F3 plots every rate)
def test_variance_matches_closed_form(setup, rate):
    """Bernoulli masks: tr Cov[grad L_hat] = sum_items (1/pi - 1) ||grad item||^2 / (B G)^2 (docs/method.md §2.7), with
    items = completions (completion stage) or whole groups (prompt stage); both stages together:
    sum_b [(1/pi_b - 1) ||S_b||^2 + (1/pi_b) sum_i (1/pi_bi - 1) ||g_bi||^2] / (B G)^2.
    Exact on both sides: tr Cov[grad L_hat] = <Cov c, K> with Cov c enumerated over every mask outcome. The trainer's
    own random draws are checked against the enumerated moments of c, which do not involve the model: with the
    rewards fixed by construction those draws, and so that verdict, are the same on every machine."""
    rewards, adv, gram, history, *_ = setup
    sq = torch.diagonal(gram)  # ||grad l_n||^2
    group = torch.zeros(B, N, dtype=torch.float64)
    for b in range(B):
        group[b, b * G:(b + 1) * G] = 1.0
    sq_group = torch.diagonal(group @ gram @ group.T)  # ||S_b||^2

    pi_o = torch.where(completion_candidates(adv, rewards), torch.tensor(1 - rate, dtype=torch.float64), 1.0).reshape(-1)
    pi_q = torch.tensor([1 - rate, 1 - rate, 1.0, 1.0], dtype=torch.float64)
    cases = {
        "completion": (DPPO(completion_prune_rate=rate), ((1 / pi_o - 1) * sq).sum()),
        "prompt": (DPPO(prompt_prune_rate=rate), ((1 / pi_q - 1) * sq_group).sum()),
        "both": (DPPO(prompt_prune_rate=rate, completion_prune_rate=rate),
                 ((1 / pi_q - 1) * sq_group).sum() + (group @ ((1 / pi_o - 1) * sq) / pi_q).sum()),
    }
    for name, (pruner, closed) in cases.items():
        mean, cov = _exact_moments(pruner, rewards, history)
        assert float((cov * gram).sum()) == pytest.approx(closed.item() / N**2, rel=1e-9), name
        # dppo.variance (F3) agrees, from the pruner's own probabilities
        library = closed_form_variance(gram, pruner, history, rewards, adv)["variance"]
        assert library == pytest.approx(closed.item() / N**2, rel=1e-12), name
        # the sampler: 6000 draws' mean coefficient within 5 standard errors of E c, every coordinate
        draws = coefficients(pruner, rewards, history, 6000, seed=1)
        se = torch.sqrt(torch.diagonal(cov) / draws.shape[0])
        assert torch.all((draws.mean(0) - mean).abs() <= 5 * se + 1e-15), name
    # the proportional rule: its completion probabilities depend on which prompts were rolled out, so only the
    # enumeration over prompt masks is exact; the Monte-Carlo variance is measured against it within 5 of its own
    # standard errors (estimated from the draws: the per-draw quadratic form is heavy-tailed at small pi, so a fixed
    # relative tolerance would hold on some batches and not others). At the high rate only, where pi is smallest and
    # the weights largest: the Monte-Carlo is the slow part.
    if rate != 0.9:
        return
    prop = DPPO(prompt_prune_rate=rate, completion_prune_rate=rate, inclusion="proportional", kl_coef=0.1, kl_estimate=0.1)
    lengths = torch.tensor(setup[4]).view(B, G)  # fixed by construction, as the logit proxy's sizes below
    logit_grad = torch.stack([0.3 * lengths, 0.2 * lengths.sqrt() + (torch.arange(N) % 4).view(B, G)], -1).double()
    exact = closed_form_variance(gram, prop, history, rewards, adv, lengths, logit_grad)
    coef = coefficients(prop, rewards, history, 6000, seed=1, lengths=lengths, logit_grad=logit_grad)
    centred = coef - coef.mean(0)
    per_draw = torch.einsum("dn,nm,dm->d", centred, gram, centred)
    measured, se = float(per_draw.mean()), float(per_draw.std() / per_draw.numel() ** 0.5)
    assert abs(measured - exact["variance"]) <= 5 * se + 1e-3 * exact["variance"], (measured, exact["variance"], se)
    uniform = closed_form_variance(gram, cases["both"][0], history, rewards, adv)
    assert exact["kept"] == pytest.approx(uniform["kept"], rel=1e-9) and exact["rolled"] == pytest.approx(uniform["rolled"])


@pytest.mark.parametrize("refill", ["prompts", "tokens"])
def test_monte_carlo_refilled_epoch_matches_full_batch(setup, refill):
    """Refill (docs/method.md §3.1): the 4 prompts are one epoch, composed into steps of budget 2 from a window of 4;
    history updates after each step, so later steps' coverage depends on earlier masks. The epoch's summed
    pruned loss, sum_s |S_s| G L_hat_s / N, has mean grad L = mean_n grad l_n (each prompt covered once)."""
    import copy

    from dppo.composition import PromptStream, StepComposer

    rewards, adv, gram, history, lengths, _ = setup
    dppo = DPPO(prompt_prune_rate=0.5, completion_prune_rate=0.5)
    gen = torch.Generator().manual_seed(2)
    draws = 3000
    coef = torch.zeros(draws, N, dtype=torch.float64)
    partitions = []
    for d in range(draws):
        comp, hist = StepComposer(PromptStream(B, seed=d, limit=B), refill, 4, G), copy.deepcopy(history)  # 1 epoch
        covered = []
        while not comp.finished():
            keys = comp.next_keys(2, hist, dppo)
            step = prune_step(dppo, keys, hist, lambda ks: (rewards[ks], torch.ones(len(ks), G)), gen, group_size=G)
            kept = torch.tensor(step.rolled, dtype=torch.long)
            rows = (kept[:, None] * G + torch.arange(G)[None, :]).reshape(-1)[step.rows]
            coef[d, rows] = step.weights / step.normaliser * (len(keys) * G) / N
            for k in kept.tolist():
                hist.update(k, rewards[k].tolist(), adv[k].abs().tolist(), lengths[k * G:(k + 1) * G], step=1)
            covered.append(tuple(keys))
        partitions.append(tuple(covered))
    cos, err, se = _mc_check(coef, gram)
    assert cos > 0.99 and err < 3 * se, (cos, err, se)
    assert len(set(partitions)) > 1  # steps composed differently across draws (epoch order and masks)


def test_count_sketch_estimates_inner_products_without_bias():
    """E[<S a, S b>] = <a, b> over the sketch's random buckets and signs (docs/method.md §2.7): the mean over 400
    sketches of k = 64 buckets lies within 5 standard errors of the exact Gram matrix, on vectors with positive entries
    (where a sketch without signs would add every collision: ~P/k times <a, b>) split into two parameter pieces."""
    gen = torch.Generator().manual_seed(0)
    vectors = torch.rand(3, 2000, generator=gen, dtype=torch.float64) + 0.5  # [3, P], all positive
    exact = vectors @ vectors.T
    draws = []
    for seed in range(400):
        sketch = CountSketch([1500, 500], 64, seed)
        z = torch.stack([sketch([v[:1500].view(30, 50), v[1500:]]) for v in vectors])
        draws.append(z @ z.T)
    draws = torch.stack(draws)  # [400, 3, 3]
    se = draws.std(0) / 400 ** 0.5
    assert torch.all((draws.mean(0) - exact).abs() <= 5 * se), (draws.mean(0), exact, se)
    # one sketch: each quadratic form within its standard deviation bound sqrt(2 / k) (here 10 of them)
    assert torch.all((draws[0] - exact).abs() <= 10 * (2 / 64) ** 0.5 * exact.diagonal().max())


def test_sketched_gram_gives_f3s_statistics_on_the_exact_grams_scale(embedded, setup):
    """F3 on a real model streams each per-sample gradient through a count sketch (no [N, P] matrix): on the embedded
    model, small enough for the exact Gram matrix, the sketched K (k = 2^16) gives the closed-form variance of DPPO
    and the full gradient's norm within 10 of the sketch's relative standard deviations sqrt(2 / k) = 0.55%."""
    model, tok = embedded
    rewards, adv, gram, history, _, batch = setup
    sketched, _ = per_sample_gram(model, tok, batch, adv, kl_coef=0.1, seed=0, sketch_dim=2**16)
    tolerance = 10 * (2 / 2**16) ** 0.5
    full = torch.full((N,), 1.0 / N, dtype=torch.float64)
    assert float(full @ sketched @ full) == pytest.approx(float(full @ gram @ full), rel=tolerance)
    for rate in (0.3, 0.9):
        pruner = DPPO(prompt_prune_rate=rate, completion_prune_rate=rate)
        exact = closed_form_variance(gram, pruner, history, rewards, adv)["variance"]
        assert closed_form_variance(sketched, pruner, history, rewards, adv)["variance"] == pytest.approx(
            exact, rel=tolerance), rate
