"""Run under torchrun by tests/test_distributed.py (one copy per process, gloo on CPU).

    one_step OUT [field=value ...]   Trainer steps (worker_steps=N, default 1) on fixed rollouts; the main rank saves
                                     the parameters, the first step's gradient and record, every step's lr
    fsdp OUT                         FSDP2 (fully_shard) of TokenLogprobs: log-probs, gradients, gathered weights
    fsdp_prepare OUT DTYPE [checkpointing]
                                     accelerate's own FSDP2 prepare (plugin from the FSDP_* launch environment) after
                                     dppo.distributed.configure_fsdp: one update against the unsharded fp32-master
                                     + autocast step, the dtypes gathered and reduced, the KL reference, the push;
                                     `checkpointing`: the policy's activation checkpointing on, as the trainer
                                     sets it for gradient_checkpointing
"""

from __future__ import annotations

import hashlib
import sys

import torch
import yaml

from dppo.config import TrainConfig
from dppo.rollout import RolloutBatch, SamplingParams


class FixedRollout:
    """Completions that are a function of the prompt alone (the same on any rank, in any batch): G texts per prompt,
    some with the right boxed answer, of lengths that vary with the prompt and the completion's index."""

    def __init__(self, tok, answers: dict[str, str]):
        self.tok, self.answers = tok, answers

    @classmethod
    def install(cls, tr):
        """Replace trainer `tr`'s rollout engine by fixed completions for its train and eval prompts; returns `tr`."""
        tr.engine = cls(tr.tok, {p.prompt: p.answer for p in [*tr.train, *sum(tr.evals.values(), [])]})
        return tr

    def sync_weights(self, model) -> None:
        pass

    def sleep(self) -> None:
        pass

    def generate(self, prompts: list[str], params: SamplingParams) -> RolloutBatch:
        out = RolloutBatch([], [], [], [], [])
        for p in prompts:
            h = int(hashlib.sha256(p.encode()).hexdigest(), 16)
            p_ids = self.tok(p, add_special_tokens=False)["input_ids"]
            for j in range(params.n):
                right = (h >> j) & 1
                text = "so " * ((h >> (3 * j)) % 7) + f"\\boxed{{{self.answers[p] if right else '-1'}}}"
                ids = self.tok(text, add_special_tokens=False)["input_ids"][: params.max_new_tokens]
                out.prompt_ids.append(p_ids)
                out.completion_ids.append(ids)
                out.logprobs.append(torch.zeros(len(ids)))
                out.texts.append(self.tok.decode(ids))
                out.truncated.append(False)
        return out


def end_process_group() -> None:
    """Wait for every rank, then destroy the process group. Without the barrier, a rank that tears its gloo pairs down
    while another still writes its results aborts at exit under torch 2.11 ("terminate called without an active
    exception"; 4 of 30 `fsdp` runs in .venv-min, 0 of 30 with it)."""
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def one_step(out: str, fields: dict) -> None:
    from safetensors.torch import save_file

    from dppo.trainer import Trainer

    steps = int(fields.pop("worker_steps", 1))
    tr = Trainer(TrainConfig.from_dict({**fields, "output_dir": out + "/run"}))
    FixedRollout.install(tr)
    first_grads = {}

    def keep_first_gradient(optimizer, args, kwargs):  # the gradient of the first optimizer step, after all-reduce
        if not first_grads:
            first_grads.update({k: v.grad.detach().clone() for k, v in tr.policy.named_parameters() if v.grad is not None})

    tr.opt.optimizer.register_step_pre_hook(keep_first_gradient)
    records = [tr.train_step() for _ in range(steps)]
    record = records[0]
    if tr.is_main:
        state = {k: v.detach().clone() for k, v in tr.policy.state_dict().items()}
        save_file(state, out + "/params.safetensors")
        save_file(first_grads, out + "/grads.safetensors")
        with open(out + "/record.yaml", "w") as f:
            yaml.safe_dump({k: v for k, v in record.items() if not k.startswith("timing_s")}, f)
        with open(out + "/lrs.yaml", "w") as f:
            yaml.safe_dump([r["lr"] for r in records], f)
        if torch.distributed.is_initialized():  # the process group's timeout, as the trainer set it
            backend = torch.distributed.group.WORLD._get_backend(torch.device("cpu"))
            with open(out + "/timeout.yaml", "w") as f:
                yaml.safe_dump(backend.options._timeout.total_seconds(), f)


