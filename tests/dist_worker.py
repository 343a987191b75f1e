"""Run under torchrun by tests/test_distributed.py (one copy per process, gloo on CPU).

    one_step OUT [field=value ...]   Trainer steps (worker_steps=N, default 1) on fixed rollouts; the main rank saves
                                     the parameters, the first step's gradient and record, every step's lr
    fsdp OUT                         FSDP2 (fully_shard) of TokenLogprobs: log-probs, gradients, gathered weights
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
    dist.destroy_process_group()


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    if mode == "one_step":
        one_step(out, {k: yaml.safe_load(v) for k, v in (a.split("=", 1) for a in sys.argv[3:])})
    else:
        fsdp(out)
