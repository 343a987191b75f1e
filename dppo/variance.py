"""Gradient bias and variance of pruned estimators on a real batch (docs/method.md §2.7, figure F3).

With rollouts fixed and masks independent of theta, grad L_hat = sum_n c_n grad l_n, where c_n = keep_n w_n /
normaliser. So every statistic follows exactly from the per-sample gradients' Gram matrix
K = [<grad l_n, grad l_m>] and draws of the coefficient vector c:

    bias     = || E[c] - 1/N ||_K                     (0 for an unbiased estimator)
    variance = E || c - E[c] ||_K^2  = tr Cov[grad L_hat]
    closed form (independent inclusion, docs/method.md §2.7): sum_b [(1/pi_b - 1) ||S_b||^2 + (1/pi_b) sum_i (1/pi_bi - 1)
                ||g_bi||^2] / N^2, for the uniform rule's and the proportional rule's (§2.10) probabilities alike

On a model too large to hold N per-sample gradients (64 x 134.5 M x 8 B = 69 GB for SmolLM2-135M), each gradient is
streamed through a fixed random projection (a count sketch, `CountSketch`) and K is estimated without bias from the
sketches (docs/method.md §2.7, "On a real model").
"""

from __future__ import annotations

import dataclasses
import math

from dataclasses import dataclass

import pandas as pd
import torch

from dppo.config import TrainConfig
from dppo.history import PromptHistory
from dppo.losses import grpo_advantages, policy_objective
from dppo.pruning import DPPO, SIZE_PROXIES, logit_grad_sizes, prune_step
from dppo.reward import math_reward
from dppo.rollout import HFRollout, RolloutBatch, SamplingParams
from dppo.scoring import completion_logprobs, pad_completions


EMBEDDED_SAMPLING = TrainConfig(max_new_tokens=48)  # F3's batches without a run config: the embedded task, T = 1


