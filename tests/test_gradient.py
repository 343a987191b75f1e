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
from dppo.variance import bias_and_variance, closed_form_variance, coefficients, per_sample_gram, rollout

B, G = 4, 4
N = B * G


@pytest.fixture(scope="module")
def setup(embedded):
    model, tok = embedded
    problems = make_train(B, seed=11)
    batch, rewards = rollout(model, tok, [p.prompt for p in problems], [p.answer for p in problems], G, seed=3)
    rewards[0] = 1.0  # make sure of a zero-variance group and an informative one
    rewards[1, :2], rewards[1, 2:] = 1.0, 0.0
    adv = grpo_advantages(rewards)
    gram, _ = per_sample_gram(model, tok, batch, adv, kl_coef=0.1, seed=0)  # clipped surrogate + beta * k3 KL
    history = PromptHistory()
    for k in (0, 1):  # prompts 0 and 1 were zero-variance when last seen; 2 and 3 are new
        history.update(k, [1.0] * G, [0.0] * G, [10] * G, step=0)
    lengths = [len(c) for c in batch.completion_ids]
    return rewards, adv, gram, history, lengths


def _mc_check(coef, gram):
    """(cosine of MC mean with grad L, ||MC mean - grad L||, its standard error)."""
    st = bias_and_variance(coef, gram)
    return st["cosine"], st["bias"], st["bias_se"]


@pytest.mark.parametrize("mode", ["bernoulli", "fixed_count"])
def test_monte_carlo_gradient_matches_full_batch(setup, mode):
    rewards, adv, gram, history, _ = setup
    dppo = DPPO(prompt_rate=0.5, completion_rate=0.5, sampling=mode)
    cos, err, se = _mc_check(coefficients(dppo, rewards, history, 4000), gram)
    assert cos > 0.99 and err < 3 * se, (cos, err, se)
    biased = BiasedDPPO(prompt_rate=0.5, completion_rate=0.5, sampling=mode)
    cos_b, err_b, se_b = _mc_check(coefficients(biased, rewards, history, 4000), gram)
    assert err_b > 3 * se_b, (cos_b, err_b, se_b)  # the same test catches the unweighted estimator


@pytest.mark.parametrize("rate", [0.3, 0.5, 0.7, 0.9])
def test_variance_matches_closed_form(setup, rate):
    """Bernoulli masks: tr Cov[grad L_hat] = sum_items (1/pi - 1) ||grad item||^2 / (B G)^2 (docs/method.md §2.7), with
    items = completions (completion stage) or whole groups (prompt stage); both stages together:
    sum_b [(1/pi_b - 1) ||S_b||^2 + (1/pi_b) sum_i (1/pi_bi - 1) ||g_bi||^2] / (B G)^2."""
    rewards, adv, gram, history, _ = setup
    sq = torch.diagonal(gram)  # ||grad l_n||^2
    group = torch.zeros(B, N, dtype=torch.float64)
    for b in range(B):
        group[b, b * G:(b + 1) * G] = 1.0
    sq_group = torch.diagonal(group @ gram @ group.T)  # ||S_b||^2

    pi_o = torch.where(completion_candidates(adv, rewards), torch.tensor(1 - rate, dtype=torch.float64), 1.0).reshape(-1)
    pi_q = torch.tensor([1 - rate, 1 - rate, 1.0, 1.0], dtype=torch.float64)
    cases = {
        "completion": (DPPO(completion_rate=rate), ((1 / pi_o - 1) * sq).sum()),
        "prompt": (DPPO(prompt_rate=rate), ((1 / pi_q - 1) * sq_group).sum()),
        "both": (DPPO(prompt_rate=rate, completion_rate=rate),
                 ((1 / pi_q - 1) * sq_group).sum() + (group @ ((1 / pi_o - 1) * sq) / pi_q).sum()),
    }
    for name, (pruner, closed) in cases.items():
        measured = bias_and_variance(coefficients(pruner, rewards, history, 6000, seed=1), gram)["variance"]
        assert measured == pytest.approx(closed.item() / N**2, rel=0.10), name
        # dppo.variance (F3) agrees, from the pruner's own probabilities
        library = closed_form_variance(gram, pruner, history, rewards, adv)["variance"]
        assert library == pytest.approx(closed.item() / N**2, rel=1e-12), name
    # the proportional rule: its completion probabilities depend on which prompts were rolled out, so only the
    # enumeration over prompt masks is exact; measured against it (two rates: the Monte-Carlo is the slow part)
    if rate not in (0.5, 0.9):
        return
    prop = DPPO(prompt_rate=rate, completion_rate=rate, inclusion="proportional", kl_coef=0.1, kl_estimate=0.1)
    exact = closed_form_variance(gram, prop, history, rewards, adv)
    measured = bias_and_variance(coefficients(prop, rewards, history, 6000, seed=1), gram)["variance"]
    assert measured == pytest.approx(exact["variance"], rel=0.10)
    uniform = closed_form_variance(gram, cases["both"][0], history, rewards, adv)
    assert exact["kept"] == pytest.approx(uniform["kept"], rel=1e-9) and exact["rolled"] == pytest.approx(uniform["rolled"])


@pytest.mark.parametrize("refill", ["prompts", "tokens"])
def test_monte_carlo_refilled_epoch_matches_full_batch(setup, refill):
    """Refill (docs/method.md §3.1): the 4 prompts are one epoch, composed into steps of budget 2 from a window of 4;
    history updates after each step, so later steps' coverage depends on earlier masks. The epoch's summed
    pruned loss, sum_s |S_s| G L_hat_s / N, has mean grad L = mean_n grad l_n (each prompt covered once)."""
    import copy

    from dppo.composition import PromptStream, StepComposer

    rewards, adv, gram, history, lengths = setup
    dppo = DPPO(prompt_rate=0.5, completion_rate=0.5)
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
