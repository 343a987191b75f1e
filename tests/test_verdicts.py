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


@pytest.mark.parametrize("gain,gain_ci,verdict", [(2.0, 1.0, "better"), (-2.0, 1.0, "worse"),
                                                  (0.5, 1.0, "indistinguishable from zero"),
                                                  (-0.5, 1.0, "indistinguishable from zero"),
                                                  (1.0, 1.0, "indistinguishable from zero")])  # 0 at the bound
def test_accuracy_verdict(gain, gain_ci, verdict):
    text = tables.sentence(summary(2.0, 0.2, gain, gain_ci), "DPPO", "GRPO")
    assert f"(95% CI {gain - gain_ci:+.1f} to {gain + gain_ci:+.1f}: {verdict}), over 3 seeds." in text, text
    # a baseline that did not learn leaves the comparison unresolved; one that learned does not
    text = tables.sentence(summary(2.0, 0.2, gain, gain_ci, learned=(1.0, 2.0)), "DPPO", "GRPO")
    assert f": {verdict}; unresolved: GRPO did not learn), over 3 seeds." in text, text
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
    assert text.endswith("the baseline did not learn.") == (word != "learned"), text


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
