"""bench/trl_dppo.py, the comparison a TRL user reads (docs/trl.md, "Measured"): GRPOTrainer and DPPOTrainer in turn,
evaluated under the protocol (docs/method.md §6.4) on shared streams, logged, and summarised by the stated verdict
rules (dppo.verdicts) — the summary from synthetic logs whose answer is known, the pair end to end at toy size."""

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[1]


def bench():
    spec = importlib.util.spec_from_file_location("trl_dppo_bench", ROOT / "bench" / "trl_dppo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(steps: int, wall: float, load: float, start: float, final: float, subset: list[float], flops: float) -> dict:
    """One run's log entry: `steps` steps of `wall / steps` s each with `load` other cores, evaluations every step
    on the subset (`subset`, one per step; the last is at the final step, which the final evaluation replaces)."""
    per = wall / steps
    return {"steps": steps, "wall": wall, "step_wall": [per] * steps, "other_cores": [load] * steps,
            "flops": flops, "t_generate": 1.0, "t_score": 0.0, "t_update": wall - 1.0,
            "start": {"step": 0, "avg": start, "subset_avg": start},
            "evaluations": [{"step": i + 1, "avg": None, "subset_avg": x} for i, x in enumerate(subset)],
            "final": {"step": steps, "avg": final, "subset_avg": subset[-1] + 0.5}}


def write(folder: Path, seed: int, trl: dict, dppo: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"seed{seed}.json").write_text(json.dumps({"seed": seed, "commit": "abc", "runs": {
        "TRL GRPO": trl, "DPPO in TRL": dppo}}))


def test_the_summary_reads_the_protocol_and_states_verdicts_by_the_rules(tmp_path):
    """Three seeds: wall speed-ups 2.0, 1.8 and (contended, left out of the wall interval) 5.0; FLOPs 1.5 each;
    TRL learned +20 points in every seed; DPPO's last 3 subset evaluations (the final's subset share for the last one,
    not the periodic evaluation at the final step) above TRL's by 10, 11 and 12 points: accuracy 'higher'."""
    b = bench()
    for seed, (speed, load, gain) in enumerate([(2.0, 0.0, 0.10), (1.8, 0.0, 0.11), (5.0, 0.9, 0.12)]):
        trl = run(6, 100.0, load, 0.2, 0.4, [0.3, 0.3, 0.3, 0.3, 0.3, 0.9], 3.0)
        dppo = run(4, 100.0 / speed, 0.0, 0.2, 0.5, [0.3, 0.3 + gain, 0.3 + gain, 0.9], 2.0)
        write(tmp_path, seed, trl, dppo)
    df = b.summarize(tmp_path)
    assert list(df["contended"]) == [False, False, True]
    assert df["flops_speedup"].tolist() == pytest.approx([1.5] * 3)
    assert df["trl_learning"].tolist() == pytest.approx([20.0] * 3)
    # TRL: steps 4, 5 and the final's 0.9 + 0.5 (not step 6's 0.9); DPPO: steps 2, 3 and 1.4
    assert df["trl_last_k"].tolist() == pytest.approx([100 * (0.3 + 0.3 + 1.4) / 3] * 3)
    assert df["gain"].tolist() == pytest.approx([100 * 2 * g / 3 for g in (0.10, 0.11, 0.12)])
    v = b.verdicts(df)
    assert v["wall"].n == 2 and v["wall"].mean == pytest.approx(1.9)  # the contended pair is not in it
    assert (v["accuracy"], v["learned"], v["speed_flops"]) == ("higher", "learned", "faster")
    text = b.report(tmp_path, tmp_path / "figures" / "TRL")
    assert "**higher**" in text and "(2 quiet pairs;" in text and "commit abc" in text
    assert (tmp_path / "figures" / "TRL.csv").is_file() and (tmp_path / "figures" / "TRL.md").read_text() == text + "\n"
    # a GRPOTrainer that did not learn: no accuracy verdict, whatever the gain
    for seed in range(3):
        log = json.loads((tmp_path / f"seed{seed}.json").read_text())
        log["runs"]["TRL GRPO"]["final"]["avg"] = 0.2 + (0.01 if seed else -0.01)
        (tmp_path / f"seed{seed}.json").write_text(json.dumps(log))
    assert b.verdicts(b.summarize(tmp_path))["accuracy"].startswith("not compared")


def test_a_pair_at_toy_size_evaluates_both_runs_on_shared_streams_and_logs_them(tmp_path, monkeypatch):
    """The embedded model, 2 steps a run, evaluations every step: both runs start from one evaluation, each is
    evaluated at steps 1 and 2 while it holds its turn (outside its steps' time) and at the end; the final
    evaluations share one stream key (so two equal models would score alike), the log records every step's time
    and load, FLOPs by phase, and the summary reads it."""
    import torch

    from dppo import evaluation
    from dppo.task import make_eval, make_train

    b = bench()
    monkeypatch.setitem(b.SETUPS, "embedded", dict(
        prompts=4, trl=dict(learning_rate=1e-4, warmup_steps=0, max_completion_length=12, temperature=1.0),
        eval=(1, 1.0, 12), answer_format="boxed", eval_every=1, eval_subset=2))
    keys = []
    real = evaluation.evaluate

    def keyed(*args, **kwargs):
        keys.append(kwargs.get("step"))
        return real(*args, **kwargs)
    monkeypatch.setattr(b, "evaluate", keyed)
    train = make_train(8, 0)
    evals = dict(list(make_eval(3, 0, train).items())[:2])  # two splits of 3 problems
    torch.manual_seed(0)
    r = b.run_pair(0, 1.0, train, [p.prompt for p in train], evals, 2, str(tmp_path / "runs"), "embedded")
    trl, dppo = r["TRL GRPO"], r["DPPO in TRL"]
    assert trl["steps"] == 2 and trl["start"] is dppo["start"] and trl["start"]["step"] == 0
    assert [e["step"] for e in trl["evaluations"]] == [1, 2] and [e["step"] for e in dppo["evaluations"]] == \
        list(range(1, dppo["steps"] + 1))
    assert keys[0] == 0 and keys.count(b.FINAL_KEY) == 2  # one start, both finals on one key
    assert all(e["subset_avg"] is not None for e in trl["evaluations"])
    assert len(trl["step_wall"]) == len(trl["other_cores"]) == 2 and trl["wall"] == pytest.approx(sum(trl["step_wall"]))
    assert trl["flops_by_phase"]["generate"] > 0 and trl["flops_by_phase"]["update"] > 0
    assert dppo["flops"] < trl["flops"]  # pruning: fewer rows scored and trained
    b.write_log(tmp_path / "logs", 0, r, {"model": "embedded"})
    df = b.summarize(tmp_path / "logs")
    assert df.loc[0, "flops_speedup"] == pytest.approx(trl["flops"] / dppo["flops"])


def test_the_committed_comparison_and_the_readme_recompute_from_the_committed_logs(tmp_path):
    """figures/real/TRL_smollm2.md is what `report` makes from the committed logs (experiments/results/real/
    trl_smollm2/, >= 3 seeds, one pair each), and the README's and docs/trl.md's numbers for DPPO inside TRL are
    that table's: a log edited, added or left out shows here."""
    b = bench()
    logs = sorted(b.REAL_LOGS.glob("seed*.json"))
    assert len(logs) >= 3, logs
    text = b.report(b.REAL_LOGS, tmp_path / "TRL")
    assert b.REAL_TABLE.with_suffix(".md").read_text() == text + "\n"
    v = b.verdicts(b.summarize(b.REAL_LOGS))
    said = (f"{v['wall'].mean:.2f}x ± {v['wall'].half:.2f} wall", f"{v['flops'].mean:.2f}x ± {v['flops'].half:.2f} FLOPs",
            f"{v['gain'].mean:+.1f} ± {v['gain'].half:.1f} points")
    for doc in ("README.md", "docs/trl.md"):
        page = (ROOT / doc).read_text()
        assert all(s in page for s in said), (doc, said)
