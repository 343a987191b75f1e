"""Per-token log-probabilities of completions under a model (padded batches), memory-bounded.

    logp[n, t] = log softmax(logits(prompt_n + completion_n[:t]) / temperature)[completion_n[t]]

The decoder's hidden states are read only at the positions that predict a completion token, and the
vocabulary projection + log-softmax run in chunks of tokens inside one autograd function that recomputes
each chunk's logits in the backward pass (`selective_logprobs`): extra memory is one chunk x V floats,
never [N, T, V] (at the paper's 151,936-token vocabulary, 8 x 1,024 completion tokens would need 5 GB per
float32 copy). Every scoring/training forward passes `use_cache=False`; sequences are right-padded with
position ids 0..len-1, which equals left-padded generation with positions taken from the mask. Tensors
are built on the model's device.
"""

from __future__ import annotations

import torch

# config dtype -> the autocast compute dtype over fp32 master weights (None: plain fp32)
COMPUTE_DTYPES = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}

LOGITS_CHUNK_BYTES = 256 * 2**20  # float32 logits per chunk of the selective log-softmax (CPU)
CUDA_LOGITS_SHARE = 0.02  # on CUDA: this share of the device's memory, at most 4 GiB (H100: 1.6 GB)


def logits_chunk_bytes(device: torch.device | str) -> int:
    """The logits budget of one chunk: 256 MiB on CPU (cache-sized chunks are not slower there); on CUDA 2% of the
    device's memory, at most 4 GiB, so a chunk is thousands of tokens at Qwen3's vocabulary (80 GB: 1.6 GB = 2,600
    tokens at V = 151,936, instead of 441 at 256 MiB) and the head's backward runs a few large matmuls instead of
    dozens of small memory-bound ones."""
    device = torch.device(device)
    if device.type != "cuda":
        return LOGITS_CHUNK_BYTES
    return cuda_logits_chunk_bytes(torch.cuda.get_device_properties(device).total_memory)


def cuda_logits_chunk_bytes(device_bytes: float) -> int:
    """`logits_chunk_bytes` of a CUDA device with `device_bytes` of memory: 2% of it, at least 256 MiB, at most 4 GiB."""
    return int(min(4 * 2**30, max(LOGITS_CHUNK_BYTES, CUDA_LOGITS_SHARE * device_bytes)))


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """bf16/fp16 values upcast to fp32; fp32 and fp64 kept as they are."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def decoder_and_head(model) -> tuple[torch.nn.Module, torch.Tensor]:
    """(the model without its vocabulary projection, the projection's weight [V, H]) of a causal LM whose
    logits are exactly lm_head(hidden) (Qwen, Llama, Mistral); anything else is refused."""
    head = model.get_output_embeddings()
    cfg = model.config
    capped = [name for name in LOGIT_TRANSFORMS if getattr(cfg, name, None) not in (None, 0, 0.0, 1, 1.0)]
    if getattr(head, "bias", None) is not None or capped:
        raise ValueError(f"{type(model).__name__}: selective log-probs need logits = lm_head(hidden) "
                         f"(no bias, soft-capping or logit scaling; config sets {', '.join(capped) or 'a bias'})")
    return model.get_decoder(), head.weight


# config fields by which transformers' models change the logits after lm_head (Gemma 2 / 3's final soft-capping,
# RecurrentGemma's under another name, Granite's and Cohere's scaling): such a model is refused, not mis-scored
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logits_soft_cap", "logits_scaling", "logit_scale")


class _SelectiveLogSoftmax(torch.autograd.Function):
    """logp[m] = log softmax(hidden[m] @ W^T / temperature)[target[m]], chunk by chunk, in `compute`
    dtype (bf16 under autocast) with fp32 (or fp64) log-sum-exp; the backward pass recomputes each chunk:
    d logp / d logits = (onehot(target) - softmax) / temperature."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk, compute):
        out_dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        m = hidden.shape[0]
        lse = torch.empty(m, dtype=out_dtype, device=hidden.device)
        logp = torch.empty(m, dtype=out_dtype, device=hidden.device)
        w = weight.to(compute)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, m, chunk):
                logits = (hidden[s:s + chunk].to(compute) @ w.T).to(out_dtype).div_(temperature)  # [c, V]
                lse[s:s + chunk] = torch.logsumexp(logits, dim=-1)
                logp[s:s + chunk] = logits.gather(1, targets[s:s + chunk, None]).squeeze(1) - lse[s:s + chunk]
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.temperature, ctx.chunk, ctx.compute = temperature, chunk, compute
        return logp

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, targets, lse = ctx.saved_tensors
        t, chunk, compute = ctx.temperature, ctx.chunk, ctx.compute
        w = weight.to(compute)
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=lse.dtype, device=weight.device) if ctx.needs_input_grad[1] else None
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, hidden.shape[0], chunk):
                h, g = hidden[s:s + chunk].to(compute), grad[s:s + chunk].to(lse.dtype)
                d = (h @ w.T).to(lse.dtype).div_(t).sub_(lse[s:s + chunk, None]).exp_()  # softmax [c, V]
                d.mul_(-g[:, None]).scatter_add_(1, targets[s:s + chunk, None], g[:, None]).div_(t)  # dlogits
                if grad_h is not None:
                    grad_h[s:s + chunk] = (d.to(compute) @ w).to(hidden.dtype)
                if grad_w is not None:  # the matmul in the compute dtype (bf16 tensor cores), accumulated in fp32
                    grad_w += (d.to(compute).T @ h).to(lse.dtype)
        return grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None, None, None


