"""Evaluation: Pass@1 averaged over k samples per problem (avg@k) and pass@k, per split, and avg@k on
average over the splits (docs/engineering.md §4).

    avg@k(split)  = 1/(|split| k) * sum_problems sum_{j<k} reward(sample_j, gold)
    pass@k(split) = 1/|split| * sum_problems max_{j<k} reward(sample_j, gold)
"""

from __future__ import annotations

import math

import torch

from dppo import seeding
from dppo.data import Problem
from dppo.distributed import all_gather, shard, unshard
from dppo.reward import math_reward
from dppo.rollout import RolloutEngine, SamplingParams


def evaluate(engine: RolloutEngine, splits: dict[str, list[Problem]], k: int, temperature: float,
             max_new_tokens: int, seed: int = 0, step: int = 0, k_per_split: dict[str, int] | None = None,
             answer_check: str = "literal", answer_format: str = "boxed") -> dict[str, float]:
    """{split: avg@k, f'{split}/pass@{k}': pass@k, 'avg': mean of the splits' avg@k}, k = k_per_split.get(split, k).
    Every split is sampled in one `generate` call (the engine batches them all): n = gcd of the splits' k, and a
    problem whose split takes k samples is asked k / n times. Sampling uses a forked RNG on stream
    (seed, "evaluation", step, rank) (`dppo.seeding`), so evaluating never changes the training run's random stream. Under data parallelism each rank samples its shard
    of every split and the scores are gathered."""
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    ks = {name: (k_per_split or {}).get(name, k) for name in splits}
    n = math.gcd(*ks.values()) if ks else 1
    mine = {name: shard(problems, rank, world) for name, problems in splits.items()}
    prompts = [p.prompt for name, problems in mine.items() for p in problems for _ in range(ks[name] // n)]
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
        torch.manual_seed(seeding.stream_seed(seed, "evaluation", step, rank))
        params = SamplingParams(n=n, temperature=temperature, max_new_tokens=max_new_tokens)
        texts = iter(engine.generate(prompts, params).texts if prompts else [])
    scores = {name: [[math_reward(next(texts), p.answer, answer_check, answer_format) for _ in range(ks[name])]
                     for p in problems] for name, problems in mine.items()}
    parts = all_gather(scores)
    out: dict[str, float] = {}
    for name, problems in splits.items():
        split = torch.tensor(unshard([part[name] for part in parts]), dtype=torch.float32).view(len(problems), ks[name])
        out[name] = float(split.mean())
        out[f"{name}/pass@{ks[name]}"] = float((split.max(dim=1).values > 0).float().mean())
    if splits:  # a run without eval splits (a data file and no eval_datasets) evaluates nothing
        out["avg"] = sum(out[name] for name in splits) / len(splits)
    return out


def format_accuracy(acc: dict[str, float]) -> str:
    return "  ".join(f"{k}={100 * v:.1f}" for k, v in acc.items() if "/pass@" not in k)
