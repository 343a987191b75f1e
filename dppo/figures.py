"""Figures of the reproduction (docs/method.md §6), each saved as figures/<name>.png and .pdf and returned, so a
notebook shows it inline. Curves over seeds are the mean with a 95% band (Student's t, as the tables)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dppo.results import load_run
from dppo.studies import FIGURES, RESULTS, T4_RUNS
from dppo.tables import curve, on_subset, t_quantile


def save_figure(fig, name: str, out: Path = FIGURES) -> list[Path]:
    """figures/<name>.png and .pdf."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    for p in paths:
        fig.savefig(p, bbox_inches="tight", dpi=150)
    return paths


def _plt():
    """pyplot with the project's style. The backend is matplotlib's own choice: inline in a notebook kernel,
    Agg on a headless machine."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    return plt


def band(curves: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Mean and 95% half-width over seeds (rows) of equally long curves (half-width 0 for one seed)."""
    y = np.vstack(curves)
    n = len(y)
    half = t_quantile(n - 1) * y.std(axis=0, ddof=1) / np.sqrt(n) if n > 1 else np.zeros(y.shape[1])
    return y.mean(axis=0), half


def figure_f2(runs: dict[str, list[Path]], baseline: str = "GRPO", name: str = "F2_training_curves",
              out: Path = FIGURES, accuracy_label: str = "Pass@1 (%), mean of 6 splits"):
    """Held-out accuracy and training reward against training wall-clock, one line per method: the mean over seeds
    with a 95% band. Accuracy: at each evaluation, on the problems every evaluation of the run sampled (`tables.curve`:
    the subset where the runs evaluated one; the step-0 point is the baseline's of the same seed when a run skipped
    it), x = the mean wall-clock of that evaluation. Reward: 15-step moving average, each seed interpolated
    onto a common wall-clock grid up to the shortest seed's end. A dashed line marks the baseline's final accuracy
    (the target of T1's equal-compute columns). Bands: 95% Student-t intervals over the n seeds. The training reward is
    averaged over the prompts each method rolled out, which pruning changes: it compares a method with itself over time,
    not methods with each other (held-out accuracy does that)."""
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    subset = False  # whether the curves are on the evaluation subset (eval_subset_size: every evaluation samples it)
    for (label, dirs), color in zip(runs.items(), plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        xs, accs, rewards = [], [], []
        for seed, d in enumerate(dirs):
            df = load_run(d)
            start = curve(runs[baseline][seed]).query("step == 0")["acc"]  # the initial model's, on the same set
            ev = curve(d, start.iloc[0] if len(start) else float("nan"))
            subset |= on_subset(df)
            xs.append(ev["train_s"].to_numpy() / 60)
            accs.append(ev["acc"].to_numpy())
            train = df[df["step"] > 0]
            rewards.append((train["wall_s"].to_numpy() / 60, train["reward"].rolling(15, min_periods=1).mean().to_numpy()))
        k = min(len(a) for a in accs)
        mean, half = band([a[:k] for a in accs])
        if label == baseline:
            ax1.axhline(np.mean([a[-1] for a in accs]), color=color, ls="--", lw=0.8, label=f"{label} final (mean)")
        x = np.mean([v[:k] for v in xs], axis=0)
        ax1.plot(x, mean, marker="o", ms=3, color=color, label=f"{label} (n={len(dirs)})")
        ax1.fill_between(x, mean - half, mean + half, color=color, alpha=0.15, lw=0)
        grid = np.linspace(max(r[0][0] for r in rewards), min(r[0][-1] for r in rewards), 100)
        mean, half = band([np.interp(grid, t, r) for t, r in rewards])
        ax2.plot(grid, mean, color=color, label=label)
        ax2.fill_between(grid, mean - half, mean + half, color=color, alpha=0.15, lw=0)
    n = sorted({len(d) for d in runs.values()})
    accuracy_label += ", evaluation subset" if subset else ""
    ax1.set(xlabel="training wall-clock (min)", ylabel=accuracy_label,
            title=f"held-out accuracy (mean, 95% t-band over n = {'/'.join(map(str, n))} seeds)")
    ax2.set(xlabel="training wall-clock (min)", ylabel="mean reward (15-step moving avg)",
            title="training reward, over the prompts each method rolled out\n(pruning changes them: compare a method "
                  "with itself, not across methods)")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, name, out)
    return fig

