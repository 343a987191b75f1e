"""Evaluation: Pass@1 averaged over k samples per problem (avg@k) and pass@k, per split, and avg@k on
average over the splits (docs/method.md §4).

    avg@k(split)  = 1/(|split| k) * sum_problems sum_{j<k} reward(sample_j, gold)
    pass@k(split) = 1/|split| * sum_problems max_{j<k} reward(sample_j, gold)
"""

from __future__ import annotations

import torch

from dppo.data import Problem
from dppo.distributed import all_gather, shard, unshard
from dppo.reward import math_reward
from dppo.rollout import RolloutEngine, SamplingParams


def evaluate(engine: RolloutEngine, splits: dict[str, list[Problem]], k: int, temperature: float,
             max_new_tokens: int, seed: int = 0, k_per_split: dict[str, int] | None = None,
             answer_check: str = "literal", answer_format: str = "boxed") -> dict[str, float]:
    """{split: avg@k, f'{split}/pass@{k}': pass@k, 'avg': mean of the splits' avg@k}, k = k_per_split.get(split, k).
    Sampling uses a forked RNG seeded by `seed`, so evaluating never changes the training run's random stream.
    Under data parallelism each rank samples its shard of every split and the scores are gathered."""
    out: dict[str, float] = {}
    avgs = []
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
        torch.manual_seed(seed + 1_000_003 * rank)
        for name, problems in splits.items():
            n = (k_per_split or {}).get(name, k)
            params = SamplingParams(n=n, temperature=temperature, max_new_tokens=max_new_tokens)
            mine = shard(problems, rank, world)
            texts = engine.generate([p.prompt for p in mine], params).texts if mine else []
            scores = [[math_reward(texts[i * n + j], p.answer, answer_check, answer_format) for j in range(n)]
                      for i, p in enumerate(mine)]
            scores = torch.tensor(unshard(all_gather(scores)), dtype=torch.float32).view(len(problems), n)
            out[name] = float(scores.mean())
            out[f"{name}/pass@{n}"] = float((scores.max(dim=1).values > 0).float().mean())
            avgs.append(out[name])
    if avgs:  # a run without eval splits (a data file and no eval_datasets) evaluates nothing
        out["avg"] = sum(avgs) / len(avgs)
    return out


def format_accuracy(acc: dict[str, float]) -> str:
    return "  ".join(f"{k}={100 * v:.1f}" for k, v in acc.items() if "/pass@" not in k)
