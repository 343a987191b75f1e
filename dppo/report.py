"""Runs, tables and figures of the reproduction (docs/method.md §6). The notebooks call these; nothing here trains
by itself except `run`, which is `dppo train` with a smoke switch and a skip for finished runs.

Wall-clock is the sum of `timing_s/step` (training steps; evaluation excluded), so runs compare on the
work they do, not on how often they were evaluated. Speed-up = baseline train time / method train time at
the same number of epochs, in three currencies (docs/method.md §5.1): wall-clock, process CPU time (`cpu_s/step`:
other jobs stretch wall time, not CPU time, unless threads oversubscribe and spin) and FLOPs (`flops/step`,
deterministic). A run whose CPU/wall
ratio (cores it actually used) is below 3/4 of the table's median is flagged `contended`: its wall-clock
speed-up is not to be trusted. Accuracy is the final Pass@1 (%) averaged over the six held-out splits.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from dppo.config import ConfigError, TrainConfig
from dppo.trainer import Trainer, load_data, read_metrics

FIGURES = Path("figures")
SPLITS = ("level1", "level2", "level3", "level4", "level5", "ood")

# docs/method.md §1: what the paper reports (Qwen3, MATH, 8xH100, verl + vLLM). Printed beside our numbers.
PAPER = {
    "T1": "Qwen3-4B on MATH: DPPO 2.37x training speed-up over GRPO and +3.36 points average accuracy "
          "(GRESO and CPPO faster than GRPO but less accurate than DPPO).",
    "T2": "1.64x-2.45x speed-up across GRPO / DAPO / GSPO with DPPO on Qwen3-4B/8B, accuracy kept or improved.",
    "T3": "Up to +4.19 points on the largest model; up to 4.87x speed-up on the MoE model (Qwen3-30B-A3B).",
    "T4": "Both pruning levels contribute; removing the 1/pi re-weighting or Dense Prompt Packing hurts "
          "accuracy or speed respectively.",
    "T5": "Gradient variance bounded for r_q, r_o <= 0.7 and modestly higher at r_q = r_o = 0.9; speed-up grows "
          "with the rates.",
    "F3": "Variance bounded for r <= 0.7, modestly higher at 0.9; CPPO / GRESO estimates are biased.",
    "F4": "Dense Prompt Packing keeps batches full of valid tokens after pruning.",
    "F5": "Cauchy-Schwarz case study: CPPO and GRESO converge to the wrong answer 1/2, DPPO finds 55.",
}

# Study layouts: item -> {label: (config, overrides, run folder under the results root)}. The study
# notebooks train these; paper_figures reads them back. One source of truth for both.
RESULTS = Path("experiments/results")
# 640 problems x 3 epochs = 120 steps (the YAML files' 1000 problems take 188 steps: ./reproduce.sh fits 60 min);
# every checkpoint stays for the case study (F5).
_KEEP = {"train_size": 640, "keep_checkpoints": 10, "save_every": 25}
T1_RUNS = {
    "GRPO": ("experiments/cpu/grpo.yaml", _KEEP, "main_results/grpo"),
    "GRESO": ("experiments/cpu/greso.yaml", _KEEP, "main_results/greso"),
    "CPPO": ("experiments/cpu/cppo.yaml", _KEEP, "main_results/cppo"),
    "DPPO": ("experiments/cpu/dppo.yaml", _KEEP, "main_results/dppo"),
    "DPPO, proportional": ("experiments/cpu/dppo_proportional.yaml", _KEEP, "main_results/dppo_proportional"),
}
# T2-T5 share short runs (256 problems x 2 epochs = 32 steps: the second epoch is where the prompt
# stage has history to prune with), so each is a few minutes on 2 CPU cores.
SHORT = {"train_size": 256, "epochs": 2, "eval_every": 1000}
_G, _D = "experiments/cpu/grpo.yaml", "experiments/cpu/dppo.yaml"
_ON = {"GRPO": (_G, SHORT, "short/grpo"), "DPPO": (_D, SHORT, "short/dppo")}  # on-policy short runs, shared
# T2 runs off-policy (4 minibatch updates per step, as verl's PPO mini-batches): on-policy, the sequence-level
# ratio of GSPO and GRPO's token ratios are both 1 and their gradients coincide, so GSPO would equal GRPO.
T2_RUNS = {f"{alg.upper()}{' + DPPO' if d else ''}": (_D if d else _G, {**SHORT, "algorithm": alg,
                                                                        "num_minibatches": 4},
                                                       f"short/mb4_{alg}{'_dppo' if d else ''}")
           for alg in ("grpo", "dapo", "gspo") for d in (False, True)}
T4_RUNS = {
    "GRPO": _ON["GRPO"],
    "DPPO (prompt + completion, 1/pi, packing)": _ON["DPPO"],
    "prompt stage only": (_D, {**SHORT, "completion_prune_rate": 0.0}, "short/dppo_prompt_only"),
    "completion stage only": (_D, {**SHORT, "prompt_prune_rate": 0.0}, "short/dppo_completion_only"),
    "without 1/pi weights": (_D, {**SHORT, "pruner": "dppo_biased"}, "short/dppo_biased"),
    "without Dense Prompt Packing": (_D, {**SHORT, "packing": "none", "refill": "none"}, "short/dppo_nopack"),
    "proportional inclusion (same budget)": ("experiments/cpu/dppo_proportional.yaml", SHORT,
                                             "short/dppo_proportional"),
}
T5_RATES = (0.3, 0.5, 0.7)


def t5_runs(rates=T5_RATES) -> dict:
    """T5 layout: GRPO and DPPO at every (r_q, r_o) of the grid."""
    return {"GRPO": _ON["GRPO"], **{
        f"r_q={rq}, r_o={ro}": (_D, {**SHORT, "prompt_prune_rate": rq, "completion_prune_rate": ro},
                                "short/dppo" if (rq, ro) == (0.5, 0.5) else f"short/dppo_rq{rq}_ro{ro}")
        for rq in rates for ro in rates}}


T5_RUNS = t5_runs()
T3_RUNS = {
    "GRPO, embedded (0.8 M)": _ON["GRPO"],
    "DPPO, embedded (0.8 M)": _ON["DPPO"],
    "GRPO, embedded-large (1.6 M)": (_G, {**SHORT, "model_name_or_path": "embedded-large"}, "short/grpo_large"),
    "DPPO, embedded-large (1.6 M)": (_D, {**SHORT, "model_name_or_path": "embedded-large"}, "short/dppo_large"),
}
SHORT_CAPTION = ("CPU scale, short runs: embedded model, 256 training problems x 2 epochs (32 steps of 16 prompts x 8 "
                 "completions), seed 0, 2 CPU cores; accuracy = final Pass@1 (%) over 6 held-out splits (64 problems x "
                 "4 samples); speed-up vs GRPO in training-step seconds. Single seed: accuracy differences of a few "
                 "points are within run-to-run noise at this scale.")
T2_NOTE = (" T2 runs are off-policy: 4 minibatch updates per step (on-policy, GSPO's gradient equals GRPO's)."
           " Speed-up of X + DPPO is against X.")
T1_CAPTION = ("Main results at CPU scale: embedded Qwen3-architecture model (0.8 M parameters), synthetic math task "
              "(640 training problems x 3 epochs = 120 steps of 16 prompts x 8 completions, seed 0, 2 CPU cores). "
              "Accuracy: final Pass@1 (%) over 6 held-out splits (64 problems x 4 samples each); train_s: "
              "training-step seconds (evaluation excluded); speed-up vs GRPO at equal epochs.")


def runs_of(layout: dict, root: str | Path = RESULTS) -> dict[str, Path]:
    """{label: run folder} of a study layout under a results root."""
    return {label: Path(root) / sub for label, (_, _, sub) in layout.items()}


def results_root(smoke: bool = False) -> Path:
    return RESULTS / "smoke" if smoke else RESULTS


SMOKE = dict(train_size=24, epochs=1, max_steps=2, eval_size=4, eval_samples=1, eval_every=1000, save_every=1000,
             prompts_per_step=8, group_size=4)


def figures_dir(smoke: bool = False) -> Path:
    """Where tables and figures go: figures/, or a scratch folder for smoke (test) runs."""
    return Path("experiments/results/smoke/figures") if smoke else FIGURES


def run(config: str | Path, output_dir: str | Path, smoke: bool = False, launch: dict | None = None,
        **overrides) -> Path:
    """Train `config` (YAML) into `output_dir` with field overrides; `smoke` shrinks it to seconds. In this
    process, or, with `launch` ({accelerate_config, num_processes}; `dppo.launch`), as its own `accelerate
    launch` over the local GPUs. A finished run (its `final/` exists and its config is unchanged) is not
    trained again."""
    fields = {**(SMOKE if smoke else {}), **overrides, "output_dir": str(output_dir)}
    cfg = TrainConfig.load(config, fields)
    out = Path(output_dir)
    before = _saved_config(out)
    same = before is not None and dataclasses.replace(before, resume=cfg.resume) == cfg
    if (out / "final").is_dir() and same:
        return out
    if not same:  # the study asks for another run than the folder holds: start it over, never resume it
        cfg = dataclasses.replace(cfg, resume=False)
    if launch:
        from dppo.launch import launch_run

        launch_run(cfg, launch)
    else:
        Trainer(cfg).fit()
    return out


def _saved_config(out: Path) -> TrainConfig | None:
    """The config a run folder was made with (None: no run, or one of an older dppo that no longer loads)."""
    try:
        return TrainConfig.load(out / "config.yaml") if (out / "config.yaml").is_file() else None
    except ConfigError:
        return None


def load_run(run_dir: str | Path) -> pd.DataFrame:
    """metrics.jsonl as a frame, with `wall_s` = cumulative training seconds at the end of each step."""
    df = pd.DataFrame(read_metrics(Path(run_dir) / "metrics.jsonl"))
    df["wall_s"] = df.get("timing_s/step", pd.Series(0.0, index=df.index)).fillna(0.0).cumsum()
    return df


def summarize(run_dir: str | Path) -> dict:
    """One row: final accuracy per split and average (%), train seconds, steps, epochs, tokens, kept fractions."""
    df = load_run(run_dir)
    evals = df.dropna(subset=["eval/avg"])
    train = df[df["step"] > 0]
    row = {f"acc/{s}": evals.iloc[-1].get(f"eval/{s}") for s in SPLITS if f"eval/{s}" in evals}
    row.update({
        "acc/avg": evals.iloc[-1]["eval/avg"], "acc/start": evals.iloc[0]["eval/avg"],
        "train_s": float(train["timing_s/step"].sum()), "steps": int(train["step"].max()),
        "train_cpu_s": float(train["cpu_s/step"].sum()) if "cpu_s/step" in train else float("nan"),
        "train_flops": float(train["flops/step"].sum()) if "flops/step" in train else float("nan"),
        "epochs": float(train["epoch"].max()), "tokens/generated": int(train["tokens/generated"].sum()),
        "tokens/trained": int(train["tokens/trained"].sum()),
        "kept/prompt_frac": float(train["kept/prompt_frac"].mean()),
        "kept/completion_frac": float(train["kept/completion_frac"].mean()),
        "density/valid_token": float(train["density/valid_token"].mean()),
    })
    return row


def run_layout(layout: dict, smoke: bool = False, launch: dict | None = None, root: str | Path = "") -> dict[str, Path]:
    """Train every run of a study layout under `root` (default `results_root(smoke)`; finished runs are
    skipped); {label: run folder}."""
    root = Path(root) if root else results_root(smoke)
    return {label: run(cfg, root / sub, smoke=smoke, launch=launch, **over) for label, (cfg, over, sub) in layout.items()}


def study_layouts(study: str, configs: dict | None = None, overrides: dict | None = None,
                  large_model: str = "embedded-large", rates=T5_RATES) -> dict[str, dict]:
    """{table: layout} that a study notebook trains, from its papermill parameters (`configs` replaces T1's YAML
    files by label, `overrides` applies to every run, `large_model` is T3's larger model, `rates` T5's grid).
    The notebooks and the dry run (`dppo.budget`) both build their runs here."""
    configs, overrides = configs or {}, overrides or {}

    def apply(layout: dict, extra=lambda sub: {}) -> dict:
        return {k: (configs.get(k, cfg), {**over, **overrides, **extra(sub)}, sub) for k, (cfg, over, sub) in layout.items()}
    if study == "main_results":
        return {"T1": apply(T1_RUNS)}
    if study == "algorithms":
        return {"T2": apply(T2_RUNS)}
    if study == "scale":
        return {"T3": apply(T3_RUNS, lambda sub: {"model_name_or_path": large_model} if "large" in sub else {})}
    if study == "ablations":
        return {"T4": apply(T4_RUNS), "T5": apply(t5_runs(rates))}
    return {}


def compare(runs: dict[str, str | Path], baseline: str) -> pd.DataFrame:
    """Summaries of named runs with speed-up (baseline train_s / train_s) and accuracy gain over `baseline`."""
    df = pd.DataFrame({name: summarize(d) for name, d in runs.items()}).T
    df["speedup"] = df.loc[baseline, "train_s"] / df["train_s"]
    df["speedup_cpu"] = df.loc[baseline, "train_cpu_s"] / df["train_cpu_s"]
    df["speedup_flops"] = df.loc[baseline, "train_flops"] / df["train_flops"]
    cores = df["train_cpu_s"] / df["train_s"]  # cores the run actually used
    df["contended"] = cores < 0.75 * cores.median()
    df["acc_gain"] = df["acc/avg"] - df.loc[baseline, "acc/avg"]
    return df


def write_table(df: pd.DataFrame, name: str, caption: str, paper_key: str | None = None,
                out: Path = FIGURES) -> Path:
    """figures/<name>.csv and figures/<name>.md (caption, our numbers, the paper's beside them)."""
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / f"{name}.csv")
    md = [f"**{name}.** {caption}", "", df.to_markdown(floatfmt=".3g"), ""]
    if paper_key:
        md += [f"*Paper (reported, GPU scale):* {PAPER[paper_key]}", ""]
    (out / f"{name}.md").write_text("\n".join(md))
    return out / f"{name}.md"


