"""Depth growth of the embedded model (dppo/model.py `grow_depth`): the grown model computes exactly the source
model's function, has twice its layers, and its inserted layers train away from the identity under the warm start."""

import torch

from dppo.model import EMBEDDED_SPEC, build_untrained, grow_depth, warm_start

ARCH = {**EMBEDDED_SPEC["arch"], "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "head_dim": 16}
SMALL = {**EMBEDDED_SPEC, "arch": ARCH}
LARGE = {**EMBEDDED_SPEC, "arch": {**ARCH, "num_hidden_layers": 4}}
ZEROED = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def _grown():
    small, tok = build_untrained(SMALL, seed=1)
    with torch.no_grad():  # non-trivial norms too, so the copies of every weight are exercised
        for name, p in small.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    large, _ = build_untrained(LARGE, seed=2)
    grow_depth(small, large)
    return small.eval(), large.eval(), tok


def test_grown_model_computes_the_source_function():
    small, large, tok = _grown()
    assert large.config.num_hidden_layers == len(large.model.layers) == 2 * len(small.model.layers) == 4
    ids = torch.randint(3, len(tok), (3, 17), generator=torch.Generator().manual_seed(0))
    attn = torch.ones_like(ids)
    attn[0, :5] = 0  # left padding, as in generation
    with torch.no_grad():
        want = small(input_ids=ids, attention_mask=attn).logits
        got = large(input_ids=ids, attention_mask=attn).logits
    assert want.abs().max() > 0.1  # not a degenerate function
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    # the even layers are the source's layers, the odd ones copies with the two output projections zeroed
    for i, layer in enumerate(small.model.layers):
        copy, new = large.model.layers[2 * i].state_dict(), large.model.layers[2 * i + 1].state_dict()
        for name, w in layer.state_dict().items():
            assert torch.equal(copy[name], w)
            assert torch.equal(new[name], torch.zeros_like(w) if name in ZEROED else w)
    assert large.lm_head.weight.data_ptr() == large.model.embed_tokens.weight.data_ptr()  # still tied
    assert torch.equal(large.model.embed_tokens.weight, small.model.embed_tokens.weight)


def test_inserted_layers_train():
    _, large, tok = _grown()
    losses = warm_start(large, tok, steps=3, batch_size=4, lr=1e-3, warmup=1, weight_decay=0.0, error_rate=0.15,
                        seed=0)
    assert all(torch.isfinite(torch.tensor(losses)))
    for layer in large.model.layers[1::2]:
        assert layer.self_attn.o_proj.weight.abs().max() > 0
        assert layer.mlp.down_proj.weight.abs().max() > 0
