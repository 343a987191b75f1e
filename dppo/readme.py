"""The README's results tables, generated from the committed tables and figure data so that each number has one
source (tests/test_readme.py checks that the pages carry exactly these blocks, `blocks`): the real model's main table
(`figures/real/`, `./reproduce.sh`) in README.md and all its tables (`--profile real`) in docs/results.md, each with
the commit its runs trained at, and the embedded default's and R1's (`figures/T*.csv`, `F3_*.csv`, `F4_packing.csv`,
`--profile cpu` and `--study real_model`) in docs/results.md. `python -m dppo.readme` (and
`./reproduce.sh`, at its end) rewrites both in place after `./reproduce.sh` has regenerated the tables."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from dppo import verdicts
from dppo.studies import PAPER, TABLES
from dppo.verdicts import Interval

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "<!-- results-table: generated from figures/*.csv by `.venv/bin/python -m dppo.readme` -->"
END = "<!-- /results-table -->"
REAL_BEGIN = "<!-- real-results-table: generated from figures/real/*.csv by `.venv/bin/python -m dppo.readme` -->"
REAL_END = "<!-- /real-results-table -->"
ALL_REAL_BEGIN = "<!-- all-real-results-table: generated from figures/real/*.csv by `.venv/bin/python -m dppo.readme` -->"
ALL_REAL_END = "<!-- /all-real-results-table -->"
README_TABLES = ("T1",)  # the README's: the main table ./reproduce.sh makes; docs/results.md has every one
P1_BEGIN = "<!-- protocol-table: generated from figures/real/P1_protocol.md by `.venv/bin/python -m dppo.readme` -->"
P1_END = "<!-- /protocol-table -->"
# T5's FLOPs speed-up drops by more than this share before a cell with higher rates counts as below one with lower
# rates: each cell's rollouts are its own (the real T1's DPPO FLOPs speed-up over its seeds: docs/results.md, R1)
MONOTONE_MARGIN = 0.05


def _value(row: pd.Series, column: str, unit: str = "", sign: str = "") -> str:
    """row[column] to 2 decimals (1 for points) with its unit, and its 95% interval (`<column>_ci`) when the table has
    one: "1.94x ± 0.22", "+3.3 ± 15.6 points"."""
    digits = 1 if unit == " points" else 2
    ci = row.get(f"{column}_ci", float("nan"))
    value = f"{row[column]:{sign}.{digits}f}"
    if ci is None or math.isnan(ci):
        return value + unit
    return f"{value} ± {ci:.{digits}f}{unit}" if unit.startswith(" ") else f"{value}{unit} ± {ci:.{digits}f}"


def _run(row: pd.Series, base: pd.Series | None = None) -> str:
    """Speed-up in wall-clock and FLOPs and accuracy gain of one row against its baseline (`base`, its summary row);
    a wall-clock mean that leaves out contended pairs or pairs that trained apart (`dppo.tables`) says over how many
    seeds it is; a row whose training steps (each one optimizer update or a fixed number of them) differ from its
    baseline's by half a step or more says how many it made (CPPO's allocation halves them; refill saves a few); the
    tokens it trained as a share of its baseline's, where the table has them (a row at "the same budget" shows it)."""
    contended, apart = int(row.get("contended", 0) or 0), int(row.get("apart", 0) or 0)
    why = ", ".join(f"{k} {name}" for k, name in ((contended, "contended"), (apart, "trained apart")) if k)
    wall = f" ({int(row['seeds']) - contended - apart} seeds: {why})" if why else ""
    timed = "not timed (trained apart)" if math.isnan(row["speedup"]) else f"{_value(row, 'speedup', 'x')} wall{wall}"
    steps = ""
    if base is not None and "steps" in row and abs(row["steps"] - base["steps"]) >= 0.5:
        steps = f", {row['steps']:.3g} training steps to {base['steps']:.3g}"
    tokens = ""
    if base is not None and not math.isnan(row.get("tokens_share", float("nan"))):
        tokens = f", {_value(row, 'tokens_share', 'x')} tokens trained"
    return (f"{timed}, {_value(row, 'speedup_flops', 'x')} FLOPs{tokens}, {_value(row, 'acc_gain', ' points', '+')}"
            f"{steps}")


