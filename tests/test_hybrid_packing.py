"""Packing is exact on every model a user trains (docs/method.md §3.2): a model with a layer that carries state along
the sequence — Qwen3.5's and Qwen3-Next's gated delta-nets, LFM2's short convolutions, Mamba-2 / Jamba / Bamba /
Falcon-H1 / Granite / Nemotron-H mixers, RecurrentGemma's recurrence — gets one sequence a row in dppo's trainer, its
scorer and DPPOTrainer (`dppo.packing.packed_rows`), whatever its attention kernel; a model of attention layers only
(sliding windows included) keeps several a row. On tiny random-weight models of every such family the installed
transformers ships: packed log-probs equal each sequence scored alone, and DPPOTrainer's expected gradient equals
GRPOTrainer's — both wrong under the rule before (the attention kernel alone: several sequences a row)."""

import copy
import random
import warnings

import pytest
import torch

from dppo import packing
from dppo.packing import ONE_SEQUENCE, ROWS, packed_completion_logprobs, packed_rows, stateful_layer

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, max_position_embeddings=256)
_LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)
# every family of transformers 5.25 whose layers carry state along the sequence, as a tiny config (model type: fields)
HYBRIDS = {
    "qwen3_5_text": dict(layer_types=["linear_attention", "full_attention"] * 2, **_LINEAR),
    "lfm2": dict(layer_types=["conv", "full_attention"] * 2, block_dim=64, block_ff_dim=128, conv_L_cache=3),
    "qwen3_next": dict(layer_types=["linear_attention", "full_attention"] * 2, **_LINEAR, num_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32),
    "mamba2": dict(num_heads=4, head_dim=32, state_size=16, expand=2, n_groups=1),
    "jamba": dict(num_experts=2, num_experts_per_tok=1, attn_layer_period=2, attn_layer_offset=1,
                  expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8, mamba_dt_rank=8),
    "falcon_h1": dict(mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1),
    "bamba": dict(attn_layer_indices=[1, 3], mamba_n_heads=4, mamba_d_head=32, mamba_d_state=8, mamba_n_groups=1),
    "granitemoehybrid": dict(layer_types=["mamba", "attention"] * 2, mamba_n_heads=4, mamba_d_head=32,
                             mamba_d_state=8, mamba_n_groups=1, num_local_experts=2, num_experts_per_tok=1),
    "nemotron_h": dict(hybrid_override_pattern="M*M*", mamba_num_heads=4, mamba_head_dim=32, ssm_state_size=8,
                       n_groups=1),
}
# RecurrentGemma's recurrence carries state too, but it soft-caps its logits: the scorer refuses it (the last test)
RECURRENT_GEMMA = dict(lru_width=64, attention_window_size=16, block_types=["recurrent", "attention"])
ATTENTION_ONLY = {"qwen3": {}, "olmo3": {}}  # Olmo3: sliding-window layers between full ones
VOCAB = 256


