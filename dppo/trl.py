"""DPPO inside TRL: `DPPOConfig(GRPOConfig)` and `DPPOTrainer(GRPOTrainer)` (docs/trl.md).

A TRL user changes two imports and nothing else:

    from dppo.trl import DPPOConfig, DPPOTrainer      # was: from trl import GRPOConfig, GRPOTrainer

With both prune rates at 0 (the defaults) every method below hands over to TRL's own: DPPOTrainer is GRPOTrainer.
With rates > 0 the two stages of docs/method.md §2.3 run where they save work in TRL's step:

* prompt stage, in the sampler, before generation: the next stretch of TRL's prompt order is covered, the
  shortest one in which the fixed_count rule keeps exactly the generation batch's B prompts
  (`dppo.composition.exact_count_stretch`), so TRL's shapes (per-device batch, steps_per_generation, repeats)
  hold; pruned prompts are never generated. A pass over the data takes fewer generation batches.
* completion stage, in `_generate`, after rewards and before TRL's old-policy and reference log-prob passes: those
  passes score kept rows only, and the update never sees a pruned row.
* loss: TRL's own `_compute_loss`, where each kept row's whole per-token loss (surrogate x vLLM IS ratio, + beta KL)
  is multiplied by c_r = a_r w_r: w_r = 1 / (pi_q pi_o) and a_r the row's factor in TRL's loss of the unpruned
  batch (`trl_row_coefficients`), fixed before the masks (§2.6).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import math
import os
import warnings
from collections import defaultdict, deque
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import torch
import trl
from packaging.version import Version
from torch.utils.data import Dataset, Sampler
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import nanmax, nanmin, nanstd

from dppo import packing, pruning, seeding
from dppo.composition import exact_count_stretch
from dppo.config import FIELD_TYPES, PRUNER_FIELDS, ConfigError, TrainConfig, _check, check_pruning_fields
from dppo.history import PromptHistory
from dppo.losses import AGGREGATIONS

TESTED_TRL = ("1.16", "1.17")  # [from, to): DPPOTrainer overrides these TRL releases' private methods
if not Version(TESTED_TRL[0]) <= Version(Version(trl.__version__).base_version) < Version(TESTED_TRL[1]) \
        and os.environ.get("DPPO_TRL_UNTESTED") != "1":
    raise ImportError(f"dppo.trl is tested with TRL >= {TESTED_TRL[0]}, < {TESTED_TRL[1]} (it overrides private "
                      f"methods), found {trl.__version__}: pip install 'trl>={TESTED_TRL[0]},<{TESTED_TRL[1]}' (or "
                      f"set DPPO_TRL_UNTESTED=1 to try it)")

# ------------------------------------------------------------------ TRL's internals, borrowed
# What DPPOTrainer borrows from TESTED_TRL's private GRPOTrainer code beyond the methods it overrides (OVERRIDDEN): a
# tuple read by its TRL names, and four slots that carry dppo's values through TRL's step into its loss. Every use
# goes through this section, so a TRL release that changes one is fixed here (docs/trl.md; tests/test_trl.py checks
# them against the installed TRL). Private attributes read as TRL means them: _metrics, _step, _buffered_inputs,
# _tokenizer, _signature_columns, _train_batch_size.


class TRLGeneration(NamedTuple):
    """GRPOTrainer._generate's return, this process's rows: a bare 8-tuple in TRL 1.16, named as TRL names it."""
    prompt_ids: list  # [n] token ids
    completion_ids: list  # [n] token ids
    tool_mask: list | None  # [n] 1 for the model's tokens, 0 for tool results; None without tools
    completions: list  # [n] decoded
    logprobs: list | None  # [n] the sampled tokens' log-probs (vLLM only)
    extra_fields: dict  # rollout_func's extra fields
    images: list | None
    tool_images: list | None


def trl_generation(result: tuple) -> TRLGeneration:
    """`_generate`'s tuple read by TRL's field names; a tuple of another length (another TRL) is a one-line error."""
    if len(result) != len(TRLGeneration._fields):
        raise RuntimeError(f"DPPOTrainer: TRL {trl.__version__}'s GRPOTrainer._generate returned {len(result)} values, "
                           f"TRL {TESTED_TRL[0]}'s {len(TRLGeneration._fields)} ({', '.join(TRLGeneration._fields)})")
    return TRLGeneration(*result)


# dppo's values of a generation batch ride in TRL's output dict, which TRL 1.16 buffers, shuffles and splits into
# micro-batches (trl.trainer.utils shuffle_sequence_dict, split_tensor_dict): a [n] tensor travels with its rows, a
# 0-d one is copied into every micro-batch
ROW_WEIGHT = "dppo_weight"  # w_r [n]; its presence marks a pruned batch
CARRIED_KEYS = (ROW_WEIGHT, "dppo_seq_scale", "dppo_num_items")  # ... and `normaliser_factors`' two


def carry_in_batch(output: dict, weight: torch.Tensor, seq_scale: float, num_items: float) -> None:
    """Puts each local row's weight [n] and the batch's normaliser factors (`normaliser_factors`) in TRL's output."""
    scalar = functools.partial(torch.tensor, dtype=torch.float64, device=weight.device)
    output.update(zip(CARRIED_KEYS, (weight, scalar(seq_scale), scalar(num_items))))


def take_from_batch(inputs: dict) -> tuple[dict, torch.Tensor, float, float]:
    """A micro-batch without dppo's carried values, and those values: (inputs, weight [n], seq_scale, num_items)."""
    rest = {k: v for k, v in inputs.items() if k not in CARRIED_KEYS}
    weight, seq_scale, num_items = (inputs[k] for k in CARRIED_KEYS)
    return rest, weight, float(seq_scale), float(num_items)


# TRL 1.16's _compute_loss multiplies tool_mask into its loss mask and uses it nowhere else: the slot that carries each
# row's coefficient into TRL's per-token sum (and into its logged metrics, which read the mask)
WEIGHT_SLOT = "tool_mask"


def trl_loss_mask(inputs: dict) -> torch.Tensor:
    """TRL's loss mask of a batch [n, T]: completion_mask x tool_mask where there is one (tool results left out)."""
    mask = inputs["completion_mask"]
    return mask if WEIGHT_SLOT not in inputs else mask * inputs[WEIGHT_SLOT]


def put_row_scale(inputs: dict, scale: torch.Tensor, dtype: torch.dtype) -> None:
    """Multiplies each row's entries of TRL's loss mask by scale [n] (in `dtype`), through WEIGHT_SLOT."""
    base = inputs[WEIGHT_SLOT] if WEIGHT_SLOT in inputs else torch.ones_like(inputs["completion_mask"])
    inputs[WEIGHT_SLOT] = base.to(dtype) * scale.to(dtype)[:, None]


def dapo_slot_scale(coef: torch.Tensor, tokens: torch.Tensor, processes: int, steps_per_generation: int,
                    grad_accum: int) -> float:
    """s, the factor the rows' coefficients c_r [n] ride the slot with and the dapo divisor TRL is then given: the
    smallest that keeps TRL 1.16's clamps idle, every live row's weighted mask sum c_r s |o_r| >= 1 (the sequence-level
    importance ratio divides by mask.sum(-1).clamp(min=1)) and num_items_in_batch >= 1 (the dapo branch clamps it)."""
    live = (coef > 0) & (tokens > 0)
    smallest_row = 1.0 / float((coef[live] * tokens[live]).min()) if bool(live.any()) else 1.0
    return max(smallest_row, grad_accum / (processes * steps_per_generation))


