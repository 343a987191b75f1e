"""Run under torchrun by tests/test_trl.py (one copy per process, gloo on CPU).

    trl_worker.py OUT run         a sampled DPPOTrainer run on the embedded model; each rank writes its pruning log,
                                  the dataset indices of its own rows and its steps to OUT/rank<r>.json
    trl_worker.py OUT gradients   for each CASE, one generation batch of the rig (tests/trl_rig.py) through
                                  DPPOTrainer, each rank scoring its half of the rows; rank 0 writes the gradient
                                  averaged over the ranks (what DDP applies) to OUT/gradients.pt
    trl_worker.py OUT forwards    a packed no-grad pass over rows of unequal lengths on the two ranks (long on rank 0,
                                  short on rank 1); each rank writes its model calls and the largest difference from
                                  the padded pass to OUT/forwards<r>.json"""

import copy
import json
import sys
import tempfile

import torch
from datasets import Dataset

from dppo.model import load_policy
from dppo.task import make_train
from dppo.trl import DPPOConfig, DPPOTrainer

# (loss_type, prompt_prune_rate): the rig's 4 prompts, completion stage fixed_count at 0.5, beta 0.1
CASES = [("grpo", 0.0), ("dapo", 0.7), ("dr_grpo", 0.7)]


def zero_reward(completions, **kwargs):  # every group zero-variance: every prompt a candidate after its first visit
    return [0.0] * len(completions)


def sampled_run(out: str) -> None:
    model, tok = load_policy("embedded")
    data = Dataset.from_list([{"prompt": p.prompt} for p in make_train(16, 0)])
    args = DPPOConfig(output_dir=tempfile.mkdtemp(), use_cpu=True, bf16=False, num_generations=4,
                      per_device_train_batch_size=8, steps_per_generation=1, max_completion_length=12,
                      num_train_epochs=2, report_to="none", save_strategy="no", seed=0, disable_tqdm=True,
                      prompt_prune_rate=0.5, completion_prune_rate=0.5, beta=0.04)
    trainer = DPPOTrainer(model=model, reward_funcs=zero_reward, args=args, train_dataset=data, processing_class=tok)
    rows: list[list[int]] = []
    own = trainer._generation_rows = rows
    original = trainer._generate_and_score_completions

    def record(inputs):
        own.append([x["dppo_index"] for x in inputs])
        return original(inputs)
    trainer._generate_and_score_completions = record
    trainer.train()
    rank = trainer.accelerator.process_index
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"log": list(trainer.pruning_log), "rows": rows, "steps": trainer.state.global_step,
                   "processes": trainer.accelerator.num_processes}, f)


def rig_gradient(trainer, processes: int, rank: int) -> torch.Tensor:
    """One generation batch of the rig through `trainer` (its sampler's first composition, the prompts' history set
    as tests/test_trl.py sets it), this process scoring rows [rank n, (rank + 1) n) of it: the gradient of its loss."""
    from dppo.history import PromptRecord
    from tests.trl_rig import COMPLETIONS, G, batch_gradient, rows

    for key in range(4):  # seen before, zero variance, the lengths these completions have
        trainer.prompt_history.records[key] = PromptRecord(visits=1, zero_variance=True,
                                                           mean_length=sum(map(len, COMPLETIONS[key][0])) / G)
    sampler = trainer._get_train_sampler()
    sampler.max_passes, sampler.position, sampler.batch_no = 1, 0, 0
    comp = sampler.compose()
    sampler.compositions[comp.batch_no] = comp
    batch = rows(comp.rolled, comp.batch_no)
    n = len(batch) // processes
    return batch_gradient(trainer, trainer._generate_and_score_completions(batch[rank * n:(rank + 1) * n]))


def rig_trainer(loss_type: str, prompt_rate: float, processes: int, out: str):
    """The rig's DPPOTrainer in float64, one micro-batch per generation batch, which `processes` processes share."""
    from tests.trl_rig import PROMPTS, G, make_trainer

    model, tok = load_policy("embedded")
    data = Dataset.from_list([{"prompt": p} for p in PROMPTS])
    rows_per_device = (2 if prompt_rate else 4) * G // processes
    return make_trainer(DPPOTrainer, DPPOConfig, copy.deepcopy(model).double(), tok, data, out, rows_per_device,
                        steps_per_generation=1, gradient_accumulation_steps=1, loss_type=loss_type, beta=0.1,
                        prompt_prune_rate=prompt_rate, completion_prune_rate=0.5, prune_sampling="fixed_count")


def gradients(out: str) -> None:
    import torch.distributed as dist
    import trl.trainer.utils
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    from tests.trl_rig import Float64LogProbs, rms_norm_float64

    trl.trainer.utils._ChunkedLogProbFunction = Float64LogProbs  # as tests/trl_rig.float64_numerics
    Qwen3RMSNorm.forward = rms_norm_float64
    result = {}
    for loss_type, prompt_rate in CASES:
        trainer = rig_trainer(loss_type, prompt_rate, 2, tempfile.mkdtemp())
        rank, processes = trainer.accelerator.process_index, trainer.accelerator.num_processes
        grad = rig_gradient(trainer, processes, rank)
        dist.all_reduce(grad)
        result[loss_type] = grad / processes
    if rank == 0:
        torch.save(result, f"{out}/gradients.pt")


def forwards(out: str) -> None:
    import trl.trainer.utils
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    from tests.trl_rig import Float64LogProbs, rms_norm_float64

    trl.trainer.utils._ChunkedLogProbFunction = Float64LogProbs
    Qwen3RMSNorm.forward = rms_norm_float64
    trainer = rig_trainer("grpo", 0.0, 2, tempfile.mkdtemp())
    rank = trainer.accelerator.process_index
    trainer.args.pack_capacity = 64
    # 9 rows of 4 prompt + K completion columns: rank 0's completions 56 tokens (a row each: 3 calls of 3 rows),
    # rank 1's 16 (3 a row: one call)
    K, used = 60, (56 if rank == 0 else 16)
    gen = torch.Generator().manual_seed(rank)
    ids = torch.randint(5, 200, (9, 4 + K), generator=gen)
    mask = torch.zeros_like(ids)
    mask[:, :4 + used] = 1
    calls = []
    hook = trainer.model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(1), with_kwargs=True)
    with torch.no_grad():
        packed = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, K, batch_size=3)[0]
        hook.remove()
        trainer.args.pack_sequences = False
        padded = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, K, batch_size=3)[0]
    error = float((packed - padded)[mask[:, 4:].bool()].abs().max())
    with open(f"{out}/forwards{rank}.json", "w") as f:
        json.dump({"calls": len(calls), "error": error}, f)


if __name__ == "__main__":
    {"run": sampled_run, "gradients": gradients, "forwards": forwards}[sys.argv[2]](sys.argv[1])
