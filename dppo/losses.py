"""Estimator math as pure functions (docs/method.md §2): advantages, per-token surrogates, KL, aggregation.

Shapes: B prompts, G completions each, N = B*G rows (row = b*G + i), T completion tokens (padded).
Functions are registered by name (ADVANTAGES, POLICY_LOSSES, AGGREGATIONS); the config's choices are
these registries' keys. An aggregation also carries what pruning needs to know of it (`Aggregation`): what its
normaliser counts and whether it divides a completion's loss by its length, so a new one is one registered entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch


@dataclass(frozen=True)
class Aggregation:
    """A loss aggregation L = sum_n w_n l_n / Z (docs/method.md §2.2) and the two facts pruning asks of it.

    `reduce(token_loss [N, T], mask [N, T], sample_weight [N], normaliser, max_len) -> []` computes L;
    `counts_tokens`: Z counts completion tokens (True) or completions (False), so each completion's share of Z is
    `units(lengths)` (§2.6); `divides_by_length`: l_n is divided by the completion's own length |o_n|, so the
    size proxy of ||grad l_n|| is too (§2.10). Calling it calls `reduce`."""
    reduce: Callable[..., torch.Tensor]
    counts_tokens: bool
    divides_by_length: bool

    def __call__(self, token_loss: torch.Tensor, mask: torch.Tensor, sample_weight: torch.Tensor,
                 normaliser: float, max_len: int = 0) -> torch.Tensor:
        return self.reduce(token_loss, mask, sample_weight, normaliser, max_len)

    def units(self, lengths: torch.Tensor) -> torch.Tensor:
        """Each completion's share of Z (float64, lengths' shape): its token count, or 1."""
        return lengths.to(torch.float64) if self.counts_tokens else torch.ones_like(lengths, dtype=torch.float64)


ADVANTAGES: dict[str, Callable] = {}
POLICY_LOSSES: dict[str, Callable] = {}
AGGREGATIONS: dict[str, Aggregation] = {}

# |log pi/pi_old| is clamped to this before exp (as verl), so one stale token cannot overflow the ratio
LOG_RATIO_CLAMP = 20.0


def _register(table: dict, name: str):
    def deco(fn):
        table[name] = fn
        return fn
    return deco


# ---------------------------------------------------------------- advantages (docs/method.md §2.1)
@_register(ADVANTAGES, "group")
def grpo_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: A_{b,i} = (r_{b,i} - mean_i r_b) / (std_i r_b + eps), std unbiased (n - 1), as TRL's
    `scale_rewards="group"` and verl's GRPO estimator.  rewards [B, G] -> advantages [B, G]."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + eps)


@_register(ADVANTAGES, "batch")
def batch_scaled_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """TRL's `scale_rewards="batch"`: A_{b,i} = (r_{b,i} - mean_i r_b) / (std(all rewards of the step) + eps),
    std unbiased over the B*G rolled-out rewards.  [B, G] -> [B, G].

    The std depends on which prompts were rolled out, so under prompt pruning the advantages (and the
    estimator) are not exactly those of the full batch (docs/method.md §2.8)."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std() if rewards.numel() > 1 else torch.zeros((), dtype=rewards.dtype)
    return (rewards - mean) / (std + eps)


@_register(ADVANTAGES, "none")
def drgrpo_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Dr. GRPO (TRL's `scale_rewards="none"`): A_{b,i} = r_{b,i} - mean_i r_b.  [B, G] -> [B, G]."""
    return rewards - rewards.mean(dim=1, keepdim=True)


def zero_std_groups(rewards: torch.Tensor) -> torch.Tensor:
    """[B] bool: groups whose G rewards are all equal (all-correct or all-wrong)."""
    return (rewards.max(dim=1).values - rewards.min(dim=1).values) == 0


# ---------------------------------------------------------------- per-token policy losses (§2.2)
class Surrogate(NamedTuple):
    loss: torch.Tensor  # [N, T] per-token surrogate, 0 where mask is 0
    ratio: torch.Tensor  # importance ratio pi/pi_old with its gradient: [N, T] (token level) or [N, 1] (sequence)


def _clipped(ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float) -> torch.Tensor:
    """-min(ratio A, clip(ratio, 1 - clip_low, 1 + clip_high) A), broadcast over ratio's shape."""
    a = adv[:, None]
    return -torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * a)


