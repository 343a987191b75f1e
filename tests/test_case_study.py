"""F5's case study (dppo.case_study) on the runs it follows: answers read and graded as the runs' reward reads them,
sampled at their training temperature, from the checkpoints a run keeps (as weights only: results.keep_weights_only)."""

import types

import pytest

from dppo import case_study, results
from dppo.trainer import Trainer


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, embedded):
    """A finished smoke run whose reward reads the last number (the real task's answers have no \\boxed{}), trained at
    temperature 0.7 and evaluated at 1.0, keeping its checkpoints."""
    out = tmp_path_factory.mktemp("case") / "run"
    results.run("experiments/cpu/grpo.yaml", out, smoke=True, keep_checkpoints_after_final=True, save_every=1,
                keep_checkpoints=2, temperature=0.7, eval_temperature=1.0, answer_format="last_number")
    return out


class Answers:
    """A rollout engine that answers every prompt 'so it is 7' (no \\boxed{}) and records its sampling."""

    def __init__(self):
        self.temperatures: list[float] = []

    def generate(self, prompts, sampling):
        self.temperatures.append(sampling.temperature)
        return types.SimpleNamespace(texts=["so it is 7"] * (len(prompts) * sampling.n))

    def sync_weights(self, model):
        pass


def test_answers_are_read_as_the_runs_reward_reads_them_at_their_temperature(run_dir, monkeypatch):
    """Before: every answer '(none)' (read as \\boxed{} only) and sampled at temperature 1."""
    from dppo import rollout

    engine = Answers()
    monkeypatch.setattr(rollout, "engine_from_config", lambda *args: engine)
    answers = case_study.case_study_answers({"GRPO": run_dir, "again": run_dir}, samples=4)
    assert set(answers["answer"]) == {"7"}
    assert (answers["correct"] == (answers["gold"].astype(str) == "7")).all()
    assert set(engine.temperatures) == {0.7}
    steps = sorted(set(answers["step"]))  # the initial model, each kept checkpoint (the last is the final's step)
    kept = sorted(int(p.name[5:]) for p in run_dir.glob("checkpoints/step_*"))
    assert steps == [0, *kept] and len(kept) == 2
    with pytest.raises(ValueError, match="split 'heldout' is not one of the runs' eval splits"):
        case_study.case_study_answers({"GRPO": run_dir}, split="heldout", samples=4)


def test_a_finished_runs_checkpoints_keep_their_weights_only_and_it_is_not_retrained(run_dir, monkeypatch):
    """What F5 reads stays (the weights, readable by the case study), the optimizer's and RNG state go, and the run
    still serves its config (not trained again); an unfinished run's checkpoints are not touched."""
    from dppo import rollout

    before = {p.name for p in next(run_dir.glob("checkpoints/step_*")).iterdir()}
    assert {"model.safetensors", "trainer_state.json"} < before  # optimizer and RNG state beside them
    results.keep_weights_only(run_dir)
    for ckpt in run_dir.glob("checkpoints/step_*"):
        assert {p.name for p in ckpt.iterdir()} == {"model.safetensors", "trainer_state.json"}
    fits = []
    monkeypatch.setattr(Trainer, "fit", lambda self: fits.append(1))
    results.run("experiments/cpu/grpo.yaml", run_dir, smoke=True, keep_checkpoints_after_final=True, save_every=1,
                keep_checkpoints=2, temperature=0.7, eval_temperature=1.0, answer_format="last_number")
    assert not fits
    monkeypatch.setattr(rollout, "engine_from_config", lambda *args: Answers())
    assert len(case_study.case_study_answers({"GRPO": run_dir}, samples=2)) == 3  # steps 0 and the 2 kept
    unfinished = run_dir.parent / "unfinished"
    (unfinished / "checkpoints" / "step_1").mkdir(parents=True)
    with pytest.raises(ValueError, match="not finished"):
        results.keep_weights_only(unfinished)
