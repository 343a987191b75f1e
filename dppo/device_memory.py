"""What the trainer itself holds on the GPU, apart from a colocated vLLM engine (metrics `memory/*`, CUDA only).

vLLM allocates its weights and KV cache through PyTorch's allocator, in a memory pool of its own. Its `sleep()`
unmaps their physical pages but leaves the tensors allocated, so `torch.cuda.max_memory_allocated()` counts the
engine's whole share (e.g. 0.7 x the GPU) in every step, asleep or awake. The trainer's own peak is therefore

    trainer_peak = max_memory_allocated(during the update) - engine_resident

with engine_resident = memory_allocated() after the engine started - memory_allocated() before (`engine_started`):
those tensors stay allocated, in PyTorch's count, for the engine's whole life. The peak counter is reset when the
update phase begins (the engine asleep), so the rollout's own activations are not the trainer's either.
`device_used_gb` is the device's physical use at the end of the step (`mem_get_info`: every process, vLLM's mapped
pages included), the number to compare with the GPU's size.
"""

from __future__ import annotations

GiB = 2**30


class DeviceMemory:
    """`memory/*` metrics of one process's device. `cuda` is `torch.cuda` (a recorded allocator in the tests)."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.engine_resident = 0  # bytes of the colocated engine's tensors (0: no engine on the device)
        self._before_engine = 0

    def engine_starting(self) -> None:
        self._before_engine = self.cuda.memory_allocated()

    def engine_started(self) -> None:
        self.engine_resident = max(0, self.cuda.memory_allocated() - self._before_engine)

    def update_starting(self) -> None:
        """The update phase begins (the engine asleep): count the peak from here."""
        self.cuda.reset_peak_memory_stats()

    def metrics(self) -> dict[str, float]:
        """memory/peak_gb: the trainer's own peak in the update phase; memory/engine_gb: the engine's allocation
        (resident in PyTorch's count, its pages unmapped while asleep); memory/device_used_gb: physical use now."""
        free, total = self.cuda.mem_get_info()
        return {"memory/peak_gb": max(0, self.cuda.max_memory_allocated() - self.engine_resident) / GiB,
                "memory/engine_gb": self.engine_resident / GiB, "memory/device_used_gb": (total - free) / GiB}