def _learned(seeds: pd.DataFrame, label: str) -> Interval:
    """A row's final minus starting accuracy in points over its seeds: did its training raise accuracy at all."""
    return Interval.of((seeds["acc/avg"] - seeds["acc/start"])[seeds["label"] == label])


def _gain(seeds: pd.DataFrame, label: str) -> Interval:
    """A row's paired accuracy gain over its baseline (points), one value per seed."""
    return Interval.of(seeds.loc[seeds["label"] == label, "acc_gain"])


def learning(seeds: pd.DataFrame, baselines) -> str:
    """"learned: GRPO +41.2 ± 3.0" for each baseline whose final − start accuracy's interval lies above 0
    (`verdicts.learned`); every other baseline is named with its interval and what it shows ("GRPO +22.9 ± 120.4: did
    not learn resolvably"; "(one seed)" without an interval): its table compares no accuracy."""
    said, others = [], []
    for baseline in baselines:
        gain = _learned(seeds, baseline)
        text = f"{baseline} {gain.mean:+.1f}" + (f" ± {gain.half:.1f}" if gain.resolved else " (one seed)")
        if verdicts.learned(gain):
            said.append(text)
        else:
            others.append(f"{text}: {verdicts.learning_word(gain)}" if gain.resolved else text)
    return "; ".join((["learned: " + ", ".join(said)] if said else []) + others)


def verdict(df: pd.DataFrame, seeds: pd.DataFrame, label: str, baseline: str) -> str:
    """A row's verdict from its intervals by the stated rules (`dppo.verdicts`, docs/method.md §6.3): its speed-up's
    ("faster" / "slower" / "speed unresolved", over the pairs timed in turn; one seed says so), then its accuracy's
    ("higher" / "lower" / "kept" at the margin / "unresolved" with the seeds it would need), which is not drawn
    when the baseline did not learn."""
    row = df.loc[label]
    timed = int(row.get("seeds_timed", row.get("seeds", 1)) or 1)
    speed = verdicts.speed(Interval.from_summary(row["speedup"], row.get("speedup_ci", math.nan), timed))
    gain, learning = _gain(seeds, label), _learned(seeds, baseline)
    acc = verdicts.accuracy(gain, learning)
    if acc == "kept":
        acc += f" (lower bound {gain.lo:+.1f} > -{verdicts.MARGIN:g} points)"
    elif acc == "unresolved" and (need := verdicts.seeds_needed(gain)):
        acc += f"; {need}"
    return f"{speed}, accuracy {acc}"


def paired(seeds: pd.DataFrame, a: str, b: str, key: str = "acc/avg") -> tuple[float, float, int]:
    """(mean, 95% t half-width, n) over the seeds both rows ran of row a's `key` minus row b's (NaN half-width for
    one seed): a difference judged by the seeds, not by the means."""
    wide = seeds.pivot_table(index="seed", columns="label", values=key)
    gap = Interval.of((wide[a] - wide[b]).dropna() if a in wide and b in wide else [])
    return gap.mean, gap.half, gap.n


def against_paper(table: str, df: pd.DataFrame, seeds: pd.DataFrame) -> str:
    """Where a table's intervals contradict what the paper reports (data-driven; "" where they do not): T1 a baseline
    more accurate than DPPO, its paired interval over seeds above 0 (the paper: GRESO and CPPO less accurate than
    DPPO); T3 DPPO losing accuracy on the larger model, its interval below 0 (the paper: up to +4.19 points on the
    largest); a mean alone, or one seed, contradicts nothing. T5 a FLOPs speed-up that falls by more than
    MONOTONE_MARGIN where the rates grow (one seed's wall clock is one paired measurement per cell, not compared across
    cells)."""
    said = []
    if table in ("T1", "R1") and "DPPO" in df.index:
        for b in ("GRESO", "CPPO"):
            mean, half, n = paired(seeds, b, "DPPO")
            if mean - half > 0:  # NaN (one seed) compares False
                said.append(f"{b} more accurate than DPPO by {mean:+.1f} ± {half:.1f} points (paired, {n} seeds)")
    if table == "T3":
        large = [label for label in df.index if label.startswith("DPPO") and "large" in label]
        said += [f"DPPO on the larger model {df.loc[label, 'acc_gain']:+.1f} ± {df.loc[label, 'acc_gain_ci']:.1f} points"
                 for label in large if df.loc[label, "acc_gain"] + df.loc[label, "acc_gain_ci"] < 0]
    if table == "T5":
        cells = {tuple(float(v.split("=")[1]) for v in label.split(", ")): float(df.loc[label, "speedup_flops"])
                 for label in df.index if label.startswith("r_q=")}
        down = [(a, b) for a in cells for b in cells
                if a != b and b[0] >= a[0] and b[1] >= a[1] and cells[b] < cells[a] * (1 - MONOTONE_MARGIN)]
        if down:
            (a, b) = max(down, key=lambda ab: cells[ab[0]] - cells[ab[1]])
            said.append(f"FLOPs speed-up not monotone in the rates (r_q, r_o = {b[0]:g}, {b[1]:g}: {cells[b]:.2f}x "
                        f"below {a[0]:g}, {a[1]:g}: {cells[a]:.2f}x)")
    return ("against the paper: " + "; ".join(said)) if said else ""


