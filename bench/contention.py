"""How a busy core slows training, per thread policy: quiet vs one competing CPU-bound process (docs/engineering.md §5.1).

    python bench/contention.py [--steps 3] [--policies default passive one]

For each thread policy a fresh worker process (OpenMP reads its settings once, at start) builds a DPPO trainer on
the embedded model, warms up one step, then times `--steps` training steps and `--steps` rollouts (the hf sampler
on one step's prompts) quiet, then again while a CPU-bound Python loop runs beside it (one core busy), alternating
quiet and busy blocks so that drift hits both. Prints seconds per step and per rollout and the slowdown busy / quiet:
a policy that degrades gracefully slows about as much as the core it lost (here at most ~2x), not many-fold.

Policies: `default` (torch's threads = cores, OpenMP's default wait policy: idle workers spin), `passive`
(OMP_WAIT_POLICY=PASSIVE: idle workers sleep), `one` (one intra-op thread).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

POLICIES = {"default": {}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"}, "short-spin": {"GOMP_SPINCOUNT": "10000"},
            "one": {"OMP_NUM_THREADS": "1"}}


def worker(steps: int) -> dict:
    """In the policy's environment: seconds per training step and per rollout, quiet and busy, alternating blocks."""
    import torch

    from dppo.config import TrainConfig
    from dppo.trainer import Trainer

    with tempfile.TemporaryDirectory() as d:
        tr = Trainer(TrainConfig(output_dir=d, pruner="dppo", prompt_prune_rate=0.5, completion_prune_rate=0.5,
                                 train_size=256, prompts_per_step=8, group_size=8, max_new_tokens=64, eval_every=10_000,
                                 save_every=10_000, eval_size=2, eval_samples=1, packing="shared"))
        tr.train_step()  # warm-up
        prompts = [tr.train[k].prompt for k in range(8)]

        def rollout():
            tr.engine.generate(prompts, tr.sampling)

        times: dict[str, list[float]] = {f"{what}_{load}": [] for what in ("step", "rollout") for load in ("quiet", "busy")}
        for block in range(2 * steps):
            busy = block % 2 == 1
            competitor = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
            try:
                time.sleep(0.2 if busy else 0.0)  # the competitor is running before the clock starts
                for what, fn in (("step", tr.train_step), ("rollout", rollout)):
                    t0 = time.perf_counter()
                    fn()
                    times[f"{what}_{'busy' if busy else 'quiet'}"].append(time.perf_counter() - t0)
            finally:
                if competitor:
                    competitor.kill()
                    competitor.wait()
        return {"threads": torch.get_num_threads(), **{k: sum(v) / len(v) for k, v in times.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="quiet and busy blocks per policy (one step + one rollout each)")
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES),
                    help="in this order (a policy named twice runs twice: rounds that alternate see the same drift)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.steps)))
        return
    print(f"{'policy':<10}{'threads':>8}{'step quiet (s)':>16}{'step busy (s)':>15}{'slowdown':>10}"
          f"{'rollout quiet (s)':>19}{'rollout busy (s)':>18}{'slowdown':>10}")
    for name in args.policies:
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")}
        env.update(POLICIES[name])
        out = subprocess.run([sys.executable, __file__, "--worker", "--steps", str(args.steps)], env=env,
                             capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(f"{name:<10}{r['threads']:>8}{r['step_quiet']:>16.2f}{r['step_busy']:>15.2f}"
              f"{r['step_busy'] / r['step_quiet']:>9.2f}x{r['rollout_quiet']:>19.2f}{r['rollout_busy']:>18.2f}"
              f"{r['rollout_busy'] / r['rollout_quiet']:>9.2f}x", flush=True)


if __name__ == "__main__":
    main()
