"""Tables of the reproduction (docs/method.md §6): per-seed comparisons, their means with 95% confidence
intervals, the markdown tables (the paper's columns) and the sentence that puts a table beside the paper's claim.

Speed-up = baseline time / method time at equal epochs, per seed (the same seed = the same problems in the same
order: paired), in three currencies (docs/method.md §5): wall-clock (`speedup`), process CPU time
(`speedup_cpu`) and FLOPs (`speedup_flops`). A run is `contended` when other work took more than
`OTHER_CORES_LIMIT` cores on average beyond those the run left free (`load/other_cores` over `load/spare_cores`: the
machine's cores minus the run's intra-op threads; dppo.machine) while it trained, when more than
`CONTENDED_FRAC_LIMIT` of its training time went to contended steps (`load/contended_frac`: steps computed with fewer
threads than planned, or that met more than `OTHER_CORES_LIMIT` cores of other work beyond their free ones;
results.contended_steps — a few such steps average out of the whole-run means), or when the core share of its
threads (CPU / wall / threads) falls below 3/4 of the table's median; a pair (a run and its baseline of the same
seed) is contended when either is or when the two met other work differing by more than `UNEVEN_LIMIT` cores (beyond
their spare ones: short bursts that fell on one side's steps), and its wall-clock and CPU speed-ups are left out of the means (FLOPs never are).
Accuracy is the final Pass@1 (%) averaged over the held-out splits; `acc_gain` is the paired difference to the baseline. Over n seeds a cell is
mean +- t_{0.975, n-1} s / sqrt(n) (Student's t).

At equal compute (`equal_compute`, docs/method.md §6.2): per seed, the training time and FLOPs a run needs to reach
its baseline's final accuracy a (at the first evaluation within one evaluation standard error of it: acc >= a - se,
se = 100 sqrt(p (1 - p) / n), p = a / 100, n the samples the baseline's final evaluation graded — the same rule for
the baseline's own time to a, so a coarse evaluation grid cannot turn sampling noise into a speed-up), and its
accuracy when it trains for the baseline's training time (at its last evaluation within that time).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from dppo.results import LAST_K, OTHER_CORES_LIMIT, PHASES, eval_counts, finished, load_run, summarize, timed_with
from dppo.studies import (FIGURES, PAPER, PAPER_GAIN, PAPER_SPEEDUP, Table, accuracy_reading, longer_rows,
                          start_source)
from dppo.verdicts import Interval, t_quantile  # noqa: F401  (t_quantile: figures and benches import it here)
from dppo import verdicts

SPEEDUPS = {"speedup": "train_s", "speedup_cpu": "train_cpu_s", "speedup_flops": "train_flops"}
TIMED = ("speedup", "speedup_cpu")  # the speed-ups a busy machine moves: contended pairs are left out of their means
# OTHER_CORES_LIMIT (dppo.results, 0.25 cores): a quiet machine reads a few hundredths; one CPU-bound process about 1
CONTENDED_FRAC_LIMIT = 0.05  # a run with more than 5% of its training time in contended steps is contended
UNEVEN_LIMIT = 0.1  # a pair whose two runs met other work differing by more than this (cores beyond their spare ones)
# The markdown table: what the paper's tables show (accuracy per benchmark or split, average, time, speed-up), here
# with the speed-up in wall-clock and FLOPs and, on CPU, process CPU time; every other column stays in the CSV.
MD_COLUMNS = {"acc/avg": "avg", "learned": "learned (vs start)", "acc_gain": "gain", "train_min": "time (min)",
              "speedup": "speed-up", "speedup_cpu": "speed-up (CPU)", "speedup_flops": "speed-up (FLOPs)",
              "tokens_share": "tokens trained (x baseline)"}
# The accuracy a paired gain compares (`per_seed`'s `reading`): final Pass@1 on every held-out problem, or the mean of
# the last LAST_K evaluations on the evaluation subset (the protocol's reading where P1 chose it: docs/method.md §6.4).
READINGS = {"final": "acc/avg", "last_k": "acc_last_k"}
READING_WORDS = {"final": "final Pass@1", "last_k": f"the mean of each run's last {LAST_K} evaluations (subset)"}
CPU_ONLY = ("speedup_cpu",)  # and the contended mark: a GPU run's process CPU time measures the host, not the work


def twin_repeats(base: dict, twin: dict) -> bool:
    """Whether a timing twin (`summarize` of each) did its baseline's work: the same training FLOPs and tokens trained.
    A twin trained on another host than its baseline can draw other rollouts from its first update on (floating point
    of other kernels: T1's seed-0 twin of 2026-12-08 trained 859 tokens at step 16 to its baseline's 662); its clock
    then times other work, and a row pairs with the twin alone (FLOPs, tokens, accuracy), not the twin's clock over
    the baseline's work."""
    return base.get("train_flops") == twin.get("train_flops") and base.get("tokens/trained") == twin.get("tokens/trained")