def set_dapo_divisor(inputs: dict, divisor: float, processes: int, steps_per_generation: int, grad_accum: int,
                     dtype: torch.dtype) -> None:
    """Sets the micro-batch's num_items_in_batch (TRL's loss-token count of the whole generation batch) so that TRL's
    dapo branch divides its masked loss sum by `divisor`: TRL 1.16 divides by num_items / P x GA / spg in training,
    so num_items = divisor P spg / GA."""
    inputs["num_items_in_batch"] = torch.tensor(divisor * processes * steps_per_generation / grad_accum, dtype=dtype,
                                                device=inputs["completion_mask"].device)


@contextlib.contextmanager
def aggregated_by_dapo(trainer: GRPOTrainer):
    """trainer.loss_type is "dapo" inside, the user's again after, even if the loss raises. grpo, bnpo, dr_grpo, luspo
    and dapo share TRL 1.16's per-token loss and differ only in how `_compute_loss` aggregates it, by branching on
    self.loss_type; the weighted rows need the dapo branch's aggregation (a sum over a given divisor)."""
    own, trainer.loss_type = trainer.loss_type, "dapo"
    try:
        yield
    finally:
        trainer.loss_type = own


# TRL loss_type -> dppo's aggregation (docs/method.md §2.2); pruning supports these five. luspo (a row's token sum,
# averaged over the micro-batch's rows) is dr_grpo's with L_max = 1: the same normaliser, counting completions
LOSS_AGG = {"grpo": "seq-mean-token-mean", "dr_grpo": "seq-mean-token-sum-norm", "luspo": "seq-mean-token-sum-norm",
            "bnpo": "token-mean", "dapo": "token-mean"}
TRL_ADV_EPS = 1e-4  # TRL's advantage epsilon (hard-coded in GRPOTrainer)
PRUNING_LOG_LENGTH = 1000  # DPPOTrainer.pruning_log keeps the last this many generation batches
STATE_FILE = "dppo_state.json"  # in each TRL checkpoint folder
DPPO_COLUMNS = ("dppo_index", "dppo_batch")  # the sampler's keys in each row, removed before TRL generates
PADDING = (-1, -1)  # the sampler's key of a zero-weight micro-batch completing an optimizer step's window
# inputs whose second axis is the completion (trimmed with it)
COMPLETION_KEYS = ("completion_ids", "completion_mask", "old_per_token_logps", "ref_per_token_logps",
                   "sampling_per_token_logps", "importance_sampling_ratio", "tool_mask")


def dppo_fields(config: type = TrainConfig) -> list[tuple[str, type, dataclasses.Field]]:
    """(name, type, field) of every field `config` declares with trl=True (dppo.config._f): DPPOConfig's own fields,
    with TrainConfig's names, defaults, help and allowed values (the metadata HfArgumentParser hands to argparse)."""
    return [(f.name, FIELD_TYPES.get(f.type, f.type),
             field(default=f.default, metadata={k: v for k, v in f.metadata.items() if k in ("help", "choices")}))
            for f in dataclasses.fields(config) if f.metadata.get("trl")]


@dataclass
class DPPOConfig(GRPOConfig, dataclasses.make_dataclass("DPPOFields", dppo_fields())):
    """GRPOConfig plus DPPO's pruning fields: those TrainConfig declares with trl=True (`config.TRL_FIELDS`: the
    names, defaults, help and allowed values of dppo's TrainConfig; docs/reference.md), and pack_sequences."""
    pack_sequences: bool = field(default=True, metadata={"help": (
        "When pruning: score the rows of the old-policy, reference and training passes packed densely, position ids "
        "restarting per sequence (sdpa / eager: best-fit rows of <= pack_capacity tokens; flash-attn: one row), "
        "not padded to the widest; the same log-probs (docs/trl.md)")})

    def __post_init__(self):
        super().__post_init__()
        for name, _, declared in dppo_fields():
            choices = declared.metadata.get("choices")
            _check(choices is None or getattr(self, name) in choices, name, f"one of {list(choices or ())}",
                   getattr(self, name))
        _check(self.pack_capacity >= 1, "pack_capacity", "a positive number of tokens", self.pack_capacity)
        check_pruning_fields(self)
        if self.pruning:
            _check(self.loss_type in LOSS_AGG, "loss_type", f"one of {list(LOSS_AGG)} when pruning", self.loss_type)
            _check(self.entropy_coef == 0 and not self.use_adaptive_entropy, "entropy_coef", "0 (and "
                   "use_adaptive_entropy off) when pruning: TRL's entropy bonus is a token mean the row weights would "
                   "skew", self.entropy_coef)
        if self.prompt_prune_rate > 0:
            _check(self.loss_type != "bnpo", "loss_type", "grpo, dr_grpo, luspo or dapo with prompt_prune_rate > 0 "
                   "(bnpo divides by each micro-batch's tokens, unknown before the prompt masks; dapo is its "
                   "batch-wide token mean)", self.loss_type)
            _check(self.inclusion == "uniform", "inclusion", "uniform with prompt_prune_rate > 0 in TRL (the prompt "
                   "stage keeps an exact count, docs/trl.md)", self.inclusion)
        if self.pruning:
            _check(self.top_entropy_quantile == 1.0, "top_entropy_quantile", "1.0 when pruning: TRL picks the tokens "
                   "above the entropy quantile of the micro-batch it scores, which pruning changes",
                   self.top_entropy_quantile)
            acc = self.accelerator_config
            dispatch = acc.get("dispatch_batches") if isinstance(acc, dict) else getattr(acc, "dispatch_batches", None)
            _check(dispatch is not True, "accelerator_config.dispatch_batches", "False or None when pruning: each "
                   "process runs the prompt stage's sampler itself", dispatch)
        if self.prompt_prune_rate > 0 and (self.scale_rewards == "batch"
                                           or self.multi_objective_aggregation == "normalize_then_sum"):
            warnings.warn(f"scale_rewards={self.scale_rewards!r}, multi_objective_aggregation="
                          f"{self.multi_objective_aggregation!r}: TRL normalises by statistics of the rolled-out "
                          f"prompts, which the prompt stage changes, so the estimator is not exactly unbiased "
                          f"(docs/trl.md; scale_rewards 'group' or 'none' with sum_then_normalize is)", stacklevel=2)
        if self.pruning and self.inclusion == "proportional" and self.size_proxy in pruning.NEEDS_LOGPROBS:
            _check(self.use_vllm, "size_proxy", "adv or length without use_vllm (TRL returns the sampled tokens' "
                   "log-probs only from vLLM)", self.size_proxy)

    @property
    def pruning(self) -> bool:
        return self.prompt_prune_rate > 0 or self.completion_prune_rate > 0


