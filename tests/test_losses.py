"""Advantages, surrogates, KL and aggregation against hand-computed values (SPEC §2)."""

import math

import pytest
import torch

from dppo.losses import (AGGREGATIONS, drgrpo_advantages, grpo_advantages, gspo_loss, kl_k3, policy_objective,
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
    loss = ppo_clip_loss(logp, old, adv, torch.ones(4, 1), 0.2, 0.2)
    assert torch.allclose(loss.squeeze(1), torch.tensor([-1.2, 1.5, -0.5, 0.8]), atol=1e-6)
    # clip-higher (DAPO): ratio 1.5 with A>0 is clipped at 1.28
    loss_hi = ppo_clip_loss(logp[:1], old[:1], adv[:1], torch.ones(1, 1), 0.2, 0.28)
    assert loss_hi.item() == pytest.approx(-1.28, abs=1e-6)


def test_ppo_clip_gradient_is_policy_gradient_at_ratio_one():
    logp = torch.tensor([[-0.7, -1.2]], requires_grad=True)
    loss = ppo_clip_loss(logp, logp.detach(), torch.tensor([2.0]), torch.ones(1, 2)).sum()
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
    loss = gspo_loss(logp, old, torch.tensor([1.0]), mask, clip_low=1.0, clip_high=1.0)
    s = math.exp(0.2)
    assert torch.allclose(loss, torch.tensor([[-s, -s]]), atol=1e-6)
    AGGREGATIONS["seq-mean-token-mean"](loss, mask, torch.ones(1), 1.0).backward()
    assert torch.allclose(logp.grad, torch.tensor([[-s / 2, -s / 2]]), atol=1e-6)
    # with a tight clip and A > 0, s = e^0.2 > 1 + 4e-4 is clipped: no gradient
    logp.grad = None
    AGGREGATIONS["seq-mean-token-mean"](gspo_loss(logp, old, torch.tensor([1.0]), mask), mask, torch.ones(1),
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
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths])
    old = -torch.rand(B * G, T, generator=g)
    logp = old + 0.4 * torch.randn(B * G, T, generator=g)  # some ratios outside the clip range
    adv = grpo_advantages(rewards).reshape(-1)
    loss, _ = policy_objective(logp, old, adv, mask, torch.ones(B * G), float(B * G))
    assert loss.item() == pytest.approx(_plain_grpo_loss(logp.tolist(), old.tolist(), rewards, lengths), rel=1e-5)


def test_policy_objective_kl_requires_reference():
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError):
        policy_objective(x, x, torch.zeros(1), torch.ones(1, 1), torch.ones(1), 1.0, kl_coef=0.1)
    loss, stats = policy_objective(x, x, torch.zeros(1), torch.ones(1, 1), torch.ones(1), 1.0, kl_coef=0.5,
                                   ref_logp=torch.log(torch.tensor([[0.5]])))
    assert loss.item() == pytest.approx(0.5 * (0.5 + math.log(2) - 1), abs=1e-6)
    assert stats["kl"] == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)
