"""The paper path on one GPU, with a verdict (bench/gpu_check.sh runs it; <= 5 minutes, no downloads).

Every check prints one row — check, value, tolerance, PASS / FAIL / SKIPPED (why) — and the script exits 1 when any
check fails (an exception in a check is a failure too). What cannot run here (flash-attn or vLLM not importable,
device memory on a CPU) is SKIPPED, never passed. `--device cpu` runs every check it can on the CPU at smaller sizes
(the test suite does, tests/test_gpu_check.py); `--tolerance NAME=VALUE` replaces one tolerance (a test breaks one
on purpose to see the script fail).

  packed_fp32      fp32, sdpa: packed (dense rows, restarting position ids) == padded log-probs and gradients
  packed_autocast  fp32 master weights under bf16 autocast (the paper's dtype): packed with the paper's kernel
                   (flash_attention_2, one row, when importable on CUDA; else sdpa) vs padded sdpa, log-probs and
                   gradients
  vllm_logprobs    vLLM's sampled-token log-probs (processed: of logits / temperature) vs the trainer's scoring
  vllm_follows     after the weights change and are pushed in place (sleep / wake on CUDA), vLLM's log-probs
                   follow the new weights: close to the new model's, far from the old one's
  train            2 DPPO steps of the paper recipe (experiments/paper/dppo_qwen3_4b_math.yaml's fields: bf16 autocast
                   over fp32 masters, gradient checkpointing, dense packing, TIS, KL to the reference, off-policy
                   minibatches; flash-attn and vLLM when importable), launched as the paper launches it
                   (accelerate launch --config_file experiments/accelerate/fsdp.yaml, 1 process), on the shipped
                   embedded policy (it earns rewards, so the update has gradients): finite loss and gradient norm,
                   weights moved
  update_memory    one update (forward + backward, bf16 autocast, checkpointing, dense packing) of a random Qwen3 with
                   the real vocabulary (151,936) at a few hundred M parameters: peak device memory <= the bound
                   `dppo.budget.update_peak_bytes` predicts
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
# name -> (tolerance, what is compared against it)
TOLERANCES = {
    "packed_fp32": 1e-4,       # max |log-prob diff| and relative gradient diff, fp32
    "packed_autocast": 5e-2,   # the same in bf16 compute (8 mantissa bits: ~4e-3 relative per op)
    "vllm_logprobs": 5e-2,     # mean |log-prob diff| per sampled token (bf16 kernels on CUDA; fp32 on CPU: ~1e-5)
    "vllm_follows": 5e-2,      # mean |diff| to the new weights' log-probs (and > 4x this to the old weights')
    "update_memory": 1.0,      # measured peak / predicted bound
    "train": 0,                # non-finite losses, gradient norms, KL or rewards (and the weights must move)
}


CHECKS = ("packed", "vllm", "train", "update_memory")  # groups of checks, in the order they run


class Report:
    """Rows of (check, value, tolerance, verdict)."""

    def __init__(self, tolerances: dict[str, float]):
        self.tol, self.rows = tolerances, []

    def check(self, name: str, value: float, shown: str = "", ok: bool | None = None) -> None:
        """PASS when `value` <= the tolerance of `name` (and `ok`, when given)."""
        passed = math.isfinite(value) and value <= self.tol[name] and (ok is None or ok)
        self.rows.append((name, shown or f"{value:.3g}", f"<= {self.tol[name]:g}", "PASS" if passed else "FAIL"))

    def skip(self, name: str, why: str) -> None:
        self.rows.append((name, "-", "-", f"SKIPPED ({why})"))

    def fail(self, name: str, why: str) -> None:
        self.rows.append((name, why, "-", "FAIL"))

    def info(self, name: str, value: str) -> None:
        self.rows.append((name, value, "", ""))

    def print(self) -> None:
        header = ("check", "value", "tolerance", "verdict")
        widths = [max(len(str(r[i])) for r in [header, *self.rows]) for i in range(4)]
        for r in [header, tuple("-" * w for w in widths), *self.rows]:
            print("| " + " | ".join(f"{str(x):<{w}}" for x, w in zip(r, widths)) + " |")

    @property
    def failed(self) -> bool:
        return any(r[3] == "FAIL" for r in self.rows)


def importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def random_qwen3(vocab: int, hidden: int, layers: int, attn: str, device: str, seed: int = 0):
    """A random-init Qwen3ForCausalLM in fp32 (the trainer's master weights)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                      num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 128),
                      head_dim=64, max_position_embeddings=4096, pad_token_id=0, eos_token_id=1, bos_token_id=1,
                      tie_word_embeddings=True, attn_implementation=attn)
    return Qwen3ForCausalLM(cfg).to(device)


