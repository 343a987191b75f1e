"""F5's case study (dppo.case_study) on the runs it follows: answers read and graded as the runs' reward reads them,
sampled at their training temperature, from the checkpoints a run keeps (as weights only: results.keep_weights_only)."""

import types

import pytest

from dppo import budget, case_study, results
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


def test_the_problem_followed_is_the_one_the_initial_model_is_most_split_on():
    """The rule F5 fixes before any run trains: the largest share outside the most sampled answer, ties to more
    distinct answers, then to the first problem."""
    answers = [["7"] * 16, ["7"] * 10 + ["8"] * 6, ["7"] * 8 + ["8"] * 8, ["1"] * 8 + ["2"] * 4 + ["3"] * 4, []]
    assert case_study.most_split(answers) == 3  # 1/2 outside the top answer, with three answers against two
    assert case_study.most_split(answers[:3]) == 2
    assert case_study.most_split([["4", "5"], ["5", "4"]]) == 0  # a full tie: the first
    assert case_study.most_split([[], ["3"] * 4]) == 1  # neither split: one answer is more distinct ones than none


def test_the_problem_is_picked_from_the_initial_model_before_any_method_s_result(run_dir, monkeypatch):
    """Whatever the runs' models answer later, the pick reads the initial model's answers only, among the problems
    whose right answer it samples at least once: problem 1 (right half the time) over problem 2 (four wrong answers,
    more split); with no right answer sampled anywhere, the most split of all (problem 2)."""
    from dppo import rollout
    from dppo.config import TrainConfig
    from dppo.trainer import load_data

    evals = load_data(TrainConfig.load(run_dir / "config.yaml"))[1]
    split = "ood" if "ood" in evals else next(iter(evals))
    golds = [p.answer for p in evals[split][:4]]
    assert not {str(987654321 + k) for k in range(5)} & set(golds)

    class Initial(Answers):
        def __init__(self, gold_on_1: bool):
            super().__init__()
            self.synced, self.gold_on_1 = False, gold_on_1

        def sync_weights(self, model):
            self.synced = True

        def generate(self, prompts, sampling):
            if self.synced or len(prompts) == 1:  # a checkpoint's answers on the problem followed
                return super().generate(prompts, sampling)
            wrong = 987654321  # no gold of the task's
            one = [f"so it is {golds[1] if self.gold_on_1 and k % 2 else wrong}" for k in range(sampling.n)]
            two = [f"so it is {wrong + 1 + k % 4}" for k in range(sampling.n)]
            rest = [f"so it is {wrong}"] * sampling.n
            return types.SimpleNamespace(texts=rest + one + two + rest)
    for gold_on_1, picked in ((True, 1), (False, 2)):
        monkeypatch.setattr(rollout, "engine_from_config", lambda *args, g=gold_on_1: Initial(g))
        answers = case_study.case_study_answers({"GRPO": run_dir}, samples=2, seed=5, candidates=4)
        assert set(answers["question"]) == {evals[split][picked].prompt} and set(answers["seed"]) == {5}, gold_on_1


def test_a_seed_s_saved_answers_stand_for_its_runs_while_their_logs_are_this_code_s(run_dir, tmp_path, monkeypatch):
    """F5's seeds can train in different sittings: a seed's saved answers are read back (as written: "016" stays a
    string) for its runs' committed logs alone, weights gone as in a fresh clone; they are not once a run is
    unfinished, trained by other code or another config, or under --retrain."""
    import shutil

    import pandas as pd

    sub = "case_study/grpo"
    over = dict(keep_checkpoints_after_final=True, save_every=1, keep_checkpoints=2, temperature=0.7,
                eval_temperature=1.0, answer_format="last_number")
    layout = {"GRPO": ("experiments/cpu/grpo.yaml", over, sub)}
    logs = tmp_path / sub / "seed0"  # the run's logs as committed (LOG_FILES), no checkpoint, no final/
    logs.mkdir(parents=True)
    for name in results.LOG_FILES:
        if (run_dir / name).is_file():
            shutil.copy(run_dir / name, logs / name)
    answers = pd.DataFrame({"seed": [0, 0], "method": ["GRPO", "GRPO"], "step": [0, 0], "answer": ["016", "(none)"],
                            "count": [3, 1], "samples": [4, 4], "correct": [True, False], "question": ["8 + 8"] * 2,
                            "gold": ["016", "016"]})
    assert case_study.saved_answers(layout, 0, tmp_path, smoke=True) is None  # nothing saved yet
    assert case_study.save_answers(answers, tmp_path, 0) == case_study.answers_path(tmp_path, 0)
    pd.testing.assert_frame_equal(case_study.saved_answers(layout, 0, tmp_path, smoke=True), answers)
    grpo = "experiments/cpu/grpo.yaml"
    planned = {logs: (grpo, results._config(grpo, logs, True, **over, seed=0))}
    assert budget.answered_runs(planned, tmp_path) == {logs}  # the dry run counts the seed's runs as reused
    assert case_study.saved_answers(layout, 1, tmp_path, smoke=True) is None  # seed 1's runs are not there
    assert case_study.saved_answers({"GRPO": ("experiments/cpu/grpo.yaml", {**over, "temperature": 0.9}, sub)}, 0,
                                    tmp_path, smoke=True) is None  # another config
    monkeypatch.setenv(results.RETRAIN_ENV, "1")
    assert case_study.saved_answers(layout, 0, tmp_path, smoke=True) is None
    monkeypatch.delenv(results.RETRAIN_ENV)
    code = (logs / results.CODE_FILE).read_text()
    (logs / results.CODE_FILE).write_text("0" * 64 + "\n")  # trained by other code
    assert case_study.saved_answers(layout, 0, tmp_path, smoke=True) is None
    assert budget.answered_runs(planned, tmp_path) == set()
    (logs / results.CODE_FILE).write_text(code)
    metrics = (logs / "metrics.jsonl").read_text().splitlines(keepends=True)
    (logs / "metrics.jsonl").write_text("".join(metrics[:-1]))  # stopped before its final evaluation
    assert case_study.saved_answers(layout, 0, tmp_path, smoke=True) is None
    (logs / "metrics.jsonl").write_text("".join(metrics))
    assert case_study.saved_answers(layout, 0, tmp_path, smoke=True) is not None


def test_the_dry_run_counts_a_case_study_run_at_its_weights_only(run_dir):
    """The disk a trimmed run keeps (`results.keep_weights_only`) is what the dry run counts for the case study's runs
    (`dppo.disk.run_disk_bytes(trimmed=True)`, within the few kB of JSON and YAML beside the weights); untrimmed, the
    estimate counted their optimizer state too (F5's 15 runs: 105 GB where they keep 40)."""
    from dppo import disk
    from dppo.config import TrainConfig

    results.keep_weights_only(run_dir)
    on_disk = sum(f.stat().st_size for f in run_dir.rglob("*") if f.is_file() and f.name != "metrics.jsonl")
    cfg = TrainConfig.load(run_dir / "config.yaml")
    kept, peak = disk.run_disk_bytes(cfg, trimmed=True)
    assert kept <= on_disk < kept + 256 * 1024, (kept, on_disk)
    assert disk.run_disk_bytes(cfg)[0] > 2 * on_disk and disk.run_disk_bytes(cfg)[1] == peak  # while training: all
    plan = {out: run for out, run in budget.study_runs("case_study", "real").items()}
    assert len(plan) == 15 and budget.plan(["case_study"], "real", 1)[1][0]["peak_tb"] < 0.06  # one at a time