def trl_row_coefficients(loss_type: str, row_tokens: torch.Tensor, grad_accum: int, n_processes: int,
                         steps_per_generation: int, max_completion_length: int, num_items: float) -> torch.Tensor:
    """a_r [n] float64: TRL's loss of one micro-batch of n rows is sum_r a_r sum_t l_{r,t} m_{r,t}
    (row_tokens [n] = sum_t m_{r,t}, the loss mask; GA = grad_accum; P processes, whose gradients DDP averages):

        grpo     a_r = 1 / (n max(|o_r|, 1) GA)          bnpo  a_r = 1 / (max(sum_r |o_r|, 1) GA)
        dr_grpo  a_r = 1 / (n L_max GA)                   dapo  a_r = P spg / (max(N, 1) GA)
        luspo    a_r = 1 / (n GA)

    with N the generation batch's loss tokens over all processes (TRL's num_items_in_batch) and spg
    steps_per_generation. Computed on the unpruned micro-batch, so fixed before the completion masks."""
    n, tok = row_tokens.numel(), row_tokens.to(torch.float64)
    if loss_type == "grpo":
        return 1.0 / (n * tok.clamp(min=1.0) * grad_accum)
    if loss_type == "bnpo":
        return torch.full((n,), 1.0 / (max(float(tok.sum()), 1.0) * grad_accum), dtype=torch.float64)
    if loss_type == "dr_grpo":
        return torch.full((n,), 1.0 / (n * max_completion_length * grad_accum), dtype=torch.float64)
    if loss_type == "luspo":
        return torch.full((n,), 1.0 / (n * grad_accum), dtype=torch.float64)
    if loss_type == "dapo":
        return torch.full((n,), n_processes * steps_per_generation / (max(num_items, 1.0) * grad_accum),
                          dtype=torch.float64)
    raise ValueError(f"loss_type must be one of {list(LOSS_AGG)} when pruning, got {loss_type!r}")


def normaliser_factors(agg: str, z: float, rolled_rows: int) -> tuple[float, float]:
    """How the step's normaliser Z enters TRL's loss, as (sequence scale, token count). Counting completions, TRL
    divides by the rolled rows B G and dppo by Z (|S| G, or B G when fixed), so each row is scaled by B G / Z; counting
    tokens, Z replaces TRL's token count (num_items_in_batch), and the token count is unused otherwise (0)."""
    if AGGREGATIONS[agg].counts_tokens:
        return 1.0, z
    return rolled_rows / z, 0.0


def trl_advantages(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor, group_size: int,
                   scale_rewards: str, aggregation: str) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPOTrainer's rewards and advantages of a generation batch, computed as TRL 1.16 computes them (in
    `_generate_and_score_completions`, after the log-prob passes; the completion stage needs them before, and
    `DPPOTrainer` checks its own against TRL's at every step). rewards_per_func [R, F] (NaN: no reward), weights [F]
    -> (rewards [R/G, G], NaN where every function returned None; advantages [R/G, G], 0 there):

        sum_then_normalize   r = sum_k w_k r_k;  A = (r - nanmean_group r) / (nanstd_{group | batch} r + 1e-4)
                             (scale_rewards none: no division)
        normalize_then_sum   r = sum_k w_k (r_k - nanmean_group r_k) / (nanstd_group r_k + 1e-4);
                             A = (r - nanmean_batch r) / (nanstd_batch r + 1e-4)"""
    G = group_size
    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    weights = reward_weights.to(rewards_per_func.device).unsqueeze(0)
    if aggregation == "sum_then_normalize":
        rewards = (rewards_per_func * weights).nansum(dim=1)
        rewards[unscorable] = torch.nan
        mean = torch.nanmean(rewards.view(-1, G), dim=1).repeat_interleave(G, dim=0)
        std = nanstd(rewards).expand_as(rewards) if scale_rewards == "batch" else \
            nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G, dim=0)
        adv = rewards - mean
        if scale_rewards != "none":
            adv = adv / (std + TRL_ADV_EPS)
    elif aggregation == "normalize_then_sum":
        grouped = rewards_per_func.view(-1, G, rewards_per_func.size(1))
        per_func = (grouped - torch.nanmean(grouped, dim=1, keepdim=True)) / (nanstd(grouped, dim=1, keepdim=True)
                                                                              + TRL_ADV_EPS)
        rewards = (per_func.view(-1, rewards_per_func.size(1)) * weights).nansum(dim=1)
        rewards[unscorable] = torch.nan
        adv = (rewards - torch.nanmean(rewards)) / (nanstd(rewards).expand_as(rewards) + TRL_ADV_EPS)
    else:
        raise ValueError(f"multi_objective_aggregation must be sum_then_normalize or normalize_then_sum, got "
                         f"{aggregation!r}")
    return rewards.view(-1, G), torch.nan_to_num(adv, nan=0.0).view(-1, G)


def mask_generator(seed: int, batch_no: int, stage: int) -> torch.Generator:
    """The masks of generation batch `batch_no` (stage 0: prompts, 1: completions): keyed by the batch alone
    (`dppo.seeding`), so every process and a resumed run draw the same masks."""
    return seeding.generator(seed, ("trl_prompt_masks", "trl_completion_masks")[stage], batch_no)


# ------------------------------------------------------------------ prompt stage: the sampler
@dataclass
class Composition:
    """One generation batch's prompt stage: the covered stretch [start, end) of pass `pass_no`'s order."""
    batch_no: int
    pass_no: int
    start: int
    end: int
    covered: list[int]  # [S] dataset indices
    keep: torch.Tensor  # [S] bool, exactly B True
    pi: torch.Tensor  # [S] float64
    est_lengths: torch.Tensor  # [S] float64: mean completion length at the last visit (Z of token-mean)

    @property
    def rolled(self) -> list[int]:
        return [k for k, kept in zip(self.covered, self.keep.tolist()) if kept]


class PruningSampler(Sampler):
    """TRL's RepeatSampler with DPPO's prompt stage. The prompt order is RepeatSampler's (one torch.randperm per
    pass from a generator seeded with `seed`, or the dataset order without shuffle), so with no candidate it yields
    exactly TRL's batches; with candidates each batch covers the shortest stretch of that order in which the
    fixed_count rule keeps exactly `batch_prompts` prompts, draws the mask and yields the kept prompts, each
    `group_size` times, the whole batch `repeat_count` times (TRL's reuse across steps_per_generation x
    num_iterations). Items are (dataset index, batch number) keys for `IndexedDataset`. A pass ends when its rest
    cannot fill a batch (TRL drops the incomplete last batch likewise). One iteration (one of transformers'
    epochs) is one pass when `one_pass_per_iter`; otherwise (`max_steps`: transformers' epochs have TRL's unpruned
    length, and pruned passes are shorter) it runs on through the passes, and transformers stops it at `max_steps`.
    Nothing iterates past `max_passes` passes.

    `position` is where the next batch starts. Each iteration starts at `start()`, where training stands (the
    trainer's last generated batch's end: the dataloader fetches a batch ahead, and a batch fetched at an epoch's end
    is composed again, not skipped); the trainer checkpoints that position and sets it back on resume.

    In that one-pass mode a pass ends where transformers steps: transformers steps the optimizer every `window`
    (gradient_accumulation_steps) micro-batches or at its planned, unpruned epoch end, and a pruned pass is shorter,
    so a pass that leaves a window part-full is followed by PADDING keys (zero-weight micro-batches, no generation:
    `DPPOTrainer._padding_step`) that complete it; the micro-batches in it already count as the window (TRL's
    normalisation of a last, partial window). Without them their gradient would wait, unapplied, for the next
    pass's first step, or be dropped after the last.

    A pass whose prompts cannot fill one batch with the prompt stage (the candidates' pruned share leaves fewer than
    `batch_prompts` of the whole pass) runs without it, pi_q = 1 (`unpruned_pass`, with a warning): nothing would
    roll out, the history would never change, and `max_steps` would wait for a batch forever. A dataset that cannot
    fill one batch even so (fewer prompts than a batch) yields nothing, with a warning, and the iteration ends — as
    TRL's RepeatSampler, whose run stops at step 0; with `max_steps` the passes would otherwise run on forever."""

    def __init__(self, size: int, batch_prompts: int, group_size: int, repeat_count: int, shuffle: bool, seed: int,
                 candidates, est_lengths, prompt_rate: float, max_passes: float, one_pass_per_iter: bool = True,
                 start=None, window: int = 1):
        self.size, self.batch_prompts, self.group_size, self.repeat_count = size, batch_prompts, group_size, repeat_count
        self.shuffle, self.seed, self.prompt_rate, self.max_passes = shuffle, seed, prompt_rate, max_passes
        self.candidates, self.est_lengths = candidates, est_lengths  # keys -> [n] bool / [n] float64 (history)
        self.one_pass_per_iter, self.start = one_pass_per_iter, start  # start: () -> (pass, position, batch number)
        self.window = window  # micro-batches an optimizer step accumulates
        self.pass_no, self.position, self.batch_no = 0, 0, 0
        self.unpruned_pass = -1  # the pass that runs without the prompt stage (class docstring), if any
        self.compositions: dict[int, Composition] = {}
        self._order: tuple[int, list[int]] | None = None

    def order(self, pass_no: int) -> list[int]:
        if self._order is None or self._order[0] != pass_no:
            if self.shuffle:
                gen = torch.Generator().manual_seed(self.seed)
                for _ in range(pass_no + 1):  # RepeatSampler draws one permutation per pass from one generator
                    perm = torch.randperm(self.size, generator=gen).tolist()
            else:
                perm = list(range(self.size))
            self._order = (pass_no, perm)
        return self._order[1]

    def compose(self) -> Composition | None:
        """The next batch of the current pass, or None when the pass cannot fill one."""
        order, start = self.order(self.pass_no), self.position
        rate = 0.0 if self.pass_no == self.unpruned_pass else self.prompt_rate
        flags: list[bool] = []
        n = None
        while n is None and start + len(flags) < self.size:  # read the stream in chunks of 4 B
            chunk = order[start + len(flags): start + len(flags) + 4 * self.batch_prompts]
            flags += self.candidates(chunk).tolist() if rate > 0 else [False] * len(chunk)
            n = exact_count_stretch(flags, rate, self.batch_prompts)
        if n is None and start == 0 and rate > 0:  # not one batch in the whole pass
            warnings.warn(f"DPPOTrainer: pass {self.pass_no} cannot fill one generation batch of {self.batch_prompts} "
                          f"prompts with prompt_prune_rate {rate} ({sum(flags)} of its {self.size} prompts are "
                          f"candidates): it runs without the prompt stage", stacklevel=2)
            self.unpruned_pass = self.pass_no
            return self.compose()
        if n is None:
            return None
        covered = order[start:start + n]
        cand = torch.tensor(flags[:n], dtype=torch.bool)
        keep, pi = pruning.draw_keep_mask(cand, rate, "fixed_count",
                                          mask_generator(self.seed, self.batch_no, 0))
        comp = Composition(self.batch_no, self.pass_no, start, start + n, covered, keep, pi,
                           torch.as_tensor(self.est_lengths(covered), dtype=torch.float64))
        self.position, self.batch_no = start + n, self.batch_no + 1
        return comp

    def __iter__(self):
        if self.start is not None:
            self.pass_no, self.position, self.batch_no = self.start()
        yielded = 0  # generation batches this iteration
        while self.pass_no < self.max_passes:
            at_start = self.position == 0
            comp = self.compose()
            if comp is None and at_start:  # a whole pass (without the prompt stage where it had one) cannot fill one
                warnings.warn(f"DPPOTrainer: the {self.size} training prompts cannot fill one generation batch of "
                              f"{self.batch_prompts} prompts: no batch to train on", stacklevel=2)  # as RepeatSampler
                return  # yields nothing: transformers stops at step 0 with its own line, as under GRPOTrainer
            if comp is None:  # this pass is done; an iteration that has yielded nothing goes on to the next one
                self.pass_no, self.position = self.pass_no + 1, 0
                if yielded and self.one_pass_per_iter:
                    short = -yielded * self.repeat_count % self.window  # micro-batches the last window lacks
                    yield from [PADDING] * (short * self.batch_prompts * self.group_size)
                    return
                continue
            self.compositions[comp.batch_no] = comp
            yielded += 1
            for _ in range(self.repeat_count):
                for key in comp.rolled:
                    for _ in range(self.group_size):
                        yield key, comp.batch_no

    def __len__(self) -> int:  # TRL's planned length (a pass with pruning yields fewer batches)
        return (self.size // self.batch_prompts) * self.batch_prompts * self.group_size * self.repeat_count

    def take(self, batch_no: int) -> Composition:
        """The composition of batch `batch_no` (compositions of earlier batches, fetched but never trained, go)."""
        for b in [b for b in self.compositions if b < batch_no]:
            del self.compositions[b]
        return self.compositions.pop(batch_no)


class IndexedDataset(Dataset):
    """The train dataset read by (index, batch number) keys: each row gains `dppo_index` and `dppo_batch`."""

    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, key):
        index, batch_no = key
        return {**self.data[max(index, 0)], "dppo_index": index, "dppo_batch": batch_no}  # PADDING: any row


