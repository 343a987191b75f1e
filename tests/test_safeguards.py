"""Safeguards of a run (docs/engineering.md §4.3): non-finite steps skipped and never saved, strict-JSON metrics, a
zero-variance warning, corrupt checkpoints passed over, the model's own prompt template, train/eval overlap."""

import json
import math
from pathlib import Path

import pytest
import torch

from dppo.config import TrainConfig
from dppo.runfiles import RunError, RunWarning, json_line
from dppo.trainer import Trainer, load_data, read_metrics, run_metrics

TINY = dict(train_size=12, eval_size=2, eval_samples=1, prompts_per_step=3, group_size=4, max_new_tokens=40,
            eval_every=1000, lr=2e-4)


def _strict(path: Path) -> list[dict]:
    def refuse(token):
        raise ValueError(f"non-JSON constant {token}")
    return [json.loads(ln, parse_constant=refuse) for ln in path.read_text().splitlines()]


def _poison(trainer: Trainer, steps: set[int]) -> None:
    """Make the loss NaN in the updates of the given steps (0-based: the step being taken)."""
    real = trainer.score

    def score(model, *a, **kw):
        logp, slots = real(model, *a, **kw)
        if torch.is_grad_enabled() and trainer.step in steps:
            logp = logp * float("nan")
        return logp, slots
    trainer.score = score


def test_non_finite_step_is_skipped_and_logged_as_strict_json(tmp_path):
    tr = Trainer(TrainConfig(output_dir=str(tmp_path), max_steps=4, save_every=1, **TINY))
    _poison(tr, {1})
    weights = {}
    real_step = tr.train_step

    def step():
        weights[tr.step] = {k: v.detach().clone() for k, v in tr.model.named_parameters()}
        return real_step()
    tr.train_step = step
    tr.fit()
    m = _strict(tmp_path / "metrics.jsonl")
    assert [r.get("skipped_updates") for r in m[1:]] == [0, 1, 0, 0]
    assert [r["skipped_steps"] for r in m[1:]] == [0, 1, 1, 1]
    assert m[2]["loss"] is None and m[2]["grad_norm"] is None  # NaN written as null
    same = all(torch.equal(weights[1][k], weights[2][k]) for k in weights[1])
    assert same  # the poisoned step left the weights as they were
    after = dict(tr.model.named_parameters())
    assert not all(torch.equal(weights[2][k], after[k]) for k in after)  # the next steps train again


def test_consecutive_non_finite_steps_stop_the_run_with_good_checkpoints(tmp_path):
    tr = Trainer(TrainConfig(output_dir=str(tmp_path), max_steps=8, save_every=1, keep_checkpoints=10,
                             max_skipped_steps=2, **TINY))
    _poison(tr, {2, 3, 4, 5, 6, 7})
    with pytest.raises(RunError, match="2 consecutive steps"):
        tr.fit()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3, 4]
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert ckpts == ["step_1", "step_2", "step_3"]  # the run stopped before saving step 4
    from safetensors.torch import load_file
    for c in ckpts:
        assert all(torch.isfinite(t).all() for t in load_file(tmp_path / "checkpoints" / c / "model.safetensors").values())
    assert not (tmp_path / ".lock").exists()


def test_non_finite_weights_are_never_saved(tmp_path):
    tr = Trainer(TrainConfig(output_dir=str(tmp_path), max_steps=1, **TINY))
    with torch.no_grad():
        next(tr.model.parameters())[0] = float("inf")
    with pytest.raises(RunError, match="not finite"):
        tr.save_checkpoint()
    assert not list((tmp_path / "checkpoints").glob("step_*"))


def test_zero_variance_run_warns_and_says_why(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"question": f"Ann has {i} pens. How many pens?", "answer": "-7777"}) + "\n"
                            for i in range(8)))
    cfg = TrainConfig(output_dir=str(tmp_path / "run"), dataset=str(data), max_steps=3, zero_variance_warn_steps=3,
                      eval_datasets={"d": str(data)}, **TINY)
    with pytest.warns(RunWarning) as caught:
        Trainer(cfg).fit()
    said = [str(w.message) for w in caught]
    assert any("steps 1-3" in s and "reward always 0" in s for s in said), said
    assert any("also in the training data" in s and "d 2/2" in s for s in said), said  # train/eval overlap


@pytest.mark.parametrize("broken", ["model.safetensors", "trainer_state.json", "optimizer.bin"])
def test_corrupt_newest_checkpoint_is_passed_over(tmp_path, broken):
    common = dict(save_every=1, keep_checkpoints=3, pruner="dppo", prompt_prune_rate=0.5,
                  completion_prune_rate=0.5, **TINY)
    Trainer(TrainConfig(output_dir=str(tmp_path / "full"), max_steps=4, **common)).fit()
    Trainer(TrainConfig(output_dir=str(tmp_path / "cut"), max_steps=3, **common)).fit()
    f = tmp_path / "cut" / "checkpoints" / "step_3" / broken
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.warns(RunWarning, match="step_3.*resuming from step_2"):
        Trainer(TrainConfig(output_dir=str(tmp_path / "cut"), max_steps=4, **common)).fit()
    full, cut = ([run_metrics(r) for r in read_metrics(tmp_path / x /
                  "metrics.jsonl")] for x in ("full", "cut"))
    assert cut == full


def test_prompt_template_defaults_to_the_models_own(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"problem": "What is 2+3?", "answer": 5}) + "\n")
    train, _ = load_data(TrainConfig(dataset=str(data), output_dir=str(tmp_path / "r")))
    assert train[0].prompt == "What is 2+3?\nAnswer:\n" and train[0].answer == "5"  # the embedded warm-start format
    other = TrainConfig(dataset=str(data), model_name_or_path=str(tmp_path), output_dir=str(tmp_path / "r"))
    assert load_data(other)[0][0].prompt.endswith("put your final answer within \\boxed{}.")
    mine = TrainConfig(dataset=str(data), prompt_template="Q: {question} A:", output_dir=str(tmp_path / "r"))
    assert load_data(mine)[0][0].prompt == "Q: What is 2+3? A:"


def test_json_line_is_strict():
    line = json_line({"a": math.nan, "b": [math.inf, 1.0], "c": {"d": -math.inf}, "e": 2})
    assert json.loads(line) == {"a": None, "b": [None, 1.0], "c": {"d": None}, "e": 2}