def per_seed(runs: dict[str, list[Path]], baseline: str | dict[str, str],
             starts: list[Path] | None = None, reading: str = "final") -> pd.DataFrame:
    """One row per (label, seed): summarize() plus speed-ups and accuracy gain against the row's baseline of the
    same seed (`baseline`: one label for every row, or {label: baseline label}); accuracies in %. A row that skipped
    its step-0 evaluation takes acc/start from its baseline, or from the first row of the table whose run of the seed
    made it (same initial model, problems and sampling seed), or from `starts` (a run outside the table per seed that
    made it: `studies.start_source`). `acc_gain` compares the accuracy `reading` names (READINGS)."""
    base_of = baseline if isinstance(baseline, dict) else {label: baseline for label in runs}
    summary = {label: [summarize(d) for d in dirs] for label, dirs in runs.items()}
    if starts:
        summary_of_start = [summarize(d) if finished(d) else {} for d in starts]
    rows, clocks = [], {}  # clocks: a timing twin's summary by (label, seed) of the row it times
    for label, seeds in summary.items():
        for i, row in enumerate(seeds):
            base = summary[base_of[label]][i]
            row = {"label": label, "seed": _seed_of(runs[label][i], i), **row}
            others = [base, *(runs_of_label[i] for runs_of_label in summary.values())]  # the baseline first
            others += [summary_of_start[i]] if starts else []
            for start in ("acc/start", "acc_subset/start"):  # the baseline's, else another row's of the seed (the
                if start in row and pd.isna(row[start]):  # same initial model, problems and sampling stream)
                    row[start] = next((o[start] for o in others if pd.notna(o.get(start, float("nan")))), float("nan"))
            # the clock of the baseline that trained beside this row (results.timed_with); FLOPs are the baseline's
            timer, row["timed_with"] = ((runs[label][i], "self") if label == base_of[label]
                                        else timed_with(runs[label][i], runs[base_of[label]][i]))
            clock = summarize(timer) if row["timed_with"] == "twin" else base
            if row["timed_with"] == "twin":
                clocks[label, row["seed"]] = clock
                if not twin_repeats(base, clock):  # the twin did other work: the row's pair is the twin, every column
                    base = clock
            row.update({k: (clock if k in TIMED else base)[col] / row[col] for k, col in SPEEDUPS.items()})
            if row["timed_with"] == "apart":  # trained at another time than its baseline: not a fair wall-clock pair
                row.update({k: float("nan") for k in TIMED})
            # the tokens the row's updates trained on, a share of its baseline's (T4's proportional row trains fewer
            # than DPPO at the same expected budget: its speed-up beside what it spends)
            trained = base.get("tokens/trained", float("nan"))  # (0 where a toy run trained nothing: no share)
            row["tokens_share"] = row.get("tokens/trained", float("nan")) / trained if trained else float("nan")
            row["acc_gain"] = row[READINGS[reading]] - base[READINGS[reading]]
            row["reading"] = reading
            rows.append(row)
    df = pd.DataFrame(rows)
    for c in [c for c in df.columns if c.startswith("acc")]:
        df[c] = df[c].astype(float) * 100
    df["learned"] = df["acc/avg"] - df["acc/start"]  # did training raise accuracy at all (the baseline's row above all)
    df["train_min"] = df["train_s"] / 60
    df["load/spare_cores"] = _spare(df)
    median = _per_thread(df).median()
    df["contended"] = _contended(df, median)
    flagged = set(zip(df["label"][df["contended"]], df["seed"][df["contended"]]))
    # a pair is also contended when its two runs met unequal load: short bursts of other work that fell on one side's
    # steps (in turn, only bursts longer than a few steps hit both alike)
    excess = dict(zip(zip(df["label"], df["seed"]), _excess(df)))
    twin = pd.DataFrame(clocks.values(), index=pd.MultiIndex.from_tuples(clocks.keys()) if clocks else None)
    twin_contended = dict(zip(twin.index, _contended(twin, median))) if clocks else {}
    twin_excess = dict(zip(twin.index, _excess(twin))) if clocks else {}
    df["pair_contended"] = [
        (label, seed) in flagged or twin_contended.get((label, seed), (base_of[label], seed) in flagged)
        or abs(excess[label, seed] - twin_excess.get((label, seed), excess[base_of[label], seed])) > UNEVEN_LIMIT
        for label, seed in zip(df["label"], df["seed"])]
    return df


def _per_thread(runs: pd.DataFrame) -> pd.Series:
    """The core share a run's threads got: CPU / wall / threads."""
    return runs["train_cpu_s"] / runs["train_s"] / runs["load/threads"].fillna(1.0)


def _spare(runs: pd.DataFrame) -> pd.Series:
    """The cores a run left free: the machine's cores minus its threads."""
    return (runs["cores"] - runs["load/threads"]).clip(lower=0.0).fillna(0.0)


def _excess(runs: pd.DataFrame) -> pd.Series:
    """Other work beyond the cores a run left free."""
    return (runs["load/other_cores"] - _spare(runs)).clip(lower=0.0)


def _contended(runs: pd.DataFrame, median_per_thread: float) -> pd.Series:
    """Runs that met other work beyond the cores they left free, spent more than CONTENDED_FRAC_LIMIT of their time
    in contended steps, or whose threads got less of a core than the table's runs typically do."""
    return (runs["load/other_cores"] > _spare(runs) + OTHER_CORES_LIMIT) | \
        (runs["load/contended_frac"] > CONTENDED_FRAC_LIMIT) | (_per_thread(runs) < 0.75 * median_per_thread)


