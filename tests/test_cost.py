"""Compute cost and CPU time per phase, and speed-ups a busy machine cannot fake (docs/method.md §5.1)."""

import json

import pytest

from dppo import report
from dppo.config import TrainConfig
from dppo.cost import ModelShape
from dppo.trainer import Trainer

SMALL = dict(train_size=16, epochs=100, eval_size=2, eval_samples=1, prompts_per_step=8, group_size=8,
             max_new_tokens=48, warmup_steps=1, eval_every=1000, save_every=1000)


def test_model_shape_and_forward_flops(embedded):
    model = embedded[0]
    shape = ModelShape.of(model)
    total = sum(p.numel() for p in model.parameters())  # tied head counted once
    assert shape.body_params == total - model.get_input_embeddings().weight.numel()
    assert shape.layers == model.config.num_hidden_layers and shape.vocab == model.config.vocab_size
    assert shape.forward(10, 0, 0) == 20 * shape.body_params
    assert shape.forward(0, 5, 2) == 20 * shape.layers * shape.q_dim + 4 * shape.vocab * shape.hidden
    # generation: a prompt of 3 and completion of 2 = 5 tokens, 15 causal pairs, 2 logit rows
    assert shape.generation([3], [2]) == shape.forward(5, 15, 2)


def test_each_step_records_cpu_time_and_flops_and_shared_prompts_cost_less(tmp_path, embedded):
    records = {}
    for packing in ("none", "dense", "shared"):
        tr = Trainer(TrainConfig(output_dir=str(tmp_path / packing), packing=packing, pack_capacity=256,
                                 pruner="dppo", completion_prune_rate=0.5, **SMALL))
        records[packing] = r = tr.train_step()
        assert r["cpu_s/step"] > 0 and r["cpu_s/rollout"] > 0 and r["cpu_s/update"] > 0
        assert r["flops/step"] == pytest.approx(r["flops/rollout"] + r["flops/update"], rel=1e-12)
    # the same rollouts and kept rows (same seed), laid out three ways: same rollout cost, less update cost
    none, dense, shared = (records[k] for k in ("none", "dense", "shared"))
    assert none["flops/rollout"] == dense["flops/rollout"] == shared["flops/rollout"]
    assert shared["flops/update"] < dense["flops/update"] < none["flops/update"]


def _fake_run(path, wall, cpu, flops, acc=0.5):
    path.mkdir(parents=True)
    rows = [{"step": 0, "eval/avg": acc}]
    rows += [{"step": i, "epoch": i / 2, "timing_s/step": wall / 2, "cpu_s/step": cpu / 2, "flops/step": flops / 2,
              "tokens/generated": 1, "tokens/trained": 1, "kept/prompt_frac": 1.0, "kept/completion_frac": 1.0,
              "density/valid_token": 1.0} for i in (1, 2)]
    rows[-1]["eval/avg"] = acc
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_speedups_in_three_currencies_and_a_contended_run_is_flagged(tmp_path):
    # the baseline ran on a busy machine: 2 cores' worth of CPU in 40 s of wall time (0.1 core) -> its wall-clock
    # speed-up over the others is fake, CPU time and FLOPs are not
    runs = {"GRPO": _fake_run(tmp_path / "a", wall=40.0, cpu=4.0, flops=9e12),
            "DPPO": _fake_run(tmp_path / "b", wall=2.0, cpu=2.0, flops=3e12),
            "CPPO": _fake_run(tmp_path / "c", wall=3.0, cpu=3.0, flops=4.5e12)}
    df = report.compare(runs, "GRPO")
    assert df.loc["DPPO", "speedup"] == pytest.approx(20.0)
    assert df.loc["DPPO", "speedup_cpu"] == pytest.approx(2.0)
    assert df.loc["DPPO", "speedup_flops"] == pytest.approx(3.0)
    assert list(df["contended"]) == [True, False, False]
