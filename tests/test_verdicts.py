"""The words a table's sentences say about its intervals (dppo/tables.py): every branch, on constructed summaries
whose intervals lie on one side or the other of the value compared (the paper's speed-up and gain, 0, a learned
baseline), checked word for word."""

import math

import pandas as pd
import pytest

from dppo import tables
from dppo.studies import PAPER_GAIN, PAPER_SPEEDUP

PAPER_SP, PAPER_G = PAPER_SPEEDUP["T1"], PAPER_GAIN["T1"]  # 2.37x, +3.36 points


def summary(speedup: float, speedup_ci: float, gain: float, gain_ci: float, seeds: int = 3,
            learned: tuple[float, float] | None = None) -> pd.DataFrame:
    """A two-row summary (GRPO, DPPO) as tables.aggregate makes it; a NaN interval for one seed. `learned`: the
    baseline's (mean, half-width) gain over its start (DPPO's: 20 +- 1)."""
    ci = (lambda x: math.nan) if seeds == 1 else (lambda x: x)
    rows = {"GRPO": dict(speedup=1.0, speedup_ci=ci(0.0), acc_gain=0.0, acc_gain_ci=ci(0.0)),
            "DPPO": dict(speedup=speedup, speedup_ci=ci(speedup_ci), acc_gain=gain, acc_gain_ci=ci(gain_ci))}
    for label, row in rows.items():
        row.update({"speedup_cpu": 1.5, "speedup_flops": 1.75, "acc/avg": 40.0, "acc/avg_ci": ci(1.0),
                    "seeds": seeds})
        if learned is not None:  # DPPO's own is always resolvably above 0
            own = learned if label == "GRPO" else (20.0, 1.0)
            row.update(learned=own[0], learned_ci=ci(own[1]))
    return pd.DataFrame.from_dict(rows, orient="index")


@pytest.mark.parametrize("speedup,speedup_ci,where", [
    (2.0, 0.2, "above"),  # our interval 1.80-2.20 lies below the paper's 2.37: the paper's speed-up is above it
    (3.0, 0.2, "below"),  # 2.80-3.20: the paper's is below it
    (2.3, 0.2, "inside"),  # 2.10-2.50 holds it
    (PAPER_SP, 0.0, "inside"),  # an interval of zero width at the paper's value (the bounds are inclusive)
])
@pytest.mark.parametrize("gain,gain_ci,gain_where", [(3.0, 1.0, "inside"), (1.0, 1.0, "outside"),
                                                     (6.0, 1.0, "outside")])
def test_paper_comparison_with_intervals(speedup, speedup_ci, where, gain, gain_ci, gain_where):
    text = tables.sentence(summary(speedup, speedup_ci, gain, gain_ci), "DPPO", "GRPO", "T1")
    assert text.endswith(f" The paper reports {PAPER_SP}x and {PAPER_G:+.2f} points; its speed-up is {where} our "
                         f"interval, and its gain is {gain_where} our interval."), text


@pytest.mark.parametrize("speedup,where", [(2.0, "above"), (3.0, "below")])
def test_paper_comparison_with_one_seed(speedup, where):
    text = tables.sentence(summary(speedup, 0.0, 3.0, 0.0, seeds=1), "DPPO", "GRPO", "T1")
    assert "(one seed: no interval)." in text
    assert text.endswith(f"its speed-up is {where} ours, and its gain is to be compared."), text


def test_paper_comparison_only_for_dppo_in_a_paper_table():
    s = summary(2.0, 0.2, 3.0, 1.0)
    assert "The paper reports" not in tables.sentence(s, "DPPO", "GRPO", None)
    assert "The paper reports" not in tables.sentence(s.rename(index={"DPPO": "CPPO"}), "CPPO", "GRPO", "T1")


@pytest.mark.parametrize("gain,gain_ci,verdict", [(2.0, 1.0, "higher"), (-2.0, 1.0, "lower"), (0.5, 1.0, "kept"),
                                                  (-0.5, 1.0, "kept"), (1.0, 1.0, "kept"),  # 0 at the bound
                                                  (-1.0, 3.9, "kept"), (-1.0, 4.1, "unresolved")])  # -5 at the bound
