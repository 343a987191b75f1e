"""Every random stream of a run, named by one key (docs/method.md §6.1).

A stream is a key (seed, purpose, step, rank): the run's seed, what the numbers are for (`PURPOSES`), the step that
draws them and the process. `stream_seed` hashes the key with numpy's SeedSequence (built for this: spawning
independent streams from a key), so two different keys never share a stream. Strides summed into one integer do not
promise that: step s's masks were seeded with seed * 1_000_003 + 7919 s + 1 and step s' 's minibatches with
seed * 1_000_003 + s' + 104_729 * rank, so step 0's masks and step 1's minibatches drew the same numbers; the
rollouts' seed + rank gave seed 1's rank 0 the stream of seed 0's rank 1."""
import numpy as np
import torch

# What a stream is for: the rollouts' sampling (torch's and Python's global generators, per process), the pruning
# masks of a step (the trainer's, one stream for both stages and DAPO's extra rounds), a rank's minibatch order,
# an evaluation's sampling, and the masks of the TRL adapter's generation batches (prompt and completion stage
# apart, as TRL draws them at different times).
PURPOSES = ("rollouts", "masks", "minibatches", "evaluation", "trl_prompt_masks", "trl_completion_masks")


def stream_seed(seed: int, purpose: str, step: int = 0, rank: int = 0) -> int:
    """The 63-bit seed of stream (seed, purpose, step, rank): the first 63 bits of
    SeedSequence([seed, PURPOSES.index(purpose), step, rank]).generate_state(2) — the same on every process and
    machine, so every rank can draw another rank's stream (the minibatch plan) and a resumed run draws what it
    would have drawn."""
    if purpose not in PURPOSES:
        raise ValueError(f"stream purpose must be one of {list(PURPOSES)}, got {purpose!r}")
    if min(seed, step, rank) < 0:
        raise ValueError(f"a stream's seed, step and rank must be integers >= 0, got {(seed, step, rank)}")
    low, high = np.random.SeedSequence([seed, PURPOSES.index(purpose), step, rank]).generate_state(2)
    return int(low) | (int(high) & 0x7FFF_FFFF) << 32


def generator(seed: int, purpose: str, step: int = 0, rank: int = 0) -> torch.Generator:
    """A CPU torch.Generator on stream (seed, purpose, step, rank) (`stream_seed`)."""
    return torch.Generator().manual_seed(stream_seed(seed, purpose, step, rank))