def proportional_summary(ratios: pd.DataFrame) -> pd.DataFrame:
    """Per (rule, rate) over the report batches of proxies.csv: median, min and max of variance / the uniform rule's,
    the batches below it, the batches below it at every rate, and the batch count (F3's third panel and its CSV)."""
    by = ratios.groupby(["rule", "rate"])["ratio"]
    summary = by.agg(["median", "min", "max"])
    summary["batches_below_uniform"] = by.apply(lambda d: int((d < 1).sum()))
    worst = ratios.groupby(["rule", "batch_seed"])["ratio"].max()
    summary = summary.join((worst < 1).groupby("rule").sum().rename("batches_below_at_every_rate"), on="rule")
    return summary.assign(batches=ratios["batch_seed"].nunique())


def figure_f3(results_dir: str | Path, name: str = "F3_gradient_variance", out: Path = FIGURES,
              rules: list[str] | None = None):
    """Variance (relative to ||grad L||^2) vs rate, measured and closed form; bias in standard errors; and, from
    proxies.csv (or proportional.csv, the summary an earlier F3 wrote: a redraw) when present, each of `rules`
    (proportional rules by name; default: the library's, TrainConfig's `size_proxy` and `uniform_mix`), |A| alone
    and the oracle against the uniform rule over the report batches (median, min-max band). Its numbers go beside it: <name>.csv (variance.csv) and <name>_proportional.csv (per rule
    and rate over the report batches: median, min, max of variance / the uniform rule's, batches below it)."""
    plt = _plt()
    df = pd.read_csv(Path(results_dir) / "variance.csv")
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / f"{name}.csv", index=False)
    proxies, summary = Path(results_dir) / "proxies.csv", None
    if proxies.exists():
        summary = proportional_summary(pd.read_csv(proxies).query("split == 'report'"))
        summary.to_csv(out / f"{name}_proportional.csv")
    elif (Path(results_dir) / "proportional.csv").exists():  # a summary written beside an earlier F3 (redraw)
        summary = pd.read_csv(Path(results_dir) / "proportional.csv", index_col=["rule", "rate"])
    fig, axes = plt.subplots(1, 3 if summary is not None else 2, figsize=(15 if summary is not None else 10, 4.2))
    ax1, ax2 = axes[:2]
    for est, style in (("DPPO (r_q = r_o = r)", "o-"), ("DPPO prompt only (r_q = r)", "s-"),
                       ("DPPO completion only (r_o = r)", "^-"), ("DPPO proportional (same budget)", "D-"),
                       ("DPPO oracle (same budget)", "*-")):
        d = df[(df["estimator"] == est) & (df["rate"] > 0)]  # r = 0 has variance 0: off a log axis
        if d.empty:  # a CSV written before the proportional rule
            continue
        ax1.plot(d["rate"], d["variance_rel"], style, label=f"{est}, measured")
        ax1.plot(d["rate"], d["closed_form_variance"] / d["full_grad_sq"], "k:", lw=1)
    ax1.plot([], [], "k:", lw=1, label="closed form (docs/method.md §2)")
    ax1.set(yscale="log", xlabel="pruning rate r", ylabel="tr Cov[grad L_hat] / ||grad L||^2",
            title="variance (log scale)")
    ax1.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    norm = df["full_grad_sq"] ** 0.5
    for est in ("DPPO (r_q = r_o = r)", "DPPO without 1/pi", "CPPO (P = r)"):
        d = df[(df["estimator"] == est) & (df["rate"] > 0)]
        ax2.plot(d["rate"], d["bias"] / norm[d.index], "o-", label=est)
    d = df[(df["estimator"] == "DPPO (r_q = r_o = r)") & (df["rate"] > 0)]
    ax2.plot(d["rate"], 3 * d["bias_se"] / norm[d.index], "k:", lw=1, label="3 Monte-Carlo s.e. (DPPO)")
    greso = df[df["estimator"] == "GRESO"]
    if len(greso):
        ax2.axhline(float(greso["bias"].iloc[0] / norm[greso.index[0]]), color="gray", ls="--", label="GRESO (no rate)")
    ax2.set(yscale="log", xlabel="pruning rate r", ylabel="||E[grad L_hat] - grad L|| / ||grad L||",
            title="bias (DPPO: Monte-Carlo noise only)")
    ax2.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    if summary is not None:
        if rules is None:
            from dppo.variance import rule_name

            rules = [rule_name()]
        ax3 = axes[2]
        for rule in dict.fromkeys([*(rules or []), "proportional, adv, mix 0", "oracle"]):  # in order, once each
            if rule not in summary.index.get_level_values("rule"):
                continue
            d = summary.loc[rule]
            line, = ax3.plot(d.index, d["median"], "o-", label=rule)
            ax3.fill_between(d.index, d["min"], d["max"], color=line.get_color(), alpha=0.15, lw=0)
        ax3.axhline(1.0, color="k", ls=":", lw=1, label="uniform rule (the paper's)")
        ax3.set(yscale="log", xlabel="pruning rate r", ylabel="variance / the uniform rule's",
                title=f"same budget, {int(summary['batches'].iloc[0])} report batches (median, range)")
        ax3.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    fig.tight_layout()
    save_figure(fig, name, out)
    return fig


