"""The real profile (`./reproduce.sh --profile real`): the paper's tables on R1's real model. Every run of its studies
trains SmolLM2-135M-Instruct on the arithmetic task with R1's sampling and setup (one override set, read from R1's
YAML files, `dppo.studies.real_overrides`), T1 with all five methods; its dry run lists the runs and their estimated
minutes; its captions are made from the fields the runs train with."""

import dataclasses
import subprocess
from pathlib import Path

import pytest

from dppo import budget, results, studies
from dppo.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def real_runs(study: str) -> dict[str, TrainConfig]:
    return {str(out): cfg for out, (_, cfg) in budget.study_runs(study, "real").items()}


def _t1_every_row() -> dict:
    """The real profile's T1 layout with every row (REAL_T1_ROWS trains the headline pair of it)."""
    params = {**studies.real_params("main_results"), "rows": []}
    return studies.study_layouts("main_results", **studies.layout_params(params), report=lambda line: None)["T1"]


def test_every_real_profile_run_trains_r1s_model_and_task():
    """Every run but T3's larger rows (Gemma 3 270M: the next test); F3 trains none (it samples R1's config); T1 trains
    under the protocol's chosen lever, and F5 trains T1's methods again (3 seeds) in folders of its own, keeping a
    checkpoint every 4 steps."""
    lever = studies.PROTOCOL_LEVERS[studies.PROTOCOL_CHOICE]
    for study in studies.REAL_STUDIES:
        runs = real_runs(study)
        assert bool(runs) == (study not in studies.REAL_STUDY_MINUTES), study
        for out, cfg in runs.items():
            assert out.startswith("experiments/results/real/"), out
            if cfg.model_name_or_path == "gemma3-270m":
                assert study == "scale" and out.rsplit("/", 1)[0].endswith(("/grpo_large", "/dppo_large")), out
                continue
            assert (cfg.model_name_or_path, cfg.dataset, cfg.chat_template) == ("smollm2-135m", "arithmetic", True)
            size = (lever["train_size"], lever["epochs"]) if study in ("main_results", "case_study") else (64, 2)
            assert (cfg.train_size, cfg.epochs, cfg.prompts_per_step, cfg.temperature) == (*size, 8, 0.7), out
            # 1.6 GB a run: 36 runs filled a disk; F5's runs keep theirs, as weights only (the case study reads them)
            assert cfg.keep_checkpoints_after_final == (study == "case_study"), out
    t1 = studies.study_layouts("main_results", **studies.layout_params(studies.real_params("main_results")))["T1"]
    assert list(t1) == list(studies.REAL_T1_ROWS) == ["GRPO", "DPPO"]  # the headline pair (its other rows: not yet)
    f5 = real_runs("case_study")
    methods = ["grpo", "greso", "cppo", "dppo", "dppo_proportional"]
    assert sorted(out.split("/")[-2:] for out in f5) == sorted([m, f"seed{s}"] for m in methods for s in (0, 1, 2))
    t1_runs = {(sub.split("/")[-1], s): results._config(cfg, sub, **{**over, "seed": s})
               for cfg, over, sub in _t1_every_row().values() for s in (0, 1, 2)}
    for out, cfg in f5.items():  # T1's run of the method and seed field for field, but where it trains, what it keeps,
        # when it evaluates and GRPO's unread refill window (T1's GRPO is the protocol's run)
        t1_cfg = t1_runs[out.split("/")[-2], int(out.split("/")[-1][4:])]
        keeps = ("output_dir", "save_every", "keep_checkpoints", "keep_checkpoints_after_final", "eval_every",
                 "eval_before_train", "refill_window")
        assert dataclasses.replace(cfg, **{f: getattr(t1_cfg, f) for f in keeps}) == t1_cfg, out
        assert (cfg.save_every, cfg.keep_checkpoints, cfg.eval_every) == (4, 4, 1000)  # no evaluation but its own