def _real(figures: Path, name: str, df: pd.DataFrame, seeds: pd.DataFrame) -> str:
    """Each method's final accuracy: mean ± the 95% interval over its seeds (the table's, `tables.aggregate`), then the
    binomial half-width of the samples pooled over the seeds, labelled as what it is (evaluation noise only); and the
    time to within one evaluation s.e. of the baseline's final accuracy (equal compute, `tables.reach`) over the seeds
    whose evaluation grid resolves it, with its verdict (`tables.sooner`)."""
    from dppo.config import TrainConfig
    from dppo.studies import REAL_RUNS
    from dppo.tables import cell, sooner

    if "eval_n" in seeds:  # the samples each run's final evaluation graded
        samples = seeds.groupby("label")["eval_n"].sum().min()
    else:  # a table written before runs logged it: the configs'
        cfg = TrainConfig.load(ROOT / REAL_RUNS["GRPO"][0], REAL_RUNS["GRPO"][1])
        samples = cfg.eval_size * cfg.eval_samples * seeds["seed"].nunique()
    between = ", ".join(f"{label} {cell(row['acc/avg'], row['acc/avg_ci'], 1)}" for label, row in df.iterrows())
    noise = max(196 * math.sqrt(p / 100 * (1 - p / 100) / samples) for p in df["acc/avg"])
    eq = pd.read_csv(figures / f"{name}_equal_compute.csv").set_index("label").drop(index="GRPO")
    said = []
    for label, row in eq.iterrows():
        reached = f"{int(row['reached'])}/{int(row['seeds'])} seeds reached it"
        if "reach_resolved" not in row:
            value = f"{_value(row, 'speedup_reach', 'x')} ({reached})"
        elif int(row["reach_resolved"]):
            value = f"{_value(row, 'speedup_reach', 'x')} ({reached}, {int(row['reach_resolved'])} resolved by the grid)"
        else:
            value = f"({reached}, none resolved by the grid)"
        said.append(f"{label} {value}: {sooner(eq, label, seeds.loc[seeds['label'] == label, 'speedup_flops'])}")
    return (f"Pass@1 over seeds: {between} (evaluation noise ± {noise:.1f}); to GRPO's final accuracy ± 1 s.e.: "
            + "; ".join(said))


def _f3(figures: Path) -> str:
    """F3: DPPO's variance and bias against the rate, the baselines' bias, and the default proportional rule."""
    df = pd.read_csv(figures / "F3_gradient_variance.csv")
    norm = df["full_grad_sq"].iloc[0] ** 0.5
    at = {est: d[d["rate"] > 0] for est, d in df.groupby("estimator")}
    dppo, biased, cppo = at["DPPO (r_q = r_o = r)"], at["DPPO without 1/pi"], at["CPPO (P = r)"]
    rates = "/".join(f"{r:g}" for r in dppo["rate"])
    grad = "\\|grad L\\|"  # |grad L|, its bars escaped inside a Markdown table
    greso = df.loc[df["estimator"] == "GRESO", "bias"].iloc[0] / norm
    text = (f"DPPO variance / {grad}^2 at r = {rates}: {', '.join(f'{v:.2f}' for v in dppo['variance_rel'])}; "
            f"DPPO's bias within {dppo['bias_in_se'].max():.1f} Monte-Carlo s.e. (without 1/pi: "
            f"{biased['bias_in_se'].min():.0f}-{biased['bias_in_se'].max():.0f} s.e.); bias / {grad}: CPPO "
            f"{cppo['bias'].min() / norm:.2f}-{cppo['bias'].max() / norm:.2f}, GRESO {greso:.2f}")
    proportional = figures / "F3_gradient_variance_proportional.csv"
    if proportional.is_file():
        from dppo.variance import rule_name

        p = pd.read_csv(proportional)
        p = p[p["rule"] == rule_name()]
        text += (f"; proportional (default proxy, same budget): {p['median'].min():.2f}-{p['median'].max():.2f}x the "
                 f"uniform rule's variance (median), below it on {p['batches_below_at_every_rate'].iloc[0]}/"
                 f"{p['batches'].iloc[0]} batches")
    return text


