"""The thread policies on a whole run, quiet and beside another job: `intra_op_threads` 1, one per core, and auto
(docs/engineering.md §5.1).

    python bench/thread_policy.py [--steps 12] [--label GRPO] [--rounds 1]

Trains T1's run of `--label` (seed 0) for `--steps` steps under each policy, once on a quiet machine and once while a
CPU-bound Python loop (another job, not this process's child) runs beside it, alternating so that drift hits every
policy alike. Prints training seconds (evaluation excluded), the threads the steps used and the cores other work
took: a policy that degrades gracefully is fast when quiet and slows by about the core it lost when busy.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile

import pandas as pd

from busy_machine import start_job
from dppo import results, studies
from dppo.runfiles import read_metrics
from dppo.trainer import Trainer

POLICIES = {"1 thread": 1, f"{os.cpu_count()} threads (one per core)": os.cpu_count(), "auto": -1}


def train(label: str, steps: int, threads: int) -> dict:
    config, over, _ = studies.T1_RUNS[label]
    with tempfile.TemporaryDirectory() as d:
        cfg = results.prepare(config, d, **{**over, "seed": 0, "max_steps": steps, "eval_before_train": False,
                                            "eval_every": 10_000, "save_every": 10_000, "eval_size": 2,
                                            "eval_samples": 1, "intra_op_threads": threads})
        Trainer(cfg).fit()
        m = pd.DataFrame([r for r in read_metrics(f"{d}/metrics.jsonl") if r["step"] > 0])
    w = m["timing_s/step"]
    return {"train_s": w.sum(), "threads": (m["load/threads"] * w).sum() / w.sum(),
            "other_cores": (m["load/other_cores"] * w).sum() / w.sum()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--label", default="GRPO", choices=list(studies.T1_RUNS))
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    rows = []
    for r in range(args.rounds):
        for busy in (False, True):
            for policy, threads in POLICIES.items():
                job = start_job() if busy else None
                try:
                    rows.append({"round": r, "policy": policy, "machine": "busy" if busy else "quiet",
                                 **train(args.label, args.steps, threads)})
                finally:
                    if job:
                        os.kill(job, signal.SIGKILL)
                print(rows[-1], flush=True)
    df = pd.DataFrame(rows).groupby(["policy", "machine"], sort=False).mean(numeric_only=True).drop(columns="round")
    table = df["train_s"].unstack()
    table["slowdown busy / quiet"] = table["busy"] / table["quiet"]
    table["quiet vs fastest quiet"] = table["quiet"] / table["quiet"].min()
    print(df.round(2).to_string(), "\n")
    print(table.round(2).to_markdown())


if __name__ == "__main__":
    main()