def save_figure(fig, name: str, out: Path = FIGURES) -> list[Path]:
    """figures/<name>.png and .pdf."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    for p in paths:
        fig.savefig(p, bbox_inches="tight", dpi=150)
    return paths


# ------------------------------------------------------------------ figures
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    return plt


TABLE_COLUMNS = ["acc/avg", "acc_gain", "train_s", "speedup", "speedup_cpu", "speedup_flops", "contended", "steps", "epochs", "tokens/generated", "tokens/trained",
                 "kept/prompt_frac", "kept/completion_frac", "density/valid_token", *[f"acc/{s}" for s in SPLITS]]


def table(runs: dict[str, Path], baseline: str, name: str, caption: str, paper_key: str, out: Path = FIGURES
          ) -> pd.DataFrame:
    """compare() restricted to the reported columns, accuracies in %, written as csv + md."""
    df = compare(runs, baseline)
    for c in df.columns:
        if c.startswith("acc"):
            df[c] = df[c].astype(float) * 100
    df = df[[c for c in TABLE_COLUMNS if c in df.columns]]
    write_table(df, name, caption, paper_key, out)
    return df


def table_t2(runs: dict[str, Path], out: Path = FIGURES) -> pd.DataFrame:
    """T2: every run against GRPO, then each X + DPPO's speed-up against its own base algorithm X."""
    df = table(runs, "GRPO", "T2_algorithms", SHORT_CAPTION + T2_NOTE, "T2", out)
    for alg in ("DAPO", "GSPO"):
        df.loc[f"{alg} + DPPO", "speedup"] = df.loc[alg, "train_s"] / df.loc[f"{alg} + DPPO", "train_s"]
    write_table(df, "T2_algorithms", SHORT_CAPTION + T2_NOTE, "T2", out)
    return df


