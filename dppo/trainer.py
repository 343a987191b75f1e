"""The training loop: it orchestrates; the math lives in `losses` and `pruning`.

One step: the prompts it covers (`dppo.composition`: the next B, or refilled from a look-ahead window)
-> prompt stage (pruner) -> rollout G completions for each kept prompt -> rewards -> full-group
advantages -> completion stage -> old / reference log-probs of the kept rows only -> mu inner epochs of
minibatch updates with weights and normaliser from the pruner -> sync rollout weights.
Each phase is timed (`timing_s/*`); metrics go to `metrics.jsonl`, checkpoints (safetensors via
accelerate) to `checkpoints/step_N`, and a run resumes from its newest checkpoint.

Under `accelerate launch` (DDP or FSDP; docs/engineering.md §4.1, `dppo.distributed`) every rank composes the same
step, rolls out and scores its shard, the rollouts are gathered, each rank trains on its token-balanced share
of the kept rows, and only the main process writes.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import shutil
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
import yaml
from tqdm.auto import tqdm

from dppo import progress, seeding
from dppo.composition import PromptStream, StepComposer, prompt_limit
from dppo.config import COMPUTE_DTYPES, RESUMABLE_CHANGES, ConfigError, TrainConfig
from dppo.cost import ModelShape, training_multiplier
from dppo.data import MATH_INSTRUCTION, Problem, load_problems, model_prompts, overlap
from dppo.device_memory import DeviceMemory
from dppo.distributed import (all_gather, balance, configure_fsdp, load_policy_for, pad_to, shard, shard_frozen,
                              unshard)
from dppo.evaluation import evaluate, format_accuracy
from dppo.history import PromptHistory
from dppo.losses import policy_objective, zero_std_groups
from dppo.machine import LoadMeter, describe, free_cores
from dppo.model import load_policy
from dppo.packing import (MicroBatch, MicroBatchPlan, packed_completion_logprobs, packed_rows,
                          shared_prompt_logprobs)
from dppo.pruning import (NEEDS_LOGPROBS, Rollouts, build_pruner, completion_stage, logit_grad_sizes, prompt_stage,
                          wants_refill)
from dppo.reward import math_reward, require_checker
from dppo.rollout import RolloutBatch, SamplingParams, engine_from_config, gather_rollouts, rollout_backend
from dppo.runfiles import (MACHINE_METRICS, RunError, RunWarning, acquire_lock, append_line,  # noqa: F401
                           check_output_dir, checkpoint_state, config_changes, data_fingerprint, json_line,
                           read_jsonl_prefix, read_metrics, release_lock, run_metrics, space_for, write_atomic)
# (read_metrics, run_metrics and MACHINE_METRICS are re-exported: a run folder is read through dppo.runfiles)
from dppo.scoring import TokenLogprobs, completion_logprobs, pad_completions
from dppo.update_stats import UpdateStats

# what a rank with fewer micro-batches than the busiest scores (x 0) to keep the collectives in step: kept row 0 alone
DUMMY_MICRO_BATCH = MicroBatch([[[0]]])


class _TiedHeadSaveNote(logging.Filter):
    """accelerate warns at every checkpoint that it stored the tied lm_head once (as the embedding): expected here,
    and the reload ties it back (docs/engineering.md §4.3), so the line is dropped from the run's output."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not ("Removed shared tensor" in msg and "lm_head" in msg)


logging.getLogger("accelerate.utils.other").addFilter(_TiedHeadSaveNote())


def load_data(cfg: TrainConfig) -> tuple[list[Problem], dict[str, list[Problem]]]:
    """Train problems and eval splits for `cfg` (embedded task or files / hub)."""
    if cfg.dataset == "embedded":
        from dppo.task import make_eval, make_train

        train = make_train(cfg.train_size, cfg.seed)
        evals = make_eval(cfg.eval_size, cfg.seed, train) if cfg.eval_datasets is None else {}
    elif cfg.dataset == "arithmetic":
        from dppo.arithmetic import make_split

        train, evals = make_split(cfg.train_size, cfg.eval_size, cfg.seed, prompt_template(cfg))
        evals = evals if cfg.eval_datasets is None else {}
    else:
        train = load_problems(cfg.dataset, "train", prompt_template(cfg))
        evals = {}
    for name, path in (cfg.eval_datasets or {}).items():
        evals[name] = load_problems(path, name, prompt_template(cfg), limit=cfg.eval_size)
    if not train:
        raise ValueError(f"config field 'dataset' ({cfg.dataset!r}) yields no training problems")
    if not evals:
        warnings.warn(f"no evaluation set: dataset {cfg.dataset!r} has none of its own, so the run reports no "
                      f"accuracy; set config field 'eval_datasets' ({{split: file or hf:...}})", RunWarning, stacklevel=2)
    shared = overlap(train, evals)
    if shared:
        warnings.warn(f"eval prompts also in the training data: {', '.join(f'{k} {n}/{len(evals[k])}' for k, n in shared.items())} "
                      f"(held-out accuracy is then partly memorisation)", RunWarning, stacklevel=2)
    return train, evals


def learning_rate(cfg: TrainConfig, step: int, fraction: float = 0.0) -> float:
    """The learning rate of training step `step` (0-based) begun at `fraction` f in [0, 1), the share of the run's
    data covered before it (docs/method.md §6.4): linear warm-up over `warmup_steps` training steps times the decay
    of `lr_scheduler_type`, lr x min(1, (step + 1) / warmup_steps) x {1 | 1 - f | (1 + cos(pi f)) / 2}. Every
    optimizer update of the step (ppo_epochs x num_minibatches of them) uses it; it depends on the step and the data
    covered alone, so 1 and N processes follow one schedule, and methods whose steps cover more prompts (refill)
    decay per epoch as those that cover fewer."""
    f = min(max(fraction, 0.0), 1.0)
    decay = {"constant": 1.0, "linear": 1.0 - f, "cosine": 0.5 * (1.0 + math.cos(math.pi * f))}[cfg.lr_scheduler_type]
    return cfg.lr * min(1.0, (step + 1) / max(1, cfg.warmup_steps)) * decay


def prompt_template(cfg: TrainConfig) -> str:
    """cfg.prompt_template, or the default when empty: the arithmetic task's instruction on dataset 'arithmetic', the
    embedded task's format on the embedded models (what their warm-start taught), the MATH instruction on any other."""
    from dppo import arithmetic
    from dppo.model import EMBEDDED_SPECS
    from dppo.task import PROMPT_TEMPLATE

    if cfg.prompt_template:
        return cfg.prompt_template
    if cfg.dataset == "arithmetic":
        return arithmetic.PROMPT_TEMPLATE
    return PROMPT_TEMPLATE if cfg.model_name_or_path in EMBEDDED_SPECS else "{question}\n" + MATH_INSTRUCTION


