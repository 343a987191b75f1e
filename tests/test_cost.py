"""Compute cost and CPU time per phase, and speed-ups a busy machine cannot fake (docs/method.md §5, docs/engineering.md §5.1)."""

import json

import pandas as pd
import pytest

from dist_worker import FixedRollout

from dppo import tables
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
    # a group of 2 completions (2 and 4 tokens) after one 3-token prompt: the prompt computed once
    assert shape.generation([3, 3], [2, 4], group_size=2) == shape.forward(3 + 2 + 4, 6 + (6 + 3) + (12 + 10), 6)
    assert shape.generation([3, 3], [2, 4]) == shape.forward(5 + 7, 15 + 28, 6)


def test_flops_against_a_hand_count_term_by_term():
    """Every FLOPs figure (dppo.cost, and what the trainer records as flops/*) against a count written out by hand
    from the cost model (docs/method.md §5, dppo/cost.py): per token slot 2 N_body, per attended (query, key) pair
    2 x 2 x layers x q_dim (scores and weighted values), per token whose logits are computed 2 x V x H; an update is
    3 forwards (4 with gradient checkpointing). Ordering checks would pass with a term dropped; these would not."""
    from types import SimpleNamespace

    from dppo.cost import training_multiplier

    shape = ModelShape(body_params=1000, layers=3, q_dim=8, vocab=50, hidden=4)
    SLOT, PAIR, LOGIT = 2 * 1000, 2 * 2 * 3 * 8, 2 * 50 * 4  # 2000, 96, 400
    assert shape.forward(10, 7, 3) == 10 * SLOT + 7 * PAIR + 3 * LOGIT == 21_872

    # two groups of G = 2 rows: prompt 3 with completions of 2 and 4 tokens, prompt 5 with completions of 1 and 3
    prompts, completions = [3, 3, 5, 5], [2, 4, 1, 3]
    # prompt pairs (causal, within the prompt): 3 -> 1+2+3 = 6, 5 -> 15
    # completion pairs (each token attends to the prompt and the completion so far):
    #   (3, 2): 4+5 = 9   (3, 4): 4+5+6+7 = 22   (5, 1): 6   (5, 3): 6+7+8 = 21   -> 58
    # shared (vLLM's prefix cache, sample_compacting): each prompt once -> 8 + 10 slots, 21 + 58 pairs, 10 logit rows
    assert shape.generation(prompts, completions, group_size=2) == 18 * SLOT + 79 * PAIR + 10 * LOGIT == 47_584
    # every row its own prompt: 16 + 10 slots, 42 + 58 pairs, the same 10 logit rows
    assert shape.generation(prompts, completions) == 26 * SLOT + 100 * PAIR + 10 * LOGIT == 65_600

    # the trainer's scoring forwards (update, old and reference log-probs), on the layouts' token slots
    trainer = SimpleNamespace(shape=shape)
    # shared prompts: (prompt, its group's completions) in a 20-slot bin; pairs as the shared generation's
    assert Trainer.forward_flops(trainer, [(3, [2, 4]), (5, [1, 3])], 20) == 20 * SLOT + 79 * PAIR + 10 * LOGIT == 51_584
    # one row per sequence, padded to 8: 4 x 8 slots; pairs (p + c)(p + c + 1)/2: 15 + 28 + 21 + 36 = 100
    assert Trainer.forward_flops(trainer, [(3, [2]), (3, [4]), (5, [1]), (5, [3])], 32) \
        == 32 * SLOT + 100 * PAIR + 10 * LOGIT == 77_600
    # the update: forward + backward (2 forwards), + the recomputed forward under gradient checkpointing
    assert training_multiplier(False) == 3.0 and training_multiplier(True) == 4.0