def test_accuracy_verdict(gain, gain_ci, verdict):
    text = tables.sentence(summary(2.0, 0.2, gain, gain_ci), "DPPO", "GRPO")
    assert f"(95% CI {gain - gain_ci:+.1f} to {gain + gain_ci:+.1f}: {verdict}), over 3 seeds." in text, text
    # a baseline that did not learn gets no accuracy verdict; one that learned does
    text = tables.sentence(summary(2.0, 0.2, gain, gain_ci, learned=(1.0, 2.0)), "DPPO", "GRPO")
    assert ": not compared (baseline did not learn)), over 3 seeds." in text, text
    text = tables.sentence(summary(2.0, 0.2, gain, gain_ci, learned=(10.0, 2.0)), "DPPO", "GRPO")
    assert f": {verdict}), over 3 seeds." in text, text


@pytest.mark.parametrize("learned,seeds,word", [((10.0, 2.0), 3, "learned"), ((-10.0, 2.0), 3, "lost accuracy"),
                                                ((1.0, 2.0), 3, "did not learn resolvably"),
                                                ((-1.0, 2.0), 3, "did not learn resolvably"),
                                                ((10.0, 2.0), 1, "one seed")])
def test_learned_verdict(learned, seeds, word):
    s = summary(2.0, 0.2, 1.0, 1.0, seeds=seeds, learned=learned)
    assert tables.learned(s, "GRPO") == word
    text = tables.learning_sentence(s.assign(**{"acc/start": 30.0}), "GRPO")
    assert text.startswith(f"**GRPO** goes from 30.0 to 40.0 Pass@1, {learned[0]:+.1f} points") and \
        f": {word}." in text
    assert text.endswith("Baseline did not learn: accuracy not compared.") == (word != "learned"), text


@pytest.mark.parametrize("gain,gain_ci,verdict", [(2.0, 1.0, "better"), (-2.0, 1.0, "worse"),
                                                  (0.5, 1.0, "indistinguishable from zero"),
                                                  (2.0, math.nan, "one seed")])
def test_equal_compute_verdict(gain, gain_ci, verdict):
    rows = {"GRPO": dict(reached=3, seeds=3, speedup_reach=1.0, speedup_reach_ci=0.0, speedup_reach_flops=1.0,
                         acc_at_budget=math.nan, gain_at_budget=math.nan, gain_at_budget_ci=math.nan),
            "DPPO": dict(reached=2, seeds=3, speedup_reach=1.5, speedup_reach_ci=0.25, speedup_reach_flops=1.75,
                         acc_at_budget=42.0, gain_at_budget=gain, gain_at_budget_ci=gain_ci)}
    text = tables.equal_compute_sentences(pd.DataFrame.from_dict(rows, orient="index"), "GRPO")
    assert text.startswith("- **DPPO** comes within one evaluation s.e. of GRPO's final accuracy in 2 of 3 seeds, 1.50x "
                           "faster than GRPO gets "
                           "there (95% CI 1.25-1.75) (1.75x in FLOPs); trained for GRPO's time it scores 42.0, "), text
    assert text.endswith(f": {verdict}).")
    # with the grid's resolution recorded (2 seeds resolved of the 2 that reached it), and the sooner verdict
    rows["GRPO"]["reach_resolved"], rows["DPPO"]["reach_resolved"] = 3, 2
    text = tables.equal_compute_sentences(pd.DataFrame.from_dict(rows, orient="index"), "GRPO",
                                          flops={"DPPO": [1.7, 1.8, 1.75]})
    assert "(1.75x in FLOPs) over the 2 seeds the grid resolves: sooner; trained for" in text, text
    rows["DPPO"]["reach_resolved"] = 0
    text = tables.equal_compute_sentences(pd.DataFrame.from_dict(rows, orient="index"), "GRPO",
                                          flops={"DPPO": [1.0, 1.0, 1.0]})
    assert "in 2 of 3 seeds, in no seed at a time the evaluation grid resolves: no time-to-accuracy verdict" in text


# ---------------------------------------------------------------- the rules themselves (dppo.verdicts)
from dppo import verdicts  # noqa: E402
from dppo.verdicts import Interval  # noqa: E402


def iv(mean: float, half: float, n: int = 4) -> Interval:
    return Interval.from_summary(mean, half, n)