class Timer:
    """Wall-clock and process CPU seconds per phase (CPU time counts every thread of this process, and not the
    time other processes take the cores: a busy machine stretches wall time, not CPU time); phases a step skips
    report 0. On a GPU each phase boundary waits for the device (`sync`: torch.cuda.synchronize), so a phase is
    charged with the kernels it launched, not with those of the phase before it."""

    def __init__(self, phases=("prune", "rollout", "reward", "gather", "old_logprob", "ref_logprob", "update"),
                 sync=lambda: None):
        self.times: dict[str, float] = dict.fromkeys(phases, 0.0)
        self.cpu: dict[str, float] = dict.fromkeys(phases, 0.0)
        self.sync = sync

    def now(self) -> float:
        """perf_counter once the device has finished what was queued."""
        self.sync()
        return time.perf_counter()

    @contextmanager
    def __call__(self, name: str):
        t0, c0 = self.now(), time.process_time()
        yield
        self.times[name] = self.times.get(name, 0.0) + self.now() - t0
        self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - c0


def enable_gradient_checkpointing(policy: torch.nn.Module) -> None:
    """Recompute each decoder layer in the backward (non-reentrant checkpointing): transformers >= 5.2x names it
    `activation_checkpointing_enable` (the old name warns), earlier releases `gradient_checkpointing_enable`."""
    if hasattr(policy, "activation_checkpointing_enable"):
        policy.activation_checkpointing_enable({"use_reentrant": False})
    else:
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under `folder` (what a checkpoint like it needs)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def eval_step(step: int, final: bool) -> int:
    """The step that keys an evaluation's sampling stream (`dppo.seeding`: (seed, "evaluation", step, rank);
    docs/method.md §6.1): its own step for the initial and periodic ones, so the runs of one seed evaluated at one
    step draw the same random numbers there; 0 for the final one, whatever step the run ended at: every method of a
    seed evaluates its final model with the same random numbers (common random numbers), though DPPO ends at fewer
    steps than GRPO — the initial model's, too."""
    return 0 if final else step


def graded_samples(splits: dict[str, list[Problem]], k: int, k_per_split: dict[str, int] | None) -> int:
    """n of one evaluation: the samples graded, sum over the splits of problems x k (k = k_per_split.get(split, k),
    as dppo.evaluation.evaluate samples them); logged as `eval_n` (the standard error of docs/method.md §6.2)."""
    return sum(len(problems) * (k_per_split or {}).get(name, k) for name, problems in splits.items())


