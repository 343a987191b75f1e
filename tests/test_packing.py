"""Packed (padding-free, block-diagonal) log-probs and gradients equal padded ones (docs/method.md §3)."""

import random

import pytest
import torch

from dppo.packing import best_fit_decreasing, pack_rows, packed_completion_logprobs, shared_prompt_logprobs
from dppo.scoring import completion_logprobs


def test_best_fit_decreasing_respects_capacity_and_covers_every_item():
    lengths = [70, 10, 45, 30, 25, 60, 5, 55, 40, 100]
    bins = best_fit_decreasing(lengths, 100)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 100 for b in bins)
    assert len(bins) == 5  # sum = 440: the lower bound is 5 bins of 100
    assert best_fit_decreasing([150, 20], 100) == [[0], [1]]  # too long: a bin of its own



def test_pack_rows_never_processes_more_slots_than_padding():
    """Rows x (fullest row) <= items x (longest item), for any lengths: the width search includes the longest item's
    own width. [69, 74, 65, 63, 78] at capacity 256 took 394 slots (vs 390 padded) when the search started at 128."""
    def slots(lengths, capacity):
        bins = pack_rows(lengths, capacity)
        assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
        return len(bins) * max(sum(lengths[i] for i in b) for b in bins)

    assert slots([69, 74, 65, 63, 78], 256) <= 5 * 78
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        lengths = torch.randint(5, 120, (int(torch.randint(1, 12, (1,), generator=gen)),), generator=gen).tolist()
        assert slots(lengths, 256) <= len(lengths) * max(lengths), lengths

def _random_sequences(vocab, n, gen):
    p = [torch.randint(3, vocab, (int(torch.randint(3, 30, (1,), generator=gen)),), generator=gen).tolist()
         for _ in range(n)]
    c = [torch.randint(3, vocab, (int(torch.randint(1, 40, (1,), generator=gen)),), generator=gen).tolist()
         for _ in range(n)]
    return p, c


def _larger_qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=512, hidden_size=256, intermediate_size=704, num_hidden_layers=3,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=32, max_position_embeddings=512,
                      pad_token_id=0, attn_implementation="sdpa")
    return Qwen3ForCausalLM(cfg).eval()


def _logprob_tolerance(reference: torch.Tensor) -> float:
    """Agreement required of two layouts: float64 is exact up to ~1e-15 (1e-10 allowed), so a wrong mask, position or
    row fails it on any machine; float32 rounds differently per layout by up to ~0.4e-6 of the largest |log p|
    measured (6.7e-6 at |log p| = 17, which kernel and thread count move), so it gets 4e-6 of that (the 1e-5 of
    docs/method.md §3.2 at |log p| ~ 2.5, scaling with it) rather than a constant tuned on one model."""
    if reference.dtype == torch.float64:
        return 1e-10
    return 4e-6 * max(1.0, reference.abs().max().item())


