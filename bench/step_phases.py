"""Per-phase wall time, work done and accuracy of runs, from their metrics.jsonl, side by side.

    python bench/step_phases.py BASELINE_RUN [OTHER_RUN ...] [--steps N]

For each run: total wall seconds, CPU seconds and FLOPs per phase (prune, rollout, reward, old/ref log-probs,
update, step), prompts rolled out, completions generated and trained, tokens generated and trained, throughput,
valid-token density and eval accuracy first -> last; every other run is also shown as a ratio to
the first. `--steps N` compares the first N steps only (e.g. against a longer baseline run).

Efficiency accounting (every run against the first): the ideal speed-up of a phase is what its kept work allows
(rollout: baseline generated tokens / generated tokens; update: baseline trained tokens / trained tokens), the
measured one is baseline time / time (wall and CPU), and efficiency = measured / ideal: how much of the pruning
the implementation turns into time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dppo.runfiles import read_metrics

PHASES = ("prune", "rollout", "reward", "gather", "old_logprob", "ref_logprob", "update", "step")
IDEAL = {"rollout": "tokens generated", "update": "tokens trained"}  # phase -> the work its time should follow


def summarise(run: Path, steps: int = 0) -> dict:
    rows = read_metrics(run / "metrics.jsonl")
    train = [r for r in rows if "timing_s/step" in r and (not steps or r["step"] <= steps)]
    evals = [r for r in rows if "eval/avg" in r and (not steps or r["step"] <= steps)]
    out = {f"time/{p}": sum(r.get(f"timing_s/{p}", 0.0) for r in train) for p in PHASES}
    out.update({f"cpu/{p}": sum(r.get(f"cpu_s/{p}", 0.0) for r in train) for p in PHASES})
    out.update({f"flops/{p}": sum(r.get(f"flops/{p}", 0.0) for r in train) for p in ("rollout", "update", "step")})
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
    for s in stats[1:]:  # efficiency accounting
        base = stats[0]
        for phase, work in IDEAL.items():
            ideal = base[work] / max(1e-9, s[work])
            for clock in ("time", "cpu"):
                measured = base[f"{clock}/{phase}"] / max(1e-9, s[f"{clock}/{phase}"])
                s[f"{phase}: ideal / {clock} speed-up, efficiency"] = f"{ideal:.2f}x / {measured:.2f}x, {measured / ideal:.2f}"
    keys = list(dict.fromkeys(k for s in stats for k in s))
    print(f"{'':<46}" + "".join(f"{r.name[:22]:>24}" for r in args.runs))
    for k in keys:
        cells = []
        for i, s in enumerate(stats):
            v = s.get(k, "-" if k.endswith("efficiency") else float("nan"))
            if isinstance(v, str):
                cells.append(f"{v:>24}")
                continue
            cell = f"{v:,.3f}" if isinstance(v, float) and abs(v) < 100 else f"{v:,.3g}" if abs(v) >= 1e9 else f"{v:,.0f}"
            if i and stats[0].get(k) and not k.startswith("eval/"):
                cell += f" ({v / stats[0][k]:.2f}x)"
            cells.append(f"{cell:>24}")
        print(f"{k[:45]:<46}" + "".join(cells))


if __name__ == "__main__":
    main()
