"""The disk a run keeps and the most it holds while it trains, from its config alone (the dry run, `dppo.budget`,
and a study's check before it trains, `dppo.results.run_layout`, both read it; docs/engineering.md §4.2-4.3)."""

from __future__ import annotations

import math
from pathlib import Path

from dppo.config import TrainConfig
from dppo.studies import model_params

# records of the paper's hub datasets (so the dry run needs no download)
DATASET_SIZES = {
    "hf:DigitalLearningGmbH/MATH-lighteval:train": 7500, "hf:HuggingFaceH4/MATH-500:test": 500,
    "hf:HuggingFaceH4/aime_2024:train": 30, "hf:math-ai/amc23:test": 40, "hf:math-ai/minervamath:test": 272,
    "hf:math-ai/olympiadbench:test": 675, "hf:openai/gsm8k:test:main": 1319,
}


def dataset_size(source: str, limit: int | None = None, embedded_size: int = 0) -> int:
    if source == "embedded":
        n = embedded_size
    elif source == "arithmetic":
        n = embedded_size  # train_size of its 610 facts
    elif source in DATASET_SIZES:
        n = DATASET_SIZES[source]
    elif Path(source).is_file() and source.endswith(".jsonl"):
        n = sum(1 for ln in Path(source).read_text().splitlines() if ln.strip())
    else:
        raise ValueError(f"unknown dataset size for {source!r}: add it to dppo.disk.DATASET_SIZES")
    return min(n, limit) if limit else n


CHECKPOINT_BYTES_PER_PARAM = 12  # fp32 master weights (4) + AdamW's two fp32 moments (8)
SAVE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2}  # final/: the weights in the config's save_dtype (float32 if unset)


def final_bytes_per_param(cfg: TrainConfig) -> int:
    """Bytes a parameter takes in final/: 4 (float32, the default) or 2 (bfloat16), from `save_dtype`."""
    dtype = getattr(cfg, "save_dtype", "float32")
    if dtype not in SAVE_DTYPE_BYTES:
        raise ValueError(f"save_dtype must be one of {list(SAVE_DTYPE_BYTES)}, got {dtype!r}")
    return SAVE_DTYPE_BYTES[dtype]


def run_disk_bytes(cfg: TrainConfig, trimmed: bool = False) -> tuple[float, float]:
    """(disk a finished run keeps, the most it holds while training): final/ (N x `final_bytes_per_param`), plus the
    checkpoints it keeps (12 N each: its `keep_checkpoints` newest of the ones it writes, every `save_every` steps and
    at its last) unless `keep_checkpoints_after_final` is false; while training, one more checkpoint than kept where
    it writes more than it keeps (the newest is complete before the oldest is removed). `trimmed`: the checkpoints it
    keeps are cut to their weights once it is done (`results.keep_weights_only`: N x `final_bytes_per_param` each).
    Qwen3-4B: final/ 16 GB in float32, 8 GB in bfloat16; 48 GB a checkpoint."""
    n_params = model_params(cfg.model_name_or_path.removeprefix("hf:"))
    steps = cfg.max_steps or math.ceil(dataset_size(cfg.dataset, None, cfg.train_size) * cfg.epochs
                                       / cfg.prompts_per_step)
    saves = math.ceil(steps / cfg.save_every)  # the trainer saves every save_every steps and at the last
    kept_checkpoints = min(cfg.keep_checkpoints, saves)
    held = kept_checkpoints * CHECKPOINT_BYTES_PER_PARAM * n_params
    final = final_bytes_per_param(cfg) * n_params
    after = kept_checkpoints * final if trimmed else held
    return (final + (after if cfg.keep_checkpoints_after_final else 0.0),
            final + held + (CHECKPOINT_BYTES_PER_PARAM * n_params if saves > cfg.keep_checkpoints else 0.0))


def disk_plan(groups: list[list[TrainConfig]], trimmed: bool = False) -> tuple[float, float]:
    """(bytes kept when every run is done, the most on disk at any time) of runs trained group after group, the runs
    of a group together (CPU runs in turn: each holds its checkpoints at once): `run_disk_bytes` of each (`trimmed`:
    its checkpoints cut to their weights once done), the groups before a group kept beside its runs' peaks."""
    kept, most = 0.0, 0.0
    for group in groups:
        sizes = [run_disk_bytes(cfg, trimmed) for cfg in group]
        most = max(most, kept + sum(peak for _, peak in sizes))
        kept += sum(k for k, _ in sizes)
    return kept, most


def runs_at_once(configs: list[TrainConfig], folder: str | Path) -> int | None:
    """How many of `configs` may train in turn together in `folder` (`dppo.results.in_turn_chunks`): the free space
    there less what all of them keep when done, over the most one run holds beyond that while it trains (its
    checkpoints at their peak, `run_disk_bytes`: runs trained in turn hold theirs at once, the last step's until
    their final/ is written); at least 1 (`disk_shortfall` then says whether one at a time fits). None: no limit
    (nothing held beyond what is kept, or a model whose size its name does not give)."""
    try:
        sizes = [run_disk_bytes(cfg) for cfg in configs]
    except ValueError:
        return None
    held = max((peak - kept for kept, peak in sizes), default=0.0)
    if held <= 0:
        return None
    return max(1, int((free_bytes(folder) - sum(kept for kept, _ in sizes)) // held))


def free_bytes(folder: str | Path) -> int:
    """Free bytes on the device `folder` would be on (its nearest existing parent's)."""
    import shutil

    path = Path(folder).resolve()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def disk_shortfall(groups: list[list[TrainConfig]], folder: str | Path, what: str) -> str | None:
    """One line saying why `what` cannot train into `folder` — its runs' dry-run estimate at most (`disk_plan`)
    above the free space there — or None where it fits, nothing is left to train, or a model's size is unknown
    (`dppo.studies.model_params`)."""
    if not any(groups):
        return None
    try:
        kept, most = disk_plan(groups)
    except ValueError:  # a model whose size its name does not give: no estimate (the writes still end in one line)
        return None
    free = free_bytes(folder)
    if most <= free:
        return None
    return (f"{what}: not enough disk in {str(folder)!r}: its runs need up to {_size(most)} at once "
            f"({_size(kept)} kept when done; final/ and checkpoints, dppo.disk.run_disk_bytes), "
            f"{_size(free)} free; free space or set keep_checkpoints lower")


def _size(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"
