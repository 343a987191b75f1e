"""dppo against TRL's GRPOTrainer on identical work, alternating step by step in one process.

    pip install -e .[bench]          # TRL (optional extra)
    python bench/vs_trl.py [--epochs 3] [--train-size 640] [--steps 0]
    python bench/vs_trl.py --model smollm2-135m --steps 3     # the real pretrained model (docs/engineering.md §4.6)

Work: the embedded model and task, math-verify reward, 16 prompts x 8 completions per step, <= 64 new tokens,
temperature 1, beta 0 (no reference model), TRL's `grpo` loss (dppo: algorithm grpo, the same sequence-mean of
token means), lr 1e-4 constant after 10 warm-up steps, grad-norm clip 1, one update per rollout.

What it compares: what a TRL user gains by switching trainers — dppo's trainer on its own layout (rows packed, each
group's prompt computed once) against `GRPOTrainer`'s padded default. dppo GRPO against TRL GRPO is the layout and the
trainer, no pruning; dppo DPPO against dppo GRPO (both on the shared layout) is pruning's own share.

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

`--model smollm2-135m`: SmolLM2-135M-Instruct (a 49k vocabulary, where the head and the packing weigh more) on the
arithmetic task, each run as experiments/cpu/real_grpo.yaml / real_dppo.yaml set it (8 prompts x 8 completions, <= 32
tokens, temperature 0.7, lr 3e-5 after 2 warm-up steps; TRL with conversational prompts, so it applies the same chat
template, in two micro-batches of 32 rows a step as bench/trl_dppo.py); --epochs and --train-size default to the
study's 2 and 64, evaluation on seed 0's 256 held-out problems x 2 samples.
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
from dppo.rollout import HFRollout
from dppo.trainer import Trainer

COMMON = dict(train_size=640, prompts_per_step=16, group_size=8, max_new_tokens=64, temperature=1.0, lr=1e-4,
              warmup_steps=10, max_grad_norm=1.0, kl_coef=0.0, eval_every=10**6, save_every=10**6, seed=0)


def trl_trainer(out: str, train, prompts: list, epochs: float, callback, model_name: str = "embedded"):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from trl_dppo import SETUPS, rewarder  # bench/trl_dppo.py: the same TRL settings per model

    model, tok = load_policy(model_name)
    setup = SETUPS[model_name]
    kw = {**dict(learning_rate=1e-4, warmup_steps=10, max_completion_length=64, temperature=1.0), **setup["trl"]}
    micro = kw.get("gradient_accumulation_steps", 1)
    args = GRPOConfig(output_dir=out, use_cpu=True, bf16=False, gradient_checkpointing=False,
                      lr_scheduler_type="constant_with_warmup", max_grad_norm=1.0, beta=0.0, loss_type="grpo",
                      scale_rewards="group", num_generations=8,
                      per_device_train_batch_size=setup["prompts"] * 8 // micro,
                      num_iterations=1, num_train_epochs=epochs, report_to="none", save_strategy="no",
                      logging_steps=1, seed=0, disable_dropout=True, **{"steps_per_generation": 1, **kw})
    data = Dataset.from_list([{"prompt": q, "answer": p.answer} for q, p in zip(prompts, train)])
    return GRPOTrainer(model=model, reward_funcs=rewarder(setup["answer_format"]), args=args, train_dataset=data,
                       processing_class=tok, callbacks=[callback])


def main() -> None:
    from transformers import TrainerCallback

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=float, default=None, help="passes over the data (embedded 3, smollm2-135m 2)")
    ap.add_argument("--train-size", type=int, default=None, help="training problems (embedded 640, smollm2-135m 64)")
    ap.add_argument("--steps", type=int, default=0, help="stop every run after this many steps (0: to the end)")
    ap.add_argument("--model", choices=("embedded", "smollm2-135m"), default="embedded")
    args = ap.parse_args()
    real = args.model != "embedded"
    epochs, train_size = args.epochs or (2.0 if real else 3.0), args.train_size or (64 if real else 640)
    resolve_model_path(args.model)
    if real:  # the study's YAML files, as they are (their seed 0 split)
        common = {"train_size": train_size, "epochs": epochs, "max_steps": args.steps, "seed": 0,
                  "eval_every": 10**6, "save_every": 10**6}
        grpo_yaml, dppo_yaml = "experiments/cpu/real_grpo.yaml", "experiments/cpu/real_dppo.yaml"
    else:
        common = {**COMMON, "train_size": train_size, "epochs": epochs, "max_steps": args.steps}
        grpo_yaml, dppo_yaml = "experiments/cpu/grpo.yaml", "experiments/cpu/dppo.yaml"
    with tempfile.TemporaryDirectory() as d:
        runs = {"dppo GRPO": Trainer(TrainConfig.load(grpo_yaml, {
                    **common, "packing": "shared", "pack_capacity": 256, "output_dir": f"{d}/grpo"})),
                "dppo DPPO": Trainer(TrainConfig.load(dppo_yaml, {**common, "output_dir": f"{d}/dppo"}))}
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

        from trl_dppo import task  # the same problems, TRL's prompts and the evaluation splits per model

        train, splits, prompts = task(args.model, train_size)
        trl = trl_trainer(f"{d}/trl", train, prompts, epochs, Alternate(), args.model)
        if args.steps:
            trl.args.max_steps = args.steps
        trl.train()
        for name, tr in runs.items():  # DPPO may need fewer steps; GRPO exactly as many as TRL
            while not tr.finished():
                step(name, tr)
        from trl_dppo import SETUPS

        samples, temperature, new_tokens = SETUPS[args.model]["eval"]
        answer_format = SETUPS[args.model]["answer_format"]
        tok = runs["dppo GRPO"].tok
        policies = {"TRL GRPO": trl.model, **{name: tr.policy for name, tr in runs.items()}}
        acc = {name: evaluate(HFRollout(m.eval(), tok), splits, samples, temperature, new_tokens, seed=17,
                              answer_format=answer_format)["avg"] for name, m in policies.items()}
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
