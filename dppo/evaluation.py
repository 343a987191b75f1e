"""Evaluation: Pass@1 averaged over k samples per problem, per split and on average (docs/method.md §4).

    pass@1(split) = 1/(|split| k) * sum_problems sum_{j<k} reward(sample_j, gold)
"""

from __future__ import annotations

import torch

from dppo.data import Problem
from dppo.reward import math_reward
from dppo.rollout import RolloutEngine, SamplingParams


def evaluate(engine: RolloutEngine, splits: dict[str, list[Problem]], k: int, temperature: float,
             max_new_tokens: int, seed: int = 0) -> dict[str, float]:
    """{split: pass@1, 'avg': mean over splits}. Sampling uses a forked RNG seeded by `seed`, so
    evaluating never changes the training run's random stream."""
    out: dict[str, float] = {}
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
        torch.manual_seed(seed)
        params = SamplingParams(n=k, temperature=temperature, max_new_tokens=max_new_tokens)
        for name, problems in splits.items():
            batch = engine.generate([p.prompt for p in problems], params)
            scores = [math_reward(text, problems[r // k].answer) for r, text in enumerate(batch.texts)]
            out[name] = sum(scores) / len(scores)
    out["avg"] = sum(out.values()) / len(splits)
    return out


def format_accuracy(acc: dict[str, float]) -> str:
    return "  ".join(f"{k}={100 * v:.1f}" for k, v in acc.items())
