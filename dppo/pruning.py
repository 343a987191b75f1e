"""Hierarchical pruning with exact inclusion probabilities, the biased baselines, and one pruning step
(docs/method.md §2.3-2.6 and §2.9).

Masks are drawn from an explicit `torch.Generator` (never the global stream), once per step, and never
depend on the policy parameters, so with weights w = 1 / (pi_q pi_o) and a normaliser Z fixed before the
masks are drawn

    L_hat = 1/Z * sum_{kept (b,i)} w_{b,i} l_{b,i}   satisfies   E[L_hat | history, rollouts] = 1/Z * sum_{b,i} l_{b,i}.

Sampling modes, both exact:
  * "bernoulli":   each candidate is kept independently with pi = 1 - r;
  * "fixed_count": k = floor(r n) of the n candidates are dropped, a uniformly random subset; pi = (n - k)/n.
Non-candidates are always kept (pi = 1). DPPO's `inclusion="proportional"` instead keeps every item
independently (Poisson sampling) with pi proportional to a gradient-size proxy (`SIZE_PROXIES`), at the uniform
rule's expected budget (`proportional_probs`), optionally mixed with the uniform rule's probabilities (§2.10).

A step's stages are plain functions on values: `prompt_stage` -> (the caller's rollout) -> `wants_refill` (DAPO)
-> `completion_stage` (full-group advantages, completion masks, weights and normaliser). `Trainer.train_step`
calls them in that order; `prune_step` is the same order around a rollout function (`dppo.variance`, the tests).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from dppo.losses import ADVANTAGES, AGGREGATIONS

SAMPLING_MODES = ("bernoulli", "fixed_count")
NORMALISERS = ("covered", "fixed")
INCLUSION_RULES = ("uniform", "proportional")

# ------------------------------------------------------------------ gradient-size proxies (docs/method.md §2.10)
# A completion's loss gradient is sum_t c_t grad log p(o_t) / (|o| for seq-mean-token-mean), with c_t the advantage's
# and the KL term's coefficient; grad log p(o_t) w.r.t. the logits is onehot - p, of size (1 - p_t) to within sqrt(2).
# A proxy is the sequence factor F [K, G] of size = sqrt(A^2 + 2 beta^2 k) * F / (|o| or 1): how the tokens' gradients
# add up, from the lengths [K, G] and `logit_grad` [K, G, 2] = (sum_t (1 - p_t), sqrt(sum_t (1 - p_t)^2)).
SIZE_PROXIES: dict[str, Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]] = {
    "adv": lambda lengths, logit_grad: lengths,  # tokens' gradients aligned, of one size: |A| alone (per token)
    "length": lambda lengths, logit_grad: lengths.sqrt(),  # orthogonal, of one size
    "logit_rms": lambda lengths, logit_grad: logit_grad[..., 1],  # orthogonal, each of size 1 - p_t
    "logit_sum": lambda lengths, logit_grad: logit_grad[..., 0],  # aligned, each of size 1 - p_t
}
NEEDS_LOGPROBS = ("logit_rms", "logit_sum")  # proxies that read the sampled tokens' log-probs


def logit_grad_sizes(logprobs: list[torch.Tensor], group_size: int) -> torch.Tensor:
    """[K, G, 2] float64: (sum_t (1 - p_t), sqrt(sum_t (1 - p_t)^2)) over each completion's sampled tokens, from
    their sampling log-probs (K*G rows, each [len]; p_t = exp(log-prob))."""
    out = torch.zeros(len(logprobs), 2, dtype=torch.float64)
    if not logprobs:
        return out.view(-1, group_size, 2)
    # one transfer for the whole batch (the sampler's rows may live on the GPU), then per-row sums on the CPU
    one_minus_p = 1.0 - torch.cat([lp.detach().reshape(-1) for lp in logprobs]).to("cpu", torch.float64).exp()
    row = torch.repeat_interleave(torch.arange(len(logprobs)), torch.tensor([lp.numel() for lp in logprobs]))
    out[:, 0].index_add_(0, row, one_minus_p)
    out[:, 1].index_add_(0, row, one_minus_p.square())
    out[:, 1].sqrt_()
    return out.view(-1, group_size, 2)


def inclusion_probs(candidates: torch.Tensor, rate: float, mode: str) -> torch.Tensor:
    """pi (float64, same shape): 1 - r (bernoulli) or (n - floor(r n)) / n (fixed_count, n = candidate
    count) for candidates, 1 for the others."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"prune rate must be in [0, 1), got {rate}")
    if mode not in SAMPLING_MODES:
        raise ValueError(f"prune_sampling must be one of {list(SAMPLING_MODES)}, got {mode!r}")
    n_cand = int(candidates.sum())
    if mode == "bernoulli":
        p = 1.0 - rate
    else:
        p = (n_cand - math.floor(rate * n_cand)) / max(1, n_cand)
    pi = torch.ones(candidates.shape, dtype=torch.float64)
    pi[candidates] = p
    return pi