def fsdp(out: str) -> None:
    """Shard TokenLogprobs with FSDP2 the way accelerate does on GPUs (each decoder layer, then the root), score
    and back-propagate each rank's half of a batch with loss x W, and compare with the unsharded model on the
    whole batch; gather the weights as the rollout engines do."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from dppo.distributed import all_gather, full_state_items, is_sharded, shard_frozen
    from dppo.model import load_policy
    from dppo.rollout import HFRollout
    from dppo.scoring import TokenLogprobs, completion_logprobs

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    policy, tok = load_policy("embedded", "float32", "sdpa")
    reference = TokenLogprobs(load_policy("embedded", "float32", "sdpa")[0])
    g, vocab = torch.Generator().manual_seed(1), policy.config.vocab_size
    p_ids = [torch.randint(3, vocab, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist() for _ in range(6)]
    c_ids = [torch.randint(3, vocab, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g).tolist() for _ in range(6)]

    def loss_of(model, rows):  # sum of completion log-probs of `rows`, a share of the whole batch's loss
        return -completion_logprobs(model, [p_ids[i] for i in rows], [c_ids[i] for i in rows], 0).sum() / len(p_ids)

    loss_of(reference, range(len(p_ids))).backward()
    expected = {k: v.grad for k, v in reference.named_parameters()}
    scorer = TokenLogprobs(policy)
    for layer in policy.model.layers:
        fully_shard(layer)
    fully_shard(scorer)
    mine = list(range(rank, len(p_ids), world))
    (loss_of(scorer, mine) * world).backward()  # the gradient is reduce-scattered as an average over ranks
    grads = {k: (v.grad.full_tensor() if hasattr(v.grad, "full_tensor") else v.grad) for k, v in scorer.named_parameters()}
    # relative to each tensor's largest gradient: the gradients' scale comes from the model, the rounding of a sum in
    # another order (3 + 3 rows averaged vs 6) is ~1e-7 of it
    grad_diff = max(float((grads[k] - expected[k]).abs().max() / expected[k].abs().max().clamp_min(1e-30))
                    for k in expected)
    copy = load_policy("embedded", "float32", "sdpa")[0]
    with torch.no_grad():
        for p in copy.parameters():
            p.zero_()
    engine = HFRollout(copy, tok)
    engine.sync_weights(scorer.policy)  # FSDP shards -> the engine's own full copy
    full = dict(full_state_items(scorer.policy))
    weight_diff = max(float((v - full[k]).abs().max()) for k, v in copy.state_dict().items())
    ref_diff = max(float((v - reference.policy.state_dict()[k]).abs().max()) for k, v in copy.state_dict().items())
    # the KL reference, sharded the same way (dppo.distributed.shard_frozen) and only scored: every rank's rows equal
    # the unsharded model's
    frozen = shard_frozen(TokenLogprobs(load_policy("embedded", "float32", "sdpa")[0].requires_grad_(False)))
    whole = TokenLogprobs(load_policy("embedded", "float32", "sdpa")[0])
    with torch.no_grad():
        mp, mc = [p_ids[i] for i in mine], [c_ids[i] for i in mine]
        frozen_diff = float((completion_logprobs(frozen, mp, mc, 0) - completion_logprobs(whole, mp, mc, 0)).abs().max())
    rows = all_gather((rank, is_sharded(scorer.policy) and is_sharded(frozen), grad_diff, weight_diff, ref_diff,
                       frozen_diff))
    if rank == 0:
        with open(out + "/fsdp.yaml", "w") as f:
            yaml.safe_dump({"ranks": [list(r) for r in rows]}, f)
    end_process_group()


def fsdp_prepare(out: str, dtype: str, checkpointing: bool) -> None:
    """accelerate's FSDP2 `prepare` of TokenLogprobs and AdamW, as the trainer runs it on GPUs: the plugin is the one
    accelerate builds from the `accelerate launch` environment (FSDP_*; the test derives it from the shipped
    config), the mixed precision policy dppo's (`configure_fsdp`). On CPU accelerate runs MULTI_CPU, so the
    plugin is put into its state by hand; prepare then takes its FSDP2 path (optimizer parameters swapped for the
    shards). One update of a fixed batch (each rank its rows, loss x W) is compared with the unsharded fp32-master
    + autocast update of the whole batch; recorded: the dtypes of the parameters the forward sees, of the
    all-gathers and reduce-scatters, of the sharded parameters, gradients and AdamW state, the KL reference's
    scores before the update (`shard_frozen`) and the weights pushed to rollout engines (`full_state_items`)."""
    import torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    from dppo.config import COMPUTE_DTYPES
    from dppo.distributed import (all_gather, configure_fsdp, full_state_items, load_policy_for, loads_weights,
                                  shard_frozen)
    from dppo.model import load_policy
    from dppo.scoring import TokenLogprobs, completion_logprobs

    acc = Accelerator(cpu=True)
    acc.state.distributed_type = DistributedType.FSDP
    acc.state.fsdp_plugin = FullyShardedDataParallelPlugin()  # what Accelerator() builds from the launch environment
    rank, world = acc.process_index, acc.num_processes
    policy_in_force = configure_fsdp(acc, dtype)
    compute = COMPUTE_DTYPES[dtype]
    lr = 1e-4

    def autocast():
        return torch.autocast("cpu", dtype=compute, enabled=compute is not None)

    def loss_of(model, rows):  # minus the completion log-probs of `rows`, their share of the whole batch's loss
        with autocast():
            return -completion_logprobs(model, [p_ids[i] for i in rows], [c_ids[i] for i in rows], 0).sum() / len(p_ids)

    # the unsharded reference: fp32 master weights, autocast compute, the whole batch, one AdamW step
    reference = TokenLogprobs(load_policy("embedded", "float32", "sdpa")[0])
    g, vocab = torch.Generator().manual_seed(1), reference.policy.config.vocab_size

    def draw(low: int, high: int) -> list[int]:  # a random length in [low, high), random tokens
        return torch.randint(3, vocab, (int(torch.randint(low, high, (1,), generator=g)),), generator=g).tolist()
    p_ids = [draw(3, 9) for _ in range(6)]
    c_ids = [draw(2, 12) for _ in range(6)]
    initial = {k: v.detach().clone() for k, v in reference.named_parameters()}
    loss_of(reference, range(len(p_ids))).backward()
    ref_grads = {k: v.grad.detach().clone() for k, v in reference.named_parameters()}
    torch.optim.AdamW(reference.parameters(), lr=lr, weight_decay=0.0).step()
    ref_update = {k: v.detach() - initial[k] for k, v in reference.named_parameters()}

    policy, _ = load_policy_for(acc, "embedded", "sdpa")
    if checkpointing:  # as Trainer.__init__ for gradient_checkpointing
        from dppo.trainer import enable_gradient_checkpointing

        enable_gradient_checkpointing(policy)
    before = {"loads_weights": loads_weights(acc), "meta": any(p.is_meta for p in policy.parameters()),
              "distinct_storages": len({p.data_ptr() for p in policy.parameters()}) == len(list(policy.parameters())),
              "tied": policy.lm_head.weight is policy.model.embed_tokens.weight}
    scorer = TokenLogprobs(policy)
    model, opt = acc.prepare(scorer, torch.optim.AdamW(scorer.parameters(), lr=lr, weight_decay=0.0))
    policy = model.policy
    loaded = {k: v.clone() for k, v in full_state_items(policy)}
    load_diff = max(float((loaded[k] - v).abs().max()) for k, v in load_policy("embedded")[0].state_dict().items())
    frozen = shard_frozen(TokenLogprobs(load_policy_for(acc, "embedded", "sdpa")[0].requires_grad_(False)))

    seen: dict[str, list] = {k: [] for k in ("gate_proj", "embed", "frozen_gate_proj", "all_gather", "reduce_scatter")}

    def record(key: str, module: torch.nn.Module) -> None:  # the dtype of the weight `module`'s forward uses
        module.register_forward_pre_hook(lambda m, args: seen[key].append(str(m.weight.dtype)))
    record("gate_proj", policy.model.layers[0].mlp.gate_proj)
    record("embed", policy.model.embed_tokens)
    record("frozen_gate_proj", frozen.policy.model.layers[0].mlp.gate_proj)
    # the collectives fully_shard calls: torch 2.13 names them all_gather_single / reduce_scatter_single, torch 2.11
    # (the GPU image's, pyproject.toml's lowest) all_gather_into_tensor / reduce_scatter_tensor (both still exist in 2.13)
    ag_name, rs_name = (("all_gather_single", "reduce_scatter_single") if hasattr(dist, "all_gather_single")
                        else ("all_gather_into_tensor", "reduce_scatter_tensor"))
    all_gather_single, reduce_scatter_single = getattr(dist, ag_name), getattr(dist, rs_name)

    def gather(output_tensor, input_tensor, *args, **kwargs):
        seen["all_gather"].append(str(input_tensor.dtype))
        return all_gather_single(output_tensor, input_tensor, *args, **kwargs)

    def reduce(output, input, *args, **kwargs):
        seen["reduce_scatter"].append(str(input.dtype))
        return reduce_scatter_single(output, input, *args, **kwargs)

    setattr(dist, ag_name, gather)
    setattr(dist, rs_name, reduce)
    mine = list(range(rank, len(p_ids), world))
    with torch.no_grad(), autocast():  # the KL reference before the first update: the policy's scores exactly
        mp, mc = [p_ids[i] for i in mine], [c_ids[i] for i in mine]
        kl_zero = bool(torch.equal(completion_logprobs(model, mp, mc, 0), completion_logprobs(frozen, mp, mc, 0)))
    model.train()  # as Trainer.update (activation checkpointing recomputes in training mode only)
    layer_calls = len(seen["gate_proj"])
    acc.backward(loss_of(model, mine) * world)  # the gradient is reduce-scattered as an average over ranks
    layer_calls = len(seen["gate_proj"]) - layer_calls  # 2 with checkpointing: the forward and its recompute
    setattr(dist, ag_name, all_gather_single)
    setattr(dist, rs_name, reduce_scatter_single)
    local = {"param": {str(p.to_local().dtype) for p in model.parameters()},
             "grad": {str(p.grad.to_local().dtype) for p in model.parameters()}}
    grads = {k: v.grad.full_tensor() for k, v in model.named_parameters()}
    opt.step()
    local["adam"] = {str(t.to_local().dtype) for s in opt.optimizer.state.values() for t in s.values() if t.dim()}
    pushed = dict(full_state_items(policy))
    params = {k: v.detach().full_tensor() for k, v in model.named_parameters()}
    update = {k: params[k] - loaded[k.removeprefix("policy.")] for k in params}

    def compare(a: dict, b: dict) -> tuple[float, float]:  # cosine and norm ratio of a against b
        x = torch.cat([a[k].double().reshape(-1) for k in sorted(b)])
        y = torch.cat([b[k].double().reshape(-1) for k in sorted(b)])
        return float(x @ y / (x.norm() * y.norm())), float(x.norm() / y.norm())

    grad_cos, grad_ratio = compare(grads, ref_grads)
    update_cos, update_ratio = compare(update, ref_update)
    push = {"dtypes": sorted({str(v.dtype) for v in pushed.values()}),
            "equals_masters": all(torch.equal(pushed[k.removeprefix("policy.")], v) for k, v in params.items()),
            "finer_than_bf16": any(bool((v != v.bfloat16().float()).any()) for v in pushed.values())}
    row = {"rank": rank, "policy": repr(policy_in_force), "layer_forwards_in_update": layer_calls,
           "before_prepare": before, "load_diff": load_diff,
           "tied": policy.lm_head.weight is policy.model.embed_tokens.weight,
           "seen": {k: sorted(set(v)) for k, v in seen.items()}, "local": {k: sorted(v) for k, v in local.items()},
           "kl_zero": kl_zero, "grad_cos": grad_cos, "grad_ratio": grad_ratio, "update_cos": update_cos,
           "update_ratio": update_ratio,
           "update_norm": sum(float(v.double().pow(2).sum()) for v in update.values()) ** 0.5,
           "push": push}
    rows = all_gather(row)
    if rank == 0:
        with open(out + "/fsdp_prepare.yaml", "w") as f:
            yaml.safe_dump({"ranks": rows}, f)
    end_process_group()


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    if mode == "one_step":
        one_step(out, {k: yaml.safe_load(v) for k, v in (a.split("=", 1) for a in sys.argv[3:])})
    elif mode == "fsdp_prepare":
        fsdp_prepare(out, sys.argv[3], "checkpointing" in sys.argv[4:])
    else:
        fsdp(out)