def _f3_verdict(figures: Path) -> str:
    """F3 against the paper's "modestly higher at 0.9": the variance at r = 0.9 as a multiple of that at 0.7."""
    d = pd.read_csv(figures / "F3_gradient_variance.csv").query("estimator == 'DPPO (r_q = r_o = r)'").set_index("rate")
    ratio = d.loc[0.9, "variance_rel"] / d.loc[0.7, "variance_rel"]
    worst = d.loc[d.index > 0, "bias_in_se"].max()
    return ((f"unbiased: reproduced (bias within {worst:.1f} s.e.)" if worst < 3 else
             f"bias {worst:.1f} s.e.: not reproduced") + f"; variance at r = 0.9 {ratio:.1f}x that at 0.7" +
            (", against the paper's 'modestly higher'" if ratio > 2 else ""))


def _f4(figures: Path) -> str:
    """F4: density and update throughput of one DPPO step's update, padded vs packed vs shared (C = 256)."""
    b = pd.read_csv(figures / "F4_packing.csv").set_index("layout")
    padded, packed, shared = b.loc["padded"], b.loc["packed C=256"], b.loc["shared C=256"]
    return (f"one DPPO step's update, C = 256: valid-token density {padded['valid_token_density']:.2f} padded, "
            f"{packed['valid_token_density']:.2f} packed; loss-token density "
            f"{padded['loss_token_density']:.2f} padded, {shared['loss_token_density']:.2f} shared-prompt; update throughput {packed['speedup_vs_padded']:.2f}x "
            f"(packed), {shared['speedup_vs_padded']:.2f}x (shared) padded's")


def _f5(figures: Path) -> tuple[int, str, str]:
    """F5: its seeds; per seed the problem followed (chosen before training: dppo.case_study.most_split) and each
    method's share of right answers at its first and last checkpoint; the verdict on the paper's pattern (the pruned
    baselines settle on a wrong answer, DPPO on the right one) by its stated rule (dppo.verdicts.case_study)."""
    a = pd.read_csv(figures / "F5_case_study.csv")
    a = a if "seed" in a else a.assign(seed=0)  # written before F5 had seeds: one
    what, patterns = [], []
    for seed, d in a.groupby("seed", sort=False):
        right = d[d["correct"]].groupby(["method", "step"])["count"].sum()
        ends: dict[str, tuple[float, float]] = {}
        for m, dm in d.groupby("method", sort=False):
            n = dm["samples"].iloc[0]
            ends[m] = (right.get((m, dm["step"].min()), 0) / n, right.get((m, dm["step"].max()), 0) / n)
        what.append(f"seed {seed}: '{' '.join(str(d['question'].iloc[0]).split())}' (gold {d['gold'].iloc[0]}), right "
                    f"of {int(d['samples'].iloc[0])} samples, step 0 -> last: "
                    + ", ".join(f"{m} {s:.0%} -> {e:.0%}" for m, (s, e) in ends.items()))
        patterns.append(verdicts.case_pattern(verdicts.final_right(d)))
    said = (f"{verdicts.case_study(patterns)}: DPPO's most sampled last answer right, CPPO's and GRESO's wrong")
    return len(patterns), "; ".join(what), said