def curve(run_dir: str | Path, start: float = float("nan")) -> pd.DataFrame:
    """A run's evaluations on one set of problems: step, `acc` (%), `train_s` / `train_flops` spent on training steps
    up to each and `eval_n`, the samples each graded. The set is the subset every evaluation of the run sampled
    (`eval_subset/avg`, `eval_subset_n`: a run with `eval_subset_size` evaluates only it during training, docs/method.md
    §6.2), else every problem (`eval/avg`, `eval_n` or results.eval_counts); a run that skipped its step-0 evaluation
    starts from `start` (its baseline's on the same set, at 0 s and 0 FLOPs)."""
    df = load_run(run_dir)
    df["train_flops"] = df.get("flops/step", pd.Series(0.0, index=df.index)).fillna(0.0).cumsum()
    subset = on_subset(df)
    df["eval_n"] = df["eval_subset_n"].astype(float) if subset else eval_counts(run_dir, df)
    ev = df.dropna(subset=[CURVE_ACC[subset]])
    out = pd.DataFrame({"step": ev["step"], "acc": ev[CURVE_ACC[subset]] * 100, "train_s": ev["wall_s"],
                        "train_flops": ev["train_flops"], "eval_n": ev["eval_n"]})
    if not (out["step"] == 0).any() and pd.notna(start):
        out = pd.concat([pd.DataFrame({"step": [0], "acc": [start], "train_s": [0.0], "train_flops": [0.0]}), out])
    return out.reset_index(drop=True)


CURVE_ACC = {True: "eval_subset/avg", False: "eval/avg"}  # the accuracy a curve follows (`on_subset`)


def on_subset(metrics: pd.DataFrame) -> bool:
    """Whether a run's curve is its subset's (it logged `eval_subset/avg`): every evaluation sampled the subset."""
    return "eval_subset/avg" in metrics and "eval_subset_n" in metrics


def standard_error(acc: float, n: float) -> float:
    """One standard error (points) of an accuracy `acc` (%) measured on `n` graded samples (docs/method.md §6.2):
    se = 100 sqrt(p (1 - p) / n), p = acc / 100; 0 when n is unknown (NaN: a run without its config.yaml)."""
    p = acc / 100
    return 0.0 if pd.isna(n) or n <= 0 else 100 * (p * (1 - p) / n) ** 0.5


def reach(evals: pd.DataFrame, target: float, tolerance: float = 0.0) -> pd.Series | None:
    """The first evaluation after training began within `tolerance` (points) of `target` (%) or above it, acc >=
    target - tolerance — what stopping there would cost —, or None if none is (docs/method.md §6.2: the tolerance
    is one standard error of the target's evaluation). The initial model does not count: where training lowered the
    baseline's accuracy below its start, the target is still the first trained evaluation that scores it, not time 0."""
    hit = evals[(evals["step"] > 0) & (evals["acc"] >= target - tolerance - 1e-9)]
    return hit.iloc[0] if len(hit) else None


def resolved(evals: pd.DataFrame, hit: pd.Series | None) -> bool:
    """Whether the evaluation grid resolves a run's time to a target it reached at `hit` (`reach`): an evaluation
    during training came before it (and did not reach the target). Reached at its first evaluation after training
    began, a run's time to it is only bounded by the grid — on a grid of steps 8 and 16, any run that gets there by
    step 8 'takes' step 8's time, and a speed-up to it is the ratio of per-step costs, whatever each learned."""
    return hit is not None and bool(((evals["step"] > 0) & (evals["step"] < hit["step"])).any())


def within(evals: pd.DataFrame, seconds: float) -> pd.Series | None:
    """The last evaluation within `seconds` of training, when the run trained at least that long (else None: it
    stopped before the budget, so its accuracy there is not known)."""
    if evals["train_s"].iloc[-1] < seconds * (1 - 1e-9):
        return None
    return evals[evals["train_s"] <= seconds * (1 + 1e-9)].iloc[-1]


EQUAL_COMPUTE = {"reached": "within one evaluation s.e. of baseline's final accuracy",
                 "reach_resolved": "times resolved by the grid", "reach_min": "time to it (min)",
                 "speedup_reach": "speed-up to it", "speedup_reach_flops": "speed-up to it (FLOPs)",
                 "budget_frac": "trained (x baseline's time)", "acc_at_budget": "accuracy at baseline's time",
                 "gain_at_budget": "gain at baseline's time"}
TIMED_EQUAL_COMPUTE = ("reach_min", "speedup_reach", "acc_at_budget", "gain_at_budget")  # a busy pair moves these
REACH_RATIOS = ("speedup_reach", "speedup_reach_flops")  # defined only where the grid resolves both times


