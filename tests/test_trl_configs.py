"""DPPO inside TRL in the configurations a TRL user sets (docs/trl.md): TRL's default beta = 0 with proportional
inclusion, several reward functions that may return None, normalize_then_sum, max_steps with prompt pruning,
push_to_hub, and the TRL version. Each test runs the real TRL GRPOTrainer underneath (tests/trl_rig.py)."""

import copy
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")
from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

import dppo.trl  # noqa: E402
from dppo.model import load_policy  # noqa: E402
from dppo.trl import DPPOConfig, DPPOTrainer, trl_advantages  # noqa: E402
from tests.masks import enumerate_draws  # noqa: E402
from tests.trl_rig import (COMPLETIONS, PROMPTS, SPG, G, batch_gradient, float64_numerics, make_trainer,  # noqa: E402
                           rows)

ROOT = Path(__file__).resolve().parents[1]
C = {(k, i): tuple(c) for k, (comps, _) in COMPLETIONS.items() for i, c in enumerate(comps)}
# two reward functions over prompts 0 and 1 of the rig, weighted 1 and 2, returning None for some rows: prompt 0's
# weighted sums are all 2 (zero variance if summed first, not after normalize_then_sum's per-function
# normalisation, since the weights differ); prompt 1's second completion is scored by neither function
FIRST = {C[0, 0]: 2.0, C[0, 1]: 0.0, C[0, 2]: 2.0, C[1, 0]: 1.0, C[1, 1]: None, C[1, 2]: 0.0}
SECOND = {C[0, 0]: 0.0, C[0, 1]: 1.0, C[0, 2]: 0.0, C[1, 0]: None, C[1, 1]: None, C[1, 2]: 1.0}


def first_reward(prompts, completions, completion_ids, **kwargs):
    return [FIRST[tuple(ids)] for ids in completion_ids]


def second_reward(prompts, completions, completion_ids, **kwargs):
    return [SECOND[tuple(ids)] for ids in completion_ids]


def zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


