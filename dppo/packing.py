"""Padding-free packed scoring (docs/method.md §3.2), and shared-prompt rows (§3.3).

Kept (prompt, completion) sequences are packed into rows of at most `capacity` tokens by
best-fit-decreasing; position ids restart at 0 for every sequence and no attention mask is passed,
so transformers derives the block-diagonal causal mask from the restarting positions (sdpa/eager), or the
varlen cu_seqlens of flash-attn, which it does only for a batch of one row: with a flash-attn varlen kernel every
sequence of a micro-batch goes in one row, and with a kernel that separates nothing, one sequence a row
(`attention_rows`, `packed_layout`). A model with a layer that carries state along the sequence (recurrent,
linear-attention, convolution, state-space: Qwen3.5, Qwen3-Next, LFM2, Mamba, Jamba, ...) gets one sequence a row
whatever its attention kernel: nothing restarts that state at a sequence boundary (`stateful_layer`, `packed_rows`).
Only completion tokens are read back, so the logits at sequence boundaries (which would predict the next sequence's
first token) are never used.

    packed logp[n, t] == padded logp[n, t]   (fp32: max abs diff <= 1e-5; tested)
"""

from __future__ import annotations

import re
import warnings
import weakref
from dataclasses import dataclass

import torch

from dppo.scoring import as_scorer, model_device, scatter_completions


