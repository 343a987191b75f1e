"""memory/* (dppo.device_memory) against a recorded allocator that behaves as vLLM's sleep mode does on CUDA: the
engine's weights and KV cache are allocated through PyTorch's allocator (its own pool), and `sleep()` unmaps their
pages while the tensors stay allocated in PyTorch's count."""

from dppo.device_memory import GiB, DeviceMemory


class RecordedCuda:
    """memory_allocated / max_memory_allocated / reset_peak_memory_stats / mem_get_info of one device, with vLLM's
    pool: `engine_alloc` counts as allocated (and mapped until `engine_sleep`)."""

    def __init__(self, total: float):
        self.total, self.allocated, self.peak, self.unmapped = total, 0.0, 0.0, 0.0

    def alloc(self, n: float) -> None:
        self.allocated += n
        self.peak = max(self.peak, self.allocated)

    def free(self, n: float) -> None:
        self.allocated -= n

    def engine_sleep(self, engine_bytes: float) -> None:  # pages unmapped; PyTorch still counts the tensors
        self.unmapped = engine_bytes

    def engine_wake(self) -> None:
        self.unmapped = 0.0

    def memory_allocated(self) -> float:
        return self.allocated

    def max_memory_allocated(self) -> float:
        return self.peak

    def reset_peak_memory_stats(self) -> None:
        self.peak = self.allocated

    def mem_get_info(self) -> tuple[float, float]:
        return self.total - (self.allocated - self.unmapped), self.total


def test_peak_is_the_trainers_own_with_a_sleeping_engine_counted_by_pytorch():
    cuda = RecordedCuda(total=80 * GiB)
    mem = DeviceMemory(cuda)
    cuda.alloc(8 * GiB)  # the trainer's shards: fp32 weights + AdamW state
    mem.engine_starting()
    engine = 56 * GiB
    cuda.alloc(engine)  # vLLM: bf16 weights + KV cache, in its pool
    mem.engine_started()
    for step in range(2):
        cuda.engine_wake()
        cuda.alloc(3 * GiB)  # the rollout's activations (the engine's, transient)
        cuda.free(3 * GiB)
        cuda.engine_sleep(engine)
        mem.update_starting()
        update = (5 + step) * GiB  # activations + gradients of the update
        cuda.alloc(update)
        cuda.free(update)
        m = mem.metrics()
        assert m["memory/peak_gb"] == 8 + 5 + step  # the trainer's shards + its update, nothing of the engine's
        assert m["memory/engine_gb"] == 56
        assert m["memory/device_used_gb"] == 8  # asleep: the engine's pages are back to the device
        # what max_memory_allocated alone reads: the engine's whole share every step, asleep or not
        assert cuda.max_memory_allocated() / GiB == 8 + 56 + 5 + step


def test_without_an_engine_the_peak_is_max_memory_allocated():
    cuda = RecordedCuda(total=80 * GiB)
    mem = DeviceMemory(cuda)  # the HF rollout: no engine_started call
    cuda.alloc(4 * GiB)
    mem.update_starting()
    cuda.alloc(2 * GiB)
    assert mem.metrics()["memory/peak_gb"] == 6 and mem.metrics()["memory/engine_gb"] == 0