def test_the_real_t1s_grpo_and_dppo_are_the_protocols_chosen_pair():
    """Under the real profile T1's GRPO and DPPO are the runs of the protocol's chosen lever (docs/method.md §6.4):
    the same folders, config for config, so T1 reuses them (the protocol's pairs trained in turn); its other rows
    train with the lever's setup (fields, evaluation subset and grid). Without that, the pair would be trained twice
    and T1's headline pair would not be the one P1 measured."""
    params = studies.real_params("main_results")
    t1 = _t1_every_row()
    pair = studies.protocol_runs()
    lever = studies.PROTOCOL_LEVERS[studies.PROTOCOL_CHOICE]

    def config(row, seed=0):
        cfg, over, sub = row
        return results._config(cfg, ROOT / sub / f"seed{seed}", **{**over, "seed": seed})
    for method in ("GRPO", "DPPO"):
        chosen = pair[f"{method}, lever {studies.PROTOCOL_CHOICE}"]
        assert t1[method][2] == chosen[2] and config(t1[method]) == config(chosen), method
    for label in ("GRESO", "CPPO", "DPPO, proportional"):
        cfg = config(t1[label])
        assert (cfg.train_size, cfg.epochs, cfg.lr, cfg.lr_scheduler_type) == \
            (lever["train_size"], lever["epochs"], lever["lr"], lever["lr_scheduler_type"]), label
        assert (cfg.eval_every, cfg.eval_subset_size) == (2, 128) and t1[label][2].startswith("main_results/")
    assert params["seeds"][:len(studies.PROTOCOL_SEEDS)] == list(studies.PROTOCOL_SEEDS)  # P1's pairs, then more
    # the pair alone evaluates no initial model (the chosen lever's GRPO skipped it, the first lever's made it): T1's
    # start, and GRPO's learning, come from that run of the seed; with GRESO in the layout, from GRESO's
    pair_alone = studies.study_layouts("main_results", **studies.layout_params(params), report=lambda line: None)["T1"]
    first = next(iter(studies.PROTOCOL_LEVERS))
    assert studies.start_source(pair_alone) == (None if studies.PROTOCOL_CHOICE == first else f"protocol/{first}/grpo")
    assert studies.start_source(t1) is None


def test_the_real_t3s_larger_rows_train_the_gemma_config_and_every_row_one_layout():
    """T3 under the real profile: its Gemma rows train experiments/cpu/real_gemma_grpo.yaml field for field (but their
    folders, the study setup and each row's pruning), R1's overrides included where that file trains otherwise
    (chat_template: a base model has no chat turn); its SmolLM2 rows R1's; all four on the shared-prompt layout.
    Without the file's explicit `chat_template: false`, R1's chat turn would wrap Gemma's few-shot prompt."""
    params = studies.real_params("scale")
    t3 = studies.study_layouts("scale", **studies.layout_params(params))["T3"]
    small, large = params["model_labels"]
    gemma = TrainConfig.load(ROOT / params["large_config"])
    skip = {"output_dir", "seed", "refill_window", "keep_checkpoints_after_final", *studies.SETUP_FIELDS}
    for label in (f"GRPO, {large}", f"DPPO, {large}"):
        cfg_path, over, _ = t3[label]
        cfg = TrainConfig.load(ROOT / cfg_path, over)
        differ = {f.name for f in dataclasses.fields(TrainConfig) if f.name not in skip
                  and getattr(cfg, f.name) != getattr(gemma, f.name)}
        pruning = {"pruner", "prompt_prune_rate", "completion_prune_rate", "prune_sampling", "refill"}
        assert differ <= pruning and (label.startswith("DPPO") or not differ), (label, differ)
    for label in (f"GRPO, {small}", f"DPPO, {small}"):
        cfg = TrainConfig.load(ROOT / t3[label][0], t3[label][1])
        assert (cfg.model_name_or_path, cfg.chat_template, cfg.lr) == ("smollm2-135m", True, 3e-5), label
    assert {TrainConfig.load(ROOT / c, o).packing for c, o, _ in t3.values()} == {"shared"}