def provenance(figures: Path) -> str:
    """Where each table of `figures` comes from: the commit its runs trained at (their `commit.txt`, in the table's
    per-seed CSV), grouped — "T1: 4 seeds, trained at commit c849ab1b8111 (run logs in experiments/results/real/)" —
    or that its runs trained before runs recorded it (no logs committed)."""
    said: dict[str, list[str]] = {}

    def where(commits: list[str]) -> str:
        return ("trained before runs recorded their commit (no run logs)" if commits == ["unrecorded"] else
                f"trained at commit {', '.join(commits)} (run logs under experiments/results/"
                f"{'real/' if figures.name == 'real' else ''})")
    for table, recipe in TABLES.items():
        path = figures / f"{recipe.name}_seeds.csv"
        if not path.is_file():
            continue
        seeds = pd.read_csv(path)
        commits = sorted(set(seeds["commit"])) if "commit" in seeds else ["unrecorded"]
        n = seeds["seed"].nunique()
        said.setdefault(where(commits), []).append(f"{table} ({n} seed{'s' if n != 1 else ''})")
    if (figures / "P1_protocol_pairs.csv").is_file():  # the protocol's pairs (P1): a row names both runs' commits
        pairs = pd.read_csv(figures / "P1_protocol_pairs.csv")
        commits = sorted(set(", ".join(pairs["commit"]).split(", "))) if "commit" in pairs else ["unrecorded"]
        said.setdefault(where(commits), []).append(f"P1 ({pairs['seed'].nunique()} seeds a lever)")
    f3 = figures / "F3_gradient_variance.csv"
    if f3.is_file():  # F3 trains no run: the code that measured it, in its CSV
        commits = sorted(set(pd.read_csv(f3).get("commit", pd.Series(["unrecorded"])).astype(str)))
        text = ("measured before F3 recorded its commit" if commits == ["unrecorded"] else
                f"measured at commit {', '.join(commits)} (no runs: its numbers in {f3.name})")
        said.setdefault(text, []).append("F3")
    trace = figures / "F5_case_study_trace.csv"
    if trace.is_file():  # F5's runs: the commit each trained at, in its trace (one row a seed and method)
        runs = pd.read_csv(trace)
        commits = sorted(set(runs["commit"].astype(str))) if "commit" in runs else ["unrecorded"]
        n = runs["seed"].nunique()
        said.setdefault(where(commits), []).append(f"F5 ({n} seed{'s' if n != 1 else ''})")
    return "Provenance: " + "; ".join(f"{', '.join(tables)}: {text}" for text, tables in said.items()) + "."


