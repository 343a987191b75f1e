"""How far the embedded model's build moves with the thread count — a stand-in for another machine (docs/results.md).

    python bench/embedded_build.py [--threads 1 2] [--cache DIR] [--out DIR]

The shipped embedded weights (`dppo/embedded/`) were built with one thread; a machine that builds them itself
(`DPPO_EMBEDDED_SOURCE=build`) rounds differently from the first step on. For each thread count this builds the
embedded model (`DIR/threads<n>`, cached: a build is ~12 min on 2 cores) in a process with that many intra-op threads,
then trains T4's short GRPO and DPPO runs (seed 0, in turn) from it. Prints, per build: the warm-start's final loss,
the weights' relative distance to the first build's, the initial model's held-out accuracy, and the short runs' final
accuracies and FLOPs / wall-clock speed-ups — what a table made on that machine would start from and show.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import torch
from safetensors.torch import load_file

from dppo import results, studies, tables


def build(threads: int, cache: Path) -> Path:
    """The embedded model built with `threads` intra-op threads (in its own process: OpenMP reads them once)."""
    env = {**os.environ, "DPPO_CACHE": str(cache / f"threads{threads}"), "DPPO_EMBEDDED_SOURCE": "build",
           "OMP_NUM_THREADS": str(threads)}
    code = (f"import torch; torch.set_num_threads({threads}); from dppo.model import embedded_model_dir; "
            "print(embedded_model_dir('embedded'))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return Path(done.stdout.strip().splitlines()[-1])


def distance(a: Path, b: Path) -> float:
    """||w_a - w_b|| / ||w_b|| over every weight."""
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    diff = sum(float((wa[k].double() - wb[k].double()).pow(2).sum()) for k in wb)
    return (diff / sum(float(w.double().pow(2).sum()) for w in wb.values())) ** 0.5


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "dppo" / "builds"))
    ap.add_argument("--out", default=str(results.RESULTS / "embedded_build"))
    args = ap.parse_args()
    rows, first = [], None
    for n in args.threads:
        folder = build(n, Path(args.cache))
        first = first or folder
        layout = {label: (cfg, {**over, "model_name_or_path": str(folder)}, f"threads{n}/{sub}")
                  for label, (cfg, over, sub) in (("GRPO", studies.T4_RUNS["GRPO"]),
                                                  ("DPPO", studies.T4_RUNS["DPPO (prompt + completion, 1/pi, packing)"]))}
        torch.set_num_threads(1)
        runs = results.run_layout(layout, seeds=[0], root=args.out)
        seeds = tables.per_seed(runs, "GRPO").set_index("label")
        meta = pd.read_json(folder / "warm_start.json", typ="series")
        rows.append({"build threads": n, "warm-start final loss": meta["final_loss"],
                     "weights vs first build": distance(folder, first), "start acc": seeds.loc["GRPO", "acc/start"],
                     "GRPO acc": seeds.loc["GRPO", "acc/avg"], "DPPO acc": seeds.loc["DPPO", "acc/avg"],
                     "DPPO speed-up (FLOPs)": seeds.loc["DPPO", "speedup_flops"],
                     "DPPO speed-up (wall)": seeds.loc["DPPO", "speedup"]})
    print(pd.DataFrame(rows).round(4).to_markdown(index=False))


if __name__ == "__main__":
    main()
