"""Hierarchical pruning with exact inclusion probabilities (SPEC §2), and the biased baselines.

Pure functions on tensors; masks are drawn from an explicit `torch.Generator` (never the global
stream), once per step, and never depend on the policy parameters, so

    L_hat = 1/(B G) * sum_{kept (b,i)} l_{b,i} / (pi_q(b) pi_o(b,i))   satisfies   E[L_hat] = L.

Sampling modes, both exact:
  * "bernoulli":   each candidate is kept independently with pi = 1 - r;
  * "fixed_count": k = floor(r n) of the n candidates are dropped, a uniformly random subset; pi = (n - k)/n.
Non-candidates are always kept (pi = 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SAMPLING_MODES = ("bernoulli", "fixed_count")


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

    def skip_prob(self, easy_streak: int, hard_streak: int) -> float:
        """1 - max(p^z, 0.01) with z the count of the most recent consecutive zero-variance visits."""
        if easy_streak > 0:
            return 1.0 - max(self.p_easy ** easy_streak, 0.01)
        if hard_streak > 0:
            return 1.0 - max(self.p_hard ** hard_streak, 0.01)
        return 0.0

    def adapt(self, frac_easy: float, frac_hard: float) -> None:
        """Move each p by one step toward the zero-variance target: too many zero-variance groups
        rolled out -> explore less (p down); too few -> explore more (p up)."""
        def move(p, frac, target):
            p = p - self.step_size if frac >= target else p + self.step_size
            return min(self.high, max(self.low, p))
        self.p_easy = move(self.p_easy, frac_easy, self.target_easy)
        self.p_hard = move(self.p_hard, frac_hard, self.target_hard)


# ------------------------------------------------------------------ pruners behind one interface
@dataclass
class Selection:
    keep: torch.Tensor  # bool, [B] (prompt stage) or [B, G] (completion stage)
    pi: torch.Tensor  # float64 inclusion probability, same shape


class Pruner:
    """Base class: no pruning. Subclasses override a stage; the trainer calls, per step,
    select_prompts -> rollout -> select_completions -> loss_weights -> after_step."""

    weighted = False  # whether loss_weights applies 1/pi
    refill_rounds = 1  # rollout rounds a step may take (DAPO dynamic sampling refills)

    def __init__(self, prompt_rate: float = 0.0, completion_rate: float = 0.0, sampling: str = "bernoulli",
                 prompt_rule: str = "zero_variance", abs_adv_threshold: float = 0.0, cppo_per_group: bool = True,
                 cppo_allocation: bool = True, dapo_max_rounds: int = 4):
        self.prompt_rate, self.completion_rate, self.sampling = prompt_rate, completion_rate, sampling
        self.prompt_rule, self.abs_adv_threshold, self.cppo_per_group = prompt_rule, abs_adv_threshold, cppo_per_group
        self.cppo_allocation, self.dapo_max_rounds = cppo_allocation, dapo_max_rounds

    def prompts_to_cover(self, batch_prompts: int) -> int:
        """How many prompts a step takes from the data stream (B; CPPO's allocation takes more)."""
        return batch_prompts

    def needs_refill(self, rewards: torch.Tensor, batch_prompts: int) -> bool:
        """Whether to roll out another round of prompts (only DAPO dynamic sampling does)."""
        return False

    def limit(self, keep: torch.Tensor, batch_prompts: int) -> torch.Tensor:
        """Final cap on the kept [B', G] rows (DAPO trains at most B groups)."""
        return keep

    def prompt_candidates(self, keys: list[int], history) -> torch.Tensor:
        """[B] bool from history: zero-variance group at the last visit (or mean |A| below the
        threshold); never-seen prompts are never candidates."""
        out = torch.zeros(len(keys), dtype=torch.bool)
        for j, k in enumerate(keys):
            rec = history.get(k)
            if rec is not None:
                out[j] = rec.zero_variance if self.prompt_rule == "zero_variance" \
                    else rec.mean_abs_adv < self.abs_adv_threshold
        return out

    def prompt_inclusion(self, keys: list[int], history) -> torch.Tensor:
        """pi_q [len(keys)] float64 the prompt stage would use for this set, without drawing (step
        composition budgets with it, SPEC §3.1)."""
        return torch.ones(len(keys), dtype=torch.float64)

    def select_prompts(self, keys: list[int], history, gen: torch.Generator) -> Selection:
        n = len(keys)
        return Selection(torch.ones(n, dtype=torch.bool), torch.ones(n, dtype=torch.float64))

    def select_completions(self, rewards: torch.Tensor, adv: torch.Tensor, gen: torch.Generator) -> Selection:
        return Selection(torch.ones_like(adv, dtype=torch.bool), torch.ones_like(adv, dtype=torch.float64))

    def loss_weights(self, prompts: Selection, completions: Selection, group_size: int) -> tuple[torch.Tensor, float]:
        """Per kept row weight [K] and the loss normaliser. Unbiased (DPPO): 1/(pi_q pi_o) over the
        covered prompts x G. Biased baselines: weight 1 over the kept count (a plain mean)."""
        keep = completions.keep
        if self.weighted:
            w = importance_weights(prompts.pi[prompts.keep], completions.pi)[keep]
            return w, float(prompts.keep.numel() * group_size)
        return torch.ones(int(keep.sum()), dtype=torch.float64), float(max(1, int(keep.sum())))

    def after_step(self, rolled_rewards: torch.Tensor, epoch: int) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class NoPruner(Pruner):
    weighted = True  # weights 1 over B*G: plain GRPO


class DPPO(Pruner):
    """Dynamic Pruning Policy Optimization: random inclusion at both stages, 1/pi weights."""
    weighted = True

    def prompt_inclusion(self, keys, history):
        return inclusion_probs(self.prompt_candidates(keys, history), self.prompt_rate, self.sampling)

    def select_prompts(self, keys, history, gen):
        keep, pi = draw_keep_mask(self.prompt_candidates(keys, history), self.prompt_rate, self.sampling, gen)
        return Selection(keep, pi)

    def select_completions(self, rewards, adv, gen):
        keep, pi = draw_keep_mask(completion_candidates(adv, rewards), self.completion_rate, self.sampling, gen)
        return Selection(keep, pi)


class BiasedDPPO(DPPO):
    """Ablation: DPPO's masks without the 1/pi weights (kept-count normaliser)."""
    weighted = False


class CPPO(Pruner):
    """CPPO: keep the top ceil((1-P) G) |A| completions per group (or per batch); no weights."""

    def prompts_to_cover(self, batch_prompts):
        if not self.cppo_allocation:
            return batch_prompts
        return math.ceil(batch_prompts / (1 - self.completion_rate))  # refill to ~B*G trained completions

    def select_completions(self, rewards, adv, gen):
        keep = cppo_keep(adv, self.completion_rate, self.cppo_per_group)
        return Selection(keep, torch.ones_like(adv, dtype=torch.float64))


class GRESO(Pruner):
    """GRESO: skip a prompt with prob. 1 - max(p^z, 0.01) (z = its recent zero-variance streak),
    p adapted toward the zero-variance targets after the first epoch; no weights."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.state = GresoState()

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

    def after_step(self, rolled_rewards, epoch):
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


class DAPOFilter(Pruner):
    """DAPO dynamic sampling: drop zero-variance groups, roll out more prompts until B groups are
    informative (at most `dapo_max_rounds` rounds), train the first B; no weights."""

    @property
    def refill_rounds(self):
        return self.dapo_max_rounds

    def needs_refill(self, rewards, batch_prompts):
        return int((rewards.max(1).values != rewards.min(1).values).sum()) < batch_prompts

    def select_completions(self, rewards, adv, gen):
        informative = (rewards.max(1).values != rewards.min(1).values)[:, None].expand_as(adv)
        return Selection(informative.clone(), torch.ones_like(adv, dtype=torch.float64))

    def limit(self, keep, batch_prompts):
        return keep & (keep.any(1).cumsum(0) <= batch_prompts)[:, None]


def make_pruner(name: str, **kw) -> Pruner:
    table = {"none": NoPruner, "dppo": DPPO, "dppo_biased": BiasedDPPO, "cppo": CPPO, "greso": GRESO,
             "dapo_filter": DAPOFilter}
    if name not in table:
        raise ValueError(f"config field 'pruner' must be one of {list(table)}, got {name!r}")
    return table[name](**kw)
