"""DPPO inside TRL (dppo.trl, docs/trl.md), tested against the real TRL GRPOTrainer.

The exactness tests enumerate every outcome of every mask a generation batch draws (tests/masks.py patches the
library's draws) through DPPOTrainer's real generation-batch pipeline, loss and backward, in float64, and compare
the expectation of the gradient with GRPOTrainer's gradient of the full covered batch. Only the generation backend
is fixed (each prompt's completions are given, so both trainers see the same rollouts); rewards, advantages, the
reference pass and the loss are TRL's own, as shipped (TRL's float32 log-prob kernel, transformers' float32 RMSNorm)
or, to test to 1e-9, with those two computed in float64."""

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")
from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from dppo.config import ConfigError  # noqa: E402
from dppo.history import PromptRecord  # noqa: E402
from dppo.model import load_policy  # noqa: E402
from dppo.trl import DPPOConfig, DPPOTrainer  # noqa: E402
from tests.masks import enumerate_draws  # noqa: E402
from tests.trl_rig import (COMPLETIONS, PROMPTS, SPG, G, batch_gradient, float64_numerics, make_trainer,  # noqa: E402
                           rows, sampling_logprobs)

# A "float64" model is not float64 end to end: TRL 1.16 scores log-probs with a float32 kernel
# (trl/kernels/chunked_logprob.py: fp32 logsumexp statistics, fp32 gradient GEMMs) and transformers' Qwen3RMSNorm
# normalises in float32. Identical shapes give identical float32 results, but the update's kept rows are trimmed to
# their own width, so a gradient through them agrees with TRL's full batch only to float32 rounding: the bound on
# max |E[g] - g_TRL| / max |g_TRL| as shipped (measured: <= 2.4e-7 over these cases). With both computed in float64
# (tests/trl_rig.float64_numerics) the bound is 1e-9. A wrong weight or normaliser is off by 0.29 or more
# (docs/trl.md); the last assertion of the test shows one mask outcome alone is off too.
TOLERANCE = {"as_shipped": 2e-6, "float64": 1e-9}


CASES = [("grpo", 0.0, "bernoulli", 0.0), ("grpo", 0.1, "fixed_count", 0.0), ("grpo", 0.1, "bernoulli", 0.7),
         ("dr_grpo", 0.0, "fixed_count", 0.7), ("dr_grpo", 0.1, "bernoulli", 0.0),
         ("bnpo", 0.0, "fixed_count", 0.0), ("bnpo", 0.1, "bernoulli", 0.0),
         ("dapo", 0.0, "bernoulli", 0.7), ("dapo", 0.1, "fixed_count", 0.7), ("dapo", 0.1, "bernoulli", 0.0),
         ("luspo", 0.1, "fixed_count", 0.7), ("luspo", 0.0, "bernoulli", 0.0)]
AS_SHIPPED = [CASES[i] for i in (2, 3, 6, 8)]  # each loss type once, prompt pruning where it is allowed


