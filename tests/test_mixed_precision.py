"""bf16 the standard way: fp32 master weights and optimizer state, bf16 compute (accelerate mixed precision).
At the paper's lr 1e-6 every weight with a gradient moves (pure bf16 weights would round most updates away), and a
bf16 step follows the fp32 one. The batch is fixed by construction (tests/dist_worker.py `FixedRollout`), so no
verdict depends on what this machine's model happens to sample."""

import torch

from dist_worker import FixedRollout

from dppo.config import TrainConfig
from dppo.scoring import completion_logprobs
from dppo.trainer import Timer, Trainer

SMALL = dict(train_size=8, eval_size=2, prompts_per_step=4, group_size=4, max_new_tokens=32, warmup_steps=0,
             eval_every=1000, save_every=1000)
ADAM_EPS = 1e-8  # torch AdamW's default, which the trainer keeps


def _trainer(path, **fields) -> Trainer:
    tr = Trainer(TrainConfig(output_dir=str(path), **{**SMALL, **fields}))
    FixedRollout.install(tr)
    return tr


def _batch(tr):
    keys = list(range(4))
    batch, rollouts = tr._rollout(keys, Timer())
    rewards = rollouts.rewards
    rewards[:, 0], rewards[:, 1] = 1.0, 0.0  # every group informative
    adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).reshape(-1)
    return batch, adv


def _update(tr, batch, adv) -> dict[str, torch.Tensor]:
    """One Trainer.update on every row; returns the gradient the optimizer stepped with (after clipping)."""
    grads = {}

    def keep(optimizer, args, kwargs):
        if not grads:
            grads.update({k: p.grad.detach().clone() for k, p in tr.policy.named_parameters() if p.grad is not None})

    handle = tr.opt.optimizer.register_step_pre_hook(keep)
    rows = list(range(len(adv)))
    tr.update(batch, rows, adv, torch.ones(len(rows), dtype=torch.float64), float(len(rows)), Timer())
    handle.remove()
    return grads


def test_bf16_keeps_fp32_master_weights_so_every_weight_moves_at_lr_1e6(tmp_path, embedded):
    tr = _trainer(tmp_path, dtype="bfloat16", lr=1e-6)
    assert all(p.dtype == torch.float32 for p in tr.model.parameters())
    batch, adv = _batch(tr)
    before = {k: v.detach().clone() for k, v in tr.policy.named_parameters()}
    grads = _update(tr, batch, adv)
    # AdamW's first step is lr g / (|g| + eps) per element. Every element where that exceeds twice the fp32 spacing
    # of its weight must have moved; elements with |g| << eps (e.g. embedding rows of tokens the batch never makes
    # likely) legitimately stay, so the count is over the elements that must move, not over all of them.
    must = moved = total = 0
    for name, p in tr.policy.named_parameters():
        w, g = before[name], grads[name]
        step = 1e-6 * g.abs() / (g.abs() + ADAM_EPS)
        spacing = torch.finfo(torch.float32).eps * w.abs().clamp_min(torch.finfo(torch.float32).tiny)
        need = step > 2 * spacing
        must += int(need.sum())
        moved += int((p.detach() != w)[need].sum())
        total += p.numel()
    assert must >= 0.5 * total, (must, total)  # most weights have a gradient well above eps
    assert moved == must, (moved, must)

    # the same step with the weights themselves in bf16 (what `dtype: bfloat16` used to mean) loses most of it
    pure = {k: v.to(torch.bfloat16) for k, v in before.items()}
    params = [torch.nn.Parameter(v.clone()) for v in pure.values()]
    for p, name in zip(params, pure):
        p.grad = grads[name].to(torch.bfloat16)
    torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0).step()
    moved_bf16 = sum(int((p.detach() != v).sum()) for p, v in zip(params, pure.values()))
    assert moved_bf16 < 0.5 * must, (moved_bf16, must)


