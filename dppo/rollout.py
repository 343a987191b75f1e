"""Rollout: prompts -> G sampled completions each, with their sampling log-probs.

The trainer talks only to `RolloutEngine`; the transformers backend below (`sample_compacting`, a KV-cached
sampling loop that prefills each prompt once and drops finished rows, docs/method.md §3.4) samples from the
training model itself (so weight sync is a no-op); `dppo.vllm_rollout` implements the same two methods on
vLLM, with the weights pushed after every optimizer step.

Sampling log-probs (returned when `SamplingParams.logprobs`) are those of the tempered, untruncated
distribution, `log softmax(logits / temperature)[token]`, exactly what `scoring.completion_logprobs`
recomputes; only the sampled token's value is kept, never a step's full-vocabulary logits.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from functools import partial
from typing import Protocol, Sequence

import torch
from transformers.cache_utils import DynamicLayer

from dppo.distributed import full_state_items, is_sharded, unshard
from dppo.scoring import COMPUTE_DTYPES, at_least_fp32, model_device


@dataclass
class SamplingParams:
    n: int = 8  # completions per prompt (G)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 96
    logprobs: bool = False  # return the sampled tokens' log-probs (RolloutBatch.logprobs; None otherwise)


@dataclass
class RolloutBatch:
    """Row r = completion r % n of prompt r // n (rows are grouped by prompt)."""
    prompt_ids: list[list[int]]  # [N] prompt token ids (repeated for each completion)
    completion_ids: list[list[int]]  # [N] generated ids, EOS included when emitted
    logprobs: list[torch.Tensor | None]  # [N] each [len(completion)] sampling log-probs, or None if not asked
    texts: list[str]  # [N] decoded completions
    truncated: list[bool]  # [N] hit max_new_tokens without EOS

    FIELDS = ("prompt_ids", "completion_ids", "logprobs", "texts", "truncated")

    @classmethod
    def concat(cls, batches: list["RolloutBatch"]) -> "RolloutBatch":
        """The rows of several batches, in order (rollout rounds of one step, or ranks' shards)."""
        return cls(*([x for b in batches for x in getattr(b, f)] for f in cls.FIELDS))

    @property
    def num_tokens(self) -> int:
        return sum(len(c) for c in self.completion_ids)


class RolloutEngine(Protocol):
    def generate(self, prompts: list[str], params: SamplingParams) -> RolloutBatch: ...

    def sync_weights(self, model: torch.nn.Module) -> None: ...

    def sleep(self) -> None:
        """Give the device memory back until the next `generate` (the trainer calls it once per step, before the
        update, and after an evaluation): vLLM on CUDA offloads its weights and frees its KV cache; a no-op else."""


def gather_rollouts(parts: list[RolloutBatch], group_size: int) -> RolloutBatch:
    """The rollouts of every rank (each a `shard` of the rolled prompts, G rows per prompt) as one batch in the
    global prompt order."""
    groups = []
    for b in parts:  # each rank's batch as a list of its prompts' row groups
        groups.append([RolloutBatch(*(getattr(b, f)[j: j + group_size] for f in RolloutBatch.FIELDS))
                       for j in range(0, len(b.completion_ids), group_size)])
    return RolloutBatch.concat(unshard(groups))