def draw_keep_mask(candidates: torch.Tensor, rate: float, mode: str, gen: torch.Generator
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """keep [n] bool and inclusion probability pi [n] float64 for candidates [n] bool at prune rate r."""
    pi = inclusion_probs(candidates, rate, mode)
    keep = torch.ones(candidates.numel(), dtype=torch.bool)
    cand_idx = candidates.reshape(-1).nonzero().flatten()
    n_cand = cand_idx.numel()
    if n_cand and rate > 0.0:
        if mode == "bernoulli":
            keep[cand_idx] = torch.rand(n_cand, generator=gen, dtype=torch.float64) >= rate  # P(keep) = 1 - r
        else:
            keep[cand_idx[torch.randperm(n_cand, generator=gen)[:math.floor(rate * n_cand)]]] = False
    return keep.view_as(candidates), pi


def proportional_probs(size: torch.Tensor, budget: float, floor: float, exact_zeros: bool) -> torch.Tensor:
    """Inclusion probabilities proportional to size (Horvitz-Thompson; docs/method.md §2.10). size [n] >= 0 ->
    pi [n] float64 with sum_i pi_i = budget:

        pi_i = min(1, max(floor, c s_i))   (c found by bisection),

    With `exact_zeros`, items of size 0 get pi = 0 and take no budget (only for items whose loss is zero for every
    theta); otherwise they get the floor while larger items can use the budget, and share what is left once every
    larger item is kept for sure. When even keeping every item that may be kept does not reach the budget, the
    sum is smaller (nothing left to spend it on); when the floor alone exceeds it, every item gets the floor."""
    s = size.to(torch.float64).reshape(-1)
    live = s > 0 if exact_zeros else torch.ones_like(s, dtype=torch.bool)
    pos, zero = live & (s > 0), live & (s == 0)
    n_pos, n_zero = int(pos.sum()), int(zero.sum())
    pi = torch.zeros_like(s)
    if n_pos + n_zero == 0:
        return pi.view(size.shape)
    if budget >= n_pos + floor * n_zero:  # every sized item at 1; the size-0 ones share the rest
        pi[pos] = 1.0
        if n_zero:
            pi[zero] = min(1.0, max(floor, (budget - n_pos) / n_zero))
        return pi.view(size.shape)
    if budget <= floor * (n_pos + n_zero):
        pi[live] = floor
        return pi.view(size.shape)
    sp = s[pos]

    def total(c: float) -> float:
        return float((c * sp).clamp(min=floor, max=1.0).sum()) + floor * n_zero
    lo, hi = 0.0, 1.0 / float(sp.min())  # at hi every sized item has pi = 1: total >= budget
    for _ in range(100):  # the bracket halves each time: c to double precision
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if total(mid) < budget else (lo, mid)
    pi[pos] = (hi * sp).clamp(min=floor, max=1.0)
    pi[zero] = floor
    return pi.view(size.shape)


def draw_poisson(pi: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Poisson sampling: keep item i independently with probability pi_i. pi [...] float64 -> keep bool."""
    return torch.rand(pi.shape, generator=gen, dtype=torch.float64) < pi


def completion_candidates(adv: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """[B, G] bool: |A| below the group's mean |A|, and every completion of a zero-variance group."""
    abs_a = adv.abs()
    small = abs_a < abs_a.mean(dim=1, keepdim=True)
    zero_var = (rewards.max(dim=1).values == rewards.min(dim=1).values)[:, None]
    return small | zero_var


def importance_weights(pi_prompt: torch.Tensor, pi_completion: torch.Tensor) -> torch.Tensor:
    """w_{b,i} = 1 / (pi_q(b) pi_o(b,i)).  [B], [B, G] -> [B, G]."""
    return 1.0 / (pi_prompt[:, None] * pi_completion)


def cppo_keep(adv: torch.Tensor, prune_rate: float, per_group: bool = True) -> torch.Tensor:
    """CPPO: keep the ceil((1-P) n) completions of largest |A| (per group, or over the batch).
    [B, G] -> [B, G] bool; deterministic given the advantages; no weights."""
    B, G = adv.shape
    keep = torch.zeros(B, G, dtype=torch.bool)
    if per_group:
        k = math.ceil((1 - prune_rate) * G)
        top = adv.abs().topk(k, dim=1, sorted=False).indices
        keep.scatter_(1, top, True)
    else:
        k = math.ceil((1 - prune_rate) * B * G)
        keep.view(-1)[adv.abs().reshape(-1).topk(k, sorted=False).indices] = True
    return keep


# ------------------------------------------------------------------ normalisers (docs/method.md §2.6)
def unbiased_normaliser(loss_agg: str, prompt_pi: torch.Tensor, prompt_keep: torch.Tensor,
                        rolled_lengths: torch.Tensor, est_lengths: torch.Tensor, mode: str = "covered",
                        prompts_per_step: int | None = None) -> float:
    """Z of the re-weighted loss, fixed before the masks are drawn (given the history and the rollouts).

    prompt_pi, prompt_keep, est_lengths [S] over the covered prompts; rolled_lengths [K, G] completion
    lengths of the rolled-out (kept) prompts, in order. With u(o) a completion's share of Z (the aggregation's
    `units`: 1, or its token count |o|):

        Z = sum_{b: pi_b = 1} sum_i u(o_{b,i}) + sum_{b: pi_b < 1} G u(len_b)

    len_b = b's mean completion length at its last visit (a prompt that may be pruned has no token count that does
    not depend on the mask). Counting completions this is |S| G; counting tokens, with no prompt candidates, DAPO's
    token count of the whole batch. Mode "fixed": Z * prompts_per_step / |S| (= B G for seq-mean: epoch-level
    exactness, §2.6)."""
    S, G = prompt_keep.numel(), rolled_lengths.shape[1]
    units = AGGREGATIONS[loss_agg].units
    certain = prompt_pi[prompt_keep] >= 1.0  # [K]: prompts rolled out whatever the mask
    z = float(units(rolled_lengths)[certain].sum()) + G * float(units(est_lengths)[prompt_pi < 1.0].sum())
    if mode == "fixed":
        z *= (prompts_per_step or S) / S
    elif mode != "covered":
        raise ValueError(f"config field 'loss_normaliser' must be one of {list(NORMALISERS)}, got {mode!r}")
    return z


def kept_normaliser(loss_agg: str, keep: torch.Tensor, rolled_lengths: torch.Tensor) -> float:
    """The biased baselines' plain mean over what they keep: sum of u(o) over the kept rows (kept rows, or kept
    tokens for an aggregation that counts tokens), at least 1."""
    return max(1.0, float(AGGREGATIONS[loss_agg].units(rolled_lengths)[keep].sum()))


# ------------------------------------------------------------------ pruners, each with its own settings
@dataclass
class Selection:
    keep: torch.Tensor  # bool, [B] (prompt stage) or [B, G] (completion stage)
    pi: torch.Tensor  # float64 inclusion probability, same shape
    size: torch.Tensor | None = None  # the gradient-size proxy the probabilities followed, if any (same shape)


class Pruner:
    """What a pruner does at each stage; here every stage keeps everything (`NoPruning`). Subclasses override a
    stage; `prompt_stage` calls select_prompts, `completion_stage` select_completions -> limit -> loss_weights, and
    the trainer calls after_step."""

    weighted = True  # 1/pi weights on the kept rows (False: every kept row weighs 1)
    unbiased_z = True  # Z = unbiased_normaliser, fixed before the masks (False: kept_normaliser, a mean over the kept)
    refill_rounds = 1  # rollout rounds a step may take (DAPO dynamic sampling refills)
    @classmethod
    def from_config(cls, cfg) -> "Pruner":
        """This pruner with its settings from a TrainConfig-like `cfg`: every dataclass field of the pruner that `cfg`
        has, under the same name (the pruning fields it reads, and run fields such as kl_coef; docs/reference.md)."""
        own = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
        return cls(**{name: getattr(cfg, name) for name in own if hasattr(cfg, name)})

    def min_prompt_inclusion(self) -> float:
        """The smallest inclusion probability the prompt stage may give a prompt (1: no prompt stage)."""
        return 1.0

    def prompts_to_cover(self, batch_prompts: int) -> int:
        """How many prompts a step takes from the data stream (B; CPPO's allocation takes more)."""
        return batch_prompts

    def needs_refill(self, rewards: torch.Tensor, batch_prompts: int) -> bool:
        """Whether to roll out another round of prompts (only DAPO dynamic sampling does)."""
        return False

    def limit(self, keep: torch.Tensor, batch_prompts: int) -> torch.Tensor:
        """Final cap on the kept [B', G] rows (DAPO trains at most B groups)."""
        return keep

    def prompt_inclusion(self, keys: list[int], history) -> torch.Tensor:
        """pi_q [len(keys)] float64 the prompt stage would use for this set, without drawing (step
        composition budgets with it, docs/method.md §3.1)."""
        return torch.ones(len(keys), dtype=torch.float64)

    def select_prompts(self, keys: list[int], history, gen: torch.Generator) -> Selection:
        n = len(keys)
        return Selection(torch.ones(n, dtype=torch.bool), torch.ones(n, dtype=torch.float64))

    def select_completions(self, rewards: torch.Tensor, adv: torch.Tensor, gen: torch.Generator,
                           lengths: torch.Tensor | None = None, logit_grad: torch.Tensor | None = None) -> Selection:
        """Completion stage on full-group advantages; rewards, adv, lengths [K, G], logit_grad [K, G, 2] (see
        `logit_grad_sizes`; None when the rollout returned no log-probs)."""
        return Selection(torch.ones_like(adv, dtype=torch.bool), torch.ones_like(adv, dtype=torch.float64))

    def loss_weights(self, prompts: Selection, completions: Selection) -> torch.Tensor:
        """Weight of each kept row [R] float64: 1/(pi_q pi_o) when `weighted`, else 1."""
        keep = completions.keep
        if self.weighted:
            return importance_weights(prompts.pi[prompts.keep], completions.pi)[keep]
        return torch.ones(int(keep.sum()), dtype=torch.float64)

    def after_step(self, rolled_rewards: torch.Tensor, epoch: int, stats: dict | None = None) -> dict:
        """Adapt to the finished step (its rollouts' rewards [K, G] and the update's statistics)."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class NoPruning(Pruner):
    """No pruning (`pruner: none`): GRPO's step, every prompt rolled out and every completion trained."""


@dataclass
class DPPO(Pruner):
    """Dynamic Pruning Policy Optimization: random inclusion at both stages, 1/pi weights (§2.3). `inclusion`
    "uniform" keeps candidates with pi = 1 - r (the paper's rule); "proportional" spends the same expected
    budget with pi proportional to a gradient-size proxy, mixed with the uniform rule's pi by `uniform_mix` (§2.10)."""
    # settings named as the config's fields (config.TrainConfig declares them; from_config reads them by name)
    prompt_prune_rate: float = 0.0  # r_q
    completion_prune_rate: float = 0.0  # r_o
    prune_sampling: str = "bernoulli"
    prompt_candidate_rule: str = "zero_variance"  # or "abs_adv": mean |A| at the last visit below abs_adv_threshold
    abs_adv_threshold: float = 0.1
    inclusion: str = "uniform"  # or "proportional"
    inclusion_floor: float = 0.1  # pi_min of the proportional rule (weights <= 1 / pi_min)
    size_proxy: str = "logit_rms"  # a SIZE_PROXIES name (the default: chosen on F3's selection batches)
    uniform_mix: float = 0.25  # lambda: pi = (1 - lambda) pi_proportional + lambda pi_uniform
    kl_coef: float = 0.0  # beta: with beta > 0 no row's loss is zero for every theta
    loss_agg: str = "seq-mean-token-mean"
    kl_estimate: float = 0.0  # the last step's mean per-token KL to the reference (the KL term's size proxy)

    def min_prompt_inclusion(self):
        """Uniform rule 1 - r_q (bernoulli; fixed_count's (n - floor(r_q n)) / n is no smaller); proportional rule
        (1 - lambda) pi_min + lambda (1 - r_q)."""
        if self.prompt_prune_rate == 0:
            return 1.0
        uniform = 1.0 - self.prompt_prune_rate
        if self.inclusion == "proportional":
            return (1 - self.uniform_mix) * self.inclusion_floor + self.uniform_mix * uniform
        return uniform

    def prompt_candidates(self, keys: list[int], history) -> torch.Tensor:
        """[S] bool from history: zero-variance group at the last visit (or mean |A| below the threshold);
        never-seen prompts are never candidates."""
        out = torch.zeros(len(keys), dtype=torch.bool)
        for j, k in enumerate(keys):
            rec = history.get(k)
            if rec is not None:
                out[j] = rec.zero_variance if self.prompt_candidate_rule == "zero_variance" \
                    else rec.mean_abs_adv < self.abs_adv_threshold
        return out

    def _mix(self, proportional: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
        """(1 - lambda) pi_proportional + lambda pi_uniform; items the proportional rule drops as exact zeros
        (pi = 0) stay at 0. Both sum to the budget, so the mixture spends it (less the exact zeros' share)."""
        return (1 - self.uniform_mix) * proportional + self.uniform_mix * uniform * (proportional > 0)

    def prompt_inclusion(self, keys, history):
        candidates = self.prompt_candidates(keys, history)
        uniform = inclusion_probs(candidates, self.prompt_prune_rate, self.prune_sampling)
        if self.inclusion == "uniform":
            return uniform
        # proportional: the uniform rule's expected kept count over the seen prompts, pi ~ the mean size proxy of
        # the last visit's completions, floored (a prompt's gradient now is never known to be zero); never-seen: pi = 1
        seen = torch.tensor([history.get(k) is not None for k in keys], dtype=torch.bool)
        pi = torch.ones(len(keys), dtype=torch.float64)
        if self.prompt_prune_rate > 0 and bool(seen.any()):
            size = torch.tensor([history.get(k).mean_size for k, s in zip(keys, seen.tolist()) if s],
                                dtype=torch.float64)
            budget = float(seen.sum()) - self.prompt_prune_rate * float(candidates.sum())
            pi[seen] = proportional_probs(size, budget, self.inclusion_floor, exact_zeros=False)
        return self._mix(pi, uniform)

    def completion_size(self, adv: torch.Tensor, lengths: torch.Tensor | None,
                        logit_grad: torch.Tensor | None = None) -> torch.Tensor:
        """s [B, G], the proxy of ||grad l_{b,i}|| known after rollout (§2.10):

            s = sqrt(A^2 + 2 beta^2 k) * F / (|o| if the aggregation divides by the length, else 1)

        with F = SIZE_PROXIES[size_proxy](lengths, logit_grad) and k the last step's per-token KL (beta (1 - e^d)
        is the k3 term's per-token coefficient, of root mean square ~ beta sqrt(2k); it adds in quadrature to A's
        because its sign varies from token to token). No lengths: every length 1."""
        if self.size_proxy in NEEDS_LOGPROBS and logit_grad is None:
            raise ValueError(f"size_proxy {self.size_proxy!r} needs the sampled tokens' log-probs, which this rollout "
                             f"did not return; use size_proxy 'adv' or 'length', or a rollout that returns them")
        lengths = torch.ones_like(adv, dtype=torch.float64) if lengths is None else lengths.to(torch.float64)
        coef = (adv.to(torch.float64).square() + 2 * self.kl_coef ** 2 * self.kl_estimate).sqrt()
        per_sequence = SIZE_PROXIES[self.size_proxy](lengths, logit_grad)
        if AGGREGATIONS[self.loss_agg].divides_by_length:
            per_sequence = per_sequence / lengths.clamp(min=1)
        return coef * per_sequence

    def completion_inclusion(self, rewards, adv, lengths=None, logit_grad=None) -> torch.Tensor:
        """pi_o [B, G] of the completion stage, without drawing."""
        candidates = completion_candidates(adv, rewards)
        uniform = inclusion_probs(candidates, self.completion_prune_rate, self.prune_sampling)
        if self.inclusion == "uniform":
            return uniform
        budget = adv.numel() - self.completion_prune_rate * float(candidates.sum())
        exact = self.kl_coef == 0  # A = 0 and no KL term: l = 0 for every theta, so pi = 0 is exact
        size = self.completion_size(adv, lengths, logit_grad)
        return self._mix(proportional_probs(size, budget, self.inclusion_floor, exact), uniform)

    def select_prompts(self, keys, history, gen):
        if self.inclusion == "proportional":
            pi = self.prompt_inclusion(keys, history)
            return Selection(draw_poisson(pi, gen), pi)
        return Selection(*draw_keep_mask(self.prompt_candidates(keys, history), self.prompt_prune_rate, self.prune_sampling, gen))

    def select_completions(self, rewards, adv, gen, lengths=None, logit_grad=None):
        if self.inclusion == "proportional":
            pi = self.completion_inclusion(rewards, adv, lengths, logit_grad)
            return Selection(draw_poisson(pi, gen), pi, self.completion_size(adv, lengths, logit_grad))
        return Selection(*draw_keep_mask(completion_candidates(adv, rewards), self.completion_prune_rate, self.prune_sampling, gen))

    def after_step(self, rolled_rewards, epoch, stats=None):
        if stats and stats.get("kl") is not None:
            self.kl_estimate = float(stats["kl"])
        return {}

    def state_dict(self):
        return {"kl_estimate": self.kl_estimate}

    def load_state_dict(self, state):
        self.kl_estimate = float(state.get("kl_estimate", 0.0))


class BiasedDPPO(DPPO):
    """Ablation: DPPO's masks without the 1/pi weights and with a plain mean over the kept rows (two changes:
    the weights and Z; docs/method.md §2.9)."""
    weighted = False
    unbiased_z = False


class UnweightedDPPO(DPPO):
    """Ablation of the weights alone (T4's "without 1/pi weights"): DPPO's masks and DPPO's Z (unbiased_normaliser),
    every kept row weighing 1 instead of 1/(pi_q pi_o) (docs/method.md §2.9)."""
    weighted = False


@dataclass
class CPPO(Pruner):
    """CPPO: keep the top ceil((1-P) G) |A| completions per group (or per batch); no weights."""
    completion_prune_rate: float = 0.0  # P
    cppo_per_group: bool = True
    cppo_allocation: bool = True  # roll out ceil(B / (1 - P)) prompts so ~B*G completions train
    weighted = False
    unbiased_z = False

    def prompts_to_cover(self, batch_prompts):
        return math.ceil(batch_prompts / (1 - self.completion_prune_rate)) if self.cppo_allocation else batch_prompts

    def select_completions(self, rewards, adv, gen, lengths=None, logit_grad=None):
        return Selection(cppo_keep(adv, self.completion_prune_rate, self.cppo_per_group), torch.ones_like(adv, dtype=torch.float64))


@dataclass
class GresoState:
    """GRESO's adaptive exploration probabilities (one for all-correct, one for all-wrong prompts)."""
    p_easy: float = 0.5
    p_hard: float = 0.5
    target_easy: float = 0.25 / 3
    target_hard: float = 0.25 * 2 / 3
    step_size: float = 0.01
    low: float = 0.05
    high: float = 0.95
    min_keep: float = 0.01  # a prompt is kept with probability at least this

    def skip_prob(self, easy_streak: int, hard_streak: int) -> float:
        """1 - max(p^z, min_keep) with z the count of the most recent consecutive zero-variance visits."""
        if easy_streak > 0:
            return 1.0 - max(self.p_easy ** easy_streak, self.min_keep)
        if hard_streak > 0:
            return 1.0 - max(self.p_hard ** hard_streak, self.min_keep)
        return 0.0

    def adapt(self, frac_easy: float, frac_hard: float) -> None:
        """Move each p by one step toward the zero-variance target: too many zero-variance groups
        rolled out -> explore less (p down); too few -> explore more (p up)."""
        def move(p, frac, target):
            p = p - self.step_size if frac >= target else p + self.step_size
            return min(self.high, max(self.low, p))
        self.p_easy = move(self.p_easy, frac_easy, self.target_easy)
        self.p_hard = move(self.p_hard, frac_hard, self.target_hard)


@dataclass
class GRESO(Pruner):
    """GRESO: skip a prompt with prob. 1 - max(p^z, 0.01) (z = its recent zero-variance streak),
    p adapted toward the zero-variance targets after the first epoch; no weights."""
    state: GresoState = field(default_factory=GresoState)
    weighted = False
    unbiased_z = False

    def min_prompt_inclusion(self):
        return self.state.min_keep

    def prompt_inclusion(self, keys, history):
        skip = torch.zeros(len(keys), dtype=torch.float64)
        for j, k in enumerate(keys):
            rec = history.get(k)
            if rec is not None:
                skip[j] = self.state.skip_prob(rec.easy_streak, rec.hard_streak)
        return 1.0 - skip

    def select_prompts(self, keys, history, gen):
        pi = self.prompt_inclusion(keys, history)
        keep = torch.rand(len(keys), generator=gen, dtype=torch.float64) >= 1.0 - pi  # skip w.p. 1 - pi
        return Selection(keep, pi)

    def after_step(self, rolled_rewards, epoch, stats=None):
        if rolled_rewards.numel() and epoch > 0:
            zero = rolled_rewards.max(1).values == rolled_rewards.min(1).values
            easy = (zero & (rolled_rewards[:, 0] > 0)).float().mean().item()
            hard = (zero & (rolled_rewards[:, 0] <= 0)).float().mean().item()
            self.state.adapt(easy, hard)
        return {"greso/p_easy": self.state.p_easy, "greso/p_hard": self.state.p_hard}

    def state_dict(self):
        return {"p_easy": self.state.p_easy, "p_hard": self.state.p_hard}

    def load_state_dict(self, state):
        self.state.p_easy, self.state.p_hard = state["p_easy"], state["p_hard"]


@dataclass
class DAPOFilter(Pruner):
    """DAPO dynamic sampling: drop zero-variance groups, roll out more prompts until B groups are
    informative (at most `dapo_max_rounds` rounds), train the first B; no weights."""
    dapo_max_rounds: int = 4
    weighted = False
    unbiased_z = False

    @property
    def refill_rounds(self):
        return self.dapo_max_rounds

    def needs_refill(self, rewards, batch_prompts):
        return int((rewards.max(1).values != rewards.min(1).values).sum()) < batch_prompts

    def select_completions(self, rewards, adv, gen, lengths=None, logit_grad=None):
        informative = (rewards.max(1).values != rewards.min(1).values)[:, None].expand_as(adv)
        return Selection(informative.clone(), torch.ones_like(adv, dtype=torch.float64))

    def limit(self, keep, batch_prompts):
        return keep & (keep.any(1).cumsum(0) <= batch_prompts)[:, None]


# name -> class; the config's `pruner` choices are these keys
PRUNERS: dict[str, type[Pruner]] = {"none": NoPruning, "dppo": DPPO, "dppo_biased": BiasedDPPO, "dppo_unweighted": UnweightedDPPO, "cppo": CPPO,
                                    "greso": GRESO, "dapo_filter": DAPOFilter}
def build_pruner(cfg) -> Pruner:
    """The pruner named by `cfg.pruner`, given only its own settings from the config's fields."""
    if cfg.pruner not in PRUNERS:
        raise ValueError(f"config field 'pruner' must be one of {list(PRUNERS)}, got {cfg.pruner!r}")
    return PRUNERS[cfg.pruner].from_config(cfg)


# ------------------------------------------------------------------ one pruning step
@dataclass
class PrunedStep:
    """What one step keeps and how it weighs it. Rows index the rolled-out batch: row = j*G + i for the
    i-th completion of the j-th rolled-out prompt."""
    covered: list[int]  # [S] prompt keys the step covers (kept or pruned)
    prompt: Selection  # [S] prompt stage
    rolled: list[int]  # [K] keys rolled out, in rollout order
    rewards: torch.Tensor  # [K, G]
    lengths: torch.Tensor  # [K, G] completion lengths (tokens)
    advantages: torch.Tensor  # [K, G] on the full groups, before completion pruning
    completion: Selection  # [K, G] completion stage (after the pruner's limit)
    rows: torch.Tensor  # [R] long, kept rows
    weights: torch.Tensor  # [R] float64
    normaliser: float  # Z


@dataclass
class Rollouts:
    """What a step's rollout rounds returned, in rollout order: the values the completion stage reads."""
    rewards: torch.Tensor  # [K, G]
    lengths: torch.Tensor  # [K, G] completion lengths (tokens)
    logit_grad: torch.Tensor | None = None  # [K, G, 2] (sum_t (1 - p_t), sqrt(sum_t (1 - p_t)^2)) when read

    @classmethod
    def empty(cls, group_size: int) -> "Rollouts":
        """No prompt rolled out."""
        return cls(torch.zeros(0, group_size), torch.zeros(0, group_size, dtype=torch.long),
                   torch.zeros(0, group_size, 2, dtype=torch.float64))

    def concat(self, more: "Rollouts") -> "Rollouts":
        """This round's rows, then `more`'s (a DAPO refill round)."""
        both = self.logit_grad is not None and more.logit_grad is not None
        return Rollouts(torch.cat([self.rewards, more.rewards]), torch.cat([self.lengths, more.lengths]),
                        torch.cat([self.logit_grad, more.logit_grad]) if both else None)


@dataclass
class PromptStage:
    """The prompt stage's outcome over the covered keys (several rounds under DAPO's refill)."""
    covered: list[int]  # [S] prompt keys, kept or pruned
    selection: Selection  # [S]
    rolled: list[int]  # [K] the kept keys, in rollout order
    est_lengths: torch.Tensor  # [S] float64: each covered prompt's expected completion length (history)

    def extend(self, more: "PromptStage") -> "PromptStage":
        """This round's prompts, then `more`'s."""
        return PromptStage(self.covered + more.covered,
                           Selection(torch.cat([self.selection.keep, more.selection.keep]),
                                     torch.cat([self.selection.pi, more.selection.pi])),
                           self.rolled + more.rolled, torch.cat([self.est_lengths, more.est_lengths]))


def prompt_stage(pruner: Pruner, keys: list[int], history, gen: torch.Generator,
                 default_length: float = 1.0) -> PromptStage:
    """The prompt stage on the covered `keys` (docs/method.md §2.3): which to roll out, with their pi_q. The history
    is read, not written; the expected lengths are those before this step's rollouts (the normaliser's, §2.6)."""
    selection = pruner.select_prompts(keys, history, gen)
    est = torch.tensor(history.estimated_lengths(keys, default_length), dtype=torch.float64)
    return PromptStage(list(keys), selection, [k for k, kept in zip(keys, selection.keep.tolist()) if kept], est)


def wants_refill(pruner: Pruner, rollouts: Rollouts, rounds: int, batch_prompts: int) -> bool:
    """DAPO dynamic sampling (§2.9): another round of `batch_prompts` prompts after `rounds` rollout rounds?"""
    return rounds < pruner.refill_rounds and pruner.needs_refill(rollouts.rewards, batch_prompts)


def completion_stage(pruner: Pruner, prompts: PromptStage, rollouts: Rollouts, gen: torch.Generator, *,
                     group_size: int, scale_rewards: str = "group", adv_eps: float = 1e-6,
                     loss_agg: str = "seq-mean-token-mean", loss_normaliser: str = "covered",
                     prompts_per_step: int) -> PrunedStep:
    """Full-group advantages -> completion stage -> the pruner's limit -> weights 1/(pi_q pi_o) and the normaliser
    Z (docs/method.md §2.1, §2.3-2.6). `prompts_per_step`: B, the prompts a step trains."""
    G, B = group_size, prompts_per_step
    rewards, lengths = rollouts.rewards, rollouts.lengths
    adv = ADVANTAGES[scale_rewards](rewards, adv_eps) if prompts.rolled else torch.zeros(0, G)
    csel = pruner.select_completions(rewards, adv, gen, lengths, rollouts.logit_grad)
    csel.keep = pruner.limit(csel.keep, B)
    weights = pruner.loss_weights(prompts.selection, csel)
    psel = prompts.selection
    if pruner.unbiased_z:
        norm = unbiased_normaliser(loss_agg, psel.pi, psel.keep, lengths, prompts.est_lengths, loss_normaliser, B)
    else:
        norm = kept_normaliser(loss_agg, csel.keep, lengths)
    return PrunedStep(prompts.covered, psel, prompts.rolled, rewards, lengths, adv, csel,
                      csel.keep.reshape(-1).nonzero().flatten(), weights, norm)


Rollout = Callable[[list[int]], tuple[torch.Tensor, ...]]  # keys -> rewards [K, G], lengths [K, G][, logit_grad [K, G, 2]]


def prune_step(pruner: Pruner, keys: list[int], history, rollout: Rollout, gen: torch.Generator, *,
               group_size: int, scale_rewards: str = "group", adv_eps: float = 1e-6,
               loss_agg: str = "seq-mean-token-mean", loss_normaliser: str = "covered",
               prompts_per_step: int | None = None, more_keys: Callable[[int], list[int]] | None = None,
               default_length: float = 1.0) -> PrunedStep:
    """One step's pruning for a caller holding a `rollout` function (the tests, `dppo.variance`): prompt stage ->
    rollout -> (DAPO: more rounds from `more_keys`) -> completion stage. `Trainer.train_step` makes the same calls
    in the same order with its own rollout."""
    B = prompts_per_step or len(keys)

    def rolled_out(rolled: list[int]) -> Rollouts:
        return Rollouts(*rollout(rolled)) if rolled else Rollouts.empty(group_size)

    prompts = prompt_stage(pruner, keys, history, gen, default_length)
    rollouts, rounds = rolled_out(prompts.rolled), 1
    while more_keys is not None and wants_refill(pruner, rollouts, rounds, B):
        more = prompt_stage(pruner, more_keys(B), history, gen, default_length)
        prompts, rollouts, rounds = prompts.extend(more), rollouts.concat(rolled_out(more.rolled)), rounds + 1
    return completion_stage(pruner, prompts, rollouts, gen, group_size=group_size, scale_rewards=scale_rewards,
                            adv_eps=adv_eps, loss_agg=loss_agg, loss_normaliser=loss_normaliser, prompts_per_step=B)