def test_each_step_records_cpu_time_and_flops_and_shared_prompts_cost_less(tmp_path, embedded):
    records = {}
    # (packing, gradient checkpointing): the recomputed forward is counted in what the trainer records, not only in
    # the budget's estimate (bench/gpu_check.py's MFU divides by it)
    for packing, checkpointing in (("none", False), ("dense", False), ("shared", False), ("dense", True)):
        key = packing + ("+checkpointing" if checkpointing else "")
        tr = Trainer(TrainConfig(output_dir=str(tmp_path / key), packing=packing, pack_capacity=256,
                                 pruner="dppo", completion_prune_rate=0.5, gradient_checkpointing=checkpointing,
                                 **SMALL))
        # completions fixed by the prompt alone: the same lengths, rewards and masks on any machine, so the strict
        # ordering below is a property of the layouts, not of what this machine's model happened to sample
        FixedRollout.install(tr)
        generated, real_generate = [], tr.engine.generate
        tr.engine.generate = lambda prompts, params: (generated.append(real_generate(prompts, params)), generated[-1])[1]
        micro, real_loss = [], tr.micro_batch_loss

        def watch_micro_batch(mbatch, p_ids, c_ids, *args):
            loss, n_slots, sums = real_loss(mbatch, p_ids, c_ids, *args)
            groups = [k for k, seg in enumerate(mbatch.segments) for _ in seg]  # the prompt computation of each row
            micro.append(([p_ids[i] for i in mbatch.rows], [c_ids[i] for i in mbatch.rows], groups, n_slots))
            return loss, n_slots, sums
        tr.micro_batch_loss = watch_micro_batch
        records[key] = r = tr.train_step()
        # the update's FLOPs by hand: 3 forwards (4 with checkpointing: the backward recomputes each layer) over each micro-batch's token slots (the layout's), the causal pairs of
        # each prompt computation (once per row; once per group with shared prompts) and of each completion over its
        # prompt and itself, and a logit row per completion token
        shape, update = ModelShape.of(tr.policy), 0.0
        for mp, mc, groups, n_slots in micro:
            seen, pairs = set(), 0
            for p, c, g in zip(mp, mc, groups):
                key = g if packing == "shared" else len(seen)
                if key not in seen:
                    seen.add(key)
                    pairs += len(p) * (len(p) + 1) // 2
                pairs += len(c) * len(p) + len(c) * (len(c) + 1) // 2
            update += (4 if checkpointing else 3) * (2 * shape.body_params * n_slots + 4 * shape.layers * shape.q_dim * pairs
                           + 2 * shape.vocab * shape.hidden * sum(len(c) for c in mc))
        assert micro
        assert r["flops/update"] == update, (packing, r["flops/update"], update)
        assert r["cpu_s/step"] > 0 and r["cpu_s/rollout"] > 0 and r["cpu_s/update"] > 0
        # the rollout costs every generated row (pruned completions too, each group's prompt once); on-policy without
        # KL the old and reference passes never run
        rows = [(len(p), len(c)) for b in generated for p, c in zip(b.prompt_ids, b.completion_ids)]
        assert r["flops/rollout"] == ModelShape.of(tr.policy).generation(*map(list, zip(*rows)), group_size=8) > 0
        assert r["flops/old_logprob"] == r["flops/ref_logprob"] == 0 and r["kept/completion_frac"] < 1
    # the same rollouts and kept rows (same seed), laid out three ways: same rollout cost, less update cost
    none, dense, shared = (records[k] for k in ("none", "dense", "shared"))
    assert none["flops/rollout"] == dense["flops/rollout"] == shared["flops/rollout"]
    assert shared["flops/update"] < dense["flops/update"] < none["flops/update"]
    assert records["dense+checkpointing"]["flops/update"] == pytest.approx(4 / 3 * dense["flops/update"], rel=1e-12)


def _fake_run(path, wall, cpu, flops, acc=0.5, start=None, other_cores=(0.02, 0.02)):
    path.mkdir(parents=True)
    rows = [] if start is None else [{"step": 0, "eval/avg": start}]
    rows += [{"step": i, "epoch": i / 2, "timing_s/step": wall / 2, "cpu_s/step": cpu / 2, "flops/step": flops / 2,
              "tokens/generated": 1, "tokens/trained": 1, "kept/prompt_frac": 1.0, "kept/completion_frac": 1.0,
              "density/valid_token": 1.0, "load/other_cores": other_cores[i - 1]} for i in (1, 2)]
    rows[-1]["eval/avg"] = acc
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_speedups_in_three_currencies_and_a_contended_run_is_flagged(tmp_path):
    # the baseline ran on a busy machine: 2 cores' worth of CPU in 40 s of wall time (0.1 core) -> its wall-clock
    # speed-up over the others is fake, CPU time and FLOPs are not
    runs = {"GRPO": [_fake_run(tmp_path / "a", wall=40.0, cpu=4.0, flops=9e12, start=0.25)],
            "DPPO": [_fake_run(tmp_path / "b", wall=2.0, cpu=2.0, flops=3e12)],
            "CPPO": [_fake_run(tmp_path / "c", wall=3.0, cpu=3.0, flops=4.5e12)]}
    df = tables.per_seed(runs, "GRPO").set_index("label")
    assert df.loc["DPPO", "speedup"] == pytest.approx(20.0)
    assert df.loc["DPPO", "speedup_cpu"] == pytest.approx(2.0)
    assert df.loc["DPPO", "speedup_flops"] == pytest.approx(3.0)
    assert list(df["contended"]) == [True, False, False] and df["pair_contended"].all()
    assert (df["acc/start"] == 25.0).all()  # runs that skipped step 0 take the baseline's start


