"""Gradient bias and variance of pruned estimators on a real batch (docs/method.md §2.7, figure F3).

With rollouts fixed and masks independent of theta, grad L_hat = sum_n c_n grad l_n, where c_n = keep_n w_n /
normaliser. So every statistic follows exactly from the per-sample gradients' Gram matrix
K = [<grad l_n, grad l_m>] and draws of the coefficient vector c:

    bias     = || E[c] - 1/N ||_K                     (0 for an unbiased estimator)
    variance = E || c - E[c] ||_K^2  = tr Cov[grad L_hat]
    closed form (Bernoulli, docs/method.md §2.7): sum_b [(1/pi_b - 1) ||S_b||^2 + (1/pi_b) sum_i (1/pi_bi - 1) ||g_bi||^2] / N^2
"""

from __future__ import annotations

import torch

from dppo.history import PromptHistory
from dppo.losses import grpo_advantages, policy_objective
from dppo.pruning import completion_candidates, inclusion_probs, prune_step
from dppo.reward import math_reward
from dppo.rollout import HFRollout, RolloutBatch, SamplingParams
from dppo.scoring import completion_logprobs, pad_completions


def rollout(model, tok, prompts: list[str], answers: list[str], group_size: int, max_new_tokens: int = 48,
            seed: int = 0):
    """G sampled completions per prompt and their rewards [B, G] (seeded)."""
    torch.manual_seed(seed)
    batch = HFRollout(model, tok, 64).generate(prompts, SamplingParams(n=group_size, max_new_tokens=max_new_tokens))
    rewards = torch.tensor([math_reward(t, answers[r // group_size]) for r, t in enumerate(batch.texts)])
    return batch, rewards.view(len(prompts), group_size)


def per_sample_gram(model, tok, batch, adv: torch.Tensor, kl_coef: float = 0.1, seed: int = 0) -> torch.Tensor:
    """K [N, N] float64 of the per-sample gradients of the clipped surrogate + beta * k3 KL; old and reference
    log-probs are the current ones perturbed (seeded) so that clipping and the KL act."""
    gen = torch.Generator().manual_seed(seed)
    grads = []
    for n in range(adv.numel()):
        model.zero_grad(set_to_none=True)
        logp = completion_logprobs(model, batch.prompt_ids[n:n + 1], batch.completion_ids[n:n + 1], tok.pad_token_id)
        mask = pad_completions([torch.ones(logp.shape[1])], None, logp.device)[1]
        old = logp.detach() + 0.3 * torch.randn(logp.shape, generator=gen).to(logp.device)
        ref = logp.detach() + 0.5 * torch.randn(logp.shape, generator=gen).to(logp.device)
        loss, _ = policy_objective(logp, old, adv.reshape(-1)[n:n + 1], mask, torch.ones(1), 1.0, ref_logp=ref,
                                   kl_coef=kl_coef)
        loss.backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).double().cpu())
    model.zero_grad(set_to_none=True)
    g = torch.stack(grads)  # [N, P]
    return g @ g.T


def gradient_gram(model, tok, prompts: list[str], answers: list[str], n_groups: int, group_size: int,
                  zero_variance_groups: int, max_new_tokens: int = 48, kl_coef: float = 0.1, seed: int = 0) -> dict:
    """Roll out every prompt, keep `n_groups` groups of which `zero_variance_groups` have all-equal rewards
    (so the prompt stage has candidates: prompts whose last group had zero variance), then GRPO advantages
    and per_sample_gram. Returns rewards [B, G], adv [B, G], gram [N, N], lengths [N]."""
    G = group_size
    batch, rewards = rollout(model, tok, prompts, answers, G, max_new_tokens, seed)
    zero = (rewards.max(1).values == rewards.min(1).values).tolist()
    pick = [b for b, z in enumerate(zero) if z][:zero_variance_groups]
    pick += [b for b, z in enumerate(zero) if not z][: n_groups - len(pick)]
    if len(pick) < n_groups:
        raise ValueError(f"only {len(pick)} usable groups among {len(prompts)} prompts; pass more prompts")
    pick.sort()
    rows = [b * G + i for b in pick for i in range(G)]
    sub = RolloutBatch(*([getattr(batch, f)[r] for r in rows] for f in
                         ("prompt_ids", "completion_ids", "logprobs", "texts", "truncated")))
    rewards = rewards[pick]
    adv = grpo_advantages(rewards)
    return {"rewards": rewards, "adv": adv, "gram": per_sample_gram(model, tok, sub, adv, kl_coef, seed),
            "lengths": [len(c) for c in sub.completion_ids]}


def history_from(rewards: torch.Tensor, adv: torch.Tensor, lengths: list[int]) -> PromptHistory:
    """A history in which every prompt was last seen with exactly these rollouts (so zero-variance groups
    are prompt candidates, as in the epoch after)."""
    h, G = PromptHistory(), rewards.shape[1]
    for b in range(rewards.shape[0]):
        h.update(b, rewards[b].tolist(), adv[b].abs().tolist(), lengths[b * G:(b + 1) * G], step=0)
    return h


def coefficients(pruner, rewards: torch.Tensor, history, draws: int, seed: int = 0,
                 lengths: torch.Tensor | None = None, **step_kw) -> torch.Tensor:
    """[draws, N] coefficients c (grad L_hat = c @ grad l): `prune_step` on fixed rollouts (rewards [B, G],
    lengths [B, G]), masks drawn as the trainer draws them; `step_kw` as prune_step's settings."""
    B, G = rewards.shape
    lengths = torch.ones(B, G, dtype=torch.long) if lengths is None else lengths
    gen = torch.Generator().manual_seed(seed)
    out = torch.zeros(draws, B * G, dtype=torch.float64)
    for d in range(draws):
        step = prune_step(pruner, list(range(B)), history, lambda keys: (rewards[keys], lengths[keys]), gen,
                          group_size=G, **{"prompts_per_step": B, **step_kw})
        rows = (torch.tensor(step.rolled, dtype=torch.long)[:, None] * G + torch.arange(G)).reshape(-1)[step.rows]
        out[d, rows] = step.weights / step.normaliser
    return out


def bias_and_variance(coef: torch.Tensor, gram: torch.Tensor) -> dict:
    """bias ||E c - 1/N||_K, its Monte-Carlo standard error, variance tr Cov, and cosine to the full gradient."""
    n = gram.shape[0]
    full = torch.full((n,), 1.0 / n, dtype=torch.float64)
    mean = coef.mean(0)
    diff = mean - full
    centred = coef - mean
    per_draw = torch.einsum("dn,nm,dm->d", centred, gram, centred)
    var = per_draw.mean() * coef.shape[0] / max(1, coef.shape[0] - 1)
    cos = (mean @ gram @ full) / torch.sqrt((mean @ gram @ mean) * (full @ gram @ full))
    return {"bias": float(torch.sqrt(diff @ gram @ diff)), "bias_se": float(torch.sqrt(var / coef.shape[0])),
            "variance": float(var), "cosine": float(cos), "full_grad_sq": float(full @ gram @ full)}


def closed_form_variance(rewards: torch.Tensor, adv: torch.Tensor, gram: torch.Tensor, prompt_candidates: torch.Tensor,
                         prompt_rate: float, completion_rate: float) -> float:
    """tr Cov[grad L_hat] of DPPO with Bernoulli masks (docs/method.md §2.7)."""
    B, G = rewards.shape
    n = B * G
    sq = torch.diagonal(gram)
    group = torch.zeros(B, n, dtype=torch.float64)
    for b in range(B):
        group[b, b * G:(b + 1) * G] = 1.0
    sq_group = torch.diagonal(group @ gram @ group.T)
    pi_o = inclusion_probs(completion_candidates(adv, rewards), completion_rate, "bernoulli").reshape(-1)
    pi_q = inclusion_probs(prompt_candidates, prompt_rate, "bernoulli")
    total = ((1 / pi_q - 1) * sq_group).sum() + (group @ ((1 / pi_o - 1) * sq) / pi_q).sum()
    return float(total) / n**2
