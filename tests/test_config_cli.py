"""Bad configs get one-line errors naming the field; overrides and YAML round-trip."""

import subprocess
import sys
from pathlib import Path

import pytest

from dppo.cli import main
from dppo.config import ConfigError, TrainConfig

GRPO_YAML = str(Path(__file__).resolve().parents[1] / "experiments" / "cpu" / "grpo.yaml")


def _err(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("dppo: error: ")
    return err


@pytest.mark.parametrize("override, field", [
    (["--group_size", "1"], "group_size"),
    (["--algorithm", "ppo"], "algorithm"),
    (["--lr", "-1"], "lr"),
    (["--temperature", "0"], "temperature"),
    (["--top_p", "1.5"], "top_p"),
    (["--loss_agg", "sum"], "loss_agg"),
    (["--prompts_per_step", "abc"], "prompts_per_step"),
    (["--clip_low", "1.2"], "clip_low"),
    (["--dataset", "missing.jsonl"], "dataset"),
    (["--no_such_field", "3"], "no_such_field"),
    (["--pruner", "magic"], "pruner"),
    (["--prompt_prune_rate", "1.0"], "prompt_prune_rate"),
    (["--completion_prune_rate", "-0.1"], "completion_prune_rate"),
    (["--prune_sampling", "poisson"], "prune_sampling"),
    (["--scale_rewards", "sideways"], "scale_rewards"),
    (["--loss_normaliser", "kept"], "loss_normaliser"),
    (["--pruner", "cppo", "--loss_normaliser", "fixed"], "loss_normaliser"),  # unweighted baselines: covered only
    (["--prompt_prune_rate", "0.5"], "prompt_prune_rate"),  # pruner none would ignore it
    (["--pruner", "greso", "--completion_prune_rate", "0.5"], "completion_prune_rate"),
    (["--kl_bias_correction", "maybe"], "kl_bias_correction"),
])
def test_bad_field_gets_one_line_error(capsys, tmp_path, override, field):
    err = _err(capsys, ["train", "--config", GRPO_YAML, "--output_dir", str(tmp_path), *override])
    assert field in err


def test_missing_config_file(capsys):
    assert "nope.yaml" in _err(capsys, ["train", "--config", "nope.yaml"])


def test_empty_dataset_file(capsys, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    err = _err(capsys, ["train", "--dataset", str(empty), "--output_dir", str(tmp_path / "run")])
    assert "empty.jsonl" in err and "no records" in err


def test_cli_error_is_one_line_in_a_real_process(tmp_path):
    out = subprocess.run([sys.executable, "-m", "dppo.cli", "train", "--group_size", "1"], capture_output=True,
                         text=True)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["dppo: error: config field 'group_size' must be an integer >= 2, got 1"]


def test_algorithm_presets_and_overrides():
    assert TrainConfig(algorithm="dapo").loss_agg == "token-mean"
    assert TrainConfig(algorithm="dapo").clip_high == 0.28
    assert TrainConfig(algorithm="gspo").loss_type == "gspo"
    assert TrainConfig(algorithm="drgrpo").scale_rewards == "none" and TrainConfig().scale_rewards == "group"
    assert TrainConfig(algorithm="dapo", clip_high=0.3).clip_high == 0.3  # explicit values win
    cfg = TrainConfig.load(GRPO_YAML, {"group_size": "4", "resume": "false"})
    assert cfg.group_size == 4 and cfg.resume is False


def test_yaml_round_trip(tmp_path):
    cfg = TrainConfig(algorithm="drgrpo", kl_coef=0.05, seed=7)
    cfg.save(tmp_path / "c.yaml")
    assert TrainConfig.load(tmp_path / "c.yaml") == cfg
    with pytest.raises(ConfigError, match="eval_datasets"):
        TrainConfig(eval_datasets={"math500": str(tmp_path / "missing.jsonl")}).validate()


def test_eval_command_prints_every_split(capsys, embedded):
    assert main(["eval", "--config", GRPO_YAML, "--eval_size", "2", "--eval_samples", "1"]) == 0
    out = capsys.readouterr().out
    for split in ("level1", "level2", "level3", "level4", "level5", "ood", "avg"):
        assert f"{split}=" in out