class Trainer:
    def __init__(self, cfg: TrainConfig):
        from datetime import timedelta

        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs, DistributedType, InitProcessGroupKwargs

        self.cfg = cfg.validate().check_machine()
        require_checker()  # a missing math-verify stops here in one line, not as a run whose every reward is 0
        self.out = check_output_dir(cfg.output_dir)  # refuses '', '.', home, a file, an unwritable folder
        # DDP's per-forward buffer broadcast is off: ranks run their own no-grad passes (the buffers are constants)
        self.accelerator = Accelerator(cpu=not torch.cuda.is_available(), kwargs_handlers=[
            DistributedDataParallelKwargs(broadcast_buffers=False),
            InitProcessGroupKwargs(timeout=timedelta(seconds=cfg.process_group_timeout_s))])
        self.rank, self.world = self.accelerator.process_index, self.accelerator.num_processes
        self.is_main = self.accelerator.is_main_process
        self.fsdp = self.accelerator.distributed_type == DistributedType.FSDP
        configure_fsdp(self.accelerator, cfg.dtype)  # FSDP2: bf16 all-gathers over fp32 shards, fp32 reduce-scatters
        sampling = seeding.stream_seed(cfg.seed, "rollouts", rank=self.rank)  # rollout sampling: a stream per rank
        random.seed(sampling)
        torch.manual_seed(sampling)
        with self.accelerator.main_process_first():  # downloads and the embedded model's first build: once
            self.train, self.evals = load_data(cfg)
            # under fsdp_cpu_ram_efficient_loading only rank 0 reads the weights; prepare() broadcasts them
            policy, self.tok = load_policy_for(self.accelerator, cfg.model_name_or_path, cfg.attn_implementation)
        # mixed precision the standard way: fp32 master weights and optimizer state, `dtype` compute under
        # torch.autocast (per trainer, so runs of different dtypes can share a process), fp16 with a grad scaler
        self.compute_dtype = COMPUTE_DTYPES[cfg.dtype]
        self.scaler = torch.amp.GradScaler("cuda") if cfg.dtype == "float16" else None
        if cfg.gradient_checkpointing:
            enable_gradient_checkpointing(policy)
        self.train = model_prompts(self.train, self.tok, cfg.chat_template, cfg.chat_template_kwargs)
        self.evals = {k: model_prompts(v, self.tok, cfg.chat_template, cfg.chat_template_kwargs)
                      for k, v in self.evals.items()}
        self.ref_model = None
        if cfg.kl_coef > 0:  # scored as the policy is: fp32 weights under the compute dtype's autocast, so the KL is
            # exactly 0 before the first update; sharded like the policy under FSDP (4 / W bytes a parameter)
            ref = load_policy_for(self.accelerator, cfg.model_name_or_path, cfg.attn_implementation)[0].requires_grad_(False)
            self.ref_model = TokenLogprobs(ref.to(self.accelerator.device))
            if self.fsdp:
                self.ref_model = shard_frozen(self.ref_model)
        self.shape = ModelShape.of(policy)  # FLOPs of each phase (dppo.cost)
        scorer = TokenLogprobs(policy)  # what DDP / FSDP wrap: the vocabulary projection inside the wrapped forward
        opt = torch.optim.AdamW(scorer.parameters(), lr=learning_rate(cfg, 0), weight_decay=cfg.weight_decay)
        # no scheduler object: accelerate's wrapper would step it once per process per call, and each training step
        # sets its own rate (`learning_rate`), so the schedule is the same for 1 and N processes and after a resume
        self.model, self.opt = self.accelerator.prepare(scorer, opt)
        if self.scaler is not None:
            self.accelerator.register_for_checkpointing(self.scaler)
        rollout_model = self.policy
        # a backend that samples from the training model needs whole weights: under FSDP a full copy, synced
        if self.fsdp and rollout_backend(cfg.rollout_backend).samples_training_model:
            rollout_model, _ = load_policy(cfg.model_name_or_path, cfg.dtype, cfg.attn_implementation)
            rollout_model.requires_grad_(False).to(self.accelerator.device)
        cuda = self.accelerator.device.type == "cuda"
        self.memory = DeviceMemory(torch.cuda) if cuda else None  # the trainer's own memory, not vLLM's (memory/*)
        if cuda:
            self.memory.engine_starting()
        self.engine = engine_from_config(cfg, rollout_model, self.tok,
                                         [p.prompt for p in self.train] + [p.prompt for v in self.evals.values() for p in v])
        if cuda:
            self.memory.engine_started()
        # the proportional rule's logit proxies read the sampled tokens' log-probs (docs/method.md §2.10)
        self.proxy_reads_logprobs = cfg.inclusion == "proportional" and cfg.size_proxy in NEEDS_LOGPROBS
        self.sampling = SamplingParams(n=cfg.group_size, temperature=cfg.temperature, top_p=cfg.top_p,
                                       top_k=cfg.top_k, max_new_tokens=cfg.max_new_tokens,
                                       logprobs=cfg.rollout_is_correction != "none" or self.proxy_reads_logprobs)
        self.step = 0
        self.next_threads = os.cpu_count() or 1  # intra_op_threads -1 (auto): the first step assumes a quiet machine
        self.skipped_steps = self.skip_streak = self.zero_variance_streak = 0  # safeguards (§4.3)
        self.composer = StepComposer(PromptStream(len(self.train), cfg.seed, prompt_limit(cfg.epochs, len(self.train))),
                                     cfg.refill, cfg.refill_window or 2 * cfg.prompts_per_step, cfg.group_size,
                                     cfg.rollout_token_budget, default_length=cfg.max_new_tokens / 2)
        self.history = PromptHistory()
        self.pruner = build_pruner(cfg)
        if cfg.scale_rewards == "batch" and self.pruner.min_prompt_inclusion() < 1:  # a prompt stage that drops prompts
            warnings.warn("scale_rewards='batch' divides by the std of the rolled-out prompts' rewards, which the "
                          "prompt stage changes: the estimator is then not exactly unbiased (docs/method.md §2.8)",
                          stacklevel=2)
        self.metrics_path = self.out / "metrics.jsonl"
        # the update's layout and micro-batches, decided once from what the model is: the kernel it runs
        # (transformers may swap flash_attention_2 for a hub kernel) and whether a layer carries state along the
        # sequence (then one sequence a row); shared prompts need sdpa / eager and attention layers, dense otherwise
        self.plan = MicroBatchPlan.for_run(cfg.packing, packed_rows(self.policy), cfg.pack_capacity,
                                           cfg.micro_batch_tokens, cfg.micro_batch_size)

    @property
    def policy(self) -> torch.nn.Module:
        """The causal LM being trained (unwrapped; FSDP shards under FSDP)."""
        return self.accelerator.unwrap_model(self.model).policy

    # ------------------------------------------------------------ data order
    def finished(self) -> bool:
        """All epochs covered, or max_steps reached."""
        return self.composer.finished() or bool(self.cfg.max_steps and self.step >= self.cfg.max_steps)

    @property
    def epoch_progress(self) -> float:
        return self.composer.covered / len(self.train)

    def run_fraction(self) -> float:
        """The share of the run done: prompts covered of those its epochs cover, or steps of max_steps when that
        stops the run sooner (`learning_rate`'s f)."""
        f = self.composer.covered / max(1, self.composer.stream.limit)
        return max(f, self.step / self.cfg.max_steps) if self.cfg.max_steps else f

    def _rollout(self, keys: list[int], timer: Timer) -> tuple[RolloutBatch, Rollouts]:
        """One rollout round: G completions for each prompt key (this rank's shard, gathered from every rank in the
        order of `keys`), their rewards and lengths [len(keys), G], and the sampled tokens' log-prob sizes when the
        completion stage's size proxy reads them."""
        G = self.cfg.group_size
        if not keys:
            return RolloutBatch([], [], [], [], []), Rollouts.empty(G)
        mine = shard(keys, self.rank, self.world)
        batch, rewards = RolloutBatch([], [], [], [], []), []  # rewards: [len(mine)][G]
        if mine:
            with timer("rollout"):
                batch = self.engine.generate([self.train[k].prompt for k in mine], self.sampling)
            with timer("reward"):
                rewards = [[math_reward(t, self.train[k].answer, self.cfg.answer_check, self.cfg.answer_format)
                            for t in batch.texts[j * G:(j + 1) * G]] for j, k in enumerate(mine)]
        if self.world > 1:  # every rank gets every rank's rollouts, in the order of `keys`
            with timer("gather"):
                parts = all_gather((batch, rewards))
            batch, rewards = gather_rollouts([b for b, _ in parts], G), unshard([r for _, r in parts])
        lengths = torch.tensor([len(c) for c in batch.completion_ids]).view(len(keys), G)
        return batch, Rollouts(torch.tensor(rewards, dtype=torch.float32).view(len(keys), G), lengths,
                               logit_grad_sizes(batch.logprobs, G) if self.proxy_reads_logprobs else None)

    # ------------------------------------------------------------ one step
    def train_step(self) -> dict:
        """Compose -> prompt stage -> rollout (-> DAPO's refill rounds) -> completion stage (full-group advantages,
        masks, weights and normaliser; docs/method.md §2) -> record history -> update on the kept rows."""
        cfg, pruner = self.cfg, self.pruner
        cuda = self.accelerator.device.type == "cuda"
        timer = Timer(sync=torch.cuda.synchronize if cuda else lambda: None)
        t_step, c_step = timer.now(), time.process_time()
        load = LoadMeter()  # what other work took of the machine's cores meanwhile (dppo.machine)
        load.start()
        B, length0 = cfg.prompts_per_step, cfg.max_new_tokens / 2  # length0: a never-seen prompt's expected length
        gen = seeding.generator(cfg.seed, "masks", self.step)  # the same on every rank: the masks are global
        epoch = self.composer.covered // len(self.train)
        fraction = self.run_fraction()  # done before this step: the learning rate's decay

        keys = self.composer.next_keys(pruner.prompts_to_cover(B), self.history, pruner)
        with timer("prune"):
            prompts = prompt_stage(pruner, keys, self.history, gen, length0)
        batch, rollouts = self._rollout(prompts.rolled, timer)
        rounds = 1
        while wants_refill(pruner, rollouts, rounds, B):  # DAPO dynamic sampling: B more prompts a round
            with timer("prune"):
                more = prompt_stage(pruner, self.composer.stream.take(B), self.history, gen, length0)
            more_batch, more_rollouts = self._rollout(more.rolled, timer)
            prompts, rollouts = prompts.extend(more), rollouts.concat(more_rollouts)
            batch, rounds = RolloutBatch.concat([batch, more_batch]), rounds + 1
        with timer("prune"):
            step = completion_stage(pruner, prompts, rollouts, gen, group_size=cfg.group_size,
                                    scale_rewards=cfg.scale_rewards, adv_eps=cfg.adv_eps, loss_agg=cfg.loss_agg,
                                    loss_normaliser=cfg.loss_normaliser, prompts_per_step=B)
        with timer("rollout"):
            self.engine.sleep()  # vLLM on CUDA: its memory back to the update, once per step
        if self.memory is not None:
            self.memory.update_starting()
        sizes = step.completion.size  # the proportional rule's size proxy [K, G] (the prompt stage's next visit)
        for j, k in enumerate(step.rolled):
            self.history.update(k, step.rewards[j].tolist(), step.advantages[j].abs().tolist(),
                                step.lengths[j].tolist(), self.step, sizes=None if sizes is None else sizes[j].tolist())
        lr = learning_rate(cfg, self.step, fraction)  # every optimizer update of this step uses it
        for group in self.opt.param_groups:
            group["lr"] = lr
        update = self.update(batch, step.rows.tolist(), step.advantages.reshape(-1), step.weights, step.normaliser,
                             timer)
        stats = update.metrics(cfg.ppo_epochs, timer.times["update"])
        self.skip_streak = self.skip_streak + 1 if stats["skipped_updates"] else 0
        self.skipped_steps += bool(stats["skipped_updates"])
        self.engine.sync_weights(self.policy)
        extra_stats = self.pruner.after_step(step.rewards, epoch, stats)
        self.step += 1
        timer.times["step"] = timer.now() - t_step
        timer.cpu["step"] = time.process_time() - c_step
        other_cores = load.stop()
        self.next_threads = free_cores(other_cores)  # what `intra_op_threads: -1` computes the next step with
        flops = {"rollout": self.shape.generation([len(p) for p in batch.prompt_ids],
                                                  [len(c) for c in batch.completion_ids], cfg.group_size),
                 **{phase: update.flops.get(phase, 0.0) for phase in ("old_logprob", "ref_logprob", "update")}}
        flops["step"] = sum(flops.values())
        rewards, n_rows, n_rolled = step.rewards, len(step.rows), len(step.rolled)
        lengths = step.lengths.reshape(-1).float()
        return {
            "step": self.step, "epoch": self.epoch_progress, "processes": self.world, "prompts/covered": len(step.covered),
            "prompts/window": len(self.composer.window),
            "reward": rewards.mean().item() if n_rolled else 0.0,
            "reward_std": rewards.std(dim=1).mean().item() if n_rolled else 0.0,
            "frac_reward_zero_std": zero_std_groups(rewards).float().mean().item() if n_rolled else 0.0,
            "kept/prompt_frac": n_rolled / len(step.covered), "kept/completion_frac": n_rows / max(1, rewards.numel()),
            "weights/mean": step.weights.mean().item() if n_rows else 0.0,
            "weights/max": step.weights.max().item() if n_rows else 0.0, "loss/normaliser": step.normaliser,
            "tokens/generated": batch.num_tokens, "completion_length/mean": lengths.mean().item() if n_rolled else 0.0,
            "throughput/rollout_tokens_per_s": batch.num_tokens / max(1e-9, timer.times["rollout"]),
            "completion_length/truncated_frac": sum(batch.truncated) / max(1, len(batch.truncated)),
            **stats, "skipped_steps": self.skipped_steps, **extra_stats, "lr": lr,
            **{f"timing_s/{k}": v for k, v in timer.times.items()}, **{f"cpu_s/{k}": v for k, v in timer.cpu.items()},
            **{f"flops/{k}": v for k, v in flops.items()}, "load/other_cores": other_cores,
            "load/threads": torch.get_num_threads(),
            **(self.memory.metrics() if self.memory is not None else {}),
        }

    def update(self, batch: RolloutBatch, rows: list[int], adv: torch.Tensor, weights: torch.Tensor,
               normaliser: float, timer: Timer) -> UpdateStats:
        """mu inner epochs of `num_minibatches` optimizer steps over the kept `rows`; what it measured, summed over
        every rank (`UpdateStats`).

        A minibatch holds a uniformly random 1/num_minibatches of the kept rows (of each rank's token-balanced
        share under data parallelism), and its loss uses Z n_mb / n: given the masks its expectation over the
        split is the step's L_hat, for every aggregation (§2.6). Each rank's loss is its share of the global
        one; backward(W x loss) because DDP / FSDP average gradients over the W ranks (`dppo.distributed`)."""
        cfg, W = self.cfg, self.world
        stats = UpdateStats()
        if not rows:  # everything pruned: no forward, no optimizer step
            return stats
        # the kept rows: their prompts and completions, advantages, and the prompt each answers (shared packing)
        p_ids, c_ids = [batch.prompt_ids[r] for r in rows], [batch.completion_ids[r] for r in rows]
        adv, groups = adv[rows], [r // cfg.group_size for r in rows]
        shares = self.shares(p_ids, c_ids, groups, W)  # indices into the kept rows, per rank

        # 1. log-probs without gradients: the old policy's (off-policy only; on-policy the ratio is 1 at the
        # update), the reference's (KL), the rollout engine's (truncated importance sampling)
        old_logp = ref_logp = rollout_logp = None
        off_policy = cfg.ppo_epochs * cfg.num_minibatches > 1
        scored = off_policy or self.ref_model is not None
        plans = [self.micro_batches(share, p_ids, c_ids, groups) for share in shares] if scored else []  # planned once
        mine, busiest = (plans[self.rank], max(len(x) for x in plans)) if scored else ([], 0)
        if off_policy:  # every rank as many forwards as the busiest (FSDP's collectives)
            with timer("old_logprob"):
                old_logp, flops = self.logprobs_no_grad(self.model, p_ids, c_ids, mine, busiest)
            stats.add_flops("old_logprob", flops)
        if self.ref_model is not None:  # sharded under FSDP: every rank in step; else this rank's rows only
            with timer("ref_logprob"):
                ref_logp, flops = self.logprobs_no_grad(self.ref_model, p_ids, c_ids, mine,
                                                        busiest if self.fsdp else len(mine))
            stats.add_flops("ref_logprob", flops)
        if cfg.rollout_is_correction == "tis":
            rollout_logp = pad_completions([batch.logprobs[r] for r in rows], None, self.accelerator.device)[0]

        # 2. the optimizer steps: ppo_epochs passes, each over num_minibatches random splits of every rank's share
        self.model.train()
        # every rank's minibatches (the same generators on every rank), so all know the global sizes and counts
        gens = [seeding.generator(cfg.seed, "minibatches", self.step, r) for r in range(W)]
        with timer("update"):
            for _ in range(cfg.ppo_epochs):
                perms = [[shares[r][i] for i in (torch.randperm(len(shares[r]), generator=gens[r]).tolist()
                                                 if cfg.num_minibatches > 1 else range(len(shares[r])))]
                         for r in range(W)]
                for mb in range(cfg.num_minibatches):
                    mb_rows = [perm[mb::cfg.num_minibatches] for perm in perms]  # per rank
                    n_mb = sum(len(x) for x in mb_rows)
                    if n_mb:  # (none: fewer kept rows than minibatches)
                        # its micro-batches, every rank's planned here: a rank with fewer runs dummies (in step)
                        mb_plans = [self.micro_batches(x, p_ids, c_ids, groups) for x in mb_rows]
                        micro = pad_to(mb_plans[self.rank], max(len(x) for x in mb_plans), DUMMY_MICRO_BATCH)
                        stats = stats.merge(self.minibatch_step(micro, p_ids, c_ids, adv, weights,
                                                                normaliser * n_mb / len(rows), old_logp, ref_logp,
                                                                rollout_logp))
        self.opt.zero_grad(set_to_none=True)  # gradients freed before the next rollout (vLLM wakes into that memory)
        self.model.eval()

        # 3. every rank's sums added up; the update's FLOPs: its forwards x the backward's multiple
        if W > 1:
            stats = UpdateStats.merged(all_gather(stats))
        stats.flops["update"] = stats.flops.get("update", 0.0) * training_multiplier(cfg.gradient_checkpointing)
        return stats

    def minibatch_step(self, micro: list[tuple[bool, MicroBatch]], p_ids: list[list[int]], c_ids: list[list[int]],
                       adv: torch.Tensor, weights: torch.Tensor, mb_norm: float, old_logp: torch.Tensor | None,
                       ref_logp: torch.Tensor | None, rollout_logp: torch.Tensor | None) -> UpdateStats:
        """One optimizer step over a minibatch — this rank's planned micro-batches `micro` ((real, micro-batch); a
        dummy keeps the collectives in step) — with normaliser `mb_norm`: their gradients accumulated (DDP
        all-reduces once, at the last), then clipped and applied; this rank's sums (the update's forward FLOPs under
        "update")."""
        ddp = self.world > 1 and not self.fsdp  # DDP: one all-reduce a minibatch; FSDP reduce-scatters each backward
        stats = UpdateStats()
        self.opt.zero_grad(set_to_none=True)
        for m, (real_mb, mbatch) in enumerate(micro):
            sync = not ddp or m == len(micro) - 1
            with (nullcontext() if sync else self.accelerator.no_sync(self.model)):
                loss, n_slots, diagnostics = self.micro_batch_loss(
                    mbatch, p_ids, c_ids, adv, weights, mb_norm, old_logp, ref_logp, rollout_logp)
                if not real_mb:  # a dummy: keeps this rank's collectives in step, adds nothing
                    loss = loss * 0.0
                scaled = loss * self.world if self.world > 1 else loss
                self.accelerator.backward(scaled if self.scaler is None else self.scaler.scale(scaled))
            if real_mb:
                segs = mbatch.segment_lengths(p_ids, c_ids)
                stats.loss_sum += loss.item()
                stats.add_diagnostics(diagnostics)
                stats.slots += n_slots
                stats.add_flops("update", self.forward_flops(segs, n_slots))
                stats.loss_tokens += sum(sum(cs) for _, cs in segs)
                stats.real_tokens += sum(p + sum(cs) for p, cs in segs)
        norm, skipped = self.optimizer_step()
        stats.grad_norm_sum, stats.optimizer_steps, stats.skipped_steps = norm, 1, int(skipped)
        return stats

    def micro_batch_loss(self, mbatch: MicroBatch, p_ids: list[list[int]], c_ids: list[list[int]], adv: torch.Tensor,
                         weights: torch.Tensor, mb_norm: float, old_logp: torch.Tensor | None,
                         ref_logp: torch.Tensor | None, rollout_logp: torch.Tensor | None
                         ) -> tuple[torch.Tensor, int, dict[str, list[float]]]:
        """(loss, token slots, diagnostics {name: [sum, count]}) of one micro-batch — the kept rows `mbatch.rows`
        (indices into the kept rows' prompts `p_ids` and completions `c_ids`) in its planned layout — scored with
        gradients under autocast: the clipped surrogate of `losses.policy_objective` with the pruning weights and the
        minibatch normaliser, the KL to the reference, and truncated importance sampling against the rollout engine's
        log-probs when on (min(pi_old / pi_rollout, C) a token)."""
        cfg, idx = self.cfg, mbatch.rows
        with self.autocast():
            logp, n_slots = self.score(self.model, p_ids, c_ids, mbatch)  # [n, T]
            ones = [torch.ones(len(c_ids[i])) for i in idx]
            mask = pad_completions(ones, logp.shape[1], logp.device)[1].to(logp.dtype)
            old = logp.detach() if old_logp is None else old_logp[idx, : logp.shape[1]]
            ref = None if ref_logp is None else ref_logp[idx, : logp.shape[1]]
            tis, sums = None, {}
            if rollout_logp is not None:
                gap = (old - rollout_logp[idx, : logp.shape[1]].to(old)) * mask
                tis = torch.exp(gap.clamp(max=20.0)).clamp(max=cfg.rollout_is_cap) * mask
                for name, x in (("rollout_is/weight", tis),
                                ("rollout_is/capped_frac", (tis >= cfg.rollout_is_cap).to(mask) * mask),
                                ("rollout/logprob_abs_diff", gap.abs())):
                    sums[name] = [float(x.sum()), float(mask.sum())]
            loss, st = policy_objective(
                logp, old, adv[idx].to(logp), mask, weights[idx].to(logp.device), mb_norm, loss_type=cfg.loss_type,
                agg=cfg.loss_agg, clip_low=cfg.clip_low, clip_high=cfg.clip_high, ref_logp=ref, kl_coef=cfg.kl_coef,
                kl_bias_correction=cfg.kl_bias_correction, max_len=cfg.max_new_tokens, token_weight=tis)
        return loss, n_slots, {**sums, **st}

    def optimizer_step(self) -> tuple[float, bool]:
        """(global gradient norm, skipped) of one optimizer update: unscale (fp16), clip to max_grad_norm (inf =
        measure only), step — unless the norm is not finite: a NaN / inf loss or gradient never reaches the weights
        (nor a checkpoint). fp16's scaler skips overflowed steps itself and lowers its scale."""
        if self.scaler is not None:
            self.scaler.unscale_(self.opt)
        norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm or math.inf)
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if self.scaler is not None:
            self.scaler.step(self.opt)
            self.scaler.update()
            return norm, False
        if math.isfinite(norm):
            self.opt.step()
            return norm, False
        return norm, True

    def shares(self, p_ids: list[list[int]], c_ids: list[list[int]], groups: list[int], world: int
               ) -> list[list[int]]:
        """The kept rows split over `world` ranks by tokens (`distributed.balance`), whole prompt computations (with
        shared packing a group's rows, so a prompt is computed on one rank)."""
        segs = self.plan.segments(list(range(len(c_ids))), groups)
        split = balance([len(p_ids[s[0]]) + sum(len(c_ids[i]) for i in s) for s in segs], world)
        return [sorted(i for k in share for i in segs[k]) for share in split]

    def micro_batches(self, rows: list[int], p_ids: list[list[int]], c_ids: list[list[int]], groups: list[int]
                      ) -> list[MicroBatch]:
        """The planned micro-batches of `rows` (indices into the kept rows; `MicroBatchPlan`), each with its layout."""
        if not rows:
            return []
        return self.plan.micro_batches(rows, [len(p) for p in p_ids], [len(c) for c in c_ids], groups)

    def score(self, model, p_ids: list[list[int]], c_ids: list[list[int]], mbatch: MicroBatch
              ) -> tuple[torch.Tensor, int]:
        """(logp [n, Tc] of the micro-batch's rows in `mbatch.rows` order, token slots processed): padded, densely
        packed or with shared prompts, in the rows the plan laid out (no re-packing here)."""
        cfg, idx = self.cfg, mbatch.rows
        mp, mc = [p_ids[i] for i in idx], [c_ids[i] for i in idx]
        if self.plan.packing == "shared":
            return shared_prompt_logprobs(model, mp, mc, None, self.tok.pad_token_id, cfg.temperature,
                                          cfg.pack_capacity, layout=mbatch.local_layout())
        if self.plan.packing == "dense":
            rows = [[i for seg in row for i in seg] for row in mbatch.local_layout()]
            return packed_completion_logprobs(model, mp, mc, self.tok.pad_token_id, cfg.temperature,
                                              cfg.pack_capacity, rows=rows)
        logp = completion_logprobs(model, mp, mc, self.tok.pad_token_id, cfg.temperature)
        return logp, len(mp) * max(len(a) + len(b) for a, b in zip(mp, mc))

    def forward_flops(self, segs: list[tuple[int, list[int]]], slots: int) -> float:
        """FLOPs of one scoring forward over the segments (`cost.ModelShape.scoring`)."""
        return self.shape.scoring(segs, slots)

    def autocast(self):
        """The compute dtype's autocast on the training device (a no-op for float32)."""
        return torch.autocast(self.accelerator.device.type, dtype=self.compute_dtype,
                              enabled=self.compute_dtype is not None)

    def logprobs_no_grad(self, model, p_ids: list[list[int]], c_ids: list[list[int]], micro: list[MicroBatch],
                         forwards: int | None = None) -> tuple[torch.Tensor, float]:
        """(log-probs [N, Tc_max] of the rows the micro-batches `micro` lay out (other rows stay 0), their forward
        FLOPs): `forwards` forwards in all (default len(micro)), dummies after the real ones, so that every rank runs
        as many as the busiest where the forwards are collectives (FSDP's all-gathers)."""
        out = torch.zeros((len(c_ids), max(len(c) for c in c_ids)), device=self.accelerator.device)
        flops = 0.0
        with torch.no_grad(), self.autocast():
            for real_mb, mbatch in pad_to(micro, forwards or len(micro), DUMMY_MICRO_BATCH):
                lp, n_slots = self.score(model, p_ids, c_ids, mbatch)
                if real_mb:
                    flops += self.forward_flops(mbatch.segment_lengths(p_ids, c_ids), n_slots)
                    out = out.to(lp.dtype)
                    out[mbatch.rows, : lp.shape[1]] = lp
        return out, flops

    # ------------------------------------------------------------ eval, checkpoints, loop
    def run_eval(self) -> dict[str, float]:
        """Pass@1 per split and averaged (dppo.evaluation) of the current policy, sampled on the stream of `eval_step`,
        as metrics to log: `eval/*` and `eval_n` (samples graded) for an evaluation of every problem, `eval_subset/*`
        and `eval_subset_n` for the first `eval_subset_size` problems of each split (docs/method.md §6.2). With a
        subset, an evaluation during training samples only the subset; the initial one and the final one (after the
        run's last step, whose stream does not depend on that step; a resumed run's too) sample every problem and
        log both. `timing_s/eval` and `cpu_s/eval`: what the evaluation took (never training time)."""
        cfg, final = self.cfg, self.step > 0 and self.finished()
        n = cfg.eval_subset_size
        whole = not n or self.step == 0 or final
        splits = self.evals if whole else {name: problems[:n] for name, problems in self.evals.items()}
        wall, cpu = time.perf_counter(), time.process_time()
        acc = evaluate(self.engine, splits, cfg.eval_samples, cfg.eval_temperature, cfg.max_new_tokens, seed=cfg.seed,
                       step=eval_step(self.step, final), k_per_split=cfg.eval_samples_per_split,
                       answer_check=cfg.answer_check, answer_format=cfg.answer_format, subset_size=n if whole else 0)
        # the engine stays awake: the next step's rollout needs it, and that step sleeps it before its update (a
        # sleep here would need a weight push at the next wake: a collective that a rank without prompts would skip)
        if self.is_main:
            tqdm.write(f"[eval step {self.step}{'' if whole else f', first {n} a split'}] pass@1 (%): "
                       f"{format_accuracy(acc)}")
        if not splits:  # a run without eval splits reports no accuracy
            return {}
        graded = graded_samples(splits, cfg.eval_samples, cfg.eval_samples_per_split)
        spent = {"timing_s/eval": time.perf_counter() - wall, "cpu_s/eval": time.process_time() - cpu}
        if not whole:
            return {**{f"eval_subset/{k}": v for k, v in acc.items()}, "eval_subset_n": graded, **spent}
        out = {**{f"eval/{k}": v for k, v in acc.items() if not k.startswith("subset/")}, "eval_n": graded, **spent}
        if n:
            out.update({f"eval_subset/{k[7:]}": v for k, v in acc.items() if k.startswith("subset/")})
            out["eval_subset_n"] = graded_samples({name: problems[:n] for name, problems in splits.items()},
                                                  cfg.eval_samples, cfg.eval_samples_per_split)
        return out

    def _log(self, record: dict) -> None:
        if self.is_main:  # one write(2) of the whole line, fsynced (runfiles.append_line)
            append_line(self.metrics_path, json_line(record))

    def watch(self, record: dict) -> None:
        """Safeguards after a logged step (docs/engineering.md §4.3): stop after `max_skipped_steps` consecutive steps
        with a non-finite gradient; warn once per streak of `zero_variance_warn_steps` steps in which every
        rolled-out group had zero reward variance (no gradient at all)."""
        cfg = self.cfg
        if self.skip_streak >= cfg.max_skipped_steps:
            raise RunError(f"{self.skip_streak} consecutive steps (to step {self.step}) had a non-finite loss or "
                           f"gradient and were skipped; the last checkpoint holds finite weights; lower lr (now "
                           f"{cfg.lr:g}) or check the data")
        flat = record["kept/prompt_frac"] > 0 and record["frac_reward_zero_std"] == 1  # rolled out, all zero-variance
        self.zero_variance_streak = self.zero_variance_streak + 1 if flat else 0
        if cfg.zero_variance_warn_steps and self.zero_variance_streak == cfg.zero_variance_warn_steps:
            r = record["reward"]
            why = ("reward always 0: no completion is ever right (answers, answer_check, prompt_template, "
                   "max_new_tokens?)" if r == 0 else "reward always 1: every completion is right (task too easy)"
                   if r == 1 else "every group's completions score alike")
            warnings.warn(f"steps {self.step - self.zero_variance_streak + 1}-{self.step}: every group had zero "
                          f"reward variance, so no gradient ({why})", RunWarning, stacklevel=2)

    def save_checkpoint(self) -> None:
        """accelerate's state (model, optimizer, every rank's RNG) + the trainer's step state, written to
        `.step_N.tmp` and renamed to `step_N` when complete (a kill never leaves a half checkpoint under a valid
        name); only the newest `keep_checkpoints` are kept. Every rank enters (FSDP gathers); the main writes."""
        ckpts = self.out / "checkpoints"
        ckpt, tmp = ckpts / f"step_{self.step}", ckpts / f".step_{self.step}.tmp"
        local = [p.to_local() if hasattr(p, "to_local") else p for p in self.model.parameters()]  # FSDP2: own shard
        finite = bool(torch.stack([torch.isfinite(p).all() for p in local]).all())  # one device sync
        if not all(all_gather(finite) if self.world > 1 else [finite]):
            raise RunError(f"step {self.step}: the weights are not finite; nothing saved (the newest checkpoint in "
                           f"{str(ckpts)!r} is the last good one)")
        if self.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        self.accelerator.wait_for_everyone()
        last = max((p for p in ckpts.glob("step_*") if p.is_dir()), key=lambda p: p.stat().st_mtime, default=None)
        needed = folder_bytes(last) if last is not None else 12 * sum(p.numel() for p in local) * self.world
        failed: RunError | None = None
        try:  # a full disk: one line, the partial checkpoint removed, the newest complete one left to resume from
            with space_for(ckpts, f"checkpoint step {self.step}", needed, (tmp,),
                           then=f"the newest complete checkpoint ({last.name if last else 'none'}) resumes the run "
                                f"once there is space: the same command"):
                self.accelerator.save_state(str(tmp), safe_serialization=True)
                if self.is_main:
                    write_atomic(tmp / "trainer_state.json", json.dumps(self.trainer_state()))
        except RunError as e:
            failed = e
        if self.world > 1 and not all(all_gather(failed is None)):  # every rank stops, none waits for the others
            raise failed or RunError(f"checkpoint step {self.step}: another process ran out of space writing it")
        if failed is not None:
            raise failed
        if self.is_main:
            shutil.rmtree(ckpt, ignore_errors=True)
            tmp.rename(ckpt)
            done = sorted((p for p in ckpts.glob("step_*") if (p / "trainer_state.json").is_file()),
                          key=lambda p: int(p.name.split("_")[1]))
            for old in done[: -self.cfg.keep_checkpoints]:
                shutil.rmtree(old, ignore_errors=True)
        self.accelerator.wait_for_everyone()

    def trainer_state(self) -> dict:
        """What a checkpoint adds to accelerate's state: the data position, history, pruner and safeguard counters,
        and the config and training data it was made with (a resumed run must match them)."""
        return {"step": self.step, "composer": self.composer.state_dict(), "history": self.history.state_dict(),
                "pruner": self.pruner.state_dict(), "skipped_steps": self.skipped_steps,
                "skip_streak": self.skip_streak, "zero_variance_streak": self.zero_variance_streak,
                "config": self.cfg.to_dict(), "train_data": data_fingerprint(self.train)}

    def maybe_resume(self) -> bool:
        """Restore model, optimizer, RNG and data position (the learning rate follows from the step) from the newest
        readable checkpoint (a corrupt one is passed over, and said so); metrics.jsonl is cut back to that step so a resumed run's log
        equals an uninterrupted one. A checkpoint made with another config (a field outside
        `config.RESUMABLE_CHANGES`) or other training data stops the run with one line."""
        ckpts = self.out / "checkpoints"
        done = sorted((p for p in ckpts.glob("step_*") if p.is_dir() and p.name[5:].isdigit()),
                      key=lambda p: int(p.name.split("_")[1]), reverse=True)
        self.accelerator.wait_for_everyone()  # every rank has listed the checkpoints before any is removed
        if not self.cfg.resume or not done:  # start over: drop what an earlier run left
            if self.is_main:
                self.metrics_path.unlink(missing_ok=True)
                shutil.rmtree(ckpts, ignore_errors=True)
            self.accelerator.wait_for_everyone()
            return False
        problems = []
        for ckpt in done:
            try:
                state = checkpoint_state(ckpt)
            except ValueError as e:
                problems.append(f"{ckpt.name}: {e}")
                continue
            changed = config_changes(state.get("config") or self.legacy_config(), self.cfg.to_dict(),
                                     RESUMABLE_CHANGES)
            if changed:
                raise ConfigError(f"cannot resume from {str(ckpt)!r}: config field(s) changed: {'; '.join(changed)}; "
                                  f"restore them or set resume: false to start over (fields that may change: "
                                  f"config.RESUMABLE_CHANGES, docs/engineering.md §4.3)")
            if state.get("train_data", data_fingerprint(self.train)) != data_fingerprint(self.train):
                raise ConfigError(f"cannot resume from {str(ckpt)!r}: the training data differ from the checkpoint's "
                                  f"(dataset {self.cfg.dataset!r} changed?); set resume: false to start over")
            try:
                self.accelerator.load_state(str(ckpt))
            except Exception as e:  # a truncated optimizer / RNG file, a checkpoint of another model
                first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
                problems.append(f"{ckpt.name}: {first}")
                continue
            break
        else:
            raise RunError(f"no checkpoint in {str(ckpts)!r} can be loaded ({'; '.join(problems)}); set resume: false "
                           f"to start over")
        if problems and self.is_main:
            warnings.warn(f"passed over unreadable checkpoint(s) {'; '.join(problems)}; resuming from {ckpt.name}",
                          RunWarning, stacklevel=2)
        self.step = state["step"]
        self.composer.load_state_dict(state["composer"])
        self.history.load_state_dict(state["history"])
        self.pruner.load_state_dict(state["pruner"])
        self.skipped_steps = state.get("skipped_steps", 0)
        self.skip_streak, self.zero_variance_streak = state.get("skip_streak", 0), state.get("zero_variance_streak", 0)
        if self.is_main and self.metrics_path.exists():
            keep = [ln for ln in read_jsonl_prefix(self.metrics_path) if json.loads(ln)["step"] <= self.step]
            write_atomic(self.metrics_path, "".join(ln + "\n" for ln in keep))
        self.engine.sync_weights(self.policy)
        if self.is_main:
            tqdm.write(f"resumed from {ckpt} (step {self.step})")
        return True

    def legacy_config(self) -> dict:
        """The config of a checkpoint written before checkpoints recorded theirs: the run folder's config.yaml."""
        try:
            return TrainConfig.load(self.out / "config.yaml").to_dict()
        except (ConfigError, OSError):
            return {}

    def fit(self) -> dict[str, float]:
        """Train to the end; returns the final eval accuracies. The run owns its folder meanwhile (`.lock`)."""
        steps = self.steps()
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def steps(self) -> Iterator[int]:
        """`fit` one step at a time: yields the step number after each step (with its evaluation and checkpoint), and
        returns the final eval accuracies (as StopIteration's value); several runs can take turns
        (`dppo.paired`). The run owns its folder from the first step until the generator ends or is closed."""
        lock = acquire_lock(self.out) if self.is_main else None
        try:
            inner = self._fit()
            while True:
                with self.threads():
                    try:
                        step = next(inner)
                    except StopIteration as done:
                        return done.value
                yield step
        finally:
            release_lock(lock)

    @contextmanager
    def threads(self):
        """torch's intra-op threads set to `intra_op_threads` (when > 0; -1: the cores other work left free during the
        last step) while this run computes, restored after: the setting is process-wide, and runs trained in turn or
        other work in the process may use another."""
        before = torch.get_num_threads()
        want = self.next_threads if self.cfg.intra_op_threads == -1 else self.cfg.intra_op_threads
        if want:
            torch.set_num_threads(want)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def finished_earlier(self) -> bool:
        """Whether this folder holds this run already finished: final/ and metrics written with this config (only
        fields that may change on resume differ) and no checkpoint to resume from (they were removed after final/,
        `keep_checkpoints_after_final: false`). Such a run is done, not started over; a finished run of another
        config stops this one with one line, as a checkpoint of another config does."""
        if not (self.cfg.resume and (self.out / "final").is_dir() and self.metrics_path.is_file()):
            return False
        if any(p.name[5:].isdigit() for p in (self.out / "checkpoints").glob("step_*")):
            return False  # resuming from the last checkpoint finishes at once, and rewrites final/ identically
        saved = self.legacy_config()
        changed = config_changes(saved, self.cfg.to_dict(), RESUMABLE_CHANGES) if saved else ["config.yaml (unreadable)"]
        if changed:
            raise ConfigError(f"{str(self.out)!r} holds a finished run of another config: field(s) changed: "
                              f"{'; '.join(changed)}; restore them, or set resume: false to start over")
        return True

    def _fit(self) -> Iterator[int]:
        cfg = self.cfg
        if self.finished_earlier():
            if self.is_main:
                tqdm.write(f"{self.out} is finished (final/ and metrics.jsonl of this config); nothing to train")
            return {k[5:]: v for k, v in read_metrics(self.metrics_path)[-1].items() if k.startswith("eval/")}
        resumed = self.maybe_resume()
        if self.is_main:
            write_atomic(self.out / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
            write_atomic(self.out / "machine.json", json.dumps(describe(), indent=1))  # what the clocks ran on
        if not resumed and cfg.eval_before_train:
            self._log({"step": 0, **self.run_eval()})
        acc: dict[str, float] = {}
        name = "/".join(self.out.parts[-2:])  # e.g. "grpo/seed1": which run the bar is
        bar = tqdm(total=self.composer.stream.limit, initial=min(self.composer.covered, self.composer.stream.limit),
                   desc=name, unit="prompt", mininterval=10.0, disable=not self.is_main)
        note_due = progress.Throttle(every_s=20.0)  # true at most every 20 s: a line in the progress file
        while not self.finished():
            record = self.train_step()
            last = self.finished()
            if self.step % cfg.eval_every == 0 or last:
                evaluated = self.run_eval()
                record.update(evaluated)
                acc = {k[5:]: v for k, v in evaluated.items() if k.startswith("eval/")} if last else acc
            self._log(record)
            self.watch(record)
            if self.step % cfg.save_every == 0 or last:
                self.save_checkpoint()
            bar.update(min(self.composer.covered, bar.total) - bar.n)
            bar.set_postfix(step=self.step, reward=f"{record['reward']:.3f}",
                            zero_std=f"{record['frac_reward_zero_std']:.2f}")
            if self.is_main and (note_due() or last):
                progress.note(f"  {name}: step {self.step} | {bar.format_meter(**bar.format_dict)}")
            yield self.step
        bar.close()
        final, tmp = self.out / "final", self.out / ".final.tmp"
        state = self.accelerator.get_state_dict(self.model)  # full weights (all-gathered under FSDP) on the main rank
        failed: RunError | None = None
        if self.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            saved = COMPUTE_DTYPES[cfg.save_dtype] or torch.float32  # final/ in the dtype asked for (config save_dtype)
            needed = sum(v.numel() * (saved.itemsize if v.is_floating_point() else v.element_size())
                         for v in state.values())
            try:
                with space_for(self.out, "final weights", needed, (tmp,), then="the newest checkpoint resumes the "
                               "run (it finishes at once and writes final/) once there is space: the same command"):
                    self.policy.save_pretrained(tmp, state_dict={k.removeprefix("policy."): v.to(saved)
                                                                 if v.is_floating_point() else v
                                                                 for k, v in state.items()}, safe_serialization=True)
                    self.tok.save_pretrained(tmp)
            except RunError as e:
                failed = e
        if self.world > 1 and not all(all_gather(failed is None)):  # the other ranks stop too, none waits
            raise failed or RunError("final weights: the main process ran out of space writing them")
        if failed is not None:
            raise failed
        if self.is_main:
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            if not cfg.keep_checkpoints_after_final:
                shutil.rmtree(self.out / "checkpoints", ignore_errors=True)
        self.accelerator.wait_for_everyone()
        if not acc:  # resumed at the very end: read the last eval back
            acc = {k[5:]: v for k, v in read_metrics(self.metrics_path)[-1].items() if k.startswith("eval/")}
        return acc
