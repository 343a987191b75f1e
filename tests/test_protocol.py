"""The protocol's readings (dppo.protocol, docs/method.md §6.4) on synthetic run folders whose numbers are known:
each reading's paired s.d., the seeds a ±5 half-width needs, the projection of more evaluation samples, what a pair
costs, and the choice. Nothing trains here."""

import json
import math

import pandas as pd
import pytest

from dppo import protocol, verdicts


def _run(path, finals: float, curve: list[float], step_s: float, eval_s: float, start: float | None,
         sampling_var: float = 0.0, samples: int = 2, problems: int = 256):
    """A lever run: step-0 evaluation at `start` (None: skipped), len(curve) steps of `step_s` s over 2 epochs, a
    subset evaluation at every even step with accuracy curve[step-1] (%), the final evaluation (every problem) at
    `finals` with `sampling_var` (points²), each evaluation `eval_s` s."""
    path.mkdir(parents=True)
    steps = len(curve)
    rows = [] if start is None else [{"step": 0, "eval/avg": start / 100, "eval_subset/avg": start / 100,
                                      "eval_n": problems * samples, "timing_s/eval": eval_s}]
    for s in range(1, steps + 1):
        row = {"step": s, "epoch": 2 * s / steps, "timing_s/step": step_s, "cpu_s/step": step_s, "flops/step": step_s,
               "tokens/generated": 1, "tokens/trained": 1, "kept/prompt_frac": 1.0, "kept/completion_frac": 1.0,
               "density/valid_token": 1.0}
        if s % 2 == 0 or s == steps:
            row.update({"eval_subset/avg": curve[s - 1] / 100, "eval_subset_n": 128 * samples, "timing_s/eval": eval_s})
        if s == steps:
            row.update({"eval/avg": finals / 100, "eval/avg/sampling_var": sampling_var / 1e4,
                        "eval_n": problems * samples})
        rows.append(row)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "config.yaml").write_text(json.dumps({"eval_size": problems, "eval_samples": samples}))
    return path


GAINS = [4.0, -2.0, 6.0, 0.0]  # DPPO - GRPO at the end, per seed: s.d. 3.65


@pytest.fixture
def lever_runs(tmp_path):
    """Lever 'a': GRPO at 50% and DPPO at 50 + GAINS[s] at the end (every problem and subset alike), 12 steps of 10 s
    and 5 s, evaluations of 2 s; GRPO's subset curve flat at 40 up to half the run (DPPO at 40 + 2 s), then its end
    value; sampling variance 1 point² per run."""
    runs = {"GRPO, lever a": [], "DPPO, lever a": []}
    for s, gain in enumerate(GAINS):
        g = [40.0] * 6 + [50.0] * 6
        d = [40.0 + 2 * s] * 6 + [50.0 + gain] * 6
        runs["GRPO, lever a"].append(_run(tmp_path / f"g/seed{s}", 50.0, g, 10.0, 2.0, 20.0 + s, sampling_var=1.0))
        runs["DPPO, lever a"].append(_run(tmp_path / f"d/seed{s}", 50.0 + gain, d, 5.0, 2.0, None, sampling_var=1.0))
    return runs


def test_each_reading_is_the_paired_difference_of_its_own_accuracy(lever_runs):
    pairs = protocol.pairs(lever_runs, ["a"])
    assert pairs["seed"].tolist() == [0, 1, 2, 3]
    assert pairs["gain_final"].tolist() == pytest.approx(GAINS)
    assert pairs["gain_last_k"].tolist() == pytest.approx(GAINS)  # the last 3 evaluations sit on the end value
    assert pairs["gain_half_run"].tolist() == pytest.approx([0.0, 2.0, 4.0, 6.0])  # step 6 = epoch 1 of 2
    assert pairs["learned"].tolist() == pytest.approx([30.0, 29.0, 28.0, 27.0])  # GRPO's final - the seed's start
    assert pairs["noise_var"].tolist() == pytest.approx([2.0] * 4)
    # a pair's minutes: both runs' training and every evaluation (GRPO 7 evaluations with its start, DPPO 6)
    assert pairs["pair_min"].tolist() == pytest.approx([(120 + 7 * 2 + 60 + 6 * 2) / 60] * 4)
    assert (pairs["pair_min"] > pairs["pair_train_min"]).all()


