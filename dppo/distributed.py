"""Data parallelism over processes (accelerate: DDP or FSDP; docs/engineering.md §4.1).

Every rank composes the same step (composer, history and pruner state, masks from the same generator); the work
that costs is split: rank r rolls out and scores `shard(rolled, r)`, the rollouts are gathered (`rollout.gather_rollouts`)
so rewards, advantages, history and the normaliser Z are global, and each rank trains on its share of the kept
rows (`balance`), with its loss taken as its share of the global loss L_hat = sum_r L_r:

    grad L_hat = sum_r grad L_r = W * mean_r grad L_r     (DDP / FSDP average gradients: backward(W * L_r))

Collectives must be entered by every rank the same number of times, so every rank runs the same number of
forward passes (`pad_to`), filling with zero-weight dummies where it has less work.

FSDP2 mixed precision (`fsdp_mixed_precision`, set on accelerate's plugin by `configure_fsdp`): the sharded
parameters — the master weights AdamW steps, with its state — stay fp32; each unit's all-gather casts its shard to
the compute dtype first (`dtype: bfloat16` gathers bf16: half the bytes of the forward's and the backward's
all-gathers, and no fp32 full-layer copy), each decoder layer's output is cast back to fp32, so the residual stream
between layers stays fp32 as under autocast over fp32 weights, and gradients are reduce-scattered in fp32 (as DDP
all-reduces them, and as FSDP did before: the sum over W ranks and the accumulation over micro-batches are not
rounded to bf16). dppo's autocast still chooses each op's dtype (the policy casts no forward inputs). The KL
reference is sharded with the same policy (`shard_frozen`), so it scores exactly as the policy before the first
update; the rollout engines still receive the fp32 master weights (`full_state_items`).

`fsdp_cpu_ram_efficient_loading` (accelerate's plugin): only the main process holds the weights in host memory;
the other ranks build the architecture with uninitialised parameters (`load_policy_for`: storage that is never
written is never resident) and receive rank 0's weights when the model is sharded (accelerate's `prepare` for the
policy, `shard_frozen` for the KL reference).
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
    all-gathered as they are reached, so every rank must iterate in step and peak extra memory is one tensor. The
    values are the sharded master weights' (fp32), whatever dtype the forward's all-gathers use."""
    for name, value in model.state_dict().items():
        if hasattr(value, "full_tensor"):  # a DTensor shard (FSDP2)
            value = value.full_tensor()
        yield name, value.detach()


def is_sharded(model: torch.nn.Module) -> bool:
    """True when `model`'s parameters are FSDP2 shards (DTensor)."""
    return any(hasattr(p, "full_tensor") for p in model.parameters())


def fsdp_mixed_precision(dtype: str):
    """The FSDP2 `MixedPrecisionPolicy` for config field `dtype`: the all-gathered (unsharded) parameters in the
    compute dtype, the sharded fp32 ones untouched (the optimizer steps them), gradients reduced in fp32, each unit's
    output cast to fp32 (the residual stream between decoder layers stays fp32, as under autocast over fp32 weights)
    and no forward input cast (autocast decides each op's dtype; masks and rotary tables stay as given). float32:
    the empty policy (fp32 all-gathers, as without one)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from dppo.scoring import COMPUTE_DTYPES

    compute = COMPUTE_DTYPES[dtype]
    if compute is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32, output_dtype=torch.float32,
                                cast_forward_inputs=False)


def fsdp2_plugin(accelerator=None):
    """accelerate's FSDP2 plugin of `accelerator` (default: the process's AcceleratorState, when one exists), or
    None when the run is not FSDP2 (one process, DDP, FSDP1)."""
    if accelerator is None:
        from accelerate.state import AcceleratorState

        if not AcceleratorState._shared_state:  # no Accelerator in this process: do not create its state
            return None
        state = AcceleratorState()
    else:
        state = accelerator.state
    plugin = getattr(state, "fsdp_plugin", None)
    return plugin if plugin is not None and getattr(plugin, "fsdp_version", 1) == 2 else None


def configure_fsdp(accelerator, dtype: str):
    """Called once after the Accelerator is built, before anything is sharded: under FSDP2 sets the plugin's mixed
    precision policy to `fsdp_mixed_precision(dtype)`, which accelerate's `prepare` passes to every `fully_shard` of
    the policy and `shard_frozen` to the KL reference's. accelerate's launch config has no key for it (its
    `mixed_precision` would also make accelerate autocast, and reduce in bf16): dppo's configs set
    `mixed_precision: "no"`; with anything else accelerate's own policy is left as it is. Returns the policy in
    force (None when not FSDP2). (`fsdp_cpu_ram_efficient_loading` re-creates the prepared module's parameters and
    re-ties tied embeddings through its `tie_weights`: `TokenLogprobs.tie_weights`.)"""
    plugin = fsdp2_plugin(accelerator)
    if plugin is None:
        return None
    if str(accelerator.mixed_precision) == "no":
        plugin.mixed_precision_policy = fsdp_mixed_precision(dtype)
    return plugin.mixed_precision_policy


def loads_weights(accelerator) -> bool:
    """False on the ranks other than the main one under FSDP2 with `fsdp_cpu_ram_efficient_loading`: they receive
    rank 0's weights when the model is sharded."""
    plugin = fsdp2_plugin(accelerator)
    return plugin is None or not plugin.cpu_ram_efficient_loading or accelerator.is_main_process


