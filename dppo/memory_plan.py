"""The GPU plan of a run, from its config alone (docs/engineering.md §4.1-4.2): how many sequences one rank's vLLM engine is
asked to decode at once, how many tokens its KV cache holds, and what one GPU holds in each phase of a step.

A step on one GPU (one training process, its colocated vLLM engine; `dppo.vllm_rollout`) has two phases:

  awake    rollout, evaluation and the weight push: vLLM holds its share u x GPU (bf16 weights, activations, KV
           cache); the trainer its FSDP shards of the fp32 weights and AdamW's two moments (12 N / W; the gradients
           are freed before the rollout, `Trainer.update`), the fp32 reference's shard (4 N / W if kl_coef > 0), and,
           during the push, one gathered full tensor (fp32) and its bf16 copy (`distributed.full_state_items`); plus
           the process's CUDA context. The push is counted beside vLLM's whole share: an upper bound whether the
           engine wakes whole before it or its KV cache after it
  update   vLLM asleep (weights and KV cache off the device; the trainer empties torch's cache before it wakes):
           `update_peak_bytes` at the micro-batch's tokens, the reference's shard, what a sleeping engine
           keeps, the CUDA context

so the activations of the update and vLLM's share never coexist, and the plan fits when both phases do.

Assumptions, not measured here: CUDA_CONTEXT_BYTES, VLLM_ASLEEP_BYTES and VLLM_ACTIVATION_BYTES below; the GPU's
nominal 80 GB (nvidia-smi reports 81,559 MiB = 85.5 GB for an H100 SXM, of which vLLM takes u: the plan, counting u
of 80 GB against 80 GB, is conservative in both directions); prompts of `PROMPT_TOKENS` tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dppo.pruning import build_pruner
from dppo.scoring import cuda_logits_chunk_bytes

if TYPE_CHECKING:
    from dppo.config import TrainConfig

PROMPT_TOKENS = 150  # assumed mean prompt length (MATH problem + instruction + chat template)
PAPER_GPU_BYTES = 80 * 10**9  # the paper profile's GPU, an H100 SXM 80 GB (dppo.budget.PEAK_FLOPS is its bf16 peak)
CUDA_CONTEXT_BYTES = 2 * 2**30  # per process: CUDA context, cuBLAS and NCCL workspaces (assumed: 1-2 GB is typical)
VLLM_ASLEEP_BYTES = 2**30  # what a sleeping engine keeps on the GPU (CUDA graph pools, buffers; assumed)
VLLM_ACTIVATION_BYTES = 2**30  # vLLM's profiled forward peak outside the KV cache, sampler aside (assumed)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Shape:
    """A Qwen3 decoder's dimensions (its config.json)."""
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool  # tie_word_embeddings: the head is the embedding matrix

    @property
    def params(self) -> int:
        """N = V H (x 2 untied) + H + L (H hd (2 heads + 2 kv_heads) + 3 H I + 2 H + 2 hd): embedding (and head), final
        norm, and per layer the q/k/v/o projections, the gated MLP, two RMSNorms and q/k norms."""
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        layer = attention + 3 * self.hidden * self.intermediate + 2 * self.hidden + 2 * self.head_dim
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden + self.layers * layer

    @property
    def largest_tensor(self) -> int:
        """Elements of the largest single weight: the V x H embedding (or head), else an MLP matrix."""
        return max(self.vocab * self.hidden, self.intermediate * self.hidden, self.heads * self.head_dim * self.hidden)


# config.json of each hub repository (huggingface.co/Qwen/Qwen3-4B, /Qwen3-8B): hidden_size, intermediate_size,
# num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, vocab_size, tie_word_embeddings
QWEN3 = {
    "Qwen/Qwen3-4B": Shape(2560, 9728, 36, 32, 8, 128, 151_936, tied=True),
    "Qwen/Qwen3-8B": Shape(4096, 12288, 36, 32, 8, 128, 151_936, tied=False),
}


def model_shape(cfg) -> Shape:
    """The shape of `cfg.model_name_or_path` (hf:Qwen/Qwen3-4B or -8B), known offline."""
    name = cfg.model_name_or_path.removeprefix("hf:")
    if name not in QWEN3:
        raise ValueError(f"no shape for {name!r}: add its config.json values to dppo.memory_plan.QWEN3")
    return QWEN3[name]


