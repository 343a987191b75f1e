"""Rollout tokens/s side by side in one run: transformers `generate`, dppo's sampler (`HFRollout`:
`dppo.rollout.sample_compacting`, each prompt prefilled once, finished rows dropped) and, where vLLM is
installed, vLLM. The contenders alternate, so a busy machine slows all alike.

    python bench/rollout.py [--rounds 5]                                  # generate vs dppo's sampler
    bash scripts/bootstrap.sh vllm && .venv-vllm/bin/python bench/rollout.py   # ... and vLLM
    .venv-vllm/bin/python bench/rollout.py --model smollm2-135m           # the real model (docs/engineering.md §4.6)

on the embedded model and on a wider random-init Qwen3 (hidden 512, 8 layers, same tokenizer); with `--model
smollm2-135m`, on SmolLM2-135M-Instruct with the real-model study's rollouts instead (arithmetic prompts in its chat
template, 8 prompts x 8 completions, <= 32 new tokens, temperature 0.7). Each round
samples the same prompts with the same seed for every contender (the completions differ: the samplers draw
differently), so tokens/s, not time per call, is compared.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dppo.model import EMBEDDED_SPEC, load_policy, resolve_model_path
from dppo.rollout import HFRollout, SamplingParams, left_pad
from dppo.task import make_train


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


class TransformersGenerate:
    """The baseline: one `generate` call per batch (left-padded, KV-cached, sampling; finished rows stay in the
    batch until the longest ends, every row prefills its prompt)."""

    def __init__(self, model, tok):
        self.model, self.tok = model, tok

    @torch.no_grad()
    def generate(self, prompts: list[str], params: SamplingParams) -> int:
        from transformers import GenerationConfig

        tok = self.tok
        rows = [ids for ids in tok(prompts, add_special_tokens=False)["input_ids"] for _ in range(params.n)]
        ids, attn = left_pad(rows, tok.pad_token_id)
        g = self.model.generate(input_ids=ids, attention_mask=attn, generation_config=GenerationConfig(
            do_sample=True, temperature=params.temperature, max_new_tokens=params.max_new_tokens,
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id))
        new = g[:, ids.shape[1]:]
        ended = (new == tok.eos_token_id).int()
        return int(torch.where(ended.any(1), ended.argmax(1) + 1, new.shape[1]).sum())  # tokens up to EOS


def tokens_per_s(engine, prompts, params) -> float:
    t0 = time.perf_counter()
    out = engine.generate(prompts, params)
    return (out if isinstance(out, int) else out.num_tokens) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max_new_tokens", type=int, default=64)
    ap.add_argument("--model", choices=("embedded", "smollm2-135m"), default="embedded")
    args = ap.parse_args()
    try:
        from dppo.vllm_rollout import VLLMRollout
        import vllm  # noqa: F401
    except ImportError:
        VLLMRollout = None
    if args.model == "embedded":
        prompts = [p.prompt for p in make_train(args.prompts * args.rounds, seed=0)]
        params = SamplingParams(n=args.n, max_new_tokens=args.max_new_tokens)
        _, tok = load_policy("embedded")
        models = {"embedded (1.0 M)": resolve_model_path("embedded"),
                  "random Qwen3, hidden 512 x 8 layers": wider_qwen3(tok, Path(tempfile.mkdtemp()))}
    else:  # the real-model study's rollouts (experiments/cpu/real_grpo.yaml)
        from dppo.config import TrainConfig
        from dppo.data import with_chat_template
        from dppo.trainer import load_data

        cfg = TrainConfig.load("experiments/cpu/real_grpo.yaml", {"train_size": 8 * args.rounds})
        _, tok = load_policy(args.model)
        prompts = [p.prompt for p in with_chat_template(load_data(cfg)[0], tok)]
        args.prompts = 8
        params = SamplingParams(n=cfg.group_size, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
        models = {"SmolLM2-135M-Instruct": resolve_model_path(args.model)}
    print(f"{args.prompts} prompts x {params.n} completions, <= {params.max_new_tokens} new tokens, "
          f"{args.rounds} alternating rounds, {torch.get_num_threads()} threads; tok/s: median over rounds")
    cols = ["generate", "dppo"] + (["vllm"] if VLLMRollout else [])
    print("| model | " + " | ".join(f"{c} tok/s" for c in cols) + " | dppo / generate |"
          + (" vllm / dppo |" if VLLMRollout else ""))
    print("| --- " * (len(cols) + 2 + bool(VLLMRollout)) + "|")
    for name, path in models.items():
        model, tok = load_policy(path)
        model.eval()
        engines = {"generate": TransformersGenerate(model, tok), "dppo": HFRollout(model, tok, batch_size=256)}
        if VLLMRollout:
            engines["vllm"] = VLLMRollout(path, tok, max_model_len=160 + params.max_new_tokens)
        for engine in engines.values():  # warm-up
            engine.generate(prompts[:2], SamplingParams(n=2, max_new_tokens=8))
        speeds = {label: [] for label in engines}
        for r in range(args.rounds):
            batch = prompts[r * args.prompts:(r + 1) * args.prompts]
            for label, engine in engines.items():
                torch.manual_seed(r)
                speeds[label].append(tokens_per_s(engine, batch, params))

        def ratio(a: str, b: str) -> str:
            rs = [x / y for x, y in zip(speeds[a], speeds[b])]
            return f"{statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f})"

        print(f"| {name} | " + " | ".join(f"{statistics.median(speeds[c]):,.0f}" for c in cols)
              + f" | {ratio('dppo', 'generate')} |" + (f" {ratio('vllm', 'dppo')} |" if VLLMRollout else ""))
        engines.pop("vllm", None)


if __name__ == "__main__":
    main()