def load_policy_for(accelerator, name_or_path: str, attn_implementation: str):
    """`model.load_policy(name_or_path, "float32", attn_implementation)` on a rank that `loads_weights`; on the
    others the same (model, tokenizer) with the checkpoint never read: the architecture from its config, its
    parameters uninitialised CPU storage (`uninitialized_parameters`: distinct tensors, as accelerate's prepare maps
    the optimizer's parameters by storage address; never written, so never resident), buffers computed, tied weights
    tied. A training checkpoint (`<run>/checkpoints/step_N`) is its run's base model, as in `load_policy`."""
    from pathlib import Path

    from dppo.model import load_policy

    if loads_weights(accelerator):
        return load_policy(name_or_path, "float32", attn_implementation)
    if (Path(name_or_path) / "trainer_state.json").is_file():
        from dppo.runfiles import checkpoint_state

        base = checkpoint_state(Path(name_or_path))["config"]["model_name_or_path"]
        return load_policy_for(accelerator, base, attn_implementation)
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from dppo.model import resolve_model_path

    path = resolve_model_path(name_or_path)
    tok = AutoTokenizer.from_pretrained(path)
    with init_empty_weights(include_buffers=False):  # parameters on the meta device, buffers computed on the CPU
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32,
                                                 attn_implementation=attn_implementation)
    tok.padding_side = "left"  # as load_policy
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model.config.use_cache = False
    return uninitialized_parameters(model).eval(), tok


def uninitialized_parameters(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with every meta-device parameter replaced by uninitialised CPU storage of its shape and dtype (pages
    never written are never resident), shared parameters kept shared and tied weights re-tied (`tie_weights`)."""
    made: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and p.is_meta:
                if id(p) not in made:
                    made[id(p)] = torch.nn.Parameter(torch.empty_like(p, device="cpu"), requires_grad=p.requires_grad)
                module._parameters[name] = made[id(p)]
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model


def shard_frozen(scorer: torch.nn.Module, accelerator=None) -> torch.nn.Module:
    """FSDP2 shards of a model that is only scored, never trained (the KL reference, a `TokenLogprobs`), the way
    accelerate shards the policy (experiments/accelerate/fsdp.yaml: each decoder layer its own unit, then the root,
    with the plugin's mixed precision policy: `configure_fsdp`), so it costs 4 / W bytes a parameter instead of a
    full copy per rank and scores exactly as the policy. `accelerator`: whose FSDP2 plugin to follow (default: the
    process's; none: plain `fully_shard`). Under `fsdp_cpu_ram_efficient_loading` rank 0's parameters and buffers
    are broadcast first (the other ranks built it with `load_policy_for`). Scoring it is a collective: every rank
    runs the same number of forwards (`pad_to`)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    plugin = fsdp2_plugin(accelerator)
    mp_policy = (plugin.mixed_precision_policy if plugin is not None else None) or MixedPrecisionPolicy()
    if plugin is not None and plugin.cpu_ram_efficient_loading and torch.distributed.is_initialized():
        with torch.no_grad():
            for t in {id(t): t for t in [*scorer.parameters(), *scorer.buffers()]}.values():
                torch.distributed.broadcast(t.detach(), src=0)
    units = set(getattr(scorer, "_no_split_modules", None) or [])
    for module in list(scorer.modules()):
        if type(module).__name__ in units:
            fully_shard(module, mp_policy=mp_policy)
    fully_shard(scorer, mp_policy=mp_policy)
    return scorer


def all_gather(obj) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every rank (pickled; small objects: token ids, rewards, sums);
    [obj] when not distributed."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return [obj]
    out = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out
