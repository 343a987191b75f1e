"""Per-token log-probabilities of completions under a model (padded batches).

    logp[n, t] = log softmax(logits(prompt_n + completion_n[:t]) / temperature)[completion_n[t]]

Every scoring/training forward passes `use_cache=False`; sequences are right-padded with
position ids 0..len-1, which equals left-padded generation with positions taken from the mask.
"""

from __future__ import annotations

import torch


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """bf16/fp16 logits upcast to fp32 for the log-softmax; fp32 and fp64 kept as they are."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def right_pad(prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int
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
    return ids, attn, comp


def pad_completions(values: list[torch.Tensor], width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D tensors into [N, Tc] (zero-padded) and a float mask [N, Tc]."""
    width = width or max((len(v) for v in values), default=0)
    out = torch.zeros((len(values), width), dtype=torch.float32)
    mask = torch.zeros((len(values), width), dtype=torch.float32)
    for i, v in enumerate(values):
        out[i, : len(v)] = v
        mask[i, : len(v)] = 1.0
    return out, mask


def completion_logprobs(model, prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int,
                        temperature: float = 1.0) -> torch.Tensor:
    """logp [N, Tc] of each completion token (0 beyond a completion's length), one forward.

    Gradients flow when called outside `torch.no_grad()`."""
    ids, attn, _ = right_pad(prompt_ids, completion_ids, pad_id)
    logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits  # [N, T, V]
    tc = max(len(c) for c in completion_ids)
    # position of each completion token's predicting logit: len(prompt)-1+t
    p_len = torch.tensor([len(p) for p in prompt_ids])
    pos = (p_len[:, None] - 1 + torch.arange(tc)[None, :]).clamp(max=ids.shape[1] - 2)  # [N, Tc]
    c_len = torch.tensor([len(c) for c in completion_ids])
    valid = torch.arange(tc)[None, :] < c_len[:, None]  # [N, Tc]
    sel = at_least_fp32(logits.gather(1, pos[:, :, None].expand(-1, -1, logits.shape[-1]))) / temperature  # [N, Tc, V]
    target = ids.gather(1, (pos + 1).clamp(max=ids.shape[1] - 1))  # [N, Tc]
    logp = torch.log_softmax(sel, dim=-1).gather(-1, target[:, :, None]).squeeze(-1)
    return logp * valid