def best_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Bins (lists of item indices) of total length <= capacity; longest items first, each into the
    fullest bin it still fits. An item longer than `capacity` gets a bin of its own."""
    bins: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        fits = [b for b in range(len(bins)) if free[b] >= lengths[i]]
        if fits:
            b = min(fits, key=lambda k: free[k])
            bins[b].append(i)
            free[b] -= lengths[i]
        else:
            bins.append([i])
            free.append(capacity - lengths[i])
    return bins


def pack_rows(lengths: list[int], capacity: int, step: int = 8) -> list[list[int]]:
    """Best-fit-decreasing bins for the row width w <= capacity that processes the fewest token slots,
    rows x (fullest row): w runs from max(longest item, capacity / 2) to capacity in `step`s, and w = the longest
    item itself (one row per sequence at worst), so packing never processes more slots than padding the same items
    to their longest. A fixed w = capacity often leaves every row a few tokens short of the widest one; the search
    recovers them."""
    lo = max(max(lengths), capacity // 2)
    best, best_slots = None, None
    for width in sorted({max(lengths), *range(lo, capacity + 1, step), max(lo, capacity)}):
        bins = best_fit_decreasing(lengths, width)
        slots = len(bins) * max(sum(lengths[i] for i in b) for b in bins)
        if best_slots is None or slots < best_slots:
            best, best_slots = bins, slots
    return best


def token_groups(lengths: list[int], budget: int) -> list[list[int]]:
    """Groups of items, longest first, each of total length <= `budget` (an item longer than `budget` alone): the
    micro-batches of a one-row kernel (flash-attn's varlen: a micro-batch is one row of its sequences end to end, so
    a row width means nothing and `pack_rows`' width search is not needed)."""
    groups: list[list[int]] = []
    used = budget
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        if used + lengths[i] > budget:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += lengths[i]
    return groups


ROWS, ONE_ROW, ONE_SEQUENCE = "rows", "one_row", "one_sequence"  # how a kernel takes packed sequences


def attention_rows(attn_implementation: str) -> str:
    """How the attention kernel a model runs (its `config._attn_implementation`) can take packed sequences, decided
    from what transformers registered under that name (its mask builder and attention function), not from the name,
    so hub kernels and new names land where their behaviour puts them (docs/method.md §3.2):

      rows          several sequences a row: transformers' own sdpa and eager apply the block-diagonal causal mask it
                    builds from position ids restarting per sequence;
      one_row       a micro-batch is ONE row: flash-attn's varlen kernel (flash_attention_2/3/4, or a hub kernel such
                    as kernels-community/flash-attn2, registered with flash_attn_varlen_func), whose sequence
                    boundaries transformers derives from the position ids only for a batch of one row; several rows
                    would let each row's sequences attend to each other;
      one_sequence  anything else (flex_attention, paged kernels, hub kernels registered with sdpa's mask, a name
                    transformers does not know): nothing is known to separate two sequences of a row, so each row
                    holds one, its padding after it (never seen under causal attention).

    The one place dppo decides it."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS as masks
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as kernels

    mask, kernel = masks.get(attn_implementation), kernels.get(attn_implementation)
    if attn_implementation == "eager" and mask is masks["eager"]:  # the model's own eager attention, masked
        return ROWS
    if mask is masks["sdpa"] and kernel is kernels["sdpa"]:
        return ROWS
    if mask is masks["flash_attention_2"] and kernel is kernels["flash_attention_2"]:  # varlen, from position ids
        return ONE_ROW
    return ONE_SEQUENCE


# What transformers names the layers of config.layer_types that mix the sequence by attention alone (a mask keeps
# packed sequences apart in them); it names every other kind otherwise ("linear_attention": gated delta-nets and
# Mamba mixers; "conv": LFM2's short convolutions; "hybrid": Falcon-H1's attention and Mamba side by side).
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "chunked_attention", "attention"})
_STATEFUL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> stateful_layer(model), read once
_SAID: weakref.WeakSet = weakref.WeakSet()  # models whose one-sequence-a-row layout was said


def stateful_layer(model: torch.nn.Module) -> str | None:
    """The first layer of a causal LM that carries state along the sequence — recurrent, linear-attention,
    convolution or state-space — as "model.layers.0 (linear_attention: Qwen3_5DecoderLayer)", or None for a model
    whose layers mix the sequence by attention only. Read from what the model is, once per model: an entry of
    `config.layer_types` outside ATTENTION_LAYER_TYPES, else a torch Conv1d or RNN module (what every such layer
    holds: a causal convolution over the sequence or a recurrence), so a family transformers adds later is caught by
    its modules."""
    if model in _STATEFUL:
        return _STATEFUL[model]
    names = dict(model.named_modules())
    found = None
    for i, kind in enumerate(getattr(getattr(model, "config", None), "layer_types", None) or []):
        if kind not in ATTENTION_LAYER_TYPES:
            path = next((n for n in names if re.search(rf"(^|\.)layers\.{i}$", n)), f"layer {i}")
            found = f"{path} ({kind}: {type(names[path]).__name__ if path in names else 'layer'})"
            break
    if found is None:
        for name, module in names.items():
            if isinstance(module, (torch.nn.Conv1d, torch.nn.RNNBase)):
                parent = names.get(name.rpartition(".")[0], module)
                found = f"{name} ({type(module).__name__} in {type(parent).__name__})"
                break
    _STATEFUL[model] = found
    return found


def packed_rows(model: torch.nn.Module) -> tuple[str, str]:
    """(how the model takes packed sequences, why): `attention_rows` of its attention kernel, unless a layer carries
    state along the sequence (`stateful_layer`): then one sequence a row (ONE_SEQUENCE), whatever the kernel — said
    once per model. The one place dppo's trainer, its scorer and `DPPOTrainer` decide a layout (docs/method.md §3.2)."""
    attn = getattr(model.config, "_attn_implementation", None) or "sdpa"
    layer = stateful_layer(model)
    if layer is None:
        return attention_rows(attn), f"attn_implementation {attn}"
    why = f"{layer} carries state along the sequence"
    if model not in _SAID:
        _SAID.add(model)
        warnings.warn(f"packing one sequence a row: {why} (packed rows would carry one sequence's state into the "
                      f"next; docs/method.md §3.2)", stacklevel=3)
    return ONE_SEQUENCE, why


def _policy(scorer) -> torch.nn.Module:
    """The causal LM of a (possibly DDP-wrapped) TokenLogprobs."""
    return getattr(scorer, "module", scorer).policy


def padded_groups(lengths: list[int], budget: int) -> list[list[int]]:
    """Groups of items, longest first, each padded to its longest within `budget` token slots (rows x longest; an
    item longer than `budget` alone): the micro-batches of a one-sequence-per-row kernel."""
    groups: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def packed_layout(lengths: list[int], capacity: int, rows: str = ROWS) -> list[list[int]]:
    """Rows of sequence indices handed to the model, for how it takes packed sequences (`packed_rows`): rows:
    best-fit-decreasing rows of <= `capacity` tokens; one_row: every sequence in ONE row, longest first;
    one_sequence: a row per sequence, longest first."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    if rows == ONE_ROW:
        return [order]
    if rows == ONE_SEQUENCE:
        return [[i] for i in order]
    return pack_rows(lengths, capacity)


def check_layout(layout: list[list[int]], rows: str, why: str) -> None:
    """Refuse a layout the model would score wrongly (`packed_rows`: how it takes packed sequences, and why):
    several rows for a one-row kernel, or two sequences (or segments) in a row for a model that does not separate
    them."""
    if rows == ONE_ROW and len(layout) > 1:
        raise ValueError(f"{why} takes a packed micro-batch as one row, got {len(layout)} rows")
    if rows == ONE_SEQUENCE and any(len(row) > 1 for row in layout):
        raise ValueError(f"{why}: it does not separate sequences sharing a row (packing needs sdpa, eager or a "
                         f"flash-attn varlen kernel, and attention layers only), got a row of {max(map(len, layout))}")


# ------------------------------------------------------------------ an update's micro-batches, planned once
@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch: `layout` = the scored tensor's rows -> their segments -> sequence indices (the caller's row
    numbers). A segment is one prompt computation: one sequence, or with shared prompts one group's sequences (its
    prompt once). Padded (packing none): a row per sequence."""
    layout: list[list[list[int]]]

    @property
    def rows(self) -> list[int]:
        """The sequences scored, in layout order."""
        return [i for row in self.layout for seg in row for i in seg]

    @property
    def segments(self) -> list[list[int]]:
        return [seg for row in self.layout for seg in row]

    def segment_lengths(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]
                        ) -> list[tuple[int, list[int]]]:
        """(prompt length, completion lengths) of each prompt computation (what its FLOPs count, `dppo.cost`)."""
        return [(len(prompt_ids[seg[0]]), [len(completion_ids[i]) for i in seg]) for seg in self.segments]

    def local_layout(self) -> list[list[list[int]]]:
        """The layout with each sequence's position in `rows` (what a scorer given the rows' ids indexes)."""
        where = {i: n for n, i in enumerate(self.rows)}
        return [[[where[i] for i in seg] for seg in row] for row in self.layout]


