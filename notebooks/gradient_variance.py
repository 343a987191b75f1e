# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # F3 — gradient variance and bias against the pruning rates
# One real batch of a policy (B prompts x G completions, rollouts fixed: the embedded model and task, or
# `config`'s model, task, prompts, temperature, length and reward), per-sample gradients of the clipped surrogate
# (+ `kl_coef` x k3 KL: 0, as every trained run), and many mask draws per estimator. A real model's per-sample
# gradients are streamed through a count sketch of `sketch_dim` buckets, never stored (docs/method.md §2.7). Measured variance (trace of the
# covariance of grad L_hat) is compared with the closed form of docs/method.md §2.7; measured bias (distance of the Monte-Carlo
# mean from the full-batch gradient, relative to its norm) is shown for DPPO beside biased DPPO (no 1/pi),
# CPPO and GRESO. Half of the B groups have zero reward variance, and every prompt's history is its own
# rollout (the next epoch's view), so those prompts are prompt-stage candidates. In GRPO a zero-variance
# group has zero advantage, so pruning it costs only its KL term's variance (none at kl_coef 0; docs/method.md §2.7). Beside the
# paper's uniform rule, the proportional rule (docs/method.md §2.10) spends the same expected budget with inclusion
# probabilities proportional to each item's gradient-size proxy, and the oracle spends it in proportion to each
# row's true gradient norm (what any proxy could reach). The last part compares every proxy with the uniform rule
# and the oracle over many batches: the default proxy is chosen on `selection_batches` batches and reported on
# `report_batches` others.

# %% tags=["parameters"]
import os

prompts = 8  # B
group_size = 8  # G
rates = [0.0, 0.3, 0.5, 0.7, 0.9]  # the rate of each point of F3 (r_q and r_o both)
draws = 3000  # mask draws per estimator and rate
seed = 0  # rollout seed of the batch above; the selection batches start here too
selection_batches = 10  # batches the default size proxy and mixture are chosen on (seeds from `seed`)
report_batches = 10  # batches the proxies are reported on (seeds from `report_seed`), never used to choose
report_seed = 100  # rollout seed of the first report batch
mixes = [0.0, 0.1, 0.25]  # uniform_mix values compared (lambda: pi is (1 - lambda) x proportional + lambda x uniform)
kl_coef = 0.0  # beta of the measured loss: the trained runs' (experiments/cpu/*.yaml and the paper recipes: 0)
config = ""  # a run config (experiments/...yaml) whose model and task the batches come from; "": the embedded
# model and task, 48 new tokens at temperature 1
pool = 8  # prompts rolled out for a batch, as a multiple of `prompts` (the batch keeps half its groups zero-variance
# from them; the real model, with ~40% of its groups zero-variance, needs fewer: rollouts are most of a batch's time)
sketch_dim = 0  # k > 0: each per-sample gradient streamed into a count sketch of k buckets (K estimated without
# bias, each quadratic form within a relative standard deviation sqrt(2 / k)); 0: the exact Gram matrix
results_dir = ""  # results under <profile root>/results_dir (root: experiments/results, or .../paper):
# the CSVs in <...>/gradient_variance, F3 in <...>/figures; "": the root, and figures/ (paper: figures/paper)
smoke = os.environ.get("DPPO_SMOKE") in ["1"]  # seconds-long sizes (the tests set DPPO_SMOKE to 1)
profile = "cpu"  # "paper": results under experiments/results/paper, tables and figures in figures/paper

# %%
from pathlib import Path

import pandas as pd
import torch
from IPython.display import Markdown, display

from dppo import figures, results, studies, variance
from dppo.studies import ROOT
from dppo.config import TrainConfig
from dppo.model import load_policy
from dppo.pruning import CPPO, DPPO, GRESO, BiasedDPPO

if smoke:
    prompts, group_size, rates, draws = 3, 4, [0.0, 0.5], 300
    selection_batches, report_batches, mixes = 2, 2, [0.0, 0.25]
data_dir = results.study_root(results_dir, smoke, profile) / "gradient_variance"  # the CSVs
DEFAULT = {"size_proxy": TrainConfig.size_proxy, "uniform_mix": TrainConfig.uniform_mix}  # the library's defaults
cfg = TrainConfig.load(ROOT / config) if config else None  # the task, prompts, sampling and reward of its runs
model, tok = load_policy(cfg.model_name_or_path if cfg else "embedded")
name = cfg.model_name_or_path if cfg else "embedded"
print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters; K "
      f"{'sketched, k = ' + str(sketch_dim) if sketch_dim else 'exact'}")