def enumerate_trl_step(model, tok, tmp_path, loss_type, beta, sampling, prompt_rate, length_shift=0.0,
                       perturb=False, **step):
    """(every mask outcome's (probability, DPPOTrainer gradient), GRPOTrainer's gradient of the full covered batch,
    DPPOTrainer). With prompt pruning the 4 prompts are candidates (zero variance at the last visit) whose recorded
    mean lengths are the given completions' plus `length_shift`; fixed_count keeps exactly 2 of 4, so the batch
    covers all 4 and generates 2 (6 outcomes); without, 2 prompts are covered and generated. `perturb`: the
    parameters move after the old-policy pass and before the loss (as num_iterations > 1 reuses a batch), the same
    move for both trainers. `step`: GRPOConfig fields of the step's shape (steps_per_generation, ...)."""
    covered = [0, 1, 2, 3] if prompt_rate else [0, 1]
    data = Dataset.from_list([{"prompt": p} for p in PROMPTS[:len(covered)]])
    vllm_is = step.pop("vllm_is", False)  # TRL's vLLM importance-sampling correction, on sampling log-probs near
    logprobs = sampling_logprobs(model, tok, covered) if vllm_is else False  # the model's (ratios around 1)
    common = dict(loss_type=loss_type, beta=beta, logprobs=logprobs, **step)
    spg = step.get("steps_per_generation", SPG)
    torch.manual_seed(1)
    move = [0.01 * torch.randn_like(p) for p in model.parameters()] if perturb else None
    full = make_trainer(GRPOTrainer, GRPOConfig, copy.deepcopy(model), tok, data, tmp_path / "grpo",
                        len(covered) * G // spg, **common)
    dppo = make_trainer(DPPOTrainer, DPPOConfig, copy.deepcopy(model), tok, data, tmp_path / "dppo",
                        2 * G // spg, **common, prompt_prune_rate=prompt_rate, completion_prune_rate=0.5,
                        prune_sampling=sampling)
    for trainer in (full, dppo) if vllm_is else ():  # set after construction: no vLLM engine is built
        trainer.use_vllm = trainer.vllm_importance_sampling_correction = True
    original = [p.detach().clone() for p in model.parameters()]

    def set_parameters(trainer, moved: bool):
        with torch.no_grad():
            for i, p in enumerate(trainer.model.parameters()):
                p.copy_(original[i] + move[i] if moved else original[i])

    def gradient(trainer, batch):
        """The batch generated (and its old-policy pass run) at the original parameters, the gradient at the moved
        ones when perturbing."""
        set_parameters(trainer, False)
        output = trainer._generate_and_score_completions(batch)
        if move is not None:
            set_parameters(trainer, True)
        return batch_gradient(trainer, output)

    target = gradient(full, rows(covered))
    sampler = dppo._get_train_sampler()
    sampler.max_passes = 1
    for key in covered if prompt_rate else []:  # seen before, zero variance, the loss tokens these completions have
        truncation = step.get("mask_truncated_completions")
        counted = [c for c in COMPLETIONS[key][0] if not truncation or c[-1] == tok.eos_token_id]
        mean_len = sum(map(len, counted)) / G + length_shift
        dppo.prompt_history.records[key] = PromptRecord(visits=1, zero_variance=True, mean_length=mean_len)
    history = copy.deepcopy(dppo.prompt_history.records)

    def one_draw():
        dppo.prompt_history.records = copy.deepcopy(history)
        sampler.position = sampler.batch_no = 0
        comp = sampler.compose()
        assert sorted(comp.covered) == covered and len(comp.rolled) == 2
        sampler.compositions[comp.batch_no] = comp
        return gradient(dppo, rows(comp.rolled, comp.batch_no))

    draws = enumerate_draws(one_draw)
    assert len(draws) > (6 if prompt_rate else 3)  # masks were enumerated at the stages under test
    return draws, target, dppo


def relative_error(draws, target) -> float:
    expected = sum(p * g for p, g in draws)
    return float((expected - target).abs().max()) / float(target.abs().max())


@pytest.mark.parametrize("loss_type,beta,sampling,prompt_rate,numerics",
                         [(*c, "float64") for c in CASES] + [(*c, "as_shipped") for c in AS_SHIPPED])
def test_expected_gradient_is_trls_full_batch_gradient(embedded64, tmp_path, loss_type, beta, sampling, prompt_rate,
                                                      numerics, monkeypatch):
    """E over every prompt and completion mask of DPPOTrainer's gradient (its sampler's prompt stage, its
    generation-batch pipeline, TRL's loss with the weights, backward) = GRPOTrainer's gradient of the full covered
    batch, in float64: to 1e-9 with TRL's log-prob kernel and the model's norms computed in float64, to float32
    rounding as shipped (TOLERANCE). With prompt pruning at r_q = 0.7 the candidates' recorded lengths are their
    true mean lengths, so dapo's token normaliser Z is the batch's token count (other lengths: the next test)."""
    if numerics == "float64":
        float64_numerics(monkeypatch)
    draws, target, _ = enumerate_trl_step(*embedded64, tmp_path, loss_type, beta, sampling, prompt_rate)
    error = relative_error(draws, target)
    print(f"max |E[g] - g_TRL| / max |g_TRL| = {error:.2e}")
    assert error <= TOLERANCE[numerics], error
    # the enumeration can tell: one mask outcome alone is not the full-batch gradient
    assert float((draws[0][1] - target).abs().max()) / float(target.abs().max()) > 1e-3


@pytest.mark.parametrize("loss_type,step,perturb", [
    ("dapo", dict(steps_per_generation=2, gradient_accumulation_steps=1), False),  # spg > GA: two steps a batch
    ("dapo", dict(steps_per_generation=1, gradient_accumulation_steps=2), False),  # GA > spg
    ("grpo", dict(steps_per_generation=2, gradient_accumulation_steps=1), False),
    ("grpo", dict(num_iterations=2), True),  # the old-policy pass scores the kept rows; the ratio moves off 1
    ("dapo", dict(num_iterations=2, epsilon=0.05), True),  # ... and clips
    ("dr_grpo", dict(mask_truncated_completions=True), False),  # completions without EOS leave the loss
    ("dapo", dict(mask_truncated_completions=True), False),  # ... and the token count
    ("grpo", dict(vllm_is=True), False),  # TRL's vLLM IS ratio (default: sequence level, masked above 3)
    ("dapo", dict(vllm_is=True, vllm_importance_sampling_mode="token_truncate"), False),  # per token, clipped at 3
    ("luspo", dict(importance_sampling_level="sequence"), False),  # LUSPO as recommended: GSPO's sequence ratio
    ("luspo", dict(importance_sampling_level="sequence", num_iterations=2), True),  # ... moved off 1
])
def test_expected_gradient_in_other_step_shapes(embedded64, tmp_path, monkeypatch, loss_type, step, perturb):
    """The same identity (E[g] = GRPOTrainer's full-batch gradient, 1e-9 in float64) where TRL's step differs from one
    optimizer step per generation batch: steps_per_generation and gradient_accumulation_steps unequal either way
    (the sum of the batch's steps' gradients; dapo's factor P spg / GA), num_iterations = 2 with the parameters moved
    after the old-policy pass (importance ratios != 1, clipped), mask_truncated_completions (the rig's completions
    that end without EOS leave the loss), and TRL's vLLM importance-sampling correction (the rig's sampling log-probs
    against the old policy's, token and sequence level)."""
    float64_numerics(monkeypatch)
    prompt_rate = 0.7 if loss_type in ("dapo", "luspo") else 0.0
    draws, target, dppo = enumerate_trl_step(*embedded64, tmp_path, loss_type, 0.1, "bernoulli", prompt_rate,
                                             perturb=perturb, **step)
    assert relative_error(draws, target) <= TOLERANCE["float64"]
    if perturb or dppo.use_vllm:
        assert dppo.scored_rows["old_policy"] > 0  # the old-policy pass ran (on kept rows)


@pytest.mark.parametrize("shift", [-0.5, 1.0])
def test_dapo_prompt_stage_normaliser_uses_recorded_lengths(embedded64, tmp_path, monkeypatch, shift):
    """dapo with prompt pruning divides by Z_tok = sum over candidate prompts of G x their mean length at the last
    visit (docs/method.md §2.6), fixed before the masks: when those lengths are off by `shift` tokens, E[g] is
    GRPOTrainer's gradient scaled by T_S / Z_tok (T_S: the covered batch's true loss tokens), to 1e-9."""
    float64_numerics(monkeypatch)
    draws, target, _ = enumerate_trl_step(*embedded64, tmp_path, "dapo", 0.1, "fixed_count", 0.7,
                                          length_shift=shift)
    true_tokens = sum(len(c) for k in range(4) for c in COMPLETIONS[k][0])
    z = true_tokens + 4 * G * shift
    assert relative_error(draws, target * true_tokens / z) <= TOLERANCE["float64"]
    assert relative_error(draws, target) > 1e-3  # the factor is visible


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_fixed_loss_normaliser_divides_by_the_rolled_batch(embedded64, tmp_path, monkeypatch, loss_type):
    """loss_normaliser fixed (docs/method.md §2.6): Z = the covered normaliser x B / |S|, B the prompts a batch rolls
    out, |S| those it covers (seq-mean: B G rows, not |S| G; token-mean: Z_tok B / |S|). The rig's 4 prompts are
    candidates and fixed_count keeps 2, so the same generation batch (same masks: they are seeded by the batch) has
    exactly half the covered normaliser (logged as used) and twice its gradient, to 1e-9 in float64. With the covered
    normaliser E[g] is GRPOTrainer's full-batch gradient (test_expected_gradient_is_trls_full_batch_gradient): with
    fixed it is (|S| / B) times that, the unbiased estimate of the per-step loss the fixed normaliser targets."""
    float64_numerics(monkeypatch)
    model, tok = embedded64
    data = Dataset.from_list([{"prompt": p} for p in PROMPTS])
    dppo = make_trainer(DPPOTrainer, DPPOConfig, copy.deepcopy(model), tok, data, tmp_path, 2 * G // SPG,
                        loss_type=loss_type, beta=0.0, prompt_prune_rate=0.7, completion_prune_rate=0.5,
                        prune_sampling="fixed_count", loss_normaliser="fixed")
    history = {k: PromptRecord(visits=1, zero_variance=True, mean_length=sum(map(len, COMPLETIONS[k][0])) / G)
               for k in range(4)}
    sampler = dppo._get_train_sampler()
    sampler.max_passes = 1
    grads, logs = {}, {}
    for mode in ("fixed", "covered"):
        dppo.args.loss_normaliser = mode
        dppo.prompt_history.records = copy.deepcopy(history)
        sampler.position = sampler.batch_no = 0
        comp = sampler.compose()
        sampler.compositions[comp.batch_no] = comp
        assert len(comp.covered) == 4 and len(comp.rolled) == 2
        grads[mode] = batch_gradient(dppo, dppo._generate_and_score_completions(rows(comp.rolled, comp.batch_no)))
        logs[mode] = dppo.pruning_log[-1]
    assert logs["fixed"]["prompt_keep"] == logs["covered"]["prompt_keep"]  # the same batch and masks
    assert logs["fixed"]["completion_keep"] == logs["covered"]["completion_keep"]
    z_covered = 4.0 * G if loss_type == "grpo" else float(sum(len(c) for k in range(4) for c in COMPLETIONS[k][0]))
    assert (logs["fixed"]["normaliser"], logs["covered"]["normaliser"]) == (z_covered * 2 / 4, z_covered)
    assert bool(grads["covered"].any())
    error = float((grads["fixed"] - 2 * grads["covered"]).abs().max()) / float(grads["fixed"].abs().max())
    assert error <= TOLERANCE["float64"], error


@pytest.mark.parametrize("proxy", ["adv", "logit_rms"])
def test_proportional_completion_stage_is_exact_in_trl(embedded64, tmp_path, proxy, monkeypatch):
    """inclusion proportional in DPPOTrainer (completion stage, docs/trl.md; with KL, so no row is an exact zero): E
    over every Poisson mask of its gradient = GRPOTrainer's full-batch gradient, to 1e-9 in float64. With `logit_rms`
    the sizes are read from the sampled tokens' log-probs as TRL's vLLM backend returns them (the rig's generation
    returns a fixed table in its place; the config refuses the logit proxies without use_vllm, so the pruner's proxy
    is switched after construction): every process's rows are gathered in order and reach the completion stage."""
    from dppo.pruning import logit_grad_sizes
    from tests.trl_rig import LOGPROBS

    float64_numerics(monkeypatch)
    model, tok = embedded64
    covered = [0, 1]
    data = Dataset.from_list([{"prompt": p} for p in PROMPTS[:len(covered)]])
    common = dict(loss_type="grpo", beta=0.1)
    full = make_trainer(GRPOTrainer, GRPOConfig, copy.deepcopy(model), tok, data, tmp_path / "grpo",
                        len(covered) * G // SPG, **common)
    target = batch_gradient(full, full._generate_and_score_completions(rows(covered)))
    dppo = make_trainer(DPPOTrainer, DPPOConfig, copy.deepcopy(model), tok, data, tmp_path / "dppo", G, logprobs=True,
                        **common, completion_prune_rate=0.5, inclusion="proportional", size_proxy="adv")
    dppo.pruner.size_proxy = proxy
    seen, select = [], dppo.pruner.select_completions

    def spy(rewards, adv, gen, lengths=None, logit_grad=None):
        sel = select(rewards, adv, gen, lengths, logit_grad)
        seen.append((logit_grad, sel.pi))
        return sel
    dppo.pruner.select_completions = spy
    sampler = dppo._get_train_sampler()
    sampler.max_passes = 1

    def one_draw():
        sampler.position = sampler.batch_no = 0
        comp = sampler.compose()
        sampler.compositions[comp.batch_no] = comp
        return batch_gradient(dppo, dppo._generate_and_score_completions(rows(comp.rolled, comp.batch_no)))

    draws = enumerate_draws(one_draw)
    logit_grad, pi = seen[0]
    assert len(draws) == 2 ** int(((pi > 0) & (pi < 1)).sum()) > 8  # each row with pi < 1 kept or not, independently
    expected = sum(p * g for p, g in draws)
    assert float((expected - target).abs().max()) / float(target.abs().max()) <= TOLERANCE["float64"]
    if proxy == "logit_rms":
        table = [torch.tensor(LOGPROBS[tuple(c)], dtype=torch.float64) for k in covered for c in COMPLETIONS[k][0]]
        assert torch.equal(logit_grad, logit_grad_sizes(table, G))
    else:
        assert logit_grad is None
    assert 0 < float(pi.min()) < float(pi.max()) <= 1 and len(set(pi.reshape(-1).tolist())) > 2  # sized, not uniform


# ------------------------------------------------------------------ real runs (sampled generation)
def run_config(tmp, **kw):
    base = dict(output_dir=str(tmp), use_cpu=True, bf16=False, num_generations=4, per_device_train_batch_size=16,
                steps_per_generation=1, max_completion_length=12, num_train_epochs=3, report_to="none",
                save_strategy="no", seed=0, disable_tqdm=True, learning_rate=1e-4)
    return {**base, **kw}


def zero_reward(completions, **kwargs):  # every group zero-variance: every prompt a candidate after its first visit
    return [0.0] * len(completions)


def length_reward(completions, **kwargs):
    return [float(len(c) % 3 == 0) for c in completions]


def prompts_data(n):
    from dppo.task import make_train
    return Dataset.from_list([{"prompt": p.prompt} for p in make_train(n, 0)])


def test_rates_zero_is_grpo_trainer(tmp_path):
    """Two imports changed, nothing else: with the default DPPOConfig the run is GRPOTrainer's, parameter for
    parameter (same batches, same loss, same sampling)."""
    data, finals = prompts_data(8), []
    for cls, cfg in ((GRPOTrainer, GRPOConfig), (DPPOTrainer, DPPOConfig)):
        model, tok = load_policy("embedded")
        initial = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        args = cfg(**run_config(tmp_path / cls.__name__, max_steps=3, beta=0.04, per_device_train_batch_size=8))
        trainer = cls(model=model, reward_funcs=length_reward, args=args, train_dataset=data, processing_class=tok)
        trainer.train()
        finals.append(torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()]))
    assert not trainer.pruning and list(trainer.pruning_log) == []
    assert not torch.equal(finals[0], initial)  # the run moved the weights, so equality means something
    assert torch.equal(finals[0], finals[1])