def test_a_pair_that_ran_beside_other_work_is_left_out_of_the_timed_means(tmp_path):
    """Seed 1's DPPO run shared the machine with a job that took a core for its second step (time-weighted: 0.68
    cores on average): that pair's wall and CPU speed-ups leave the means (FLOPs stay), the table marks it."""
    runs = {"GRPO": [_fake_run(tmp_path / f"g/seed{s}", wall=10.0, cpu=10.0, flops=9.0) for s in range(3)],
            "DPPO": [_fake_run(tmp_path / "d/seed0", wall=5.0, cpu=5.0, flops=3.0),
                     _fake_run(tmp_path / "d/seed1", wall=20.0, cpu=30.0, flops=3.0, other_cores=(0.02, 1.0)),
                     _fake_run(tmp_path / "d/seed2", wall=4.0, cpu=4.0, flops=3.0)]}
    seeds = tables.per_seed(runs, "GRPO")
    assert list(seeds["load/other_cores"]) == pytest.approx([0.02] * 4 + [0.51, 0.02])
    assert list(seeds["contended"]) == [False] * 4 + [True, False]
    assert list(seeds["pair_contended"]) == [False] * 4 + [True, False]
    summary = tables.aggregate(seeds)
    assert summary.loc["DPPO", "speedup"] == pytest.approx((2.0 + 2.5) / 2)  # seeds 0 and 2
    assert summary.loc["DPPO", "speedup_cpu"] == pytest.approx((2.0 + 2.5) / 2)
    assert summary.loc["DPPO", "speedup_flops"] == pytest.approx(3.0)  # every seed
    assert summary.loc["DPPO", "seeds_timed"] == 2 and summary.loc["DPPO", "contended"] == 1
    assert "2.25 ± " in tables.markdown(summary) and "†1" in tables.markdown(summary)
    # a GPU table keeps every seed (a rank's meter counts its node's other ranks as other work)
    gpu = tables.table(runs, "GRPO", "T_gpu", "caption", out=tmp_path / "figures", cpu_columns=False)
    assert gpu.loc["DPPO", "speedup"] == pytest.approx((2.0 + 0.5 + 2.5) / 3) and gpu.loc["DPPO", "seeds_timed"] == 3


def test_seeds_are_paired_and_intervals_are_students_t(tmp_path):
    """Speed-up and gain are per seed against the same seed's baseline; a cell is mean +- t_{.975,n-1} s/sqrt(n)."""
    walls, accs = [10.0, 12.0, 16.0], [0.30, 0.40, 0.35]
    runs = {"GRPO": [_fake_run(tmp_path / f"g/seed{s}", wall=w, cpu=w, flops=w, acc=a, start=0.2)
                     for s, (w, a) in enumerate(zip(walls, accs))],
            "DPPO": [_fake_run(tmp_path / f"d/seed{s}", wall=w / k, cpu=w / k, flops=w / k, acc=a + 0.02)
                     for s, (w, a, k) in enumerate(zip(walls, accs, [2.0, 2.5, 3.0]))]}
    seeds = tables.per_seed(runs, "GRPO")
    d = seeds[seeds["label"] == "DPPO"]
    assert list(d["seed"]) == [0, 1, 2] and list(d["speedup"]) == pytest.approx([2.0, 2.5, 3.0])
    assert list(d["acc_gain"]) == pytest.approx([2.0] * 3)  # paired: the seeds' differences, not the means'
    summary = tables.aggregate(seeds)
    assert summary.loc["DPPO", "speedup"] == pytest.approx(2.5)
    assert summary.loc["DPPO", "speedup_ci"] == pytest.approx(4.302653 * 0.5 / 3**0.5, rel=1e-6)
    assert summary.loc["DPPO", "acc_gain_ci"] == pytest.approx(0.0, abs=1e-9)
    assert summary.loc["DPPO", "seeds"] == 3
    md = tables.markdown(summary)
    header = md.splitlines()[0]
    assert "2.50 ± 1.24" in md and "speed-up (FLOPs)" in header and "train_cpu_s" not in header  # paper's columns
    text = tables.sentences(summary, "GRPO", "T1")
    assert "2.50x (95% CI 1.26-3.74)" in text and "+2.0 points (95% CI +2.0 to +2.0: higher)" in text
    assert "The paper reports 2.37x" in text and "inside our interval" in text