def tiny(model_type: str, vocab: int = VOCAB, dtype=torch.float32, **extra):
    """A random-weight causal LM of `model_type` (seeded), eval mode, in `dtype`; skipped with its reason where the
    installed transformers cannot build it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    own = {**HYBRIDS, **ATTENTION_ONLY, "recurrent_gemma": RECURRENT_GEMMA}.get(model_type, {})
    fields = {**SMALL, **own, "vocab_size": vocab, **extra}
    torch.manual_seed(0)
    try:
        config = AutoConfig.for_model(model_type, **fields)
        config.pad_token_id, config.eos_token_id, config.bos_token_id = 0, 1, 2
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError, ImportError, TypeError) as e:
        pytest.skip(f"{model_type}: not built by this transformers ({type(e).__name__}: {str(e)[:80]})")
    return model.to(dtype).eval()


def sequences(n: int = 6, seed: int = 1):
    rng = random.Random(seed)
    prompts = [[rng.randint(5, VOCAB - 1) for _ in range(rng.randint(3, 9))] for _ in range(n)]
    completions = [[rng.randint(5, VOCAB - 1) for _ in range(rng.randint(2, 12))] for _ in range(n)]
    return prompts, completions


def alone(model, prompts, completions) -> torch.Tensor:
    """Each completion's token log-probs with its sequence scored by itself (a batch of one, no padding): the truth
    any layout must give. [N, longest completion], 0 past each completion."""
    out = torch.zeros(len(prompts), max(map(len, completions)), dtype=torch.float64)
    with torch.no_grad():
        for i, (p, c) in enumerate(zip(prompts, completions)):
            logits = model(torch.tensor([p + c])).logits[0, len(p) - 1:-1].double()
            out[i, :len(c)] = logits.log_softmax(-1).gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
    return out


def packed_error(model, prompts, completions, capacity: int = 64) -> float:
    want = alone(model, prompts, completions)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, _ = packed_completion_logprobs(model, prompts, completions, 0, 1.0, capacity)
    valid = torch.zeros_like(want, dtype=torch.bool)
    for i, c in enumerate(completions):
        valid[i, :len(c)] = True
    return float((got.double() - want)[valid].abs().max())


@pytest.mark.parametrize("family", list(HYBRIDS))
def test_a_model_that_carries_state_packs_one_sequence_a_row_and_scores_each_alone(family, monkeypatch):
    model = tiny(family)
    with pytest.warns(UserWarning, match="packing one sequence a row: .* carries state along the sequence"):
        kind, why = packed_rows(model)
    assert kind == ONE_SEQUENCE and stateful_layer(model) in why
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per model
        assert packed_rows(model)[0] == ONE_SEQUENCE
    prompts, completions = sequences()
    error = packed_error(model, prompts, completions)
    print(f"{family}: packed vs alone {error:.1e}")
    assert error <= 1e-5
    # the rule before: the attention kernel alone (sdpa: several sequences a row) — one sequence's state leaks
    monkeypatch.setattr(packing, "stateful_layer", lambda model: None)
    assert packed_rows(model)[0] == ROWS
    leaked = packed_error(model, prompts, completions)
    print(f"{family}: packed by the kernel alone vs alone {leaked:.1e}")
    assert leaked > 1e-4


@pytest.mark.parametrize("family", list(ATTENTION_ONLY))
def test_a_model_of_attention_layers_keeps_several_sequences_a_row(family):
    model = tiny(family)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say
        assert stateful_layer(model) is None and packed_rows(model) == (ROWS, "attn_implementation sdpa")
    assert packed_error(model, *sequences()) <= 1e-5


def test_the_layer_is_found_from_the_modules_where_the_config_names_no_layer_types():
    """A model whose config lists no layer types (an older or custom family) is read from its modules: a Conv1d over
    the sequence, or an RNN."""
    model = tiny("qwen3")
    model.config.layer_types = None
    model.model.layers[1].mlp.mix = torch.nn.Conv1d(4, 4, 3, groups=4)
    packing._STATEFUL.pop(model, None)
    assert stateful_layer(model) == "model.layers.1.mlp.mix (Conv1d in Qwen3MLP)"
    other = tiny("qwen3")
    other.config.layer_types = None
    other.model.layers[0].rnn = torch.nn.GRU(4, 4)
    assert stateful_layer(other) == "model.layers.0.rnn (GRU in Qwen3DecoderLayer)"


def test_logits_changed_after_the_head_under_any_name_are_refused_not_mis_scored():
    """RecurrentGemma soft-caps its logits as `logits_soft_cap` (Gemma 2 / 3: `final_logit_softcapping`): a scorer
    that reads lm_head(hidden) would score other log-probs than the model's (3.9e-4 on a tiny one); it is refused in
    one line."""
    model = tiny("recurrent_gemma")
    with pytest.warns(UserWarning, match="packing one sequence a row: model.layers.0 .linear_attention: "):
        assert packed_rows(model)[0] == ONE_SEQUENCE  # its recurrence
    with pytest.raises(ValueError, match="config sets logits_soft_cap"):
        packed_completion_logprobs(model, *sequences(), 0, 1.0, 64)


@pytest.mark.parametrize("family", ["qwen3_5_text", "lfm2"])
def test_dppo_trainers_expected_gradient_on_a_hybrid_model_is_grpo_trainers(family, embedded, tmp_path, monkeypatch):
    """DPPOTrainer (pack_sequences on, its default) on a tiny Qwen3.5 / LFM2 of the embedded tokenizer's vocabulary:
    the expected gradient over every completion mask equals GRPOTrainer's full-batch gradient (float64 weights; the
    models' float32 norms bound the agreement), as tests/test_trl.py shows on Qwen3. Under the rule before (packed by
    the attention kernel alone) it does not (the issue measured 4.9% and 0.12% on one step)."""
    pytest.importorskip("trl")
    from tests.test_trl import enumerate_trl_step, relative_error

    _, tok = embedded
    model = tiny(family, vocab=len(tok), dtype=torch.float64)
    model.config.pad_token_id, model.config.eos_token_id = tok.pad_token_id, tok.eos_token_id
    draws, target, _ = enumerate_trl_step(model, tok, tmp_path / "new", "grpo", 0.0, "bernoulli", 0.0)
    error = relative_error(draws, target)
    monkeypatch.setattr(packing, "stateful_layer", lambda model: None)  # the rule before
    old_draws, old_target, _ = enumerate_trl_step(model, tok, tmp_path / "old", "grpo", 0.0, "bernoulli", 0.0)
    old = relative_error(old_draws, old_target)
    print(f"{family}: E[g] vs GRPOTrainer {error:.1e} (the rule before: {old:.1e})")
    assert error <= 1e-6 < 1e-4 < old
