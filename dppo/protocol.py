"""The real-model protocol (docs/method.md §6.4): which setup lets the paired accuracy difference of GRPO and DPPO
resolve, read from the levers' runs (`dppo.studies.protocol_runs`), each a GRPO-DPPO pair trained in turn per seed.

Per lever and seed, with G and D the two runs (accuracies in points):

- **final** (levers a, b): D's final Pass@1 on every held-out problem minus G's — what T1 compares;
- **mean of the last k evaluations** (lever c): each run's accuracy on the evaluation subset averaged over its last
  LAST_K evaluations (the final one's subset share included), D's minus G's;
- **more evaluation samples** (lever d, projected): the final difference's variance over seeds less what sampling
  adds at k samples a problem, plus what it would add at MORE_SAMPLES: s_d² = s² − v̄ (1 − k / MORE_SAMPLES), v = the
  two final evaluations' logged `sampling_var` summed (independent draws: an upper bound where common random numbers
  correlate them) — a projection, not a measurement;
- **half the run** (lever e, read the other way): the subset's difference at the last evaluation within half of each
  run's epochs against the subset's at the end: what training on does to the spread.

Each reading's s.d. over seeds, its 95% interval (chi-square), the seeds whose 95% t half-width is at most MARGIN
points (`seeds_for_half_width`), the seeds for 80% power at MARGIN (`verdicts.seeds_for_power`), and what a pair costs:
both runs' training and evaluation minutes (over the pairs no other work contended, dppo.tables' rule). The
protocol chosen is the reading whose half-width target costs least
(`choose`), among those measured, not projected.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from dppo import verdicts
from dppo.results import LAST_K, contended_fraction, finished, last_evaluations, load_run, run_commit
from dppo.tables import CONTENDED_FRAC_LIMIT
from dppo.verdicts import MARGIN, Interval

MORE_SAMPLES = 8  # lever d: the samples a problem the projection asks for
READINGS = {"final": "final Pass@1, every held-out problem",
            "last_k": f"mean of the last {LAST_K} evaluations (subset)",
            "more_samples": f"{MORE_SAMPLES} samples a problem at the end (projected)",
            "half_run": "at half the run's epochs (subset)", "end_subset": "at the end (subset)"}


def seeds_for_half_width(sd: float, margin: float = MARGIN) -> int:
    """The fewest seeds n >= 2 whose expected 95% t half-width at s.d. `sd`, t_{0.975, n-1} sd / √n, is at most
    `margin` (the interval a verdict at the margin needs; `verdicts.seeds_for_power` asks for more: power)."""
    n = 2
    while verdicts.t_quantile(n - 1) * sd / math.sqrt(n) > margin:
        n += 1
        if n >= verdicts.MAX_SEEDS:
            break
    return n


def run_readings(run_dir: str | Path) -> dict:
    """One run's numbers: final accuracy (every problem) and its sampling variance (points²) and samples a problem,
    the start's (NaN when it skipped its step-0 evaluation), the mean of its last LAST_K subset evaluations, its
    subset accuracy at half its epochs and at the end, and its training and evaluation minutes."""
    df = load_run(run_dir)
    full = df.dropna(subset=["eval/avg"])
    subset = df.dropna(subset=["eval_subset/avg"])
    train = df[df["step"] > 0]
    half = train["epoch"].max() / 2
    trained_evals = subset[subset["step"] > 0]
    at_half = trained_evals[df.loc[trained_evals.index, "epoch"] <= half + 1e-9]
    final = full.iloc[-1]
    n = final.get("eval_n", math.nan)
    machine = Path(run_dir) / "machine.json"
    contended = contended_fraction(train, json.loads(machine.read_text()) if machine.is_file() else {})
    return {
        "contended": bool(contended > CONTENDED_FRAC_LIMIT),  # (dppo.tables' rule: its minutes are not a quiet run's)
        "final": 100 * final["eval/avg"], "start": 100 * full.iloc[0]["eval/avg"] if full.iloc[0]["step"] == 0 else math.nan,
        "sampling_var": 1e4 * final.get("eval/avg/sampling_var", math.nan),
        "samples_per_problem": n / _problems(run_dir) if _problems(run_dir) else math.nan,
        "last_k": 100 * last_evaluations(df),  # lever c
        "half_run": 100 * at_half["eval_subset/avg"].iloc[-1] if len(at_half) else math.nan,
        "end_subset": 100 * trained_evals["eval_subset/avg"].iloc[-1],
        "train_min": float(train["timing_s/step"].sum()) / 60,
        "eval_min": float(df.get("timing_s/eval", pd.Series(0.0, index=df.index)).fillna(0.0).sum()) / 60,
    }


def _problems(run_dir: str | Path) -> int:
    """Held-out problems one full evaluation of the run graded (its config's eval_size x splits: the arithmetic task
    has one split)."""
    import yaml

    cfg = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    return int(cfg["eval_size"])


def pairs(runs: dict[str, list[Path]], levers) -> pd.DataFrame:
    """One row per (lever, seed): both runs' readings (`run_readings`, G_ and D_ prefixed), D − G for each reading,
    the final difference's sampling variance (points², the two runs' summed), GRPO's learning (final − the seed's
    start, the first run of the seed that evaluated the initial model), the pair's minutes and the commit its runs
    trained at."""
    read = {d: run_readings(d) for dirs in runs.values() for d in dirs if finished(d)}
    rows = []
    for k in levers:
        grpo, dppo = runs[f"GRPO, lever {k}"], runs[f"DPPO, lever {k}"]
        for i, (g, d) in enumerate(zip(grpo, dppo)):
            if g not in read or d not in read:
                continue
            G, D = read[g], read[d]
            start = next((read[r[i]]["start"] for r in runs.values() if i < len(r) and r[i] in read
                          and not math.isnan(read[r[i]]["start"])), math.nan)
            row = {"lever": k, "seed": int(Path(g).name.removeprefix("seed")), "start": start,
                   **{f"G_{c}": v for c, v in G.items()}, **{f"D_{c}": v for c, v in D.items()},
                   "learned": G["final"] - start, "noise_var": G["sampling_var"] + D["sampling_var"],
                   "pair_min": G["train_min"] + G["eval_min"] + D["train_min"] + D["eval_min"],
                   "pair_contended": G["contended"] or D["contended"],
                   "pair_train_min": G["train_min"] + D["train_min"],
                   "commit": ", ".join(sorted({run_commit(g), run_commit(d)}))}
            row.update({f"gain_{c}": D[c] - G[c] for c in ("final", "last_k", "half_run", "end_subset")})
            rows.append(row)
    return pd.DataFrame(rows)


def readings(pair_rows: pd.DataFrame, margin: float = MARGIN) -> pd.DataFrame:
    """Per (lever, reading): seeds, the mean gain, the paired s.d. with its 95% interval, the half-width at these
    seeds, the seeds a half-width of `margin` needs and those 80% power at `margin` needs (with their range over the
    s.d.'s interval), minutes a pair, the hours those seeds take, and GRPO's learning (mean ± half-width)."""
    out = []
    for lever, rows in pair_rows.groupby("lever", sort=False):
        learned = Interval.of(rows["learned"])
        quiet = rows[~rows["pair_contended"]]  # what a pair costs on a quiet machine (all pairs if none was)
        minutes = float((quiet if len(quiet) else rows)["pair_min"].mean())
        final = Interval.of(rows["gain_final"])
        k = float(rows["G_samples_per_problem"].mean())
        noise = float(rows["noise_var"].mean())
        projected = math.sqrt(max(final.sd ** 2 - noise * (1 - k / MORE_SAMPLES), 0.0)) if final.n >= 2 else math.nan
        for reading in READINGS:
            gain = final if reading == "more_samples" else Interval.of(rows[f"gain_{reading}"])
            sd = projected if reading == "more_samples" else gain.sd
            lo, hi = verdicts.sd_interval(sd, gain.n) if gain.n >= 2 and sd > 0 else (math.nan, math.nan)
            n_half = seeds_for_half_width(sd, margin) if sd == sd else math.nan
            out.append({
                "lever": lever, "reading": reading, "what": READINGS[reading], "seeds": gain.n,
                "gain": gain.mean, "sd": sd, "sd_lo": lo, "sd_hi": hi,
                "half_width": verdicts.t_quantile(gain.n - 1) * sd / math.sqrt(gain.n) if gain.n >= 2 else math.nan,
                "seeds_half_width": n_half,
                "seeds_half_width_lo": seeds_for_half_width(lo, margin) if lo == lo else math.nan,
                "seeds_half_width_hi": seeds_for_half_width(hi, margin) if hi == hi else math.nan,
                "seeds_power": verdicts.seeds_for_power(sd, margin) if sd == sd else math.nan,
                "projected": reading == "more_samples", "pair_min": minutes,
                "hours_half_width": n_half * minutes / 60 if n_half == n_half else math.nan,
                "grpo_learned": learned.mean, "grpo_learned_ci": learned.half,
                "grpo_learned_lo": learned.lo, "noise_sd": math.sqrt(noise),
            })
    return pd.DataFrame(out)


def choose(table: pd.DataFrame, budget_hours: float = 3.0) -> pd.Series:
    """The protocol: among the measured readings (not projected) of levers whose GRPO learned (its interval above
    0), the one whose half-width target (`seeds_half_width` seeds) costs the fewest hours; `within_budget` says
    whether that fits `budget_hours` of the machine for the headline pair."""
    measured = table[~table["projected"] & table["reading"].isin(["final", "last_k"])]
    fair = measured[measured["grpo_learned_lo"] > 0]
    best = (fair if len(fair) else measured).sort_values(["hours_half_width", "seeds_half_width"]).iloc[0].copy()
    best["baseline_learned"] = bool(len(fair))  # (False: no lever's GRPO learned, the cheapest reading is shown)
    best["within_budget"] = bool(best["hours_half_width"] <= budget_hours)
    return best


def markdown(table: pd.DataFrame) -> str:
    """The measurement table: per lever and reading, seeds, mean gain, paired s.d. [95% interval], half-width now,
    seeds for a ±MARGIN half-width [range over the s.d.'s interval] and for 80% power, minutes a pair, hours, GRPO's
    learning."""
    def fmt(x, d=1):
        return "" if x != x else f"{x:.{d}f}"

    rows = []
    for _, r in table.iterrows():
        rows.append({
            "lever": r["lever"], "reading": r["what"], "seeds": int(r["seeds"]),
            "DPPO - GRPO (points)": f"{r['gain']:+.1f}",
            "paired s.d. [95%]": f"{fmt(r['sd'])} [{fmt(r['sd_lo'])}, {fmt(r['sd_hi'])}]",
            "half-width now": fmt(r["half_width"]),
            f"seeds for ±{MARGIN:g} [range]": f"{fmt(r['seeds_half_width'], 0)} [{fmt(r['seeds_half_width_lo'], 0)}-"
                                             f"{fmt(r['seeds_half_width_hi'], 0)}]",
            f"seeds for 80% power at {MARGIN:g}": fmt(r["seeds_power"], 0),
            "min a pair": fmt(r["pair_min"]), f"hours for ±{MARGIN:g}": fmt(r["hours_half_width"]),
            "GRPO learned": f"{r['grpo_learned']:+.1f} ± {fmt(r['grpo_learned_ci'])}",
        })
    return pd.DataFrame(rows).to_markdown(index=False)


def decision(chosen: pd.Series, margin: float = MARGIN) -> str:
    """The protocol chosen, in words: the lever and reading, the seeds and hours its ±margin half-width takes at the
    s.d. measured (and over that s.d.'s 95% interval), and whether that fits the budget; otherwise what it would take."""
    what = (f"lever {chosen['lever']}, {chosen['what']}: paired s.d. {chosen['sd']:.1f} points over "
            f"{int(chosen['seeds'])} seeds (95% interval {chosen['sd_lo']:.1f}-{chosen['sd_hi']:.1f}); a ±{margin:g} "
            f"half-width takes {int(chosen['seeds_half_width'])} seeds "
            f"({int(chosen['seeds_half_width_lo'])}-{int(chosen['seeds_half_width_hi'])} over that interval), "
            f"{chosen['hours_half_width']:.1f} h at {chosen['pair_min']:.0f} min a pair; 80% power to detect "
            f"{margin:g} points takes {int(chosen['seeds_power'])} seeds")
    if not chosen["baseline_learned"]:
        return f"**No protocol chosen: no lever's GRPO learned** (its final − start interval holds 0); cheapest: {what}."
    verdict = "within" if chosen["within_budget"] else "beyond"
    return f"**Chosen: {what}** — {verdict} the budget for the headline pair."


def write(runs: dict[str, list[Path]], levers: dict, pair_rows: pd.DataFrame, table: pd.DataFrame, out: Path,
          budget_hours: float = 3.0) -> pd.Series:
    """figures/<real>/P1_protocol.csv (the readings), P1_protocol_pairs.csv (per lever and seed) and P1_protocol.md
    (caption with the levers' fields and the commit the runs trained at, the table, the choice); returns the chosen
    reading (`choose`)."""
    from dppo.tables import machines, trained_at

    out.mkdir(parents=True, exist_ok=True)
    chosen = choose(table, budget_hours)
    table.to_csv(out / "P1_protocol.csv", index=False)
    pair_rows.to_csv(out / "P1_protocol_pairs.csv", index=False)
    said = "; ".join(f"{k}: lr {f['lr']:g} {f.get('lr_scheduler_type', 'constant')}, {f['train_size']} problems x "
                     f"{f['epochs']:g} epochs" for k, f in levers.items())
    caption = ("**P1_protocol.** Which setup lets GRPO vs DPPO accuracy resolve on SmolLM2-135M-Instruct (the "
               "arithmetic task, 8 prompts x 8 completions, both padding-free, each lever's pair in turn per seed; "
               f"docs/method.md §6.4). Levers: {said}. Minutes a pair: both runs' training and evaluation."
               + machines(runs) + trained_at(runs))
    (out / "P1_protocol.md").write_text("\n".join([caption, "", markdown(table), "", decision(chosen), ""]))
    return chosen
