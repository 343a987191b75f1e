"""Data parallelism with real processes (torchrun, gloo on CPU; docs/engineering.md §4.1).

On CPU `accelerate launch` starts one process (its multi-process launcher is for accelerators), so these tests
start the ranks with torchrun, which is what `accelerate launch` runs on GPUs; the Accelerator inside the trainer
finds the process group the same way. accelerate 1.15 maps FSDP only onto accelerator devices (a FSDP config on
CPU runs DDP), so the FSDP path is exercised with torch's own `fully_shard` on gloo (`test_fsdp_*`).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from dppo.config import TrainConfig
from dppo.trainer import read_metrics

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "dist_worker.py"


def _torchrun(n: int, *args: str, timeout: int = 600, env: dict[str, str] | None = None) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n), *args]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]


ONE_STEP = dict(train_size=10, eval_size=2, prompts_per_step=5, group_size=4, max_new_tokens=32, lr=3e-4,
                warmup_steps=0, pruner="dppo", completion_prune_rate=0.5, kl_coef=0.05, ppo_epochs=2,
                packing="dense", pack_capacity=96, micro_batch_tokens=128, algorithm="dapo")


def test_two_processes_make_the_same_step_as_one(tmp_path, embedded):
    """Same fixed rollouts, same masks: 2 ranks (each scoring its token-balanced share, old / reference passes
    included, gradients all-reduced) end the step with the parameters of 1 process."""
    args = [f"{k}={v}" for k, v in ONE_STEP.items()]
    for n in (1, 2):
        (tmp_path / str(n)).mkdir()
        _torchrun(n, str(WORKER), "one_step", str(tmp_path / str(n)), *args)
    one, two = (load_file(str(tmp_path / str(n) / "params.safetensors")) for n in (1, 2))
    g1, g2 = (load_file(str(tmp_path / str(n) / "grads.safetensors")) for n in (1, 2))
    initial = embedded[0].state_dict()
    # The gradient (of the first of the two optimizer steps) is the same sum in another order: equal to rounding,
    # relative to its norm. The parameters after two Adam steps are compared in norm, not per element: Adam's step
    # lr g / (|g| + eps) turns a rounding difference in an element whose gradient cancels to ~eps into a difference
    # up to 2 lr in that element, so a per-element bound depends on the model; a handful of such elements move the
    # update's norm by ~2 lr each against ~lr sqrt(#params) ~ 1e3 lr for the whole update.
    grad_norm = sum(float(g1[k].double().pow(2).sum()) for k in g1) ** 0.5
    grad_diff = sum(float((g1[k] - g2[k]).double().pow(2).sum()) for k in g1) ** 0.5
    update_norm = sum(float((one[k] - initial[k]).double().pow(2).sum()) for k in one) ** 0.5
    update_diff = sum(float((one[k] - two[k]).double().pow(2).sum()) for k in one) ** 0.5
    print(f"gradient: norm {grad_norm:.3e}, 1 vs 2 processes {grad_diff:.2e}; update: norm {update_norm:.3e}, "
          f"1 vs 2 processes {update_diff:.2e}")
    assert set(g1) == set(g2) and grad_norm > 0
    assert grad_diff <= 1e-5 * grad_norm
    assert update_norm > 1e-4  # the step moved the weights (two Adam updates at lr 3e-4)
    assert update_diff <= 1e-2 * update_norm
    r1, r2 = (yaml.safe_load((tmp_path / str(n) / "record.yaml").read_text()) for n in (1, 2))
    for key in ("reward", "kept/completion_frac", "loss/normaliser", "tokens/trained", "tokens/generated"):
        assert r1[key] == r2[key], key  # fixed rollouts, the same masks: exact
    for key in ("loss", "grad_norm"):  # the first pass's values: rounding only
        assert r1[key] == pytest.approx(r2[key], rel=1e-4, abs=1e-7), key
    # after the first update the two runs' weights differ by rounding (above), so the second epoch's statistics may
    # differ a little: one token across a clip boundary moves the clip fraction by 1/tokens, the KL terms O(1e-6)
    assert abs(r1["clip_frac/region"] - r2["clip_frac/region"]) <= 1.0 / r1["tokens/trained"] + 1e-12
    for key in ("approx_kl", "kl"):
        assert r1[key] == pytest.approx(r2[key], rel=1e-2, abs=1e-6), key


def test_the_learning_rate_schedule_counts_training_steps_for_any_number_of_processes(tmp_path, embedded):
    """Warm-up over training steps, as documented: with warmup_steps 10 and 2 optimizer updates per step (ppo_epochs
    2), steps 0-2 use lr x 1/10, 2/10, 3/10 on 1 process and on 2 (accelerate's scheduler wrapper used to step a
    prepared scheduler once per process per call: 2 processes warmed up twice as fast), and the 3 steps end with the
    same parameters."""
    fields = {**ONE_STEP, "warmup_steps": 10, "worker_steps": 3}
    args = [f"{k}={v}" for k, v in fields.items()]
    for n in (1, 2):
        (tmp_path / str(n)).mkdir()
        _torchrun(n, str(WORKER), "one_step", str(tmp_path / str(n)), *args)
    lrs = [yaml.safe_load((tmp_path / str(n) / "lrs.yaml").read_text()) for n in (1, 2)]
    want = [ONE_STEP["lr"] * (k + 1) / 10 for k in range(3)]
    assert lrs[0] == pytest.approx(want, rel=1e-12) and lrs[1] == pytest.approx(want, rel=1e-12), lrs
    one, two = (load_file(str(tmp_path / str(n) / "params.safetensors")) for n in (1, 2))
    initial = embedded[0].state_dict()
    update_norm = sum(float((one[k] - initial[k]).double().pow(2).sum()) for k in one) ** 0.5
    update_diff = sum(float((one[k] - two[k]).double().pow(2).sum()) for k in one) ** 0.5
    assert update_norm > 0 and update_diff <= 1e-2 * update_norm, (update_diff, update_norm)  # as above
    # the process group waits process_group_timeout_s (default 2 h, not torch's 10 min) for a rank that downloads
    assert yaml.safe_load((tmp_path / "2" / "timeout.yaml").read_text()) == TrainConfig().process_group_timeout_s == 7200


RUN = dict(train_size=24, epochs=100, eval_size=4, eval_samples=1, prompts_per_step=6, group_size=4,
           max_new_tokens=32, warmup_steps=1, lr=2e-4, pruner="dppo", prompt_prune_rate=0.5,
           completion_prune_rate=0.5, save_every=2, eval_every=5, keep_checkpoints=2)


def _data_with_sure_candidates(tmp_path: Path) -> Path:
    """The embedded task's first RUN["train_size"] training problems as a data file, with the 6 prompts that step 5
    covers (the first of epoch 2 in the seeded order, which depends on the seed alone) given an answer no model
    writes: their groups are all-wrong (zero variance) in epoch 1 on any machine, so step 5 has exactly 6 prompt
    candidates and fixed_count drops exactly 3 of them, whatever the model samples."""
    from dppo.composition import PromptStream
    from dppo.task import make_train

    n = RUN["train_size"]
    problems = make_train(n, seed=0)
    unanswerable = set(PromptStream(n, seed=0, limit=2 * n).order(1)[:RUN["prompts_per_step"]])
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"question": p.prompt, "answer": "-987654" if i in unanswerable else p.answer})
                            + "\n" for i, p in enumerate(problems)))
    return path


def _train(tmp_path: Path, name: str, **over) -> Path:
    cfg = tmp_path / f"{name}.yaml"
    data = {"dataset": str(_data_with_sure_candidates(tmp_path)), "prompt_template": "{question}",
            "prune_sampling": "fixed_count"}
    cfg.write_text(yaml.safe_dump({**RUN, **data, "output_dir": str(tmp_path / name), **over}))
    _torchrun(2, "-m", "dppo.cli", "train", "--config", str(cfg))
    return tmp_path / name


def test_two_process_run_logs_once_and_keeps_its_checkpoints(tmp_path, embedded):
    """A 2-process DPPO run writes one metrics line per step, keeps `keep_checkpoints` checkpoints and its final
    weights, and both ranks prune the same sure candidates (fixed_count). Its resume, after a rank is killed, equals
    an uninterrupted 2-process run bit for bit: tests/test_faults.py."""
    full = _train(tmp_path, "full", max_steps=5)
    assert [r["step"] for r in read_metrics(full / "metrics.jsonl")] == [0, 1, 2, 3, 4, 5]  # one line per step
    assert sorted(p.name for p in (full / "checkpoints").iterdir()) == ["step_4", "step_5"]  # keep_checkpoints 2
    assert (full / "final" / "model.safetensors").is_file()
    m = read_metrics(full / "metrics.jsonl")
    assert m[5]["kept/prompt_frac"] == 0.5, "step 5 has 6 sure candidates: fixed_count at rate 0.5 drops 3"


def test_fsdp_sharded_scoring_gradients_and_weight_gather(tmp_path, embedded):
    """FSDP2 shards of TokenLogprobs (the module the trainer hands accelerate): the vocabulary projection inside
    the wrapped forward gives the unsharded gradient (loss x W, averaged reduce-scatter), and the rollout engine's
    full copy is refreshed from the gathered shards; the KL reference, sharded the same way, scores as the whole model."""
    _torchrun(2, str(WORKER), "fsdp", str(tmp_path))
    ranks = yaml.safe_load((tmp_path / "fsdp.yaml").read_text())["ranks"]
    assert len(ranks) == 2
    for rank, sharded, grad_diff, weight_diff, ref_diff, frozen_diff in ranks:
        assert sharded  # the policy and the KL reference (shard_frozen)
        assert grad_diff <= 1e-4, (rank, grad_diff)  # relative (a wrong W or averaging would be off by 0.5 or more)
        assert weight_diff == 0.0 and ref_diff == 0.0, (rank, weight_diff, ref_diff)
        assert frozen_diff <= 1e-5, (rank, frozen_diff)  # the sharded reference scores as the whole model


FSDP_YAML = ROOT / "experiments" / "accelerate" / "fsdp.yaml"


def _launch_env(config_file: Path) -> dict[str, str]:
    """The ACCELERATE_* / FSDP_* environment `accelerate launch --config_file <config_file>` gives each rank, by
    accelerate's own parsing (its launcher's checks included)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(config_file), "--num_processes", "8",
                                               "--main_process_port", "0", "train.py"])
    _validate_launch_command(args)
    return {k: v for k, v in prepare_multi_gpu_env(args).items() if k.startswith(("ACCELERATE_", "FSDP_"))}


