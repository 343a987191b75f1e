"""Per-phase wall time and throughput of a run, from its metrics.jsonl (measured, not estimated).

    python bench/step_phases.py experiments/results/cpu/grpo [more run folders ...]

Prints, per run: mean seconds per step for each phase (rollout, reward, old/ref log-probs, update),
the share of the step each takes, rollout and update tokens/s, and eval accuracy first -> last.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dppo.trainer import read_metrics

PHASES = ("rollout", "reward", "old_logprob", "ref_logprob", "update", "step")


def summarise(run: Path) -> None:
    rows = read_metrics(run / "metrics.jsonl")
    steps = [r for r in rows if "timing_s/step" in r]
    evals = [r for r in rows if "eval/avg" in r]
    if not steps:
        print(f"{run}: no training steps logged")
        return
    mean = {p: sum(r.get(f"timing_s/{p}", 0.0) for r in steps) / len(steps) for p in PHASES}
    print(f"\n{run}  ({len(steps)} steps, {sum(r['timing_s/step'] for r in steps):.0f} s of steps)")
    print(f"{'phase':<12} {'s/step':>8} {'share':>7}")
    for p in PHASES:
        print(f"{p:<12} {mean[p]:>8.3f} {mean[p] / mean['step']:>7.1%}")
    gen = sum(r["tokens/generated"] for r in steps) / sum(r["timing_s/rollout"] for r in steps)
    upd = sum(r["tokens/trained"] for r in steps) / sum(r["timing_s/update"] for r in steps)
    print(f"rollout throughput: {gen:,.0f} generated tokens/s; update: {upd:,.0f} trained tokens/s; "
          f"valid-token density {sum(r['density/valid_token'] for r in steps) / len(steps):.3f}")
    if evals:
        first, last = evals[0], evals[-1]
        splits = [k[5:] for k in first if k.startswith("eval/")]
        print("pass@1 %  " + "  ".join(f"{s}: {100 * first['eval/' + s]:.1f} -> {100 * last['eval/' + s]:.1f}"
                                      for s in splits))


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["experiments/results/cpu/grpo"]:
        summarise(Path(arg))
