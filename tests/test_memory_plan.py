"""The GPU plan of the paper runs (dppo.memory_plan): every vLLM engine is sized for the most sequences its rank is
asked to decode at once (the formula checked against the trainer's own composer and pruners), and every paper
config's per-GPU memory, phase by phase, fits the GPU it names with a KV cache that holds its budgeted rollout."""

import re
from pathlib import Path

import pytest
import torch

from dppo import budget, memory_plan
from dppo.composition import PromptStream, StepComposer
from dppo.config import TrainConfig
from dppo.distributed import shard
from dppo.history import PromptHistory
from dppo.pruning import build_pruner, prune_step

ROOT = Path(__file__).resolve().parents[1]
PAPER_GPUS = 8  # each paper run: one accelerate launch over the node's 8 GPUs (experiments/paper/<study>.yaml: launch)


def _paper_configs() -> dict[str, TrainConfig]:
    """Every training config the paper profile launches (each study's runs) and every paper recipe as it stands."""
    configs = {str(out): cfg for study in budget.DEFAULT_STUDIES
               for out, (_, cfg) in budget.study_runs(study, "paper").items()}
    configs.update({p.name: TrainConfig.load(p) for p in sorted((ROOT / "experiments/paper").glob("*_qwen3_*.yaml"))})
    return configs


@pytest.fixture(scope="module")
def paper_configs() -> dict[str, TrainConfig]:
    return _paper_configs()


# ------------------------------------------------------------------ the formula against the trainer's calls
B, G, WORLD, N = 6, 2, 4, 64


def _largest_call(cfg: TrainConfig, history: PromptHistory, zero_variance: bool, steps: int = 3) -> tuple[int, int]:
    """(most sequences rank 0 was asked to decode in one call, most prompts a step covered) over `steps` steps
    composed and pruned as `Trainer.train_step` does (rank 0 takes the ceil of every split, `distributed.shard`)."""
    pruner = build_pruner(cfg)
    composer = StepComposer(PromptStream(N, cfg.seed, 10 * N), cfg.refill,
                            cfg.refill_window or 2 * cfg.prompts_per_step, cfg.group_size, cfg.rollout_token_budget,
                            default_length=cfg.max_new_tokens / 2)  # as Trainer.__init__ builds it
    calls, covered = [], []

    def rollout(keys):
        calls.append(len(shard(keys, 0, WORLD)) * cfg.group_size)
        rewards = torch.zeros(len(keys), G) if zero_variance else torch.tensor([[1.0] + [0.0] * (G - 1)] * len(keys))
        return rewards, torch.full((len(keys), G), 3)

    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        keys = composer.next_keys(pruner.prompts_to_cover(cfg.prompts_per_step), history, pruner)
        covered.append(len(keys))
        prune_step(pruner, keys, history, rollout, gen, group_size=G, prompts_per_step=cfg.prompts_per_step,
                   more_keys=composer.stream.take, default_length=cfg.max_new_tokens / 2)
    return max(calls), max(covered)


def _window_short_history(cfg: TrainConfig) -> PromptHistory:
    """Every prompt seen with an informative group (never a candidate): the first window's completions 1 token
    long, the others' 1,000, so the token budget (B groups of the mean length) covers the whole window."""
    window = set(PromptStream(N, cfg.seed, N).order(0)[:cfg.refill_window])
    hist = PromptHistory()
    for k in range(N):
        hist.update(k, [1.0] + [0.0] * (G - 1), [1.0] * G, [1 if k in window else 1000] * G, step=0)
    return hist


def _all_candidates_history() -> PromptHistory:
    hist = PromptHistory()
    for k in range(N):
        hist.update(k, [1.0] * G, [0.0] * G, [3] * G, step=0)  # zero variance: every prompt a candidate
    return hist


CASES = [  # (config fields, history, rollouts of zero variance, the formula's bound reached)
    ({"pruner": "none"}, PromptHistory, False, True),
    ({"pruner": "cppo", "completion_prune_rate": 0.6}, PromptHistory, False, True),  # ceil(6 / 0.4) = 15 prompts
    ({"pruner": "greso"}, PromptHistory, False, True),
    ({"pruner": "dapo_filter"}, PromptHistory, True, True),  # every round refills B more prompts: one call each
    ({"pruner": "dppo", "prompt_prune_rate": 0.5, "completion_prune_rate": 0.5}, PromptHistory, False, True),
    ({"pruner": "dppo", "prompt_prune_rate": 0.5, "refill": "tokens", "refill_window": 16},
     _window_short_history, False, True),
    ({"pruner": "dppo", "prompt_prune_rate": 0.5, "refill": "prompts", "refill_window": 24},
     _all_candidates_history, False, False),
    ({"pruner": "dppo", "prompt_prune_rate": 0.5, "refill": "prompts", "refill_window": 24,
      "inclusion": "proportional", "size_proxy": "length"}, _all_candidates_history, False, False),
]


@pytest.mark.parametrize("fields,history,zero_variance,reached", CASES)
def test_rollout_sequences_per_rank_bounds_every_call_the_trainer_makes(fields, history, zero_variance, reached):
    cfg = TrainConfig(prompts_per_step=B, group_size=G, max_new_tokens=8, **fields)
    hist = history(cfg) if history is _window_short_history else history()
    most, covered = _largest_call(cfg, hist, zero_variance)
    bound = memory_plan.rollout_sequences_per_rank(cfg, WORLD)
    assert most <= bound, (fields, most, bound)
    if reached:  # the bound is what a rank can be asked for, not a loose guess
        assert most == bound, (fields, most, bound)
    else:  # refill by prompts: the covered set (what may all be kept) reaches it
        assert covered <= memory_plan.rollout_prompts_per_call(cfg)
        if cfg.inclusion == "uniform":
            assert covered == memory_plan.rollout_prompts_per_call(cfg)


