"""dppo against TRL's GRPOTrainer on identical work, alternating step by step in one process.

    pip install -e .[bench]          # TRL (optional extra)
    python bench/vs_trl.py [--epochs 3] [--train-size 640] [--steps 0]

Work: the embedded model and task, math-verify reward, 16 prompts x 8 completions per step, <= 64 new tokens,
temperature 1, beta 0 (no reference model), TRL's `grpo` loss (dppo: algorithm grpo, the same sequence-mean of
token means), lr 1e-4 constant after 10 warm-up steps, grad-norm clip 1, one update per rollout.

Three contenders train side by side: TRL GRPO, dppo GRPO (shared-prompt packing, exact, docs/method.md §3.3)
and dppo DPPO (experiments/cpu/dppo.yaml). They alternate: after every TRL step (a callback) each dppo run
takes its next step, so a busy machine slows all three alike; per-step wall and CPU times are recorded for each.
Printed: the per-step time ratio dppo GRPO / TRL (median and spread over steps), the time to the end of
training (sum of steps) of each and its ratio to TRL's, and each final policy's Pass@1 on the embedded eval
splits (the same evaluation for all three).

TRL defaults changed, and why: `bf16=False` and `gradient_checkpointing=False` (TRL's defaults for GPUs; on CPU
bf16 autocast and recomputation only slow it down, and dppo runs neither here), `lr_scheduler_type=
constant_with_warmup` (dppo's schedule; TRL decays linearly), `learning_rate=1e-4` (TRL's 1e-6 is for billion-
parameter models), `loss_type="grpo"` and `scale_rewards="group"` (the GRPO being compared), `beta=0`,
`report_to="none"`, `save_strategy="no"` and `logging_steps=1` (no I/O in the timed loop). One difference is
left: transformers' warm-up starts at lr 0 on the first step, dppo's at lr / warmup_steps.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from dppo.config import TrainConfig
from dppo.evaluation import evaluate
from dppo.model import load_policy, resolve_model_path
from dppo.reward import math_reward
from dppo.rollout import HFRollout
from dppo.task import make_eval, make_train
from dppo.trainer import Trainer

COMMON = dict(train_size=640, prompts_per_step=16, group_size=8, max_new_tokens=64, temperature=1.0, lr=1e-4,
              warmup_steps=10, max_grad_norm=1.0, kl_coef=0.0, eval_every=10**6, save_every=10**6, seed=0)


def trl_trainer(out: str, train, epochs: float, callback):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tok = load_policy("embedded")

    def reward(prompts, completions, answer, **kwargs):
        return [math_reward(c, a) for c, a in zip(completions, answer)]

    args = GRPOConfig(output_dir=out, use_cpu=True, bf16=False, gradient_checkpointing=False, learning_rate=1e-4,
                      lr_scheduler_type="constant_with_warmup", warmup_steps=10, max_grad_norm=1.0, beta=0.0,
                      loss_type="grpo", scale_rewards="group", num_generations=8, per_device_train_batch_size=128,
                      steps_per_generation=1, num_iterations=1, max_completion_length=64,
                      temperature=1.0, num_train_epochs=epochs, report_to="none", save_strategy="no",
                      logging_steps=1, seed=0, disable_dropout=True)
    data = Dataset.from_list([{"prompt": p.prompt, "answer": p.answer} for p in train])
    return GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok,
                       callbacks=[callback])


def main() -> None:
    from transformers import TrainerCallback

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=float, default=3.0)
    ap.add_argument("--train-size", type=int, default=640)
    ap.add_argument("--steps", type=int, default=0, help="stop every run after this many steps (0: to the end)")
    args = ap.parse_args()
    resolve_model_path("embedded")
    common = {**COMMON, "train_size": args.train_size, "epochs": args.epochs, "max_steps": args.steps}
    with tempfile.TemporaryDirectory() as d:
        runs = {"dppo GRPO": Trainer(TrainConfig.load("experiments/cpu/grpo.yaml", {
                    **common, "packing": "shared", "pack_capacity": 256, "output_dir": f"{d}/grpo"})),
                "dppo DPPO": Trainer(TrainConfig.load("experiments/cpu/dppo.yaml", {**common, "output_dir": f"{d}/dppo"}))}
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in ("TRL GRPO", *runs)}

        def step(name: str, tr: Trainer) -> None:
            t0, c0 = time.perf_counter(), time.process_time()
            tr.train_step()
            times[name].append((time.perf_counter() - t0, time.process_time() - c0))

        class Alternate(TrainerCallback):
            def on_step_begin(self, *a, **k):
                self.t0, self.c0 = time.perf_counter(), time.process_time()

            def on_step_end(self, *a, **k):
                times["TRL GRPO"].append((time.perf_counter() - self.t0, time.process_time() - self.c0))
                for name, tr in runs.items():
                    if not tr.finished():
                        step(name, tr)

        train = make_train(args.train_size, 0)
        trl = trl_trainer(f"{d}/trl", train, args.epochs, Alternate())
        if args.steps:
            trl.args.max_steps = args.steps
        trl.train()
        for name, tr in runs.items():  # DPPO may need fewer steps; GRPO exactly as many as TRL
            while not tr.finished():
                step(name, tr)
        splits = make_eval(64, 0, train)
        tok = runs["dppo GRPO"].tok
        policies = {"TRL GRPO": trl.model, **{k: tr.policy for k, tr in runs.items()}}
        acc = {k: evaluate(HFRollout(m.eval(), tok), splits, 4, 1.0, 64, seed=17)["avg"] for k, m in policies.items()}
    base = times["TRL GRPO"]
    n = min(len(base), len(times["dppo GRPO"]))
    ratios = [times["dppo GRPO"][i][0] / base[i][0] for i in range(n)]
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    print(f"per-step wall time, dppo GRPO / TRL GRPO over {n} alternating steps: median {statistics.median(ratios):.2f}x "
          f"(quartiles {q[0]:.2f}-{q[2]:.2f}, min {min(ratios):.2f}, max {max(ratios):.2f})")
    print(f"{'run':<12}{'steps':>7}{'wall s':>10}{'CPU s':>10}{'TRL wall / wall':>17}{'TRL CPU / CPU':>15}{'Pass@1 %':>10}")
    for name, t in times.items():
        wall, cpu = sum(x for x, _ in t), sum(y for _, y in t)
        print(f"{name:<12}{len(t):>7}{wall:>10.1f}{cpu:>10.1f}{sum(x for x, _ in base) / wall:>16.2f}x"
              f"{sum(y for _, y in base) / cpu:>14.2f}x{100 * acc[name]:>10.1f}")


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