@pytest.mark.parametrize("gain,word", [((3.0, 2.0), "higher"), ((-3.0, 2.0), "lower"), ((0.0, 2.0), "kept"),
                                       ((-2.0, 2.9), "kept"), ((-2.0, 3.0), "unresolved"),  # lower bound -4.9, -5.0
                                       ((10.0, 10.0), "kept"), ((10.0, 9.9), "higher"), ((-1.0, 30.0), "unresolved")])
def test_accuracy_rule_at_its_boundaries(gain, word):
    """'kept' only when the interval holds 0 and its lower bound is above -5 points (docs/method.md §6.3); the rule
    before it said 'kept' for any interval within ±5 of its mean (half-width <= 5), whose lower bound can be -9.9."""
    learned = iv(30.0, 5.0)
    assert verdicts.accuracy(iv(*gain), learned) == word
    wide = iv(-4.9, 4.95)  # holds 0, lower bound -9.85, half-width 4.95
    old_rule = "kept" if wide.half <= verdicts.MARGIN else "unresolved"  # readme.py at f140c55
    assert old_rule == "kept" and verdicts.accuracy(wide, learned) == "unresolved"
    assert verdicts.accuracy(iv(-5.0, 4.95), learned) == "lower"


@pytest.mark.parametrize("learning,compared", [((30.0, 5.0), True), ((3.0, 5.0), False), ((-3.0, 2.0), False),
                                               ((0.1, 0.1), False)])  # a lower bound at 0 is not above it
def test_no_accuracy_verdict_without_a_baseline_that_learned(learning, compared):
    said = verdicts.accuracy(iv(5.0, 1.0), iv(*learning))
    assert (said == "higher") == compared and (said == verdicts.NOT_COMPARED) != compared
    assert verdicts.accuracy(iv(5.0, 1.0), Interval(30.0, math.nan, 1)).startswith("not compared (one seed")
    assert verdicts.learned(iv(*learning)) == compared


def test_interval_of_per_seed_values_is_the_t_interval():
    got = Interval.of([1.0, 2.0, 6.0])
    assert got.mean == pytest.approx(3.0) and got.sd == pytest.approx(math.sqrt(7.0))
    assert got.half == pytest.approx(4.302653 * math.sqrt(7.0) / math.sqrt(3), rel=1e-6)
    assert Interval.from_summary(got.mean, got.half, 3).sd == pytest.approx(got.sd)
    assert not Interval.of([2.0]).resolved and Interval.of([]).n == 0 and Interval.of([1.0, math.nan]).n == 1


@pytest.mark.parametrize("effect,seeds", [(0.4, 52), (0.5, 34), (0.8, 15), (1.0, 10)])
def test_seeds_for_power_match_the_textbook(effect, seeds):
    """Paired two-sided t-test, alpha 0.05, power 0.8, effect size d = delta / s.d.: G*Power's (and Cohen's, 1988)
    sample sizes. The rule that came before counted the seeds whose *expected* 95% half-width is 5 points: at s.d.
    12.5 (d = 0.4, T1 of main f140c55) 27 seeds, not the 52 a power of 80% needs."""
    assert verdicts.seeds_for_power(sd=5.0 / effect, delta=5.0) == seeds
    assert verdicts.power(seeds, 5.0 / effect) >= 0.8 > verdicts.power(seeds - 1, 5.0 / effect)
    old = next(m for m in range(2, 1000) if verdicts.t_quantile(m - 1) * 12.5 / math.sqrt(m) <= 5.0)
    assert old == 27 and verdicts.seeds_for_power(12.5) == 52


def test_the_sd_interval_is_the_chi_square_one_and_makes_few_seeds_rough():
    lo, hi = verdicts.sd_interval(1.0, 3)  # df 2: sqrt(2 / 7.3778), sqrt(2 / 0.0506356)
    assert lo == pytest.approx(0.52066, rel=1e-4) and hi == pytest.approx(6.28472, rel=1e-4)
    rough = verdicts.seeds_needed(Interval.of([2.9, -8.2, 16.8]))  # T1's per-seed gains at f140c55
    assert rough.startswith("52 seeds for 80% power at ±5 points (rough: s.d. 12.5 from 3 seeds; ") and "-" in rough
    firm = verdicts.seeds_needed(Interval.of([2.9, -8.2, 16.8, 1.0]))
    assert "rough" not in firm and "from 4 seeds" in firm
    assert verdicts.seeds_needed(Interval.of([3.0])) == ""