def _fsdp_prepare(tmp_path: Path, config_file: Path, dtype: str, *flags: str) -> list[dict]:
    _torchrun(2, str(WORKER), "fsdp_prepare", str(tmp_path), dtype, *flags, env=_launch_env(config_file))
    ranks = yaml.safe_load((tmp_path / "fsdp_prepare.yaml").read_text())["ranks"]
    assert len(ranks) == 2
    for r in ranks:
        print({k: r[k] for k in ("rank", "grad_cos", "grad_ratio", "update_cos", "update_ratio", "update_norm")})
    return ranks


def _assert_bf16_gathers_fp32_masters_and_the_unsharded_step(r: dict) -> None:
    seen, rank = r["seen"], r["rank"]
    # the parameters a forward sees (a decoder layer's projection, the root unit's embedding) and the KL reference's
    # are the bf16 all-gathered copies; the collectives themselves carry bf16 out and fp32 gradients back
    for key in ("gate_proj", "embed", "frozen_gate_proj", "all_gather"):
        assert seen[key] == ["torch.bfloat16"], (rank, key, seen[key])
    assert seen["reduce_scatter"] == ["torch.float32"], (rank, seen["reduce_scatter"])
    # the shards the optimizer steps, their gradients and AdamW's moments stay fp32
    assert r["local"] == {"param": ["torch.float32"], "grad": ["torch.float32"], "adam": ["torch.float32"]}, r["local"]
    # the update follows the unsharded fp32-master + bf16-autocast update of the same batch, within the bounds
    # test_mixed_precision.py allows bf16 against fp32 (cosine > 0.95, norm within 0.8-1.25): bf16-gathered norms and
    # embeddings are the only rounding added (measured: gradient cosine 0.99999, AdamW update cosine 0.994 — Adam's
    # first step is lr sign(g), so elements whose gradient is ~0 flip with rounding)
    assert r["grad_cos"] > 0.95 and 0.8 < r["grad_ratio"] < 1.25, (rank, r["grad_cos"], r["grad_ratio"])
    assert r["update_cos"] > 0.95 and 0.8 < r["update_ratio"] < 1.25, (rank, r["update_cos"], r["update_ratio"])
    assert r["update_norm"] > 1e-3  # the step moved the weights
    assert r["kl_zero"], rank  # the KL reference (shard_frozen, the same policy) scores exactly as the policy
    # rollout engines receive the fp32 master weights, not their bf16 copies
    assert r["push"] == {"dtypes": ["torch.float32"], "equals_masters": True, "finer_than_bf16": True}, r["push"]
    assert r["tied"], rank  # the tied head is still the embedding