def selective_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                       chunk_bytes: int | None = None) -> torch.Tensor:
    """logp [M] of `targets` [M] under logits = hidden [M, H] @ weight [V, H]^T / temperature, holding at most
    `chunk_bytes` of float32 logits at a time, forward and backward (default: `logits_chunk_bytes` of the device)."""
    chunk = max(1, (chunk_bytes or logits_chunk_bytes(hidden.device)) // (4 * weight.shape[0]))
    compute = torch.get_autocast_dtype(hidden.device.type) if torch.is_autocast_enabled(hidden.device.type) \
        else hidden.dtype
    return _SelectiveLogSoftmax.apply(hidden, weight, targets, float(temperature), chunk, compute)


def scatter_completions(values: torch.Tensor, seq: torch.Tensor, pos: torch.Tensor, n: int, width: int) -> torch.Tensor:
    """values [M] of completion token `pos[m]` of sequence `seq[m]` -> [n, width], 0 elsewhere."""
    return torch.zeros((n, width), dtype=values.dtype, device=values.device).index_put((seq, pos), values)


def right_pad(prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int, device=None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids [N, T], attention_mask [N, T] and completion_mask [N, T] of prompt+completion rows."""
    lens = [len(p) + len(c) for p, c in zip(prompt_ids, completion_ids)]
    n, t = len(lens), max(lens)
    ids = torch.full((n, t), pad_id, dtype=torch.long)
    attn = torch.zeros((n, t), dtype=torch.long)
    comp = torch.zeros((n, t), dtype=torch.float32)
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        ids[i, : lens[i]] = torch.tensor(p + c, dtype=torch.long)
        attn[i, : lens[i]] = 1
        comp[i, len(p): lens[i]] = 1.0
    return ids.to(device), attn.to(device), comp.to(device)


def pad_completions(values: list[torch.Tensor], width: int | None = None, device=None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D tensors into [N, Tc] (zero-padded) and a float mask [N, Tc]."""
    width = width or max((len(v) for v in values), default=0)
    out = torch.zeros((len(values), width), dtype=torch.float32)
    mask = torch.zeros((len(values), width), dtype=torch.float32)
    for i, v in enumerate(values):
        out[i, : len(v)] = v
        mask[i, : len(v)] = 1.0
    return out.to(device), mask.to(device)


class TokenLogprobs(torch.nn.Module):
    """A causal LM whose forward returns the selective log-probs of chosen tokens instead of logits:

        forward(input_ids [R, T], rows [M], cols [M], temperature, attention_mask | position_ids [R, T])
            = log softmax(lm_head(hidden[rows, cols]) / temperature)[input_ids[rows, cols + 1]]   [M]

    This module, not the causal LM, is what DDP / FSDP wrap (`Trainer`): the vocabulary projection then runs
    inside the wrapped forward, where FSDP has gathered the head's weight and DDP sees every parameter used.
    The causal LM is `.policy` (checkpoints, rollout, `final/`)."""

    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        self.policy = policy
        self._no_split_modules = getattr(policy, "_no_split_modules", None)  # FSDP auto-wrap: the decoder layers

    def tie_weights(self, *args, **kwargs) -> None:
        """Re-tie the policy's tied weights: accelerate calls it on the module it prepares when
        fsdp_cpu_ram_efficient_loading re-creates the parameters (FSDP2)."""
        if hasattr(self.policy, "tie_weights"):
            self.policy.tie_weights()

    def forward(self, input_ids: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, temperature: float,
                attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
                targets: torch.Tensor | None = None) -> torch.Tensor:
        """`targets` [M] default to the next token, input_ids[rows, cols + 1]; a shared-prompt row
        (`packing.shared_prompt_logprobs`) names them, since every completion's first token follows the prompt."""
        decoder, weight = decoder_and_head(self.policy)
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=False).last_hidden_state  # [R, T, H]
        targets = input_ids[rows, cols + 1] if targets is None else targets
        return selective_logprobs(hidden[rows, cols], weight, targets, temperature)


def as_scorer(model: torch.nn.Module) -> torch.nn.Module:
    """`model` itself when it is a (possibly DDP/FSDP-wrapped) `TokenLogprobs`, else a `TokenLogprobs` view of the
    causal LM (no copy)."""
    return TokenLogprobs(model) if hasattr(model, "get_decoder") else model


def completion_logprobs(model, prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int,
                        temperature: float = 1.0) -> torch.Tensor:
    """logp [N, Tc] of each completion token (0 beyond a completion's length), one forward of the decoder and a
    selective log-softmax at the completion positions (`TokenLogprobs`). `model`: a causal LM or a wrapped
    `TokenLogprobs`. Gradients flow when called outside `torch.no_grad()`."""
    device = model_device(model)
    ids, attn, _ = right_pad(prompt_ids, completion_ids, pad_id, device)
    seq = torch.cat([torch.full((len(c),), i) for i, c in enumerate(completion_ids)]).to(device)
    pos = torch.cat([torch.arange(len(c)) for c in completion_ids]).to(device)
    p_len = torch.tensor([len(p) for p in prompt_ids], device=device)
    col = p_len[seq] - 1 + pos  # the position whose logits predict completion token pos
    logp = as_scorer(model)(ids, seq, col, temperature, attention_mask=attn)
    return scatter_completions(logp, seq, pos, len(completion_ids), max(len(c) for c in completion_ids))
