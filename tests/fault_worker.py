"""A training run that kills itself with SIGKILL at a chosen point (run by tests/test_faults.py).

    python tests/fault_worker.py OUT POINT [CONFIG.yaml]
        POINT: none | checkpoint:N | update:N | step:N | final, each optionally rankR:POINT

checkpoint:N  inside the step-N checkpoint write: accelerate's files written, trainer state and rename not yet
update:N      inside step N's update: after the first backward, before the optimizer step
step:N        after step N, once its checkpoint is written (every rank has left the checkpoint's last barrier)
final         inside the final model's write, after every checkpoint
rankR:POINT   under torchrun: only rank R dies there; the other ranks run on until torchrun ends them
CONFIG.yaml   the run's config (output_dir set to OUT) instead of `CONFIG`
"""

from __future__ import annotations

import os
import signal
import sys

from dppo.config import TrainConfig
from dppo.trainer import Trainer

CONFIG = dict(train_size=12, eval_size=2, eval_samples=1, prompts_per_step=3, group_size=4, max_new_tokens=12,
              max_steps=4, eval_every=2, save_every=1, keep_checkpoints=2, lr=2e-4, pruner="dppo",
              prompt_prune_rate=0.5, completion_prune_rate=0.5, packing="shared")


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(out: str, point: str, config: str | None = None) -> None:
    cfg = TrainConfig.load(config, {"output_dir": out}) if config else TrainConfig(output_dir=out, **CONFIG)
    trainer = Trainer(cfg)
    if point.startswith("rank"):
        rank, _, point = point.partition(":")
        if trainer.rank != int(rank[len("rank"):]):
            point = "none"
    kind, _, n = point.partition(":")
    acc = trainer.accelerator
    if kind == "checkpoint":
        real = acc.save_state

        def save_state(path, **kw):
            real(path, **kw)
            if trainer.step == int(n):
                die()
        acc.save_state = save_state
    elif kind == "update":
        real_backward = acc.backward

        def backward(loss, **kw):
            real_backward(loss, **kw)
            if trainer.step == int(n) - 1:  # trainer.step counts finished steps
                die()
        acc.backward = backward
    elif kind == "step":
        real_checkpoint = trainer.save_checkpoint

        def save_checkpoint():
            real_checkpoint()
            if trainer.step == int(n):
                die()
        trainer.save_checkpoint = save_checkpoint
    elif kind == "final":
        real_save = trainer.policy.save_pretrained

        def save_pretrained(path, **kw):
            real_save(path, **kw)
            die()
        trainer.policy.save_pretrained = save_pretrained
    trainer.fit()


if __name__ == "__main__":
    main(*sys.argv[1:4])