def test_bf16_step_follows_the_fp32_step(tmp_path, embedded):
    """The same fixed batch, four updates at lr 1e-4 in each precision. The first update's gradients agree in
    direction and size (bf16 keeps 8 bits of mantissa: ~0.4% error per operation, a few percent through the
    network, against the 5% and 20% allowed), and the log-likelihood margin of the positive-advantage completions
    over the negative ones grows in both, the bf16 curve within 15% of the fp32 curve's largest value."""
    curves, first_grads = {}, {}
    for dtype in ("float32", "bfloat16"):
        torch.manual_seed(0)
        tr = _trainer(tmp_path / dtype, dtype=dtype, lr=1e-4)
        batch, adv = _batch(tr)  # the same completions in both runs (fixed by the prompts)

        def margin():
            with torch.no_grad():
                seq = completion_logprobs(tr.model, batch.prompt_ids, batch.completion_ids, tr.tok.pad_token_id).sum(1)
            return float(seq[adv > 0].mean() - seq[adv < 0].mean())
        start, curve = margin(), []
        for k in range(4):
            grads = _update(tr, batch, adv)
            if k == 0:
                first_grads[dtype] = torch.cat([g.reshape(-1).double() for _, g in sorted(grads.items())])
            curve.append(margin() - start)
        curves[dtype] = curve
    g32, g16 = first_grads["float32"], first_grads["bfloat16"]
    cosine = float(g32 @ g16 / (g32.norm() * g16.norm()))
    assert cosine > 0.95 and 0.8 < float(g16.norm() / g32.norm()) < 1.25, (cosine, g16.norm(), g32.norm())
    assert not torch.equal(g32, g16)  # bf16 compute really ran (fp32 would give the same gradient bit for bit)
    fp32, bf16 = torch.tensor(curves["float32"]), torch.tensor(curves["bfloat16"])
    assert fp32[-1] > 0, curves  # the fp32 run learns the batch's contrast
    assert ((bf16 - fp32).abs() <= 0.15 * fp32.abs().max()).all(), curves


