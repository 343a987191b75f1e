"""Every random stream of a run has its own key (dppo.seeding): no two purposes, steps, ranks or seeds share one."""

import pytest
import torch

from dppo import seeding
from dppo.config import TrainConfig
from dppo.trainer import Trainer


def test_every_key_names_its_own_stream():
    """Over 4 seeds x every purpose x 64 steps x 8 ranks, no two keys give one seed (nor one first draw), and a key
    gives the same numbers every time it is asked (another process, a resumed run)."""
    keys = [(seed, purpose, step, rank) for seed in range(4) for purpose in seeding.PURPOSES for step in range(64)
            for rank in range(8)]
    seeds = [seeding.stream_seed(*key) for key in keys]
    assert len(set(seeds)) == len(keys) and all(0 <= s < 2**63 for s in seeds)
    first = {torch.randint(2**62, (1,), generator=seeding.generator(*key)).item() for key in keys[:2000]}
    assert len(first) == 2000
    again = seeding.generator(1, "minibatches", 5, 3)
    assert torch.equal(torch.rand(8, generator=again), torch.rand(8, generator=seeding.generator(1, "minibatches", 5, 3)))


def test_a_bad_key_is_a_one_line_error():
    with pytest.raises(ValueError, match=r"purpose must be one of \['rollouts', 'masks'"):
        seeding.stream_seed(0, "mask")
    with pytest.raises(ValueError, match="must be integers >= 0"):
        seeding.stream_seed(-1, "masks")


def test_a_runs_generators_never_share_a_seed(tmp_path, embedded, monkeypatch):
    """A DPPO run of 3 steps with 2 minibatches and 2 PPO epochs: every torch.Generator the trainer seeds (a step's
    masks, each rank's minibatch order) gets a seed of its own. With the seeds of strides summed into one integer
    (seed * 1_000_003 + 7919 s + 1 for the masks, seed * 1_000_003 + s + 104_729 r for the minibatches), step 0's
    masks and step 1's minibatches got seed 1."""
    seeded: list[int] = []

    class Recording(torch.Generator):
        def manual_seed(self, seed):
            seeded.append(int(seed))
            return super().manual_seed(seed)

    monkeypatch.setattr(torch, "Generator", Recording)
    Trainer(TrainConfig(output_dir=str(tmp_path), max_steps=3, train_size=16, eval_size=2, eval_samples=1,
                        eval_every=1000, eval_before_train=False, prompts_per_step=4, group_size=4, max_new_tokens=16,
                        num_minibatches=2, ppo_epochs=2, pruner="dppo", prompt_prune_rate=0.5,
                        completion_prune_rate=0.5, save_every=1000)).fit()
    assert len(seeded) >= 3 * 2  # per step: the masks' and the minibatches' (one rank)
    assert len(set(seeded)) == len(seeded), seeded


def test_an_evaluation_draws_from_its_key_alone(tmp_path, embedded):
    """The real evaluation (Trainer.run_eval -> dppo.evaluation.evaluate): what it samples is decided by its key
    (seed, evaluation, step) alone — the same after the run's global random state moved, and the same for another
    run's equal model (common random numbers: what every paired accuracy difference relies on) — and another step's
    key samples otherwise. Sampling from the global state instead passes every other test."""
    import dataclasses
    import random

    cfg = TrainConfig(output_dir=str(tmp_path / "a"), train_size=8, eval_size=6, eval_samples=2, max_new_tokens=16,
                      prompts_per_step=4, group_size=2, max_steps=10, eval_every=1000, save_every=1000)
    runs = [Trainer(cfg), Trainer(dataclasses.replace(cfg, output_dir=str(tmp_path / "b")))]

    def sampled(trainer, global_seed: int) -> list[str]:
        texts, generate = [], trainer.engine.generate
        trainer.engine.generate = lambda *a, **k: (lambda out: (texts.extend(out.texts), out)[1])(generate(*a, **k))
        torch.manual_seed(global_seed)
        random.seed(global_seed)
        trainer.run_eval()
        trainer.engine.generate = generate
        return texts
    first = sampled(runs[0], 1)
    assert first and sampled(runs[0], 2) == first  # the run's global state moved: the same samples
    assert sampled(runs[1], 3) == first  # another run, an equal model, the same key: the same samples
    runs[0].step = 2  # the evaluation at step 2 of 10 (the model unchanged): its own key, other samples
    assert sampled(runs[0], 1) != first