@dataclass(frozen=True)
class MicroBatchPlan:
    """How an update lays out and splits its rows (docs/method.md §3.2-3.3), fixed for a run by the packing mode,
    the attention kernel and the token budgets. `micro_batches` returns each micro-batch with the rows its scorer
    lays out, so what is scored is what was planned:

      none    `micro_batch_size` sequences a micro-batch, padded to the longest;
      dense   best-fit-decreasing rows of <= `capacity` tokens over the whole minibatch (`pack_rows`, so only its
              last rows are part-full), whole rows grouped into micro-batches of <= `token_budget` tokens; with a
              one-row kernel (flash-attn) the sequences grouped greedily into micro-batches of <= `token_budget`
              tokens (`token_groups`), each micro-batch one row; with a kernel that separates no sequences
              (`attention_rows` one_sequence) a row per sequence, micro-batches of <= `token_budget` slots
              (`padded_groups`);
      shared  as dense on sdpa / eager, each group's sequences one segment (its prompt once, §3.3). Another kernel
              cannot share a prompt (that needs a 4-D mask), nor can a model with a layer that carries state along
              the sequence: `for_run` plans dense then, with a warning."""
    packing: str  # "none" | "dense" | "shared"
    kernel_rows: str  # how the model takes packed sequences (`packed_rows`)
    capacity: int  # tokens of a packed row (pack_capacity)
    token_budget: int  # tokens of a packed micro-batch (micro_batch_tokens)
    micro_batch_size: int  # sequences of a padded micro-batch

    @classmethod
    def for_run(cls, packing: str, rows: tuple[str, str], capacity: int, token_budget: int,
                micro_batch_size: int) -> "MicroBatchPlan":
        """The plan of a run whose model takes packed sequences as `rows` says (`packed_rows`: the kind, and why)."""
        kernel_rows, why = rows
        if packing == "shared" and kernel_rows != ROWS:
            warnings.warn(f"packing 'shared' with {why} packs densely (sharing a prompt between sequences needs the "
                          "4-D mask sdpa or eager applies, and attention layers only; docs/method.md §3.3)",
                          stacklevel=3)
            packing = "dense"
        return cls(packing, kernel_rows, capacity, token_budget, micro_batch_size)

    def segments(self, rows: list[int], groups: list[int]) -> list[list[int]]:
        """`rows` as prompt computations: grouped by `groups[i]` (the prompt row i answers) when shared, in order of
        first appearance; else one each."""
        if self.packing != "shared":
            return [[i] for i in rows]
        return [[rows[j] for j in seg] for seg in group_segments([groups[i] for i in rows])]

    def micro_batches(self, rows: list[int], prompt_lengths: list[int], completion_lengths: list[int],
                      groups: list[int]) -> list[MicroBatch]:
        """The micro-batches of `rows` (indices into the lengths and `groups`)."""
        segs = self.segments(rows, groups)
        size = [prompt_lengths[s[0]] + sum(completion_lengths[i] for i in s) for s in segs]
        if self.packing == "none":
            step = self.micro_batch_size
            return [MicroBatch([[s] for s in segs[k: k + step]]) for k in range(0, len(segs), step)]
        if self.kernel_rows == ONE_ROW:
            return [MicroBatch([[segs[j] for j in g]]) for g in token_groups(size, self.token_budget)]
        if self.kernel_rows == ONE_SEQUENCE:
            return [MicroBatch([[segs[j]] for j in g]) for g in padded_groups(size, self.token_budget)]
        out, cur, tokens = [], [], 0
        for b in pack_rows(size, self.capacity):
            n = sum(size[j] for j in b)
            if cur and tokens + n > self.token_budget:
                out.append(MicroBatch(cur))
                cur, tokens = [], 0
            cur.append([segs[j] for j in b])
            tokens += n
        return out + ([MicroBatch(cur)] if cur else [])


