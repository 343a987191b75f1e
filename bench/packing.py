"""Padded vs densely packed vs shared-prompt update on the same kept sequences of a real DPPO step (docs/method.md §3).

    python bench/packing.py [--capacity 128 256 512 1024] [--reps 5] [--csv OUT.csv] [--smoke]

Takes one DPPO step's kept rows from the embedded policy (r_q = r_o = 0.5, after one warm-up step so
that the prompt history has candidates), then times forward+backward of the weighted log-prob loss
padded (micro-batches of 64 rows), packed (rows of at most C tokens) and shared-prompt packed (each group's
prompt once, §3.3), side by side in one run, and prints valid-token density (real, non-padding tokens computed /
token slots processed: the `density/valid_token` metric), loss-token density (completion tokens / slots: the
share of slots whose logit enters the loss), update tokens/s (completion tokens trained per second) and the
speed ratio to padded, and how far each layout's completion log-probs are from padded's (the same numbers up to
float32 rounding, docs/method.md §3.2-3.3).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from dppo.config import TrainConfig
from dppo.packing import group_segments, packed_completion_logprobs, shared_prompt_logprobs
from dppo.scoring import completion_logprobs
from dppo.trainer import Trainer


def kept_rows(prompts_per_step: int = 16):
    """(model, tokenizer, prompt ids, completion ids, group ids) of the rows a real DPPO step trains on."""
    with tempfile.TemporaryDirectory() as d:
        cfg = TrainConfig(output_dir=d, pruner="dppo", prompt_prune_rate=0.5, completion_prune_rate=0.5,
                          train_size=2 * prompts_per_step, prompts_per_step=prompts_per_step, max_steps=3,
                          eval_every=1000, save_every=1000, eval_size=2, eval_samples=1)
        tr = Trainer(cfg)
        captured = {}
        update = tr.update

        def spy(batch, rows, *args):
            captured["p"] = [batch.prompt_ids[r] for r in rows]
            captured["c"] = [batch.completion_ids[r] for r in rows]
            captured["g"] = [r // cfg.group_size for r in rows]
            return update(batch, rows, *args)
        tr.update = spy
        tr.fit()
        return tr.model, tr.tok, captured["p"], captured["c"], captured["g"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", type=int, nargs="+", default=[128, 256, 512, 1024])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--csv", help="also write the table here")
    ap.add_argument("--smoke", action="store_true", help="a tiny step (tests)")
    args = ap.parse_args()
    model, tok, p, c, g = kept_rows(4 if args.smoke else 16)
    pad = tok.pad_token_id
    comp_tokens, all_tokens = sum(map(len, c)), sum(map(len, p)) + sum(map(len, c))
    shared_tokens = comp_tokens + sum(len(p[seg[0]]) for seg in group_segments(g))  # each prompt once
    weights = torch.rand(len(c), generator=torch.Generator().manual_seed(0))

    def timed(fn):
        """(mean seconds a rep, token slots, the completion log-probs [n, T] of the last rep, each rep's seconds)."""
        reps = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            model.zero_grad(set_to_none=True)
            slots, lp = fn()
            reps.append(time.perf_counter() - t0)
        return sum(reps) / len(reps), slots, lp.detach(), reps

    def padded():
        slots, parts = 0, []
        for s in range(0, len(c), 64):
            lp = completion_logprobs(model, p[s:s + 64], c[s:s + 64], pad)
            (lp.sum(1) * weights[s:s + 64]).sum().backward()
            slots += len(lp) * max(len(a) + len(b) for a, b in zip(p[s:s + 64], c[s:s + 64]))
            parts.append(lp)
        width = max(x.shape[1] for x in parts)
        return slots, torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1])) for x in parts])

    def packed(cap):
        lp, slots = packed_completion_logprobs(model, p, c, pad, 1.0, cap)
        (lp.sum(1) * weights).sum().backward()
        return slots, lp

    def shared(cap):
        lp, slots = shared_prompt_logprobs(model, p, c, g, pad, 1.0, cap)
        (lp.sum(1) * weights).sum().backward()
        return slots, lp

    print(f"{len(c)} kept rows of {len(set(g))} prompts, {comp_tokens} completion tokens, {all_tokens} tokens in all "
          f"({shared_tokens} with each prompt once)")
    print(f"{'layout':<16}{'valid-token density':>20}{'loss-token density':>19}{'update tok/s':>14}"
          f"{'speed vs padded':>17}{'max |dlogp|':>13}")
    base_t, base_slots, base_lp, base_reps = timed(padded)
    rows = [("padded", base_t, base_slots, base_lp, base_reps, all_tokens)]
    for cap in args.capacity:  # the layouts alternate, so a busy machine slows them alike
        rows.append((f"packed C={cap}", *timed(lambda cap=cap: packed(cap)), all_tokens))
        rows.append((f"shared C={cap}", *timed(lambda cap=cap: shared(cap)), shared_tokens))
    mask = torch.zeros_like(base_lp, dtype=torch.bool)  # the completion tokens of each row
    for n, b in enumerate(c):
        mask[n, : len(b)] = True
    table = [{"layout": name, "valid_token_density": real / slots, "loss_token_density": comp_tokens / slots,
              "update_tokens_per_s": comp_tokens / t, "speedup_vs_padded": base_t / t,
              "max_logprob_diff_vs_padded": float((lp[:, : mask.shape[1]] - base_lp)[mask].abs().max()),
              "update_tokens_per_s_std": float(torch.tensor([comp_tokens / r for r in reps]).std()) if len(reps) > 1
              else 0.0}
             for name, t, slots, lp, reps, real in rows]
    for r in table:
        print(f"{r['layout']:<16}{r['valid_token_density']:>20.3f}{r['loss_token_density']:>19.3f}"
              f"{r['update_tokens_per_s']:>14,.0f}{r['speedup_vs_padded']:>16.2f}x"
              f"{r['max_logprob_diff_vs_padded']:>13.1e}")
    if args.csv:
        import pandas as pd

        pd.DataFrame(table).to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