def equal_compute(runs: dict[str, list[Path]], baseline: str, seeds: pd.DataFrame) -> pd.DataFrame:
    """One row per (label, seed), paired with the baseline of the same seed, on their curves (`curve`: the subset's
    where the runs evaluated one) (its final accuracy a = the target, its training time B = the budget, se =
    standard_error(a, n of that evaluation) the tolerance, `reach_tolerance`):
    `reached` (some evaluation >= a - se), `reach_resolved` (the grid resolves both runs' times to it: `resolved`),
    `reach_min` (training minutes to the first such evaluation),
    `speedup_reach` / `speedup_reach_flops` (the baseline's own time / FLOPs to its first evaluation >= a - se, over the
    run's), `budget_frac` (training time / B), `acc_at_budget` (% at the last evaluation within B; NaN when the run
    trained less than B) and `gain_at_budget` (that minus a). `seeds`: per_seed()'s frame (acc/start, the pairs'
    contended flags)."""
    indexed = seeds.set_index(["label", "seed"])
    starts = {True: indexed.get("acc_subset/start", indexed["acc/start"] * math.nan), False: indexed["acc/start"]}
    contended = indexed["pair_contended"]
    rows = []
    for label, dirs in runs.items():
        for i, (d, base_dir) in enumerate(zip(dirs, runs[baseline])):
            seed = _seed_of(d, i)
            start = starts[on_subset(load_run(d))]
            run, base = curve(d, start[label, seed]), curve(base_dir, start[baseline, seed])
            target, budget = base["acc"].iloc[-1], base["train_s"].iloc[-1]
            se = standard_error(target, base["eval_n"].iloc[-1])
            base_hit, hit, at = reach(base, target, se), reach(run, target, se), within(run, budget)
            rows.append({
                "label": label, "seed": seed, "reached": hit is not None, "reach_tolerance": se,
                "reach_resolved": resolved(base, base_hit) and resolved(run, hit),
                "reach_min": hit["train_s"] / 60 if hit is not None else float("nan"),
                "speedup_reach": base_hit["train_s"] / hit["train_s"] if hit is not None and hit["train_s"] > 0 else float("nan"),
                "speedup_reach_flops": base_hit["train_flops"] / hit["train_flops"]
                if hit is not None and hit["train_flops"] > 0 else float("nan"),
                "budget_frac": run["train_s"].iloc[-1] / budget,
                "acc_at_budget": at["acc"] if at is not None else float("nan"),
                "gain_at_budget": at["acc"] - target if at is not None else float("nan"),
                "pair_contended": bool(contended.get((label, seed), False)),
            })
    return pd.DataFrame(rows)


def aggregate_equal_compute(rows: pd.DataFrame) -> pd.DataFrame:
    """Per label: `reached` = seeds that reached the target (within its tolerance), `seeds`, `reach_tolerance` the
    mean tolerance (points); every other column's mean and `_ci` over the seeds where it is defined (timed columns:
    over pairs that were not contended; the speed-ups to the target over the seeds whose grid resolves them,
    `reach_resolved` of them), `<col>_n` how many."""
    columns = [c for c in EQUAL_COMPUTE if c not in ("reached", "reach_resolved")]
    if "reach_resolved" in rows:  # a speed-up to the target counts only where the grid resolves it (`resolved`)
        rows = rows.copy()
        rows.loc[~rows["reach_resolved"].astype(bool), list(REACH_RATIOS)] = math.nan
    out = _mean_and_interval(rows, columns)
    timed = rows[~rows["pair_contended"]]
    quiet = _mean_and_interval(timed, list(TIMED_EQUAL_COMPUTE))
    for label in quiet.index:  # labels with every pair contended keep every seed, as aggregate() does
        out.loc[label, [*TIMED_EQUAL_COMPUTE, *(f"{c}_ci" for c in TIMED_EQUAL_COMPUTE)]] = \
            quiet.loc[label, [*TIMED_EQUAL_COMPUTE, *(f"{c}_ci" for c in TIMED_EQUAL_COMPUTE)]].to_numpy()
    g = rows.groupby("label", sort=False)
    counts = g[columns].count()
    counts.loc[quiet.index, list(TIMED_EQUAL_COMPUTE)] = timed.groupby("label", sort=False)[list(TIMED_EQUAL_COMPUTE)].count()
    out = out.join(counts.add_suffix("_n"))
    out["reached"], out["seeds"] = g["reached"].sum().astype(int), g.size()
    if "reach_resolved" in rows:
        out["reach_resolved"] = g["reach_resolved"].sum().astype(int)
    if "reach_tolerance" in rows:
        out["reach_tolerance"] = g["reach_tolerance"].mean()
    return out


def markdown_equal_compute(summary: pd.DataFrame, baseline: str) -> str:
    """T1's equal-compute columns: seeds that came within one evaluation s.e. of the baseline's final accuracy (k/n),
    then mean ± 95% CI of each column over the seeds where it is defined ('(k)' when that is fewer than all)."""
    body = pd.DataFrame(index=summary.index.rename(None))
    for c, name in EQUAL_COMPUTE.items():
        name = name.replace("baseline", baseline)
        if c in ("reached", "reach_resolved"):
            if c in summary:  # (a table written before the grid's resolution was recorded has no reach_resolved)
                body[name] = [f"{int(k)}/{int(n)}" for k, n in zip(summary[c], summary["seeds"])]
            continue
        digits = 1 if c.startswith(("acc", "gain")) else 2
        body[name] = [cell(m, ci, digits) + (f" ({int(k)})" if 0 < k < n else "")
                      for m, ci, k, n in zip(summary[c], summary[f"{c}_ci"], summary[f"{c}_n"], summary["seeds"])]
    return body.to_markdown(stralign="right")


def _seed_of(run_dir: str | Path, i: int) -> int:
    """A run folder's seed: N of `seedN`, else its position in the table's list."""
    name = Path(run_dir).name
    return int(name[4:]) if name.startswith("seed") else i


