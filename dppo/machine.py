"""The machine a run ran on: what it is, and what else ran on it meanwhile (docs/engineering.md §5.1).

A step's wall-clock and CPU times are only comparable with another run's if nobody else used the CPUs. `LoadMeter`
measures that directly: the CPU seconds the whole machine spent busy (user, system, interrupts, and time the
hypervisor gave to other machines, `steal`) minus those of this process and its children, per second of wall
time — the cores that other work took while the step ran:

    other_cores = (busy_machine - busy_own) / wall

A quiet machine reads a few hundredths of a core (daemons); a competing CPU-bound process reads about one core.
"""

from __future__ import annotations

import os
import platform
import time

import psutil
import torch

BUSY_FIELDS = ("user", "nice", "system", "irq", "softirq", "steal")  # psutil.cpu_times() fields present per platform


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine spent not idle (and not waiting on I/O) since boot."""
    times = psutil.cpu_times()
    return sum(getattr(times, f, 0.0) for f in BUSY_FIELDS)


def own_busy_seconds() -> float:
    """CPU seconds of this process and its live children (a vLLM engine process, for one)."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:  # it ended meanwhile
            pass
    return total


class LoadMeter:
    """Cores used by other work between `start()` and `stop()`: (machine busy - own busy) / wall, >= 0."""

    def start(self) -> None:
        self.t0, self.machine0, self.own0 = time.perf_counter(), machine_busy_seconds(), own_busy_seconds()

    def stop(self) -> float:
        wall = time.perf_counter() - self.t0
        other = (machine_busy_seconds() - self.machine0) - (own_busy_seconds() - self.own0)
        return max(0.0, other) / max(wall, 1e-9)


def free_cores(other_cores: float, cores: int | None = None) -> int:
    """Intra-op threads for the next step under `intra_op_threads: -1` (auto): the cores other work left free during
    the last one, floor(cores - other_cores + 0.25), at least 1. A quiet machine gets a thread per core; each core
    another job takes costs a thread, instead of OpenMP workers spin-waiting for a core they lost (docs/engineering.md §5.1)."""
    cores = cores or os.cpu_count() or 1
    return max(1, min(cores, int(cores - other_cores + 0.25)))


def describe() -> dict:
    """What a run folder records about the machine: CPU model, cores, torch build and threads, accelerator."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "",
            "gpus": torch.cuda.device_count()}
