"""Time to plan one rank's micro-batches of a paper-scale minibatch (docs/method.md §3.2): the width search of
`pack_rows` (sdpa / eager rows) against the greedy token groups a one-row kernel needs (flash-attn:
`packing.token_groups`), side by side in one run.

    python bench/micro_batches.py      # 64 rows (2,048 rollouts / 8 ranks / 4 minibatches) of 150 + 1-1,024 tokens
"""

from __future__ import annotations

import random
import time

from dppo.packing import pack_rows, token_groups


def main(rows: int = 64, reps: int = 20, capacity: int = 16384, budget: int = 32768) -> None:
    rng = random.Random(0)
    lengths = [rng.randint(60, 240) + rng.randint(1, 1024) for _ in range(rows)]
    timings = {}
    for name, plan in (("pack_rows width search", lambda: pack_rows(lengths, capacity)),
                       ("token_groups (one row)", lambda: token_groups(lengths, budget))):
        plan()
        t0 = time.perf_counter()
        for _ in range(reps):
            plan()
        timings[name] = (time.perf_counter() - t0) / reps
    base = timings["pack_rows width search"]
    for name, s in timings.items():
        print(f"| {name:<24} | {s * 1e3:8.2f} ms per call | {base / s:6.0f}x |")


if __name__ == "__main__":
    main()