def rollout(model, tok, prompts: list[str], answers: list[str], group_size: int,
            cfg: TrainConfig = EMBEDDED_SAMPLING, seed: int = 0):
    """G sampled completions per prompt and their rewards [B, G] (seeded), sampled and scored as `cfg`'s runs are
    (temperature, length, stop strings, reward)."""
    torch.manual_seed(seed)
    batch = HFRollout(model, tok, 64, stop_strings=cfg.stop_strings or ()).generate(prompts, SamplingParams(
        n=group_size, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, logprobs=True))
    rewards = torch.tensor([math_reward(t, answers[r // group_size], cfg.answer_check, cfg.answer_format)
                            for r, t in enumerate(batch.texts)])
    return batch, rewards.view(len(prompts), group_size)


class CountSketch:
    """A fixed random projection S: R^P -> R^k of a model's gradients, streamed parameter by parameter: coordinate j
    of the flattened gradient goes to bucket h(j) with sign s(j) (both drawn once, seeded), (S g)_k = sum_{h(j)=k}
    s(j) g_j. For any two vectors E[<S a, S b>] = <a, b>, so K_hat = Z Z^T (rows Z_n = S g_n) estimates the Gram
    matrix K without bias, and every quadratic form c^T K_hat c = ||S (sum_n c_n g_n)||^2 has relative standard
    deviation at most sqrt(2 / k) (docs/method.md §2.7). Memory: k floats a sample, and the buckets (int32) and
    signs (int8) of the P coordinates. Buckets sum in float32 (~P / k terms each: rounding ~1e-6 of a bucket, far
    below the sketch's own spread), several times faster than float64 on a CPU."""

    def __init__(self, shapes: list[int], dim: int, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.dim = dim
        self.buckets = [torch.randint(dim, (n,), generator=gen, dtype=torch.int32) for n in shapes]
        self.signs = [torch.randint(2, (n,), generator=gen, dtype=torch.int8) * 2 - 1 for n in shapes]

    def __call__(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """[k] float64 sketch of the gradient given as its parameters' pieces (in the order of `shapes`)."""
        out = torch.zeros(self.dim, dtype=torch.float32)
        for g, bucket, sign in zip(grads, self.buckets, self.signs):
            out.index_add_(0, bucket, g.reshape(-1).float().cpu() * sign)
        return out.double()


def per_sample_gram(model, tok, batch, adv: torch.Tensor, kl_coef: float = 0.1, seed: int = 0,
                    temperature: float = 1.0, sketch_dim: int = 0) -> tuple[torch.Tensor, float]:
    """(K [N, N] float64 of the per-sample gradients of the clipped surrogate + beta * k3 KL at the sampling
    temperature, the mean per-token KL); old and reference log-probs are the current ones perturbed (seeded) so that
    clipping and the KL act. sketch_dim k > 0: each gradient is streamed into a `CountSketch` of k buckets (seeded by
    `seed`) and K is its unbiased estimate Z Z^T; 0: the exact K from the stacked gradients."""
    gen = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    sketch = CountSketch([p.numel() for p in params], sketch_dim, seed) if sketch_dim else None
    rows, kl_sum, kl_tokens = [], 0.0, 0.0
    for n in range(adv.numel()):
        model.zero_grad(set_to_none=True)
        logp = completion_logprobs(model, batch.prompt_ids[n:n + 1], batch.completion_ids[n:n + 1], tok.pad_token_id,
                                   temperature)
        mask = pad_completions([torch.ones(logp.shape[1])], None, logp.device)[1]
        old = logp.detach() + 0.3 * torch.randn(logp.shape, generator=gen).to(logp.device)
        ref = logp.detach() + 0.5 * torch.randn(logp.shape, generator=gen).to(logp.device)
        loss, stats = policy_objective(logp, old, adv.reshape(-1)[n:n + 1], mask, torch.ones(1), 1.0, ref_logp=ref,
                                       kl_coef=kl_coef)
        if "kl" in stats:
            kl_sum, kl_tokens = kl_sum + stats["kl"][0], kl_tokens + stats["kl"][1]
        loss.backward()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        rows.append(sketch(grads) if sketch else torch.cat([g.reshape(-1) for g in grads]).double().cpu())
    model.zero_grad(set_to_none=True)
    z = torch.stack(rows)  # [N, P] or [N, k]
    return z @ z.T, kl_sum / max(kl_tokens, 1.0)


def gradient_gram(model, tok, prompts: list[str], answers: list[str], n_groups: int, group_size: int,
                  zero_variance_groups: int, cfg: TrainConfig = EMBEDDED_SAMPLING, kl_coef: float = 0.1, seed: int = 0,
                  sketch_dim: int = 0) -> dict:
    """Roll out every prompt, keep `n_groups` groups of which `zero_variance_groups` have all-equal rewards
    (so the prompt stage has candidates: prompts whose last group had zero variance), then GRPO advantages
    and per_sample_gram. Returns rewards [B, G], adv [B, G], gram [N, N], lengths [N], kl (mean per token) and
    logit_grad [B, G, 2] (`pruning.logit_grad_sizes` of the sampling log-probs)."""
    G = group_size
    batch, rewards = rollout(model, tok, prompts, answers, G, cfg, seed)
    zero = (rewards.max(1).values == rewards.min(1).values).tolist()
    pick = [b for b, z in enumerate(zero) if z][:zero_variance_groups]
    if len(pick) < zero_variance_groups:  # never substitute informative groups: the prompt stage needs candidates
        raise ValueError(f"only {len(pick)} of {len(prompts)} prompts gave a zero-variance group "
                         f"({zero_variance_groups} wanted); pass more prompts")
    pick += [b for b, z in enumerate(zero) if not z][: n_groups - len(pick)]
    if len(pick) < n_groups:
        raise ValueError(f"only {len(pick)} usable groups among {len(prompts)} prompts; pass more prompts")
    pick.sort()
    rows = [b * G + i for b in pick for i in range(G)]
    sub = RolloutBatch(*([getattr(batch, f)[r] for r in rows] for f in
                         ("prompt_ids", "completion_ids", "logprobs", "texts", "truncated")))
    rewards = rewards[pick]
    adv = grpo_advantages(rewards)
    gram, kl = per_sample_gram(model, tok, sub, adv, kl_coef, seed, cfg.temperature, sketch_dim)
    return {"rewards": rewards, "adv": adv, "gram": gram, "lengths": [len(c) for c in sub.completion_ids], "kl": kl,
            "logit_grad": logit_grad_sizes(sub.logprobs, G)}


def history_from(rewards: torch.Tensor, adv: torch.Tensor, lengths: list[int], sizes: torch.Tensor | None = None
                 ) -> PromptHistory:
    """A history in which every prompt was last seen with exactly these rollouts (so zero-variance groups
    are prompt candidates, as in the epoch after), with the completions' size proxies `sizes` [B, G] if given."""
    h, G = PromptHistory(), rewards.shape[1]
    for b in range(rewards.shape[0]):
        h.update(b, rewards[b].tolist(), adv[b].abs().tolist(), lengths[b * G:(b + 1) * G], step=0,
                 sizes=None if sizes is None else sizes[b].tolist())
    return h


@dataclass
class OracleDPPO(DPPO):
    """The proportional rule given each row's true gradient norm ||g_{b,i}|| = sqrt(K_nn) as its size, in place of
    a proxy, unmixed (docs/method.md §2.10): what any proxy could reach at the same budget. The norms travel in the
    `logit_grad[..., 0]` slot (`oracle_inputs`); its prompt stage reads their group means from the history."""
    uniform_mix: float = 0.0

    def completion_size(self, adv, lengths, logit_grad=None):
        return logit_grad[..., 0]


def oracle_inputs(gram: torch.Tensor, group_size: int) -> torch.Tensor:
    """[B, G, 2] with the true per-row gradient norms sqrt(diag K) in slot 0, for OracleDPPO."""
    norms = torch.diagonal(gram).clamp(min=0).sqrt().view(-1, group_size)
    return torch.stack([norms, norms], dim=-1)


def coefficients(pruner, rewards: torch.Tensor, history, draws: int, seed: int = 0,
                 lengths: torch.Tensor | None = None, logit_grad: torch.Tensor | None = None, **step_kw) -> torch.Tensor:
    """[draws, N] coefficients c (grad L_hat = c @ grad l): `prune_step` on fixed rollouts (rewards [B, G],
    lengths [B, G], logit_grad [B, G, 2]), masks drawn as the trainer draws them; `step_kw` as prune_step's settings."""
    B, G = rewards.shape
    lengths = torch.ones(B, G, dtype=torch.long) if lengths is None else lengths
    gen = torch.Generator().manual_seed(seed)
    out = torch.zeros(draws, B * G, dtype=torch.float64)
    for d in range(draws):
        step = prune_step(pruner, list(range(B)), history, lambda keys: (rewards[keys], lengths[keys])
                          + (() if logit_grad is None else (logit_grad[keys],)), gen,
                          group_size=G, **{"prompts_per_step": B, **step_kw})
        rows = (torch.tensor(step.rolled, dtype=torch.long)[:, None] * G + torch.arange(G)).reshape(-1)[step.rows]
        out[d, rows] = step.weights / step.normaliser
    return out


def bias_and_variance(coef: torch.Tensor, gram: torch.Tensor) -> dict:
    """bias ||E c - 1/N||_K, its Monte-Carlo standard error, variance tr Cov with its own standard error (from the
    spread of the per-draw ||c - mean||_K^2, heavy-tailed when some pi is small), and cosine to the full gradient."""
    n = gram.shape[0]
    full = torch.full((n,), 1.0 / n, dtype=torch.float64)
    mean = coef.mean(0)
    diff = mean - full
    centred = coef - mean
    per_draw = torch.einsum("dn,nm,dm->d", centred, gram, centred)
    var = per_draw.mean() * coef.shape[0] / max(1, coef.shape[0] - 1)
    cos = (mean @ gram @ full) / torch.sqrt((mean @ gram @ mean) * (full @ gram @ full))
    var_se = per_draw.std() / coef.shape[0] ** 0.5 if coef.shape[0] > 1 else torch.tensor(float("nan"))
    return {"bias": float(torch.sqrt(diff @ gram @ diff)), "bias_se": float(torch.sqrt(var / coef.shape[0])),
            "variance": float(var), "variance_se": float(var_se), "cosine": float(cos),
            "full_grad_sq": float(full @ gram @ full)}


def closed_form_variance(gram: torch.Tensor, pruner, history, rewards: torch.Tensor, adv: torch.Tensor,
                         lengths: torch.Tensor | None = None, logit_grad: torch.Tensor | None = None) -> dict:
    """Exact moments of a two-stage estimator with independent inclusion at both stages (docs/method.md §2.7), by
    enumerating the prompt masks (Poisson: each prompt with 0 < pi_b < 1 kept independently) and, given each,
    taking the completion stage's probabilities pi_bi | mask from the pruner (the proportional rule's depend on
    which prompts were rolled out):

        Var = E_mask[ sum_{b kept} (1/pi_b^2) sum_i (1/pi_bi - 1) ||g_bi||^2 ] / N^2  +  Var_mask[ E[grad L_hat | mask] ]

    which for the uniform rule is sum_b [(1/pi_b - 1) ||S_b||^2 + (1/pi_b) sum_i (1/pi_bi - 1) ||g_bi||^2] / N^2.
    Items with pi = 0 are never kept (the proportional rule gives pi = 0 only to zero-gradient items).
    Returns {variance, kept: E[kept rows] / N, rolled: E[rolled prompts] / B}."""
    import itertools

    B, G = rewards.shape
    n = B * G
    keys = list(range(B))
    pi_q = pruner.prompt_inclusion(keys, history)
    free = [b for b in keys if 0 < float(pi_q[b]) < 1]
    sq = torch.diagonal(gram)
    moments, total_p = [], 0.0
    for bits in itertools.product([True, False], repeat=len(free)):
        keep = pi_q >= 1
        prob = 1.0
        for b, k in zip(free, bits):
            keep[b] = k
            prob *= float(pi_q[b]) if k else 1 - float(pi_q[b])
        rolled = [b for b in keys if keep[b]]
        mean, cond, kept = torch.zeros(n, dtype=torch.float64), 0.0, 0.0
        if rolled:
            pi_o = pruner.completion_inclusion(rewards[rolled], adv[rolled], None if lengths is None else lengths[rolled],
                                               None if logit_grad is None else logit_grad[rolled])  # [K, G] | mask
            for j, b in enumerate(rolled):
                rows = slice(b * G, (b + 1) * G)
                mean[rows] = 1.0 / float(pi_q[b]) / n
                live = pi_o[j] > 0
                excess = torch.where(live, 1 / pi_o[j].clamp(min=1e-300) - 1, torch.zeros_like(pi_o[j]))
                cond += float((excess * sq[rows]).sum()) / float(pi_q[b]) ** 2 / n**2
                kept += float(pi_o[j].sum())
        moments.append((prob, mean, cond, kept, len(rolled)))
        total_p += prob
    assert abs(total_p - 1) < 1e-9
    expected = sum(p * m for p, m, *_ in moments)
    between = sum(p * float((m - expected) @ gram @ (m - expected)) for p, m, *_ in moments)
    return {"variance": sum(p * c for p, _, c, *_ in moments) + between,
            "kept": sum(p * k for p, _, _, k, _ in moments) / n, "rolled": sum(p * r for p, *_, r in moments) / B}


def rule_name(size_proxy: str = TrainConfig.size_proxy, uniform_mix: float = TrainConfig.uniform_mix) -> str:
    """A proportional rule's name in `rule_variances`' rows (and F3): "proportional, <proxy>, mix <lambda>"; without
    arguments, the library's default rule (TrainConfig's `size_proxy` and `uniform_mix`)."""
    return f"proportional, {size_proxy}, mix {uniform_mix:g}"


def rule_variances(batch: dict, rates: list[float], mixes: list[float], kl_coef: float = 0.1) -> list[dict]:
    """On one batch (`gradient_gram`'s output), the closed-form variance of the uniform rule and, at the same budget,
    of the proportional rule with every SIZE_PROXIES proxy and mixture lambda in `mixes`, and of the oracle, at each
    rate r = r_q = r_o (docs/method.md §2.10). Rows {rate, rule, size_proxy, uniform_mix, variance, ratio}, ratio =
    variance / the uniform rule's; the prompt stage of each reads its own proxy's sizes from the last visit."""
    rewards, adv, gram, kl = batch["rewards"], batch["adv"], batch["gram"], batch["kl"]
    B, G = rewards.shape
    lengths = torch.tensor(batch["lengths"]).view(B, G)
    history = history_from(rewards, adv, batch["lengths"])
    oracle_in = oracle_inputs(gram, G)
    rows = []
    for r in rates:
        uniform = closed_form_variance(gram, DPPO(prompt_prune_rate=r, completion_prune_rate=r), history, rewards, adv)["variance"]
        rules = [("uniform", DPPO(prompt_prune_rate=r, completion_prune_rate=r), None)]
        rules += [(rule_name(proxy, mix), DPPO(prompt_prune_rate=r, completion_prune_rate=r, inclusion="proportional",
                                                               size_proxy=proxy, uniform_mix=mix, kl_coef=kl_coef,
                                                               kl_estimate=kl), batch["logit_grad"])
                  for proxy in SIZE_PROXIES for mix in mixes]
        rules.append(("oracle", OracleDPPO(prompt_prune_rate=r, completion_prune_rate=r, inclusion="proportional"), oracle_in))
        for name, pruner, grad in rules:
            if name != "uniform":
                sized = history_from(rewards, adv, batch["lengths"], pruner.completion_size(adv, lengths, grad))
                v = closed_form_variance(gram, pruner, sized, rewards, adv, lengths, grad)["variance"]
            else:
                v = uniform
            rows.append({"rate": r, "rule": name, "size_proxy": getattr(pruner, "size_proxy", None)
                         if name.startswith("proportional") else None, "uniform_mix": pruner.uniform_mix
                         if name.startswith("proportional") else None, "variance": v,
                         "ratio": v / uniform if uniform > 0 else 1.0 if v == 0 else math.inf})  # 0/0: both free
    return rows


def proxy_correlations(batch: dict, kl_coef: float = 0.1) -> dict[str, float]:
    """Spearman rank correlation of each SIZE_PROXIES proxy with the true per-row gradient norm on one batch."""
    rewards, adv, gram = batch["rewards"], batch["adv"], batch["gram"]
    B, G = rewards.shape
    lengths = torch.tensor(batch["lengths"]).view(B, G)

    truth = pd.Series(torch.diagonal(gram).tolist())
    sizes = {proxy: DPPO(size_proxy=proxy, kl_coef=kl_coef, kl_estimate=batch["kl"]).completion_size(
        adv, lengths, batch["logit_grad"]) for proxy in SIZE_PROXIES}
    return {proxy: float(pd.Series(s.reshape(-1).tolist()).corr(truth, method="spearman")) for proxy, s in sizes.items()}


def task_problems(cfg: TrainConfig, tok, n: int, seed: int):
    """n training problems of `cfg`'s task for seed `seed`, prompts as its runs see them (template, chat turn)."""
    from dppo.data import model_prompts
    from dppo.trainer import load_data

    problems = load_data(dataclasses.replace(cfg, train_size=n, seed=seed))[0][:n]
    return model_prompts(problems, tok, cfg.chat_template, cfg.chat_template_kwargs)


def sample_batches(model, tok, n: int, first_seed: int, prompts: int, group_size: int, kl_coef: float = 0.1,
                   cfg: TrainConfig | None = None, sketch_dim: int = 0, pool: int = 8) -> list[tuple[int, dict]]:
    """n batches (`gradient_gram`, half the groups zero-variance, picked from `pool` x `prompts` prompts rolled
    out) of the task, prompts, temperature, length and reward of `cfg` (None: the embedded task, 48 new tokens at
    temperature 1), from rollout seeds first_seed, first_seed + 1, ...: [(seed, batch)]. A seed whose prompts give
    too few zero-variance groups is passed over (at most 2n + 5 seeds)."""
    cfg = EMBEDDED_SAMPLING if cfg is None else cfg
    out, seed = [], first_seed
    while len(out) < n:
        if seed >= first_seed + 2 * n + 5:
            raise RuntimeError(f"only {len(out)} of {n} batches from seeds {first_seed}-{seed - 1}: too few "
                               f"zero-variance groups; pass fewer prompts")
        problems = task_problems(cfg, tok, prompts * pool, seed)
        try:
            out.append((seed, gradient_gram(model, tok, [p.prompt for p in problems], [p.answer for p in problems],
                                            prompts, group_size, prompts // 2, cfg, kl_coef,
                                            seed, sketch_dim)))
        except ValueError:
            pass
        seed += 1
    return out
