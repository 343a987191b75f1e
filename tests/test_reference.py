"""One declaration per config field (dppo/config.py `_f`): TrainConfig's checks, the pruners' settings, what a resume
may change, DPPOConfig (TRL) and docs/reference.md are all read from it; and the reference names every metric a step
logs."""

import dataclasses
import re
from pathlib import Path

import pytest

from dist_worker import FixedRollout

from dppo import reference
from dppo.config import PRUNER_FIELDS, RESUMABLE_CHANGES, ConfigError, TrainConfig, _f, declared, pruner_settings
from dppo.pruning import DPPO, PRUNERS
from dppo.runfiles import config_changes

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference.md"


def test_reference_page_is_generated_from_the_declarations():
    """docs/reference.md's field list is what `python -m dppo.reference` writes from TrainConfig today."""
    page = PAGE.read_text()
    assert reference.with_fields(page) == page, "docs/reference.md is stale: run python -m dppo.reference"
    for f in dataclasses.fields(TrainConfig):
        assert f"- `{f.name}` (" in page


@dataclasses.dataclass
class _Config(TrainConfig):
    """TrainConfig plus one new pruning field, declared once (as a maintainer would add it to TrainConfig)."""
    prompt_keep_floor: str = _f("pruning", "off", "A new pruning setting.", choices=("off", "on"), trl=True)


@dataclasses.dataclass
class _Pruner(DPPO):
    """A pruner that reads it: a dataclass field of the same name, nothing else."""
    prompt_keep_floor: str = "off"


def test_a_field_declared_once_reaches_the_checks_the_pruner_trl_and_the_docs():
    """The new field's one declaration is enough: the config rejects a value outside its choices in one line, the
    pruner built from the config gets it, it counts as a setting of that pruner only (so another pruner's config
    setting it is an error), a resume may not change it, DPPOConfig's fields and the reference page carry it."""
    with pytest.raises(ConfigError, match=r"^config field 'prompt_keep_floor' must be one of \['off', 'on'\]"):
        _Config(prompt_keep_floor="sometimes").validate()
    assert _Pruner.from_config(_Config(prompt_keep_floor="on")).prompt_keep_floor == "on"
    assert "prompt_keep_floor" in pruner_settings(_Pruner, _Config)
    assert "prompt_keep_floor" not in pruner_settings(DPPO, _Config)
    assert "prompt_keep_floor" in declared(_Config, section="pruning") and "prompt_keep_floor" in declared(_Config, trl=True)
    assert "prompt_keep_floor" not in declared(_Config, resumable=True)
    assert config_changes({"prompt_keep_floor": "off"}, {"prompt_keep_floor": "on"}, declared(_Config, resumable=True))
    assert "- `prompt_keep_floor` (str; default `'off'`; one of `'off'`, `'on'`; also in DPPOConfig): A new pruning " \
           "setting." in reference.fields_markdown(_Config)
    assert "| `mine` | " in reference.pruners_markdown({"mine": pruner_settings(_Pruner, _Config)}) and \
        "`prompt_keep_floor` |" in reference.pruners_markdown({"mine": pruner_settings(_Pruner, _Config)})
    trl = pytest.importorskip("dppo.trl")
    fields = {name: f for name, _, f in trl.dppo_fields(_Config)}
    assert fields["prompt_keep_floor"].default == "off" and fields["prompt_keep_floor"].metadata == {
        "help": "A new pruning setting.", "choices": ("off", "on")}
    assert {name for name, _, _ in trl.dppo_fields()} == set(declared(trl=True))
    declared_in_trl = {f.name: f for f in dataclasses.fields(trl.DPPOConfig)}
    for f in dataclasses.fields(TrainConfig):
        if f.metadata["trl"]:
            assert (declared_in_trl[f.name].default, declared_in_trl[f.name].metadata["help"]) == \
                (f.default, f.metadata["help"])


def test_the_declarations_are_what_the_package_reads():
    """Every pruner's settings have the config's defaults; a pruning field set away from its default with a pruner
    that does not read it is an error naming the pruners that do; a resume may change exactly the declared fields."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    for name, cls in PRUNERS.items():
        pruner = cls()
        for setting in PRUNER_FIELDS[name]:
            assert getattr(pruner, setting) == defaults[setting], (name, setting)
    with pytest.raises(ConfigError, match=r"^config field 'cppo_per_group' must be True with pruner dppo \(read by: "
                                          r"cppo\)"):
        TrainConfig(pruner="dppo", cppo_per_group=False).validate()
    with pytest.raises(ConfigError, match=r"^config field 'size_proxy' must be 'logit_rms' with pruner none"):
        TrainConfig(size_proxy="adv").validate()
    assert config_changes({"save_every": 1, "lr": 1.0}, {"save_every": 2, "lr": 2.0}, RESUMABLE_CHANGES) == \
        ["lr (1.0 -> 2.0)"]


def test_the_reference_names_every_metric_a_step_logs(tmp_path, embedded):
    """Each key of one DPPO step's record (KL on, two optimizer updates, so clip and approx-KL metrics appear) is
    named in docs/reference.md's metrics list: as itself, or as a `prefix/{a,b}` / `prefix/...` family."""
    from dppo.trainer import Trainer

    cfg = TrainConfig(output_dir=str(tmp_path / "run"), train_size=8, eval_size=2, prompts_per_step=4, group_size=4,
                      max_new_tokens=16, num_minibatches=2, kl_coef=0.05, pruner="dppo", completion_prune_rate=0.5,
                      eval_every=1000, save_every=1000, intra_op_threads=1)
    record = FixedRollout.install(Trainer(cfg)).train_step()
    text = PAGE.read_text().split("## Metrics", 1)[1]
    named = set(re.findall(r"`([^`]+)`", text))
    families = {m.split("/")[0] for m in named if "/" in m and ("{" in m or m.endswith("/..."))}
    missing = [k for k in record if k not in named and k.split("/")[0] not in families]
    assert not missing, f"metrics not in docs/reference.md: {missing}"
