"""TRL's GRPOTrainer against dppo.trl.DPPOTrainer (DPPO inside TRL) on identical work, alternating step by step.

    pip install -e .[trl]          # TRL (optional extra; the README's test environment has it)
    python bench/trl_dppo.py [--seeds 0 1 2] [--epochs 3] [--train-size 640] [--steps 0] [--model embedded]
    python bench/trl_dppo.py --model smollm2-135m --seeds 0 1    # the real pretrained model (docs/engineering.md §4.6)

Work, for both: the embedded model and task, math-verify reward, 16 prompts x 8 completions per generation batch,
<= 64 new tokens, temperature 1, beta 0, loss_type grpo, lr 1e-4 constant after 10 warm-up steps, grad-norm clip 1,
one optimizer step per generation batch, `num_train_epochs` passes over the same 640 prompts (TRL's GPU defaults bf16
and gradient checkpointing off, as bench/vs_trl.py). The only difference: DPPOTrainer prunes at
experiments/cpu/dppo.yaml's rates (prompt_prune_rate 0.5, completion_prune_rate 0.5, bernoulli), so its passes over
the data take fewer generation batches and its updates fewer rows.

What it compares: DPPO inside TRL against TRL's GRPO, as a TRL user would switch. Not pruning alone: DPPOTrainer also
scores the rows it keeps packed densely (`pack_sequences`), where GRPOTrainer pads them, so the speed-up mixes the two.
Pruning's own share would need a third contender, DPPOTrainer at rates 0 with packing on; at rates 0 DPPOTrainer takes
TRL's padded path today, so that contender is not here yet (bench/vs_trl.py separates layout from pruning in dppo's
own trainer).

`--model smollm2-135m`: SmolLM2-135M-Instruct on the arithmetic task instead, as experiments/cpu/real_grpo.yaml sets
it (TRL's conversational prompts, so TRL applies the model's chat template; 8 prompts x 8 completions, <= 32 new
tokens, temperature 0.7, lr 3e-5 after 2 warm-up steps, two micro-batches of 32 rows a step (memory), answers read
with answer_format last_number; the --train-size problems of seed 0's split, evaluated on its 256 held-out problems x
2 samples); --epochs and --train-size default to the study's 2 and 64. That is the protocol T1 trains under (lever a,
docs/method.md §6.4), and it is read as T1 is: both runs evaluated once at the start (the same weights), every 2 steps
on the first 128 held-out problems while the run holds its turn (not counted in its time), and at the end on all 256,
each evaluation on stream (seed, "evaluation", step) so the two runs of a seed share their sampling (the final one on
one key for both); accuracy compared on the mean of each run's last 3 subset evaluations (the final's share
included). Each seed's log (`write_log`: commit and code hash, machine, every step's wall / CPU time and the cores
other work took, each evaluation, FLOPs and phases) goes to experiments/results/real/trl_smollm2/ (committed), and
the comparison (`report`: wall speed-up over the quiet pairs, FLOPs speed-up, GRPOTrainer's learning, DPPO - TRL on
the protocol's reading, each with its 95% t-interval over seeds and its verdict by dppo.verdicts' stated rules) to
figures/real/TRL_smollm2.md / .csv; `--summarize` remakes it from the logs alone. FLOPs (`Phases`, dppo.cost's
ModelShape): each generated row prefills its own prompt and decodes with a KV cache; a log-prob pass costs the slots
the model processed (padded or packed), the real sequences' causal pairs and the real completion tokens' logits (TRL's
padding's logits are not counted: the count favours TRL), x3 for the update's forward and backward.

The two trainers train in two threads of one process and take turns, one optimizer step each (a callback passes a
baton), so a busy machine slows both alike; each step's wall and process CPU time is taken while it holds the baton.
Printed per seed: steps, time to the end of training (sum of its steps, wall and CPU), TRL / DPPO speed-up, final
Pass@1 on the eval splits (the same evaluation for both), completions generated and rows in the update; on the
embedded model also TRL's Pass@1 at equal compute (its weights after its last step that ended within DPPO's whole
training time); then each run's phases (`Phases`: wall time generating, in the no-grad log-prob passes and in the rest
of the step, and the completion tokens generated and token slots scored and trained; the old-policy and reference
passes do not run in this configuration, for either). Over the seeds: mean ± 95% interval (t) and range.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from dppo.cost import ModelShape
from dppo.results import LAST_K, OTHER_CORES_LIMIT
from dppo.evaluation import evaluate
from dppo.machine import LoadMeter
from dppo.model import load_policy
from dppo.reward import math_reward
from dppo.rollout import HFRollout
from dppo.tables import t_quantile
from dppo.task import make_eval, make_train
from dppo.trl import DPPOConfig, DPPOTrainer

G = 8
COMMON = dict(use_cpu=True, bf16=False, gradient_checkpointing=False, lr_scheduler_type="constant_with_warmup",
              max_grad_norm=1.0, beta=0.0, loss_type="grpo", scale_rewards="group", num_generations=G,
              steps_per_generation=1, num_iterations=1, report_to="none", save_strategy="no", logging_steps=10,
              disable_dropout=True, disable_tqdm=True)
# per model: prompts per generation batch, TRL settings, evaluation (k, temperature, new tokens), the answer's format
SETUPS = {
    "embedded": dict(prompts=16, trl=dict(learning_rate=1e-4, warmup_steps=10, max_completion_length=64,
                                          temperature=1.0), eval=(4, 1.0, 64), answer_format="boxed"),
    # two micro-batches of 32 rows a step: a 64-row batch at a 49k vocabulary outgrows 24 GB in the two trainers
    "smollm2-135m": dict(prompts=8, trl=dict(learning_rate=3e-5, warmup_steps=2, max_completion_length=32,
                                             temperature=0.7, steps_per_generation=2, gradient_accumulation_steps=2),
                         eval=(2, 0.7, 32), answer_format="last_number", eval_every=2, eval_subset=128),
}
ROOT = Path(__file__).resolve().parents[1]
REAL_LOGS = ROOT / "experiments/results/real/trl_smollm2"  # the committed logs of `--model smollm2-135m`
REAL_TABLE = ROOT / "figures/real/TRL_smollm2"  # and the comparison made from them (.md, .csv)
FINAL_KEY = 10 ** 6  # the final evaluation's stream key (dppo.seeding): one for both runs, whatever their step counts
PRUNING = dict(prompt_prune_rate=0.5, completion_prune_rate=0.5, prune_sampling="bernoulli")


class Baton(TrainerCallback):
    """Two trainers in two threads, one optimizer step at a time each, in turn; times each step while held."""

    def __init__(self, shared: dict, name: str, other: str, held=None):
        self.shared, self.name, self.other, self.held = shared, name, other, held
        self.meter = LoadMeter()

    def on_step_begin(self, *args, **kwargs):
        s = self.shared
        with s["cond"]:
            s["cond"].wait_for(lambda: s["turn"] == self.name)
        self.meter.start()
        self.t0, self.c0 = time.perf_counter(), time.process_time()

    def on_step_end(self, args, state, control, **kwargs):
        s = self.shared
        wall, cpu = time.perf_counter() - self.t0, time.process_time() - self.c0
        s["times"][self.name].append((wall, cpu))
        s["load"][self.name].append(self.meter.stop())  # cores of other work during the step
        print(f"  {self.name}: step {state.global_step}/{state.max_steps} in {wall:.0f} s", flush=True)  # progress
        if self.held is not None:  # while the turn is still held (an evaluation: not counted in the step's time)
            self.held(state.global_step)
        with s["cond"]:
            if self.other not in s["done"]:
                s["turn"] = self.other
            s["cond"].notify_all()

    def on_train_end(self, *args, **kwargs):
        s = self.shared
        with s["cond"]:
            s["done"].add(self.name)
            s["turn"] = self.other
            s["cond"].notify_all()


class Phases:
    """Time and work of a trainer's step phases, by wrapping its methods: `generate` (TRL's `_generate`: sampling,
    and for DPPOTrainer the rewards and the completion stage), `score` (the no-grad log-prob passes: old policy,
    reference), `update` (the rest of the step: the loss's forward and backward, the optimizer). Token counts:
    generated completion tokens; slots the model processed in the no-grad passes and in the update (rows x width,
    padded or packed)."""

    def __init__(self, trainer):
        self.time = {"generate": 0.0, "score": 0.0}
        self.tokens = {"generated_tokens": 0, "scored": 0, "trained": 0}
        self.flops = {"generate": 0.0, "score": 0.0, "update": 0.0}
        shape = ModelShape.of(trainer.model)
        generate, logps = trainer._generate, trainer._get_per_token_logps_and_entropies

        def timed_generate(prompts):
            t0 = time.perf_counter()
            out = generate(prompts)
            self.time["generate"] += time.perf_counter() - t0
            self.tokens["generated_tokens"] += sum(map(len, out[1]))
            # each row prefills its own prompt (TRL repeats a prompt per completion) and decodes with a KV cache
            self.flops["generate"] += shape.generation(list(map(len, out[0])), list(map(len, out[1])))
            return out

        def timed_logps(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
            counted = getattr(trainer, "scored_positions", None)
            before = sum(counted.values()) if counted is not None else 0
            t0 = time.perf_counter()
            out = logps(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
            slots = sum(counted.values()) - before if counted is not None else input_ids.numel()
            # the slots the model processed (padded or packed), the real sequences' causal pairs, the logits of
            # the real completion tokens (TRL computes its padding's too: counted here for neither)
            lengths = attention_mask.sum(1).double()
            completion = float(attention_mask[:, -logits_to_keep:].sum())
            flops = shape.forward(slots, float((lengths * (lengths + 1) / 2).sum()), completion)
            if torch.is_grad_enabled():
                self.tokens["trained"] += slots
                self.flops["update"] += 3 * flops  # forward + backward (twice the forward); no checkpointing
            else:
                self.time["score"] += time.perf_counter() - t0
                self.tokens["scored"] += slots
                self.flops["score"] += flops
            return out
        trainer._generate, trainer._get_per_token_logps_and_entropies = timed_generate, timed_logps


class Snapshots(TrainerCallback):
    """The weights after every step (on CPU), for the accuracy at equal compute: small models only."""

    def __init__(self):
        self.states: list[dict] = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.states.append({k: v.detach().cpu().clone() for k, v in model.state_dict().items()})


def rewarder(answer_format: str):
    def reward(prompts, completions, answer, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]  # conversational: the reply
        return [math_reward(t, a, answer_format=answer_format) for t, a in zip(texts, answer)]
    return reward


def task(model: str, train_size: int):
    """(train problems, eval splits, TRL's prompt column): the embedded task, or the arithmetic task as a user turn
    (TRL applies the chat template) with its instruction, and the same prompts chat-templated for the evaluation."""
    if model == "embedded":
        train = make_train(train_size, 0)
        return train, make_eval(64, 0, train), [p.prompt for p in train]
    from dppo.arithmetic import PROMPT_TEMPLATE, make_split

    train, evals = make_split(train_size, 256, 0)
    ask = [[{"role": "user", "content": PROMPT_TEMPLATE.replace("{question}", p.prompt)}] for p in train]
    tok = load_policy(model)[1]
    evals = {k: [dataclasses.replace(p, prompt=tok.apply_chat_template(
        [{"role": "user", "content": PROMPT_TEMPLATE.replace("{question}", p.prompt)}], tokenize=False,
        add_generation_prompt=True)) for p in v] for k, v in evals.items()}
    return train, evals, ask


def run_pair(seed: int, epochs: float, train, prompts: list, evals: dict, steps: int, out: str, model: str) -> dict:
    setup = SETUPS[model]
    per_batch = setup["prompts"]
    k, temperature, new_tokens = setup["eval"]
    every, subset = setup.get("eval_every", 0), setup.get("eval_subset", 0)
    data = Dataset.from_list([{"prompt": q, "answer": p.answer} for q, p in zip(prompts, train)])
    names = ("TRL GRPO", "DPPO in TRL")
    shared = {"cond": threading.Condition(), "turn": "TRL GRPO", "done": set(),
              "times": {n: [] for n in names}, "load": {n: [] for n in names}}
    evaluations: dict[str, list[dict]] = {n: [] for n in names}
    trainers = {}

    def evaluation(trainer, step: int, key: int) -> dict:
        """Pass@1 of the trainer's model now, on stream (seed, "evaluation", key): the same key for both runs."""
        t0 = time.perf_counter()
        policy = trainer.model.eval()
        acc = evaluate(HFRollout(policy, trainer.processing_class), evals, k, temperature, new_tokens, seed=seed,
                       step=key, answer_format=setup["answer_format"], subset_size=subset)
        policy.train()
        return {"step": step, "avg": acc["avg"], "subset_avg": acc.get("subset/avg"),
                "seconds": time.perf_counter() - t0}

    def during(name):  # the protocol's evaluations during training, every `every` steps, while the turn is held
        def held(step: int) -> None:
            if every and step % every == 0:
                evaluations[name].append(evaluation(trainers[name], step, step))
        return held

    for name, other, cls, cfg, extra in (("TRL GRPO", "DPPO in TRL", GRPOTrainer, GRPOConfig, {}),
                                         ("DPPO in TRL", "TRL GRPO", DPPOTrainer, DPPOConfig, PRUNING)):
        policy, tok = load_policy(model)
        micro = setup["trl"].get("gradient_accumulation_steps", 1)  # one optimizer step per generation batch
        args = cfg(output_dir=f"{out}/{name.split()[0]}", num_train_epochs=epochs, seed=seed,
                   max_steps=steps if steps else -1, per_device_train_batch_size=per_batch * G // micro,
                   **{**COMMON, **setup["trl"]}, **extra)
        trainers[name] = cls(model=policy, reward_funcs=rewarder(setup["answer_format"]), args=args,
                             train_dataset=data, processing_class=tok,
                             callbacks=[Baton(shared, name, other, during(name) if every else None)])
    phases = {name: Phases(tr) for name, tr in trainers.items()}
    grpo = trainers["TRL GRPO"]
    start = evaluation(grpo, 0, 0) if every else None  # both start from the same weights: evaluated once
    snapshots = Snapshots() if sum(p.numel() for p in grpo.model.parameters()) < 20_000_000 else None
    if snapshots is not None:
        grpo.add_callback(snapshots)
    threads = [threading.Thread(target=t.train) for t in trainers.values()]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    result = {}
    for name, tr in trainers.items():
        t = shared["times"][name]
        final = evaluation(tr, len(t), FINAL_KEY if every else 0)
        acc = final["avg"]
        generated = len(t) * per_batch * G
        update_rows = tr.scored_rows["update"] if isinstance(tr, DPPOTrainer) else generated
        wall, ph = sum(x for x, _ in t), phases[name]
        result[name] = dict(steps=len(t), wall=wall, cpu=sum(y for _, y in t), acc=acc, generated=generated,
                            update_rows=update_rows, **ph.tokens, t_generate=ph.time["generate"],
                            t_score=ph.time["score"], t_update=wall - ph.time["generate"] - ph.time["score"],
                            flops=sum(ph.flops.values()), flops_by_phase=dict(ph.flops),
                            step_wall=[x for x, _ in t], step_cpu=[y for _, y in t],
                            other_cores=shared["load"][name], start=start, evaluations=evaluations[name],
                            final=final)
    # equal compute: TRL's weights after its last step that ended within DPPO's whole training time
    result["TRL GRPO"]["acc_at_dppo_time"] = None
    if snapshots is not None:
        cumulative, budget = 0.0, result["DPPO in TRL"]["wall"]
        last = 0
        for i, (w, _) in enumerate(shared["times"]["TRL GRPO"]):
            cumulative += w
            if cumulative <= budget:
                last = i
        grpo.model.load_state_dict(snapshots.states[last])
        result["TRL GRPO"]["acc_at_dppo_time"] = evaluate(
            HFRollout(grpo.model.eval(), grpo.processing_class), evals, k, temperature, new_tokens, seed=17,
            answer_format=setup["answer_format"])["avg"]
        result["TRL GRPO"]["steps_at_dppo_time"] = last + 1
    return result


def last_k(run: dict, k: int = LAST_K) -> float:
    """The protocol's reading (docs/method.md §6.4): the mean of a run's last `k` evaluations on the subset during
    training, the final evaluation's subset share included."""
    subset = [e["subset_avg"] for e in run["evaluations"] if e["step"] > 0 and e["step"] < run["steps"]]
    return statistics.mean([*subset, run["final"]["subset_avg"]][-k:])


def write_log(folder: Path, seed: int, result: dict, argv: dict) -> Path:
    """One seed's pair, as it ran, to `folder/seed<seed>.json`: the commit and code that trained it, the machine, the
    bench's arguments, every step's wall / CPU time and the other cores' load, each evaluation, FLOPs and phases."""
    import json

    import transformers
    import trl

    from dppo.machine import describe
    from dppo.results import code_hash, training_commit

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"seed{seed}.json"
    path.write_text(json.dumps({"seed": seed, "commit": training_commit(), "code": code_hash(), "args": argv,
                                "machine": describe(), "versions": {"trl": trl.__version__, "torch": torch.__version__,
                                                                    "transformers": transformers.__version__},
                                "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "runs": result}, indent=1))
    return path


def summarize(folder: Path) -> "pd.DataFrame":
    """The comparison from the logs in `folder` (`write_log`), under the protocol and the verdict rules of
    docs/method.md §6.3-6.4: per seed the wall and FLOPs speed-ups (TRL / DPPO, to the end of training), whether
    the pair was contended (either run's time-weighted other-cores load above OTHER_CORES_LIMIT: its wall ratio is
    left out), TRL's learning (final - start, all problems) and DPPO - TRL on the protocol's reading (last 3
    subset evaluations), the phases' seconds; one row per seed (their intervals and verdicts: `verdicts`)."""
    import json

    import pandas as pd

    rows = []
    for path in sorted(folder.glob("seed*.json")):
        log = json.loads(path.read_text())
        trl_run, dppo_run = log["runs"]["TRL GRPO"], log["runs"]["DPPO in TRL"]

        def load(run):
            return sum(w * c for w, c in zip(run["step_wall"], run["other_cores"])) / run["wall"]
        rows.append({"seed": log["seed"], "commit": log["commit"],
                     "wall_speedup": trl_run["wall"] / dppo_run["wall"],
                     "flops_speedup": trl_run["flops"] / dppo_run["flops"],
                     "contended": max(load(trl_run), load(dppo_run)) > OTHER_CORES_LIMIT,
                     "trl_learning": 100 * (trl_run["final"]["avg"] - trl_run["start"]["avg"]),
                     "trl_final": 100 * trl_run["final"]["avg"], "dppo_final": 100 * dppo_run["final"]["avg"],
                     "trl_last_k": 100 * last_k(trl_run), "dppo_last_k": 100 * last_k(dppo_run),
                     **{f"{who}_{phase}_s": run[f"t_{phase}"] for who, run in (("trl", trl_run), ("dppo", dppo_run))
                        for phase in ("generate", "score", "update")}})
    df = pd.DataFrame(rows).set_index("seed")
    df["gain"] = df["dppo_last_k"] - df["trl_last_k"]
    return df


def verdicts(df) -> dict:
    """The stated rules (dppo.verdicts) on a `summarize` table: intervals over seeds, quiet pairs only for the wall."""
    from dppo import verdicts as rule

    wall = rule.Interval.of(df.loc[~df["contended"], "wall_speedup"])
    flops = rule.Interval.of(df["flops_speedup"])
    learning, gain = rule.Interval.of(df["trl_learning"]), rule.Interval.of(df["gain"])
    return {"wall": wall, "flops": flops, "learning": learning, "gain": gain, "speed": rule.speed(wall),
            "speed_flops": rule.speed(flops), "learned": rule.learning_word(learning),
            "accuracy": rule.accuracy(gain, learning), "seeds_needed": rule.seeds_needed(gain)}


def report(folder: Path, table: Path | None = None) -> str:
    """The comparison as markdown (and, with `table`, its CSV beside the .md): per seed, then the intervals and the
    verdicts by the stated rules."""
    df = summarize(folder)
    v = verdicts(df)

    def iv(x, unit=""):
        return f"{x.mean:.2f}{unit} ± {x.half:.2f}" if x.resolved else f"{x.mean:.2f}{unit} (one seed)"
    lines = ["| seed | TRL / DPPO wall | FLOPs | contended | TRL learned (points) | final Pass@1 TRL, DPPO | "
             "last 3 evaluations TRL, DPPO | DPPO - TRL (points) | generate / score / update s, TRL | DPPO |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for seed, r in df.iterrows():
        lines.append(f"| {seed} | {r.wall_speedup:.2f}x | {r.flops_speedup:.2f}x | {'yes' if r.contended else 'no'} "
                     f"| {r.trl_learning:+.1f} | {r.trl_final:.1f}, {r.dppo_final:.1f} | {r.trl_last_k:.1f}, "
                     f"{r.dppo_last_k:.1f} | {r.gain:+.1f} | {r.trl_generate_s:.0f} / {r.trl_score_s:.0f} / "
                     f"{r.trl_update_s:.0f} | {r.dppo_generate_s:.0f} / {r.dppo_score_s:.0f} / {r.dppo_update_s:.0f} |")
    quiet = int((~df["contended"]).sum())
    lines += ["", f"DPPOTrainer over GRPOTrainer, {len(df)} seeds (commit {', '.join(sorted(set(df['commit'])))}): "
              f"**{iv(v['wall'], 'x')} wall** ({quiet} quiet pairs; {v['speed']}), **{iv(v['flops'], 'x')} FLOPs** "
              f"({v['speed_flops']}); GRPOTrainer {v['learned']} ({iv(v['learning'])} points); accuracy, DPPO - TRL "
              f"on the protocol's reading: {iv(v['gain'])} points, **{v['accuracy']}** ({v['seeds_needed']}). "
              f"Intervals: 95% t over seeds."]
    text = "\n".join(lines)
    if table is not None:
        table.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(table.with_suffix(".csv"))
        table.with_suffix(".md").write_text(text + "\n")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epochs", type=float, default=None, help="passes over the data (embedded 3, smollm2-135m 2)")
    ap.add_argument("--train-size", type=int, default=None, help="training problems (embedded 640, smollm2-135m 64)")
    ap.add_argument("--steps", type=int, default=0, help="stop both after this many steps (0: to the end)")
    ap.add_argument("--model", choices=tuple(SETUPS), default="embedded")
    ap.add_argument("--out", type=Path, default=None, help="write each seed's log there (smollm2-135m: "
                    f"{REAL_LOGS}, committed) and the comparison to {REAL_TABLE}.md/.csv")
    ap.add_argument("--summarize", action="store_true", help="train nothing: the comparison from the logs in --out")
    args = ap.parse_args()
    out = args.out or (REAL_LOGS if args.model != "embedded" else None)
    if args.summarize:
        print(report(out, REAL_TABLE if out == REAL_LOGS else out / "comparison"))
        return
    real = args.model != "embedded"
    epochs = args.epochs or (2.0 if real else 3.0)
    train, evals, prompts = task(args.model, args.train_size or (64 if real else 640))
    rows, phase_rows = [], []
    print(f"{'seed':>4}  {'run':<12}{'steps':>6}{'wall s':>8}{'CPU s':>8}{'TRL/DPPO wall':>15}{'CPU':>7}"
          f"{'Pass@1 %':>10}{'generated':>11}{'update rows':>13}")
    for seed in args.seeds:
        torch.manual_seed(seed)
        with tempfile.TemporaryDirectory() as d:
            r = run_pair(seed, epochs, train, prompts, evals, args.steps, d, args.model)
        if out is not None:
            print(f"log: {write_log(out, seed, r, vars(args) | {'out': str(out)})}", flush=True)
        trl, dppo = r["TRL GRPO"], r["DPPO in TRL"]
        rows.append((trl["wall"] / dppo["wall"], trl["cpu"] / dppo["cpu"], trl["acc"], dppo["acc"],
                     trl["acc_at_dppo_time"]))
        for name, x in r.items():
            ratio = f"{trl['wall'] / x['wall']:>14.2f}x{trl['cpu'] / x['cpu']:>6.2f}x"
            print(f"{seed:>4}  {name:<12}{x['steps']:>6}{x['wall']:>8.1f}{x['cpu']:>8.1f}{ratio}{100 * x['acc']:>10.1f}"
                  f"{x['generated']:>11}{x['update_rows']:>13}", flush=True)
            phase_rows.append((seed, name, x))
            print(f"      phases: generate {x['t_generate']:.1f} s, score {x['t_score']:.1f} s, update "
                  f"{x['t_update']:.1f} s; tokens generated {x['generated_tokens']}, slots scored {x['scored']}, "
                  f"trained {x['trained']}", flush=True)
        if trl["acc_at_dppo_time"] is not None:
            print(f"{seed:>4}  TRL GRPO at DPPO's training time (equal compute, step {trl['steps_at_dppo_time']}): "
                  f"Pass@1 {100 * trl['acc_at_dppo_time']:.1f} %", flush=True)
    print(f"\nphases (wall s of the steps; tokens: completion tokens generated, token slots the model processed)\n"
          f"{'seed':>4}  {'run':<12}{'generate s':>11}{'score s':>9}{'update s':>10}{'generated':>11}{'scored':>9}"
          f"{'trained':>10}")
    for seed, name, x in phase_rows:
        print(f"{seed:>4}  {name:<12}{x['t_generate']:>11.1f}{x['t_score']:>9.1f}{x['t_update']:>10.1f}"
              f"{x['generated_tokens']:>11}{x['scored']:>9}"
              f"{x['trained']:>10}")
    if len(rows) > 1:
        def spread(i):  # mean ± 95% half-width (t, seeds - 1 degrees of freedom), and the range
            v = [r[i] for r in rows]
            half = statistics.stdev(v) * t_quantile(len(v) - 1) / len(v) ** 0.5
            return f"{statistics.mean(v):.2f} ± {half:.2f} (range {min(v):.2f}-{max(v):.2f})"
        print(f"speed-up to the end of training, TRL / DPPO: wall {spread(0)}, CPU {spread(1)}")
        print(f"final Pass@1 %: TRL {100 * statistics.mean(r[2] for r in rows):.1f} "
              f"(range {100 * min(r[2] for r in rows):.1f}-{100 * max(r[2] for r in rows):.1f}), DPPO "
              f"{100 * statistics.mean(r[3] for r in rows):.1f} "
              f"(range {100 * min(r[3] for r in rows):.1f}-{100 * max(r[3] for r in rows):.1f})")
        if all(r[4] is not None for r in rows):
            print(f"equal compute, Pass@1 %: TRL at DPPO's training time {100 * statistics.mean(r[4] for r in rows):.1f}"
                  f" (range {100 * min(r[4] for r in rows):.1f}-{100 * max(r[4] for r in rows):.1f}), DPPO "
                  f"{100 * statistics.mean(r[3] for r in rows):.1f}")
    if out is not None:
        print("\n" + report(out, REAL_TABLE if out == REAL_LOGS else out / "comparison"))


if __name__ == "__main__":
    main()
