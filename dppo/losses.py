"""Estimator math as pure functions (SPEC §2): advantages, per-token surrogates, KL, aggregation.

Shapes: B prompts, G completions each, N = B*G rows (row = b*G + i), T completion tokens (padded).
Functions are registered by name (ADVANTAGES, POLICY_LOSSES, AGGREGATIONS) so configs pick them.
"""

from __future__ import annotations

from typing import Callable

import torch

ADVANTAGES: dict[str, Callable] = {}
POLICY_LOSSES: dict[str, Callable] = {}
AGGREGATIONS: dict[str, Callable] = {}


def _register(table: dict, name: str):
    def deco(fn):
        table[name] = fn
        return fn
    return deco


# ---------------------------------------------------------------- advantages
@_register(ADVANTAGES, "grpo")
def grpo_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: A_{b,i} = (r_{b,i} - mean_i r_b) / (std_i r_b + eps), std unbiased (n-1), as in TRL/verl.

    rewards [B, G] -> advantages [B, G], computed on the full group before any pruning."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + eps)


@_register(ADVANTAGES, "drgrpo")
def drgrpo_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Dr. GRPO: A_{b,i} = r_{b,i} - mean_i r_b.  rewards [B, G] -> [B, G]."""
    return rewards - rewards.mean(dim=1, keepdim=True)


def zero_std_groups(rewards: torch.Tensor) -> torch.Tensor:
    """[B] bool: groups whose G rewards are all equal (all-correct or all-wrong)."""
    return (rewards.max(dim=1).values - rewards.min(dim=1).values) == 0


# ---------------------------------------------------------------- per-token policy losses
@_register(POLICY_LOSSES, "ppo_clip")
def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                  clip_low: float = 0.2, clip_high: float = 0.2) -> torch.Tensor:
    """Clipped surrogate per token (GRPO; DAPO's clip-higher when clip_high > clip_low):

        l_t = -min(rho_t A, clip(rho_t, 1 - clip_low, 1 + clip_high) A),  rho_t = exp(logp_t - old_logp_t)

    logp, old_logp, mask [N, T]; adv [N] -> [N, T] (0 where mask is 0)."""
    ratio = torch.exp(logp - old_logp)
    a = adv[:, None]
    loss = -torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * a)
    return loss * mask


@_register(POLICY_LOSSES, "gspo")
def gspo_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
              clip_low: float = 3e-4, clip_high: float = 4e-4) -> torch.Tensor:
    """GSPO (Zheng et al. 2025): sequence-level ratio s_i = exp(mean_t (logp - old_logp)), applied per
    token as s_{i,t} = sg(s_i) * exp(logp_t - sg(logp_t)) so that its gradient is s_i * mean_t grad logp:

        l_t = -min(s_{i,t} A_i, clip(s_{i,t}, 1 - clip_low, 1 + clip_high) A_i)

    Aggregate with `seq-mean-token-mean`.  [N, T] -> [N, T]."""
    length = mask.sum(dim=1).clamp(min=1)
    log_s = ((logp - old_logp) * mask).sum(dim=1) / length  # [N]
    s_tok = torch.exp(log_s.detach()[:, None] + logp - logp.detach())  # [N, T]
    a = adv[:, None]
    loss = -torch.minimum(s_tok * a, torch.clamp(s_tok, 1 - clip_low, 1 + clip_high) * a)
    return loss * mask


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi || pi_ref) per token: exp(ref - logp) - (ref - logp) - 1 >= 0.  [N, T]."""
    d = ref_logp - logp
    return (torch.exp(d) - d - 1) * mask


# ---------------------------------------------------------------- aggregation
@_register(AGGREGATIONS, "seq-mean-token-mean")
def seq_mean_token_mean(token_loss: torch.Tensor, mask: torch.Tensor, sample_weight: torch.Tensor,
                        normaliser: float, max_len: int = 0) -> torch.Tensor:
    """L = sum_n w_n * (sum_t l_{n,t} / |o_n|) / normaliser.  Unbiased under pruning with
    w = 1/(pi_q pi_o) and normaliser = covered prompts x G (SPEC §2).  [N, T], [N, T], [N] -> []."""
    per_seq = (token_loss * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    return (sample_weight * per_seq).sum() / normaliser


@_register(AGGREGATIONS, "seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(token_loss: torch.Tensor, mask: torch.Tensor, sample_weight: torch.Tensor,
                            normaliser: float, max_len: int = 0) -> torch.Tensor:
    """Dr. GRPO: L = sum_n w_n * (sum_t l_{n,t} / L_max) / normaliser, L_max = max_new_tokens.  -> []."""
    if max_len <= 0:
        raise ValueError("seq-mean-token-sum-norm needs max_len > 0 (max_new_tokens)")
    per_seq = (token_loss * mask).sum(dim=1) / max_len
    return (sample_weight * per_seq).sum() / normaliser


@_register(AGGREGATIONS, "token-mean")
def token_mean(token_loss: torch.Tensor, mask: torch.Tensor, sample_weight: torch.Tensor,
               normaliser: float, max_len: int = 0) -> torch.Tensor:
    """DAPO: L = sum_n w_n sum_t l_{n,t} / normaliser, normaliser = number of completion tokens of the
    batch.  A ratio of random quantities after prompt pruning, so not exactly unbiased (SPEC §2).  -> []."""
    return (sample_weight[:, None] * token_loss * mask).sum() / normaliser


def policy_objective(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                     sample_weight: torch.Tensor, normaliser: float, *, loss_type: str = "ppo_clip",
                     agg: str = "seq-mean-token-mean", clip_low: float = 0.2, clip_high: float = 0.2,
                     ref_logp: torch.Tensor | None = None, kl_coef: float = 0.0, max_len: int = 0
                     ) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-sample loss l_n = agg_t(surrogate_t + kl_coef * k3_t), then sum_n w_n l_n / normaliser.

    With all weights 1 and normaliser = B*G this is the plain GRPO-family loss."""
    tok = POLICY_LOSSES[loss_type](logp, old_logp, adv, mask, clip_low, clip_high)
    stats = {}
    if kl_coef > 0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp")
        kl = kl_k3(logp, ref_logp, mask)
        tok = tok + kl_coef * kl
        stats["kl"] = float((kl.sum() / mask.sum().clamp(min=1)).detach())
    loss = AGGREGATIONS[agg](tok, mask, sample_weight, normaliser, max_len)
    with torch.no_grad():
        ratio = torch.exp(logp - old_logp)
        clipped = ((ratio < 1 - clip_low) | (ratio > 1 + clip_high)).float() * mask
        stats["clip_frac"] = float(clipped.sum() / mask.sum().clamp(min=1))
    return loss, stats