def packed_completion_logprobs(model, prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int,
                               temperature: float, capacity: int, rows: list[list[int]] | None = None
                               ) -> tuple[torch.Tensor, int]:
    """(logp [N, Tc] of each completion token in the input order, token slots processed).

    One forward of the decoder over the packed rows — `rows` (each a list of sequence indices: a `MicroBatch`'s
    layout with its segments flattened), or `packed_layout` for the model's attention kernel — then the selective log-softmax at the completion
    positions (`scoring.TokenLogprobs`; `model` a causal LM or a wrapped TokenLogprobs); gradients flow outside
    `torch.no_grad()`."""
    lengths = [len(p) + len(c) for p, c in zip(prompt_ids, completion_ids)]
    scorer = as_scorer(model)
    kind, why = packed_rows(_policy(scorer))
    bins = packed_layout(lengths, capacity, kind) if rows is None else rows
    check_layout(bins, kind, why)
    width = max(sum(lengths[i] for i in b) for b in bins)
    ids = torch.full((len(bins), width), pad_id, dtype=torch.long)
    pos = torch.zeros((len(bins), width), dtype=torch.long)
    where: list[tuple[int, int]] = [(0, 0)] * len(lengths)  # sequence -> (row, offset)
    for r, b in enumerate(bins):
        off = 0
        for i in b:
            ids[r, off: off + lengths[i]] = torch.tensor(prompt_ids[i] + completion_ids[i])
            pos[r, off: off + lengths[i]] = torch.arange(lengths[i])
            where[i] = (r, off)
            off += lengths[i]
        pos[r, off:] = torch.arange(width - off)  # trailing padding: a block of its own, never read
    device = model_device(model)
    ids, pos = ids.to(device), pos.to(device)
    rows, cols, out_n, out_t = [], [], [], []
    for i, (r, off) in enumerate(where):
        p, c = len(prompt_ids[i]), len(completion_ids[i])
        t = torch.arange(c)
        rows.append(torch.full((c,), r))
        cols.append(off + p - 1 + t)  # the hidden state that predicts completion token t
        out_n.append(torch.full((c,), i))
        out_t.append(t)
    rows, cols, out_n, out_t = (torch.cat(x).to(device) for x in (rows, cols, out_n, out_t))
    logp = scorer(ids, rows, cols, temperature, position_ids=pos)  # one decoder forward over the packed rows
    return scatter_completions(logp, out_n, out_t, len(lengths), max(len(c) for c in completion_ids)), \
        len(bins) * width