def table_t3(runs: dict[str, Path], out: Path = FIGURES) -> pd.DataFrame:
    """T3: each model size's DPPO run against GRPO on the same model."""
    caption = SHORT_CAPTION.replace("embedded model", "embedded (0.8 M) and embedded-large (1.6 M, twice the depth) "
                                    "models") + " Speed-up and accuracy gain of DPPO are against GRPO on the same model."
    df = table(runs, next(iter(runs)), "T3_scale", caption, "T3", out)
    for size in ("embedded (0.8 M)", "embedded-large (1.6 M)"):
        grpo, dppo = f"GRPO, {size}", f"DPPO, {size}"
        df.loc[dppo, "speedup"] = df.loc[grpo, "train_s"] / df.loc[dppo, "train_s"]
        df.loc[dppo, "acc_gain"] = df.loc[dppo, "acc/avg"] - df.loc[grpo, "acc/avg"]
        df.loc[grpo, ["speedup", "acc_gain"]] = [1.0, 0.0]
    write_table(df, "T3_scale", caption, "T3", out)
    return df


def figure_f2(runs: dict[str, str | Path], name: str = "F2_training_curves", out: Path = FIGURES):
    """Held-out accuracy and reward against training wall-clock, one line per method."""
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for label, d in runs.items():
        df = load_run(d)
        evals = df.dropna(subset=["eval/avg"])
        ax1.plot(evals["wall_s"] / 60, evals["eval/avg"] * 100, marker="o", ms=3, label=label)
        train = df[df["step"] > 0]
        ax2.plot(train["wall_s"] / 60, train["reward"].rolling(15, min_periods=1).mean(), label=label)
    ax1.set(xlabel="training wall-clock (min)", ylabel="Pass@1 (%), mean of 6 splits", title="held-out accuracy")
    ax2.set(xlabel="training wall-clock (min)", ylabel="mean reward (15-step moving avg)", title="training reward")
    ax1.legend()
    fig.tight_layout()
    save_figure(fig, name, out)
    return fig


