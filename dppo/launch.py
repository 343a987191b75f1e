"""One training run as its own `accelerate launch` process over the local GPUs (docs/engineering.md §4.1).

The paper profile's notebooks train this way (papermill parameter `launch`): the notebook writes the run's
config, starts `accelerate launch --config_file <accelerate yaml> --num_processes N -m dppo.cli train --config
<run>/launch.yaml`, waits, and reads the run folder back. `launch` is a mapping:

    accelerate_config: experiments/accelerate/fsdp.yaml   # DDP or FSDP (experiments/accelerate/)
    num_processes: 0                                      # 0 = every local GPU (torch.cuda.device_count())
    launcher: accelerate                                  # or torchrun: `torch.distributed.run --standalone`, the
                                                          # ranks' Accelerator plain data-parallel (CPU: gloo)

On CPU `accelerate launch` starts one process whatever --num_processes says, so CPU runs of several processes (the
toy profile, the tests) use `launcher: torchrun`, which is what `accelerate launch` itself runs on GPUs.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from dppo.config import ConfigError, TrainConfig

LAUNCH_FIELDS = ("accelerate_config", "num_processes", "launcher")
LAUNCHERS = ("accelerate", "torchrun")


def check_launch(launch: dict) -> dict:
    """`launch` with its defaults, or a one-line ConfigError naming the bad key."""
    if not isinstance(launch, dict):
        raise ConfigError(f"parameter 'launch' must be a mapping with keys {list(LAUNCH_FIELDS)}, got {launch!r}")
    unknown = sorted(set(launch) - set(LAUNCH_FIELDS))
    if unknown:
        raise ConfigError(f"parameter 'launch' has unknown key(s) {unknown}; allowed: {list(LAUNCH_FIELDS)}")
    out = {"accelerate_config": "experiments/accelerate/ddp.yaml", "num_processes": 0, "launcher": "accelerate", **launch}
    if out["launcher"] not in LAUNCHERS:
        raise ConfigError(f"parameter 'launch.launcher' must be one of {list(LAUNCHERS)}, got {out['launcher']!r}")
    if not Path(out["accelerate_config"]).is_file():
        raise ConfigError(f"parameter 'launch.accelerate_config': file {out['accelerate_config']!r} not found")
    if not isinstance(out["num_processes"], int) or out["num_processes"] < 0:
        raise ConfigError(f"parameter 'launch.num_processes' must be an integer >= 0, got {out['num_processes']!r}")
    return out


def gpu_environment_problems() -> list[str]:
    """What the paper profile needs and this environment lacks: CUDA GPUs for torch, vLLM, flash-attn."""
    import importlib.util

    import torch

    problems = []
    if not torch.cuda.is_available():
        problems.append(f"CUDA (torch {torch.__version__} sees no GPU)")
    for module, name in (("vllm", "vLLM"), ("flash_attn", "flash-attn")):
        if importlib.util.find_spec(module) is None:
            problems.append(f"{name} (not importable)")
    return problems


def main(argv: list[str] | None = None) -> int:
    """`python -m dppo.launch --check-gpu`: one line and exit status 2 when the paper profile cannot run here."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m dppo.launch", description="checks for launched training runs")
    ap.add_argument("--check-gpu", action="store_true", help="does this environment have what the paper profile needs")
    args = ap.parse_args(argv)
    if args.check_gpu:
        problems = gpu_environment_problems()
        if problems:
            print(f"the paper profile needs {', '.join(problems)}: on an NVIDIA machine, `bash scripts/bootstrap.sh "
                  f"gpu` installs them into .venv-gpu", file=sys.stderr)
            return 2
        print(f"GPU environment ready: {local_gpus()} GPU(s)")
    return 0


def local_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def train_command(run_config: str | Path, launch: dict, num_gpus: int | None = None) -> list[str]:
    """argv of `accelerate launch ... -m dppo.cli train --config run_config` (or torchrun's; num_processes 0 ->
    `num_gpus`, by default every local GPU)."""
    launch = check_launch(launch)
    n = launch["num_processes"] or (local_gpus() if num_gpus is None else num_gpus) or 1
    if launch["launcher"] == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n),
                "-m", "dppo.cli", "train", "--config", str(run_config)]
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(launch["accelerate_config"]),
            "--num_processes", str(n), "-m", "dppo.cli", "train", "--config", str(run_config)]


def hub_sources(cfg: TrainConfig) -> tuple[list[str], list[str]]:
    """(hub model ids, hub data sources) a run reads: `hf:` values of model_name_or_path, dataset, eval_datasets."""
    models = [cfg.model_name_or_path[3:]] if cfg.model_name_or_path.startswith("hf:") else []
    data = [src for src in (cfg.dataset, *(cfg.eval_datasets or {}).values()) if str(src).startswith("hf:")]
    return models, data


def prefetch(cfg: TrainConfig) -> None:
    """Download the run's hub model and datasets into the local caches, once, in this (the parent) process, so that
    the launched ranks read them from disk instead of one rank downloading while the others wait at a collective."""
    from huggingface_hub import snapshot_download

    from dppo.data import _records

    models, data = hub_sources(cfg)
    for repo in models:
        print(f"[launch] fetching model {repo}", flush=True)
        snapshot_download(repo)
    for src in data:
        print(f"[launch] fetching data {src}", flush=True)
        _records(src)


def launch_run(cfg: TrainConfig, launch: dict) -> None:
    """Fetch the run's hub model and data (`prefetch`), write `cfg` to <output_dir>/launch.yaml and train it in its
    own launched process group; waits."""
    prefetch(cfg)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg.save(out / "launch.yaml")
    cmd = train_command(out / "launch.yaml", launch)
    print("[launch]", shlex.join(cmd), flush=True)
    subprocess.run(cmd, check=True)


if __name__ == "__main__":
    sys.exit(main())