def group_segments(groups: list[int]) -> list[list[int]]:
    """Sequence indices grouped by their group id (the prompt they answer), in order of first appearance."""
    out: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        out.setdefault(g, []).append(i)
    return list(out.values())


def shared_prompt_logprobs(model, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                           groups: list[int] | None, pad_id: int, temperature: float, capacity: int,
                           layout: list[list[list[int]]] | None = None) -> tuple[torch.Tensor, int]:
    """(logp [N, Tc] of each completion token in the input order, token slots processed), each group's prompt
    computed once (docs/method.md §3.3).

    A group (the kept completions of one prompt; `groups[i]` names sequence i's) becomes one segment
    [prompt, o_1, ..., o_k]; segments are packed into rows of <= `capacity` tokens by best-fit-decreasing, or as
    `layout` gives them (rows -> segments -> sequence indices, a `MicroBatchPlan`'s; `groups` unused). Position
    ids of o_j continue from the prompt (P, P+1, ...), and a 4-D mask lets token a see token b iff they share a
    segment, b is not after a, and b is a prompt token or in a's completion: the same logits as scoring each
    (prompt, o_j) alone. The log-prob of o_j's first token is read at the prompt's last position (shared by the
    group); of token t >= 1 at o_j's token t - 1. sdpa gets a boolean mask, eager an additive one; flash-attn's
    varlen kernel cannot express a shared prefix (it would need a prefix-sharing / cascade kernel), so
    any other kernel is refused (`attention_rows`), as is a model with a layer that carries state along the sequence
    (`packed_rows`: a completion would carry it into the next)."""
    scorer = as_scorer(model)
    policy = _policy(scorer)
    attn = getattr(policy.config, "_attn_implementation", None) or "sdpa"
    kind, why = packed_rows(policy)
    if kind != ROWS:
        raise ValueError(f"packing 'shared' needs attn_implementation sdpa or eager and attention layers only, got "
                         f"{why} (it cannot share a prompt between sequences)")
    segments = group_segments(groups) if layout is None else [seg for row in layout for seg in row]
    seg_len = [len(prompt_ids[seg[0]]) + sum(len(completion_ids[i]) for i in seg) for seg in segments]
    if layout is None:
        bins = pack_rows(seg_len, capacity)
    else:  # row r holds the next len(layout[r]) segments
        ends = [sum(len(row) for row in layout[: r + 1]) for r in range(len(layout))]
        bins = [list(range(end - len(row), end)) for row, end in zip(layout, ends)]
    width = max(sum(seg_len[s] for s in b) for b in bins)
    ids = torch.full((len(bins), width), pad_id, dtype=torch.long)
    pos = torch.zeros((len(bins), width), dtype=torch.long)
    seg_of = torch.full((len(bins), width), -1, dtype=torch.long)  # segment of each slot (-1: padding)
    part = torch.full((len(bins), width), -2, dtype=torch.long)  # -1 prompt, j completion j, -2 padding
    rows, cols, targets, out_n, out_t = [], [], [], [], []
    for r, b in enumerate(bins):
        off = 0
        for s in b:
            seg = segments[s]
            prompt = prompt_ids[seg[0]]
            p = len(prompt)
            ids[r, off: off + p] = torch.tensor(prompt)
            pos[r, off: off + p] = torch.arange(p)
            seg_of[r, off: off + p], part[r, off: off + p] = s, -1
            start = off + p
            for j, i in enumerate(seg):
                c = len(completion_ids[i])
                ids[r, start: start + c] = torch.tensor(completion_ids[i])
                pos[r, start: start + c] = torch.arange(p, p + c)
                seg_of[r, start: start + c], part[r, start: start + c] = s, j
                t = torch.arange(c)
                rows.append(torch.full((c,), r))
                cols.append(torch.where(t == 0, off + p - 1, start + t - 1))  # the position that predicts token t
                targets.append(torch.tensor(completion_ids[i]))
                out_n.append(torch.full((c,), i))
                out_t.append(t)
                start += c
            off = start
        pos[r, off:] = torch.arange(width - off)
    idx = torch.arange(width)
    causal = idx[None, :] <= idx[:, None]  # [W, W]: key b not after query a
    same = seg_of[:, :, None] == seg_of[:, None, :]  # [R, W, W]
    visible = (part[:, None, :] == -1) | (part[:, None, :] == part[:, :, None])
    mask = (same & causal & visible) | torch.eye(width, dtype=torch.bool)  # padding sees itself: no empty rows
    device = model_device(model)
    mask = mask[:, None].to(device)
    if attn == "eager":  # additive
        mask = torch.zeros(mask.shape, device=device).masked_fill_(~mask, torch.finfo(torch.float32).min)
    rows, cols, targets, out_n, out_t = (torch.cat(x).to(device) for x in (rows, cols, targets, out_n, out_t))
    logp = scorer(ids.to(device), rows, cols, temperature, attention_mask=mask, position_ids=pos.to(device),
                  targets=targets)
    return scatter_completions(logp, out_n, out_t, len(completion_ids), max(len(c) for c in completion_ids)), \
        len(bins) * width