# the selection batches; the first (rollout seed `seed`, or the next seed whose prompts give half the groups with zero
# reward variance) is the batch of the Monte-Carlo part
selection = variance.sample_batches(model, tok, selection_batches, seed, prompts, group_size, kl_coef, cfg,
                                   sketch_dim, pool)
batch_seed, batch = selection[0]
rewards, adv, gram, kl = batch["rewards"], batch["adv"], batch["gram"], batch["kl"]
lengths = torch.tensor(batch["lengths"]).view(prompts, group_size)
logit_grad, oracle_sizes = batch["logit_grad"], variance.oracle_inputs(gram, group_size)
history = variance.history_from(rewards, adv, batch["lengths"])
print(f"batch seed {batch_seed}, rewards per prompt:", rewards.mean(1).tolist())

# %%
rows = []
for r in rates:
    settings = {
        "DPPO (r_q = r_o = r)": DPPO(prompt_prune_rate=r, completion_prune_rate=r),
        "DPPO proportional (same budget)": DPPO(prompt_prune_rate=r, completion_prune_rate=r, inclusion="proportional",
                                                kl_coef=kl_coef, kl_estimate=kl, **DEFAULT),
        "DPPO oracle (same budget)": variance.OracleDPPO(prompt_prune_rate=r, completion_prune_rate=r, inclusion="proportional"),
        "DPPO prompt only (r_q = r)": DPPO(prompt_prune_rate=r),
        "DPPO completion only (r_o = r)": DPPO(completion_prune_rate=r),
        "DPPO without 1/pi": BiasedDPPO(prompt_prune_rate=r, completion_prune_rate=r),
        "CPPO (P = r)": CPPO(completion_prune_rate=r, cppo_allocation=False),
    }
    for name, pruner in settings.items():
        sizes = oracle_sizes if "oracle" in name else logit_grad  # the oracle's true norms travel in this slot
        seen = variance.history_from(rewards, adv, batch["lengths"], pruner.completion_size(adv, lengths, sizes)) \
            if getattr(pruner, "inclusion", "") == "proportional" else history  # the proxy's sizes at the last visit
        stats = variance.bias_and_variance(variance.coefficients(pruner, rewards, seen, draws, seed, lengths, sizes),
                                           gram)
        exact = variance.closed_form_variance(gram, pruner, seen, rewards, adv, lengths, sizes) \
            if isinstance(pruner, DPPO) and not isinstance(pruner, BiasedDPPO) else {}
        rows.append({"estimator": name, "rate": r, **stats, "closed_form_variance": exact.get("variance"),
                     "expected_kept": exact.get("kept"), "expected_rolled": exact.get("rolled")})
greso = GRESO()  # GRESO has no rate: its skip probability comes from the zero-variance streaks
stats = variance.bias_and_variance(variance.coefficients(greso, rewards, history, draws, seed), gram)
rows.append({"estimator": "GRESO", "rate": float("nan"), **stats, "closed_form_variance": None})
df = pd.DataFrame(rows)
df["bias_in_se"] = df["bias"] / df["bias_se"].clip(lower=1e-9 * df["full_grad_sq"] ** 0.5)  # r = 0: both ~0
df["variance_rel"] = df["variance"] / df["full_grad_sq"]
df["commit"] = results.training_commit()  # the code that measured it (F3 trains no run: its numbers are its log)
data_dir.mkdir(parents=True, exist_ok=True)
df.to_csv(data_dir / "variance.csv", index=False)
df.round(4)

# %% [markdown]
# The proportional rule against the uniform one at the same rate: the expected fractions of prompts rolled out (equal:
# the prompt stage spends the uniform rule's budget) and of rows kept (the completion stage spends the uniform rule's
# budget for whichever prompts were rolled out; the two rules roll out different prompts, so the fractions differ
# where those prompts' candidate counts do), and the variance ratio, measured and closed form.

# %%
pair = df[df["estimator"].isin(["DPPO (r_q = r_o = r)", "DPPO proportional (same budget)"]) & (df["rate"] > 0)]
ratio = pair.pivot(index="rate", columns="estimator",
                   values=["variance", "closed_form_variance", "expected_kept", "expected_rolled"])