def test_table_columns_come_from_the_runs_eval_keys_and_gpu_tables_drop_cpu_columns(tmp_path):
    """A paper run's benchmarks become the table's columns (one per eval/* key, then the average); a GPU table
    (cpu_columns False) shows wall-clock and FLOPs speed-ups only, with no contended mark. The paper profile's tables
    and runs live apart from the CPU ones."""
    from dppo import results

    runs = {}
    for label, wall, (math500, aime) in (("GRPO", 4.0, (0.6, 0.1)), ("DPPO", 2.0, (0.7, 0.2))):
        path = _fake_run(tmp_path / label, wall=wall, cpu=0.1, flops=wall * 1e12, acc=(math500 + aime) / 2, start=0.3)
        rows = [json.loads(ln) for ln in (path / "metrics.jsonl").read_text().splitlines()]
        rows[-1].update({"eval/math500": math500, "eval/aime24": aime, "eval/aime24/pass@k": 0.5})
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs[label] = [path]
    summary = tables.aggregate(tables.per_seed(runs, "GRPO"))
    header = [c.strip() for c in tables.markdown(summary, cpu_columns=False).splitlines()[0].split("|")]
    assert header[2:7] == ["math500", "aime24", "avg", "learned (vs start)", "gain"] and "level1" not in header
    assert "speed-up" in header and "speed-up (FLOPs)" in header and "speed-up (CPU)" not in header
    assert "†" not in tables.markdown(summary, cpu_columns=False)
    assert "speed-up (CPU)" in tables.markdown(summary)  # the CPU profile keeps it
    assert results.figures_dir(profile="paper") == results.FIGURES / "paper"
    assert results.results_root(False, "paper") == results.RESULTS / "paper"
    with pytest.raises(ValueError, match="parameter 'profile' must be one of"):
        results.figures_dir(profile="gpu")


