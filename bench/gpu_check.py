"""The GPU paths in one short run (bench/gpu_check.sh runs it): no downloads, random-init Qwen3 models built
from configs. Prints one table; `--device cpu` runs the same checks on the CPU (a dry run, smaller sizes).

  1. packed == padded log-probs on the device, for sdpa and (when importable) flash_attention_2;
  2. scoring memory at the real Qwen3 vocabulary (151,936), 8 x 1,024 completion tokens: peak device memory of
     the selective log-softmax vs the full-logits path;
  3. two DPPO steps (prompt + completion pruning, dense packing, bf16 mixed precision, gradient checkpointing)
     of the embedded task on a wider random Qwen3, with their tokens/s;
  4. rollout tokens/s of the hf backend (and vLLM when importable).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch


def random_qwen3(vocab: int, hidden: int, layers: int, attn: str, device: str, seed: int = 0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                      num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 128),
                      head_dim=64, max_position_embeddings=4096, pad_token_id=0, eos_token_id=1, bos_token_id=1,
                      tie_word_embeddings=True, attn_implementation=attn)
    return Qwen3ForCausalLM(cfg).to(device).eval()


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def peak_reset(device):
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gb(device) -> float:
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")


def check_packing(device, rows):
    from dppo.packing import packed_completion_logprobs
    from dppo.scoring import completion_logprobs

    kernels = ["sdpa"]
    try:
        import flash_attn  # noqa: F401
        kernels.append("flash_attention_2")
    except ImportError:
        rows.append(("packed == padded, flash_attention_2", "skipped (flash-attn not importable)"))
    g = torch.Generator().manual_seed(0)
    p_ids = [torch.randint(2, 1000, (int(torch.randint(5, 40, (1,), generator=g)),), generator=g).tolist()
             for _ in range(12)]
    c_ids = [torch.randint(2, 1000, (int(torch.randint(5, 200, (1,), generator=g)),), generator=g).tolist()
             for _ in range(12)]
    for attn in kernels:
        dtype = torch.bfloat16 if attn.startswith("flash") else torch.float32  # flash-attn has no fp32 kernel
        model = random_qwen3(1024, 256, 2, attn, device).to(dtype)
        with torch.no_grad():
            ref = completion_logprobs(random_qwen3(1024, 256, 2, "sdpa", device).to(dtype), p_ids, c_ids, 0)
            packed, _ = packed_completion_logprobs(model, p_ids, c_ids, 0, 1.0, capacity=512)
        rows.append((f"packed == padded, {attn} ({str(dtype)[6:]})", f"max |diff| {float((packed - ref).abs().max()):.2e}"))


def check_memory(device, rows, tokens):
    from dppo.scoring import completion_logprobs, right_pad

    vocab = 151_936
    model = random_qwen3(vocab, 256, 2, "sdpa", device)
    g = torch.Generator().manual_seed(1)
    p_ids = [torch.randint(2, vocab, (16,), generator=g).tolist() for _ in range(8)]
    c_ids = [torch.randint(2, vocab, (tokens,), generator=g).tolist() for _ in range(8)]
    peak_reset(device)
    base = torch.cuda.memory_allocated() / 2**30 if device == "cuda" else float("nan")
    t0 = time.perf_counter()
    completion_logprobs(model, p_ids, c_ids, 0).sum().backward()
    sync(device)
    chunked, t_chunked = peak_gb(device), time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    peak_reset(device)
    try:
        t0 = time.perf_counter()
        ids, attn, _ = right_pad(p_ids, c_ids, 0, device)
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits.float()
        torch.log_softmax(logits[:, :-1], -1).gather(2, ids[:, 1:, None]).sum().backward()
        sync(device)
        naive = f"{peak_gb(device):.2f} GB, {time.perf_counter() - t0:.2f} s"
    except torch.OutOfMemoryError:
        naive = "out of memory"
    del model
    rows.append((f"scoring + backward, 8 x {tokens} tokens, V = {vocab}: peak (model {base:.2f} GB)",
                 f"selective {chunked:.2f} GB, {t_chunked:.2f} s | full logits {naive}"))


def check_training(device, rows, workdir: Path, steps: int):
    from dppo.config import TrainConfig
    from dppo.model import build_tokenizer, EMBEDDED_SPEC
    from dppo.trainer import Trainer

    tok = build_tokenizer(EMBEDDED_SPEC["vocab_size"])
    model = random_qwen3(len(tok), 512, 4, "sdpa", "cpu")
    model.config.pad_token_id, model.config.eos_token_id = tok.pad_token_id, tok.eos_token_id
    model.save_pretrained(workdir / "policy")
    tok.save_pretrained(workdir / "policy")
    cfg = TrainConfig(output_dir=str(workdir / "run"), model_name_or_path=str(workdir / "policy"), dtype="bfloat16",
                      gradient_checkpointing=True, pruner="dppo", prompt_prune_rate=0.5, completion_prune_rate=0.5,
                      packing="dense", pack_capacity=2048, refill="prompts", train_size=64, eval_size=8,
                      prompts_per_step=16, group_size=8, max_new_tokens=128, max_steps=steps, eval_every=1000,
                      save_every=1000, lr=1e-5, kl_coef=0.01)
    tr = Trainer(cfg)
    assert next(tr.model.parameters()).device.type == device, "the trainer did not put the model on the device"
    peak_reset(device)
    for _ in range(steps):
        m = tr.train_step()
        rows.append((f"DPPO step {m['step']} (bf16, packed, ckpt)",
                     f"{m['timing_s/step']:.2f} s: rollout {m['throughput/rollout_tokens_per_s']:.0f} tok/s, "
                     f"update {m['throughput/update_tokens_per_s']:.0f} tok/s, kept rows "
                     f"{m['kept/completion_frac']:.2f}, density {m['density/valid_token']:.2f}"))
    rows.append(("training peak device memory", f"{peak_gb(device):.2f} GB"))


def check_rollout(device, rows):
    from dppo.model import EMBEDDED_SPEC, build_tokenizer
    from dppo.rollout import HFRollout, SamplingParams

    tok = build_tokenizer(EMBEDDED_SPEC["vocab_size"])
    model = random_qwen3(len(tok), 512, 8, "sdpa", device)
    prompts = ["Ann has 7 pens. She finds 5 more. How many pens does Ann have now?"] * 16
    params = SamplingParams(n=8, max_new_tokens=128)
    engine = HFRollout(model, tok, 128, torch.bfloat16 if device == "cuda" else None)
    engine.generate(prompts[:2], SamplingParams(n=2, max_new_tokens=8))  # warm-up
    sync(device)
    t0 = time.perf_counter()
    batch = engine.generate(prompts, params)
    sync(device)
    rows.append(("rollout hf (hidden 512, 8 layers, 128 rows)", f"{batch.num_tokens / (time.perf_counter() - t0):.0f} tok/s"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    device, small = args.device, args.device != "cuda"
    rows = [("device", torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run: smaller sizes)"),
            ("torch", torch.__version__)]
    checks = [("packing", lambda: check_packing(device, rows)),
              ("memory", lambda: check_memory(device, rows, 128 if small else 1024)),
              ("training", lambda: check_training(device, rows, Path(tempfile.mkdtemp()), 2)),
              ("rollout", lambda: check_rollout(device, rows))]
    for name, fn in checks:
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as e:  # one failing check must not hide the others' numbers
            rows.append((f"{name}: FAILED", f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"))
        rows.append((f"  ({name} took)", f"{time.perf_counter() - t0:.1f} s"))
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"| {k:<{width}} | {v} |" for k, v in rows))


if __name__ == "__main__":
    main()