@pytest.mark.parametrize("profile", ["cpu", "real", "paper"])
def test_every_parameter_a_profile_passes_is_one_its_notebook_reads(profile):
    """papermill passes a parameter a notebook does not declare with a warning only, and the notebook never reads it:
    the real profile's T2 seeds (REAL_SEEDS) reached a notebook without a `seeds` parameter and trained seed 0 alone,
    while the dry run (which reads REAL_SEEDS) counted both seeds."""
    import papermill

    for study in studies.STUDIES:
        passed = studies.profile_params(study.name, profile)
        declared = papermill.inspect_notebook(str(ROOT / "notebooks" / f"{study.name}.ipynb"))
        assert set(passed) <= set(declared), (study.name, sorted(set(passed) - set(declared)))


def test_real_captions_are_made_from_the_runs_fields(monkeypatch):
    text = studies.caption("T2", "real")
    assert "smollm2-135m" in text and "64 training problems x 2 epochs" in text and "16 steps of 8 prompts" in text
    monkeypatch.setitem(studies.REAL_SETUP, "train_size", 128)
    assert "128 training problems x 2 epochs (GRPO: 32 steps" in studies.caption("T2", "real")
    lever = studies.PROTOCOL_LEVERS[studies.PROTOCOL_CHOICE]  # T1: the protocol's lever
    monkeypatch.setitem(lever, "train_size", 96)
    assert "96 training problems x 2 epochs (GRPO: 24 steps" in studies.caption("T1", "real")
    assert f"Protocol lever {studies.PROTOCOL_CHOICE}" in studies.caption("T1", "real")


def _reused(runs: dict[str, TrainConfig]) -> set[str]:
    """The runs a study skips here: finished by this code (a fresh clone: those whose run logs are committed), and
    F5's runs of a seed whose committed answers stand for them (`dppo.case_study.answered`: their weights are not
    committed)."""
    from dppo import case_study, results

    done = {out for out, cfg in runs.items() if results.reusable(cfg, ROOT / out)}
    for seed in {cfg.seed for cfg in runs.values()}:
        f5 = {out: cfg for out, cfg in runs.items() if cfg.seed == seed and "/case_study/" in out}
        if f5 and case_study.answered([(cfg, ROOT / out) for out, cfg in f5.items()], seed,
                                      results.study_root("", False, "real")):
            done |= set(f5)
    return done