def aggregate(seeds: pd.DataFrame) -> pd.DataFrame:
    """Per label: the mean of every numeric column, `<col>_ci` its 95% half-width (NaN for one seed), `seeds` the
    count; the wall-clock and CPU speed-ups over the pairs that were not contended and did not train apart
    (`seeds_timed` of them; all that did not train apart when every pair was contended), `contended` the number of
    contended pairs, `apart` of pairs that trained apart (`results.timed_with`: their timed speed-ups are NaN)."""
    numeric = [c for c in seeds.columns if c not in ("label", "seed", "contended", "pair_contended", "timed_with",
                                                     "commit", "reading")]
    if "pair_contended" not in seeds:
        seeds = seeds.assign(pair_contended=False)
    out = _mean_and_interval(seeds, numeric)
    timed = seeds[~seeds["pair_contended"]]
    quiet = _mean_and_interval(timed, list(TIMED))
    for label in out.index:
        if label in quiet.index:
            for c in TIMED:
                out.loc[label, [c, f"{c}_ci"]] = quiet.loc[label, [c, f"{c}_ci"]].to_numpy()
    apart = seeds["timed_with"].eq("apart") if "timed_with" in seeds else pd.Series(False, index=seeds.index)
    g = seeds.assign(apart=apart).groupby("label", sort=False)
    out["seeds"], out["contended"], out["apart"] = g.size(), g["pair_contended"].sum(), g["apart"].sum()
    twin = seeds["timed_with"].eq("twin") if "timed_with" in seeds else pd.Series(False, index=seeds.index)
    out["twin"] = twin.groupby(seeds["label"], sort=False).sum()
    out["seeds_timed"] = [int((~mine["pair_contended"] & ~mine["apart"]).sum()) or int((~mine["apart"]).sum())
                          for _, mine in g]
    return out