def figure_f3(results_dir: str | Path, name: str = "F3_gradient_variance", out: Path = FIGURES):
    """Variance (relative to ||grad L||^2) vs rate, measured and closed form; bias in standard errors."""
    plt = _plt()
    df = pd.read_csv(Path(results_dir) / "variance.csv")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for est, style in (("DPPO (r_q = r_o = r)", "o-"), ("DPPO prompt only (r_q = r)", "s-"),
                       ("DPPO completion only (r_o = r)", "^-"), ("DPPO proportional (same budget)", "D-")):
        d = df[df["estimator"] == est]
        if d.empty:  # a CSV written before the proportional rule
            continue
        ax1.plot(d["rate"], d["variance_rel"], style, label=f"{est}, measured")
        ax1.plot(d["rate"], d["closed_form_variance"] / d["full_grad_sq"], "k:", lw=1)
    ax1.plot([], [], "k:", lw=1, label="closed form (docs/method.md §2)")
    ax1.set(xlabel="pruning rate r", ylabel="tr Cov[grad L_hat] / ||grad L||^2", title="variance")
    ax1.legend(fontsize=7)
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
    ax2.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, name, out)
    return fig


def figure_f4(packing_dir: str | Path, results: str | Path = RESULTS, name: str = "F4_packing", out: Path = FIGURES):
    """Density and update throughput per layout (bench/packing.py), and per-step density of DPPO with and
    without Dense Prompt Packing (the T4 runs) when those exist."""
    plt = _plt()
    bench = pd.read_csv(Path(packing_dir) / "packing.csv")
    dense = Path(results) / T4_RUNS["DPPO (prompt + completion, 1/pi, packing)"][2]
    nopack = Path(results) / T4_RUNS["without Dense Prompt Packing"][2]
    per_step = dense.joinpath("metrics.jsonl").is_file() and nopack.joinpath("metrics.jsonl").is_file()
    fig, axes = plt.subplots(1, 3 if per_step else 2, figsize=(14 if per_step else 10, 3.6))
    x = range(len(bench))
    axes[0].bar([i - 0.2 for i in x], bench["valid_token_density"], 0.4, label="valid tokens / slots")
    axes[0].bar([i + 0.2 for i in x], bench["loss_token_density"], 0.4, label="loss (completion) tokens / slots")
    axes[0].axhline(0.95, color="k", ls=":", lw=1, label="0.95 target")
    axes[0].set(xticks=list(x), ylabel="density", title="token density of one DPPO step's update", ylim=(0, 1.05))
    axes[0].set_xticklabels(bench["layout"], rotation=20)
    axes[0].legend(fontsize=7, loc="lower right")
    axes[1].bar(x, bench["update_tokens_per_s"])
    axes[1].set(xticks=list(x), ylabel="completion tokens / s (fwd + bwd)", title="update throughput")
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
            ax.annotate("", xy=(x + 2.02, 1.1), xytext=(x + 1.68, 1.1), arrowprops=dict(arrowstyle="->", lw=1.5))
    ax.set_title("Dynamic Pruning Policy Optimization: one training step (shaded: what DPPO adds to GRPO)")
    save_figure(fig, name, out)
    return fig


