"""What a reader needs from each figure (dppo.figures), checked on the drawn matplotlib objects: arrows visible,
every line in a legend, intervals and seed counts stated, log axes where the claim is about small values, fixed
colour ranges for single-seed heatmaps, and no truncated text."""

import json
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")

from matplotlib.colors import to_rgba  # noqa: E402

from dppo import figures  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _legend_texts(ax) -> list[str]:
    legend = ax.get_legend()
    return [t.get_text() for t in legend.get_texts()] if legend else []


def test_f1_arrows_are_drawn_in_a_dark_colour(tmp_path):
    """seaborn's whitegrid style makes patch edges white: arrows left at the default vanish on the white page."""
    fig = figures.figure_f1(out=tmp_path)
    arrows = [a.arrow_patch for a in fig.axes[0].texts if getattr(a, "arrow_patch", None) is not None]
    assert len(arrows) == 7
    for arrow in arrows:
        r, g, b, _ = to_rgba(arrow.get_edgecolor())
        assert r + g + b < 1.5, arrow.get_edgecolor()


def _run(folder: Path, accs: list[float], step_s: float) -> Path:
    folder.mkdir(parents=True)
    lines = [{"step": 0, "eval/avg": accs[0]}]
    for i, acc in enumerate(accs[1:], 1):
        lines += [{"step": 2 * i - 1, "reward": 0.3, "timing_s/step": step_s},
                  {"step": 2 * i, "reward": 0.4, "timing_s/step": step_s, "eval/avg": acc}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return folder


def test_f2_names_the_baseline_line_the_band_and_both_panels(tmp_path):
    runs = {"GRPO": [_run(tmp_path / f"g{s}", [0.3, 0.35, 0.4 + 0.01 * s], 2.0) for s in range(3)],
            "DPPO": [_run(tmp_path / f"d{s}", [0.3, 0.36, 0.41 - 0.01 * s], 1.0) for s in range(3)]}
    fig = figures.figure_f2(runs, out=tmp_path / "out")
    left, right = fig.axes
    assert "GRPO final (mean)" in _legend_texts(left)
    assert "95%" in left.get_title() and "n = 3" in left.get_title()
    assert set(_legend_texts(right)) == {"GRPO", "DPPO"}
    assert "rolled out" in right.get_title()


def test_f3_from_the_committed_numbers_log_axes_and_legends_below(tmp_path):
    data = tmp_path / "in"
    data.mkdir()
    (data / "variance.csv").write_bytes((ROOT / "figures/F3_gradient_variance.csv").read_bytes())
    summary = pd.read_csv(ROOT / "figures/F3_gradient_variance_proportional.csv")
    summary.to_csv(data / "proportional.csv", index=False)
    fig = figures.figure_f3(data, out=tmp_path / "out")
    variance, bias, proportional = fig.axes
    assert variance.get_yscale() == bias.get_yscale() == proportional.get_yscale() == "log"
    assert f"{summary['batches'].iloc[0]} report batches" in proportional.get_title()
    for ax in fig.axes:  # legends under the axes, so no line (GRESO's) is hidden behind one
        anchor = ax.get_legend().get_bbox_to_anchor().transformed(ax.transAxes.inverted())
        assert anchor.y1 <= 0, ax.get_title()
    assert "GRESO (no rate)" in _legend_texts(bias)


@pytest.mark.parametrize("seeds", [1, 3])
def test_t5_states_the_speedup_kind_and_seeds_on_fixed_colour_ranges(tmp_path, seeds):
    t5 = pd.read_csv(ROOT / "figures/T5_sensitivity.csv", index_col=0).assign(seeds=seeds)
    fig = figures.figure_t5(t5, [0.3, 0.5, 0.7], out=tmp_path)
    speed, acc = fig.axes[:2]  # the two heatmaps (their colour bars are axes added after them)
    assert "wall-clock" in speed.get_title() and "GRPO" in acc.get_title()
    assert speed.collections[0].get_clim() == (1.0, 3.0)
    assert acc.collections[0].get_clim() == (-15.0, 15.0)
    title = fig._suptitle.get_text()
    assert f"{seeds} seed" in title and (("not resolved" in title) == (seeds == 1))


def test_f5_shows_the_whole_question_the_seed_and_the_samples(tmp_path):
    question = ("Lena buys " + " and then ".join(f"{k} boxes of {k + 3} pens" for k in range(1, 12)) +
                ". How many, with $0 \\le \\theta < 2 \\pi$?")  # MATH's LaTeX: no mathtext parse (\\le is not in it)
    rows = [dict(method=m, step=s, answer=a, count=c, samples=8, correct=a == "42", question=question, gold="42")
            for m, steps in (("GRPO", (0, 4, 8)), ("DPPO", (0, 4))) for s in steps
            for a, c in (("42", 3), ("41", 2), ("7", 1), ("9", 1), ("10", 1))]
    fig = figures.figure_f5(pd.DataFrame(rows), out=tmp_path, top_k=3)
    title = " ".join(fig._suptitle.get_text().replace("\\$", "$").split())
    assert " ".join(question.split()) in title and "seed 0" in title and "8 samples per checkpoint" in title
    assert "other (2 distinct answers)" in _legend_texts(fig.axes[-1]) and "42 (gold)" in _legend_texts(fig.axes[-1])


def test_f4_legend_clear_of_the_bars_and_the_spread_of_the_repetitions(tmp_path):
    bench = pd.read_csv(ROOT / "figures/F4_packing.csv")
    bench.assign(update_tokens_per_s_std=0.1 * bench["update_tokens_per_s"]).to_csv(tmp_path / "packing.csv", index=False)
    fig = figures.figure_f4(tmp_path, results=tmp_path, out=tmp_path / "out")
    density, throughput = fig.axes
    anchor = density.get_legend().get_bbox_to_anchor().transformed(density.transAxes.inverted())
    assert anchor.y1 <= 0
    bars = next(c for c in throughput.containers if hasattr(c, "patches"))
    assert bars.errorbar is not None and "s.d." in throughput.get_title()


def test_f5_has_a_row_per_seed_each_with_its_own_question(tmp_path):
    rows = [dict(seed=seed, method=m, step=s, answer=a, count=4, samples=8, correct=a == gold,
                 question=f"What is {gold} + 0?", gold=gold)
            for seed, gold in ((0, "11"), (1, "12"), (2, "13")) for m in ("GRPO", "DPPO") for s in (0, 4)
            for a in (gold, "9")]
    fig = figures.figure_f5(pd.DataFrame(rows), out=tmp_path)
    assert len(fig.axes) == 6 and fig.axes[2].get_title() == "GRPO, seed 1"
    title = fig._suptitle.get_text()
    assert all(f"seed {s}: Q: What is {g} + 0? (gold: {g})" in title for s, g in ((0, 11), (1, 12), (2, 13)))
    assert "11 (gold)" in _legend_texts(fig.axes[1]) and "13 (gold)" in _legend_texts(fig.axes[5])
