"""The real profile (`./reproduce.sh --profile real`): the paper's tables on R1's real model. Every run of its studies
trains SmolLM2-135M-Instruct on the arithmetic task with R1's sampling and setup (one override set, read from R1's
YAML files, `dppo.studies.real_overrides`), T1 with all five methods; its dry run lists the runs and their estimated
minutes; its captions are made from the fields the runs train with."""

import dataclasses
import subprocess
from pathlib import Path

import pytest

from dppo import budget, studies
from dppo.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def real_runs(study: str) -> dict[str, TrainConfig]:
    return {str(out): cfg for out, (_, cfg) in budget.study_runs(study, "real").items()}


def test_every_real_profile_run_trains_r1s_model_and_task():
    """Every run but T3's larger rows (Gemma 3 270M: the next test); F3 trains none (it samples R1's config); T1 trains
    under the protocol's chosen lever, and F5 trains T1's methods again (seed 0) in folders of its own, keeping a
    checkpoint every 4 steps."""
    lever = studies.PROTOCOL_LEVERS[studies.PROTOCOL_CHOICE]
    for study in studies.REAL_STUDIES:
        runs = real_runs(study)
        assert bool(runs) == (study not in studies.REAL_STUDY_MINUTES), study
        for out, cfg in runs.items():
            assert out.startswith("experiments/results/real/"), out
            if cfg.model_name_or_path == "gemma3-270m":
                assert study == "scale" and out.endswith(("grpo_large/seed0", "grpo_large/seed1", "dppo_large/seed0",
                                                          "dppo_large/seed1")), out
                continue
            assert (cfg.model_name_or_path, cfg.dataset, cfg.chat_template) == ("smollm2-135m", "arithmetic", True)
            size = (lever["train_size"], lever["epochs"]) if study in ("main_results", "case_study") else (64, 2)
            assert (cfg.train_size, cfg.epochs, cfg.prompts_per_step, cfg.temperature) == (*size, 8, 0.7), out
            # 1.6 GB a run: 36 runs filled a disk; F5's 5 runs keep theirs, as weights only (the case study reads them)
            assert cfg.keep_checkpoints_after_final == (study == "case_study"), out
    t1 = studies.study_layouts("main_results", **studies.layout_params(studies.real_params("main_results")))["T1"]
    assert list(t1) == ["GRPO", "GRESO", "CPPO", "DPPO", "DPPO, proportional"]
    f5 = real_runs("case_study")
    assert [out.split("/")[-2] for out in f5] == ["grpo", "greso", "cppo", "dppo", "dppo_proportional"]
    t1_runs = {out.split("/")[-2]: cfg for out, cfg in real_runs("main_results").items() if out.endswith("/seed0")}
    for out, cfg in f5.items():  # T1's seed-0 run of the method field for field, but where it trains, what it keeps,
        t1_cfg = t1_runs[out.split("/")[-2]]  # and GRPO's unread refill window (T1's GRPO is the protocol's run)
        keeps = ("output_dir", "save_every", "keep_checkpoints", "keep_checkpoints_after_final", "eval_every",
                 "eval_before_train", "refill_window")
        assert dataclasses.replace(cfg, **{f: getattr(t1_cfg, f) for f in keeps}) == t1_cfg, out
        assert (cfg.save_every, cfg.keep_checkpoints, cfg.seed) == (4, 4, 0)


def test_the_real_t1s_grpo_and_dppo_are_the_protocols_chosen_pair():
    """Under the real profile T1's GRPO and DPPO are the runs of the protocol's chosen lever (docs/method.md §6.4):
    the same folders, config for config, so T1 reuses them (the protocol's pairs trained in turn); its other rows
    train with the lever's setup (fields, evaluation subset and grid). Without that, the pair would be trained twice
    and T1's headline pair would not be the one P1 measured."""
    from dppo import results

    params = studies.real_params("main_results")
    t1 = studies.study_layouts("main_results", **studies.layout_params(params), report=lambda line: None)["T1"]
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
    assert params["seeds"] == list(studies.PROTOCOL_SEEDS)


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


def test_dry_run_lists_the_real_runs_and_their_minutes():
    done = subprocess.run(["bash", "reproduce.sh", "--profile", "real", "--dry-run"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    earlier: set[str] = set()
    for study in studies.REAL_STUDIES:
        alone = set(real_runs(study))
        # a run an earlier study trains (T5's GRPO and DPPO are T4's) counts there; the timing twins (a baseline
        # again beside rows it cannot train with: T4's 7 runs a seed, 6 fit on 24 GB) count too
        twins = budget.timing_twins(study, "real", {Path(out) for out in earlier})
        n = len(alone - earlier) + twins
        earlier |= alone
        assert f"papermill notebooks/{study}.ipynb" in done.stdout
        line = next(ln for ln in done.stdout.splitlines() if ln.startswith(f"{study} "))
        assert f"{n:3d} runs ~{studies.real_minutes(study, n):.0f} min" in line, line
        assert (f"({twins} of them timing twins)" in line) == (twins > 0), line
        # each study within 75 minutes on 2 cores, even run alone (--study NAME: every run of its own)
        alone_n = len(alone) + budget.timing_twins(study, "real", set())
        assert studies.real_minutes(study, alone_n) <= 75, (study, alone_n)
    assert budget.timing_twins("ablations", "real", set()) == 2  # seed 0 and seed 1: [GRPO + 5 rows], [twin, 1 row]
    total = next(ln for ln in done.stdout.splitlines() if ln.startswith("total "))
    minutes = {ln.split()[0]: int(ln.split("~")[1].split()[0]) for ln in done.stdout.splitlines() if " runs ~" in ln}
    assert int(total.split("~")[1].split()[0]) == pytest.approx(sum(v for k, v in minutes.items() if k != "total"),
                                                                abs=len(minutes))  # (each rounded)
    # T1, T2, T4 and T5 within 4 h 10 min with bootstrap and tables: 4 h without the timing twins' 16 min
    # (docs/results.md); T3 and F3 (issue 59) each within 75 minutes, above
    assert sum(minutes[s] for s in ("main_results", "algorithms", "ablations", "sensitivity")) <= 250, minutes


def test_reproduce_without_options_is_the_real_t1():
    """`./reproduce.sh` alone trains the main table on the real model (a baseline that learns): the real profile's
    T1 over its seeds, nothing of the embedded studies, within the 90 minutes a default run may take; `--profile cpu`
    is the embedded default's every study."""
    plain = subprocess.run(["bash", "reproduce.sh", "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    cpu = subprocess.run(["bash", "reproduce.sh", "--profile", "cpu", "--dry-run"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert plain.returncode == 0 and cpu.returncode == 0, (plain.stderr[-2000:], cpu.stderr[-2000:])
    trained = [ln for ln in plain.stdout.splitlines() if "dppo train --config" in ln]
    assert len(trained) == len(real_runs("main_results")) == 5 * len(studies.REAL_SEEDS["main_results"]), trained
    assert all("experiments/results/real/main_results/" in ln for ln in trained), trained
    total = next(ln for ln in plain.stdout.splitlines() if ln.startswith("total "))
    assert int(total.split("~")[1].split()[0]) <= 85, total  # the estimate, with bootstrap and tables, within 90 min
    assert "experiments/results/real/" not in cpu.stdout and "papermill notebooks/packing.ipynb" in cpu.stdout
