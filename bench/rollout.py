"""Rollout tokens/s, transformers `generate` vs vLLM, side by side in one run (the contenders alternate, so a
busy machine slows both alike). Needs vLLM: run it in the vLLM environment,

    bash scripts/bootstrap.sh vllm && .venv-vllm/bin/python bench/rollout.py [--rounds 3]

on the embedded model and on a wider random-init Qwen3 (hidden 512, 8 layers, same tokenizer).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dppo.model import EMBEDDED_SPEC, load_policy, resolve_model_path
from dppo.rollout import HFRollout, SamplingParams
from dppo.task import make_train
from dppo.vllm_rollout import VLLMRollout


def wider_qwen3(tok, out: Path) -> str:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(**{**EMBEDDED_SPEC["arch"], "hidden_size": 512, "intermediate_size": 1536,
                         "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64},
                      vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                      bos_token_id=tok.eos_token_id)
    Qwen3ForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def tokens_per_s(engine, prompts, params) -> float:
    t0 = time.perf_counter()
    batch = engine.generate(prompts, params)
    return batch.num_tokens / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max_new_tokens", type=int, default=64)
    args = ap.parse_args()
    prompts = [p.prompt for p in make_train(args.prompts, seed=0)]
    params = SamplingParams(n=args.n, max_new_tokens=args.max_new_tokens)
    _, tok = load_policy("embedded")
    models = {"embedded (0.8 M)": resolve_model_path("embedded"),
              "random Qwen3, hidden 512 x 8 layers": wider_qwen3(tok, Path(tempfile.mkdtemp()))}
    print(f"{args.prompts} prompts x {args.n} completions, <= {args.max_new_tokens} new tokens, "
          f"{args.rounds} alternating rounds, {torch.get_num_threads()} threads")
    print("| model | hf tok/s | vllm tok/s | vllm / hf |\n| --- | --- | --- | --- |")
    for name, path in models.items():
        model, tok = load_policy(path)
        hf = HFRollout(model, tok, batch_size=256)
        vllm = VLLMRollout(path, tok, max_model_len=160 + args.max_new_tokens)
        for engine in (hf, vllm):  # warm-up
            engine.generate(prompts[:2], SamplingParams(n=2, max_new_tokens=8))
        speeds = {"hf": [], "vllm": []}
        for _ in range(args.rounds):
            for label, engine in (("hf", hf), ("vllm", vllm)):
                torch.manual_seed(0)
                speeds[label].append(tokens_per_s(engine, prompts, params))
        ratios = [v / h for v, h in zip(speeds["vllm"], speeds["hf"])]
        print(f"| {name} | {statistics.median(speeds['hf']):,.0f} | {statistics.median(speeds['vllm']):,.0f} | "
              f"{statistics.median(ratios):.2f}x (rounds {min(ratios):.2f}-{max(ratios):.2f}) |")
        del vllm


if __name__ == "__main__":
    main()