def test_the_reference_scores_like_the_policy_so_the_kl_is_zero_before_the_first_update(tmp_path, embedded):
    """With kl_coef > 0 the reference is the initial policy scored the policy's way (fp32 weights under bf16 autocast):
    before any update its log-probs equal the policy's bit for bit, and the first on-policy step's KL term is 0 (a
    pure-bf16 copy, as before, differs from the autocast policy by bf16 rounding: KL > 0 before training starts)."""
    tr = _trainer(tmp_path, dtype="bfloat16", kl_coef=0.05, packing="dense")
    batch, adv = _batch(tr)
    groups = [r // 4 for r in range(len(batch.completion_ids))]  # the rows' prompt groups
    micro = tr.micro_batches(list(range(len(groups))), batch.prompt_ids, batch.completion_ids, groups)
    policy = tr.logprobs_no_grad(tr.model, batch.prompt_ids, batch.completion_ids, micro)[0]
    ref = tr.logprobs_no_grad(tr.ref_model, batch.prompt_ids, batch.completion_ids, micro)[0]
    assert torch.equal(policy, ref)
    assert next(tr.ref_model.parameters()).dtype == torch.float32
    stats = tr.update(batch, list(range(len(batch.completion_ids))), adv, torch.ones(len(adv)), float(len(adv)), Timer())
    kl = stats.metrics(1, 1.0)["kl"]
    assert kl == 0.0, kl


class _HeadMatmuls:
    """Records, at the aten level (after autocast has cast the operands, whatever Python op issued it: @, mm,
    F.linear), the operand dtypes of every matrix product with the vocabulary projection's [V, H] shape among its
    operands or result: the logits chunk (hidden @ W^T), its recomputation in the backward pass, and the two gradient
    products (dlogits @ W, dlogits^T @ hidden). Shapes, not identities: autocast's bf16 copy of W is a new tensor."""

    PRODUCTS = ("mm", "addmm", "bmm", "matmul", "linear")

    def __init__(self, vocab: int, hidden: int):
        from torch.utils._python_dispatch import TorchDispatchMode

        head = {(vocab, hidden), (hidden, vocab)}
        seen = self.seen = []

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func.overloadpacket.__name__ in _HeadMatmuls.PRODUCTS:
                    ins = [a for a in args if isinstance(a, torch.Tensor)]
                    if head & {tuple(t.shape) for t in (*ins, out)}:
                        seen.append(([a.dtype for a in ins], tuple(out.shape)))
                return out
        self.mode = Mode()

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


def test_bf16_computes_the_decoder_and_the_vocabulary_head_in_bf16_and_keeps_fp32_weights_gradients_and_adam_state(
        tmp_path, embedded):
    """`dtype: bfloat16` really on: a decoder layer's projections compute in bf16 in the update (forward with
    gradients) and in the no-grad passes (old policy, reference) — the residual stream between them stays fp32 under
    autocast, as it should —, and so does the vocabulary head (the largest matmul at V = 151,936: the logits chunk,
    its recomputation in the backward, both gradient products; only the log-softmax over a chunk is fp32), while the
    master weights, the gradients the optimizer steps with and AdamW's moments stay fp32; with `dtype: float32` the
    same products compute in fp32 (the control: a config whose dtype were ignored would fail the first assertion)."""
    seen: dict[str, list[torch.dtype]] = {}
    head: dict[str, dict[str, list]] = {}
    for dtype in ("bfloat16", "float32"):
        tr = _trainer(tmp_path / dtype, dtype=dtype, lr=1e-4)
        batch, adv = _batch(tr)
        outs: list[torch.dtype] = []
        projection = tr.policy.model.layers[0].mlp.gate_proj
        handle = projection.register_forward_hook(lambda mod, args, out: outs.append(out.dtype))
        groups = [r // 4 for r in range(len(batch.completion_ids))]  # the rows' prompt groups, as a step has them
        vocab, hidden = tr.shape.vocab, tr.shape.hidden
        with _HeadMatmuls(vocab, hidden) as no_grad_head:
            tr.logprobs_no_grad(tr.model, batch.prompt_ids, batch.completion_ids,
                                tr.micro_batches(list(range(len(groups))), batch.prompt_ids, batch.completion_ids, groups))
        no_grad = list(outs)
        with _HeadMatmuls(vocab, hidden) as update_head:
            grads = _update(tr, batch, adv)
        handle.remove()
        seen[dtype] = [no_grad[0], outs[-1]]
        head[dtype] = {"no_grad": no_grad_head.seen, "update": update_head.seen}
        assert all(p.dtype == torch.float32 for p in tr.policy.parameters())
        assert grads and all(g.dtype == torch.float32 for g in grads.values())
        moments = [t for s in tr.opt.optimizer.state.values() for k, t in s.items() if k in ("exp_avg", "exp_avg_sq")]
        assert moments and all(t.dtype == torch.float32 for t in moments)
        # every kind of head product ran: the logits [c, V], the weight's gradient [V, H], the hidden's [c, H]
        logits = lambda ops: [d for d, out in ops if out[-1] == vocab]  # noqa: E731
        assert logits(head[dtype]["no_grad"]) and logits(head[dtype]["update"]), head[dtype]
        assert any(out == (vocab, hidden) for _, out in head[dtype]["update"]), head[dtype]["update"]
        assert any(out[-1] == hidden and out[0] != vocab for _, out in head[dtype]["update"]), head[dtype]["update"]
    assert seen["bfloat16"] == [torch.bfloat16, torch.bfloat16], seen
    assert seen["float32"] == [torch.float32, torch.float32], seen
    for dtype, want in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        for phase, ops in head[dtype].items():
            assert all(d == want for dtypes, _ in ops for d in dtypes), (dtype, phase, ops)