def two_prompt_trainer(cls, cfg, model, tok, tmp, **kw):
    data = Dataset.from_list([{"prompt": p} for p in PROMPTS[:2]])
    return make_trainer(cls, cfg, copy.deepcopy(model), tok, data, tmp, 2 * G // SPG, **kw)


def first_batch(trainer):
    """The sampler's first generation batch through DPPOTrainer's pipeline: TRL's output, with the weights."""
    sampler = trainer._get_train_sampler()
    sampler.max_passes, sampler.position, sampler.batch_no = 1, 0, 0
    comp = sampler.compose()
    sampler.compositions[comp.batch_no] = comp
    return trainer._generate_and_score_completions(rows(comp.rolled, comp.batch_no))


def test_beta_zero_proportional_all_zero_variance_is_finite(embedded64, tmp_path):
    """TRL's default beta = 0 with proportional inclusion: every row of a zero-variance group has pi = 0 (an exact
    zero: its loss is 0 for every theta). A batch of only such groups keeps nothing; its weights, logged largest weight,
    loss and gradient are finite (1/pi x 0 would be NaN), and the gradient is TRL's: zero."""
    model, tok = embedded64
    trainer = two_prompt_trainer(DPPOTrainer, DPPOConfig, model, tok, tmp_path, reward_funcs=zero_reward, beta=0.0,
                                 completion_prune_rate=0.5, inclusion="proportional", size_proxy="adv")
    output = first_batch(trainer)
    assert trainer.pruning_log[-1]["completion_pi"] == [[0.0] * G] * 2
    assert torch.isfinite(output["dppo_weight"]).all() and not output["dppo_weight"].any()
    assert math.isfinite(trainer._metrics["train"]["dppo/weight_max"][-1])
    grad = batch_gradient(trainer, output)
    assert torch.isfinite(grad).all() and not grad.any()


@pytest.mark.parametrize("scale_rewards,aggregation", [("group", "sum_then_normalize"), ("batch", "sum_then_normalize"),
                                                       ("none", "sum_then_normalize"), ("group", "normalize_then_sum")])
def test_completion_stage_uses_trls_advantages(embedded64, tmp_path, scale_rewards, aggregation):
    """The completion stage decides from TRL's own advantages: with two weighted reward functions, None rewards
    (one row scored by neither: TRL leaves it out of its group's mean and gives it A = 0) and each aggregation, the
    advantages the pruner reads equal those GRPOTrainer computes for the same batch, and those of
    dppo.trl.trl_advantages."""
    model, tok = embedded64
    kw = dict(reward_funcs=[first_reward, second_reward], reward_weights=[1.0, 2.0], scale_rewards=scale_rewards,
              multi_objective_aggregation=aggregation, beta=0.0)
    grpo = two_prompt_trainer(GRPOTrainer, GRPOConfig, model, tok, tmp_path / "grpo", **kw)
    expected = grpo._generate_and_score_completions(rows([0, 1]))["advantages"].double().view(-1, G)
    dppo_trainer = two_prompt_trainer(DPPOTrainer, DPPOConfig, model, tok, tmp_path / "dppo", **kw,
                                      completion_prune_rate=0.5)
    seen, select = [], dppo_trainer.pruner.select_completions
    dppo_trainer.pruner.select_completions = lambda rewards, adv, *a: seen.append(adv) or select(rewards, adv, *a)
    first_batch(dppo_trainer)
    assert expected[1, 1] == 0 and bool((expected[1] != 0).any())  # the unscored row, and its scored neighbours
    assert torch.equal(seen[0], expected)
    nan = float("nan")
    rewards_per_func = torch.tensor([[nan if f[C[k, i]] is None else f[C[k, i]] for f in (FIRST, SECOND)]
                                     for k in (0, 1) for i in range(G)])
    _, adv = trl_advantages(rewards_per_func, torch.tensor([1.0, 2.0]), G, scale_rewards, aggregation)
    assert torch.equal(adv.double(), expected)


def test_proportional_with_normalize_then_sum_is_exact(embedded64, tmp_path, monkeypatch):
    """normalize_then_sum with weights 1 and 2, None rewards, beta = 0 and proportional inclusion: E over every
    Poisson mask of DPPOTrainer's gradient = GRPOTrainer's full-batch gradient (1e-9, float64). Prompt 0's weighted
    rewards are equal (zero variance when summed first) but TRL's advantages there are not zero: a completion stage
    that summed first would give those rows pi = 0 and lose their gradient."""
    float64_numerics(monkeypatch)
    model, tok = embedded64
    kw = dict(reward_funcs=[first_reward, second_reward], reward_weights=[1.0, 2.0], beta=0.0,
              multi_objective_aggregation="normalize_then_sum")
    grpo = two_prompt_trainer(GRPOTrainer, GRPOConfig, model, tok, tmp_path / "grpo", **kw)
    full = grpo._generate_and_score_completions(rows([0, 1]))
    assert bool((full["advantages"].view(-1, G)[0] != 0).all())
    target = batch_gradient(grpo, full)
    dppo_trainer = two_prompt_trainer(DPPOTrainer, DPPOConfig, model, tok, tmp_path / "dppo", **kw,
                                      completion_prune_rate=0.5, inclusion="proportional", size_proxy="adv")
    draws = enumerate_draws(lambda: batch_gradient(dppo_trainer, first_batch(dppo_trainer)))
    pi = torch.tensor(dppo_trainer.pruning_log[-1]["completion_pi"])
    assert pi[1, 1] == 0 and bool((pi[0] > 0).all()) and len(draws) == 2 ** int(((pi > 0) & (pi < 1)).sum()) > 2
    expected = sum(p * g for p, g in draws)
    assert float((expected - target).abs().max()) / float(target.abs().max()) <= 1e-9


@pytest.mark.parametrize("mode", ["sequence_mask", "token_truncate"])
def test_sampling_ratio_metrics_count_the_kept_rows(embedded64, tmp_path, mode):
    """TRL's sampling/importance_sampling_ratio/{min,mean,max} are logged over the completions the stage kept (TRL's
    own count every pruned row at exactly 1): recomputed from the batch's ratios, they differ from the all-row
    figures TRL would log."""
    model, tok = embedded64
    trainer = two_prompt_trainer(DPPOTrainer, DPPOConfig, model, tok, tmp_path, logprobs=True,
                                 completion_prune_rate=0.5, prune_sampling="fixed_count",
                                 vllm_importance_sampling_mode=mode)
    trainer.use_vllm = trainer.vllm_importance_sampling_correction = True  # no vLLM engine is built
    output = first_batch(trainer)
    keep = torch.tensor(trainer.pruning_log[-1]["completion_keep"]).reshape(-1)
    ratio, mask = output["importance_sampling_ratio"], output["completion_mask"].bool()
    every = ratio.flatten() if mode.startswith("sequence") else ratio[mask]
    kept = ratio[keep].flatten() if mode.startswith("sequence") else ratio[mask & keep[:, None]]
    assert 0 < int(keep.sum()) < keep.numel()
    logged = [trainer._metrics["train"][f"sampling/importance_sampling_ratio/{k}"][-1] for k in ("min", "mean", "max")]
    assert logged == pytest.approx([float(kept.min()), float(kept.mean()), float(kept.max())], rel=1e-6)
    assert [float(every.min()), float(every.mean()), float(every.max())] != pytest.approx(logged, rel=1e-6)


def test_reward_functions_see_the_users_columns_only(embedded64, tmp_path):
    """The sampler's keys (dppo_index, dppo_batch) leave each row before TRL generates: reward functions, like an
    environment's reset(**row), receive the dataset's columns as GRPOTrainer gives them."""
    seen = []

    def recording_reward(completions, **kwargs):
        seen.append(sorted(kwargs))
        return [float(i % 2) for i in range(len(completions))]
    model, tok = embedded64
    trainer = two_prompt_trainer(DPPOTrainer, DPPOConfig, model, tok, tmp_path, completion_prune_rate=0.5,
                                 reward_funcs=recording_reward)
    first_batch(trainer)
    assert seen and not any(k.startswith("dppo") for k in seen[0]) and "completion_ids" in seen[0]


def test_prompt_pruning_with_batch_statistics_warns(tmp_path):
    """scale_rewards 'batch' and normalize_then_sum normalise by statistics of the rolled-out prompts, which the
    prompt stage changes: DPPOConfig says so (as dppo's own trainer does); the exact configurations do not warn."""
    common = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    for kw in (dict(scale_rewards="batch"), dict(multi_objective_aggregation="normalize_then_sum")):
        with pytest.warns(UserWarning, match="not exactly unbiased"):
            DPPOConfig(**common, prompt_prune_rate=0.5, **kw)
    for kw in (dict(prompt_prune_rate=0.5, scale_rewards="group"),
               dict(completion_prune_rate=0.5, scale_rewards="batch")):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            DPPOConfig(**{**common, **kw})
        assert not [w for w in caught if "not exactly unbiased" in str(w.message)], kw


def run_args(tmp, **kw):
    base = dict(output_dir=str(tmp), use_cpu=True, bf16=False, num_generations=4, per_device_train_batch_size=16,
                steps_per_generation=1, max_completion_length=8, report_to="none", save_strategy="no", seed=0,
                disable_tqdm=True, learning_rate=1e-4, prompt_prune_rate=0.5, completion_prune_rate=0.5)
    return DPPOConfig(**{**base, **kw})


def prompts_data(n):
    from dppo.task import make_train
    return Dataset.from_list([{"prompt": p.prompt} for p in make_train(n, 0)])


def test_max_steps_with_prompt_pruning_trains_max_steps(tmp_path, monkeypatch):
    """max_steps with prompt pruning: transformers sizes its epochs by TRL's unpruned pass (16 prompts / 4 = 4
    steps), pruned passes are shorter (zero rewards: from the second pass every prompt is a candidate, 2 batches of 7
    covered prompts), and the run still trains exactly max_steps = 10 steps, its linear schedule reaching 0, with
    consecutive generation batches (none fetched at an epoch's end and skipped). The log keeps the last 6 batches."""
    monkeypatch.setattr(dppo.trl, "PRUNING_LOG_LENGTH", 6)
    model, tok = load_policy("embedded")
    trainer = DPPOTrainer(model=model, reward_funcs=zero_reward, train_dataset=prompts_data(16), processing_class=tok,
                          args=run_args(tmp_path, max_steps=10, lr_scheduler_type="linear", logging_steps=1))
    trainer.train()
    assert trainer.state.global_step == 10
    assert [e["batch"] for e in trainer.pruning_log] == [4, 5, 6, 7, 8, 9]
    passes = [e["pass"] for e in trainer.pruning_log]
    assert passes[0] >= 1 and passes[-1] >= 2  # pruned passes: more than TRL's 10 / 4 = 2.5 of them
    assert all(len(e["covered"]) == 7 for e in trainer.pruning_log)
    assert trainer.lr_scheduler.get_last_lr()[0] == 0.0


def test_a_pass_that_cannot_fill_a_batch_runs_without_the_prompt_stage():
    """8 prompts, 8 a batch, every one a candidate at prompt_prune_rate 0.5: the prompt stage keeps 4 of a pass, never
    a batch. Each pass then runs without it (all 8 covered and kept, pi_q = 1: exact), with a warning naming why,
    instead of yielding nothing (under max_steps a sampler with unbounded passes waited forever)."""
    from dppo.trl import PruningSampler

    sampler = PruningSampler(8, 8, 1, 1, False, 0, candidates=lambda keys: torch.ones(len(keys), dtype=torch.bool),
                             est_lengths=lambda keys: [4.0] * len(keys), prompt_rate=0.5, max_passes=5,
                             one_pass_per_iter=False)
    with pytest.warns(UserWarning, match="cannot fill one generation batch of 8 prompts with prompt_prune_rate 0.5 "
                                         r"\(8 of its 8 prompts are candidates\)"):
        items = list(sampler)
    assert items == [(k, b) for b in range(5) for k in range(8)]  # a batch a pass, every prompt rolled out
    assert sampler.unpruned_pass == 4


@pytest.mark.timeout(300)
def test_max_steps_when_no_pass_can_fill_a_batch_trains_max_steps(tmp_path):
    """Through train(): 4 prompts, 4 a batch, zero rewards: from the second pass every prompt is a candidate and the
    prompt stage would keep 2. The run trains its max_steps = 3 steps, each batch all 4 prompts with pi_q = 1 (it
    waited forever before)."""
    model, tok = load_policy("embedded")
    trainer = DPPOTrainer(model=model, reward_funcs=zero_reward, train_dataset=prompts_data(4), processing_class=tok,
                          args=run_args(tmp_path, max_steps=3))
    with pytest.warns(UserWarning, match="cannot fill one generation batch"):
        trainer.train()
    assert trainer.state.global_step == 3
    assert [(e["pass"], len(e["covered"]), sum(e["prompt_keep"]), set(e["prompt_pi"])) for e in trainer.pruning_log] \
        == [(p, 4, 4, {1.0}) for p in range(3)]


def alternating_reward(completions, **kwargs):  # 0, 1, 0, 1 in every group: never zero variance
    return [float(i % 2) for i in range(len(completions))]


def test_a_shortened_pass_ends_on_an_optimizer_step(tmp_path):
    """gradient_accumulation_steps 2, steps_per_generation 1, 12 prompts, 4 a batch, every visited prompt a candidate
    (abs_adv, threshold 100): the first pass is TRL's 3 micro-batches (transformers steps after 2 and at its planned
    epoch end), the next two are shortened by the prompt stage to one batch (7 prompts covered for 4 kept), a window
    left half full. A zero-weight padding micro-batch completes it: every epoch ends with no gradient waiting (the
    old code carried a pass's gradient into the next pass's step, and dropped the last), the run makes 2 + 1 + 1
    optimizer steps, each window's loss is normalised by its own micro-batches (2, 2 | 1 | 1 | 1, as TRL normalises
    its last partial window), and the padding generates nothing, logs nothing and trains no row."""
    from transformers import TrainerCallback

    class Ledger(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            steps.append(any(q.grad is not None and bool(q.grad.any()) for q in model.parameters()))

        def on_epoch_end(self, args, state, control, model=None, **kw):
            waiting.append(any(q.grad is not None and bool(q.grad.any()) for q in model.parameters()))
    steps, waiting, normalisers = [], [], []
    model, tok = load_policy("embedded")
    trainer = DPPOTrainer(model=model, reward_funcs=alternating_reward, train_dataset=prompts_data(12),
                          processing_class=tok,
                          args=run_args(tmp_path, num_train_epochs=3, gradient_accumulation_steps=2, logging_steps=1,
                                        prompt_candidate_rule="abs_adv", abs_adv_threshold=100.0),
                          callbacks=[Ledger()])
    compute_loss = trainer._compute_loss

    def record(model, inputs):
        normalisers.append((trainer.current_gradient_accumulation_steps, bool(inputs["dppo_weight"].any())))
        return compute_loss(model, inputs)
    trainer._compute_loss = record
    trainer.train()
    assert [(e["pass"], len(e["covered"])) for e in trainer.pruning_log] == [(0, 4), (0, 4), (0, 4), (1, 7), (2, 7)]
    assert waiting == [False, False, False] and trainer.state.global_step == 4 and all(steps) and len(steps) == 4
    assert normalisers == [(2, True), (2, True), (1, True), (1, True), (1, False), (1, True), (1, False)]
    assert trainer._step == 5 and trainer.scored_rows["update"] == sum(sum(map(sum, e["completion_keep"]))
                                                                       for e in trainer.pruning_log)
    assert len(trainer.state.log_history) - 1 == 4  # one log a step (and the run's summary), padding adds none


def test_checkpoint_holds_the_pruning_state_when_pushed(tmp_path):
    """With push_to_hub a checkpoint is pushed as transformers saves it: dppo_state.json must already be in it."""
    model, tok = load_policy("embedded")
    trainer = DPPOTrainer(model=model, reward_funcs=zero_reward, train_dataset=prompts_data(8), processing_class=tok,
                          args=run_args(tmp_path, max_steps=1, save_strategy="steps", save_steps=1))
    pushed = []
    trainer.args.push_to_hub = True  # set after construction: no hub repository is created
    trainer._push_from_checkpoint = lambda folder: pushed.append(os.listdir(folder))
    trainer.train()
    assert len(pushed) == 1 and "dppo_state.json" in pushed[0] and "trainer_state.json" in pushed[0]


def test_untested_trl_version_is_one_line():
    """dppo.trl overrides private TRL methods: another TRL release is refused at import in one line naming the tested
    range (DPPO_TRL_UNTESTED=1 lets a user try it)."""
    code = "import trl; trl.__version__ = '1.17.0'; import dppo.trl"
    env = {k: v for k, v in os.environ.items() if k != "DPPO_TRL_UNTESTED"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0 and last.startswith("ImportError: dppo.trl is tested with TRL >= 1.16, < 1.17"), last
    ok = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**env, "DPPO_TRL_UNTESTED": "1"},
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr[-2000:]


def padded_batch(tok, prompts: list[str], completions: list[list[int]]):
    """TRL's layout: prompts left-padded, completions right-padded (ids, attention mask, logits_to_keep)."""
    prompt_ids = [tok(p)["input_ids"] for p in prompts]
    P, K = max(map(len, prompt_ids)), max(map(len, completions))
    ids = torch.zeros(len(prompts), P + K, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, c) in enumerate(zip(prompt_ids, completions)):
        ids[i, P - len(p):P], mask[i, P - len(p):P] = torch.tensor(p), 1
        ids[i, P:P + len(c)], mask[i, P:P + len(c)] = torch.tensor(c), 1
    return ids, mask, K


@pytest.mark.parametrize("dtype,tolerance", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_packed_passes_equal_padded(embedded, tmp_path, monkeypatch, dtype, tolerance):
    """pack_sequences: the log-probs and entropies of the completion tokens, and the gradient of a weighted sum of
    the log-probs, computed on the rows packed densely equal TRL's padded pass (float64: 1e-12 with TRL's kernel and
    the norms in float64, measured <= 1.9e-15; float32 as shipped: 1e-5, measured <= 5.7e-7), in fewer token slots."""
    if dtype == torch.float64:
        float64_numerics(monkeypatch)
    model, tok = embedded
    trainer = two_prompt_trainer(DPPOTrainer, DPPOConfig, copy.deepcopy(model).to(dtype), tok, tmp_path,
                                 completion_prune_rate=0.5)
    prompts = [PROMPTS[k] for k in (0, 1, 2, 3, 0, 2)]
    completions = [list(c) for k in (0, 1) for c in COMPLETIONS[k][0]]
    ids, mask, K = padded_batch(tok, prompts, completions)
    completion_mask = mask[:, -K:].bool()
    weights = torch.randn(completion_mask.shape, generator=torch.Generator().manual_seed(0), dtype=dtype)
    results, slots = {}, {}
    for packed in (True, False):
        trainer.args.pack_sequences = packed
        trainer.model.zero_grad()
        trainer.scored_positions.clear()
        logps, entropies, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, K,
                                                                        compute_entropy=True)
        (logps * weights * completion_mask).sum().backward()
        grad = torch.cat([q.grad.reshape(-1) for q in trainer.model.parameters() if q.grad is not None])
        results[packed] = (logps[completion_mask].detach(), entropies[completion_mask].detach(), grad)
        slots[packed] = trainer.scored_positions["update"]
    for got, want in zip(results[True], results[False]):
        error = float((got - want).abs().max()) / float(want.abs().max())
        print(f"packed vs padded: {error:.1e}")
        assert error <= tolerance
    assert slots[False] == ids.numel() and slots[True] <= int(mask.sum()) < slots[False]  # one row, no padding


def test_every_pruning_field_reaches_the_pruner(embedded64, tmp_path):
    """DPPOConfig's pruning fields, each set away from its default (prompt_candidate_rule abs_adv, a threshold,
    fixed_count, the proportional rule's floor, proxy and mix; beta and loss_type), are the ones DPPOTrainer's pruner
    holds (an option read from the config but not handed over would silently keep the default)."""
    from dppo.pruning import DPPO

    model, tok = embedded64
    fields = dict(prompt_prune_rate=0.3, completion_prune_rate=0.4, prune_sampling="fixed_count",
                  prompt_candidate_rule="abs_adv", abs_adv_threshold=0.2, inclusion_floor=0.2, size_proxy="adv",
                  uniform_mix=0.5)
    trainer = two_prompt_trainer(DPPOTrainer, DPPOConfig, model, tok, tmp_path, loss_type="dr_grpo", beta=0.07,
                                 **fields)
    assert trainer.pruner == DPPO(prompt_prune_rate=0.3, completion_prune_rate=0.4, prune_sampling="fixed_count", prompt_candidate_rule="abs_adv",
                                  abs_adv_threshold=0.2, inclusion="uniform", inclusion_floor=0.2, size_proxy="adv",
                                  uniform_mix=0.5, kl_coef=0.07, loss_agg="seq-mean-token-sum-norm")
    trainer = two_prompt_trainer(DPPOTrainer, DPPOConfig, model, tok, tmp_path, completion_prune_rate=0.4,
                                 inclusion="proportional", size_proxy="length")
    assert (trainer.pruner.inclusion, trainer.pruner.size_proxy) == ("proportional", "length")
