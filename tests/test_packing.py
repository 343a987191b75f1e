"""Packed (padding-free, block-diagonal) log-probs and gradients equal padded ones (docs/method.md §3)."""

import random

import pytest
import torch

from dppo.packing import (ONE_ROW, attention_rows, best_fit_decreasing, pack_rows, packed_completion_logprobs,
                          shared_prompt_logprobs)
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
    <= micro_batch_tokens, each row once, an over-long row alone — and the plan lays out its dense micro-batches
    this way under flash_attention_2, one row each (sdpa keeps pack_rows' rows)."""
    from dppo.packing import MicroBatchPlan, token_groups

    rng = random.Random(0)
    lengths = [rng.randint(5, 300) for _ in range(60)] + [900]
    groups = token_groups(lengths, 512)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in g) <= 512 or len(g) == 1 for g in groups)
    assert [900] in [[lengths[i] for i in g] for g in groups]
    order = [lengths[i] for g in groups for i in g]
    assert order == sorted(order, reverse=True)
    assert all(sum(lengths[i] for i in a) + lengths[b[0]] > 512 for a, b in zip(groups, groups[1:]))  # greedy
    rows = list(range(0, len(lengths), 2))
    for attn in ("flash_attention_2", "sdpa"):
        plan = MicroBatchPlan.for_run("dense", (attention_rows(attn), attn), capacity=256, token_budget=512,
                                      micro_batch_size=4)
        micro = plan.micro_batches(rows, [10] * len(lengths), [n - 10 for n in lengths], list(range(len(lengths))))
        assert sorted(i for mb in micro for i in mb.rows) == rows
        want = [[rows[j] for j in g] for g in token_groups([lengths[i] for i in rows], 512)]
        assert ([mb.rows for mb in micro] == want) == (attn == "flash_attention_2"), attn
        assert all(len(mb.layout) == 1 for mb in micro) or attn == "sdpa"  # one row a micro-batch
    with pytest.warns(UserWarning, match="packs densely"):
        assert MicroBatchPlan.for_run("shared", (ONE_ROW, "flash_attention_2"), 256, 512, 4).packing == "dense"


@pytest.mark.parametrize("packing,capacity", [("dense", 80), ("shared", 120), ("none", 80)])
def test_the_update_scores_the_rows_it_planned(tmp_path, embedded, packing, capacity):
    """Trainer.update (off-policy, with a reference: old, reference and update passes) over rows of varied lengths,
    three draws: every micro-batch the scorer receives is one its plan made, and the token rows handed to the model
    are that plan's layout, row for row (each row its segments end to end: [prompt, completion] dense, [prompt,
    completions...] shared, then padding) — nothing is re-packed after planning. A scorer that packed its
    micro-batch again (as the trainer did before) hands other rows for some of these draws (shown failing)."""
    from dppo.config import TrainConfig
    from dppo.rollout import RolloutBatch
    from dppo.scoring import TokenLogprobs
    from dppo.trainer import Timer, Trainer

    G, n_prompts = 4, 8
    tr = Trainer(TrainConfig(output_dir=str(tmp_path), train_size=16, eval_size=4, prompts_per_step=n_prompts,
                             group_size=G, packing=packing, pack_capacity=capacity,
                             micro_batch_tokens=2 * capacity + 40, micro_batch_size=3, num_minibatches=1, ppo_epochs=2,
                             kl_coef=0.05, max_new_tokens=32))
    pad = tr.tok.pad_token_id
    planned, scored, rows_seen = [], [], []
    plan_micro_batches, score, forward = tr.plan.micro_batches, Trainer.score, TokenLogprobs.forward

    def record_plan(*args):
        out = plan_micro_batches(*args)
        planned.extend(out)
        return out

    def record_score(self, model, p_ids, c_ids, mbatch):
        scored.append((mbatch, p_ids, c_ids))
        return score(self, model, p_ids, c_ids, mbatch)

    def record_forward(self, input_ids, *args, **kwargs):
        rows_seen.append(input_ids.detach().cpu())
        return forward(self, input_ids, *args, **kwargs)

    object.__setattr__(tr.plan, "micro_batches", record_plan)
    Trainer.score, TokenLogprobs.forward = record_score, record_forward
    try:
        for seed in range(3):
            rng = random.Random(seed)
            prompts = [[rng.randint(3, 300) for _ in range(rng.randint(4, 12))] for _ in range(n_prompts)]
            completions = [[rng.randint(3, 300) for _ in range(rng.randint(1, 30))] for _ in range(n_prompts * G)]
            batch = RolloutBatch([prompts[r // G] for r in range(n_prompts * G)], completions,
                                 [None] * len(completions), [""] * len(completions), [False] * len(completions))
            kept = [r for r in range(n_prompts * G) if (r + seed) % 5]  # a pruning outcome: some rows dropped
            tr.update(batch, kept, torch.randn(n_prompts * G), torch.ones(len(kept), dtype=torch.float64),
                      float(len(kept)), Timer())
    finally:
        Trainer.score, TokenLogprobs.forward = score, forward
    assert len(scored) == len(rows_seen) > 3 * 4  # old + reference + 2 epochs of update passes, three times
    assert max(len(mb.layout) for mb, _, _ in scored) > 1
    for (mbatch, p_ids, c_ids), ids in zip(scored, rows_seen):
        assert any(mbatch is mb for mb in planned)  # a micro-batch the plan made (or the dummy, never here)
        if packing == "none":
            want = [p_ids[s[0]] + c_ids[s[0]] for row in mbatch.layout for s in row]
        else:
            want = [[t for s in row for t in p_ids[s[0]] + [u for i in s for u in c_ids[i]]] for row in mbatch.layout]
        assert ids.shape[0] == len(want)
        for got, row in zip(ids.tolist(), want):
            if packing == "none":  # padded: the sequence's tokens in order, padding around them
                assert [t for t in got if t != pad] == row
            else:
                assert got[: len(row)] == row and set(got[len(row):]) <= {pad}