def figure_f4(packing_dir: str | Path, results: str | Path = RESULTS, name: str = "F4_packing", out: Path = FIGURES):
    """Density and update throughput per layout (bench/packing.py; its numbers go beside the figure, <name>.csv), and
    per-step density of DPPO with and without Dense Prompt Packing (the T4 runs) when those exist."""
    plt = _plt()
    bench = pd.read_csv(Path(packing_dir) / "packing.csv")
    out.mkdir(parents=True, exist_ok=True)
    bench.to_csv(out / f"{name}.csv", index=False)
    dense = Path(results) / T4_RUNS["DPPO (prompt + completion, 1/pi, packing)"][2] / "seed0"
    nopack = Path(results) / T4_RUNS["without Dense Prompt Packing"][2] / "seed0"
    per_step = dense.joinpath("metrics.jsonl").is_file() and nopack.joinpath("metrics.jsonl").is_file()
    fig, axes = plt.subplots(1, 3 if per_step else 2, figsize=(14 if per_step else 10, 3.6))
    x = range(len(bench))
    axes[0].bar([i - 0.2 for i in x], bench["valid_token_density"], 0.4, label="valid tokens / slots")
    axes[0].bar([i + 0.2 for i in x], bench["loss_token_density"], 0.4, label="loss (completion) tokens / slots")
    axes[0].axhline(0.95, color="k", ls=":", lw=1, label="0.95 target")
    axes[0].set(xticks=list(x), ylabel="density", title="token density of one DPPO step's update", ylim=(0, 1.05))
    axes[0].set_xticklabels(bench["layout"], rotation=20)
    axes[0].legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2)
    spread = bench.get("update_tokens_per_s_std")  # over the bench's repetitions (absent in older CSVs)
    axes[1].bar(x, bench["update_tokens_per_s"], yerr=spread, capsize=3 if spread is not None else 0)
    axes[1].set(xticks=list(x), ylabel="completion tokens / s (fwd + bwd)",
                title="update throughput" + (" (mean ± s.d. of the repetitions)" if spread is not None else ""))
    axes[1].set_xticklabels(bench["layout"], rotation=20)
    if per_step:
        for label, d in (("DPPO + Dense Prompt Packing", dense), ("DPPO, padded", nopack)):
            df = load_run(d)
            df = df[df["step"] > 0]
            axes[2].plot(df["epoch"], df["density/valid_token"], label=label)
        axes[2].set(xlabel="epoch", ylabel="valid-token density", title="per training step", ylim=(0, 1.05))
        axes[2].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, name, out)
    return fig


