"""Advantages, surrogates, KL, aggregation and diagnostics against hand-computed values and TRL's formulas
(docs/method.md §2.1-2.2, §5)."""

import math
import zlib

import pytest
import torch

from dppo.losses import (ADVANTAGES, AGGREGATIONS, drgrpo_advantages, grpo_advantages, gspo_loss, kl_k3, policy_objective,
                         ppo_clip_loss, zero_std_groups)


def test_grpo_advantages_hand_values():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    a = grpo_advantages(r, eps=0.0 + 1e-12)
    # group 0: mean 0.5, unbiased std sqrt(1/3) -> +-0.5 / 0.57735 = +-0.866025
    assert torch.allclose(a[0], torch.tensor([0.866025, -0.866025, -0.866025, 0.866025]), atol=1e-6)
    assert torch.all(a[1] == 0)  # zero-variance group: no signal
    # group 2: mean 0.25, std sqrt(0.25) = 0.5 -> 1.5, -0.5
    assert torch.allclose(a[2], torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-6)
    assert zero_std_groups(r).tolist() == [False, True, False]


def test_drgrpo_advantages_hand_values():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(drgrpo_advantages(r), torch.tensor([[0.75, -0.25, -0.25, -0.25]]))


def test_ppo_clip_loss_hand_values():
    # ratios 1.5 and 0.5, each with A = +1 and A = -1; clip range 0.2
    logp = torch.log(torch.tensor([[1.5], [1.5], [0.5], [0.5]]))
    old = torch.zeros(4, 1)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss = ppo_clip_loss(logp, old, adv, torch.ones(4, 1), 0.2, 0.2).loss
    assert torch.allclose(loss.squeeze(1), torch.tensor([-1.2, 1.5, -0.5, 0.8]), atol=1e-6)
    # clip-higher (DAPO): ratio 1.5 with A>0 is clipped at 1.28
    loss_hi = ppo_clip_loss(logp[:1], old[:1], adv[:1], torch.ones(1, 1), 0.2, 0.28).loss
    assert loss_hi.item() == pytest.approx(-1.28, abs=1e-6)


def test_ppo_clip_gradient_is_policy_gradient_at_ratio_one():
    logp = torch.tensor([[-0.7, -1.2]], requires_grad=True)
    loss = ppo_clip_loss(logp, logp.detach(), torch.tensor([2.0]), torch.ones(1, 2)).loss.sum()
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-2.0, -2.0]]))  # d/dlogp of -A * exp(logp - old)


def test_kl_k3_hand_value():
    kl = kl_k3(torch.zeros(1, 1), torch.log(torch.tensor([[0.5]])), torch.ones(1, 1))
    assert kl.item() == pytest.approx(0.5 + math.log(2) - 1, abs=1e-7)
    assert kl_k3(torch.tensor([[-1.0]]), torch.tensor([[-1.0]]), torch.ones(1, 1)).item() == 0.0


def test_gspo_uses_sequence_level_ratio():
    # two tokens, log-ratios 0.1 and 0.3 -> s = exp(0.2); the gradient per token is -A * s / |o|
    old = torch.tensor([[-1.0, -2.0]])
    logp = (old + torch.tensor([[0.1, 0.3]])).requires_grad_(True)
    mask = torch.ones(1, 2)
    loss = gspo_loss(logp, old, torch.tensor([1.0]), mask, clip_low=1.0, clip_high=1.0).loss
    s = math.exp(0.2)
    assert torch.allclose(loss, torch.tensor([[-s, -s]]), atol=1e-6)
    AGGREGATIONS["seq-mean-token-mean"](loss, mask, torch.ones(1), 1.0).backward()
    assert torch.allclose(logp.grad, torch.tensor([[-s / 2, -s / 2]]), atol=1e-6)
    # with a tight clip and A > 0, s = e^0.2 > 1 + 4e-4 is clipped: no gradient
    logp.grad = None
    AGGREGATIONS["seq-mean-token-mean"](gspo_loss(logp, old, torch.tensor([1.0]), mask).loss, mask, torch.ones(1),
                                        1.0).backward()
    assert torch.all(logp.grad == 0)


