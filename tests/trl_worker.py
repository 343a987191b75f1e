"""Run under torchrun by tests/test_trl.py (one copy per process, gloo on CPU): a DPPOTrainer run on the embedded
model; each rank writes its pruning log, the dataset indices of its own rows and its steps to OUT/rank<r>.json."""

import json
import sys
import tempfile

from datasets import Dataset

from dppo.model import load_policy
from dppo.task import make_train
from dppo.trl import DPPOConfig, DPPOTrainer


def zero_reward(completions, **kwargs):  # every group zero-variance: every prompt a candidate after its first visit
    return [0.0] * len(completions)


def main(out: str) -> None:
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
        json.dump({"log": trainer.pruning_log, "rows": rows, "steps": trainer.state.global_step,
                   "processes": trainer.accelerator.num_processes}, f)


if __name__ == "__main__":
    main(sys.argv[1])