# ------------------------------------------------------------------ the engine's load (docs/method.md §2.9, §3.1)
def rollout_prompts_per_call(cfg) -> int:
    """The most prompts one rollout call of a training step asks for, over all ranks. A step covers
    C = pruner.prompts_to_cover(B) prompts (B; CPPO's allocation ceil(B / (1 - P))), and the prompt stage only
    drops some; DAPO's refill rounds are calls of B each. With refill the step covers prompts of a window of
    W = refill_window (0: 2B) until their expected cost fits the budget: at most C / min pi for a budget of C prompts
    (sum pi <= C), any number up to W for a token budget (short prompts cost little). So:

        C (refill none),   min(W, floor(C / min pi)) (refill prompts),   W (refill tokens)."""
    pruner = build_pruner(cfg)
    cover = pruner.prompts_to_cover(cfg.prompts_per_step)
    if cfg.refill == "none":
        return cover
    window = cfg.refill_window or 2 * cfg.prompts_per_step
    if cfg.refill == "prompts":
        return min(window, max(1, math.floor(cover / pruner.min_prompt_inclusion() + 1e-9)))
    return window


def rollout_sequences_per_rank(cfg, world: int) -> int:
    """The most sequences one rank's engine decodes in one generate call: ceil(prompts / world) x G (each rank
    samples every world-th prompt, `distributed.shard`). vLLM's max_num_seqs below it queues the rest."""
    return math.ceil(rollout_prompts_per_call(cfg) / world) * cfg.group_size


def engine_max_num_seqs(cfg, world: int) -> int:
    """The engine's max_num_seqs: `vllm_max_num_seqs`, or the formula when it is 0."""
    return cfg.vllm_max_num_seqs or rollout_sequences_per_rank(cfg, world)