comparison = pd.DataFrame({
    "rolled, uniform": ratio[("expected_rolled", "DPPO (r_q = r_o = r)")],
    "rolled, proportional": ratio[("expected_rolled", "DPPO proportional (same budget)")],
    "kept, uniform": ratio[("expected_kept", "DPPO (r_q = r_o = r)")],
    "kept, proportional": ratio[("expected_kept", "DPPO proportional (same budget)")],
    "variance ratio (measured)": ratio[("variance", "DPPO proportional (same budget)")]
    / ratio[("variance", "DPPO (r_q = r_o = r)")],
    "variance ratio (closed form)": ratio[("closed_form_variance", "DPPO proportional (same budget)")]
    / ratio[("closed_form_variance", "DPPO (r_q = r_o = r)")]})
comparison.to_csv(data_dir / "proportional_vs_uniform.csv")
comparison.round(3)

# %% [markdown]
# Checks: DPPO is unbiased at every rate (bias within 4 standard errors of 0, and DPPO's weights keep the
# Monte-Carlo mean on the full gradient), its measured variance matches the closed form (the proportional rule's and
# the oracle's too), and the variance grows with the rate. Whether the proportional rule's variance is below the uniform rule's is
# not asserted: it depends on how well its proxy tracks each row's gradient norm (docs/method.md §2.10), measured
# over many batches below.
# Every Monte-Carlo check is measured in its own standard errors, so it holds on whatever batch this machine's model
# samples: an unbiased mean lies beyond 4 standard errors with probability below 1e-4 (one dominant direction,
# normal approximation), a variance estimate beyond 5 of its standard errors below 1e-6. The exact versions
# (every mask enumerated) are tests/test_gradient.py's.

# %%
dppo = df[df["estimator"].str.startswith("DPPO (") | df["estimator"].str.contains("same budget")]
assert (dppo["bias_in_se"] < 4).all(), dppo
measured = dppo[dppo["rate"] > 0]
assert ((measured["variance"] - measured["closed_form_variance"]).abs()
        <= 5 * measured["variance_se"] + 1e-9 * (measured["closed_form_variance"] + measured["full_grad_sq"])).all(), \
    measured  # (a floor in |grad L|^2 units: at kl_coef 0 a batch whose prunable rows carry no gradient has variance 0)
uniform = measured[measured["estimator"].str.startswith("DPPO (")]
assert uniform["closed_form_variance"].is_monotonic_increasing  # exact: each 1/pi - 1 grows with the rate
# the prompt stage's expected budget (the completion stage's, given the rolled-out prompts: tests/test_pruning.py)
assert ((comparison["rolled, proportional"] - comparison["rolled, uniform"]).abs() < 1e-6).all(), comparison
prompt_only = df[df["estimator"].str.startswith("DPPO prompt only") & (df["rate"] > 0)]
# the prompt stage had candidates to prune; at kl_coef 0 they carry no gradient (zero reward variance: A = 0), so
# pruning them costs no variance at all, the prompt stage's whole saving is free (docs/method.md §2.7)
free = prompt_only["closed_form_variance"].abs() <= 1e-9 * uniform["closed_form_variance"].max()
assert free.all() if kl_coef == 0 else (prompt_only["closed_form_variance"] > 0).all(), prompt_only
# the estimators that drop work without re-weighting are measurably biased (DPPO without 1/pi, in its Monte-Carlo
# standard errors; CPPO is deterministic), and further from the full gradient than DPPO at every rate
for name in ("DPPO without 1/pi", "CPPO (P = r)"):
    biased = df[df["estimator"] == name].query("rate > 0").set_index("rate")
    assert (biased["bias_in_se"] > 4).all() and (biased["bias"] > uniform.set_index("rate")["bias"]).all(), biased

# %% [markdown]
# ## Size proxies over many batches
# Each batch: closed-form variance (exact, no Monte-Carlo) of the uniform rule and, at the same budget, of the
# proportional rule with every size proxy and mixture lambda, and of the oracle; ratio = variance / the uniform
# rule's. The default (proxy, lambda) is the one with the smallest worst ratio over the selection batches and rates
# (the rule is for the batches where a proxy misleads; the median breaks ties), then reported on batches it never
# saw. Rank correlation: Spearman's, of each proxy with the true per-row gradient norm.

