"""Verdicts from stated rules (docs/method.md §6.3): the word a table, a notebook or the README says about an
interval, each rule one pure function (tests/test_verdicts.py checks every branch on its boundary).

An interval is over seeds, mean ± t_{0.975, n-1} s / √n (Student's t), of per-seed values; a difference between two
methods is paired by seed (the same problems, data order and evaluation streams) before it is summarised.

- **learned**: a baseline learned when its final − start accuracy's interval lies above 0 (two seeds at least). Only
  then are a table's accuracies compared; otherwise the table says "baseline did not learn: accuracy not compared".
- **accuracy** (a row's paired gain over its baseline, points): "higher" when the interval lies above 0, "lower"
  when below, "kept" when it holds 0 with its lower bound above −MARGIN (non-inferiority at the margin stated beside
  it), else "unresolved".
- **speed** (a speed-up): "faster" when the interval lies above 1, "slower" when below, else "speed unresolved".
- **sooner** (the speed-up to the baseline's final accuracy, `dppo.tables.equal_compute`): as speed, over the seeds
  whose evaluation grid resolves both runs' times ("reach_resolved": each run's first evaluation within one s.e. of
  the target comes after an evaluation during training that was not), and never for a row whose work equals its
  baseline's (FLOPs ratio within 1 ± SAME_WORK in every seed: a clock ratio of identical work is noise).
- **case study** (F5): a seed shows the paper's pattern when, at each method's last checkpoint on the problem F5
  follows (chosen before training: `dppo.case_study.most_split`), DPPO's most sampled answer is right and the most
  sampled answer of every pruned baseline (CPPO, GRESO) is wrong. "reproduced" when a majority of at least
  CASE_MIN_SEEDS seeds shows it, "not reproduced" when they are that many and a majority does not, "illustrative" below.
- **seeds needed**: the smallest n at which a paired two-sided t-test at level ALPHA detects a difference of MARGIN
  points with power POWER, at the s.d. over seeds measured (noncentral t); "rough" when that s.d. comes from fewer
  than ROUGH_BELOW seeds, with the range of n over the s.d.'s own 95% interval (chi-square).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

MARGIN = 5.0  # points: the non-inferiority margin of "kept" and the difference the seeds-needed count detects
ALPHA = 0.05  # two-sided level of the tests behind the seeds-needed count
POWER = 0.8
ROUGH_BELOW = 4  # an s.d. from fewer seeds makes the seeds-needed count "rough"
SAME_WORK = 0.01  # a FLOPs ratio within 1 ± this is the baseline's own work: no time-to-accuracy verdict
MAX_SEEDS = 100_000  # seeds_for_power's search bound
CASE_MIN_SEEDS = 3  # F5: the seeds a case-study verdict needs (one problem a seed)
CASE_BASELINES = ("CPPO", "GRESO")  # the pruned baselines the paper's case study shows settling on a wrong answer


def t_quantile(dof: int, q: float = 0.975) -> float:
    """t_{q, dof}, the q quantile of Student's t (0.975: the two-sided 95% one)."""
    from scipy.stats import t

    return float(t.ppf(q, dof))


@dataclass(frozen=True)
class Interval:
    """The mean of one value per seed and its 95% t half-width (NaN for fewer than two seeds)."""

    mean: float
    half: float
    n: int
    sd: float = math.nan  # the sample standard deviation over the seeds

    @classmethod
    def of(cls, values: Iterable[float]) -> "Interval":
        xs = [float(x) for x in values if not math.isnan(float(x))]
        n = len(xs)
        if n == 0:
            return cls(math.nan, math.nan, 0)
        mean = sum(xs) / n
        if n < 2:
            return cls(mean, math.nan, n)
        sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
        return cls(mean, t_quantile(n - 1) * sd / math.sqrt(n), n, sd)

    @classmethod
    def from_summary(cls, mean: float, half: float, n: int) -> "Interval":
        """From a table's mean and `_ci` half-width over n seeds (the s.d. recovered from the half-width)."""
        sd = half * math.sqrt(n) / t_quantile(n - 1) if n >= 2 and not math.isnan(half) else math.nan
        return cls(float(mean), float(half) if n >= 2 else math.nan, int(n), sd)

    @property
    def lo(self) -> float:
        return self.mean - self.half

    @property
    def hi(self) -> float:
        return self.mean + self.half

    @property
    def resolved(self) -> bool:
        """Whether there is an interval at all (two seeds or more)."""
        return self.n >= 2 and not math.isnan(self.half)


def learned(learning: Interval) -> bool:
    """A baseline learned: its final − start accuracy's interval lies above 0."""
    return learning.resolved and learning.lo > 0


def learning_word(learning: Interval) -> str:
    """'learned' (interval above 0), 'lost accuracy' (below), 'did not learn resolvably' (holds 0), 'one seed'."""
    if not learning.resolved:
        return "one seed"
    return "learned" if learning.lo > 0 else "lost accuracy" if learning.hi < 0 else "did not learn resolvably"


NOT_COMPARED = "not compared (baseline did not learn)"


def accuracy(gain: Interval, baseline_learning: Interval, margin: float = MARGIN) -> str:
    """The accuracy verdict of a row's paired gain (points) over a baseline whose learning is `baseline_learning`."""
    if not baseline_learning.resolved:
        return "not compared (one seed: the baseline's learning has no interval)"
    if not learned(baseline_learning):
        return NOT_COMPARED
    if not gain.resolved:
        return "unresolved (one seed)"
    if gain.lo > 0:
        return "higher"
    if gain.hi < 0:
        return "lower"
    return "kept" if gain.lo > -margin else "unresolved"