def test_paper_engines_hold_the_most_sequences_their_rank_decodes_at_once(paper_configs):
    """vLLM's max_num_seqs below the formula queues the rest of a rollout, and the method's wall-clock then measures
    the engine setting (CPPO rolls out ceil(B / (1 - P)) prompts a step; DPPO's token refill up to its window)."""
    short = {name: (memory_plan.engine_max_num_seqs(cfg, PAPER_GPUS),
                    memory_plan.rollout_sequences_per_rank(cfg, PAPER_GPUS))
             for name, cfg in paper_configs.items() if cfg.rollout_backend == "vllm"}
    assert len(short) == len(paper_configs)
    assert not {k: v for k, v in short.items() if v[0] < v[1]}, "max_num_seqs < sequences a rank decodes at once"


# ------------------------------------------------------------------ model shapes and memory
@pytest.mark.parametrize("tied", [True, False])
def test_shape_counts_the_parameters_transformers_builds(tied):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    shape = memory_plan.Shape(hidden=64, intermediate=160, layers=3, heads=4, kv_heads=2, head_dim=24, vocab=500,
                              tied=tied)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=shape.vocab, hidden_size=shape.hidden,
                                         intermediate_size=shape.intermediate, num_hidden_layers=shape.layers,
                                         num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                                         head_dim=shape.head_dim, tie_word_embeddings=tied))
    weights = {id(p): p for p in model.parameters()}.values()  # a tied head once
    assert shape.params == sum(p.numel() for p in weights)
    assert shape.largest_tensor == max(p.numel() for p in weights)
    # the KV cache of one token: K and V of every layer's kv_heads x head_dim
    kv = model.model.layers[0].self_attn.k_proj.out_features + model.model.layers[0].self_attn.v_proj.out_features
    assert memory_plan.kv_bytes_per_token(shape, "bfloat16") == 2 * shape.layers * kv


def test_paper_models_are_the_sizes_their_names_say():
    for name, shape in memory_plan.QWEN3.items():
        assert shape.params == pytest.approx(budget.model_params(name), rel=0.03), name


def test_paper_memory_plans_fit_the_gpu_with_a_kv_cache_for_the_budgeted_rollout(paper_configs):
    """Per GPU, each phase of a step: awake (vLLM's share, the trainer's shards, the weight push's gathered tensor, the
    CUDA context) and update (vLLM asleep; `memory_plan.update_peak_bytes` at the micro-batch's tokens) within the GPU, and
    vLLM's KV cache holding a rank's budgeted rollout whole at the budget's mean completion length (max_new_tokens / 2),
    so a call of the expected size is only preempted when its completions run longer on average."""
    over, short = {}, {}
    for name, cfg in paper_configs.items():
        plan = memory_plan.gpu_memory_plan(cfg, PAPER_GPUS, memory_plan.PAPER_GPU_BYTES)
        assert plan["peak"] == max(plan["awake"], plan["update_phase"]) and plan["update"] > plan["policy_shards"]
        if plan["peak"] > plan["gpu"]:
            over[name] = {k: round(v / 1e9, 1) for k, v in plan.items()}
        need = memory_plan.kv_tokens_needed(cfg, PAPER_GPUS, memory_plan.expected_prompts_per_call(cfg),
                                            cfg.max_new_tokens / 2)
        if memory_plan.vllm_kv_tokens(cfg, PAPER_GPUS) < need:
            short[name] = (memory_plan.vllm_kv_tokens(cfg, PAPER_GPUS), need)
    assert not over, f"over the GPU: {over}"
    assert not short, f"KV cache below the budgeted rollout: {short}"


def test_no_grpo_rollout_is_ever_preempted_on_the_4b():
    """GRPO's whole rollout fits the KV cache at full length (every completion max_new_tokens long) on Qwen3-4B."""
    cfg = TrainConfig.load(ROOT / "experiments/paper/grpo_qwen3_4b_math.yaml")
    full = memory_plan.kv_tokens_needed(cfg, PAPER_GPUS, memory_plan.rollout_prompts_per_call(cfg), cfg.max_new_tokens)
    assert memory_plan.vllm_kv_tokens(cfg, PAPER_GPUS) >= full
    assert memory_plan.preemption_free_length(cfg, PAPER_GPUS) >= cfg.max_new_tokens


def test_paper_yaml_comments_quote_their_memory_plan():
    """Each paper YAML's comment on vllm_gpu_memory_utilization gives its plan's two phases as dppo.memory_plan
    computes them (so the comment cannot drift from the fields it explains)."""
    for path in sorted((ROOT / "experiments/paper").glob("*_qwen3_*.yaml")):
        plan = memory_plan.gpu_memory_plan(TrainConfig.load(path), PAPER_GPUS)
        text = path.read_text()
        rollout, update = re.search(r"rollout ([\d.]+) GB =", text), re.search(r"update ([\d.]+) GB\.", text)
        assert rollout and update, path.name
        assert float(rollout[1]) == round(plan["awake"] / 1e9, 1), path.name
        assert float(update[1]) == round(plan["update_phase"] / 1e9, 1), path.name