@_register(POLICY_LOSSES, "ppo_clip")
def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                  clip_low: float = 0.2, clip_high: float = 0.2) -> Surrogate:
    """Clipped surrogate per token (GRPO; DAPO's clip-higher when clip_high > clip_low):

        l_t = -min(rho_t A, clip(rho_t, 1 - clip_low, 1 + clip_high) A),  rho_t = exp(logp_t - old_logp_t)

    logp, old_logp, mask [N, T]; adv [N] -> Surrogate(loss [N, T], ratio [N, T])."""
    ratio = torch.exp((logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return Surrogate(_clipped(ratio, adv, clip_low, clip_high) * mask, ratio)


@_register(POLICY_LOSSES, "gspo")
def gspo_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
              clip_low: float = 3e-4, clip_high: float = 4e-4) -> Surrogate:
    """GSPO (Zheng et al. 2025; TRL `importance_sampling_level="sequence"`): one ratio per sequence,
    s_i = exp(mean_t (logp_t - old_logp_t)) (gradient s_i * mean_t grad logp_t), every token carrying

        l_t = -min(s_i A_i, clip(s_i, 1 - clip_low, 1 + clip_high) A_i)

    Aggregate with `seq-mean-token-mean`.  [N, T] -> Surrogate(loss [N, T], ratio [N, 1])."""
    length = mask.sum(dim=1).clamp(min=1)
    log_s = ((logp - old_logp) * mask).sum(dim=1) / length  # [N]
    ratio = torch.exp(log_s.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))[:, None]  # [N, 1]
    return Surrogate(_clipped(ratio, adv, clip_low, clip_high) * mask, ratio)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi || pi_ref) per token: exp(ref - logp) - (ref - logp) - 1 >= 0.  [N, T]."""
    d = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(d) - d - 1) * mask


# ---------------------------------------------------------------- aggregation (§2.2)
def register_aggregation(name: str, *, counts_tokens: bool, divides_by_length: bool):
    """Decorator: AGGREGATIONS[name] = Aggregation(fn, counts_tokens, divides_by_length) (the config's choices,
    pruning's normalisers and size proxies, and dppo.trl read it from there)."""
    def deco(fn):
        AGGREGATIONS[name] = Aggregation(fn, counts_tokens, divides_by_length)
        return fn
    return deco


@register_aggregation("seq-mean-token-mean", counts_tokens=False, divides_by_length=True)
def seq_mean_token_mean(token_loss: torch.Tensor, mask: torch.Tensor, sample_weight: torch.Tensor,
                        normaliser: float, max_len: int = 0) -> torch.Tensor:
    """L = sum_n w_n * (sum_t l_{n,t} / |o_n|) / Z  (Z: docs/method.md §2.6).  [N, T], [N, T], [N] -> []."""
    per_seq = (token_loss * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    return (sample_weight.to(per_seq.dtype) * per_seq).sum() / normaliser


@register_aggregation("seq-mean-token-sum-norm", counts_tokens=False, divides_by_length=False)
def seq_mean_token_sum_norm(token_loss: torch.Tensor, mask: torch.Tensor, sample_weight: torch.Tensor,
                            normaliser: float, max_len: int = 0) -> torch.Tensor:
    """Dr. GRPO: L = sum_n w_n * (sum_t l_{n,t} / L_max) / Z, L_max = max_new_tokens.  -> []."""
    if max_len <= 0:
        raise ValueError("seq-mean-token-sum-norm needs max_len > 0 (max_new_tokens)")
    per_seq = (token_loss * mask).sum(dim=1) / max_len
    return (sample_weight.to(per_seq.dtype) * per_seq).sum() / normaliser


@register_aggregation("token-mean", counts_tokens=True, divides_by_length=False)
def token_mean(token_loss: torch.Tensor, mask: torch.Tensor, sample_weight: torch.Tensor,
               normaliser: float, max_len: int = 0) -> torch.Tensor:
    """DAPO: L = sum_n w_n sum_t l_{n,t} / Z with Z a token count fixed before the masks are drawn
    (docs/method.md §2.6: the tokens of every rolled-out completion, pruned or kept).  -> []."""
    per_seq = (token_loss * mask).sum(dim=1)
    return (sample_weight.to(per_seq.dtype) * per_seq).sum() / normaliser


# ---------------------------------------------------------------- the objective and its diagnostics (§5)
def policy_objective(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                     sample_weight: torch.Tensor, normaliser: float, *, loss_type: str = "ppo_clip",
                     agg: str = "seq-mean-token-mean", clip_low: float = 0.2, clip_high: float = 0.2,
                     ref_logp: torch.Tensor | None = None, kl_coef: float = 0.0, kl_bias_correction: bool = False,
                     max_len: int = 0, token_weight: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, dict[str, tuple[float, float]]]:
    """Per-sample loss l_n = agg_t(c_t surrogate_t + kl_coef * k3_t [* ratio_t if kl_bias_correction]), then
    sum_n w_n l_n / normaliser, c_t = `token_weight` [N, T] (detached; the rollout correction, default 1).
    With all weights 1 and normaliser = B*G this is the plain GRPO-family loss.

    Diagnostics as (sum, count) pairs, so that summing both over micro-batches gives exact means:
    `clip_frac/{low,high,region}` count only clips that bind (ratio below 1 - clip_low with A < 0, above
    1 + clip_high with A > 0, as TRL), per token (per sequence for GSPO); `approx_kl` is the k3 estimate of
    KL(pi_old || pi) per token (cleanrl); `kl` the (bias-corrected, if on) k3 to the reference per token."""
    sur = POLICY_LOSSES[loss_type](logp, old_logp, adv, mask, clip_low, clip_high)
    tok = sur.loss if token_weight is None else sur.loss * token_weight.detach()
    n_tokens = float(mask.sum())
    stats: dict[str, tuple[float, float]] = {}
    if kl_coef > 0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs ref_logp")
        kl = kl_k3(logp, ref_logp, mask)
        if kl_bias_correction:  # TRL use_bias_correction_kl: importance-weight the k3 by pi/pi_old
            kl = kl * sur.ratio
        tok = tok + kl_coef * kl * mask
        stats["kl"] = (float((kl * mask).sum().detach()), n_tokens)
    loss = AGGREGATIONS[agg](tok, mask, sample_weight, normaliser, max_len)
    with torch.no_grad():
        ratio, a = sur.ratio, adv[:, None]
        low = ((ratio < 1 - clip_low) & (a < 0)).to(mask.dtype)
        high = ((ratio > 1 + clip_high) & (a > 0)).to(mask.dtype)
        if ratio.shape[1] == 1:  # sequence-level ratio: fractions of sequences
            seq = (mask.sum(dim=1, keepdim=True) > 0).to(mask.dtype)
            count, weigh = float(seq.sum()), seq
        else:
            count, weigh = n_tokens, mask
        for name, x in (("low", low), ("high", high), ("region", torch.maximum(low, high))):
            stats[f"clip_frac/{name}"] = (float((x * weigh).sum()), count)
        log_r = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        stats["approx_kl"] = (float(((torch.exp(log_r) - 1 - log_r) * mask).sum()), n_tokens)
    return loss, stats
