"""Packed (padding-free, block-diagonal) log-probs and gradients equal padded ones (docs/method.md §3)."""

import pytest
import torch

from dppo.packing import best_fit_decreasing, packed_completion_logprobs
from dppo.scoring import completion_logprobs


def test_best_fit_decreasing_respects_capacity_and_covers_every_item():
    lengths = [70, 10, 45, 30, 25, 60, 5, 55, 40, 100]
    bins = best_fit_decreasing(lengths, 100)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 100 for b in bins)
    assert len(bins) == 5  # sum = 440: the lower bound is 5 bins of 100
    assert best_fit_decreasing([150, 20], 100) == [[0], [1]]  # too long: a bin of its own


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


@pytest.mark.parametrize("which", ["embedded", "random_larger"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_equals_padded_logprobs_and_gradients(embedded, which, attn):
    model = embedded[0] if which == "embedded" else _larger_qwen3()
    model.config._attn_implementation = attn
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1)
    p, c = _random_sequences(vocab, 12, gen)
    try:
        padded = completion_logprobs(model, p, c, 0, 0.8)
        packed, slots = packed_completion_logprobs(model, p, c, 0, 0.8, capacity=128)
        assert slots < len(p) * max(len(a) + len(b) for a, b in zip(p, c))  # fewer slots than padding
        assert (packed - padded).abs().max().item() <= 1e-5
        # one at a time
        alone = torch.stack([torch.nn.functional.pad(completion_logprobs(model, [p[i]], [c[i]], 0, 0.8)[0],
                                                     (0, packed.shape[1] - len(c[i]))) for i in range(len(p))])
        assert (packed - alone).abs().max().item() <= 1e-5
        # gradients of the same weighted loss
        w = torch.rand(len(p), generator=gen)
        grads = []
        for fn in (lambda: completion_logprobs(model, p, c, 0, 0.8),
                   lambda: packed_completion_logprobs(model, p, c, 0, 0.8, capacity=128)[0]):
            model.zero_grad(set_to_none=True)
            (fn().sum(1) * w).sum().backward()
            grads.append(torch.cat([q.grad.reshape(-1) for q in model.parameters() if q.grad is not None]))
        model.zero_grad(set_to_none=True)
        assert ((grads[0] - grads[1]).norm() / grads[0].norm()).item() <= 1e-5
    finally:
        model.config._attn_implementation = "sdpa"
