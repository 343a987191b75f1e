"""bf16 the standard way: fp32 master weights and optimizer state, bf16 compute (accelerate mixed precision).
At the paper's lr 1e-6 every weight moves (pure bf16 weights would round most updates away), and a bf16
run learns like the fp32 one."""

import pytest
import torch

from dppo.config import TrainConfig
from dppo.scoring import completion_logprobs
from dppo.trainer import Timer, Trainer

SMALL = dict(train_size=8, eval_size=2, prompts_per_step=4, group_size=4, max_new_tokens=32, warmup_steps=0,
             eval_every=1000, save_every=1000)


def _batch(tr):
    keys = list(range(4))
    batch, rewards = tr._rollout(keys, Timer())
    rewards[:, 0], rewards[:, 1] = 1.0, 0.0  # every group informative
    adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).reshape(-1)
    return batch, adv


def _moved_fraction(before: dict, model) -> float:
    moved = total = 0
    for name, p in model.named_parameters():
        moved += int((p.detach() != before[name]).sum())
        total += p.numel()
    return moved / total


def test_bf16_keeps_fp32_master_weights_so_every_weight_moves_at_lr_1e6(tmp_path, embedded):
    tr = Trainer(TrainConfig(output_dir=str(tmp_path), dtype="bfloat16", lr=1e-6, **SMALL))
    assert all(p.dtype == torch.float32 for p in tr.model.parameters())
    batch, adv = _batch(tr)
    before = {k: v.detach().clone() for k, v in tr.model.named_parameters()}
    tr.update(batch, list(range(len(adv))), adv, torch.ones(len(adv), dtype=torch.float64), float(len(adv)), Timer())
    assert _moved_fraction(before, tr.model) >= 0.99

    # the same step with the weights themselves in bf16 (what `dtype: bfloat16` used to mean) loses most of it
    pure = {k: v.to(torch.bfloat16) for k, v in before.items()}
    params = [torch.nn.Parameter(v.clone()) for v in pure.values()]
    for p, (name, q) in zip(params, tr.model.named_parameters()):
        p.grad = torch.sign(q.detach() - before[name]).to(torch.bfloat16)  # same direction, any magnitude
    torch.optim.AdamW(params, lr=1e-6, weight_decay=0.0).step()
    moved = sum(int((p.detach() != v).sum()) for p, v in zip(params, pure.values()))
    assert moved / sum(p.numel() for p in params) < 0.5


def test_bf16_run_learns_like_the_fp32_run(tmp_path, embedded):
    """The same batch, four updates at lr 1e-4 in each precision: the mean log-likelihood gain of the
    positive-advantage completions over the negative ones follows the fp32 curve within 15%."""
    curves = {}
    for dtype in ("float32", "bfloat16"):
        torch.manual_seed(0)
        tr = Trainer(TrainConfig(output_dir=str(tmp_path / dtype), dtype=dtype, lr=1e-4, **SMALL))
        if dtype == "float32":
            batch, adv = _batch(tr)
        rows = list(range(len(adv)))

        def margin():
            with torch.no_grad():
                seq = completion_logprobs(tr.model, batch.prompt_ids, batch.completion_ids, tr.tok.pad_token_id).sum(1)
            return float(seq[adv > 0].mean() - seq[adv < 0].mean())
        start, curve = margin(), []
        for _ in range(4):
            tr.update(batch, rows, adv, torch.ones(len(rows), dtype=torch.float64), float(len(rows)), Timer())
            curve.append(margin() - start)
        curves[dtype] = curve
    fp32, bf16 = torch.tensor(curves["float32"]), torch.tensor(curves["bfloat16"])
    assert (fp32 > 0).all() and fp32[-1] > fp32[0]  # the fp32 run learns
    assert ((bf16 - fp32).abs() <= 0.15 * fp32.abs()).all(), curves