def figure_f1(name: str = "F1_method_overview", out: Path = FIGURES):
    """Method overview: the DPPO step as a pipeline (docs/method.md §2-3)."""
    plt = _plt()
    from matplotlib.patches import FancyBboxPatch

    boxes = [
        ("look-ahead window\nof W prompts", "refill: cover prompts until the\nexpected rollout budget is full"),
        ("prompt stage", "history candidates kept\nw.p. pi_q = 1 - r_q"),
        ("rollout", "G completions per\nkept prompt"),
        ("full-group\nadvantages", "A = (r - mean) / (std + eps)\nbefore any completion pruning"),
        ("completion stage", "small-|A| candidates kept\nw.p. pi_o = 1 - r_o"),
        ("re-weight", "w = 1 / (pi_q pi_o),\nnormaliser fixed\nbefore the masks"),
        ("dense packing", "rows of <= C tokens,\nblock-diagonal attention"),
        ("update", "E[grad L_hat] = grad L\n(unbiased)"),
    ]
    fig, ax = plt.subplots(figsize=(20, 3.0))
    ax.set_xlim(0, len(boxes) * 2)
    ax.set_ylim(0, 2.2)
    ax.axis("off")
    for i, (title, body) in enumerate(boxes):
        x = i * 2 + 0.1
        ax.add_patch(FancyBboxPatch((x, 0.2), 1.6, 1.8, boxstyle="round,pad=0.05",
                                    fc="#dbe9f6" if i in (0, 1, 4, 5, 6) else "#f2f2f2", ec="#333333"))
        ax.text(x + 0.8, 1.6, title, ha="center", va="center", fontsize=9, weight="bold")
        ax.text(x + 0.8, 0.8, body, ha="center", va="center", fontsize=7)
        if i < len(boxes) - 1:
            ax.annotate("", xy=(x + 2.02, 1.1), xytext=(x + 1.68, 1.1),
                        arrowprops=dict(arrowstyle="->", lw=1.5, color="#333333"))  # dark: seaborn's edges are white
    ax.set_title("Dynamic Pruning Policy Optimization: one training step (shaded: what DPPO adds to GRPO)")
    save_figure(fig, name, out)
    return fig


def figure_t5(t5: pd.DataFrame, rates, name: str = "T5_sensitivity_heatmap", out: Path = FIGURES,
               noise_points: float = 15.0):
    """Heatmaps over the r_q x r_o grid: the wall-clock speed-up vs GRPO, and Pass@1 minus GRPO's (points). Fixed
    colour ranges (speed-up 1-3x; accuracy ±`noise_points`, T1's seed-to-seed 95% interval at CPU scale) so that a
    difference a single seed cannot resolve does not show as structure; the seed count is in the title."""
    plt = _plt()
    import seaborn as sns

    cells = {(rq, ro): t5.loc[f"r_q={rq}, r_o={ro}"] for rq in rates for ro in rates}
    seeds = int(t5["seeds"].min()) if "seeds" in t5 else 0
    base = float(t5.loc["GRPO", "acc/avg"]) if "GRPO" in t5.index else 0.0
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    panels = ((axes[0], "speedup", "speed-up vs GRPO, wall-clock (x)", dict(cmap="viridis", vmin=1.0, vmax=3.0), 0.0),
              (axes[1], "acc/avg", f"Pass@1 minus GRPO's {base:.1f}% (points)",
               dict(cmap="vlag", center=0.0, vmin=-noise_points, vmax=noise_points), base))
    for ax, col, title, scale, minus in panels:
        grid = pd.DataFrame([[float(cells[(rq, ro)][col]) - minus for ro in rates] for rq in rates],
                            index=[f"{r}" for r in rates], columns=[f"{r}" for r in rates])
        sns.heatmap(grid, annot=True, fmt=".2f" if col == "speedup" else "+.1f", ax=ax, **scale)
        ax.set(xlabel="completion pruning rate r_o", ylabel="prompt pruning rate r_q", title=title)
    if seeds:
        fig.suptitle(f"{seeds} seed{'s' if seeds > 1 else ''} per cell" + (
            f": accuracy differences within ±{noise_points:g} points are not resolved (colour range)" if seeds == 1
            else ""), fontsize=9)
    fig.tight_layout()
    save_figure(fig, name, out)
    return fig