def _curve_run(path, step_s, step_flops, evals, steps, other_cores=0.02):
    """A run of `steps` steps of `step_s` seconds and `step_flops` FLOPs, evaluated {step: accuracy (fraction)}."""
    path.mkdir(parents=True)
    rows = [{"step": 0, "eval/avg": evals[0]}] if 0 in evals else []
    rows += [{"step": i, "epoch": i / 4, "timing_s/step": step_s, "cpu_s/step": step_s, "flops/step": step_flops,
              "tokens/generated": 1, "tokens/trained": 1, "kept/prompt_frac": 1.0, "kept/completion_frac": 1.0,
              "density/valid_token": 1.0, "load/other_cores": other_cores,
              **({"eval/avg": evals[i]} if i in evals else {})} for i in range(1, steps + 1)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_equal_compute_time_to_the_baselines_accuracy_and_accuracy_at_its_time(tmp_path):
    """Per seed: the target is GRPO's final accuracy, reached at the first evaluation at or above it (GRPO itself may
    reach it before its end: its own time to it is the reference); the budget is GRPO's training time, and a run's
    accuracy there is its last evaluation within it, defined only for runs that trained that long."""
    runs = {
        # seed 0: 10 s / step, evals 20% -> 25% (step 1) -> 40% (step 2, 20 s) -> 35% (end, 40 s): target 35, reached
        # at 20 s, after an evaluation that had not (the grid resolves it: `tables.resolved`)
        # seed 1: evals 20% -> 30% -> 50% (end): target 50, reached at 40 s
        "GRPO": [_curve_run(tmp_path / "g/seed0", 10.0, 10.0, {0: 0.2, 1: 0.25, 2: 0.4, 4: 0.35}, 4),
                 _curve_run(tmp_path / "g/seed1", 10.0, 10.0, {0: 0.2, 2: 0.3, 4: 0.5}, 4)],
        # 4 s / step: seed 0 reaches 35 at step 4 (16 s); seed 1 never reaches 50
        "DPPO": [_curve_run(tmp_path / "d/seed0", 4.0, 3.0, {2: 0.3, 4: 0.36}, 4),
                 _curve_run(tmp_path / "d/seed1", 4.0, 3.0, {2: 0.3, 4: 0.45}, 4)],
        # trained on past GRPO's 40 s: the accuracy at 40 s is step 10's (seed 0) / step 8's (seed 1: no eval at 10)
        "DPPO, 12 epochs": [_curve_run(tmp_path / "l/seed0", 4.0, 3.0, {4: 0.3, 8: 0.38, 10: 0.41, 12: 0.45}, 12),
                            _curve_run(tmp_path / "l/seed1", 4.0, 3.0, {4: 0.3, 8: 0.52, 11: 0.6, 12: 0.7}, 12)],
    }
    seeds = tables.per_seed(runs, "GRPO")
    rows = tables.equal_compute(runs, "GRPO", seeds).set_index(["label", "seed"])
    assert rows.loc[("GRPO", 0), "reached"] and rows.loc[("GRPO", 0), "reach_min"] == pytest.approx(20 / 60)
    assert rows.loc[("GRPO", 1), "reach_min"] == pytest.approx(40 / 60)
    assert rows.loc[("DPPO", 0), "speedup_reach"] == pytest.approx(20 / 16)
    assert rows.loc[("DPPO", 0), "speedup_reach_flops"] == pytest.approx(20 / 12)
    assert not rows.loc[("DPPO", 1), "reached"] and pd.isna(rows.loc[("DPPO", 1), "speedup_reach"])
    assert rows.loc[("DPPO", 0), "budget_frac"] == pytest.approx(0.4) and pd.isna(rows.loc[("DPPO", 0), "acc_at_budget"])
    long0, long1 = rows.loc["DPPO, 12 epochs"].loc[0], rows.loc["DPPO, 12 epochs"].loc[1]
    assert long0["speedup_reach"] == pytest.approx(20 / 32) and long1["speedup_reach"] == pytest.approx(40 / 32)
    assert long0["acc_at_budget"] == pytest.approx(41.0) and long0["gain_at_budget"] == pytest.approx(6.0)
    assert long1["acc_at_budget"] == pytest.approx(52.0) and long1["gain_at_budget"] == pytest.approx(2.0)
    assert rows.loc[("GRPO", 0), "acc_at_budget"] == pytest.approx(35.0)  # the baseline at its own budget: its final
    summary = tables.aggregate_equal_compute(rows.reset_index())
    assert summary.loc["DPPO", "reached"] == 1 and summary.loc["DPPO", "speedup_reach_n"] == 1
    assert summary.loc["DPPO, 12 epochs", "gain_at_budget"] == pytest.approx(4.0)
    assert summary.loc["DPPO, 12 epochs", "gain_at_budget_ci"] == pytest.approx(12.706205 * 2, rel=1e-6)
    md = tables.markdown_equal_compute(summary, "GRPO")
    assert "1/2" in md and "accuracy at GRPO's time" in md and "1.25 (1)" in md
    # the longer run is in the equal-compute table only; T1's equal-epoch table keeps its rows
    out = tmp_path / "figures"
    t1 = tables.table(runs, "GRPO", "T1", "caption", out=out, at_equal_compute=True, longer=("DPPO, 12 epochs",))
    assert list(t1.index) == ["GRPO", "DPPO"]
    text = (out / "T1.md").read_text()
    assert text.count("DPPO, 12 epochs") == 1 and "**At equal compute.**" in text
    assert list(pd.read_csv(out / "T1_equal_compute.csv", index_col=0).index) == list(runs)
    tables.table(runs, "GRPO", "T1", "caption", out=out, at_equal_compute=True, longer=("DPPO, 12 epochs",))
    assert (out / "T1.md").read_text() == text  # written again, not appended twice
    sentence = tables.equal_compute_sentences(summary, "GRPO")
    assert "**DPPO** comes within one evaluation s.e. of GRPO's final accuracy in 1 of 2 seeds, 1.25x faster" in sentence
    assert "+4.0 points against GRPO's final accuracy" in sentence


def test_equal_compute_never_counts_the_initial_model_as_reaching_the_target(tmp_path):
    """GRPO ended below its start (50% -> 40%): the target 40 is reached by the first trained evaluation at or above
    it (GRPO: step 4, 40 s; DPPO: step 2, 8 s), not by the shared initial model at time 0."""
    runs = {"GRPO": [_curve_run(tmp_path / "g/seed0", 10.0, 10.0, {0: 0.5, 2: 0.3, 4: 0.4}, 4)],
            "DPPO": [_curve_run(tmp_path / "d/seed0", 4.0, 3.0, {2: 0.45, 4: 0.3}, 4)]}
    rows = tables.equal_compute(runs, "GRPO", tables.per_seed(runs, "GRPO")).set_index("label")
    assert rows.loc["GRPO", "reach_min"] == pytest.approx(40 / 60) and rows.loc["DPPO", "reach_min"] == pytest.approx(8 / 60)
    assert rows.loc["DPPO", "speedup_reach"] == pytest.approx(5.0) and rows.loc["DPPO", "speedup_reach_flops"] == pytest.approx(40 / 6)


def test_equal_compute_leaves_contended_pairs_out_of_its_timed_columns(tmp_path):
    # an evaluation at step 2 short of the target: the grid resolves every time to it (`tables.resolved`)
    runs = {"GRPO": [_curve_run(tmp_path / f"g/seed{s}", 10.0, 10.0, {0: 0.2, 2: 0.2, 4: 0.3}, 4) for s in range(3)],
            "DPPO": [_curve_run(tmp_path / f"d/seed{s}", 4.0 if s else 9.0, 3.0, {2: 0.2, 4: 0.3}, 4, other_cores=1.0 if s == 0 else 0.02)
                     for s in range(3)]}
    seeds = tables.per_seed(runs, "GRPO")
    summary = tables.aggregate_equal_compute(tables.equal_compute(runs, "GRPO", seeds))
    assert summary.loc["DPPO", "speedup_reach"] == pytest.approx(2.5) and summary.loc["DPPO", "speedup_reach_n"] == 2
    assert summary.loc["DPPO", "speedup_reach_flops"] == pytest.approx(10 / 3) and summary.loc["DPPO", "speedup_reach_flops_n"] == 3


def test_other_work_on_the_cores_a_run_left_free_does_not_contend_it(tmp_path):
    """A one-thread run on 2 cores leaves a core free: another job on it (0.9 cores) does not slow the run, so the pair
    keeps its speed-up; other work beyond the free core (1.4 cores: it took from the run's) flags it. A run with a
    thread per core has no free core: 0.3 cores of other work flag it."""
    def run(path, threads, other):
        p = _fake_run(path, wall=4.0, cpu=4.0 * min(threads, 2 - max(0.0, other - (2 - threads))), flops=3.0,
                      other_cores=(other, other))
        (p / "machine.json").write_text(json.dumps({"cores": 2, "threads": threads}))
        return p
    runs = {"GRPO": [run(tmp_path / "g1", 1, 0.02), run(tmp_path / "g2", 2, 0.02)],
            "one thread, a job on the free core": [run(tmp_path / "a", 1, 0.9), run(tmp_path / "a2", 2, 0.02)],
            "one thread, more than the free core": [run(tmp_path / "b", 1, 1.4), run(tmp_path / "b2", 2, 0.02)],
            "two threads, a little other work": [run(tmp_path / "c", 1, 0.02), run(tmp_path / "c2", 2, 0.3)]}
    seeds = tables.per_seed(runs, "GRPO")
    assert list(seeds["load/spare_cores"]) == [1.0, 0.0] * 4
    assert list(seeds["contended"]) == [False, False, False, False, True, False, False, True]


def test_a_pair_whose_runs_met_unequal_load_is_contended(tmp_path):
    """Short bursts of other work that fell on one run's steps only (0.23 cores on DPPO's side, 0.03 on GRPO's; each
    below the run limit): the pair is contended; a pair that met the same moderate load is not."""
    runs = {"GRPO": [_fake_run(tmp_path / f"g{s}", wall=8.0, cpu=8.0, flops=9.0, other_cores=(o, o))
                     for s, o in enumerate((0.03, 0.2))],
            "DPPO": [_fake_run(tmp_path / f"d{s}", wall=4.0, cpu=4.0, flops=3.0, other_cores=(o, o))
                     for s, o in enumerate((0.23, 0.2))]}
    seeds = tables.per_seed(runs, "GRPO")
    assert not seeds["contended"].any() and list(seeds["pair_contended"]) == [False, False, True, False]