def results_table(figures: Path = ROOT / "figures", keys: tuple[str, ...] | None = None) -> str:
    """Markdown table: per table of the study registry (`dppo.studies.TABLES`: T1-T5, R1 on the real model) that
    `figures` holds (only `keys`, when given), its seeds, what dppo measured at CPU scale, the verdict and what the
    paper reports; then, without `keys`, F3 (one batch for the variance and bias, 10 for the proportional rule), F4
    (one step) and F5 (one problem) where it holds them. Tables on the real model (R1; every table of figures/real)
    also give each method's accuracy and the time to GRPO's."""
    lines = ["| table | seeds | measured here (vs the row's GRPO-family baseline) | verdict | paper (GPU scale) |",
             "| --- | --- | --- | --- | --- |"]
    quoted: dict[str, str] = {}  # a claim of the paper -> the first row that quoted it (later rows say "as R1")
    for table, recipe in TABLES.items():
        name, base_of = recipe.name, recipe.baseline
        if not (figures / f"{name}.csv").is_file() or (keys is not None and table not in keys):
            continue
        df = pd.read_csv(figures / f"{name}.csv").set_index("label")
        per_seed = pd.read_csv(figures / f"{name}_seeds.csv")
        seeds = per_seed["seed"].nunique()
        rows = df[~((df["speedup"] == 1) & (df["acc_gain"] == 0))]  # every row but the baselines
        if table == "T5":  # the r_q x r_o grid: its range
            what = (f"over r_q, r_o in {{0.3, 0.5, 0.7}}: {rows['speedup'].min():.2f}x-{rows['speedup'].max():.2f}x "
                    f"wall, {rows['speedup_flops'].min():.2f}x-{rows['speedup_flops'].max():.2f}x FLOPs, "
                    f"{rows['acc_gain'].min():+.1f} to {rows['acc_gain'].max():+.1f} points")
            judged = [label for label in rows.index if label == "r_q=0.5, r_o=0.5"]  # the paper's rates
        else:  # rows on the table's layout, then those on the shared-prompt layout apart (`Table.layout_rows`)
            def base(label):
                return df.loc[base_of(label)] if base_of(label) in df.index else None
            what = "; ".join(f"{label}: {_run(row, base(label))}" for label, row in rows.iterrows()
                             if label not in recipe.layout_rows)
            shared = [f"{label} vs {base_of(label)}: {_run(row, base(label))}" for label, row in rows.iterrows()
                      if label in recipe.layout_rows]
            what += (". Shared prompts: " + "; ".join(shared)) if shared else ""
            judged = [label for label in rows.index if label.startswith("DPPO") or label.endswith("+ DPPO")]
        reading = per_seed["reading"].iloc[0] if "reading" in per_seed else "final"
        if reading != "final":  # the gains compare the protocol's reading (dppo.tables.READINGS)
            from dppo.tables import READING_WORDS

            what += f" (points: {READING_WORDS[reading]}, the protocol's reading)"
        if (table == "R1" or figures.name == "real") and (figures / f"{name}_equal_compute.csv").is_file():
            what += "; " + _real(figures, name, df, per_seed)  # the real model: accuracies, time to GRPO's
        bases = dict.fromkeys(base_of(label) for label in judged)
        verdicts: dict[str, list[str]] = {}  # rows with the same verdict share it
        for label in judged:
            verdicts.setdefault(verdict(df, per_seed, label, base_of(label)), []).append(label)
        said = learning(per_seed, bases) + ". " + "; ".join(f"{' / '.join(labels)}: {v}"
                                                           for v, labels in verdicts.items())
        contradicted = against_paper(table, df, per_seed)
        said += f". {contradicted}" if contradicted else ""
        paper = f"as {quoted[PAPER[table]]}" if PAPER[table] in quoted else PAPER[table]
        quoted.setdefault(PAPER[table], table)
        lines.append(f"| {table} | {seeds} | {what} | {said} | {paper} |")
    if keys is not None:
        return "\n".join(lines)
    if (figures / "F3_gradient_variance.csv").is_file():
        lines.append(f"| F3 | - | {_f3(figures)} | {_f3_verdict(figures)} | {PAPER['F3']} |")
    if (figures / "F4_packing.csv").is_file():
        lines.append(f"| F4 | - | {_f4(figures)} | - | {PAPER['F4']} |")
    if (figures / "F5_case_study.csv").is_file():
        seeds, what, said = _f5(figures)
        lines.append(f"| F5 | {seeds} | {what} | {said} | {PAPER['F5']} |")
    return "\n".join(lines)


def with_table(text: str, table: str, begin: str = BEGIN, end: str = END) -> str:
    """A page's text with the block between `begin` and `end` replaced by `table`."""
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{table}\n{end}{tail}"


def blocks() -> list[tuple[str, str, str, str]]:
    """(page, begin marker, end marker, generated text) of every generated block: the README's main table with its
    provenance (figures/real), docs/results.md's every real table with theirs, and the embedded default's (figures/)."""
    real = ROOT / "figures" / "real"
    return [("README.md", REAL_BEGIN, REAL_END, results_table(real, README_TABLES) + "\n\n" + provenance(real)),
            ("docs/results.md", ALL_REAL_BEGIN, ALL_REAL_END, results_table(real) + "\n\n" + provenance(real)),
            ("docs/results.md", BEGIN, END, results_table(ROOT / "figures")),
            ("docs/results.md", P1_BEGIN, P1_END, protocol(real))]


def protocol(figures: Path) -> str:
    """The protocol's measurement table and choice (P1, `dppo.protocol.write`), as its notebook wrote it."""
    path = figures / "P1_protocol.md"
    return path.read_text().strip() if path.is_file() else "(not measured: ./reproduce.sh --study protocol)"


def main() -> None:
    for page, begin, end, text in blocks():
        path = ROOT / page
        path.write_text(with_table(path.read_text(), text, begin, end))
        print(f"{path}: a generated block rewritten ({begin.split(':')[0][5:]})")


if __name__ == "__main__":
    main()
