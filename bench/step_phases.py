"""Per-phase wall time, work done and accuracy of runs, from their metrics.jsonl, side by side.

    python bench/step_phases.py BASELINE_RUN [OTHER_RUN ...] [--steps N]

For each run: total seconds per phase (prune, rollout, reward, old/ref log-probs, update, step),
prompts rolled out, completions generated and trained, tokens generated and trained, throughput,
valid-token density and eval accuracy first -> last; every other run is also shown as a ratio to
the first. `--steps N` compares the first N steps only (e.g. against a longer baseline run).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dppo.trainer import read_metrics

PHASES = ("prune", "rollout", "reward", "old_logprob", "ref_logprob", "update", "step")


def summarise(run: Path, steps: int = 0) -> dict:
    rows = read_metrics(run / "metrics.jsonl")
    train = [r for r in rows if "timing_s/step" in r and (not steps or r["step"] <= steps)]
    evals = [r for r in rows if "eval/avg" in r and (not steps or r["step"] <= steps)]
    out = {f"time/{p}": sum(r.get(f"timing_s/{p}", 0.0) for r in train) for p in PHASES}
    out["steps"] = len(train)
    out["prompts rolled out"] = sum(round(r["kept/prompt_frac"] * r.get("prompts/covered", 0)) for r in train)
    out["tokens generated"] = sum(r["tokens/generated"] for r in train)
    out["tokens trained"] = sum(r["tokens/trained"] for r in train)
    out["mean kept/prompt_frac"] = sum(r["kept/prompt_frac"] for r in train) / max(1, len(train))
    out["mean kept/completion_frac"] = sum(r["kept/completion_frac"] for r in train) / max(1, len(train))
    out["rollout tokens/s"] = out["tokens generated"] / max(1e-9, out["time/rollout"])
    out["update tokens/s"] = out["tokens trained"] / max(1e-9, out["time/update"])
    out["valid-token density"] = sum(r["density/valid_token"] for r in train) / max(1, len(train))
    for tag, r in (("first", evals[0] if evals else {}), ("last", evals[-1] if evals else {})):
        for k, v in r.items():
            if k.startswith("eval/"):
                out[f"{k} ({tag}, %)"] = 100 * v
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--steps", type=int, default=0)
    args = ap.parse_args()
    stats = [summarise(r, args.steps) for r in args.runs]
    keys = list(dict.fromkeys(k for s in stats for k in s))
    print(f"{'':<34}" + "".join(f"{r.name[:22]:>24}" for r in args.runs))
    for k in keys:
        cells = []
        for i, s in enumerate(stats):
            v = s.get(k, float("nan"))
            cell = f"{v:,.3f}" if isinstance(v, float) and abs(v) < 100 else f"{v:,.0f}"
            if i and stats[0].get(k) and not k.startswith("eval/"):
                cell += f" ({v / stats[0][k]:.2f}x)"
            cells.append(f"{cell:>24}")
        print(f"{k:<34}" + "".join(cells))


if __name__ == "__main__":
    main()
