"""The README's results table, generated from the committed tables and figure data (`figures/T*.csv`, `F3_*.csv`,
`F4_packing.csv`) so that each number has one source (tests/test_readme.py checks that the README carries exactly
this table). `python -m dppo.readme` (and `./reproduce.sh`, at its end) rewrites
it in place after `./reproduce.sh` has regenerated the tables."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from dppo.studies import PAPER

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "<!-- results-table: generated from figures/*.csv by `python -m dppo.readme` -->"
END = "<!-- /results-table -->"
TABLES = {"T1": "T1_main_results", "T2": "T2_algorithms", "T3": "T3_scale", "T4": "T4_ablations",
          "T5": "T5_sensitivity"}


def _value(row: pd.Series, column: str, unit: str = "", sign: str = "") -> str:
    """row[column] to 2 decimals (1 for points) with its unit, and its 95% interval (`<column>_ci`) when the table has
    one: "1.94x ± 0.22", "+3.3 ± 15.6 points"."""
    digits = 1 if unit == " points" else 2
    ci = row.get(f"{column}_ci", float("nan"))
    value = f"{row[column]:{sign}.{digits}f}"
    if ci is None or math.isnan(ci):
        return value + unit
    return f"{value} ± {ci:.{digits}f}{unit}" if unit.startswith(" ") else f"{value}{unit} ± {ci:.{digits}f}"


def _run(row: pd.Series) -> str:
    """Speed-up in wall-clock and FLOPs and accuracy gain of one row against its baseline."""
    return (f"{_value(row, 'speedup', 'x')} wall, {_value(row, 'speedup_flops', 'x')} FLOPs, "
            f"{_value(row, 'acc_gain', ' points', '+')}")


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
        text += (f"; proportional inclusion (default proxy), same budget: median {p['median'].min():.2f}-"
                 f"{p['median'].max():.2f}x the uniform rule's variance, below it at every rate on "
                 f"{p['batches_below_at_every_rate'].iloc[0]}/{p['batches'].iloc[0]} batches")
    return text


def _f4(figures: Path) -> str:
    """F4: density and update throughput of one DPPO step's update, padded vs packed vs shared (C = 256)."""
    b = pd.read_csv(figures / "F4_packing.csv").set_index("layout")
    padded, packed, shared = b.loc["padded"], b.loc["packed C=256"], b.loc["shared C=256"]
    return (f"one DPPO step's update, C = 256: valid-token density {padded['valid_token_density']:.2f} padded, "
            f"{packed['valid_token_density']:.2f} packed; loss-token density "
            f"{padded['loss_token_density']:.2f} padded, {shared['loss_token_density']:.2f} shared-prompt; update throughput {packed['speedup_vs_padded']:.2f}x "
            f"(packed), {shared['speedup_vs_padded']:.2f}x (shared) padded's")


def results_table(figures: Path = ROOT / "figures") -> str:
    """Markdown table: per table T1-T5, its seeds, what dppo measured at CPU scale and what the paper reports; then
    F3 (one batch for the variance and bias, 10 for the proportional rule) and F4 (one step)."""
    lines = ["| table | seeds | measured here (vs the row's GRPO-family baseline) | paper (GPU scale) |",
             "| --- | --- | --- | --- |"]
    for table, name in TABLES.items():
        df = pd.read_csv(figures / f"{name}.csv").set_index("label")
        seeds = pd.read_csv(figures / f"{name}_seeds.csv")["seed"].nunique()
        if table == "T5":  # the r_q x r_o grid: its range
            grid = df.drop(index="GRPO")
            what = (f"over r_q, r_o in {{0.3, 0.5, 0.7}}: {grid['speedup'].min():.2f}x-{grid['speedup'].max():.2f}x "
                    f"wall, {grid['speedup_flops'].min():.2f}x-{grid['speedup_flops'].max():.2f}x FLOPs, "
                    f"{grid['acc_gain'].min():+.1f} to {grid['acc_gain'].max():+.1f} points")
        else:
            rows = df[~((df["speedup"] == 1) & (df["acc_gain"] == 0))]  # every row but the baselines
            what = "; ".join(f"{label}: {_run(row)}" for label, row in rows.iterrows())
        lines.append(f"| {table} | {seeds} | {what} | {PAPER[table]} |")
    lines.append(f"| F3 | - | {_f3(figures)} | {PAPER['F3']} |")
    lines.append(f"| F4 | - | {_f4(figures)} | {PAPER['F4']} |")
    return "\n".join(lines)


def with_table(readme: str, table: str) -> str:
    """The README text with the block between BEGIN and END replaced by `table`."""
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main() -> None:
    path = ROOT / "README.md"
    path.write_text(with_table(path.read_text(), results_table()))
    print(f"{path}: results table rewritten from figures/")


if __name__ == "__main__":
    main()