def test_fsdp_gathers_bf16_keeps_fp32_masters_and_follows_the_unsharded_fp32_master_step(tmp_path, embedded):
    """dtype bfloat16 under the shipped FSDP config, through accelerate's own FSDP2 prepare (dppo's mixed precision
    policy set by `configure_fsdp`): all-gathers in bf16 for compute, fp32 master weights, gradients and AdamW state,
    gradients reduce-scattered in fp32, one update that follows the unsharded fp32-master + autocast one; with
    activation checkpointing on, as in the paper profile (the recompute gathers and casts as the forward did).
    fsdp_cpu_ram_efficient_loading (shipped on): the other rank builds the policy and the KL reference without
    reading the checkpoint (`load_policy_for`: uninitialised CPU storage, one per parameter, the head tied), and
    after prepare / `shard_frozen` every rank holds rank 0's weights exactly."""
    assert _launch_env(FSDP_YAML)["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "true"
    ranks = _fsdp_prepare(tmp_path, FSDP_YAML, "bfloat16", "checkpointing")
    for r in ranks:
        before = r["before_prepare"]
        assert before["loads_weights"] == (r["rank"] == 0), r
        assert not before["meta"] and before["distinct_storages"] and before["tied"], r
        assert r["layer_forwards_in_update"] == 2, r["rank"]  # checkpointing's recompute ran (and saw bf16)
        assert r["load_diff"] == 0.0, r["rank"]  # rank 1's weights are rank 0's, exactly
        _assert_bf16_gathers_fp32_masters_and_the_unsharded_step(r)


def test_the_shipped_fsdp_config_reaches_accelerates_plugin_and_dppos_policy(monkeypatch):
    """What `accelerate launch --config_file experiments/accelerate/fsdp.yaml` gives the ranks builds the FSDP2
    plugin the trainer prepares with, and `configure_fsdp` sets dppo's mixed precision policy on it (accelerate's
    config has no key for one; its `mixed_precision` stays "no": dppo autocasts). fsdp_cpu_ram_efficient_loading
    needs `TokenLogprobs.tie_weights` (accelerate re-ties through it: without, a tied head would train apart from its
    embedding)."""
    from types import SimpleNamespace

    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from dppo.distributed import configure_fsdp, fsdp_mixed_precision, loads_weights
    from dppo.scoring import TokenLogprobs

    env = _launch_env(FSDP_YAML)
    shipped = yaml.safe_load(FSDP_YAML.read_text())
    efficient = shipped["fsdp_config"]["fsdp_cpu_ram_efficient_loading"]
    assert env["ACCELERATE_MIXED_PRECISION"] == "no" and env["ACCELERATE_USE_FSDP"] == "true"
    assert env["FSDP_SYNC_MODULE_STATES"] == "true"  # the launcher refuses efficient loading without it
    assert hasattr(TokenLogprobs, "tie_weights"), "efficient loading would untie a tied head"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin()  # as Accelerator() builds it from the launch environment
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    assert plugin.cpu_ram_efficient_loading == efficient and plugin.mixed_precision_policy is None
    accelerator = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), mixed_precision="no",
                                  is_main_process=False)
    assert configure_fsdp(accelerator, "bfloat16") == MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float32, output_dtype=torch.float32, cast_forward_inputs=False)
    assert plugin.mixed_precision_policy == fsdp_mixed_precision("bfloat16")
    assert configure_fsdp(accelerator, "float32") == MixedPrecisionPolicy()  # fp32 gathers, as without a policy
    assert configure_fsdp(SimpleNamespace(state=SimpleNamespace()), "bfloat16") is None  # not FSDP: nothing to set
    assert efficient and not loads_weights(accelerator)  # rank 1 of the shipped config: rank 0 reads the weights