def figure_f5(answers: pd.DataFrame, name: str = "F5_case_study", out: Path = FIGURES, top_k: int = 7):
    """Per seed (a row; its own problem) and method (a column): share of each sampled answer at each of the method's
    checkpoints (gold answer in green; the row's `top_k` most sampled answers over all methods by name, the rest
    pooled as 'other', with how many distinct answers it holds). Each question is shown whole with its seed; the title
    says the samples per checkpoint. Panels differ in length because each method saves a checkpoint every few of its
    own steps, and pruning methods take fewer steps per epoch."""
    import textwrap

    plt = _plt()
    answers = answers if "seed" in answers else answers.assign(seed=0)
    methods = list(dict.fromkeys(answers["method"]))
    seeds = list(dict.fromkeys(answers["seed"]))
    fig, axes = plt.subplots(len(seeds), len(methods), figsize=(3.4 * len(methods), 3.2 * len(seeds) + 0.6),
                             sharey=True, squeeze=False)
    palette = ["tab:blue", "tab:orange", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan",
               "tab:gray"]  # green = gold only
    width = int(14 * 3.4 * len(methods))
    heads = []
    for row, seed in zip(axes, seeds):
        a = answers[answers["seed"] == seed]
        top = a.groupby("answer")["count"].sum().sort_values(ascending=False).index[:top_k].tolist()
        gold = set(a.loc[a["correct"], "answer"])
        others = a.loc[~a["answer"].isin(top), "answer"].nunique()
        for ax, m in zip(row, methods):
            d = a[a["method"] == m]
            steps = sorted(d["step"].unique())
            bottom = [0.0] * len(steps)
            for j, ans in enumerate(top + ["other"]):
                mine = (d["answer"] == ans) if ans != "other" else ~d["answer"].isin(top)
                share = [float(d[(d["step"] == s) & mine]["count"].sum()) / float(d[d["step"] == s]["samples"].iloc[0])
                         for s in steps]
                color = "tab:green" if ans in gold else ("lightgray" if ans == "other" else palette[j % len(palette)])
                label = (f"{ans} (gold)" if ans in gold else f"other ({others} distinct answers)" if ans == "other"
                         else ans)
                ax.bar([str(s) for s in steps], share, bottom=bottom, color=color, label=label)
                bottom = [b + x for b, x in zip(bottom, share)]
            ax.set(title=m if len(seeds) == 1 else f"{m}, seed {seed}", xlabel="training step")
        row[0].set_ylabel("share of sampled answers")
        row[-1].legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
        question = textwrap.fill(f"seed {seed}: Q: " + " ".join(str(a["question"].iloc[0]).split()), width)
        heads.append(question.replace("$", r"\$") + f" (gold: {a['gold'].iloc[0]})")  # LaTeX shown as written
    fig.suptitle("\n".join(heads) + f"\n({int(answers['samples'].iloc[0])} samples per checkpoint; each method's own "
                 "checkpoints: pruning methods take fewer steps per epoch)", fontsize=8)
    fig.tight_layout()
    save_figure(fig, name, out)
    return fig