def is_padding(batch) -> bool:
    """Whether a dataloader batch (a list of rows) is the sampler's window padding."""
    return isinstance(batch, list) and bool(batch) and batch[0].get("dppo_batch") == PADDING[1]


# ------------------------------------------------------------------ the trainer
@dataclass
class _Generation:
    """What one generation batch's stages decide, kept between TRL's calls."""
    inputs: list  # the rows, without DPPO_COLUMNS
    comp: Composition
    indices: list[int]  # [n_local] each row's dataset index
    rewards_per_func: torch.Tensor | None = None  # [R, F] gathered, computed before the log-prob passes
    rewards: torch.Tensor | None = None  # [B, G]
    lengths: torch.Tensor | None = None  # [B, G] loss tokens per completion
    advantages: torch.Tensor | None = None  # [R] TRL's, gathered, as the completion stage computed them
    completion: pruning.Selection | None = None  # [B, G]
    local_keep: torch.Tensor | None = None  # [n_local] bool, this process's rows


# Every method of TRL's GRPOTrainer (or of transformers' Trainer under it) that DPPOTrainer overrides: the parameters
# TRL's own takes in TESTED_TRL (tests/test_trl.py checks them against the installed TRL, and that no override is
# missing here) and what the override borrows it for. Each hands over to TRL's when no rate is set. docs/trl.md lists
# them.
OVERRIDDEN: dict[str, tuple[tuple[str, ...], str]] = {
    "__init__": (
        ("model", "reward_funcs", "args", "train_dataset", "eval_dataset", "processing_class",
         "reward_processing_classes", "callbacks", "optimizers", "quantization_config", "peft_config", "tools",
         "rollout_func", "environment_factory"),
        "the pruner, the prompt history and the pruning log beside TRL's state"),
    "train": (
        ("resume_from_checkpoint", "trial", "ignore_keys_for_eval"),
        "ignore_data_skip: the sampler restores its own position (transformers would skip batches by TRL's unpruned "
        "pass length)"),
    "get_train_dataloader": (
        (),
        "the dataset indexed (each row carries its dataset index, the history's key)"),
    "get_batch_samples": (
        ("epoch_iterator", "num_batches", "device"),
        "counts an optimizer step's real (not padding) micro-batches"),
    "training_step": (
        ("model", "inputs", "num_items_in_batch"),
        "a pruned pass's last window completed with zero-weight padding steps, normalised by its real micro-batches"),
    "_set_signature_columns_if_needed": (
        (),
        "keeps dppo's columns (dataset index, sampler batch) through TRL's column removal"),
    "_get_train_sampler": (
        ("dataset",),
        "the prompt stage: PruningSampler composes each generation batch from the history"),
    "_prepare_inputs": (
        ("generation_batch",),
        "a padding batch reuses the last generation batch, every row at weight 0"),
    "_generate_and_score_completions": (
        ("inputs",),
        "hands the sampler's composition to _generate; then each kept row's weight and the step's normaliser carried "
        "in TRL's output, the batch recorded in the history (_complete_generation_batch)"),
    "_generate": (
        ("prompts",),
        "the completion stage, right after generation and before the log-prob passes: rewards and full-group "
        "advantages computed there (TRL's private 8-tuple read by its names: TRLGeneration)"),
    "_calculate_rewards": (
        ("inputs", "prompts", "completions", "completion_ids_list"),
        "the rewards _generate already computed"),
    "_get_per_token_logps_and_entropies": (
        ("model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy", "compute_aux_loss",
         "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
         "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids"),
        "the old-policy, reference and update passes score kept rows only, packed (pack_sequences)"),
    "_compute_loss": (
        ("model", "inputs"),
        "TRL's per-token loss, each kept row's scaled by c_r (in WEIGHT_SLOT, tool_mask; aggregated by the dapo "
        "branch, aggregated_by_dapo, over a num_items_in_batch set to match, set_dapo_divisor)"),
    "_save_checkpoint": (
        ("model", "trial"),
        "dppo_state.json (history, pruner, sampler position) inside TRL's checkpoint"),
    "_load_optimizer_and_scheduler": (
        ("checkpoint",),
        "dppo_state.json read back on resume"),
}


