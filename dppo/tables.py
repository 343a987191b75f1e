"""Tables of the reproduction (docs/method.md §6): per-seed comparisons, their means with 95% confidence
intervals, the markdown tables (the paper's columns) and the sentence that puts a table beside the paper's claim.

Speed-up = baseline time / method time at equal epochs, per seed (the same seed = the same problems in the same
order: paired), in three currencies (docs/method.md §5.1): wall-clock (`speedup`), process CPU time
(`speedup_cpu`) and FLOPs (`speedup_flops`). A run is `contended` when other work took more than
`OTHER_CORES_LIMIT` cores on average while it trained (`load/other_cores`, dppo.machine), or when the cores it used
(CPU / wall) fall below 3/4 of the table's median; a pair (a run and its baseline of the same seed) is contended when
either is, and its wall-clock and CPU speed-ups are left out of the means (FLOPs never are). Accuracy is the final Pass@1
(%) averaged over the held-out splits; `acc_gain` is the paired difference to the baseline. Over n seeds a cell is
mean +- t_{0.975, n-1} s / sqrt(n) (Student's t).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from dppo.results import summarize
from dppo.studies import FIGURES, PAPER, PAPER_GAIN, PAPER_SPEEDUP

SPEEDUPS = {"speedup": "train_s", "speedup_cpu": "train_cpu_s", "speedup_flops": "train_flops"}
TIMED = ("speedup", "speedup_cpu")  # the speed-ups a busy machine moves: contended pairs are left out of their means
OTHER_CORES_LIMIT = 0.25  # a quiet machine: a few hundredths of a core; one competing CPU-bound process: about 1
# The markdown table: what the paper's tables show (accuracy per benchmark or split, average, time, speed-up), here
# with the speed-up in wall-clock and FLOPs and, on CPU, process CPU time; every other column stays in the CSV.
MD_COLUMNS = {"acc/avg": "avg", "acc_gain": "gain", "train_min": "time (min)", "speedup": "speed-up",
              "speedup_cpu": "speed-up (CPU)", "speedup_flops": "speed-up (FLOPs)"}
CPU_ONLY = ("speedup_cpu",)  # and the contended mark: a GPU run's process CPU time measures the host, not the work


def per_seed(runs: dict[str, list[Path]], baseline: str | dict[str, str]) -> pd.DataFrame:
    """One row per (label, seed): summarize() plus speed-ups and accuracy gain against the row's baseline of the
    same seed (`baseline`: one label for every row, or {label: baseline label}); accuracies in %. A row that skipped
    its step-0 evaluation takes acc/start from its baseline, or from the table's first row (same initial model,
    problems and sampling seed)."""
    base_of = baseline if isinstance(baseline, dict) else {label: baseline for label in runs}
    summary = {label: [summarize(d) for d in dirs] for label, dirs in runs.items()}
    first = next(iter(summary.values()))
    rows = []
    for label, seeds in summary.items():
        for i, row in enumerate(seeds):
            base, folder = summary[base_of[label]][i], Path(runs[label][i]).name
            row = {"label": label, "seed": int(folder[4:]) if folder.startswith("seed") else i, **row}
            if pd.isna(row["acc/start"]):  # the baseline's, else the table's first row's (same initial model)
                row["acc/start"] = base["acc/start"] if pd.notna(base["acc/start"]) else first[i]["acc/start"]
            row.update({k: base[col] / row[col] for k, col in SPEEDUPS.items()})
            row["acc_gain"] = row["acc/avg"] - base["acc/avg"]
            rows.append(row)
    df = pd.DataFrame(rows)
    for c in [c for c in df.columns if c.startswith("acc")]:
        df[c] = df[c].astype(float) * 100
    df["train_min"] = df["train_s"] / 60
    cores = df["train_cpu_s"] / df["train_s"]
    df["contended"] = (df["load/other_cores"] > OTHER_CORES_LIMIT) | (cores < 0.75 * cores.median())
    flagged = set(zip(df["label"][df["contended"]], df["seed"][df["contended"]]))
    df["pair_contended"] = [(label, seed) in flagged or (base_of[label], seed) in flagged
                            for label, seed in zip(df["label"], df["seed"])]
    return df


def t_quantile(dof: int) -> float:
    """t_{0.975, dof}: the two-sided 95% quantile of Student's t."""
    from scipy.stats import t

    return float(t.ppf(0.975, dof))