def speed(speedup: Interval) -> str:
    """'faster' / 'slower' when the speed-up's interval lies above / below 1, else 'speed unresolved'; one seed says
    so ('faster in 1 seed'), never a bare 'faster'; 'speed not timed' without a value (no pair timed in turn)."""
    if math.isnan(speedup.mean):
        return "speed not timed"
    if not speedup.resolved:
        return ("faster" if speedup.mean > 1 else "not faster") + " in 1 seed"
    return "faster" if speedup.lo > 1 else "slower" if speedup.hi < 1 else "speed unresolved"


def same_work(flops_ratios: Iterable[float], tolerance: float = SAME_WORK) -> bool:
    """Whether a row did its baseline's work: its FLOPs ratio within 1 ± tolerance in every seed."""
    ratios = [float(r) for r in flops_ratios]
    return bool(ratios) and all(abs(r - 1) <= tolerance for r in ratios)


def sooner(speedup_reach: Interval, flops_ratios: Iterable[float]) -> str:
    """The time-to-accuracy verdict: `speedup_reach` over the seeds whose grid resolves it (see the module), the
    row's whole-run FLOPs ratios over every seed."""
    if same_work(flops_ratios):
        return "no time-to-accuracy verdict (the baseline's own work)"
    if not speedup_reach.resolved:
        return "time to accuracy not resolved by the evaluation grid"
    return "sooner" if speedup_reach.lo > 1 else "later" if speedup_reach.hi < 1 else "time to accuracy unresolved"


def power(n: int, sd: float, delta: float = MARGIN, alpha: float = ALPHA) -> float:
    """The power of a paired two-sided t-test at level `alpha` over n seeds to detect a mean difference `delta` when
    the differences' s.d. is `sd`: P(|T| > t_{1-alpha/2, n-1}), T noncentral t with n - 1 degrees of freedom and
    noncentrality delta √n / sd."""
    from scipy.stats import nct

    if n < 2:
        return 0.0
    crit, nc = t_quantile(n - 1, 1 - alpha / 2), delta * math.sqrt(n) / sd
    return float(nct.sf(crit, n - 1, nc) + nct.cdf(-crit, n - 1, nc))


def seeds_for_power(sd: float, delta: float = MARGIN, target: float = POWER, alpha: float = ALPHA) -> int:
    """The smallest n >= 2 with power(n, sd, delta, alpha) >= target (MAX_SEEDS if none below it)."""
    if sd <= 0:
        return 2
    lo, hi = 2, 2
    while power(hi, sd, delta, alpha) < target:  # power grows with n: double, then bisect
        lo, hi = hi, hi * 2
        if hi >= MAX_SEEDS:
            return MAX_SEEDS
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if power(mid, sd, delta, alpha) < target else (lo, mid)
    return lo


def sd_interval(sd: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """The `level` interval of a normal s.d. estimated as `sd` from n values: sd √((n-1) / χ²_{upper}) to
    sd √((n-1) / χ²_{lower}), χ² with n - 1 degrees of freedom."""
    from scipy.stats import chi2

    a = (1 - level) / 2
    return sd * math.sqrt((n - 1) / chi2.ppf(1 - a, n - 1)), sd * math.sqrt((n - 1) / chi2.ppf(a, n - 1))


def seeds_needed(gain: Interval, delta: float = MARGIN) -> str:
    """'52 seeds for 80% power at ±5 points' from the gain's s.d. over its seeds; 'rough' with the range over the
    s.d.'s 95% interval when it comes from fewer than ROUGH_BELOW seeds; '' without an s.d. (one seed)."""
    if not gain.resolved or math.isnan(gain.sd):
        return ""
    n = seeds_for_power(gain.sd, delta)
    text = f"{n} seeds for {POWER:.0%} power at ±{delta:g} points"
    if gain.n < ROUGH_BELOW:
        lo, hi = (seeds_for_power(s, delta) for s in sd_interval(gain.sd, gain.n))
        text += f" (rough: s.d. {gain.sd:.1f} from {gain.n} seeds; {lo}-{hi} over its 95% interval)"
    else:
        text += f" (s.d. {gain.sd:.1f} from {gain.n} seeds)"
    return text


def final_right(answers) -> dict[str, bool]:
    """One seed's F5 data (a DataFrame: method, step, answer, count, correct) -> {method: whether the most sampled
    answer at its last checkpoint is right} (ties to the answer listed first)."""
    out = {}
    for m, d in answers.groupby("method", sort=False):
        last = d[d["step"] == d["step"].max()]
        out[m] = bool(last.loc[last["count"].idxmax(), "correct"])
    return out


def case_pattern(right: dict[str, bool]) -> bool:
    """One seed of F5: {method: whether its most sampled answer at its last checkpoint is right} -> the paper's
    pattern (DPPO right, every pruned baseline of CASE_BASELINES wrong); False when a method is missing."""
    if "DPPO" not in right or any(m not in right for m in CASE_BASELINES):
        return False
    return right["DPPO"] and not any(right[m] for m in CASE_BASELINES)


def case_study(patterns: Iterable[bool], min_seeds: int = CASE_MIN_SEEDS) -> str:
    """F5's verdict over seeds, from `case_pattern` per seed: 'reproduced (k of n seeds)' when k > n / 2 and n >=
    `min_seeds`, 'not reproduced (k of n seeds)' when n >= `min_seeds` and k <= n / 2, else 'illustrative (k of n
    seeds: a verdict needs min_seeds)'."""
    patterns = list(patterns)
    k, n = sum(map(bool, patterns)), len(patterns)
    counted = f"{k} of {n} seed{'s' if n != 1 else ''}"
    if n < min_seeds:
        return f"illustrative ({counted}; a verdict needs {min_seeds})"
    return f"{'reproduced' if 2 * k > n else 'not reproduced'} ({counted})"