@pytest.mark.parametrize("speedup,word", [((1.5, 0.2), "faster"), ((0.8, 0.1), "slower"), ((1.2, 0.3), "speed unresolved"),
                                          ((1.2, math.nan), "faster in 1 seed"), ((math.nan, math.nan), "speed not timed")])
def test_speed_rule(speedup, word):
    assert verdicts.speed(iv(*speedup) if speedup[1] == speedup[1] else Interval(speedup[0], math.nan, 1)) == word


def test_sooner_needs_the_grid_to_resolve_it_and_work_of_its_own():
    """GRESO at f140c55: 1.08x ± 0.12 'sooner' at a FLOPs ratio of 1.000 in all 3 seeds — the clock ratio of identical
    work — gets no verdict; a ratio the grid resolves in fewer than 2 seeds gets none either."""
    faster = iv(1.6, 0.2, 3)
    assert verdicts.sooner(faster, [1.5, 1.6, 1.7]) == "sooner"
    assert verdicts.sooner(faster, [1.0, 1.004, 0.996]).startswith("no time-to-accuracy verdict")
    assert verdicts.sooner(faster, [1.0, 1.02, 1.0]) == "sooner"  # one seed did other work
    assert verdicts.sooner(iv(0.7, 0.2, 3), [1.5] * 3) == "later"
    assert verdicts.sooner(iv(1.08, 0.92, 3), [1.5] * 3) == "time to accuracy unresolved"
    assert verdicts.sooner(Interval(1.6, math.nan, 1), [1.5] * 3) == \
        "time to accuracy not resolved by the evaluation grid"


def _answers(finals: dict[str, list[tuple[str, int, bool]]]) -> pd.DataFrame:
    """One seed's F5 rows: each method's step-0 answers (the same for all) and its last checkpoint's."""
    rows = [dict(method=m, step=0, answer="5", count=8, correct=False) for m in finals]
    rows += [dict(method=m, step=16, answer=a, count=c, correct=ok) for m, last in finals.items() for a, c, ok in last]
    return pd.DataFrame(rows)


def test_the_case_study_reads_the_most_sampled_last_answer_of_each_method():
    """A method is right when its most sampled answer at its last checkpoint is the gold one, whatever its step 0."""
    right, wrong = [("26", 5, True), ("16", 3, False)], [("26", 3, True), ("16", 5, False)]
    read = verdicts.final_right(_answers({"DPPO": right, "CPPO": wrong, "GRESO": wrong, "GRPO": right}))
    assert read == {"DPPO": True, "CPPO": False, "GRESO": False, "GRPO": True}


@pytest.mark.parametrize("dppo, cppo, greso, shown", [
    (True, False, False, True),   # the paper's pattern
    (True, True, False, False),   # a pruned baseline right too
    (False, False, False, False),  # DPPO wrong as well
    (False, True, True, False),   # the opposite
])
def test_the_paper_pattern_needs_dppo_right_and_every_pruned_baseline_wrong(dppo, cppo, greso, shown):
    assert verdicts.case_pattern({"DPPO": dppo, "CPPO": cppo, "GRESO": greso, "GRPO": True}) == shown
    assert not verdicts.case_pattern({"DPPO": True, "CPPO": False})  # GRESO not followed: no pattern to show


@pytest.mark.parametrize("patterns, word", [
    ([True, True, False], "reproduced (2 of 3 seeds)"),
    ([True, False, False], "not reproduced (1 of 3 seeds)"),
    ([True, True, False, False], "not reproduced (2 of 4 seeds)"),  # half is no majority
    ([False, False, False], "not reproduced (0 of 3 seeds)"),
    ([True, True], "illustrative (2 of 2 seeds; a verdict needs 3)"),
    ([True], "illustrative (1 of 1 seed; a verdict needs 3)"),
])
def test_the_case_study_verdict_is_a_majority_of_enough_seeds(patterns, word):
    assert verdicts.case_study(patterns) == word