def test_a_pair_that_met_other_work_does_not_set_what_a_pair_costs(lever_runs):
    """Seed 0's GRPO computed every step with 1 of its 2 threads while another process took a core (dppo.tables'
    contended rule): its pair's minutes (here doubled) are left out of what a pair costs."""
    g0 = lever_runs["GRPO, lever a"][0]
    rows = [json.loads(line) for line in (g0 / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        if r["step"] > 0:
            r.update({"timing_s/step": 2 * r["timing_s/step"], "load/threads": 1, "load/other_cores": 1.0})
    (g0 / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (g0 / "machine.json").write_text(json.dumps({"cores": 2, "threads": 2}))
    pairs = protocol.pairs(lever_runs, ["a"])
    assert pairs["pair_contended"].tolist() == [True, False, False, False]
    quiet = (120 + 7 * 2 + 60 + 6 * 2) / 60
    assert protocol.readings(pairs)["pair_min"].tolist() == pytest.approx([quiet] * len(protocol.READINGS))
    assert pairs["pair_min"].iloc[0] == pytest.approx(quiet + 2)


def test_the_seeds_a_reading_needs_and_the_projection_of_more_samples(lever_runs):
    table = protocol.readings(protocol.pairs(lever_runs, ["a"])).set_index("reading")
    sd = pd.Series(GAINS).std()
    final = table.loc["final"]
    assert final["sd"] == pytest.approx(sd) and final["seeds"] == 4
    lo, hi = verdicts.sd_interval(sd, 4)
    assert (final["sd_lo"], final["sd_hi"]) == pytest.approx((lo, hi))
    n = final["seeds_half_width"]  # the fewest seeds whose expected 95% half-width is within 5 points
    assert verdicts.t_quantile(n - 1) * sd / math.sqrt(n) <= 5 < verdicts.t_quantile(n - 2) * sd / math.sqrt(n - 1)
    assert final["seeds_power"] == verdicts.seeds_for_power(sd) and final["seeds_power"] > n
    assert final["half_width"] == pytest.approx(verdicts.t_quantile(3) * sd / 2)
    assert final["hours_half_width"] == pytest.approx(n * final["pair_min"] / 60)
    # 8 samples a problem instead of 2: the sampling share of the variance (2 points² per pair) shrinks by 1 - 2/8
    assert table.loc["more_samples", "sd"] == pytest.approx(math.sqrt(sd ** 2 - 2.0 * (1 - 2 / 8)))
    assert table.loc["more_samples", "projected"] and not table.loc["final", "projected"]
    assert table.loc["final", "grpo_learned"] == pytest.approx(28.5) and table.loc["final", "grpo_learned_lo"] > 0


def test_the_choice_is_the_cheapest_measured_reading_whose_baseline_learned():
    base = {"seeds": 4, "gain": 0.0, "sd_lo": 1.0, "sd_hi": 9.0, "seeds_half_width_lo": 2, "seeds_half_width_hi": 9,
            "seeds_power": 9, "what": "x", "grpo_learned": 20.0, "grpo_learned_ci": 5.0, "grpo_learned_lo": 15.0,
            "noise_sd": 1.0, "half_width": 3.0}
    rows = [dict(base, lever="a", reading="final", sd=8.0, seeds_half_width=12, pair_min=20.0, projected=False),
            dict(base, lever="a", reading="last_k", sd=6.0, seeds_half_width=8, pair_min=20.0, projected=False),
            dict(base, lever="a", reading="more_samples", sd=1.0, seeds_half_width=2, pair_min=20.0, projected=True),
            dict(base, lever="b", reading="final", sd=4.0, seeds_half_width=5, pair_min=40.0, projected=False),
            dict(base, lever="c", reading="final", sd=1.0, seeds_half_width=2, pair_min=10.0, projected=False,
                 grpo_learned_lo=-1.0)]  # its GRPO did not learn: no candidate
    table = pd.DataFrame(rows)
    table["hours_half_width"] = table["seeds_half_width"] * table["pair_min"] / 60
    chosen = protocol.choose(table, budget_hours=3.0)
    assert (chosen["lever"], chosen["reading"]) == ("a", "last_k") and chosen["within_budget"]  # 2.67 h < 3.33 h
    assert not protocol.choose(table, budget_hours=2.0)["within_budget"]
    assert protocol.decision(chosen).startswith("**Chosen: lever a, x: paired s.d. 6.0 points over 4 seeds")
    unlearned = protocol.choose(table.assign(grpo_learned_lo=-1.0))  # no lever's GRPO learned: nothing is chosen
    assert protocol.decision(unlearned).startswith("**No protocol chosen: no lever's GRPO learned**")



def test_the_provenance_line_names_the_commit_the_protocols_runs_trained_at(lever_runs, tmp_path):
    """P1 in the pages' provenance line (dppo.readme.provenance): the commit its runs name (commit.txt)."""
    from dppo import readme

    for d in [d for dirs in lever_runs.values() for d in dirs]:
        (d / "commit.txt").write_text("abc123\n")
    levers = {"a": {"lr": 3e-5, "train_size": 64, "epochs": 2}}
    pairs = protocol.pairs(lever_runs, levers)
    protocol.write(lever_runs, levers, pairs, protocol.readings(pairs), tmp_path)
    assert readme.provenance(tmp_path) == ("Provenance: P1 (4 seeds a lever): trained at commit abc123 (run logs "
                                           "under experiments/results/)."), readme.provenance(tmp_path)


def test_a_tables_gain_on_the_protocols_last_k_reading_is_p1s(lever_runs):
    """Where P1 chose the last-k reading, a table's paired gain (dppo.tables.per_seed, reading "last_k") is the same
    difference P1 measured, not the final one: seed 0's DPPO dips to 30% at step 8, one of its last 3 evaluations."""
    from dppo import tables

    d0 = lever_runs["DPPO, lever a"][0] / "metrics.jsonl"
    rows = [json.loads(line) for line in d0.read_text().splitlines()]
    d0.write_text("".join(json.dumps({**r, "eval_subset/avg": 0.3} if r["step"] == 8 else r) + "\n" for r in rows))
    pairs = protocol.pairs(lever_runs, ["a"])
    assert pairs["gain_last_k"].iloc[0] == pytest.approx(GAINS[0] - (50 + GAINS[0] - 30) / 3)
    runs = {"GRPO": lever_runs["GRPO, lever a"], "DPPO": lever_runs["DPPO, lever a"]}
    for reading, column in (("final", "gain_final"), ("last_k", "gain_last_k")):
        seeds = tables.per_seed(runs, "GRPO", reading=reading)
        assert seeds.loc[seeds["label"] == "DPPO", "acc_gain"].tolist() == pytest.approx(pairs[column].tolist())


def test_a_table_none_of_whose_runs_evaluated_the_start_reads_it_from_the_run_that_did(lever_runs):
    """DPPO skipped its step-0 evaluation (as a second lever's pair does); given the run of each seed that made it
    (`starts`: dppo.studies.start_source), its start and so its learning are that run's; without, unknown."""
    from dppo import tables

    dppo_only = {"DPPO": lever_runs["DPPO, lever a"]}
    assert tables.per_seed(dppo_only, "DPPO")["acc/start"].isna().all()
    seeds = tables.per_seed(dppo_only, "DPPO", starts=lever_runs["GRPO, lever a"])
    assert seeds["acc/start"].tolist() == pytest.approx([20.0 + s for s in range(len(GAINS))])
    assert seeds["learned"].tolist() == pytest.approx([50.0 + g - 20.0 - s for s, g in enumerate(GAINS)])