def pack_padded(input_ids: torch.Tensor, attention_mask: torch.Tensor, capacity: int,
                rows: str = ROWS, pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The padded rows of a trainer that pads (TRL: left-padded prompt + right-padded completion, each row's
    attention_mask one run of ones) packed densely, as `packed_completion_logprobs` packs. input_ids,
    attention_mask [n, T] -> (ids [R, W], position_ids [R, W] restarting at 0 per sequence, slot [n, T] long: the
    flat index r W + c of each real token in the packed rows, -1 at padding), the rows laid out for how the model
    takes packed sequences (`packed_rows`): rows, best-fit-decreasing rows of <= `capacity` tokens; one_row (a varlen
    kernel: one row a forward), groups of <= `capacity` tokens end to end, each a row the caller forwards alone, so no
    forward holds more than `capacity` tokens; one_sequence, a row per sequence."""
    real = attention_mask.bool()
    lengths = real.sum(1).tolist()
    sizes = [max(n, 1) for n in lengths]
    bins = token_groups(sizes, capacity) if rows == ONE_ROW else packed_layout(sizes, capacity, rows)
    width = max(sum(lengths[i] for i in b) for b in bins) or 1
    ids = torch.full((len(bins), width), pad_id, dtype=input_ids.dtype, device=input_ids.device)
    pos = torch.zeros((len(bins), width), dtype=torch.long, device=input_ids.device)
    slot = torch.full(input_ids.shape, -1, dtype=torch.long, device=input_ids.device)
    for r, b in enumerate(bins):
        off = 0
        for i in b:
            n = lengths[i]
            ids[r, off:off + n] = input_ids[i][real[i]]
            pos[r, off:off + n] = torch.arange(n, device=input_ids.device)
            slot[i, real[i]] = r * width + off + torch.arange(n, device=input_ids.device)
            off += n
        pos[r, off:] = torch.arange(width - off, device=input_ids.device)  # trailing padding: a block of its own
    return ids, pos, slot