def aggregate(seeds: pd.DataFrame) -> pd.DataFrame:
    """Per label: the mean of every numeric column, `<col>_ci` its 95% half-width (NaN for one seed), `seeds` the
    count; the wall-clock and CPU speed-ups over the pairs that were not contended (`seeds_timed` of them; all seeds
    when every pair was), `contended` the number of contended pairs."""
    numeric = [c for c in seeds.columns if c not in ("label", "seed", "contended", "pair_contended")]
    if "pair_contended" not in seeds:
        seeds = seeds.assign(pair_contended=False)
    out = _mean_and_interval(seeds, numeric)
    timed = seeds[~seeds["pair_contended"]]
    quiet = _mean_and_interval(timed, list(TIMED))
    for label in out.index:
        if label in quiet.index:
            for c in TIMED:
                out.loc[label, [c, f"{c}_ci"]] = quiet.loc[label, [c, f"{c}_ci"]].to_numpy()
    g = seeds.groupby("label", sort=False)
    out["seeds"], out["contended"] = g.size(), g["pair_contended"].sum()
    out["seeds_timed"] = [int((~seeds[seeds["label"] == label]["pair_contended"]).sum()) or int(n)
                          for label, n in out["seeds"].items()]
    return out


def _mean_and_interval(seeds: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """Per label: mean of `columns` and `<col>_ci`, the 95% half-width (NaN for one seed)."""
    g = seeds.groupby("label", sort=False)
    mean, n = g[columns].mean(), g.size()
    half = g[columns].std(ddof=1).mul([t_quantile(k - 1) if k > 1 else float("nan") for k in n], axis=0) \
        .div(n.pow(0.5), axis=0)
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
        digits = 2 if c.startswith("speedup") or c == "train_min" else 1
        body[names[c]] = [cell(m, ci, digits) for m, ci in zip(summary[c], summary[f"{c}_ci"])]
    if cpu_columns:
        body["speed-up"] = [s + (f" †{k}" if k else "") for s, k in zip(body["speed-up"], summary["contended"])]
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
    md = [f"**{name}.** {caption}{note}{contended} per-seed values and every other column in `{name}_seeds.csv` / "
          f"`{name}.csv`.", "", markdown(summary, cpu_columns), ""]
    if paper_key:
        md += [f"*Paper (reported, GPU scale):* {PAPER[paper_key]}", ""]
    (out / f"{name}.md").write_text("\n".join(md))
    return summary


def table(runs: dict[str, list[Path]], baseline: str | dict[str, str], name: str, caption: str,
          paper_key: str | None = None, out: Path = FIGURES, cpu_columns: bool = True) -> pd.DataFrame:
    """per_seed() -> write(): the summary table (one row per label), its caption naming the machine(s) the runs'
    clocks ran on; `cpu_columns` False for GPU runs: no contended pairs there (a rank's load meter counts the other
    ranks of its node as other work, and the CPU is not what a GPU step waits for), every seed's speed-up counts."""
    seeds = per_seed(runs, baseline)
    if not cpu_columns:
        seeds = seeds.assign(contended=False, pair_contended=False)
    return write(seeds, name, caption + machines(runs), paper_key, out, cpu_columns)


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


def interval(summary: pd.DataFrame, label: str, col: str) -> tuple[float, float, float]:
    """(mean, low, high) of a column's 95% interval (low = high = mean for one seed)."""
    m, ci = float(summary.loc[label, col]), float(summary.loc[label, f"{col}_ci"])
    return (m, m, m) if pd.isna(ci) else (m, m - ci, m + ci)


def sentence(summary: pd.DataFrame, label: str, baseline: str, paper_key: str | None = None) -> str:
    """What one row shows against its baseline, in words, from the numbers (and against the paper's claim)."""
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
        verdict = "indistinguishable from zero" if glo <= 0 <= ghi else ("better" if glo > 0 else "worse")
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


def sentences(summary: pd.DataFrame, baseline: str | dict[str, str], paper_key: str | None = None) -> str:
    """One line per compared row (markdown), then the paper's claim."""
    base_of = baseline if isinstance(baseline, dict) else {label: baseline for label in summary.index}
    lines = [f"- {sentence(summary, label, base_of[label], paper_key)}" for label in summary.index
             if base_of[label] != label]
    if paper_key:
        lines.append(f"- *Paper:* {PAPER[paper_key]}")
    return "\n".join(lines)