def test_passes_score_kept_rows_only(tmp_path):
    """Pruned completions never reach the old-policy or reference pass nor the update: each pass scores exactly the
    rows the completion stage kept (fixed_count: at least one pruned in every batch with 2 candidates)."""
    model, tok = load_policy("embedded")
    args = DPPOConfig(**run_config(tmp_path, max_steps=4, steps_per_generation=2, gradient_accumulation_steps=1,
                                   beta=0.04, completion_prune_rate=0.5, prune_sampling="fixed_count"))
    trainer = DPPOTrainer(model=model, reward_funcs=length_reward, args=args, train_dataset=prompts_data(16),
                          processing_class=tok)
    trainer.train()
    kept = sum(sum(map(sum, e["completion_keep"])) for e in trainer.pruning_log)
    total = sum(len(e["completion_keep"]) * 4 for e in trainer.pruning_log)
    assert len(trainer.pruning_log) == 2 and 0 < kept < total
    # steps_per_generation 2 > gradient_accumulation_steps 1: TRL runs the old-policy pass; beta > 0: the reference
    assert trainer.scored_rows["old_policy"] == trainer.scored_rows["reference"] == kept
    assert trainer.scored_rows["update"] == kept
    width = 12 + max(len(tok(x)["input_ids"]) for x in prompts_data(16)["prompt"])
    for phase in ("old_policy", "reference", "update"):
        assert trainer.scored_positions[phase] <= kept * width