class DPPOTrainer(GRPOTrainer):
    """GRPOTrainer with DPPO's prompt and completion pruning (module docstring; docs/trl.md).

    `pruning_log` holds one entry per generation batch, the last PRUNING_LOG_LENGTH (covered prompts, masks,
    inclusion probabilities); `scored_rows` counts the kept rows each pass scored ("old_policy", "reference",
    "update"; rows that only pad a process to the others' count are not counted), `scored_positions` the token slots
    the model processed for them (rows x width, packed or padded)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.args, DPPOConfig):
            raise ConfigError(f"DPPOTrainer needs args=DPPOConfig(...) (from dppo.trl import DPPOConfig), got "
                              f"{type(self.args).__name__}")
        self.pruning = self.args.pruning
        if self.pruning and not hasattr(self.train_dataset, "__len__"):
            raise ConfigError("DPPOTrainer: train_dataset must be a map-style dataset (a datasets.Dataset, not an "
                              "IterableDataset) when pruning: the prompt stage keys its history by the dataset index")
        a = self.args
        # DPPOConfig names DPPO's settings as TrainConfig does; kl_coef is TRL's beta, the aggregation its loss_type's
        # (only read when pruning, which DPPOConfig allows for LOSS_AGG's loss types only)
        settings = {name: getattr(a, name) for name in PRUNER_FIELDS["dppo"]}
        self.pruner = pruning.DPPO(**settings, kl_coef=self.beta,
                                   loss_agg=LOSS_AGG[self.loss_type] if self.pruning else "token-mean")
        self.prompt_history = PromptHistory()
        self.pruning_log: deque[dict] = deque(maxlen=PRUNING_LOG_LENGTH)  # the last generation batches'
        self.scored_rows: dict[str, int] = defaultdict(int)
        self.scored_positions: dict[str, int] = defaultdict(int)
        self._sampler: PruningSampler | None = None
        self._generation: _Generation | None = None
        self._trained = (0, 0, 0)  # (pass, position, batch number) where the next untrained batch starts
        self._unpruned_pass = -1  # restored from a checkpoint: PruningSampler.unpruned_pass
        self._window_micro_batches = 0  # the current optimizer step's micro-batches, its padding not counted
        self._generation_start = (0, 0, 0)  # ... and where the last generated batch started
        self._before_generation = ({}, self.pruner.state_dict())  # its prompts' records and the pruner before it

    # ---- data: the prompt stage lives in the sampler
    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        if self.pruning:
            self._signature_columns = [*self._signature_columns, *DPPO_COLUMNS]

    def get_train_dataloader(self):
        if not self.pruning:
            return super().get_train_dataloader()
        return self._get_dataloader(dataset=IndexedDataset(self.train_dataset), description="Training",
                                    batch_size=self._train_batch_size * self.args.steps_per_generation,
                                    sampler_fn=self._get_train_sampler, is_training=True)

    def _get_train_sampler(self, dataset=None):
        if not self.pruning:
            return super()._get_train_sampler(dataset)
        a = self.args
        by_steps = a.max_steps > 0  # max_steps: passes unbounded, transformers stops at max_steps
        self._sampler = PruningSampler(
            len(self.train_dataset), a.generation_batch_size // self.num_generations, self.num_generations,
            self.num_iterations * a.steps_per_generation, self.shuffle_dataset, a.seed,
            candidates=lambda keys: self.pruner.prompt_candidates(keys, self.prompt_history),
            est_lengths=lambda keys: self.prompt_history.estimated_lengths(keys, float(a.max_completion_length)),
            prompt_rate=a.prompt_prune_rate, max_passes=math.inf if by_steps else math.ceil(a.num_train_epochs),
            one_pass_per_iter=not by_steps, start=lambda: self._trained, window=a.gradient_accumulation_steps)
        self._sampler.pass_no, self._sampler.position, self._sampler.batch_no = self._trained
        self._sampler.unpruned_pass = self._unpruned_pass
        return self._sampler

    def train(self, *args, **kwargs):
        if self.pruning:  # the sampler restores its own position from the checkpoint (dppo_state.json): transformers
            self.args.ignore_data_skip = True  # must not skip batches counted by TRL's unpruned pass length
        return super().train(*args, **kwargs)

    # ---- optimizer-step windows: a pruned pass ends on a step (PruningSampler pads its last window)
    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batches, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
        self._window_micro_batches = sum(not is_padding(b) for b in batches)
        return batches, num_items

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.pruning and is_padding(inputs):
            return self._padding_step(model, inputs, num_items_in_batch)
        if self.pruning and self._window_micro_batches:  # a window completed by padding is normalised by its own
            self.current_gradient_accumulation_steps = self._window_micro_batches  # micro-batches, as TRL's last
        return super().training_step(model, inputs, num_items_in_batch)

    def _padding_step(self, model, inputs, num_items_in_batch):
        """A micro-batch that completes a window with a zero gradient: one zero-weight row of the last generation
        batch, forward and backward (every process runs the same calls), so that transformers steps the optimizer.
        It generates nothing, leaves TRL's step counter (its generation schedule) where it was, and logs nothing."""
        step, logged = self._step, {k: len(v) for k, v in self._metrics["train"].items()}
        positions = dict(self.scored_positions)
        try:
            return super().training_step(model, inputs, num_items_in_batch)
        finally:
            self._step = step
            for k in list(self._metrics["train"]):
                if k in logged:
                    del self._metrics["train"][k][logged[k]:]
                else:
                    del self._metrics["train"][k]
            self.scored_positions.clear()
            self.scored_positions.update(positions)

    def _prepare_inputs(self, generation_batch):
        if self.pruning and self.model.training and is_padding(generation_batch):
            last = self._buffered_inputs[0]
            return {**last, ROW_WEIGHT: torch.zeros_like(last[ROW_WEIGHT])}
        return super()._prepare_inputs(generation_batch)

    # ---- completion stage: rewards before the log-prob passes
    def _generate_and_score_completions(self, inputs):
        if not (self.pruning and self.model.training):
            return super()._generate_and_score_completions(inputs)
        if "image" in inputs[0] or "images" in inputs[0]:
            raise ConfigError("DPPOTrainer: pruning does not support image inputs yet (their tensors are indexed by "
                              "image, not by row); set prompt_prune_rate and completion_prune_rate to 0")
        batch_nos = {x["dppo_batch"] for x in inputs}
        if len(batch_nos) != 1:
            raise RuntimeError(f"DPPOTrainer: a generation batch mixes sampler batches {sorted(batch_nos)}")
        indices = [x["dppo_index"] for x in inputs]
        inputs = [{k: v for k, v in x.items() if k not in DPPO_COLUMNS} for x in inputs]  # rewards and environments
        self._generation = _Generation(inputs, self._sampler.take(batch_nos.pop()), indices)  # see the user's columns
        try:
            output = super()._generate_and_score_completions(inputs)
            return self._complete_generation_batch(output, self._generation)
        finally:
            self._generation = None

    def _generate(self, prompts):
        result = super()._generate(prompts)
        gen = self._generation
        if gen is None or not self.model.training:
            return result
        generated = trl_generation(result)
        completion_ids = generated.completion_ids
        for i, row in enumerate(gen.inputs):  # as GRPOTrainer merges rollout_func's extra fields before rewards
            for key, values in generated.extra_fields.items():
                if not isinstance(values, list):
                    row[key] = values
                elif i < len(values):
                    row[key] = values[i]
        gen.rewards_per_func = super()._calculate_rewards(gen.inputs, prompts, generated.completions, completion_ids)
        G = self.num_generations
        rewards, adv = trl_advantages(gen.rewards_per_func, self.reward_weights, G, self.scale_rewards,
                                      self.args.multi_objective_aggregation)  # full groups, before any pruning
        gen.advantages = adv.reshape(-1)
        # a row no reward function scored (NaN) counts as its group's mean: it neither breaks nor makes zero variance
        rewards = rewards.double().cpu()
        gen.rewards = torch.where(rewards.isnan(), rewards.nanmean(dim=1, keepdim=True), rewards).nan_to_num()
        adv = adv.double().cpu()
        gen.lengths = self.accelerator.gather(self._loss_tokens(completion_ids, generated.tool_mask)).cpu().view(-1, G)
        logit_grad = None  # the proportional rule's logit proxies (docs/method.md §2.10): vLLM's sampled log-probs
        if self.pruner.inclusion == "proportional" and self.pruner.size_proxy in pruning.NEEDS_LOGPROBS:
            local = pruning.logit_grad_sizes([torch.tensor([0.0 if x is None else x for x in lp], dtype=torch.float64)
                                              for lp in generated.logprobs], 1).view(-1, 2)
            logit_grad = self.accelerator.gather(local.to(self.accelerator.device)).cpu().view(-1, G, 2)
        gen.completion = self.pruner.select_completions(gen.rewards, adv, mask_generator(self.args.seed,
                                                        gen.comp.batch_no, 1), gen.lengths, logit_grad)
        gen.local_keep = self._local_rows(gen.completion.keep, len(prompts)).to(self.accelerator.device)
        return result

    def _loss_tokens(self, completion_ids: list, tool_mask: list | None) -> torch.Tensor:
        """[n] loss tokens of each local completion, as TRL's loss mask counts them (tool tokens and, with
        mask_truncated_completions, truncated completions excluded)."""
        counts = [sum(m) for m in tool_mask] if tool_mask is not None else [len(ids) for ids in completion_ids]
        if self.mask_truncated_completions:
            ends = [*self.eos_token_ids, self._tokenizer.pad_token_id]
            counts = [c if ids and ids[-1] in ends else 0 for c, ids in zip(counts, completion_ids)]
        return torch.tensor(counts, dtype=torch.long, device=self.accelerator.device)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        gen = self._generation
        if gen is not None and gen.rewards_per_func is not None:  # already computed in _generate
            return gen.rewards_per_func
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, compute_aux_loss=False, **kwargs):
        """When pruning: no-grad passes of a pruned generation batch (old policy, reference) score the kept rows
        only (pruned rows get NaN, never read: the loss drops them, and TRL's vLLM IS ratio maps NaN to 1), and every
        pass, the update's too, goes through `_score` (packed with `pack_sequences`)."""
        if not self.pruning:
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                              batch_size, compute_entropy, compute_aux_loss, **kwargs)
        gen = self._generation
        phase = "update" if torch.is_grad_enabled() else None if gen is None else \
            "reference" if model is self.ref_model else "old_policy"
        score = functools.partial(self._score, model, batch_size=batch_size, compute_entropy=compute_entropy,
                                  compute_aux_loss=compute_aux_loss, phase=phase)
        if phase in (None, "update") or gen.local_keep is None or any(v is not None for v in kwargs.values()) or \
                input_ids.size(0) != gen.local_keep.numel():
            if phase not in (None, "update"):
                self.scored_rows[phase] += input_ids.size(0)
            return score(input_ids, attention_mask, logits_to_keep, **kwargs)
        rows = self._rows_in_step(gen.local_keep)
        prompt_width = input_ids.size(1) - logits_to_keep
        width = _completion_width(attention_mask[rows, prompt_width:])
        self.scored_rows[phase] += int(gen.local_keep.sum())
        cols = slice(0, prompt_width + width)
        logps, entropies, aux = score(input_ids[rows, cols], attention_mask[rows, cols], width)
        full = logps.new_zeros(input_ids.size(0), logits_to_keep)
        full[rows, :width] = logps
        full[~gen.local_keep] = float("nan")
        if entropies is not None:
            ent = entropies.new_zeros(input_ids.size(0), logits_to_keep)
            ent[rows, :width] = entropies
            entropies = ent
        return full, entropies, aux

    def _score(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
               compute_aux_loss=False, phase=None, **kwargs):
        """TRL's log-prob pass over padded rows, or with `pack_sequences` (text only, no MoE aux loss) the same
        log-probs and entropies from the rows packed densely (`dppo.packing.pack_padded`: position ids restarting
        per sequence, no attention mask; docs/method.md §3.2), scattered back to TRL's [n, logits_to_keep]
        layout. Counts the token slots the model processed in `scored_positions[phase]`."""
        if not self.args.pack_sequences or compute_aux_loss or any(v is not None for v in kwargs.values()):
            if phase is not None:
                self.scored_positions[phase] += input_ids.numel()
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                              batch_size, compute_entropy, compute_aux_loss, **kwargs)
        rows, _ = packing.packed_rows(self.accelerator.unwrap_model(model))
        tokens = (batch_size or input_ids.size(0)) * input_ids.size(1)  # what one of TRL's forwards holds
        # a varlen kernel takes one row a forward: rows of at most TRL's tokens, one a call; else packed rows
        capacity = tokens if rows == packing.ONE_ROW else max(self.args.pack_capacity, input_ids.size(1))
        ids, pos, slot = packing.pack_padded(input_ids, attention_mask, capacity, rows,
                                             self._tokenizer.pad_token_id or 0)
        if phase is not None:
            self.scored_positions[phase] += ids.numel()
        target = slot[:, input_ids.size(1) - logits_to_keep:]  # [n, K] packed slot of each completion token
        scored = target >= 0
        labels = torch.full_like(ids, -100).view(-1)
        labels[target[scored]] = ids.view(-1)[target[scored]]  # only completion tokens are scored, as TRL
        labels = labels.view(ids.shape)
        logps, entropies = [], []
        chunk = 1 if rows == packing.ONE_ROW else max(1, tokens // ids.size(1))  # rows a forward: TRL's tokens
        for start in range(0, self._forward_calls(ids.size(0), chunk) * chunk, chunk):
            if start >= ids.size(0):  # this process is done, another is not: a one-token call, its result unused
                with self.accelerator.autocast():  # (kept in the graph at weight 0 for the backward's sake)
                    out = model(input_ids=ids[:1, :1], position_ids=pos[:1, :1], labels=labels[:1, :1],
                                fused_lm_head=True)
                logps[0] = logps[0] + 0.0 * out.log_probs.sum()
                continue
            with self.accelerator.autocast():
                out = model(input_ids=ids[start:start + chunk], position_ids=pos[start:start + chunk],
                            labels=labels[start:start + chunk], fused_lm_head=True)
            logps.append(torch.nn.functional.pad(out.log_probs, (1, 0)))  # column c: the log-prob of token c
            if compute_entropy:
                entropies.append(torch.nn.functional.pad(out.entropy, (1, 0)))

        def unpack(values: list[torch.Tensor]) -> torch.Tensor:  # [R, W] -> [n, K], 0 at padding
            flat = torch.cat(values).reshape(-1)
            return flat.new_zeros(target.shape).index_put(scored.nonzero(as_tuple=True), flat[target[scored]])
        return unpack(logps), unpack(entropies) if compute_entropy else None, None

    def _forward_calls(self, rows: int, chunk: int) -> int:
        """The model calls of a packed pass: the most any process needs. The packed row count depends on each
        process's lengths, while under ZeRO-3 / FSDP every forward gathers parameters from all processes, so every
        process must make the same calls (the ones with fewer make one-token calls)."""
        calls = torch.tensor([math.ceil(rows / chunk)], device=self.accelerator.device)
        if self.accelerator.num_processes > 1:
            torch.distributed.all_reduce(calls, op=torch.distributed.ReduceOp.MAX)
        return int(calls)

    # ---- after TRL's scoring: weights and normaliser to the loss, the batch to the history
    def _complete_generation_batch(self, output: dict, gen: _Generation) -> dict:
        """After TRL scored a pruned generation batch: its advantages and group order checked against the completion
        stage's, each local row's weight w_r and the step's normaliser Z carried to the loss, TRL's sampling-ratio
        metrics recounted over the kept rows, the batch recorded (history, pruner, resume position) and logged."""
        self._check_trl_advantages(output, gen)
        self._check_group_order(gen)
        weight = self._row_weights(gen)
        z = self._loss_normaliser(gen)
        local_weight = self._local_rows(weight, output["advantages"].numel()).to(output["advantages"].device)
        carry_in_batch(output, local_weight, *normaliser_factors(LOSS_AGG[self.loss_type], z, weight.numel()))
        if "importance_sampling_ratio" in output:
            self._kept_sampling_ratio_metrics(output, gen.local_keep)
        self._remember_state_before(gen.comp)
        self._record_history(gen)
        self._update_pruner(gen)
        self._advance_position(gen.comp)
        self._log_pruning(gen, weight, z)
        return output

    def _check_trl_advantages(self, output: dict, gen: _Generation) -> None:
        """Raises unless TRL's advantages of the batch (gathered) are the completion stage's, bit for bit."""
        trl_adv = self.accelerator.gather(output["advantages"])
        if not torch.equal(trl_adv, gen.advantages.to(trl_adv.device)):
            raise RuntimeError(f"DPPOTrainer: TRL {trl.__version__} computed other advantages than dppo.trl."
                               f"trl_advantages (the completion stage's); tested with TRL {TESTED_TRL[0]}.x")

    def _check_group_order(self, gen: _Generation) -> None:
        """Raises unless the batch's groups (every process's rows, gathered) are the sampler's prompts in order."""
        indices = self.accelerator.gather(torch.tensor(gen.indices, device=self.accelerator.device))
        if indices.view(-1, self.num_generations)[:, 0].tolist() != gen.comp.rolled:
            raise RuntimeError("DPPOTrainer: the generation batch's groups are not the sampler's prompts in order")

    @staticmethod
    def _row_weights(gen: _Generation) -> torch.Tensor:
        """[B, G] w_r = 1/(pi_q pi_o) where kept, 0 where pruned (pi_o = 0: an exact zero of the proportional rule)."""
        comp, sel = gen.comp, gen.completion
        return torch.where(sel.keep, pruning.importance_weights(comp.pi[comp.keep], sel.pi), 0.0)

    def _local_rows(self, gathered: torch.Tensor, n: int) -> torch.Tensor:
        """This process's n rows of a tensor over every process's rows (in process order)."""
        start = self.accelerator.process_index * n
        return gathered.reshape(-1)[start:start + n]

    def _loss_normaliser(self, gen: _Generation) -> float:
        """Z, the unbiased normaliser of the step's loss (docs/method.md §2.6): rows or tokens of the covered batch
        (`loss_normaliser` covered) or of the rolled-out one (fixed)."""
        comp = gen.comp
        return pruning.unbiased_normaliser(LOSS_AGG[self.loss_type], comp.pi, comp.keep, gen.lengths.double(),
                                           comp.est_lengths, self.args.loss_normaliser,
                                           prompts_per_step=len(comp.rolled))

    def _remember_state_before(self, comp: Composition) -> None:
        """The rolled prompts' history records and the pruner's state before this batch updates them: what a checkpoint
        in the middle of the batch saves (`_save_checkpoint`)."""
        self._before_generation = ({k: copy.copy(self.prompt_history.get(k)) for k in comp.rolled},
                                   self.pruner.state_dict())

    def _record_history(self, gen: _Generation) -> None:
        """Every rolled-out group's rewards, |A| and loss tokens into the prompt history, in the sampler's order."""
        adv = gen.advantages.double().cpu().view(-1, self.num_generations)
        for j, key in enumerate(gen.comp.rolled):
            self.prompt_history.update(key, gen.rewards[j].tolist(), adv[j].abs().tolist(), gen.lengths[j].tolist(),
                                       step=gen.comp.batch_no)

    def _update_pruner(self, gen: _Generation) -> None:
        """The pruner's step update with TRL's last logged KL (its estimate of the KL term), when beta > 0."""
        if self.beta != 0.0 and self._metrics["train"].get("kl"):
            self.pruner.after_step(gen.rewards, 0, {"kl": self._metrics["train"]["kl"][-1]})

    def _advance_position(self, comp: Composition) -> None:
        """Where a checkpoint resumes the sampler: past this batch once it is trained, at its start while it is not."""
        self._trained = (comp.pass_no, comp.end, comp.batch_no + 1)
        self._generation_start = (comp.pass_no, comp.start, comp.batch_no)

    def _log_pruning(self, gen: _Generation, weight: torch.Tensor, z: float) -> None:
        """The batch's dppo/* metrics and its `pruning_log` entry (covered prompts, masks, probabilities, Z)."""
        comp, sel = gen.comp, gen.completion
        metrics = self._metrics["train"]
        metrics["dppo/prompts_covered"].append(len(comp.covered))
        metrics["dppo/prompts_pruned"].append(len(comp.covered) - len(comp.rolled))
        metrics["dppo/completions_kept_frac"].append(int(sel.keep.sum()) / sel.keep.numel())
        metrics["dppo/weight_max"].append(float(weight.max()))
        self.pruning_log.append({"batch": comp.batch_no, "pass": comp.pass_no, "covered": comp.covered,
                                 "prompt_keep": comp.keep.tolist(), "prompt_pi": comp.pi.tolist(),
                                 "completion_keep": sel.keep.tolist(), "completion_pi": sel.pi.tolist(),
                                 "normaliser": z})

    def _kept_sampling_ratio_metrics(self, output: dict, keep: torch.Tensor) -> None:
        """TRL's logged sampling/importance_sampling_ratio/{min,mean,max} of this generation batch recomputed over the
        kept rows (keep [n] bool): TRL's count every pruned row at exactly 1 (its old-policy log-probs were never
        computed). Reduced across processes as TRL does (min of minima, mean of means, max of maxima)."""
        ratio = output["importance_sampling_ratio"]  # [n, T] per token, [n, 1] per sequence
        mask = trl_loss_mask(output)
        if self.vllm_importance_sampling_mode in ("sequence_mask", "sequence_truncate"):
            kept = ratio[keep].flatten()
        else:
            kept = ratio[mask.bool() & keep[:, None]]
        local = torch.stack([kept.min(), kept.mean(), kept.max()]) if kept.numel() else \
            torch.full((3,), float("nan"), device=ratio.device)
        stats = self.accelerator.gather(local.float()).view(-1, 3)
        for j, (name, reduce) in enumerate((("min", nanmin), ("mean", torch.nanmean), ("max", nanmax))):
            self._metrics["train"][f"sampling/importance_sampling_ratio/{name}"][-1] = reduce(stats[:, j]).item()

    # ---- the update: TRL's loss with each kept row's per-token loss weighted
    def _compute_loss(self, model, inputs):
        if ROW_WEIGHT not in inputs:
            return super()._compute_loss(model, inputs)
        inputs, weight, seq_scale, num_items = take_from_batch(inputs)
        tokens = trl_loss_mask(inputs).sum(-1)
        coef = self._row_coefficients(tokens, num_items).to(weight.device) * weight.double() * seq_scale  # a_r w_r
        rows = self._rows_in_step(weight > 0)
        sub = _zero_unscored_logps(_select_rows(inputs, rows, weight.numel()))
        self._weigh_rows(sub, coef[rows], tokens[rows].double(), next(model.parameters()).dtype)
        self.scored_rows["update"] += int((weight > 0).sum())
        with aggregated_by_dapo(self):
            return super()._compute_loss(model, sub)

    def _row_coefficients(self, tokens: torch.Tensor, num_items: float) -> torch.Tensor:
        """a_r [n] float64 of the micro-batch's rows (tokens [n]: each row's loss tokens) in TRL's loss of the unpruned
        batch, for the user's loss_type (`trl_row_coefficients`)."""
        return trl_row_coefficients(self.loss_type, tokens.cpu(), self.current_gradient_accumulation_steps,
                                    self.accelerator.num_processes, self.args.steps_per_generation,
                                    self.max_completion_length, num_items)

    def _weigh_rows(self, sub: dict, coef: torch.Tensor, tokens: torch.Tensor, model_dtype: torch.dtype) -> None:
        """Sets the micro-batch up so that TRL's dapo branch computes sum_r c_r sum_t l m (coef [n]: c_r; tokens [n]:
        each row's loss tokens): c_r s rides in the loss mask, and the dapo divisor is set to s (`dapo_slot_scale`)."""
        P, spg = self.accelerator.num_processes, self.args.steps_per_generation
        GA = self.current_gradient_accumulation_steps
        s = dapo_slot_scale(coef, tokens, P, spg, GA)
        dtype = torch.float64 if model_dtype == torch.float64 else torch.float32
        put_row_scale(sub, coef * s, dtype)
        set_dapo_divisor(sub, s, P, spg, GA, dtype)

    def _rows_in_step(self, keep: torch.Tensor) -> torch.Tensor:
        """The kept rows of this process's batch, padded with pruned (zero-weight) rows to the largest kept count of
        any process (at least 1): every process then runs the same forward calls (FSDP, DeepSpeed) and hands TRL's
        loss the same row count (its metrics gather per-row tensors across processes)."""
        rows = keep.nonzero().flatten()
        target = torch.tensor([max(rows.numel(), 1)], device=keep.device)
        if self.accelerator.num_processes > 1:
            torch.distributed.all_reduce(target, op=torch.distributed.ReduceOp.MAX)
        return torch.cat([rows, (~keep).nonzero().flatten()[:int(target) - rows.numel()]])

    # ---- checkpoints: the history and the sampler's position travel with TRL's
    def _save_checkpoint(self, model, trial):
        """dppo_state.json first, then TRL's checkpoint, so that a pushed checkpoint (push_to_hub) holds it."""
        if self.pruning and self.args.should_save:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
            folder = os.path.join(self._get_output_dir(trial=trial),
                                  f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            generate_every = self.args.steps_per_generation * self.num_iterations
            done = self._step % generate_every == 0  # the last generation batch fully trained on
            position = self._trained if done else self._generation_start
            history, pruner_state = self.prompt_history.state_dict(), self.pruner.state_dict()
            if not done:  # the resumed run generates the batch in progress again: the state it was composed from
                records, pruner_state = self._before_generation
                for key, rec in records.items():
                    if rec is None:
                        history.pop(str(key), None)
                    else:
                        history[str(key)] = asdict(rec)
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, STATE_FILE), "w") as f:
                json.dump({"history": history, "pruner": pruner_state, "position": list(position),
                           "unpruned_pass": self._sampler.unpruned_pass if self._sampler else -1}, f)
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        path = os.path.join(checkpoint, STATE_FILE) if checkpoint else None
        if not (self.pruning and path and os.path.exists(path)):
            return
        with open(path) as f:
            state = json.load(f)
        self.prompt_history.load_state_dict(state["history"])
        self.pruner.load_state_dict(state["pruner"])
        self._trained = tuple(state["position"])  # the sampler's next iteration starts there
        self._unpruned_pass = state.get("unpruned_pass", -1)
        if self._sampler is not None:  # built before the checkpoint is read
            self._sampler.unpruned_pass = self._unpruned_pass


