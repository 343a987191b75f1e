"""Evaluation: Pass@1 averaged over k samples per problem (avg@k) and pass@k, per split, and avg@k on
average over the splits (docs/engineering.md §4), with the variance that sampling alone adds to avg@k on these
problems (docs/method.md §6.3: what more samples per problem would remove).

    avg@k(split)  = 1/(|split| k) * sum_problems sum_{j<k} reward(sample_j, gold)
    pass@k(split) = 1/|split| * sum_problems max_{j<k} reward(sample_j, gold)
    sampling_var(split) = 1/(|split|^2 k) * sum_problems s_i^2,   s_i^2 = k/(k-1) * p_i (1 - p_i)
                                                                  (p_i the problem's share right; unbiased, k >= 2)
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
             answer_check: str = "literal", answer_format: str = "boxed", subset_size: int = 0) -> dict[str, float]:
    """{split: avg@k, f'{split}/pass@{k}': pass@k, f'{split}/sampling_var' (k >= 2), 'avg': mean of the splits'
    avg@k, 'avg/sampling_var'}, k = k_per_split.get(split, k); with `subset_size` n > 0 the same keys under
    'subset/' for the first n problems of each split, from the same samples (`summary`).
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
    graded = {name: torch.tensor(unshard([part[name] for part in parts]), dtype=torch.float32).view(len(problems), ks[name])
              for name, problems in splits.items()}  # [problems, k] rewards per split
    out = summary(graded)
    if subset_size:
        out.update({f"subset/{key}": v for key, v in summary({name: g[:subset_size] for name, g in graded.items()}).items()})
    return out


def summary(graded: dict[str, torch.Tensor]) -> dict[str, float]:
    """avg@k, pass@k and sampling_var (the module's formulas) of each split's rewards [problems, k], and their mean
    over the splits ('avg', 'avg/sampling_var' = the splits' sum / splits^2); {} without splits (a run without eval
    splits evaluates nothing)."""
    out: dict[str, float] = {}
    for name, split in graded.items():
        n, k = split.shape
        out[name] = float(split.mean())
        out[f"{name}/pass@{k}"] = float((split.max(dim=1).values > 0).float().mean())
        if k >= 2:
            p = split.mean(dim=1)
            out[f"{name}/sampling_var"] = float((k / (k - 1) * p * (1 - p)).sum() / (n * n * k))
    if graded:
        out["avg"] = sum(out[name] for name in graded) / len(graded)
        if all(f"{name}/sampling_var" in out for name in graded):
            out["avg/sampling_var"] = sum(out[f"{name}/sampling_var"] for name in graded) / len(graded) ** 2
    return out


def format_accuracy(acc: dict[str, float]) -> str:
    return "  ".join(f"{k}={100 * v:.1f}" for k, v in acc.items() if "/" not in k)
