"""Data parallelism over processes (accelerate: DDP or FSDP; docs/method.md §4.1).

Every rank composes the same step (composer, history and pruner state, masks from the same generator); the work
that costs is split: rank r rolls out and scores `shard(rolled, r)`, the rollouts are gathered (`rollout.gather_rollouts`)
so rewards, advantages, history and the normaliser Z are global, and each rank trains on its share of the kept
rows (`balance`), with its loss taken as its share of the global loss L_hat = sum_r L_r:

    grad L_hat = sum_r grad L_r = W * mean_r grad L_r     (DDP / FSDP average gradients: backward(W * L_r))

Collectives must be entered by every rank the same number of times, so every rank runs the same number of
forward passes (`pad_to`), filling with zero-weight dummies where it has less work.
"""

from __future__ import annotations

from typing import Iterator

import torch


def shard(items: list, rank: int, world: int) -> list:
    """Rank `rank`'s share of `items`: every world-th item, starting at `rank` (sizes differ by at most one)."""
    return items[rank::world]


def unshard(parts: list[list]) -> list:
    """Inverse of `shard`: the per-rank lists [shard(items, r, W) for r < W] back in the order of `items`."""
    out, world = [], len(parts)
    for i in range(sum(len(p) for p in parts)):
        out.append(parts[i % world][i // world])
    return out


def balance(lengths: list[int], world: int) -> list[list[int]]:
    """Indices of `lengths` split over `world` ranks with nearly equal token totals: longest first, each to the
    rank with the fewest tokens so far (LPT; the largest total is at most 4/3 of the optimum). Deterministic, so
    every rank computes every rank's share without communicating."""
    shares: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        r = min(range(world), key=lambda k: (load[k], k))
        shares[r].append(i)
        load[r] += lengths[i]
    return [sorted(s) for s in shares]


def pad_to(items: list, count: int, filler) -> list[tuple[bool, object]]:
    """[(True, item) ...] followed by (False, filler) up to `count` entries: the dummies keep collectives aligned."""
    return [(True, x) for x in items] + [(False, filler)] * (count - len(items))


def full_state_items(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of every entry of `model.state_dict()`, one at a time; FSDP2 shards (DTensor) are
    all-gathered as they are reached, so every rank must iterate in step and peak extra memory is one tensor."""
    for name, value in model.state_dict().items():
        if hasattr(value, "full_tensor"):  # a DTensor shard (FSDP2)
            value = value.full_tensor()
        yield name, value.detach()


def is_sharded(model: torch.nn.Module) -> bool:
    """True when `model`'s parameters are FSDP2 shards (DTensor)."""
    return any(hasattr(p, "full_tensor") for p in model.parameters())


def shard_frozen(scorer: torch.nn.Module) -> torch.nn.Module:
    """FSDP2 shards of a model that is only scored, never trained (the KL reference, a `TokenLogprobs`), the way
    accelerate shards the policy (experiments/accelerate/fsdp.yaml: each decoder layer its own unit, then the root),
    so it costs 4 / W bytes a parameter instead of a full copy per rank. Scoring it is a collective: every rank runs
    the same number of forwards (`pad_to`)."""
    from torch.distributed.fsdp import fully_shard

    units = set(getattr(scorer, "_no_split_modules", None) or [])
    for module in list(scorer.modules()):
        if type(module).__name__ in units:
            fully_shard(module)
    fully_shard(scorer)
    return scorer


def all_gather(obj) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every rank (pickled; small objects: token ids, rewards, sums);
    [obj] when not distributed."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return [obj]
    out = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out
