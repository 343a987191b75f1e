"""Rollout: prompts -> G sampled completions each, with their sampling log-probs.

The trainer talks only to `RolloutEngine`; the transformers `generate` backend below samples from
the training model itself (so weight sync is a no-op); `dppo.vllm_rollout` implements the same two methods
on vLLM, with the weights pushed after every optimizer step.

Sampling log-probs (returned when `SamplingParams.logprobs`) are those of the tempered, untruncated
distribution, `log softmax(logits / temperature)[token]`, exactly what `scoring.completion_logprobs`
recomputes; only the sampled token's value is kept, never a step's full-vocabulary logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from dppo.distributed import full_state_items, is_sharded
from dppo.scoring import at_least_fp32, model_device


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


class SampledLogprobs:
    """A logits processor that keeps only the sampled token's log softmax(logits / temperature): at each step
    it reads the previous step's row at the token just sampled (the last input id), so it holds one [n, V]
    row block at a time instead of every step's full-vocabulary logits. Custom processors run before
    generate's temperature / top-k / top-p warpers, so `scores` are the untempered logits."""

    def __init__(self, temperature: float):
        self.temperature, self.prev, self.steps = temperature, None, []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.steps.append(self.prev.gather(1, input_ids[:, -1:]).squeeze(1))
        self.prev = torch.log_softmax(at_least_fp32(scores) / self.temperature, dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """[n, T] log-probs of the generated tokens (`sequences` [n, T])."""
        if self.prev is not None:
            self.steps.append(self.prev.gather(1, sequences[:, len(self.steps):len(self.steps) + 1]).squeeze(1))
        self.prev = None
        return torch.stack(self.steps, dim=1) if self.steps else sequences.new_zeros(sequences.shape, dtype=torch.float)


class HFRollout:
    """transformers `generate` backend; `batch_size` rows (prompt x completion) per call, on the model's device,
    under `autocast_dtype` (e.g. bf16 compute over fp32 master weights) when given."""

    def __init__(self, model, tokenizer, batch_size: int = 256, autocast_dtype: torch.dtype | None = None):
        self.model, self.tok, self.batch_size, self.autocast_dtype = model, tokenizer, batch_size, autocast_dtype

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
        from transformers import GenerationConfig, LogitsProcessorList

        tok, model = self.tok, self.model
        device = model_device(model)
        gen_cfg = GenerationConfig(
            do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
            max_new_tokens=params.max_new_tokens, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
            return_dict_in_generate=True, use_cache=True,
            remove_invalid_values=True)  # NaN / inf logits (diverged weights) sample, never crash: the step is skipped
        p_ids = tok(prompts, add_special_tokens=False)["input_ids"]
        rows = [ids for ids in p_ids for _ in range(params.n)]
        out = RolloutBatch([], [], [], [], [])
        was_training = model.training
        model.eval()
        for s in range(0, len(rows), self.batch_size):
            chunk = rows[s: s + self.batch_size]
            width = max(len(r) for r in chunk)
            ids = torch.full((len(chunk), width), tok.pad_token_id, dtype=torch.long)
            attn = torch.zeros_like(ids)
            for i, r in enumerate(chunk):  # left padding
                ids[i, width - len(r):] = torch.tensor(r)
                attn[i, width - len(r):] = 1
            recorder = SampledLogprobs(params.temperature) if params.logprobs else None
            with torch.autocast(device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
                g = model.generate(input_ids=ids.to(device), attention_mask=attn.to(device), generation_config=gen_cfg,
                                   logits_processor=LogitsProcessorList([recorder] if recorder else []))
            new = g.sequences[:, width:].cpu()  # [n, T]
            lp = recorder.finish(g.sequences[:, width:]).cpu() if recorder else None
            for i, r in enumerate(chunk):
                seq = new[i].tolist()
                end = seq.index(tok.eos_token_id) + 1 if tok.eos_token_id in seq else len(seq)
                out.prompt_ids.append(r)
                out.completion_ids.append(seq[:end])
                out.logprobs.append(lp[i, :end].clone() if lp is not None else None)
                out.truncated.append(tok.eos_token_id not in seq)
        out.texts = tok.batch_decode(out.completion_ids, skip_special_tokens=True)
        model.train(was_training)
        return out


def make_rollout_engine(backend: str, model, tokenizer, batch_size: int, autocast_dtype: torch.dtype | None = None,
                        model_path: str | None = None, **vllm_settings) -> RolloutEngine:
    """The rollout engine named by the config field `rollout_backend`: `hf` samples from `model` itself; `vllm`
    starts from `model_path` and receives `model`'s weights before its first generation."""
    if backend == "hf":
        return HFRollout(model, tokenizer, batch_size, autocast_dtype)
    if backend == "vllm":
        from dppo.vllm_rollout import VLLMRollout

        engine = VLLMRollout(model_path, tokenizer, **vllm_settings)
        engine.sync_weights(model)
        return engine
    raise ValueError(f"config field 'rollout_backend' must be one of ['hf', 'vllm'], got {backend!r}")


def engine_from_config(cfg, model, tokenizer, prompts: list[str]) -> RolloutEngine:
    """The engine for a TrainConfig-like `cfg` (its rollout_* / vllm_* fields), for `model` and the `prompts`
    it will see (vLLM's max_model_len: the longest prompt + max_new_tokens unless set)."""
    from dppo.config import COMPUTE_DTYPES
    from dppo.model import resolve_model_path

    autocast = COMPUTE_DTYPES[cfg.dtype]
    if cfg.rollout_backend != "vllm":
        return make_rollout_engine(cfg.rollout_backend, model, tokenizer, cfg.rollout_batch_size, autocast)
    longest = max(len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"])
    return make_rollout_engine(
        "vllm", model, tokenizer, cfg.rollout_batch_size, model_path=resolve_model_path(cfg.model_name_or_path),
        dtype=cfg.dtype, max_model_len=cfg.vllm_max_model_len or longest + cfg.max_new_tokens,
        gpu_memory_utilization=cfg.vllm_gpu_memory_utilization, tensor_parallel_size=cfg.vllm_tensor_parallel_size,
        seed=cfg.seed)
