"""Rollout: prompts -> G sampled completions each, with their sampling log-probs.

The trainer talks only to `RolloutEngine`; the transformers `generate` backend below samples from
the training model itself (so weight sync is a no-op). A vLLM engine with per-step weight sync can
implement the same two methods.

Sampling log-probs are those of the tempered, untruncated distribution,
`log softmax(logits / temperature)[token]`, exactly what `scoring.completion_logprobs` recomputes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class SamplingParams:
    n: int = 8  # completions per prompt (G)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 96


@dataclass
class RolloutBatch:
    """Row r = completion r % n of prompt r // n (rows are grouped by prompt)."""
    prompt_ids: list[list[int]]  # [N] prompt token ids (repeated for each completion)
    completion_ids: list[list[int]]  # [N] generated ids, EOS included when emitted
    logprobs: list[torch.Tensor]  # [N] each [len(completion)] sampling log-probs
    texts: list[str]  # [N] decoded completions
    truncated: list[bool]  # [N] hit max_new_tokens without EOS

    @classmethod
    def concat(cls, batches: list["RolloutBatch"]) -> "RolloutBatch":
        """The rows of several batches, in order (rollout rounds of one step)."""
        return cls(*([x for b in batches for x in getattr(b, f)] for f in
                     ("prompt_ids", "completion_ids", "logprobs", "texts", "truncated")))

    @property
    def num_tokens(self) -> int:
        return sum(len(c) for c in self.completion_ids)


class RolloutEngine(Protocol):
    def generate(self, prompts: list[str], params: SamplingParams) -> RolloutBatch: ...

    def sync_weights(self, model: torch.nn.Module) -> None: ...


class HFRollout:
    """transformers `generate` backend; `batch_size` rows (prompt x completion) per call."""

    def __init__(self, model, tokenizer, batch_size: int = 256):
        self.model, self.tok, self.batch_size = model, tokenizer, batch_size

    def sync_weights(self, model: torch.nn.Module) -> None:
        self.model = model  # generation reads the live training weights

    @torch.no_grad()
    def generate(self, prompts: list[str], params: SamplingParams) -> RolloutBatch:
        from transformers import GenerationConfig

        tok, model = self.tok, self.model
        gen_cfg = GenerationConfig(
            do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
            max_new_tokens=params.max_new_tokens, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
            return_dict_in_generate=True, output_logits=True, use_cache=True)
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
            g = model.generate(input_ids=ids, attention_mask=attn, generation_config=gen_cfg)
            new = g.sequences[:, width:]  # [n, T]
            logits = torch.stack(g.logits, dim=1).float() / params.temperature  # [n, T, V]
            lp = torch.log_softmax(logits, -1).gather(-1, new[:, :, None]).squeeze(-1)  # [n, T]
            for i, r in enumerate(chunk):
                seq = new[i].tolist()
                end = seq.index(tok.eos_token_id) + 1 if tok.eos_token_id in seq else len(seq)
                out.prompt_ids.append(r)
                out.completion_ids.append(seq[:end])
                out.logprobs.append(lp[i, :end].clone())
                out.truncated.append(tok.eos_token_id not in seq)
        out.texts = tok.batch_decode(out.completion_ids, skip_special_tokens=True)
        model.train(was_training)
        return out


def make_rollout_engine(backend: str, model, tokenizer, batch_size: int) -> RolloutEngine:
    """The rollout engine named by the config field `rollout_backend`."""
    if backend == "hf":
        return HFRollout(model, tokenizer, batch_size)
    raise ValueError(f"config field 'rollout_backend' must be one of ['hf'], got {backend!r}")