def random_batch(n: int, vocab: int, seed: int, prompt: tuple[int, int], completion: tuple[int, int]):
    g = torch.Generator().manual_seed(seed)

    def seq(lo, hi):
        return torch.randint(2, vocab, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
    return [seq(*prompt) for _ in range(n)], [seq(*completion) for _ in range(n)]


def logprobs_and_grad(model, p_ids, c_ids, packed: bool, autocast) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs [N, Tc], flattened gradient of their sum) of one scoring pass, padded or densely packed."""
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


def check_packing(rep: Report, device: str) -> None:
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


def check_vllm(rep: Report, device: str, workdir: Path) -> None:
    if not importable("vllm"):
        for name in ("vllm_logprobs", "vllm_follows"):
            rep.skip(name, "vLLM not importable")
        return
    from dppo.model import EMBEDDED_SPEC, build_tokenizer
    from dppo.rollout import SamplingParams
    from dppo.scoring import completion_logprobs
    from dppo.vllm_rollout import VLLMRollout

    tok = build_tokenizer(EMBEDDED_SPEC["vocab_size"])
    model = random_qwen3(len(tok), 256, 2, "sdpa", device).eval()
    path = save_policy(model, tok, workdir / "vllm_policy")
    compute = torch.bfloat16 if device == "cuda" else None
    engine = VLLMRollout(str(path), tok, dtype="bfloat16" if compute else "float32", max_model_len=256,
                         gpu_memory_utilization=0.2, seed=0)
    prompts = ["Ann has 7 pens. She finds 5 more. How many pens does Ann have now?", "What is 12 + 30?"]
    params = SamplingParams(n=4, max_new_tokens=32, temperature=1.0, logprobs=True)

    def gap(batch, scorer) -> float:
        with torch.no_grad(), torch.autocast(device, dtype=compute, enabled=compute is not None):
            ours = completion_logprobs(scorer, batch.prompt_ids, batch.completion_ids, tok.pad_token_id).float().cpu()
        diffs = [(ours[i, : len(lp)] - lp.float()).abs() for i, lp in enumerate(batch.logprobs)]
        return float(torch.cat(diffs).mean())

    torch.manual_seed(0)
    first = engine.generate(prompts, params)
    before = gap(first, model)
    rep.check("vllm_logprobs", before, f"mean abs diff {before:.2e} over {first.num_tokens} tokens")
    old = random_qwen3(len(tok), 256, 2, "sdpa", device).eval()  # the same initial weights (seed 0)
    with torch.no_grad():  # new weights: every parameter moved (as after an update), pushed in place
        g = torch.Generator(device="cpu").manual_seed(1)
        for p in model.parameters():
            p.add_(0.5 * p.std() * torch.randn(p.shape, generator=g).to(p))
    engine.sync_weights(model)
    torch.manual_seed(0)
    second = engine.generate(prompts, params)
    new_gap, old_gap = gap(second, model), gap(second, old)
    rep.check("vllm_follows", new_gap, f"to new weights {new_gap:.2e}, to old {old_gap:.2e}",
              ok=old_gap > 4 * TOLERANCES["vllm_follows"] and old_gap > 4 * new_gap)
    del engine


def check_training(rep: Report, device: str, workdir: Path) -> None:
    """2 DPPO steps of the paper recipe on the shipped embedded policy, launched as the paper launches a run."""
    from dppo.config import TrainConfig
    from dppo.launch import train_command
    from dppo.trainer import read_metrics

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
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        rep.fail("train", (done.stderr.strip().splitlines() or ["exit " + str(done.returncode)])[-1][:150])
        return
    steps = [r for r in read_metrics(workdir / "train" / "metrics.jsonl") if r["step"] > 0]
    finite = all(math.isfinite(r[k]) for r in steps for k in ("loss", "grad_norm"))
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
    if "memory/peak_gb" in steps[-1]:
        rep.info("  train peak device memory", f"{max(r['memory/peak_gb'] for r in steps):.2f} GB")


def check_update_memory(rep: Report, device: str, hidden: int, layers: int) -> None:
    if device != "cuda":
        rep.skip("update_memory", "device memory is measured on CUDA only")
        return
    from dppo.budget import update_peak_bytes
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    ap.add_argument("--tolerance", action="append", default=[], metavar="NAME=VALUE",
                    help=f"replace a tolerance ({', '.join(TOLERANCES)})")
    ap.add_argument("--only", action="append", choices=CHECKS, help="run this group of checks (repeatable; default all)")
    args = ap.parse_args(argv)
    tol = dict(TOLERANCES)
    for item in args.tolerance:
        name, _, value = item.partition("=")
        if name not in tol:
            ap.error(f"--tolerance: unknown check {name!r}; allowed: {', '.join(TOLERANCES)}")
        tol[name] = float(value)
    device = args.device
    rep = Report(tol)
    rep.info("device", torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run: smaller sizes)")
    rep.info("torch / vllm / flash-attn", f"{torch.__version__} / {'yes' if importable('vllm') else 'no'} / "
             f"{'yes' if importable('flash_attn') else 'no'}")
    workdir = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    checks = {"packed": lambda: check_packing(rep, device),
              "vllm": lambda: check_vllm(rep, device, workdir),
              "train": lambda: check_training(rep, device, workdir),
              "update_memory": lambda: check_update_memory(rep, device, 1024, 16)}
    for name, fn in checks.items():
        if args.only and name not in args.only:
            continue
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:  # one failing check must not hide the others
            rep.fail(name, f"{type(e).__name__}: {str(e).strip().splitlines()[0][:140] if str(e).strip() else ''}")
        rep.info(f"  ({name} took)", f"{time.perf_counter() - t0:.1f} s")
    rep.print()
    print("gpu_check:", "FAILED" if rep.failed else "passed (SKIPPED rows did not run)")
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
