"""T1's pairs trained twice, on a quiet machine and beside a CPU-bound job for part of the time: do the speed-ups hold?
(docs/engineering.md §5.1)

    python bench/busy_machine.py [--labels GRPO DPPO] [--seeds 0 1] [--busy-from 60] [--busy-for 300] [--out DIR]

Trains the main_results layout's runs (T1's setup; each seed's runs in turn, step by step) into DIR/quiet, then into
DIR/busy while another job (a Python busy loop, started outside this process tree like any other job) runs from
`--busy-from` seconds for `--busy-for` seconds. Prints, for both, every label's wall-clock, CPU and FLOPs speed-ups
over GRPO (mean +- 95% CI over the pairs the table keeps), the pairs left out as contended, and the mean cores other
work took.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from dppo import results, studies, tables


def start_job() -> int:
    """pid of a CPU-bound Python loop that is not this process's descendant (its parent exits at once)."""
    spawn = ("import subprocess as s, sys; print(s.Popen([sys.executable, '-c', 'while True: pass'], "
             "stdin=s.DEVNULL, stdout=s.DEVNULL, stderr=s.DEVNULL).pid)")
    return int(subprocess.run([sys.executable, "-c", spawn], capture_output=True, text=True, check=True).stdout)


def train(layout: dict, seeds: list[int], root: Path, busy: tuple[float, float] | None) -> dict:
    """run_layout into `root`; with `busy` = (from, for) seconds, another job runs meanwhile."""
    stop = threading.Event()
    pids: list[int] = []

    def job():
        if not stop.wait(busy[0]):
            pids.append(start_job())
            stop.wait(busy[1])
            os.kill(pids[-1], signal.SIGKILL)
    thread = threading.Thread(target=job, daemon=True) if busy else None
    if thread:
        thread.start()
    try:
        return results.run_layout(layout, seeds=seeds, root=root)
    finally:
        stop.set()
        if thread:
            thread.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--labels", nargs="+", default=["GRPO", "DPPO"], help="T1 rows (GRPO first: the baseline)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--busy-from", type=float, default=60.0)
    ap.add_argument("--busy-for", type=float, default=300.0)
    ap.add_argument("--out", default=str(results.RESULTS / "busy_machine"))
    args = ap.parse_args()
    full = studies.study_layouts("main_results")["T1"]
    layout = {label: full[label] for label in args.labels}
    for name, busy in (("quiet", None), ("busy", (args.busy_from, args.busy_for))):
        runs = train(layout, args.seeds, Path(args.out).resolve() / name, busy)
        seeds = tables.per_seed(runs, args.labels[0])
        summary = tables.aggregate(seeds)
        print(f"\n{name}: other work took {seeds['load/other_cores'].mean():.2f} cores on average "
              f"(max run {seeds['load/other_cores'].max():.2f}); contended runs: "
              f"{', '.join(f'{r.label} seed {r.seed}' for r in seeds.itertuples() if r.contended) or 'none'}")
        for label in args.labels[1:]:
            s = summary.loc[label]
            cells = ", ".join(f"{c} {tables.cell(s[c], s[f'{c}_ci'], 2)}x" for c in ("speedup", "speedup_cpu", "speedup_flops"))
            print(f"  {label}: {cells} (timed pairs: {int(s['seeds_timed'])} of {int(s['seeds'])})")
        print(seeds[["label", "seed", "train_s", "train_cpu_s", "load/other_cores", "speedup", "speedup_cpu",
                     "speedup_flops", "pair_contended"]].round(3).to_string(index=False))


if __name__ == "__main__":
    main()