def _model(embedded, which: str, dtype: torch.dtype, attn: str):
    import copy

    if dtype == torch.float64 and attn == "eager":  # Qwen3's eager attention takes its softmax in float32
        pytest.skip("eager attention computes its softmax in float32 in any dtype: checked in fp32")

    model = copy.deepcopy(embedded[0]) if which == "embedded" else _larger_qwen3()
    return model.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("which", ["embedded", "random_larger"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_equals_padded_logprobs_and_gradients(embedded, which, attn, dtype):
    model = _model(embedded, which, dtype, attn)
    model.config._attn_implementation = attn
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    p, c = _random_sequences(vocab, 12, gen)
    try:
        padded = completion_logprobs(model, p, c, 0, 0.8)
        packed, slots = packed_completion_logprobs(model, p, c, 0, 0.8, capacity=128)
        assert slots < len(p) * max(len(a) + len(b) for a, b in zip(p, c))  # fewer slots than padding
        tol = _logprob_tolerance(padded)
        assert (packed - padded).abs().max().item() <= tol
        # one at a time
        alone = torch.stack([torch.nn.functional.pad(completion_logprobs(model, [p[i]], [c[i]], 0, 0.8)[0],
                                                     (0, packed.shape[1] - len(c[i]))) for i in range(len(p))])
        assert (packed - alone).abs().max().item() <= tol
        # gradients of the same weighted loss
        w = torch.rand(len(p), generator=gen, dtype=dtype)
        grads = []
        for fn in (lambda: completion_logprobs(model, p, c, 0, 0.8),
                   lambda: packed_completion_logprobs(model, p, c, 0, 0.8, capacity=128)[0]):
            model.zero_grad(set_to_none=True)
            (fn().sum(1) * w).sum().backward()
            grads.append(torch.cat([q.grad.reshape(-1) for q in model.parameters() if q.grad is not None]))
        model.zero_grad(set_to_none=True)
        assert ((grads[0] - grads[1]).norm() / grads[0].norm()).item() <= (1e-10 if dtype == torch.float64 else 1e-5)
    finally:
        model.config._attn_implementation = "sdpa"


def _groups(vocab, gen, n_groups=6, max_kept=5):
    """Rows of several prompts, 1..max_kept kept completions each (as after completion pruning), shuffled."""
    p, c, g = [], [], []
    for k in range(n_groups):
        prompt = torch.randint(3, vocab, (int(torch.randint(3, 30, (1,), generator=gen)),), generator=gen).tolist()
        for _ in range(1 + k % max_kept):  # 1, 2, ... kept completions
            p.append(prompt)
            c.append(torch.randint(3, vocab, (int(torch.randint(1, 40, (1,), generator=gen)),), generator=gen).tolist())
            g.append(k)
    perm = torch.randperm(len(p), generator=gen).tolist()
    return [p[i] for i in perm], [c[i] for i in perm], [g[i] for i in perm]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("which", ["embedded", "random_larger"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_shared_prompt_rows_equal_padded_logprobs_and_gradients(embedded, which, attn, dtype):
    """Each group's prompt once, its completions attending to it (docs/method.md §3.3): the padded path's
    log-probs and gradients, in fewer token slots than dense packing."""
    model = _model(embedded, which, dtype, attn)
    model.config._attn_implementation = attn
    gen = torch.Generator().manual_seed(2)
    p, c, g = _groups(model.config.vocab_size, gen)
    w = torch.rand(len(p), generator=gen, dtype=dtype)
    try:
        results = []
        for fn in (lambda: (completion_logprobs(model, p, c, 0, 0.8), 0),
                   lambda: packed_completion_logprobs(model, p, c, 0, 0.8, capacity=128),
                   lambda: shared_prompt_logprobs(model, p, c, g, 0, 0.8, capacity=128)):
            model.zero_grad(set_to_none=True)
            logp, slots = fn()
            (logp.sum(1) * w).sum().backward()
            results.append((logp.detach(), slots, torch.cat([q.grad.reshape(-1) for q in model.parameters()])))
        (padded, _, g_pad), (_, dense_slots, _), (shared, shared_slots, g_shared) = results
        assert (shared - padded).abs().max().item() <= _logprob_tolerance(padded)
        # float64 gradients of the shared layout agree to ~4e-8 (measured; the log-probs to 1e-10): the prompt's
        # gradient sums its completions' contributions in another order, with cancellation. 1e-6 keeps any wrong
        # mask or position (>= 1e-2) out while no rounding decides it
        assert ((g_shared - g_pad).norm() / g_pad.norm()).item() <= (1e-6 if dtype == torch.float64 else 1e-5)
        assert shared_slots < dense_slots  # the prompts are computed once per group
        assert shared_slots >= sum(len(x) for x in c) + sum(len(p[g.index(k)]) for k in set(g))
    finally:
        model.zero_grad(set_to_none=True)
        model.config._attn_implementation = "sdpa"


def test_shared_prompt_layout_refuses_flash_attention(embedded):
    model = embedded[0]
    model.config._attn_implementation = "flash_attention_2"
    try:
        with pytest.raises(ValueError, match="packing 'shared' needs attn_implementation sdpa or eager"):
            shared_prompt_logprobs(model, [[5, 6]], [[7]], [0], 0, 1.0, 64)
    finally:
        model.config._attn_implementation = "sdpa"


def test_token_groups_for_a_one_row_kernel():
    """flash-attn takes a micro-batch as one row: the rows are grouped greedily (longest first) into micro-batches of
    <= micro_batch_tokens, each row once, an over-long row alone — and the trainer plans its dense micro-batches
    this way under flash_attention_2 (sdpa keeps pack_rows' bins)."""
    import types

    from dppo.config import TrainConfig
    from dppo.packing import token_groups
    from dppo.trainer import Trainer

    rng = random.Random(0)
    lengths = [rng.randint(5, 300) for _ in range(60)] + [900]
    groups = token_groups(lengths, 512)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in g) <= 512 or len(g) == 1 for g in groups)
    assert [900] in [[lengths[i] for i in g] for g in groups]
    order = [lengths[i] for g in groups for i in g]
    assert order == sorted(order, reverse=True)
    assert all(sum(lengths[i] for i in a) + lengths[b[0]] > 512 for a, b in zip(groups, groups[1:]))  # greedy
    p_ids = [[1] * 10 for _ in lengths]
    c_ids = [[2] * (n - 10) for n in lengths]
    rows = list(range(0, len(lengths), 2))
    for attn in ("flash_attention_2", "sdpa"):
        stub = types.SimpleNamespace(packing="dense", cfg=TrainConfig(attn_implementation=attn, packing="dense",
                                                                      pack_capacity=256, micro_batch_tokens=512))
        plan = Trainer.micro_batches(stub, rows, c_ids, p_ids)
        assert sorted(i for mb in plan for i in mb) == rows
        want = [[rows[j] for j in g] for g in token_groups([lengths[i] for i in rows], 512)]
        assert (plan == want) == (attn == "flash_attention_2"), attn