def test_resume_continues_the_pruning_history(tmp_path):
    """A run resumed from a TRL checkpoint composes the next batch as the uninterrupted run did (same covered
    prompts, masks and inclusion probabilities): the prompt history and the sampler's position travel in the
    checkpoint. Every group has zero variance, so from the second pass on every prompt is a candidate."""
    kw = run_config(tmp_path / "a", save_strategy="steps", save_steps=5, prompt_prune_rate=0.5,
                    completion_prune_rate=0.5)
    model, tok = load_policy("embedded")
    a = DPPOTrainer(model=model, reward_funcs=zero_reward, args=DPPOConfig(**kw), train_dataset=prompts_data(16),
                    processing_class=tok)
    a.train()
    assert [len(e["covered"]) for e in a.pruning_log] == [4, 4, 4, 4, 7, 7, 7, 7]  # pass 2 covers 7 for 4 rolled
    assert (tmp_path / "a" / "checkpoint-5" / "dppo_state.json").is_file()
    model, tok = load_policy("embedded")
    b = DPPOTrainer(model=model, reward_funcs=zero_reward, args=DPPOConfig(**{**kw, "output_dir": str(tmp_path / "b")}),
                    train_dataset=prompts_data(16), processing_class=tok)
    b.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-5"))
    first = b.pruning_log[0]
    same = a.pruning_log[5]
    for key in ("batch", "pass", "covered", "prompt_keep", "prompt_pi"):
        assert first[key] == same[key], key
    assert [e["covered"] for e in b.pruning_log] == [e["covered"] for e in list(a.pruning_log)[5:]]
    visits = {k: r.visits for k, r in a.prompt_history.records.items()}
    assert {k: r.visits for k, r in b.prompt_history.records.items()} == visits