def _mean_and_interval(seeds: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Per label: mean of `columns` and `<col>_ci`, the 95% half-width (NaN for one seed)."""
    g = seeds.groupby("label", sort=False)
    mean, n = g[columns].mean(), g[columns].count()  # n per column: a value undefined for a seed (NaN) is not counted
    t = n.map(lambda k: t_quantile(k - 1) if k > 1 else float("nan"))
    half = g[columns].std(ddof=1) * t / n.pow(0.5)
    return mean.join(half.add_suffix("_ci"))


def cell(mean: float, ci: float, digits: int) -> str:
    """'41.9 ± 2.1' (or '41.9' without an interval)."""
    if pd.isna(mean):
        return ""
    return f"{mean:.{digits}f}" + ("" if pd.isna(ci) else f" ± {ci:.{digits}f}")


def markdown(summary: pd.DataFrame, cpu_columns: bool = True) -> str:
    """The paper's columns, mean ± 95% CI: one per evaluated split or benchmark (the runs' eval/* keys) and the
    average, then time and speed-ups; on CPU (`cpu_columns`) also the CPU-time speed-up, and a contended row's time
    is marked †."""
    accs = {c: c[4:] for c in summary.columns if c.startswith("acc/") and c not in ("acc/avg", "acc/start")
            and not c.endswith("_ci")}
    names = {**accs, **{c: n for c, n in MD_COLUMNS.items() if cpu_columns or c not in CPU_ONLY}}
    body = pd.DataFrame(index=summary.index.rename(None))
    for c in (c for c in names if c in summary.columns):
        digits = 2 if c.startswith(("speedup", "tokens")) or c == "train_min" else 1
        if f"{c}_ci" not in summary.columns:  # a table written before the column existed
            continue
        body[names[c]] = [cell(m, ci, digits) for m, ci in zip(summary[c], summary[f"{c}_ci"])]
    if cpu_columns:
        none = 0 * summary["contended"]
        body["speed-up"] = [s + (f" †{k}" if k else "") + (f" ‡{a}" if a else "") + (f" §{t}" if t else "")
                            for s, k, a, t in zip(body["speed-up"], summary["contended"], summary.get("apart", none),
                                                  summary.get("twin", none))]
    phases = [f"phase_s/{p}" for p in PHASES]
    if all(c in summary.columns for c in phases):  # where each row's training time went (mean over seeds)
        body["rollout / scoring / update (min)"] = [" / ".join(f"{summary.loc[label, c] / 60:.2f}" for c in phases)
                                                     for label in summary.index]
    return body.to_markdown(stralign="right")


def write(seeds: pd.DataFrame, name: str, caption: str, paper_key: str | None = None, out: Path = FIGURES,
          cpu_columns: bool = True) -> pd.DataFrame:
    """figures/<name>.csv (per label: means and `_ci` half-widths of every column), <name>_seeds.csv (one row per
    seed) and <name>.md (caption with the seeds, the paper's columns, the paper's claim); returns the summary."""
    out.mkdir(parents=True, exist_ok=True)
    summary = aggregate(seeds)
    seeds.to_csv(out / f"{name}_seeds.csv", index=False)
    summary.to_csv(out / f"{name}.csv")
    used = sorted(set(seeds["seed"]))
    note = (f" {len(used)} seeds ({', '.join(map(str, used))}): mean ± 95% CI (Student's t)." if len(used) > 1 else
            f" One seed ({used[0]}): accuracy differences of a few points are within run-to-run noise at this scale.")
    contended = (" †k = k seeds' pairs ran while other work took the machine's cores (contended, dppo.machine): "
                 "their wall-clock and CPU speed-ups are left out of those means;" if cpu_columns else "")
    if cpu_columns and summary["apart"].any():
        contended += (" ‡k = k seeds' pairs trained apart from their baseline (in no common in-turn group, "
                      "docs/engineering.md §5.1): their wall-clock and CPU speed-ups are not reported;")
    if cpu_columns and summary.get("twin", pd.Series(dtype=float)).any():
        contended += (" §k = k seeds' wall-clock and CPU speed-ups divide the clock of the baseline's timing twin, the "
                      "same run trained again in turn with the row (its group held the baseline no more: "
                      "results.in_turn_chunks);")
    md = [f"**{name}.** {caption}{note}{contended} per-seed values and every other column in `{name}_seeds.csv` / "
          f"`{name}.csv`.", "", markdown(summary, cpu_columns), ""]
    if paper_key:
        md += [f"*Paper (reported, GPU scale):* {PAPER[paper_key]}", ""]
    (out / f"{name}.md").write_text("\n".join(md))
    return summary


def table(runs: dict[str, list[Path]], baseline: str | dict[str, str], name: str, caption: str,
          paper_key: str | None = None, out: Path = FIGURES, cpu_columns: bool = True,
          at_equal_compute: bool = False, longer: tuple[str, ...] = (),
          starts: list[Path] | None = None, reading: str = "final") -> pd.DataFrame:
    """per_seed() -> write(): the summary table (one row per label), its caption naming the machine(s) the runs'
    clocks ran on; `cpu_columns` False for GPU runs: no contended pairs there (a rank's load meter counts the other
    ranks of its node as other work, and the CPU is not what a GPU step waits for), every seed's speed-up counts.
    `at_equal_compute` appends equal_compute_table() of every run against the table's first row's baseline (with
    per-row baselines, the rows on another layout — T1's shared-prompt rows — are left out of it); `longer`: labels of
    runs that trained past the table's epochs, left out of the equal-epoch table and kept in the equal-compute one;
    `starts` (per seed) a run outside the table that evaluated the initial model and `reading` the accuracy its gains
    compare (`per_seed`)."""
    equal_epochs = {label: dirs for label, dirs in runs.items() if label not in longer}
    seeds = per_seed(equal_epochs, baseline, starts, reading)
    if not cpu_columns:
        seeds = seeds.assign(contended=False, pair_contended=False)
    summary = write(seeds, name, caption + machines(equal_epochs) + trained_at(equal_epochs), paper_key, out,
                    cpu_columns)
    if at_equal_compute:
        main = baseline if isinstance(baseline, str) else baseline[next(iter(runs))]
        same = {label: dirs for label, dirs in runs.items() if isinstance(baseline, str) or label in longer
                or baseline.get(label) == main}
        equal_compute_table(same, main, name, out, cpu_columns, starts)
    return summary


def build(recipe: Table, layout: dict, runs: dict[str, list[Path]], out: Path = FIGURES,
          profile: str = "cpu") -> pd.DataFrame:
    """A study's table from its registry recipe (`studies.Table`), as its study notebook and paper_figures build it:
    table() over the trained `runs` of `layout` into `out`, each row against its baseline, with the recipe's caption
    and equal-compute table (the rows that trained past the table's epochs, `studies.longer_rows`, only there); where
    no row evaluated the initial model, the run of each seed that did (`studies.start_source`) gives the start; the
    gains compare the layout's accuracy reading (`studies.accuracy_reading`: the protocol's, for its chosen pair)."""
    source, starts, reading = start_source(layout), None, accuracy_reading(layout)
    if source:  # a run folder is <root>/<its row's sub-folder>/seed<n>: the source's sits beside it
        label, (_, _, sub) = next(iter(layout.items()))
        starts = [d.parents[len(Path(sub).parts)] / source / d.name for d in runs[label]]
    caption = recipe.full_caption(runs, profile)
    if reading != "final":
        caption += (f" Gain: on the protocol's reading, {READING_WORDS[reading]} (docs/method.md §6.4); avg: "
                    f"{READING_WORDS['final']}.")
    return table(runs, recipe.baselines(runs), recipe.name, caption, recipe.key, out, cpu_columns=profile != "paper",
                 at_equal_compute=recipe.at_equal_compute, longer=longer_rows(layout), starts=starts, reading=reading)


def equal_compute_table(runs: dict[str, list[Path]], baseline: str, name: str, out: Path = FIGURES,
                        cpu_columns: bool = True, starts: list[Path] | None = None) -> pd.DataFrame:
    """equal_compute() of every run against `baseline`: figures/<name>_equal_compute.csv (summary) and
    _equal_compute_seeds.csv (per seed), and its table appended to <name>.md; returns the summary. `runs` may hold runs
    that trained longer than the baseline (their accuracy at the baseline's time is defined; shorter runs' is not)."""
    seeds = per_seed(runs, baseline, starts)
    if not cpu_columns:
        seeds = seeds.assign(pair_contended=False)
    rows = equal_compute(runs, baseline, seeds)
    summary = aggregate_equal_compute(rows)
    rows.to_csv(out / f"{name}_equal_compute_seeds.csv", index=False)
    summary.to_csv(out / f"{name}_equal_compute.csv")
    contended = (" Timed columns leave out contended pairs, as above." if cpu_columns and rows["pair_contended"].any()
                 else "")
    md = (out / f"{name}.md").read_text()
    tolerance = rows["reach_tolerance"].mean()
    md = md.split("\n**At equal compute.**")[0].rstrip("\n") + "\n\n" + "\n".join([
        f"**At equal compute.** Paired by seed with {baseline}: the training time and FLOPs to the first evaluation "
        f"within one evaluation s.e. of {baseline}'s final accuracy or above it (on average {tolerance:.1f} points; "
        f"{baseline}'s own time to it by the same rule), and the accuracy at the last evaluation within {baseline}'s "
        f"training time (only runs that trained at least that long).{contended} Per seed: "
        f"`{name}_equal_compute_seeds.csv` (the tolerance per seed: `reach_tolerance`).",
        "", markdown_equal_compute(summary, baseline), ""])
    (out / f"{name}.md").write_text(md)
    return summary


def machines(runs: dict[str, list[Path]]) -> str:
    """' Machine: <CPU>, <cores> cores, torch <version>, <threads> threads[, <GPUs>].' from the runs' machine.json
    (each distinct machine once; '' when no run recorded one)."""
    seen = []
    for d in (Path(d) for dirs in runs.values() for d in dirs):
        if (d / "machine.json").is_file():
            m = json.loads((d / "machine.json").read_text())
            text = (f"{m['cpu']}, {m['cores']} cores, torch {m['torch']}, {m['threads']} threads"
                    + (f", {m['gpus']} x {m['gpu']}" if m.get("gpus") else ""))
            if text not in seen:
                seen.append(text)
    return f" Machine: {'; '.join(seen)}." if seen else ""


def trained_at(runs: dict[str, list[Path]]) -> str:
    """' Trained at commit <c> (code sha256 <h>...).' from the runs' commit.txt and code.sha256 (`results.prepare`),
    each distinct one once; runs without them (trained before dppo recorded them) are counted as such."""
    from dppo.results import CODE_FILE, COMMIT_FILE

    dirs = [Path(d) for ds in runs.values() for d in ds]
    commits = sorted({(d / COMMIT_FILE).read_text().strip() for d in dirs if (d / COMMIT_FILE).is_file()})
    codes = sorted({(d / CODE_FILE).read_text().strip()[:12] for d in dirs if (d / CODE_FILE).is_file()})
    unrecorded = sum(not (d / COMMIT_FILE).is_file() for d in dirs)
    text = (f" Trained at commit {', '.join(commits)} (code sha256 {', '.join(codes)}...)" if commits else "")
    text += (f"{';' if commits else ''} {unrecorded} of {len(dirs)} runs trained before runs recorded their commit"
             if unrecorded else "")
    return text + "." if text else ""


def interval(summary: pd.DataFrame, label: str, col: str) -> tuple[float, float, float]:
    """(mean, low, high) of a column's 95% interval (low = high = mean for one seed)."""
    m, ci = float(summary.loc[label, col]), float(summary.loc[label, f"{col}_ci"])
    return (m, m, m) if pd.isna(ci) else (m, m - ci, m + ci)


def summary_interval(summary: pd.DataFrame, label: str, col: str, n: str = "seeds") -> Interval:
    """A column's interval as `verdicts` reads it: its mean and `_ci` half-width over the row's `n` seeds."""
    return Interval.from_summary(summary.loc[label, col], summary.loc[label, f"{col}_ci"], int(summary.loc[label, n]))


def learned(summary: pd.DataFrame, label: str) -> str:
    """Whether a row's training raised its accuracy over the start, from the interval of `learned` (final - start,
    points): `verdicts.learning_word`."""
    return verdicts.learning_word(summary_interval(summary, label, "learned"))


def learning_sentence(summary: pd.DataFrame, baseline: str) -> str:
    """The baseline's gain over its starting accuracy in words: an accuracy comparison between methods is made only
    when the baseline learned (its gain's interval above 0: docs/method.md §6.3)."""
    m, lo, hi = interval(summary, baseline, "learned")
    verdict = learned(summary, baseline)
    text = (f"**{baseline}** goes from {summary.loc[baseline, 'acc/start']:.1f} to {summary.loc[baseline, 'acc/avg']:.1f} "
            f"Pass@1, {m:+.1f} points" + (f" (95% CI {lo:+.1f} to {hi:+.1f})" if hi > lo else "") + f": {verdict}.")
    if verdict != "learned":
        text += " Baseline did not learn: accuracy not compared."
    return text


def sentence(summary: pd.DataFrame, label: str, baseline: str, paper_key: str | None = None) -> str:
    """What one row shows against its baseline, in words, from the numbers (and against the paper's claim); the
    accuracy word is `verdicts.accuracy`'s."""
    n = int(summary.loc[label, "seeds"])
    sp, lo, hi = interval(summary, label, "speedup")
    g, glo, ghi = interval(summary, label, "acc_gain")
    ci = n > 1
    speed = f"{sp:.2f}x" + (f" (95% CI {lo:.2f}-{hi:.2f})" if ci else "")
    text = (f"**{label}** trains {speed} faster than {baseline} in wall-clock "
            f"({summary.loc[label, 'speedup_cpu']:.2f}x in CPU time, {summary.loc[label, 'speedup_flops']:.2f}x in "
            f"FLOPs); accuracy {cell(summary.loc[label, 'acc/avg'], summary.loc[label, 'acc/avg_ci'], 1)} vs "
            f"{cell(summary.loc[baseline, 'acc/avg'], summary.loc[baseline, 'acc/avg_ci'], 1)}, a paired difference "
            f"of {g:+.1f} points")
    if ci:
        learning = (summary_interval(summary, baseline, "learned") if "learned" in summary.columns
                    else Interval(math.inf, 0.0, n))  # a summary without the baseline's learning: taken as learned
        verdict = verdicts.accuracy(summary_interval(summary, label, "acc_gain"), learning)
        text += f" (95% CI {glo:+.1f} to {ghi:+.1f}: {verdict}), over {n} seeds"
    else:
        text += " (one seed: no interval)"
    text += "."
    if paper_key in PAPER_SPEEDUP and label == "DPPO":  # the paper's headline number is DPPO's
        target, gain = PAPER_SPEEDUP[paper_key], PAPER_GAIN[paper_key]
        where = ("inside" if lo <= target <= hi else "above" if target > hi else "below") if ci else \
            ("above" if target > sp else "below")
        text += (f" The paper reports {target}x and {gain:+.2f} points; its speed-up is {where} "
                 f"{'our interval' if ci else 'ours'}, and its gain is "
                 f"{('inside' if glo <= gain <= ghi else 'outside') + ' our interval' if ci else 'to be compared'}.")
    return text


def sooner(equal: pd.DataFrame, label: str, flops_ratios) -> str:
    """The time-to-accuracy verdict of a row of an equal-compute summary (`verdicts.sooner`): its speed-up to the
    baseline's final accuracy over the seeds the grid resolves and that were timed on a quiet machine (the mean's
    `speedup_reach_n`), and its whole-run FLOPs ratios per seed."""
    if "reach_resolved" not in equal:  # written before the grid's resolution was recorded: not judged
        return "time to accuracy not judged (the grid's resolution was not recorded)"
    n = int(equal.loc[label, "reach_resolved"])
    timed = int(equal.loc[label, "speedup_reach_n"]) if "speedup_reach_n" in equal else n
    if n >= 2 > timed and not verdicts.same_work(flops_ratios):
        return f"time to accuracy not judged ({timed} of the {n} seeds the grid resolves timed on a quiet machine)"
    return verdicts.sooner(Interval.from_summary(equal.loc[label, "speedup_reach"], equal.loc[label, "speedup_reach_ci"],
                                                 timed) if timed else Interval(math.nan, math.nan, 0), flops_ratios)


def equal_compute_sentences(summary: pd.DataFrame, baseline: str, flops: dict | None = None) -> str:
    """What the equal-compute table shows, in words: per row, the seeds that came within one evaluation s.e. of the
    baseline's final accuracy (docs/method.md §6.2), how much faster over the seeds whose grid resolves it, and the
    verdict (`sooner`; `flops`: {label: the whole-run FLOPs ratios per seed}); per row that trained for the
    baseline's time, its accuracy there against the baseline's."""
    lines = []
    for label in summary.index.drop(baseline):
        k, n = int(summary.loc[label, "reached"]), int(summary.loc[label, "seeds"])
        se = summary.loc[label, "reach_tolerance"] if "reach_tolerance" in summary else 0.0  # CSVs of earlier code
        text = (f"**{label}** comes within one evaluation s.e." + (f" ({se:.1f} points)" if se > 0 else "")
                + f" of {baseline}'s final accuracy in {k} of {n} seeds")
        recorded = "reach_resolved" in summary  # (not in tables written before the grid's resolution was)
        resolved = int(summary.loc[label, "reach_resolved"]) if recorded else k
        if k and resolved:
            sp, lo, hi = interval(summary, label, "speedup_reach")
            text += (f", {sp:.2f}x faster than {baseline} gets there" + (f" (95% CI {lo:.2f}-{hi:.2f})" if hi > lo else "")
                     + f" ({summary.loc[label, 'speedup_reach_flops']:.2f}x in FLOPs)"
                     + (f" over the {resolved} seeds the grid resolves" if recorded and resolved < n else ""))
        elif k:
            text += ", in no seed at a time the evaluation grid resolves"
        if flops is not None:
            text += f": {sooner(summary, label, flops.get(label, []))}"  # (a longer run has no equal-epoch ratio)
        if pd.notna(summary.loc[label, "acc_at_budget"]):
            g, glo, ghi = interval(summary, label, "gain_at_budget")
            verdict = ("indistinguishable from zero" if glo <= 0 <= ghi else "better" if glo > 0 else "worse") \
                if ghi > glo else "one seed"
            text += (f"; trained for {baseline}'s time it scores {summary.loc[label, 'acc_at_budget']:.1f}, "
                     f"{g:+.1f} points against {baseline}'s final accuracy (95% CI {glo:+.1f} to {ghi:+.1f}: {verdict})")
        lines.append(f"- {text}.")
    return "\n".join(lines)


def sentences(summary: pd.DataFrame, baseline: str | dict[str, str], paper_key: str | None = None) -> str:
    """One line per compared row (markdown), then the paper's claim."""
    base_of = baseline if isinstance(baseline, dict) else {label: baseline for label in summary.index}
    lines = [f"- {sentence(summary, label, base_of[label], paper_key)}" for label in summary.index
             if base_of[label] != label]
    if paper_key:
        lines.append(f"- *Paper:* {PAPER[paper_key]}")
    return "\n".join(lines)