def test_aggregations_hand_values():
    tok = torch.tensor([[1.0, 3.0, 9.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # lengths 2 and 1; the 9 is padding
    w = torch.tensor([1.0, 3.0])
    # seq-mean-token-mean: (1 * (1+3)/2 + 3 * 2/1) / 4 = 8/4
    assert AGGREGATIONS["seq-mean-token-mean"](tok, mask, w, 4.0).item() == pytest.approx(2.0)
    # seq-mean-token-sum-norm with L_max = 8: (1 * 4/8 + 3 * 2/8) / 4 = 1.25 / 4
    assert AGGREGATIONS["seq-mean-token-sum-norm"](tok, mask, w, 4.0, 8).item() == pytest.approx(0.3125)
    # token-mean over 3 tokens: (1*1 + 1*3 + 3*2) / 3
    assert AGGREGATIONS["token-mean"](tok, mask, w, 3.0).item() == pytest.approx(10 / 3)
    with pytest.raises(ValueError):
        AGGREGATIONS["seq-mean-token-sum-norm"](tok, mask, w, 4.0, 0)


def _plain_grpo_loss(logp, old, rewards, lengths, clip=0.2):
    """A loop-by-loop GRPO loss written from the paper's formula, independent of dppo.losses."""
    B, G = rewards.shape
    total = 0.0
    for b in range(B):
        mean = sum(rewards[b].tolist()) / G
        std = math.sqrt(sum((x - mean) ** 2 for x in rewards[b].tolist()) / (G - 1))
        for i in range(G):
            n = b * G + i
            a = (rewards[b, i].item() - mean) / (std + 1e-6)
            seq = 0.0
            for t in range(lengths[n]):
                ratio = math.exp(logp[n][t] - old[n][t])
                seq += -min(ratio * a, min(max(ratio, 1 - clip), 1 + clip) * a)
            total += seq / lengths[n]
    return total / (B * G)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weight_one_normaliser_BG_is_plain_grpo(seed):
    g = torch.Generator().manual_seed(seed)
    B, G, T = 3, 4, 5
    rewards = torch.randint(0, 2, (B, G), generator=g).float()
    rewards[0] = 1.0  # include a zero-variance group
    lengths = torch.randint(1, T + 1, (B * G,), generator=g).tolist()
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths], dtype=torch.float64)
    old = -torch.rand(B * G, T, generator=g, dtype=torch.float64)
    logp = old + 0.4 * torch.randn(B * G, T, generator=g, dtype=torch.float64)  # some ratios outside the clip range
    adv = grpo_advantages(rewards.double()).reshape(-1)
    loss, _ = policy_objective(logp, old, adv, mask, torch.ones(B * G, dtype=torch.float64), float(B * G))
    # float64 on both sides: the bound does not depend on the CPU's float32 summation order
    assert loss.item() == pytest.approx(_plain_grpo_loss(logp.tolist(), old.tolist(), rewards, lengths), rel=1e-12)


def test_policy_objective_kl_requires_reference():
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError):
        policy_objective(x, x, torch.zeros(1), torch.ones(1, 1), torch.ones(1), 1.0, kl_coef=0.1)
    loss, stats = policy_objective(x, x, torch.zeros(1), torch.ones(1, 1), torch.ones(1), 1.0, kl_coef=0.5,
                                   ref_logp=torch.log(torch.tensor([[0.5]])))
    assert loss.item() == pytest.approx(0.5 * (0.5 + math.log(2) - 1), abs=1e-6)
    assert stats["kl"][0] / stats["kl"][1] == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)


# ---------------------------------------------------------------- TRL's formulas, written out by hand
def _trl_advantages(rewards, G, scale_rewards):
    """TRL GRPOTrainer._generate_and_score_completions (scale_rewards group | batch | none), eps 1e-4."""
    flat = rewards.reshape(-1)
    mean = flat.view(-1, G).mean(1).repeat_interleave(G)
    std = flat.view(-1, G).std(1).repeat_interleave(G) if scale_rewards != "batch" else flat.std().expand_as(flat)
    adv = flat - mean
    return adv / (std + 1e-4) if scale_rewards != "none" else adv


def _trl_loss(logp, old, ref, adv, mask, loss_type, level, eps_low, eps_high, beta, bias_correction, max_len):
    """TRL GRPOTrainer._compute_loss for one process and one accumulation step (num_items_in_batch = the
    batch's completion tokens), and its clip_ratio/{low,high,region}_mean."""
    log_ratio = logp - old
    if level == "token":
        liw = log_ratio
    else:
        liw = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(liw)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    a = adv.unsqueeze(1)
    per_token = -torch.min(coef_1 * a, coef_2 * a)
    if beta != 0.0:
        kl = torch.exp(ref - logp) - (ref - logp) - 1
        if bias_correction:
            kl = kl * coef_1
        per_token = per_token + beta * kl
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        loss = (per_token * mask).sum() / (per_token.size(0) * max_len)
    else:  # dapo
        loss = (per_token * mask).sum() / mask.sum()
    low = ((coef_1 < 1 - eps_low) & (a < 0)).double()
    high = ((coef_1 > 1 + eps_high) & (a > 0)).double()
    region = (low + high).clamp(max=1)
    if level == "token":
        clip = {k: float((x * mask).sum() / mask.sum()) for k, x in (("low", low), ("high", high), ("region", region))}
    else:
        clip = {k: float(x.mean()) for k, x in (("low", low), ("high", high), ("region", region))}
    return loss, clip


