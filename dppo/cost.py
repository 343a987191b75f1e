"""Deterministic compute cost of a step, in FLOPs, from the tokens each phase processes (docs/method.md §5).

As nanoGPT's MFU estimate: a forward pass costs 2 N_body per token slot (N_body: the parameters other than the
embedding table), 4 L d_q per attended (query, key) pair (scores and weighted values, L layers, d_q = heads x
head dim), and 2 V H per token whose vocabulary logits are computed; a backward pass twice the forward, and
gradient checkpointing one more forward of the body. Unlike wall-clock time it does not depend on the machine or
on what else runs on it, so speed-ups in FLOPs cannot be faked by a busy machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ModelShape:
    body_params: int  # parameters except the token embedding table
    layers: int
    q_dim: int  # attention heads x head dim
    vocab: int
    hidden: int

    @classmethod
    def of(cls, model: torch.nn.Module) -> "ModelShape":
        """The shape of a transformers causal LM (Qwen3, Llama, ...)."""
        cfg = model.config
        embed = model.get_input_embeddings().weight
        head = model.get_output_embeddings().weight
        params = {id(p): p.numel() for p in model.parameters()}  # tied weights once
        body = sum(params.values()) - embed.numel() - (0 if head is embed else head.numel())
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cls(body, cfg.num_hidden_layers, cfg.num_attention_heads * head_dim, cfg.vocab_size, cfg.hidden_size)

    def forward(self, slots: float, pairs: float, logit_tokens: float) -> float:
        """FLOPs of one forward over `slots` token slots with `pairs` attended (query, key) pairs, computing the
        vocabulary logits of `logit_tokens` tokens."""
        return 2 * self.body_params * slots + 4 * self.layers * self.q_dim * pairs + 2 * self.vocab * self.hidden * logit_tokens

    def scoring(self, segments: list[tuple[int, list[int]]], slots: float) -> float:
        """FLOPs of one scoring forward (log-probs of completions after their prompts) over `segments`, each a
        prompt computation (prompt length, its completions' lengths): the layout's token `slots`, the causal
        (query, key) pairs they need (the prompt's, then each completion's over prompt + itself; for a single
        completion (p + c)(p + c + 1) / 2), and the vocabulary logits of the completion tokens."""
        pairs = sum(p * (p + 1) / 2 + sum(c * p + c * (c + 1) / 2 for c in cs) for p, cs in segments)
        return self.forward(slots, pairs, sum(sum(cs) for _, cs in segments))

    def generation(self, prompt_lengths: list[int], completion_lengths: list[int], group_size: int = 1) -> float:
        """FLOPs of sampling each completion after its prompt with a KV cache, rows r = group_size·b + i sharing
        prompt b: the prompt is computed once per group (prefilled once, its cache shared by the group's
        completions, as `rollout.sample_compacting` and vLLM's prefix cache do), every completion token is a
        forward attending to the prompt and its own tokens so far, and each generated token takes a logit row:
        Σ_b p_b + Σ_r c_r token slots, Σ_b p_b(p_b + 1)/2 + Σ_r (c_r p_r + c_r(c_r + 1)/2) pairs."""
        heads = prompt_lengths[::group_size]  # one row per group
        tokens = sum(heads) + sum(completion_lengths)
        pairs = (sum(p * (p + 1) / 2 for p in heads)
                 + sum(c * p + c * (c + 1) / 2 for p, c in zip(prompt_lengths, completion_lengths)))
        return self.forward(tokens, pairs, sum(completion_lengths))


def training_multiplier(gradient_checkpointing: bool) -> float:
    """Forward + backward (2x forward) of a training micro-batch, + the recomputed forward under checkpointing
    (counted on the whole forward: an upper bound, the head is not recomputed)."""
    return 4.0 if gradient_checkpointing else 3.0