def _completion_width(completion_mask: torch.Tensor) -> int:
    """Columns the rows' right-padded completions use (at least 1). Trimming the rest changes nothing before it
    (causal attention); the left-padded prompts keep TRL's width, so every token keeps TRL's position."""
    used = completion_mask.any(0).nonzero()
    return int(used[-1]) + 1 if used.numel() else 1


def _zero_unscored_logps(inputs: dict) -> dict:
    """The micro-batch with NaN old-policy and reference log-probs as 0: the pruned rows that pad a process to the
    others' row count were never scored, and their zero-weight loss must stay finite."""
    for k in ("old_per_token_logps", "ref_per_token_logps"):
        if inputs.get(k) is not None:
            inputs[k] = torch.nan_to_num(inputs[k], nan=0.0)
    return inputs


def _select_rows(inputs: dict, rows: torch.Tensor, n: int) -> dict:
    """The micro-batch restricted to `rows`, with the completion columns none of them uses trimmed."""
    out = {k: (v[rows] if isinstance(v, torch.Tensor) and v.ndim >= 1 and v.size(0) == n else v)
           for k, v in inputs.items()}
    width_c, width = out["completion_ids"].size(1), _completion_width(out["completion_mask"])
    for k in COMPLETION_KEYS:
        v = out.get(k)
        if isinstance(v, torch.Tensor) and v.ndim == 2 and v.size(1) == width_c:
            out[k] = v[:, :width]
    return out