def filter_logits(logp: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """[n, V] tempered log-probs -> the same with tokens outside the top-k, then outside the top-p nucleus (the
    smallest set of most likely tokens whose mass reaches top_p, renormalised after top-k), set to -inf. The order
    and the rule are transformers' TopK then TopP warpers; top_k 0 and top_p 1 are off."""
    if top_k > 0 and top_k < logp.shape[-1]:
        kth = torch.topk(logp, top_k, dim=-1).values[:, -1:]
        logp = logp.masked_fill(logp < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logp, order = torch.sort(logp, dim=-1, descending=True)
        probs = sorted_logp.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # mass of the strictly more likely tokens
        drop = mass_before >= top_p
        drop[:, 0] = False  # the most likely token always stays
        logp = logp.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return logp


def sample_from(logp: torch.Tensor) -> torch.Tensor:
    """[n, V] log-probs (-inf = excluded) -> [n] token ids, x ~ softmax(logp), by inverting the CDF with one
    uniform per row (as FlashInfer samples; on CPU far faster than `torch.multinomial`, which draws V)."""
    cdf = (logp - logp.max(dim=-1, keepdim=True).values).exp().cumsum(dim=-1)  # [n, V], unnormalised
    u = torch.rand(cdf.shape[0], 1, device=cdf.device, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[-1] - 1)[:, 0]  # zero-mass tokens never


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id rows -> ids [n, P] left-padded with `pad_id` and their attention mask [n, P] (1 = token)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], attn[i, width - len(r):] = torch.tensor(r, dtype=torch.long), 1
    return ids, attn


KV_CACHE_ROOM = 128  # free positions a rollout's KV cache keeps per row (it grows by this many when full)


class InPlaceLayer(DynamicLayer):
    """One layer's KV cache that writes each new position in place. transformers' `DynamicLayer` grows keys and
    values [b, kv_heads, L, head_dim] by `torch.cat`, copying the whole cache at every token: O(L) bytes per
    token and layer, O(L^2) per completion (at a 4B model's 1k-token completions, more memory traffic than the
    decode step's matmuls, and a transient second copy). This one keeps `room` free positions after its
    filled part, writes each update there and returns views of the filled part; when full it grows by `room`
    (one copy per `room` tokens, and never more than `room` unused positions per row). It implements what
    `sample_compacting` calls, `update` and `batch_select_indices`; DynamicLayer's other edits (crop, offload,
    beam reorder) would act on the views only."""

    def __init__(self, room: int):
        super().__init__()
        self.room, self.filled = room, 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self.filled + key_states.shape[-2]
        if not self.is_initialized:
            self.key_buf, self.value_buf = key_states[:, :, :0], value_states[:, :, :0]
            self.device, self.is_initialized = key_states.device, True
        if end > self.key_buf.shape[-2]:  # full: [b, kv_heads, filled, hd] -> [b, kv_heads, end + room, hd]
            grow = end + self.room - self.key_buf.shape[-2]
            self.key_buf, self.value_buf = (torch.cat([b, b.new_empty(*b.shape[:2], grow, b.shape[-1])], dim=-2)
                                            for b in (self.key_buf, self.value_buf))
        self.key_buf[:, :, self.filled:end] = key_states
        self.value_buf[:, :, self.filled:end] = value_states
        self.filled = end
        self.keys, self.values = self.key_buf[:, :, :end], self.value_buf[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self.key_buf, self.value_buf = self.key_buf[indices], self.value_buf[indices]
            self.keys, self.values = self.key_buf[:, :, :self.filled], self.value_buf[:, :, :self.filled]


def kv_cache(room: int):
    """An empty KV cache of `InPlaceLayer`s with `room` positions beyond the prefill (transformers' plain
    `DynamicCache` where its `Cache` cannot be built from a layer class)."""
    from transformers import DynamicCache
    from transformers.cache_utils import Cache

    try:
        return Cache(layer_class_to_replicate=partial(InPlaceLayer, room))
    except TypeError:
        return DynamicCache()


def stop_token_ids(tok, stop_strings: Sequence[str] = ()) -> list[int]:
    """The tokens that end a completion: EOS, and every token whose text contains one of `stop_strings` (config field
    `stop_strings`; e.g. "\\n" for a base model's one-line answers: any token holding a newline). The stop token is
    the completion's last, as EOS is."""
    ids = [tok.eos_token_id]
    if stop_strings:
        texts = tok.batch_decode([[i] for i in range(len(tok))])
        ids += [i for i, t in enumerate(texts) if i != tok.eos_token_id and any(s in t for s in stop_strings)]
    return ids


@torch.no_grad()
def sample_compacting(model, ids: torch.Tensor, attn: torch.Tensor, params: SamplingParams,
                      eos_token_id: int | Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """KV-cached ancestral sampling that computes each prompt once and drops each row once it is finished.

    ids, attn: [n, P] left-padded prompts and their mask; equal consecutive rows (the G completions of a
    prompt) are prefilled once and their KV cache repeated. Each step samples x_t ~ softmax(filter(z_t / T))
    from the last logits z_t, records log softmax(z_t / T)[x_t] (tempered, untruncated: what
    `scoring.completion_logprobs` recomputes), and removes the rows that emitted EOS (any of `eos_token_id`:
    `stop_token_ids`) or hit max_new_tokens from the input, the mask and the KV cache (once an eighth of the batch has
    finished: each drop copies the cache), so a step costs about the rows still generating, not the whole batch
    until its longest completion ends (transformers' `generate` keeps finished rows and prefills every row). The
    cache is written in place (`InPlaceLayer`), not concatenated per token. Position ids follow the mask (left padding does not shift
    positions). Non-finite logits (diverged weights) are replaced as transformers' `remove_invalid_values` does,
    so such a step samples (and is skipped later) instead of crashing. A step reads one number back from the
    device (how many rows are done), so a GPU is not stalled by several syncs per token.

    Returns tokens [n, T] (zeros after a row's end), log-probs [n, T] fp32 and lengths [n] (EOS included).
    """
    n, device = ids.shape[0], ids.device
    stop = torch.tensor(eos_token_id, device=device).reshape(-1)
    tokens = torch.zeros(n, params.max_new_tokens, dtype=torch.long, device=device)
    logprobs = torch.zeros(n, params.max_new_tokens, dtype=torch.float32, device=device)
    lengths = torch.full((n,), params.max_new_tokens, dtype=torch.long, device=device)
    alive = torch.arange(n, device=device)  # original row of each row still generating
    positions = (attn.long().cumsum(-1) - 1).clamp(min=0)  # [n, P]
    new_prompt = torch.ones(n, dtype=torch.bool, device=device)
    new_prompt[1:] = (ids[1:] != ids[:-1]).any(dim=1)
    first = new_prompt.nonzero()[:, 0]  # [u] one row per distinct prompt
    row_prompt = new_prompt.long().cumsum(0) - 1  # [n] which of them each row is
    cache = kv_cache(room=min(params.max_new_tokens, KV_CACHE_ROOM))
    kv = {"cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values": cache}  # 5.x; 4.x
    out = model(input_ids=ids[first], attention_mask=attn[first], position_ids=positions[first], use_cache=True,
                logits_to_keep=1, **kv)
    cache.batch_select_indices(row_prompt)
    logits = out.logits[:, -1][row_prompt]  # [n, V]
    next_pos = positions[:, -1] + 1  # [n]
    done = torch.zeros(n, dtype=torch.bool, device=device)  # finished rows not yet dropped from the batch
    for t in range(params.max_new_tokens):
        logits = at_least_fp32(logits)  # [n_batch, V]; finite values pass unchanged
        big = torch.finfo(logits.dtype).max
        logits = torch.nan_to_num(logits, nan=0.0, posinf=big, neginf=-big)
        logp = torch.log_softmax(logits / params.temperature, dim=-1)
        choice = sample_from(filter_logits(logp, params.top_k, params.top_p)).masked_fill(done, 0)  # [n_batch]
        tokens[alive, t] = choice  # finished rows still in the batch record 0
        logprobs[alive, t] = logp.gather(1, choice[:, None])[:, 0].masked_fill(done, 0.0).float()  # fp64 models too
        ended = torch.isin(choice, stop) & ~done
        lengths[alive] = torch.where(ended, t + 1, lengths[alive])
        done |= ended
        n_done = int(done.sum())  # the step's one host-device sync (no boolean indexing above)
        if t + 1 == params.max_new_tokens or n_done == done.numel():
            break
        if n_done >= max(1, done.numel() // 8):  # drop finished rows in batches: each drop copies the cache
            keep = (~done).nonzero()[:, 0]
            alive, choice, attn, next_pos, done = alive[keep], choice[keep], attn[keep], next_pos[keep], done[keep]
            cache.batch_select_indices(keep)
        attn = torch.cat([attn, attn.new_ones(attn.shape[0], 1)], dim=1)
        logits = model(input_ids=choice[:, None], attention_mask=attn, position_ids=next_pos[:, None], use_cache=True,
                       **kv).logits[:, -1]
        next_pos = next_pos + 1
    return tokens, logprobs, lengths


class HFRollout:
    """transformers backend (`sample_compacting` on the model itself); `batch_size` rows (prompt x completion)
    per call, on the model's device, under `autocast_dtype` (e.g. bf16 compute over fp32 master weights) when
    given; completions end at EOS or at a token holding one of `stop_strings` (`stop_token_ids`)."""

    samples_training_model = True

    def __init__(self, model, tokenizer, batch_size: int = 256, autocast_dtype: torch.dtype | None = None,
                 stop_strings: Sequence[str] = ()):
        self.model, self.tok, self.batch_size, self.autocast_dtype = model, tokenizer, batch_size, autocast_dtype
        self.stop_ids = stop_token_ids(tokenizer, stop_strings)

    @classmethod
    def from_config(cls, cfg, model, tokenizer, prompts: list[str]) -> "HFRollout":
        """`rollout_batch_size` rows a call, under the compute dtype's autocast, stopping at `stop_strings`
        (`prompts` are not needed)."""
        return cls(model, tokenizer, cfg.rollout_batch_size, COMPUTE_DTYPES[cfg.dtype], cfg.stop_strings or ())

    def sleep(self) -> None:
        """Nothing to free: generation runs on the training model (or its copy under FSDP)."""

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Generation reads the live training weights; when they are FSDP shards, the engine's own full copy
        (the `model` it was built with) is refreshed from them instead (every rank in step: all-gathers)."""
        if not is_sharded(model):
            self.model = model
            return
        own = self.model.state_dict()
        with torch.no_grad():
            for name, value in full_state_items(model):
                own[name].copy_(value)

    @torch.no_grad()
    def generate(self, prompts: list[str], params: SamplingParams) -> RolloutBatch:
        tok, model = self.tok, self.model
        device = model_device(model)
        p_ids = tok(prompts, add_special_tokens=False)["input_ids"]
        rows = [ids for ids in p_ids for _ in range(params.n)]
        out = RolloutBatch([], [], [], [], [])
        was_training = model.training
        model.eval()
        for s in range(0, len(rows), self.batch_size):
            chunk = rows[s: s + self.batch_size]
            ids, attn = left_pad(chunk, tok.pad_token_id)
            with torch.autocast(device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
                new, lp, lengths = sample_compacting(model, ids.to(device), attn.to(device), params, self.stop_ids)
            new, lp, lengths = new.cpu(), lp.cpu(), lengths.tolist()
            for i, r in enumerate(chunk):
                out.prompt_ids.append(r)
                out.completion_ids.append(new[i, :lengths[i]].tolist())
                out.logprobs.append(lp[i, :lengths[i]].clone() if params.logprobs else None)
                out.truncated.append(out.completion_ids[-1][-1:] not in ([t] for t in self.stop_ids))
        out.texts = tok.batch_decode(out.completion_ids, skip_special_tokens=True)
        model.train(was_training)
        return out


# rollout backends by name (the config's `rollout_backend`): "module:Class" imported when chosen, as verl's rollout
# registry does, so a backend's module (vLLM's) is imported only when used and no backend module imports another.
# A backend class has `from_config(cfg, model, tokenizer, prompts)` and says whether it samples from the training
# model's own weights (`samples_training_model`: runs can then share a process; under FSDP it needs a full copy).
ROLLOUT_BACKENDS: dict[str, str] = {"hf": "dppo.rollout:HFRollout", "vllm": "dppo.vllm_rollout:VLLMRollout"}


def rollout_backend(name: str) -> type:
    """The engine class registered as `name` in ROLLOUT_BACKENDS (its module imported now)."""
    if name not in ROLLOUT_BACKENDS:
        raise ValueError(f"config field 'rollout_backend' must be one of {list(ROLLOUT_BACKENDS)}, got {name!r}")
    module, cls = ROLLOUT_BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def engine_from_config(cfg, model, tokenizer, prompts: list[str]) -> RolloutEngine:
    """The engine of the backend `cfg.rollout_backend` for a TrainConfig-like `cfg`, for `model` and the `prompts`
    it will see."""
    return rollout_backend(cfg.rollout_backend).from_config(cfg, model, tokenizer, prompts)
