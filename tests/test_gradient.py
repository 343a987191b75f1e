"""DPPO's gradient on the real embedded policy: Monte-Carlo mean of grad L_hat over mask draws equals
the full-batch grad L (clipped surrogate and KL included); its variance matches SPEC §2's closed form.

grad L_hat = sum_n c_n grad l_n with c_n = keep_n w_n / normaliser (masks never depend on theta), so
every statistic is computed exactly from the per-sample gradients' Gram matrix K = [<grad l_n, grad l_m>].
"""

import pytest
import torch

from dppo.history import PromptHistory
from dppo.losses import grpo_advantages, policy_objective
from dppo.pruning import make_pruner
from dppo.reward import math_reward
from dppo.rollout import HFRollout, SamplingParams
from dppo.scoring import completion_logprobs, pad_completions
from dppo.task import make_train

B, G = 4, 4
N = B * G


@pytest.fixture(scope="module")
def setup(embedded):
    model, tok = embedded
    torch.manual_seed(3)
    problems = make_train(B, seed=11)
    batch = HFRollout(model, tok, 64).generate([p.prompt for p in problems], SamplingParams(n=G, max_new_tokens=48))
    rewards = torch.tensor([math_reward(t, problems[r // G].answer) for r, t in enumerate(batch.texts)]).view(B, G)
    rewards[0] = 1.0  # make sure of a zero-variance group and an informative one
    rewards[1, :2], rewards[1, 2:] = 1.0, 0.0
    adv = grpo_advantages(rewards)
    grads = []
    gen = torch.Generator().manual_seed(0)
    for n in range(N):  # per-sample loss l_n: clipped surrogate (old != current, so clipping acts) + beta * k3 KL
        model.zero_grad(set_to_none=True)
        logp = completion_logprobs(model, batch.prompt_ids[n:n + 1], batch.completion_ids[n:n + 1], tok.pad_token_id)
        mask = pad_completions([torch.ones(logp.shape[1])])[1]
        old = logp.detach() + 0.3 * torch.randn(logp.shape, generator=gen)
        ref = logp.detach() + 0.5 * torch.randn(logp.shape, generator=gen)
        loss, _ = policy_objective(logp, old, adv.view(-1)[n:n + 1], mask, torch.ones(1), 1.0, ref_logp=ref,
                                   kl_coef=0.1)
        loss.backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).double())
    model.zero_grad(set_to_none=True)
    gmat = torch.stack(grads)  # [N, P]
    history = PromptHistory()
    for k in (0, 1):  # prompts 0 and 1 were zero-variance when last seen; 2 and 3 are new
        history.update(k, [1.0] * G, [0.0] * G, [10] * G, step=0)
    lengths = [len(c) for c in batch.completion_ids]
    return rewards, adv, gmat @ gmat.T, history, lengths


def _coefficients(pruner, rewards, adv, history, draws, seed=0):
    """[draws, N] coefficients c with grad L_hat = c @ [grad l_n]; rollouts fixed, masks drawn as the
    trainer draws them (prompt stage, then completion stage on the kept prompts' full groups)."""
    gen = torch.Generator().manual_seed(seed)
    out = torch.zeros(draws, N, dtype=torch.float64)
    for d in range(draws):
        psel = pruner.select_prompts(list(range(B)), history, gen)
        kept = psel.keep.nonzero().flatten()
        csel = pruner.select_completions(rewards[kept], adv[kept], gen)
        w, norm = pruner.loss_weights(psel, csel, G)
        rows = (kept[:, None] * G + torch.arange(G)[None, :])[csel.keep]
        out[d, rows] = w.double() / norm
    return out


def _mc_check(coef, gram):
    """(cosine of MC mean with grad L, ||MC mean - grad L||, its standard error)."""
    full = torch.full((N,), 1.0 / N, dtype=torch.float64)
    mean = coef.mean(0)
    diff = mean - full
    err = torch.sqrt(diff @ gram @ diff)
    centred = coef - mean
    tr_cov = torch.einsum("dn,nm,dm->d", centred, gram, centred).mean()
    se = torch.sqrt(tr_cov / coef.shape[0])
    cos = (mean @ gram @ full) / torch.sqrt((mean @ gram @ mean) * (full @ gram @ full))
    return cos.item(), err.item(), se.item()


@pytest.mark.parametrize("mode", ["bernoulli", "fixed_count"])
def test_monte_carlo_gradient_matches_full_batch(setup, mode):
    rewards, adv, gram, history, _ = setup
    dppo = make_pruner("dppo", prompt_rate=0.5, completion_rate=0.5, sampling=mode)
    cos, err, se = _mc_check(_coefficients(dppo, rewards, adv, history, 4000), gram)
    assert cos > 0.99 and err < 3 * se, (cos, err, se)
    biased = make_pruner("dppo_biased", prompt_rate=0.5, completion_rate=0.5, sampling=mode)
    cos_b, err_b, se_b = _mc_check(_coefficients(biased, rewards, adv, history, 4000), gram)
    assert err_b > 3 * se_b, (cos_b, err_b, se_b)  # the same test catches the unweighted estimator


@pytest.mark.parametrize("rate", [0.3, 0.5, 0.7, 0.9])
def test_variance_matches_closed_form(setup, rate):
    """Bernoulli masks: tr Cov[grad L_hat] = sum_items (1/pi - 1) ||grad item||^2 / (B G)^2 (SPEC §2), with
    items = completions (completion stage) or whole groups (prompt stage); both stages together:
    sum_b [(1/pi_b - 1) ||S_b||^2 + (1/pi_b) sum_i (1/pi_bi - 1) ||g_bi||^2] / (B G)^2."""
    rewards, adv, gram, history, _ = setup
    sq = torch.diagonal(gram)  # ||grad l_n||^2
    group = torch.zeros(B, N, dtype=torch.float64)
    for b in range(B):
        group[b, b * G:(b + 1) * G] = 1.0
    sq_group = torch.diagonal(group @ gram @ group.T)  # ||S_b||^2
    from dppo.pruning import completion_candidates

    pi_o = torch.where(completion_candidates(adv, rewards), 1 - rate, 1.0).double().reshape(-1)
    pi_q = torch.tensor([1 - rate, 1 - rate, 1.0, 1.0], dtype=torch.float64)
    cases = {
        "completion": (make_pruner("dppo", completion_rate=rate), ((1 / pi_o - 1) * sq).sum()),
        "prompt": (make_pruner("dppo", prompt_rate=rate), ((1 / pi_q - 1) * sq_group).sum()),
        "both": (make_pruner("dppo", prompt_rate=rate, completion_rate=rate),
                 ((1 / pi_q - 1) * sq_group).sum() + (group @ ((1 / pi_o - 1) * sq) / pi_q).sum()),
    }
    for name, (pruner, closed) in cases.items():
        coef = _coefficients(pruner, rewards, adv, history, 6000, seed=1)
        centred = coef - coef.mean(0)
        measured = torch.einsum("dn,nm,dm->d", centred, gram, centred).mean() * 6000 / 5999
        assert measured.item() == pytest.approx(closed.item() / N**2, rel=0.10), name


@pytest.mark.parametrize("refill", ["prompts", "tokens"])
def test_monte_carlo_refilled_epoch_matches_full_batch(setup, refill):
    """Refill (SPEC §3.1): the 4 prompts are one epoch, composed into steps of budget 2 from a window of 4;
    history updates after each step, so later steps' coverage depends on earlier masks. The epoch's summed
    pruned loss, sum_s |S_s| G L_hat_s / N, has mean grad L = mean_n grad l_n (each prompt covered once)."""
    import copy

    from dppo.composition import PromptStream, StepComposer

    rewards, adv, gram, history, lengths = setup
    dppo = make_pruner("dppo", prompt_rate=0.5, completion_rate=0.5)
    gen = torch.Generator().manual_seed(2)
    draws = 3000
    coef = torch.zeros(draws, N, dtype=torch.float64)
    partitions = []
    for d in range(draws):
        comp, hist = StepComposer(PromptStream(B, seed=d, limit=B), refill, 4, G), copy.deepcopy(history)  # 1 epoch
        covered = []
        while not comp.finished():
            keys = comp.next_keys(2, hist, dppo)
            psel = dppo.select_prompts(keys, hist, gen)
            kept = torch.tensor(keys)[psel.keep]
            csel = dppo.select_completions(rewards[kept], adv[kept], gen)
            w, norm = dppo.loss_weights(psel, csel, G)
            rows = (kept[:, None] * G + torch.arange(G)[None, :])[csel.keep]
            coef[d, rows] = w.double() / norm * (len(keys) * G) / N
            for k in kept.tolist():
                hist.update(k, rewards[k].tolist(), adv[k].abs().tolist(), lengths[k * G:(k + 1) * G], step=1)
            covered.append(tuple(keys))
        partitions.append(tuple(covered))
    cos, err, se = _mc_check(coef, gram)
    assert cos > 0.99 and err < 3 * se, (cos, err, se)
    assert len(set(partitions)) > 1  # steps composed differently across draws (epoch order and masks)
