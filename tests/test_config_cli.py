"""The CLI and the config: a real process's one-line error, algorithm presets and overrides, YAML round-trip, the
eval command (every other bad input: tests/test_bad_inputs.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

from dppo.cli import main
from dppo.config import ConfigError, TrainConfig

GRPO_YAML = str(Path(__file__).resolve().parents[1] / "experiments" / "cpu" / "grpo.yaml")


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