def figure_t5(t5: pd.DataFrame, rates, name: str = "T5_sensitivity_heatmap", out: Path = FIGURES):
    """Heatmaps of speed-up and accuracy over the r_q x r_o grid."""
    plt = _plt()
    import seaborn as sns

    cells = {(rq, ro): t5.loc[f"r_q={rq}, r_o={ro}"] for rq in rates for ro in rates}
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, col, title in ((axes[0], "speedup", "speed-up vs GRPO (x)"), (axes[1], "acc/avg", "Pass@1 avg (%)")):
        grid = pd.DataFrame([[float(cells[(rq, ro)][col]) for ro in rates] for rq in rates],
                            index=[f"{r}" for r in rates], columns=[f"{r}" for r in rates])
        sns.heatmap(grid, annot=True, fmt=".2f" if col == "speedup" else ".1f", cmap="viridis", ax=ax)
        ax.set(xlabel="completion pruning rate r_o", ylabel="prompt pruning rate r_q", title=title)
    fig.tight_layout()
    save_figure(fig, name, out)
    return fig


def case_study_answers(runs: dict[str, Path], split: str = "ood", samples: int = 32, seed: int = 0) -> pd.DataFrame:
    """F5 data: the `split` problem on which the methods' final models disagree most (by sampled accuracy),
    then for each method, at the initial model and at every kept checkpoint, the counts of its sampled
    final answers. Columns: method, step, answer, count, samples, correct, question."""
    import torch
    from safetensors.torch import load_file

    from dppo.model import load_policy
    from dppo.reward import extract_boxed, math_reward
    from dppo.rollout import HFRollout, SamplingParams

    cfg = TrainConfig.load(Path(next(iter(runs.values()))) / "config.yaml")
    problems = load_data(cfg)[1][split]
    model, tok = load_policy(cfg.model_name_or_path)
    model.to("cuda" if torch.cuda.is_available() else "cpu")
    engine = HFRollout(model, tok, 512)

    def sample(state: dict | None, prompts: list[str], n: int) -> list[str]:
        if state is not None:
            # checkpoints hold the trainer's TokenLogprobs ("policy." prefix); the tied lm_head is not stored
            missing, unexpected = model.load_state_dict(
                {k.removeprefix("policy."): v.to(model.device) for k, v in state.items()}, strict=False)
            assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            return engine.generate(prompts, SamplingParams(n=n, max_new_tokens=cfg.max_new_tokens)).texts

    initial = {k: v.clone() for k, v in model.state_dict().items()}
    finals = {m: load_file(str(Path(d) / "final" / "model.safetensors")) for m, d in runs.items()}
    acc = {}
    for m, state in finals.items():
        texts = sample(state, [p.prompt for p in problems], 8)
        acc[m] = [sum(math_reward(t, p.answer) for t in texts[i * 8:(i + 1) * 8]) / 8 for i, p in enumerate(problems)]
    spread = [max(a[i] for a in acc.values()) - min(a[i] for a in acc.values()) for i in range(len(problems))]
    problem = problems[max(range(len(problems)), key=lambda i: (spread[i], -i))]
    rows = []
    for m, d in runs.items():
        ckpts = sorted(Path(d).glob("checkpoints/step_*/model.safetensors"), key=lambda p: int(p.parent.name[5:]))
        points = [(0, initial)] + [(int(p.parent.name[5:]), load_file(str(p))) for p in ckpts]
        for step, state in points:
            counts: dict[str, int] = {}
            for t in sample(state, [problem.prompt], samples):
                a = extract_boxed(t) or "(none)"
                counts[a] = counts.get(a, 0) + 1
            rows += [{"method": m, "step": step, "answer": a, "count": c, "samples": samples,
                      "correct": math_reward(f"\\boxed{{{a}}}", problem.answer) > 0, "question": problem.prompt,
                      "gold": problem.answer}
                     for a, c in counts.items()]
    return pd.DataFrame(rows)