DPPO_OF_TRL = {  # TRL (loss_type, importance_sampling_level) -> dppo (loss_type, loss_agg)
    ("grpo", "token"): ("ppo_clip", "seq-mean-token-mean"),
    ("dr_grpo", "token"): ("ppo_clip", "seq-mean-token-sum-norm"),
    ("dapo", "token"): ("ppo_clip", "token-mean"),
    ("bnpo", "token"): ("ppo_clip", "token-mean"),
    ("grpo", "sequence"): ("gspo", "seq-mean-token-mean"),
}


@pytest.mark.parametrize("trl_loss", list(DPPO_OF_TRL))
@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
@pytest.mark.parametrize("beta,bias_correction", [(0.0, False), (0.04, False), (0.04, True)])
def test_loss_and_gradient_equal_trl(trl_loss, scale_rewards, beta, bias_correction):
    """dppo with all weights 1 and Z = N rows (seq-mean) or the batch's tokens (token-mean) computes TRL's loss,
    gradient and clip ratios, for every scale_rewards, with and without the (bias-corrected) KL."""
    g = torch.Generator().manual_seed(zlib.crc32(repr((trl_loss, scale_rewards, beta)).encode()))
    B, G, T, max_len = 3, 4, 6, 8
    rewards = torch.randint(0, 3, (B, G), generator=g).double()
    rewards[0] = 1.0  # a zero-variance group
    lengths = torch.randint(1, T + 1, (B * G,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    old = -torch.rand(B * G, T, generator=g, dtype=torch.float64) * 2
    ref = old + 0.3 * torch.randn(B * G, T, generator=g, dtype=torch.float64)
    new = (old + 0.4 * torch.randn(B * G, T, generator=g, dtype=torch.float64)).requires_grad_(True)
    eps_low, eps_high = (3e-4, 4e-4) if trl_loss[1] == "sequence" else (0.2, 0.28)
    ours_adv = ADVANTAGES[scale_rewards](rewards, 1e-4).reshape(-1)
    trl_adv = _trl_advantages(rewards, G, scale_rewards)
    assert torch.allclose(ours_adv, trl_adv, rtol=1e-12, atol=1e-12)

    ref_loss, ref_clip = _trl_loss(new, old, ref, trl_adv, mask, trl_loss[0], trl_loss[1], eps_low, eps_high, beta,
                                   bias_correction, max_len)
    (ref_grad,) = torch.autograd.grad(ref_loss, new)
    loss_type, agg = DPPO_OF_TRL[trl_loss]
    z = float(mask.sum()) if agg == "token-mean" else float(B * G)
    ours, stats = policy_objective(new, old, ours_adv, mask, torch.ones(B * G, dtype=torch.float64), z,
                                   loss_type=loss_type, agg=agg, clip_low=eps_low, clip_high=eps_high, ref_logp=ref,
                                   kl_coef=beta, kl_bias_correction=bias_correction, max_len=max_len)
    (grad,) = torch.autograd.grad(ours, new)
    assert ours.item() == pytest.approx(ref_loss.item(), rel=1e-12, abs=1e-14)
    assert torch.allclose(grad, ref_grad, rtol=1e-10, atol=1e-14)
    for k in ("low", "high", "region"):
        total, count = stats[f"clip_frac/{k}"]
        assert total / count == pytest.approx(ref_clip[k], abs=1e-12), k
    assert stats["clip_frac/region"][0] > 0  # the ratios bind somewhere, so the comparison means something


def test_clip_frac_counts_only_binding_clips_and_approx_kl_is_k3():
    """A ratio outside the range whose advantage sign leaves the unclipped branch active is not a clip
    (TRL); approx_kl = mean (rho - 1) - log rho (cleanrl's k3 of KL(old || new))."""
    old = torch.zeros(4, 1, dtype=torch.float64)
    logp = torch.log(torch.tensor([[1.5], [1.5], [0.5], [0.5]], dtype=torch.float64))
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    _, stats = policy_objective(logp, old, adv, torch.ones(4, 1, dtype=torch.float64), torch.ones(4), 4.0)
    # 1.5 with A > 0 binds (high), 1.5 with A < 0 does not, 0.5 with A > 0 does not, 0.5 with A < 0 binds (low)
    assert stats["clip_frac/high"] == (1.0, 4.0) and stats["clip_frac/low"] == (1.0, 4.0)
    assert stats["clip_frac/region"] == (2.0, 4.0)
    k3 = sum((r - 1) - math.log(r) for r in (1.5, 1.5, 0.5, 0.5))
    assert stats["approx_kl"][0] == pytest.approx(k3) and stats["approx_kl"][1] == 4.0


def test_log_ratio_is_clamped_before_exp():
    """A stale token with log-ratio 1000 would overflow exp; clamped at 20 the loss stays finite."""
    logp = torch.tensor([[1000.0, 0.0]], dtype=torch.float64, requires_grad=True)
    loss, stats = policy_objective(logp, torch.zeros(1, 2, dtype=torch.float64), torch.tensor([-1.0]),
                                   torch.ones(1, 2, dtype=torch.float64), torch.ones(1), 1.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all() and math.isfinite(stats["approx_kl"][0])