# ------------------------------------------------------------------ KV cache
def kv_bytes_per_token(shape: Shape, dtype: str = "bfloat16") -> int:
    """2 (K, V) x layers x kv_heads x head_dim x bytes: Qwen3-4B and -8B in bf16, 147,456 B a token."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * DTYPE_BYTES[dtype]


def vllm_kv_tokens(cfg, world: int, gpu_bytes: float = PAPER_GPU_BYTES) -> int:
    """Tokens vLLM's KV cache holds: (u x GPU - its weights (b N) - VLLM_ACTIVATION_BYTES - the sampler's fp32 logits
    and log-probs of max_num_seqs rows (2 x 4 V)) / kv_bytes_per_token."""
    shape, b = model_shape(cfg), DTYPE_BYTES[cfg.dtype]
    sampler = 2 * 4 * shape.vocab * engine_max_num_seqs(cfg, world)
    free = cfg.vllm_gpu_memory_utilization * gpu_bytes - b * shape.params - VLLM_ACTIVATION_BYTES - sampler
    return int(free // kv_bytes_per_token(shape, cfg.dtype))


def expected_prompts_per_call(cfg) -> int:
    """The prompts a step's rollout is budgeted for, per call: C = prompts_to_cover(B). Refill's budget is C prompts
    (or C groups of the mean length) in expectation; without refill the prompt stage only removes some."""
    return build_pruner(cfg).prompts_to_cover(cfg.prompts_per_step)


def kv_tokens_needed(cfg, world: int, prompts: int, completion_tokens: float) -> float:
    """KV tokens one rank needs to hold a call of `prompts` prompts whole, each completion `completion_tokens` long:
    ceil(prompts / world) (PROMPT_TOKENS + G x completion_tokens) (a group's completions share their prompt's
    blocks: vLLM's prefix cache). An upper bound on the occupancy: finished sequences free their blocks."""
    return math.ceil(prompts / world) * (PROMPT_TOKENS + cfg.group_size * completion_tokens)


def preemption_free_length(cfg, world: int, gpu_bytes: float = PAPER_GPU_BYTES) -> float:
    """The mean completion length up to which a call of the expected size never preempts: the KV cache holds all of
    it at once. (vllm_kv_tokens / ceil(C / world) - PROMPT_TOKENS) / G."""
    per_rank = math.ceil(expected_prompts_per_call(cfg) / world)
    return (vllm_kv_tokens(cfg, world, gpu_bytes) / per_rank - PROMPT_TOKENS) / cfg.group_size


# ------------------------------------------------------------------ one GPU's memory
def update_tokens(cfg) -> int:
    """Tokens of one training micro-batch: micro_batch_tokens when packed, else micro_batch_size padded rows of
    PROMPT_TOKENS + max_new_tokens."""
    if cfg.packing != "none":
        return cfg.micro_batch_tokens
    return cfg.micro_batch_size * (PROMPT_TOKENS + cfg.max_new_tokens)


def gpu_memory_plan(cfg, world: int, gpu_bytes: float = PAPER_GPU_BYTES) -> dict[str, float]:
    """Bytes one GPU holds, by term, and each phase's sum (module docstring):

        awake  = 12 N / W + reference + context + u GPU + (4 + b) x largest tensor
        update = update_peak_bytes(micro-batch tokens) + reference + context + vLLM asleep
        peak   = max(awake, update)

    with reference = 4 N / W if kl_coef > 0 (fp32, sharded like the policy) and b the compute dtype's bytes."""
    shape = model_shape(cfg)
    n = shape.params
    terms = {
        "policy_shards": 12 * n / world,  # fp32 weights and AdamW's two moments (gradients freed: set_to_none)
        "reference_shard": 4 * n / world if cfg.kl_coef > 0 else 0.0,
        "cuda_context": float(CUDA_CONTEXT_BYTES),
        "vllm": cfg.vllm_gpu_memory_utilization * gpu_bytes,
        "weight_push": (4 + DTYPE_BYTES[cfg.dtype]) * shape.largest_tensor,
        "update": update_peak_bytes(n, shape.hidden, shape.intermediate, shape.layers, shape.vocab, update_tokens(cfg),
                                    cfg.gradient_checkpointing, cuda_logits_chunk_bytes(gpu_bytes), world),
        "vllm_asleep": float(VLLM_ASLEEP_BYTES),
    }
    awake = sum(terms[k] for k in ("policy_shards", "reference_shard", "cuda_context", "vllm", "weight_push"))
    update = sum(terms[k] for k in ("update", "reference_shard", "cuda_context", "vllm_asleep"))
    return {**terms, "awake": awake, "update_phase": update, "peak": max(awake, update), "gpu": float(gpu_bytes)}


def update_peak_bytes(n_params: float, hidden: int, intermediate: int, layers: int, vocab: int, tokens: int,
                      checkpointing: bool = True, logits_chunk_bytes: int = 256 * 2**20, world: int = 1) -> float:
    """An upper bound on the device memory of one update step (forward + backward + AdamW) under bf16 autocast over
    fp32 master weights, checked by bench/gpu_check.py on a GPU:

        16 N / world                 fp32 weights, gradients and AdamW's two moments (FSDP shards all four)
      + 2 N                          bf16 copies autocast makes of the weights during a forward / backward
      + T H 4 L  (checkpointing)     each layer's fp32 input kept for the recompute
        or T (34 H + 5 I) L (not)    every layer's activations in bf16 (attention and MLP intermediates)
      + T (34 H + 5 I)               one layer's activations, recomputed in the backward
      + 3 logits_chunk_bytes + 4 V H the selective log-softmax's fp32 logits (forward, softmax, its gradient) and
                                     the head's fp32 gradient accumulator
    with T = tokens of the micro-batch, H hidden, I intermediate, L layers, V vocabulary; x 1.25 and + 1 GiB for the
    allocator's fragmentation and the CUDA context's workspace."""
    layer = tokens * (34 * hidden + 5 * intermediate)
    acts = tokens * hidden * 4 * layers if checkpointing else layer * layers
    need = 16 * n_params / world + 2 * n_params + acts + layer + 3 * logits_chunk_bytes + 4 * vocab * hidden
    return 1.25 * need + 2**30


def memory_table(configs: list[tuple[str, TrainConfig]], gpus: int) -> list[str]:
    """A markdown table of `dppo.memory_plan` per distinct (YAML, model, engine and micro-batch setting) of the runs:
    the most sequences a rank's engine decodes at once and its max_num_seqs, its KV cache and the mean completion
    length up to which it holds a budgeted rollout whole, and each phase's GB."""
    lines = [f"# GPU plan per config ({gpus} processes; dppo.memory_plan states the assumptions)",
             "| config | model | refill, packing | sequences a rank | max_num_seqs | KV tokens | mean length held | "
             "awake GB | update GB | GPU GB |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    seen = set()
    for cfg_path, cfg in configs:
        if cfg.model_name_or_path.removeprefix("hf:") not in QWEN3 or cfg.rollout_backend != "vllm":
            continue
        seqs, engine = rollout_sequences_per_rank(cfg, gpus), engine_max_num_seqs(cfg, gpus)
        key = (Path(cfg_path).name, cfg.model_name_or_path, seqs, engine, update_tokens(cfg),
               cfg.vllm_gpu_memory_utilization)
        if key in seen:
            continue
        seen.add(key)
        m = gpu_memory_plan(cfg, gpus)
        lines.append(f"| {key[0]} | {cfg.model_name_or_path.removeprefix('hf:Qwen/')} | {cfg.refill}, {cfg.packing} | "
                     f"{seqs} | {engine} | "
                     f"{vllm_kv_tokens(cfg, gpus):,} | {preemption_free_length(cfg, gpus):,.0f} | "
                     f"{m['awake'] / 1e9:.1f} | {m['update_phase'] / 1e9:.1f} | {m['gpu'] / 1e9:.0f} |")
    return lines