def two_processes(out: Path, mode: str) -> None:
    """tests/trl_worker.py `mode` on 2 gloo processes (torchrun)."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(Path(__file__).with_name("trl_worker.py")), str(out), mode]
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]


def test_two_processes_average_to_the_one_process_gradient(tmp_path, monkeypatch):
    """The rig's generation batch shared by 2 gloo processes, each scoring its half of the rows: the gradient DDP
    applies (the ranks' mean) equals one process's gradient of the whole batch, to 1e-9 in float64, for grpo without
    and dapo and dr_grpo with prompt pruning: each rank weights its own rows (its slice of the batch's weights) and
    TRL's per-process factors (dapo's P, the gathered token count) cancel in the mean."""
    from tests.trl_worker import CASES, rig_gradient, rig_trainer

    two_processes(tmp_path, "gradients")
    averaged = torch.load(tmp_path / "gradients.pt")
    float64_numerics(monkeypatch)
    for loss_type, prompt_rate in CASES:
        one = rig_gradient(rig_trainer(loss_type, prompt_rate, 1, str(tmp_path / loss_type)), 1, 0)
        assert bool(one.any())
        error = float((averaged[loss_type] - one).abs().max()) / float(one.abs().max())
        assert error <= TOLERANCE["float64"], (loss_type, error)


def test_two_processes_compose_the_same_masks(tmp_path):
    """2 gloo processes (torchrun): every rank composes the same covered prompts and draws the same prompt and
    completion masks, while each generates its own half of the rows."""
    two_processes(tmp_path, "run")
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["processes"] == r1["processes"] == 2 and r0["steps"] == r1["steps"]
    assert r0["log"] == r1["log"] and len(r0["log"]) == r0["steps"]
    assert any(len(e["covered"]) > sum(e["prompt_keep"]) for e in r0["log"])  # prompts were pruned
    for e, rows0, rows1 in zip(r0["log"], r0["rows"], r1["rows"]):  # each rank: its own half of the groups
        rolled = [k for k, kept in zip(e["covered"], e["prompt_keep"]) if kept]
        assert rows0 + rows1 == [k for k in rolled for _ in range(4)] and rows0 != rows1


def test_two_processes_make_the_same_model_calls(tmp_path):
    """Under ZeRO-3 / FSDP every forward gathers parameters from every process, so a packed no-grad pass must make
    the same calls on each: rank 0's 9 long rows pack into 9 rows (3 calls of TRL's 3-row budget), rank 1's short ones
    into 3 (1 call); rank 1 makes 2 one-token calls more, and both ranks' log-probs equal the padded pass's (1e-12)."""
    two_processes(tmp_path, "forwards")
    r0, r1 = (json.loads((tmp_path / f"forwards{r}.json").read_text()) for r in (0, 1))
    assert r0["calls"] == r1["calls"] == 3
    assert r0["error"] <= 1e-12 and r1["error"] <= 1e-12, (r0, r1)


@pytest.mark.parametrize("kw,field", [
    (dict(prompt_prune_rate=1.0), "prompt_prune_rate"),
    (dict(completion_prune_rate=0.5, loss_type="sapo"), "loss_type"),
    (dict(prompt_prune_rate=0.5, loss_type="bnpo"), "loss_type"),
    (dict(prompt_prune_rate=0.5, inclusion="proportional"), "inclusion"),
    (dict(prune_sampling="systematic"), "prune_sampling"),
    (dict(inclusion_floor=1.5), "inclusion_floor"),
    (dict(completion_prune_rate=0.5, inclusion="proportional", prune_sampling="fixed_count"), "prune_sampling"),
    (dict(completion_prune_rate=0.5, entropy_coef=0.01), "entropy_coef"),
    (dict(completion_prune_rate=0.5, inclusion="proportional"), "size_proxy"),  # logit_sum reads vLLM's log-probs
    (dict(size_proxy="entropy"), "size_proxy"),
    (dict(uniform_mix=1.5), "uniform_mix"),
    (dict(completion_prune_rate=0.5, top_entropy_quantile=0.8), "top_entropy_quantile"),
    (dict(prompt_prune_rate=0.5, accelerator_config={"dispatch_batches": True}), "accelerator_config.dispatch_batches"),
])
def test_bad_pruning_fields_are_one_line_errors(tmp_path, kw, field):
    with pytest.raises(ConfigError, match=f"config field '{field}' must be") as e:
        DPPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kw)
    assert "\n" not in str(e.value)


def test_grpo_config_is_refused_with_a_pointer(tmp_path):
    model, tok = load_policy("embedded")
    with pytest.raises(ConfigError, match="DPPOConfig"):
        DPPOTrainer(model=model, reward_funcs=zero_reward, train_dataset=prompts_data(4), processing_class=tok,
                    args=GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none"))


def test_resume_in_the_middle_of_a_generation_batch(tmp_path):
    """steps_per_generation 2 > gradient_accumulation_steps 1: each generation batch serves two optimizer steps, and a
    checkpoint after step 3 falls in the middle of batch 1 (steps 3 and 4). The resumed run generates that batch
    again: its sampler starts where batch 1 started, with the prompt history as batch 1 was composed from (not yet
    holding batch 1's own visits), so it composes batch 1 and the batches after it exactly as the uninterrupted run
    did (same pass, stretch, covered prompts, masks and inclusion probabilities), and ends with the same history.
    8 prompts, 4 a batch, zero rewards: batch 1's prompts are unseen when it is composed (none a candidate); a
    history that already held them would make all 4 candidates and the pass could not fill a batch. The pruner's
    state is saved as batch 1 found it too (its KL estimate, which each batch after the first updates with beta > 0;
    the rewards are zero, the policy does not move and the KL is 0, so the update here counts the calls instead); a
    checkpoint at a batch's end (step 6) holds the run's final history and pruner, and a run resumed from it
    restores them."""
    kw = run_config(tmp_path / "a", per_device_train_batch_size=8, steps_per_generation=2,
                    gradient_accumulation_steps=1, num_train_epochs=2, max_completion_length=4, beta=0.04,
                    save_strategy="steps", save_steps=3, prompt_prune_rate=0.5, completion_prune_rate=0.5)
    model, tok = load_policy("embedded")
    a = DPPOTrainer(model=model, reward_funcs=zero_reward, args=DPPOConfig(**kw), train_dataset=prompts_data(8),
                    processing_class=tok)
    after_step = a.pruner.after_step

    def count_calls(rewards, epoch, stats=None):
        after_step(rewards, epoch, stats)
        a.pruner.kl_estimate = calls.append(stats["kl"]) or 0.5 * len(calls)
    calls = []
    a.pruner.after_step = count_calls
    a.train()
    logged = list(a.pruning_log)
    assert [(e["batch"], e["pass"], len(e["covered"])) for e in logged] == [(0, 0, 4), (1, 0, 4), (2, 1, 7)]
    checkpoint = tmp_path / "a" / "checkpoint-3"
    state = json.loads((checkpoint / "dppo_state.json").read_text())
    assert state["position"] == [0, 4, 1]  # batch 1's start: pass 0, position 4, batch number 1
    assert sorted(int(k) for k in state["history"]) == sorted(logged[0]["covered"])  # batch 0's prompts only
    assert len(calls) == 2 and state["pruner"] == {"kl_estimate": 0.0}  # batch 1 updates it after its stages
    final = json.loads((tmp_path / "a" / "checkpoint-6" / "dppo_state.json").read_text())
    assert final["position"] == [1, 7, 3] and final["history"] == a.prompt_history.state_dict()
    assert final["pruner"] == {"kl_estimate": 1.0} == a.pruner.state_dict()
    model, tok = load_policy("embedded")
    b = DPPOTrainer(model=model, reward_funcs=zero_reward, args=DPPOConfig(**{**kw, "output_dir": str(tmp_path / "b")}),
                    train_dataset=prompts_data(8), processing_class=tok)
    b.train(resume_from_checkpoint=str(checkpoint))
    keys = ("batch", "pass", "covered", "prompt_keep", "prompt_pi")
    assert [{k: e[k] for k in keys} for e in b.pruning_log] == [{k: e[k] for k in keys} for e in logged[1:]]
    assert {k: r.visits for k, r in b.prompt_history.records.items()} == \
        {k: r.visits for k, r in a.prompt_history.records.items()}
    model, tok = load_policy("embedded")  # resumed at the end: nothing left to train, the state restored
    c = DPPOTrainer(model=model, reward_funcs=zero_reward, args=DPPOConfig(**{**kw, "output_dir": str(tmp_path / "c")}),
                    train_dataset=prompts_data(8), processing_class=tok)
    c.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-6"))
    assert list(c.pruning_log) == [] and c.prompt_history.state_dict() == a.prompt_history.state_dict()
    assert c.pruner.kl_estimate == 1.0


def test_every_trl_method_dppotrainer_overrides_is_listed_with_trls_parameters():
    """dppo.trl.OVERRIDDEN is the list the TRL version gate protects: every method of GRPOTrainer (or of Trainer under
    it) that DPPOTrainer defines is in it, with the parameters the installed TRL's takes, each of which DPPOTrainer's
    accepts too; docs/trl.md names each. A new override left out of the list, or a TRL whose method takes other
    parameters, fails here."""
    import inspect

    from dppo.trl import OVERRIDDEN

    mine = {name for name, value in vars(DPPOTrainer).items() if callable(value) and hasattr(GRPOTrainer, name)}
    assert mine == set(OVERRIDDEN), (sorted(mine - set(OVERRIDDEN)), sorted(set(OVERRIDDEN) - mine))
    page = (Path(__file__).resolve().parents[1] / "docs" / "trl.md").read_text()
    for name, (params, why) in OVERRIDDEN.items():
        theirs = tuple(inspect.signature(getattr(GRPOTrainer, name)).parameters)[1:]  # (self)
        assert theirs == params, (name, theirs)
        ours = inspect.signature(getattr(DPPOTrainer, name)).parameters
        anything = any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in ours.values())
        assert anything or set(theirs) <= set(ours), (name, tuple(ours))
        assert f"`{name}`" in page and why, name


def test_trls_generate_tuple_is_read_by_its_names(embedded64, tmp_path):
    """TRLGeneration names GRPOTrainer._generate's private 8-tuple as the installed TRL's `return` statement does, and
    a real call through the rig reads back the rows' own prompt ids, completion ids and sampling log-probs by those
    names. A tuple of another length (another TRL) is a one-line error naming TRL's fields."""
    import ast
    import inspect
    import textwrap

    from dppo.trl import TRLGeneration, trl_generation
    from tests.trl_rig import LOGPROBS

    tree = ast.parse(textwrap.dedent(inspect.getsource(GRPOTrainer._generate)))
    returned = [node.value for node in ast.walk(tree) if isinstance(node, ast.Return)]
    assert len(returned) == 1 and isinstance(returned[0], ast.Tuple)
    assert tuple(ast.unparse(x) for x in returned[0].elts) == TRLGeneration._fields
    model, tok = embedded64
    data = Dataset.from_list([{"prompt": p} for p in PROMPTS[:2]])
    trainer = make_trainer(GRPOTrainer, GRPOConfig, model, tok, data, tmp_path, 2 * G // SPG, logprobs=True)
    generated = trl_generation(trainer._generate([PROMPTS[k] for k in (0, 1) for _ in range(G)]))
    completions = [c for k in (0, 1) for c in COMPLETIONS[k][0]]
    assert generated.prompt_ids == [tok(PROMPTS[k])["input_ids"] for k in (0, 1) for _ in range(G)]
    assert generated.completion_ids == completions and generated.tool_mask is None
    assert generated.logprobs == [LOGPROBS[tuple(c)] for c in completions]
    with pytest.raises(RuntimeError, match="returned 7 values, TRL 1.16's 8 \\(prompt_ids, completion_ids") as e:
        trl_generation(tuple(generated)[:7])
    assert "\n" not in str(e.value)


def test_loss_type_is_the_users_again_after_the_loss_even_if_it_raises(embedded64, tmp_path, monkeypatch):
    """DPPOTrainer._compute_loss runs TRL's loss with loss_type "dapo" (aggregated_by_dapo): TRL's loss sees "dapo",
    and the user's loss_type is back afterwards, also when TRL's loss raises."""
    model, tok = embedded64
    data = Dataset.from_list([{"prompt": p} for p in PROMPTS[:2]])
    trainer = make_trainer(DPPOTrainer, DPPOConfig, copy.deepcopy(model), tok, data, tmp_path, 2 * G // SPG,
                           loss_type="grpo", completion_prune_rate=0.5)
    sampler = trainer._get_train_sampler()
    sampler.max_passes = 1
    comp = sampler.compose()
    sampler.compositions[comp.batch_no] = comp
    output = trainer._generate_and_score_completions(rows(comp.rolled, comp.batch_no))
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    seen = []

    def failing_loss(self, model, inputs):
        seen.append(self.loss_type)
        raise ValueError("TRL's loss failed")
    monkeypatch.setattr(GRPOTrainer, "_compute_loss", failing_loss)
    with pytest.raises(ValueError, match="TRL's loss failed"):
        trainer._compute_loss(trainer.model, output)
    assert seen == ["dapo"] and trainer.loss_type == "grpo"


def test_the_trl_code_the_borrowed_slots_rely_on_is_the_installed_trls():
    """The slots dppo.trl borrows hold in the installed TRL: GRPOTrainer._compute_loss reads WEIGHT_SLOT only as a
    factor of its loss mask, its dapo branch (the loss_type aggregated_by_dapo sets) divides by num_items_in_batch
    / P x GA / spg (set_dapo_divisor's formula), and TRL's buffer carries dppo's values with their rows: a [n] tensor
    through shuffle_sequence_dict and split_tensor_dict with its rows, a 0-d one into every micro-batch."""
    import inspect

    from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

    from dppo.trl import WEIGHT_SLOT, carry_in_batch, take_from_batch

    loss = inspect.getsource(GRPOTrainer._compute_loss)
    slot = f'inputs["{WEIGHT_SLOT}"]'
    assert f'mask = completion_mask if "{WEIGHT_SLOT}" not in inputs else completion_mask * {slot}' in loss
    assert loss.count(WEIGHT_SLOT) == 2
    dapo = loss[loss.index('elif self.loss_type in ["cispo", "dapo", "vespo"]:'):]
    for line in ('normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes',
                 "normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation",
                 "loss = (per_token_loss * mask).sum() / normalizer"):
        assert line in dapo[:dapo.index("elif", 1)], line
    output = {"row": torch.arange(6.0)}
    carry_in_batch(output, torch.arange(6.0) / 10, seq_scale=2.5, num_items=7.0)
    for micro_batch in split_tensor_dict(shuffle_sequence_dict(output), 3):
        inputs, weight, seq_scale, num_items = take_from_batch(micro_batch)
        assert list(inputs) == ["row"] and torch.equal(weight, inputs["row"] / 10)
        assert (seq_scale, num_items) == (2.5, 7.0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rates", [dict(prompt_prune_rate=0.5, completion_prune_rate=0.5),
                                   dict(prompt_prune_rate=0.5), dict(completion_prune_rate=0.5)])
def test_max_steps_on_a_dataset_smaller_than_a_batch_ends_at_once(tmp_path, rates):
    """A dataset of 2 prompts, a generation batch of 4 (16 rows of 4 completions), max_steps 3: GRPOTrainer stops at
    step 0 with transformers' line; so does DPPOTrainer, with its own line saying why, in seconds — whatever stage
    prunes (before: its sampler looked for a batch pass after pass, forever)."""
    import time

    model, tok = load_policy("embedded")
    args = DPPOConfig(**run_config(tmp_path, max_steps=3), **rates)
    trainer = DPPOTrainer(model=model, reward_funcs=length_reward, args=args, train_dataset=prompts_data(2),
                          processing_class=tok)
    start = time.monotonic()
    with pytest.warns(UserWarning, match="the 2 training prompts cannot fill one generation batch of 4 prompts"):
        trainer.train()
    assert trainer.state.global_step == 0 and time.monotonic() - start < 60


@pytest.mark.parametrize("kind", ["one_row", "rows", "one_sequence"])
def test_no_grad_passes_hold_no_more_than_trls_forward(kind, embedded64, tmp_path, monkeypatch):
    """A no-grad pass over a local generation batch of 9 rows, where TRL's per-device batch is 3 rows a forward:
    with a one-row (varlen) kernel every forward is one row of at most TRL's per-forward tokens (3 rows x the padded
    width), in about TRL's number of calls (before: one call held all 9 rows' tokens); with packed rows (sdpa,
    eager) a forward holds at most TRL's tokens or one row of `pack_capacity` (the stated budget) where that is more;
    one sequence a row, TRL's tokens. The layout is forced (what a flash-attn varlen kernel or a stateful model
    gets); sdpa computes it, restarting positions keeping the sequences apart."""
    from tests.test_trl_configs import padded_batch, two_prompt_trainer

    import dppo.packing as packing

    model, tok = embedded64
    trainer = two_prompt_trainer(DPPOTrainer, DPPOConfig, model, tok, tmp_path, completion_prune_rate=0.5)
    trainer.args.pack_sequences = True
    monkeypatch.setattr(packing, "packed_rows", lambda model: (kind, "a forced layout"))
    prompts = [PROMPTS[k] for k in (0, 1, 2, 3, 0, 2, 1, 3, 0)]
    completions = [list(c) for k in (0, 1, 2) for c in COMPLETIONS[k][0]]
    ids, mask, K = padded_batch(tok, prompts, completions)
    calls = []
    forward = trainer.model.forward
    monkeypatch.setattr(trainer.model, "forward", lambda *a, **k: (calls.append(tuple(k["input_ids"].shape)),
                                                                   forward(*a, **k))[1])
    per_forward = 3  # TRL's per-device batch: rows a forward
    with torch.no_grad():
        trainer._score(trainer.model, ids, mask, K, batch_size=per_forward, phase="old_policy")
    trl_calls, trl_tokens = math.ceil(ids.size(0) / per_forward), per_forward * ids.size(1)
    budget = max(trl_tokens, trainer.args.pack_capacity) if kind == "rows" else trl_tokens
    assert all(rows * width <= budget for rows, width in calls), (calls, budget)
    assert sum(rows * width for rows, width in calls) >= int(mask.sum())  # every real token scored
    if kind == "one_row":
        assert all(rows == 1 for rows, _ in calls), calls  # a varlen kernel: one row a call
        assert len(calls) <= trl_calls + 1, (calls, trl_calls)  # about TRL's calls, not one per sequence


def test_the_two_mask_stages_and_the_batches_draw_from_streams_of_their_own(tmp_path, monkeypatch):
    """A DPPOTrainer run of 3 generation batches with both stages pruning: every torch.Generator it seeds for a mask
    (the prompt stage's of each batch, the completion stage's of each batch) gets a seed of its own, so the two
    stages' masks of a batch are independent draws and no batch repeats another's. The exactness tests replace the
    draws, so a shared stream passes them."""
    import sys

    import dppo.trl as adapter

    seeds: dict[tuple[str, int], int] = {}  # (the drawing method, batch) -> the seed of its generator
    draw = adapter.mask_generator

    def recording(seed, batch_no, stage):
        gen = draw(seed, batch_no, stage)
        seeds[sys._getframe(1).f_code.co_name, batch_no] = gen.initial_seed()  # a batch composed twice: one key
        return gen
    monkeypatch.setattr(adapter, "mask_generator", recording)
    model, tok = load_policy("embedded")
    args = DPPOConfig(**run_config(tmp_path, max_steps=3, per_device_train_batch_size=8),
                      prompt_prune_rate=0.5, completion_prune_rate=0.5)
    trainer = DPPOTrainer(model=model, reward_funcs=length_reward, args=args, train_dataset=prompts_data(16),
                          processing_class=tok)
    trainer.train()
    stages = {caller for caller, _ in seeds}
    assert len(stages) == 2 and len(seeds) >= 2 * 3, seeds  # per batch: its prompt stage's and its completion stage's
    assert len(set(seeds.values())) == len(seeds), seeds