def figure_f5(answers: pd.DataFrame, name: str = "F5_case_study", out: Path = FIGURES):
    """Per method: share of each sampled answer at each checkpoint (gold answer in green)."""
    plt = _plt()
    methods = list(dict.fromkeys(answers["method"]))
    fig, axes = plt.subplots(1, len(methods), figsize=(3.4 * len(methods), 3.4), sharey=True, squeeze=False)
    top = answers.groupby("answer")["count"].sum().sort_values(ascending=False).index[:5].tolist()
    gold = set(answers.loc[answers["correct"], "answer"])
    palette = ["tab:blue", "tab:orange", "tab:red", "tab:purple", "tab:brown", "tab:pink"]  # green = gold only
    for ax, m in zip(axes[0], methods):
        d = answers[answers["method"] == m]
        steps = sorted(d["step"].unique())
        bottom = [0.0] * len(steps)
        labels = top + ["other"]
        for j, a in enumerate(labels):
            share = [float(d[(d["step"] == s) & ((d["answer"] == a) if a != "other" else ~d["answer"].isin(top))]
                           ["count"].sum()) / float(d[d["step"] == s]["samples"].iloc[0]) for s in steps]
            color = "tab:green" if a in gold else ("lightgray" if a == "other" else palette[j % len(palette)])
            ax.bar([str(s) for s in steps], share, bottom=bottom, color=color,
                   label=f"{a} (gold)" if a in gold else a)
            bottom = [b + x for b, x in zip(bottom, share)]
        ax.set(title=m, xlabel="training step")
    axes[0][0].set_ylabel("share of sampled answers")
    axes[0][-1].legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    fig.suptitle("Q: " + answers["question"].iloc[0].replace("\n", " ")[:160] + f"  (gold: {answers['gold'].iloc[0]})",
                 fontsize=8)
    fig.tight_layout()
    save_figure(fig, name, out)
    return fig
