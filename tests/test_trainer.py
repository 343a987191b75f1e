"""End-to-end training on the embedded default: learning, run folder, resume, determinism."""

import json

import pytest
import torch
from safetensors.torch import load_file

from dist_worker import FixedRollout

from dppo.config import ConfigError, TrainConfig
from dppo.reward import math_reward
from dppo.rollout import SamplingParams
from dppo.scoring import completion_logprobs
from dppo.trainer import Trainer, read_metrics, run_metrics

SMALL = dict(train_size=16, epochs=100, eval_size=4, eval_samples=2, prompts_per_step=8, group_size=8, max_new_tokens=48,
             warmup_steps=1, keep_checkpoints=10)


def _right_minus_wrong(tr, batch, right) -> float:
    """Mean teacher-forced log-likelihood (per token) of the right completions minus the wrong ones."""
    with torch.no_grad():
        logp = completion_logprobs(tr.policy, batch.prompt_ids, batch.completion_ids, tr.tok.pad_token_id)
    per_token = logp.sum(1) / torch.tensor([len(c) for c in batch.completion_ids])
    return float(per_token[right].mean() - per_token[~right].mean())


def test_short_run_changes_every_parameter_and_learns(tmp_path, embedded):
    """24 GRPO steps on completions fixed by the prompts (tests/dist_worker.py `FixedRollout`: the same texts and
    rewards on any machine, so the verdict cannot depend on what this machine's model samples): the policy learns
    the batch's contrast, raising the right completions' per-token log-likelihood over the wrong ones' by at least
    0.5 nats (the same amount on any machine up to rounding; +2.1 nats measured, 0.94 -> 3.03). Learning from the
    policy's own samples is what the studies measure (T1-T5); here it would be a threshold on one machine's trajectory."""
    cfg = TrainConfig(output_dir=str(tmp_path), lr=1e-4, max_steps=24, eval_every=1000, save_every=1000, **SMALL)
    tr = Trainer(cfg)
    FixedRollout.install(tr)
    batch = tr.engine.generate([p.prompt for p in tr.train], SamplingParams(n=cfg.group_size, max_new_tokens=48))
    right = torch.tensor([math_reward(t, tr.train[i // cfg.group_size].answer) == 1.0
                          for i, t in enumerate(batch.texts)])
    assert 0 < int(right.sum()) < len(right)
    before = {k: v.clone() for k, v in tr.model.named_parameters()}
    m0 = _right_minus_wrong(tr, batch, right)
    tr.fit()
    m1 = _right_minus_wrong(tr, batch, right)
    print(f"right - wrong per-token log-likelihood: {m0:.3f} -> {m1:.3f}")
    unchanged = [k for k, v in tr.model.named_parameters() if v.requires_grad and torch.equal(v, before[k])]
    assert not unchanged
    assert m1 > m0 + 0.5, (m0, m1)
    # the run folder: config, one metrics line per step (+ the step-0 eval), a checkpoint, a final model
    assert TrainConfig.load(tmp_path / "config.yaml") == cfg
    m = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in m] == list(range(0, 25))
    for key in ("reward", "frac_reward_zero_std", "kept/prompt_frac", "kept/completion_frac", "weights/mean",
                "tokens/generated", "tokens/trained", "density/valid_token", "timing_s/rollout", "timing_s/reward",
                "timing_s/update", "timing_s/step", "loss/normaliser", "clip_frac/low", "clip_frac/high",
                "clip_frac/region", "approx_kl"):
        assert key in m[1], key
    assert {f"eval/{s}" for s in ("level1", "level5", "ood", "avg")} <= set(m[0]) & set(m[-1])
    assert (tmp_path / "checkpoints" / "step_24" / "model.safetensors").is_file()
    final = load_file(str(tmp_path / "final" / "model.safetensors"))
    assert torch.equal(final["model.norm.weight"], tr.policy.model.norm.weight.detach())


def _plant_zero_variance_history(tr) -> None:
    """Every training prompt was last seen all-correct (zero variance): each is a prompt-stage candidate from the
    first step on, whatever this machine's model samples (a history fixed by construction)."""
    G = tr.cfg.group_size
    for k in range(len(tr.train)):
        tr.history.update(k, [1.0] * G, [0.0] * G, [10] * G, step=0)


def _training_metrics(path):
    return [run_metrics(r) for r in read_metrics(path)]  # FLOPs are deterministic and stay


@pytest.mark.parametrize("variant", [  # plain GRPO's resume: tests/test_faults.py (kill -9 at three points)
    dict(algorithm="dapo", kl_coef=0.05, ppo_epochs=2, num_minibatches=2, micro_batch_size=24),
    dict(pruner="dppo", prompt_prune_rate=0.5, completion_prune_rate=0.5),  # prompt history must survive resume
    dict(pruner="greso"),
    dict(pruner="dppo", prompt_prune_rate=0.9, refill="tokens", packing="dense"),  # window survives resume
])
def test_resume_after_interruption_reproduces_uninterrupted_run(tmp_path, embedded, variant):
    common = dict(lr=2e-4, max_steps=6, eval_every=3, save_every=2, **SMALL, **variant)
    Trainer(TrainConfig(output_dir=str(tmp_path / "full"), **common)).fit()

    interrupted = Trainer(TrainConfig(output_dir=str(tmp_path / "cut"), **common))
    real_step = interrupted.train_step

    def crash_at_step_5():
        if interrupted.step == 4:
            raise KeyboardInterrupt  # after the step-4 checkpoint, before step 5 finishes
        return real_step()
    interrupted.train_step = crash_at_step_5
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit()
    assert [r["step"] for r in read_metrics(tmp_path / "cut" / "metrics.jsonl")] == [0, 1, 2, 3, 4]
    resumed = Trainer(TrainConfig(output_dir=str(tmp_path / "cut"), **common))
    resumed.fit()
    assert resumed.step == 6
    full, cut = _training_metrics(tmp_path / "full" / "metrics.jsonl"), _training_metrics(tmp_path / "cut" / "metrics.jsonl")
    assert [r["step"] for r in cut] == list(range(7))
    assert full == cut
    a = load_file(str(tmp_path / "full" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "cut" / "final" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_no_resume_starts_over_and_final_is_in_the_save_dtype(tmp_path, embedded):
    """resume: false trains again from step 0. save_dtype bfloat16 writes final/ at 2 bytes a parameter, the trained
    weights rounded once, while checkpoints keep the fp32 master weights (a resume stays exact)."""
    common = dict(lr=2e-4, max_steps=2, eval_every=1000, save_every=1, **SMALL)
    Trainer(TrainConfig(output_dir=str(tmp_path), **common)).fit()
    assert all(v.dtype == torch.float32 for v in load_file(str(tmp_path / "final" / "model.safetensors")).values())
    tr = Trainer(TrainConfig(output_dir=str(tmp_path), resume=False, save_dtype="bfloat16", **common))
    tr.fit()
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
    final = load_file(str(tmp_path / "final" / "model.safetensors"))
    trained = {k: v.detach() for k, v in tr.policy.state_dict().items()}
    assert final and all(v.dtype == torch.bfloat16 for v in final.values())
    assert all(torch.equal(final[k], trained[k].to(torch.bfloat16)) for k in final)
    ckpts = list((tmp_path / "checkpoints").rglob("*.safetensors"))
    assert ckpts and all(v.dtype == torch.float32 for f in ckpts for v in load_file(str(f)).values() if v.is_floating_point())


def test_checkpoints_removed_after_final_and_a_finished_run_is_not_trained_again(tmp_path, embedded):
    """keep_checkpoints_after_final: false (the paper profile) keeps only the newest checkpoint while training and none
    once final/ is written; training the same config into that folder again (resume, the default) finds the run
    finished instead of starting it over; another config still starts over."""
    common = dict(lr=2e-4, max_steps=3, eval_every=1000, save_every=1, **{**SMALL, "keep_checkpoints": 1})
    cfg = TrainConfig(output_dir=str(tmp_path), keep_checkpoints_after_final=False, **common)
    seen = []
    tr = Trainer(cfg)
    real_save = tr.save_checkpoint

    def save_and_look():
        real_save()
        seen.append(sorted(p.name for p in (tmp_path / "checkpoints").iterdir()))
    tr.save_checkpoint = save_and_look
    acc = tr.fit()
    assert seen == [["step_1"], ["step_2"], ["step_3"]]  # the newest only, while training
    assert not (tmp_path / "checkpoints").exists() and (tmp_path / "final" / "model.safetensors").is_file()
    log, weights = (tmp_path / "metrics.jsonl").read_text(), (tmp_path / "final" / "model.safetensors").read_bytes()
    again = Trainer(TrainConfig(output_dir=str(tmp_path), keep_checkpoints_after_final=False, eval_every=7,
                                **{k: v for k, v in common.items() if k != "eval_every"}))  # a resumable change
    again.train_step = lambda: pytest.fail("a finished run was trained again")
    assert again.fit() == acc
    assert (tmp_path / "metrics.jsonl").read_text() == log
    assert (tmp_path / "final" / "model.safetensors").read_bytes() == weights
    other = {**common, "lr": 1e-4}  # another run: refused over the finished one, unless told to start over
    with pytest.raises(ConfigError, match=r"finished run of another config: field\(s\) changed: lr \(0.0002 -> 0.0001\)"):
        Trainer(TrainConfig(output_dir=str(tmp_path), keep_checkpoints_after_final=False, **other)).fit()
    Trainer(TrainConfig(output_dir=str(tmp_path), keep_checkpoints_after_final=False, resume=False, **other)).fit()
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3]
    assert TrainConfig.load(tmp_path / "config.yaml").lr == 1e-4 and not (tmp_path / "checkpoints").exists()


def test_zero_rates_reproduce_the_unpruned_run_exactly(tmp_path, embedded):
    """DPPO with both rates 0 is dppo's GRPO run, metric for metric (that dppo's GRPO loss is TRL's GRPOTrainer's:
    tests/test_losses.py; DPPOTrainer at rates 0 = GRPOTrainer: tests/test_trl.py)."""
    common = dict(lr=2e-4, max_steps=5, eval_every=5, save_every=1000, **SMALL)
    Trainer(TrainConfig(output_dir=str(tmp_path / "grpo"), **common)).fit()
    Trainer(TrainConfig(output_dir=str(tmp_path / "dppo0"), pruner="dppo", prompt_prune_rate=0.0,
                        completion_prune_rate=0.0, **common)).fit()
    assert _training_metrics(tmp_path / "grpo" / "metrics.jsonl") == _training_metrics(tmp_path / "dppo0" / "metrics.jsonl")


def test_pruned_work_is_never_computed(tmp_path, embedded):
    """Pruned prompts are not rolled out; pruned completions never reach the old/ref/update passes."""
    cfg = TrainConfig(output_dir=str(tmp_path), pruner="dppo", prompt_prune_rate=0.7, completion_prune_rate=0.7,
                      lr=2e-4, max_steps=6, eval_every=1000, save_every=1000, kl_coef=0.05, ppo_epochs=1,
                      num_minibatches=2, **SMALL)
    tr = Trainer(cfg)
    rolled, scored = [], []
    rollout, score = tr._rollout, tr.update

    def spy_rollout(keys, timer):
        if keys:
            rolled.append(len(keys))
        return rollout(keys, timer)

    def spy_update(batch, rows, *args):
        scored.append((len(batch.completion_ids), len(rows)))
        return score(batch, rows, *args)
    tr._rollout, tr.update = spy_rollout, spy_update
    _plant_zero_variance_history(tr)  # step 1's 8 prompts are all candidates (its masks come from the seed alone)
    tr.fit()
    m = read_metrics(tmp_path / "metrics.jsonl")[1:]
    assert rolled == [round(r["kept/prompt_frac"] * r["prompts/covered"]) for r in m if r["kept/prompt_frac"] > 0]
    assert m[0]["kept/prompt_frac"] < 1  # 8 candidates at rate 0.7
    assert all(kept == round(r["kept/completion_frac"] * n) for (n, kept), r in zip(scored, m))
    assert any(kept < n for n, kept in scored)
    assert all(r["weights/max"] >= 1 for r in m if r["kept/completion_frac"] > 0)  # 0 when a step kept nothing
    assert any(r["weights/max"] > 1 for r in m)


def test_proportional_rule_reads_the_rollouts_logprobs_and_records_its_sizes(tmp_path, embedded):
    """inclusion proportional with a logit proxy (docs/method.md §2.10): the rollout returns the sampled tokens'
    log-probs, the completion stage gets their (sum, root-sum-square) of 1 - p_t, and the history keeps each prompt's
    mean size for the prompt stage of its next visit."""
    from dppo.pruning import logit_grad_sizes

    cfg = TrainConfig(output_dir=str(tmp_path), pruner="dppo", prompt_prune_rate=0.5, completion_prune_rate=0.5,
                      inclusion="proportional", size_proxy="logit_sum", max_steps=2, eval_every=1000, save_every=1000,
                      **SMALL)
    tr = Trainer(cfg)
    seen, select = [], tr.pruner.select_completions
    rollout = tr._rollout

    def spy_rollout(keys, timer):
        batch, rollouts = rollout(keys, timer)
        seen.append({"keys": keys, "grad": logit_grad_sizes(batch.logprobs, cfg.group_size)})
        return batch, rollouts

    def spy_select(rewards, adv, gen, lengths=None, logit_grad=None):
        sel = select(rewards, adv, gen, lengths, logit_grad)
        seen[-1].update(passed=logit_grad, size=sel.size)
        return sel
    tr._rollout, tr.pruner.select_completions = spy_rollout, spy_select
    tr.fit()
    assert len(seen) == 2
    for step in seen:
        assert step["passed"] is not None and torch.equal(step["passed"], step["grad"])
        assert (step["grad"][..., 0] > 0).any()
    last = seen[-1]
    for j, k in enumerate(last["keys"]):
        assert tr.history.get(k).mean_size == pytest.approx(float(last["size"][j].mean()))
    assert any(tr.history.get(k).mean_size != pytest.approx(tr.history.get(k).mean_abs_adv) for k in last["keys"])


def test_dense_and_shared_prompt_packing_train_like_padding_with_denser_batches(tmp_path, embedded):
    common = dict(lr=2e-4, max_steps=2, eval_every=1000, save_every=1000, pruner="dppo", prompt_prune_rate=0.5,
                  completion_prune_rate=0.5, kl_coef=0.05, ppo_epochs=2, num_minibatches=2, **SMALL)
    # fixed completions: the densities compared below are then the same on any machine (sampled lengths would make
    # "denser" a property of one machine's rollouts)
    FixedRollout.install(Trainer(TrainConfig(output_dir=str(tmp_path / "pad"), **common))).fit()
    for layout in ("dense", "shared"):
        FixedRollout.install(Trainer(TrainConfig(output_dir=str(tmp_path / layout), packing=layout, pack_capacity=256,
                                            micro_batch_tokens=1024, **common))).fit()
    pad = read_metrics(tmp_path / "pad" / "metrics.jsonl")[1:]
    for layout in ("dense", "shared"):
        pack = read_metrics(tmp_path / layout / "metrics.jsonl")[1:]
        assert pad[0]["reward"] == pack[0]["reward"] and pad[0]["tokens/trained"] == pack[0]["tokens/trained"]
        # step 1's statistics average 4 optimizer updates; after the first, the two layouts' weights differ by
        # rounding (amplified by Adam in elements whose gradient is ~eps), which moves the later updates' loss and
        # KL by ~1e-5 relative; a wrong weight, normaliser or mask would move them by far more than 1e-3
        for key in ("loss", "kl", "grad_norm"):
            assert pack[0][key] == pytest.approx(pad[0][key], rel=1e-3, abs=1e-7), (layout, key)
        assert all(b["density/valid_token"] > a["density/valid_token"] for a, b in zip(pad, pack))
    dense, shared = (read_metrics(tmp_path / x / "metrics.jsonl")[1:] for x in ("dense", "shared"))
    assert shared[0]["density/loss_token"] > dense[0]["density/loss_token"]  # each prompt once per group


@pytest.mark.parametrize("pruner", ["cppo", "dapo_filter"])
def test_cppo_allocation_and_dapo_refill(tmp_path, embedded, pruner):
    cfg = TrainConfig(output_dir=str(tmp_path), pruner=pruner, completion_prune_rate=0.5 if pruner == "cppo" else 0.0,
                      lr=2e-4, max_steps=3, eval_every=1000, save_every=1000, **SMALL)
    Trainer(cfg).fit()
    m = read_metrics(tmp_path / "metrics.jsonl")[1:]
    B, G = cfg.prompts_per_step, cfg.group_size
    for r in m:
        kept_rows = round(r["kept/completion_frac"] * r["prompts/covered"] * r["kept/prompt_frac"] * G)
        if pruner == "cppo":  # allocation: ceil(B / (1 - P)) prompts, top half of each group trains
            assert r["prompts/covered"] == 16 and kept_rows == 16 * G // 2 and r["weights/max"] == 1.0
        else:  # refill in rounds of B prompts; at most B informative groups train, unweighted
            assert r["prompts/covered"] % B == 0 and B <= r["prompts/covered"] <= cfg.dapo_max_rounds * B
            assert kept_rows <= B * G and kept_rows % G == 0 and r["weights/max"] in (0.0, 1.0)


def test_refill_covers_each_epoch_in_fewer_steps(tmp_path, embedded):
    """Dense Prompt Packing's refill: once history has candidates, pruned prompts are replaced from the
    window, so an epoch takes fewer steps; every prompt is still covered once per epoch."""
    cfg = TrainConfig(output_dir=str(tmp_path), **{**SMALL, "epochs": 3, "prompts_per_step": 4}, pruner="dppo",
                      prompt_prune_rate=0.9, refill="prompts", lr=2e-4, eval_every=1000, save_every=1000)
    tr = Trainer(cfg)
    covered = []
    next_keys = tr.composer.next_keys

    def spy(*args):
        covered.append(next_keys(*args))
        return covered[-1]
    tr.composer.next_keys = spy
    # every prompt a candidate from the start (pi = 0.1): a whole look-ahead window (2 x 4 prompts, expected rollout
    # 0.8 prompts) fits one step's budget of 4, so epoch 1 takes 2 steps and no epoch more than 4 (by construction)
    _plant_zero_variance_history(tr)
    tr.fit()
    m = read_metrics(tmp_path / "metrics.jsonl")[1:]
    flat = [k for keys in covered for k in keys]
    assert len(flat) == 3 * cfg.train_size and m[-1]["epoch"] == 3.0
    for e in range(3):
        assert sorted(flat[e * 16:(e + 1) * 16]) == list(range(16))
    window = 2 * cfg.prompts_per_step  # refill_window 0 = twice the step's prompts
    assert m[0]["prompts/covered"] == m[1]["prompts/covered"] == window > cfg.prompts_per_step
    assert len(m) <= 2 + 2 * cfg.train_size / cfg.prompts_per_step < 3 * cfg.train_size / cfg.prompts_per_step  # 12 without refill


def test_phase_timers_wait_for_the_device_at_phase_boundaries(monkeypatch):
    """On a GPU kernels run after the call that queued them returns: a phase must be charged with its own queued work
    (Timer syncs at every boundary). A fake device: queued seconds run, on a fake clock, only when synced."""
    from dppo import trainer as trainer_mod

    clock, queued = [0.0], [0.0]

    def sync():
        clock[0] += queued[0]
        queued[0] = 0.0

    monkeypatch.setattr(trainer_mod.time, "perf_counter", lambda: clock[0])
    timer = trainer_mod.Timer(sync=sync)
    with timer("rollout"):
        queued[0] += 2.0  # launched, not finished
    with timer("update"):
        queued[0] += 0.5
    assert timer.times["rollout"] == 2.0 and timer.times["update"] == 0.5
    unsynced = trainer_mod.Timer()  # CPU: nothing is queued, the boundaries cost nothing
    with unsynced("rollout"):
        queued[0] += 2.0
    assert unsynced.times["rollout"] == 0.0


def test_the_rollout_engine_sleeps_once_per_step_before_the_update_and_evaluates_in_one_call(tmp_path, embedded):
    """vLLM on CUDA frees its memory when told to (`sleep`): the trainer tells it once per step, after every rollout
    of the step and before the update; an evaluation samples every split in one call and leaves it awake (the next
    step's rollout wakes into it: a sleep would need a weight push, a collective under FSDP)."""
    cfg = TrainConfig(output_dir=str(tmp_path), max_steps=2, eval_every=1000, save_every=1000, **SMALL)
    tr = FixedRollout.install(Trainer(cfg))
    events = []
    generate, update = tr.engine.generate, tr.update
    tr.engine.generate = lambda *a, **k: events.append("generate") or generate(*a, **k)
    tr.engine.sleep = lambda: events.append("sleep")
    tr.update = lambda *a, **k: events.append("update") or update(*a, **k)
    tr.train_step()
    assert events == ["generate", "sleep", "update"], events
    events.clear()
    tr.run_eval()
    assert events == ["generate"] and len(tr.evals) > 1, events


MAX_GRAD_NORM = 0.01  # far below the embedded model's gradient norms on FixedRollout's batches (4-140 measured)


@pytest.fixture(scope="module")
def optimizer_steps(tmp_path_factory, embedded):
    """Two warm-up steps of 2 optimizer updates each (num_minibatches 2) on fixed completions, every optimizer step
    watched where it happens: the learning rate AdamW reads from its param groups, the gradient it steps with (after
    clipping), and the norm of the gradient as the backward left it (before clipping). Returns (config, the steps'
    records, one dict per optimizer update)."""
    cfg = TrainConfig(output_dir=str(tmp_path_factory.mktemp("optimizer")), train_size=8, eval_size=2,
                      prompts_per_step=4, group_size=4, max_new_tokens=16, warmup_steps=10, num_minibatches=2,
                      max_grad_norm=MAX_GRAD_NORM, eval_every=1000, save_every=1000, intra_op_threads=1)
    tr = FixedRollout.install(Trainer(cfg))
    updates: list[dict] = []
    clip = tr.accelerator.clip_grad_norm_

    def measured_clip(parameters, max_norm, *args, **kwargs):
        parameters = list(parameters)
        raw = sum(float(p.grad.double().pow(2).sum()) for p in parameters if p.grad is not None) ** 0.5
        norm = clip(parameters, max_norm, *args, **kwargs)
        updates.append({"step": tr.step, "raw_norm": raw, "returned_norm": float(norm)})
        return norm

    def at_optimizer_step(optimizer, args, kwargs):
        stepped = sum(float(p.grad.double().pow(2).sum()) for g in optimizer.param_groups for p in g["params"]
                      if p.grad is not None) ** 0.5
        updates[-1].update(lrs=[g["lr"] for g in optimizer.param_groups], stepped_norm=stepped, optimizer_step=True)

    tr.accelerator.clip_grad_norm_ = measured_clip
    tr.opt.optimizer.register_step_pre_hook(at_optimizer_step)
    records = [tr.train_step() for _ in range(2)]
    return cfg, records, updates


def test_every_optimizer_update_uses_the_scheduled_learning_rate(optimizer_steps):
    """Warm-up is applied to the optimizer, not only logged: each AdamW step of training step k (0-based) reads
    lr x (k + 1) / warmup_steps from every param group, which is also what metrics.jsonl logs as `lr` (a trainer that
    never set the param groups would train at the constructor's rate while the log showed the warm-up)."""
    from dppo.trainer import learning_rate

    cfg, records, updates = optimizer_steps
    assert [u["step"] for u in updates] == [0, 0, 1, 1] and all(u.get("optimizer_step") for u in updates), updates
    for u in updates:
        want = learning_rate(cfg, u["step"])
        assert u["lrs"] and all(lr == want for lr in u["lrs"]), (u["step"], u["lrs"], want)
    assert [r["lr"] for r in records] == [learning_rate(cfg, 0), learning_rate(cfg, 1)] == [cfg.lr / 10, cfg.lr * 2 / 10]


def test_the_optimizer_steps_with_the_clipped_gradient_and_the_log_has_the_norm_before_clipping(optimizer_steps):
    """max_grad_norm is applied: every gradient above it reaches AdamW with norm max_grad_norm (torch's factor
    max_norm / (norm + 1e-6), exact up to float32 rounding), and `grad_norm` in the log is the step's mean norm before
    clipping (what the backward produced), not after."""
    _, records, updates = optimizer_steps
    assert len(updates) == 4
    for u in updates:
        assert u["raw_norm"] > 100 * MAX_GRAD_NORM, u  # the clip binds (else this test would check nothing)
        assert u["returned_norm"] == pytest.approx(u["raw_norm"], rel=1e-5), u
        want = MAX_GRAD_NORM * u["raw_norm"] / (u["returned_norm"] + 1e-6)
        assert u["stepped_norm"] == pytest.approx(want, rel=1e-5), u
    for k, record in enumerate(records):
        norms = [u["returned_norm"] for u in updates if u["step"] == k]
        assert record["grad_norm"] == sum(norms) / len(norms), (record["grad_norm"], norms)
        assert record["grad_norm"] == pytest.approx(sum(u["raw_norm"] for u in updates if u["step"] == k) / 2, rel=1e-5)


def test_prompt_history_round_trips_through_the_checkpoint_file_field_by_field(tmp_path):
    """The per-prompt history (docs/method.md §2.3) through exactly what a checkpoint does with it: `state_dict`, JSON in
    trainer_state.json (`runfiles.write_atomic`), `runfiles.checkpoint_state`, `load_state_dict`. Every field of every
    record comes back, the proportional rule's size proxy included (a record without it would load with the |A|
    fallback, which these sizes differ from)."""
    from dataclasses import asdict, fields

    from dppo.history import PromptHistory, PromptRecord
    from dppo.runfiles import checkpoint_state, write_atomic

    history = PromptHistory()
    history.update(3, [1.0, 0.0, 1.0, 1.0], [0.5, 1.5, 0.5, 0.5], [7, 12, 9, 30], step=0, sizes=[0.03, 0.21, 0.05, 0.01])
    history.update(11, [1.0] * 4, [0.0] * 4, [5, 5, 6, 8], step=0)  # zero variance, no sizes: |A| stands in
    history.update(3, [0.0, 0.0, 1.0, 0.0], [0.5, 0.5, 1.5, 0.5], [10, 11, 4, 2], step=1, sizes=[0.1, 0.2, 0.7, 0.3])
    history.update(11, [1.0] * 4, [0.0] * 4, [5, 6, 6, 7], step=2)  # a second all-correct visit: easy_streak 2
    assert history.records[3].mean_size != history.records[3].mean_abs_adv  # the sizes are not the fallback
    ckpt = tmp_path / "step_3"
    ckpt.mkdir()
    write_atomic(ckpt / "trainer_state.json", json.dumps({"step": 3, "history": history.state_dict()}))
    restored = PromptHistory()
    restored.load_state_dict(checkpoint_state(ckpt)["history"])
    assert restored.records.keys() == history.records.keys() == {3, 11}
    for key, record in history.records.items():
        for field in fields(PromptRecord):  # one by one, so a failure names the field
            assert getattr(restored.records[key], field.name) == getattr(record, field.name), (key, field.name)
        assert asdict(restored.records[key]) == asdict(record)


class _RolloutWithLogprobs(FixedRollout):
    """FixedRollout's completions with sampling log-probs that vary from token to token (FixedRollout's are 0, so
    the logit proxies, sum of 1 - p_t, would be 0 for every completion)."""

    def generate(self, prompts, params):
        batch = super().generate(prompts, params)
        batch.logprobs[:] = [-0.05 * (1 + torch.tensor(ids, dtype=torch.float32).remainder(13)) for ids in batch.completion_ids]
        return batch


def test_a_resumed_proportional_run_restores_every_prompts_history_and_size_proxy(tmp_path, embedded):
    """inclusion proportional (size_proxy: the default): the history a resumed run loads from the checkpoint equals the
    one the interrupted run saved, record by record and field by field, the size proxies included (the prompt stage of
    each prompt's next visit reads them). The full bit-for-bit resume tests are in test_resume_after_interruption_*
    (uniform inclusion) and tests/test_faults.py; this checks the history alone, in two steps."""
    from dataclasses import asdict

    cfg = TrainConfig(output_dir=str(tmp_path), pruner="dppo", prompt_prune_rate=0.5, completion_prune_rate=0.5,
                      inclusion="proportional", train_size=8, eval_size=2, prompts_per_step=4, group_size=4,
                      max_new_tokens=16, eval_every=1000, save_every=1000, intra_op_threads=1)
    assert cfg.size_proxy == "logit_rms"
    tr = _RolloutWithLogprobs.install(Trainer(cfg))
    for _ in range(2):
        tr.train_step()
    tr.save_checkpoint()
    saved = {k: asdict(r) for k, r in tr.history.records.items()}
    assert len(saved) == 8 and any(r["mean_size"] != r["mean_abs_adv"] for r in saved.values()), saved
    resumed = _RolloutWithLogprobs.install(Trainer(cfg))
    assert resumed.maybe_resume() and resumed.step == 2
    assert {k: asdict(r) for k, r in resumed.history.records.items()} == saved