def test_dry_run_lists_the_real_runs_and_their_minutes():
    done = subprocess.run(["bash", "reproduce.sh", "--profile", "real", "--dry-run"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    earlier: set[str] = set()
    for study in studies.REAL_STUDIES:
        alone = real_runs(study)
        # a run an earlier study trains (T5's GRPO and DPPO are T4's) counts there, a run finished here (its committed
        # log) not at all; the timing twins (a baseline again beside rows it cannot train with: T4's 7 runs a seed,
        # 6 fit on 24 GB) count too
        mine = {out: cfg for out, cfg in alone.items() if out not in earlier}
        reused = _reused(mine)
        twins = budget.timing_twins(study, "real", {Path(out) for out in earlier | reused})
        n = len(set(mine) - reused) + twins
        earlier |= set(alone)
        assert f"papermill notebooks/{study}.ipynb" in done.stdout
        line = next(ln for ln in done.stdout.splitlines() if ln.startswith(f"{study} "))
        assert f"{n:3d} runs ~{studies.real_minutes(study, n):.0f} min" in line, line
        assert (f"({twins} of them timing twins)" in line) == (twins > 0), line
        assert (f"; {len(reused)} finished runs reused" in line) == bool(reused), line
        # each study within 75 minutes on 2 cores, even trained again alone (--study NAME --retrain: every run of its
        # own); T1 within what its protocol's pairs cost (7 seeds of a pair trained in turn, ~16 min each under
        # lever a, ~29 under b), T2 (6 runs at 3 seeds, DAPO's dynamic sampling rounds included: 131 min measured)
        # within 135, T4 (8 rows and a timing twin at 2 seeds: 116 min measured) within 120, F5 (T1's five methods at
        # 3 seeds and their sampling) within 210 (its upper bound)
        alone_n = len(alone) + budget.timing_twins(study, "real", set())
        limit = {"main_results": 150, "algorithms": 135, "ablations": 120, "case_study": 210}.get(study, 75)
        assert studies.real_minutes(study, alone_n) <= limit, (study, alone_n)
    assert budget.timing_twins("ablations", "real", set()) == 2  # seed 0 and seed 1: [GRPO + 5 rows], [twin + 2 rows]
    total = next(ln for ln in done.stdout.splitlines() if ln.startswith("total "))
    minutes = {ln.split()[0]: int(ln.split("~")[1].split()[0]) for ln in done.stdout.splitlines() if " runs ~" in ln}
    assert int(total.split("~")[1].split()[0]) == pytest.approx(sum(v for k, v in minutes.items() if k != "total"),
                                                                abs=len(minutes))  # (each rounded)
    # T2 (3 seeds), T4 (2 seeds) and T5 within ~5.2 h with their timing twins (all three measured: 131 + 116 + 55
    # min, docs/results.md); the others' limits above
    assert sum(minutes[s] for s in ("algorithms", "ablations", "sensitivity")) <= 315, minutes


def test_reproduce_without_options_is_the_real_t1():
    """`./reproduce.sh` alone makes the main table on the real model (a baseline that learns): the real profile's T1
    over its seeds, nothing of the embedded studies; a run whose log is committed is reused, not trained (a fresh
    clone rebuilds T1 from its logs), and `--retrain` trains every one again; `--profile cpu` is the embedded
    default's every study."""
    plain = subprocess.run(["bash", "reproduce.sh", "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    again = subprocess.run(["bash", "reproduce.sh", "--retrain", "--dry-run"], cwd=ROOT, capture_output=True, text=True,
                           timeout=600)
    cpu = subprocess.run(["bash", "reproduce.sh", "--profile", "cpu", "--dry-run"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert plain.returncode == again.returncode == cpu.returncode == 0, (plain.stderr[-2000:], cpu.stderr[-2000:])
    runs = real_runs("main_results")
    assert len(runs) == len(studies.REAL_T1_ROWS) * len(studies.REAL_SEEDS["main_results"])
    for done, reused in ((plain, _reused(runs)), (again, set())):
        trained = {ln.split(" -> ")[1] for ln in done.stdout.splitlines() if "dppo train --config" in ln}
        skipped = {ln.split(" -> ")[1] for ln in done.stdout.splitlines() if "(finished by this code: reused)" in ln}
        assert skipped == reused and trained == set(runs) - reused, (trained, skipped)
        assert all(out.startswith(("experiments/results/real/main_results/", "experiments/results/real/protocol/"))
                   for out in trained | skipped)
    assert "experiments/results/real/" not in cpu.stdout and "papermill notebooks/packing.ipynb" in cpu.stdout


def test_a_fresh_clone_makes_t1_within_90_minutes():
    """Every T1 run's log is committed: `./reproduce.sh` on a fresh clone trains nothing and rebuilds T1 and F2 from
    them (bootstrap and tables within the 90 minutes a default run may take); trained again (`--retrain`), the pair's
    7 seeds take ~2.1 h."""
    plain = subprocess.run(["bash", "reproduce.sh", "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "experiments/results/real"], capture_output=True,
                             text=True, check=True).stdout.split()
    assert all(f"{out}/metrics.jsonl" in tracked for out in real_runs("main_results"))
    total = next(ln for ln in plain.stdout.splitlines() if ln.startswith("total "))
    assert int(total.split("~")[1].split()[0]) <= 85 and " 0 runs " in plain.stdout, plain.stdout[-500:]




def test_rows_names_a_tables_rows_and_refuses_others():
    """The `rows` parameter (the real profile's T1: its headline pair) keeps the rows it names; a label no table of the
    study has is a one-line error naming the allowed ones."""
    pair = studies.study_layouts("main_results", rows=["GRPO", "DPPO"], report=lambda line: None)["T1"]
    assert list(pair) == ["GRPO", "DPPO"]
    with pytest.raises(ValueError, match=r"rows: \['PPO'\] are not rows of main_results; allowed: \['GRPO'"):
        studies.study_layouts("main_results", rows=["PPO"], report=lambda line: None)
