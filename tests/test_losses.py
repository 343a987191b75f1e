"""Advantages, surrogates, KL, aggregation and diagnostics against hand-computed values and TRL's GRPOTrainer
itself (docs/method.md §2.1-2.2, §5)."""

import copy
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


# ---------------------------------------------------------------- TRL itself (GRPOTrainer, imported)
DPPO_OF_TRL = {  # TRL (loss_type, importance_sampling_level) -> dppo (loss_type, loss_agg)
    ("grpo", "token"): ("ppo_clip", "seq-mean-token-mean"),
    ("dr_grpo", "token"): ("ppo_clip", "seq-mean-token-sum-norm"),
    ("dapo", "token"): ("ppo_clip", "token-mean"),
    ("bnpo", "token"): ("ppo_clip", "token-mean"),
    ("grpo", "sequence"): ("gspo", "seq-mean-token-mean"),
}


@pytest.mark.parametrize("trl_loss", list(DPPO_OF_TRL))
@pytest.mark.parametrize("scale_rewards,beta,bias_correction", [("group", 0.0, False), ("batch", 0.04, False),
                                                                ("none", 0.04, True)])
def test_loss_and_gradient_equal_trls_grpo_trainer(embedded64, tmp_path, monkeypatch, trl_loss, scale_rewards, beta,
                                                   bias_correction):
    """TRL imported, not copied: GRPOTrainer scores a generation batch (rewards, advantages, reference log-probs) and
    computes its loss over two gradient-accumulation steps and the gradient; dppo's ADVANTAGES and policy_objective on
    the same inputs give the same loss, gradient and binding-clip fractions, to 1e-9 (float64 numerics,
    tests/trl_rig.py). Where dppo's defaults differ from TRL's, set equal here: adv_eps 1e-4 (TRL hard-codes it; dppo
    defaults to verl's 1e-6). Per micro-batch dppo's normaliser is what TRL's loss type divides by: B G rows for the
    sequence means, the generation batch's tokens for dapo, and each micro-batch's tokens x GA for bnpo (dppo's
    token-mean has one Z per step: bnpo equals it on one micro-batch)."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import split_tensor_dict

    from tests.trl_rig import COMPLETIONS, GA, PROMPTS, SPG, G, float64_numerics, make_trainer, rows

    float64_numerics(monkeypatch)
    model, tok = embedded64
    (trl_type, level), (loss_type, agg) = trl_loss, DPPO_OF_TRL[trl_loss]
    eps_low, eps_high = (3e-4, 4e-4) if level == "sequence" else (0.2, 0.28)
    trainer = make_trainer(GRPOTrainer, GRPOConfig, copy.deepcopy(model), tok,
                           Dataset.from_list([{"prompt": p} for p in PROMPTS[:2]]), tmp_path, G, loss_type=trl_type,
                           importance_sampling_level=level, scale_rewards=scale_rewards, beta=beta,
                           use_bias_correction_kl=bias_correction, epsilon=eps_low, epsilon_high=eps_high)
    out = trainer._generate_and_score_completions(rows([0, 1]))
    rewards = torch.tensor([COMPLETIONS[k][1] for k in (0, 1)], dtype=torch.float64)
    # TRL computes rewards and advantages in float32; both losses below use TRL's advantages
    assert torch.allclose(ADVANTAGES[scale_rewards](rewards, 1e-4).reshape(-1), out["advantages"].double(),
                          rtol=1e-6, atol=1e-6)
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    attention = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    T = out["completion_ids"].size(1)
    with torch.no_grad():  # an older policy, so that ratios move and clips bind, and a reference that differs from
        current = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, T)[0]  # the policy
    g = torch.Generator().manual_seed(zlib.crc32(repr(trl_loss).encode()))
    out["old_per_token_logps"] = current + 0.4 * torch.randn(current.shape, generator=g, dtype=torch.float64)
    if beta:  # (TRL's reference pass scored the initial weights, which are still the policy's: KL = 0 there)
        out["ref_per_token_logps"] = current + 0.3 * torch.randn(current.shape, generator=g, dtype=torch.float64)
    trainer.current_gradient_accumulation_steps = GA
    micro = split_tensor_dict(out, SPG)

    def gradient(loss):
        trainer.model.zero_grad()
        loss.backward()
        return torch.cat([p.grad.reshape(-1) for p in trainer.model.parameters() if p.grad is not None]).clone()

    trl_loss_value, trl_clips = 0.0, []
    for mb in micro:
        trl_loss_value = trl_loss_value + trainer._compute_loss(trainer.model, mb)
        trl_clips.append({k: trainer._metrics["train"][f"clip_ratio/{k}_mean"][-1] for k in ("low", "high", "region")})
    trl_grad = gradient(trl_loss_value)

    ours, clips = 0.0, []
    for mb in micro:
        mask = mb["completion_mask"].double()
        mb_ids = torch.cat([mb["prompt_ids"], mb["completion_ids"]], 1)
        logp = trainer._get_per_token_logps_and_entropies(
            trainer.model, mb_ids, torch.cat([mb["prompt_mask"], mb["completion_mask"]], 1), T)[0]
        z = {"seq-mean-token-mean": float(out["advantages"].numel()), "seq-mean-token-sum-norm":
             float(out["advantages"].numel()), "token-mean": float(out["num_items_in_batch"])}[agg]
        if trl_type == "bnpo":
            z = float(mask.sum()) * GA
        loss, stats = policy_objective(logp, mb["old_per_token_logps"], mb["advantages"].double(), mask,
                                       torch.ones(mask.size(0), dtype=torch.float64), z, loss_type=loss_type, agg=agg,
                                       clip_low=eps_low, clip_high=eps_high, ref_logp=mb.get("ref_per_token_logps"),
                                       kl_coef=beta, kl_bias_correction=bias_correction, max_len=8)
        ours = ours + loss
        clips.append({k: stats[f"clip_frac/{k}"][0] / stats[f"clip_frac/{k}"][1] for k in ("low", "high", "region")})
    grad = gradient(ours)
    assert float(ours) == pytest.approx(float(trl_loss_value), rel=1e-9, abs=1e-12)
    assert float((grad - trl_grad).abs().max()) <= 1e-9 * float(trl_grad.abs().max())
    for mine, theirs in zip(clips, trl_clips):  # TRL logs them in float32: fractions of a few dozen tokens
        for k in ("low", "high", "region"):
            assert mine[k] == pytest.approx(theirs[k], abs=1e-6), k
    assert any(c["region"] > 0 for c in trl_clips)  # the ratios bind somewhere, so the comparison means something


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