# %%
report = variance.sample_batches(model, tok, report_batches, report_seed, prompts, group_size, kl_coef, cfg,
                                sketch_dim, pool)
ratios, correlations = [], []
for split, batches in (("selection", selection), ("report", report)):
    for batch_seed, b in batches:
        ratios += [{"split": split, "batch_seed": batch_seed, **row}
                   for row in variance.rule_variances(b, [r for r in rates if r > 0], mixes, kl_coef)]
        correlations.append({"split": split, "batch_seed": batch_seed, **variance.proxy_correlations(b, kl_coef)})
ratios, correlations = pd.DataFrame(ratios), pd.DataFrame(correlations)
ratios.to_csv(data_dir / "proxies.csv", index=False)
correlations.to_csv(data_dir / "proxy_correlations.csv", index=False)
candidates = ratios[(ratios["split"] == "selection") & ratios["rule"].str.startswith("proportional")]
score = candidates.groupby("rule")["ratio"].agg(worst="max", median="median").sort_values(["worst", "median"])
chosen = score.index[0]
default = variance.rule_name(**DEFAULT)
print(f"chosen on {len(selection)} selection batches: {chosen}; the library's default: {default}")
score.round(3).head(6)

# %%
reported = ratios[ratios["split"] == "report"]


def summary(d: pd.DataFrame) -> str:
    return f"{d.median():.2f} [{d.min():.2f}, {d.max():.2f}] {int((d < 1).sum())}/{len(d)}"


proxy_table = reported.groupby(["rule", "rate"])["ratio"].apply(summary).unstack("rate")
proxy_table.columns = [f"r = {r}: median [min, max], batches below uniform" for r in proxy_table.columns]
below = reported.pivot_table(index="batch_seed", columns="rule", values="ratio", aggfunc="max") < 1
proxy_table["below uniform at every rate"] = below.sum().astype(int).astype(str) + f"/{len(below)}"
proxy_table.to_csv(data_dir / "proxies_report.csv")
display(Markdown(proxy_table.to_markdown()))
correlations.groupby("split").median(numeric_only=True).drop(columns="batch_seed").round(2)

# %%
fig = figures.figure_f3(data_dir, out=results.figures_dir(results_dir, smoke, profile), rules=[default, chosen])

# %% [markdown]
# ## What this shows beside the paper

# %%
d = df[df["estimator"] == "DPPO (r_q = r_o = r)"].set_index("rate")
median_ratio = reported.groupby(["rule", "rate"])["ratio"].median()  # rule -> rate -> median over the report batches
display(Markdown(
    f"- DPPO's relative variance grows from {d['variance_rel'].drop(0.0).iloc[0]:.3f} at r = {d.index[1]} to "
    f"{d['variance_rel'].iloc[-1]:.3f} at r = {d.index[-1]}, matching the closed form within "
    f"{(d['variance'] / d['closed_form_variance'] - 1).abs().drop(0.0).max():.0%}; its bias stays within "
    f"{d['bias_in_se'].max():.1f} Monte-Carlo standard errors (unbiased), while DPPO without 1/pi sits "
    f"{df[df['estimator'] == 'DPPO without 1/pi'].query('rate > 0')['bias_in_se'].min():.0f}+ standard errors away.\n"
    f"- On this batch the proportional rule ({default}) at the same budget has "
    + ", ".join(f"{v:.2f}x at r = {r}" for r, v in comparison["variance ratio (measured)"].items())
    + " the uniform rule's variance (closed form: "
    + ", ".join(f"{v:.2f}x" for v in comparison["variance ratio (closed form)"]) + ").\n"
    f"- Over {len(report)} batches it never chose on, {default} is below the uniform rule at every rate on "
    f"{proxy_table.loc[default, 'below uniform at every rate']} batches (median ratio "
    + ", ".join(f"{v:.2f}x at r = {r}" for r, v in median_ratio[default].items())
    + "), the oracle's median " + ", ".join(f"{v:.2f}x" for v in median_ratio["oracle"])
    + f"; the previous proxy (|A| alone, `adv`, mix 0) is below on "
    f"{proxy_table.loc['proportional, adv, mix 0', 'below uniform at every rate']}. Chosen on the selection batches: "
    f"{chosen} (the library's default: {default}).\n"
    f"- *Paper:* {studies.PAPER['F3']}"))
