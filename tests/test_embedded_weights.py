"""One embedded policy everywhere (dppo/model.py): the package ships both embedded models' weights, used whenever they
were built by this code; a damaged copy is refused; `DPPO_EMBEDDED_SOURCE=build` (or stale shipped weights) builds
locally instead."""

import json
import shutil

import pytest

from dppo import model as dppo_model
from dppo.model import (EMBEDDED_SPECS, SHIPPED_ROOT, embedded_model_dir, embedded_source, sha256_file,
                        shipped_model_dir, spec_hash)


@pytest.mark.parametrize("name", list(EMBEDDED_SPECS))
def test_shipped_weights_are_current_and_intact(name):
    """Fails when the code that builds the model (task, tokenizer, warm start, growth) changed without re-shipping:
    run `dppo build-model --ship` (rebuilds and ships both) and commit dppo/embedded/."""
    meta = json.loads((SHIPPED_ROOT / name / "warm_start.json").read_text())
    assert meta["spec_hash"] == spec_hash(EMBEDDED_SPECS[name]), "shipped weights are stale: re-ship them"
    assert meta["sha256"] == sha256_file(SHIPPED_ROOT / name / "model.safetensors")
    assert shipped_model_dir(name) == SHIPPED_ROOT / name
    if embedded_source() == "shipped":
        assert embedded_model_dir(name) == SHIPPED_ROOT / name
    if "grow_from" in EMBEDDED_SPECS[name]:  # grown from the shipped source model, not from some other build
        assert meta["grown_from"] == f"shipped {EMBEDDED_SPECS[name]['grow_from']}"


def test_the_embedded_fixture_is_the_shipped_policy(embedded):
    from safetensors.torch import load_file

    if embedded_source() == "build":
        pytest.skip("DPPO_EMBEDDED_SOURCE=build: the suite runs on a local build")
    shipped = load_file(str(SHIPPED_ROOT / "embedded" / "model.safetensors"))
    state = embedded[0].state_dict()
    assert all(state[k].equal(v) for k, v in shipped.items())


def _copy_shipped(tmp_path, monkeypatch):
    root = tmp_path / "shipped"
    shutil.copytree(SHIPPED_ROOT / "embedded", root / "embedded")
    monkeypatch.setattr(dppo_model, "SHIPPED_ROOT", root)
    monkeypatch.setenv("DPPO_EMBEDDED_SOURCE", "shipped")  # also when the suite runs on a local build
    return root / "embedded"


def test_a_damaged_shipped_copy_is_refused_in_one_line(tmp_path, monkeypatch):
    folder = _copy_shipped(tmp_path, monkeypatch)
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 1  # one flipped bit in the last weight
    (folder / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sha256") as err:
        dppo_model.embedded_model_dir("embedded")
    assert "\n" not in str(err.value)


def _fake_build(tmp_path, monkeypatch):
    """A cached build where embedded_model_dir looks for one (so no 10-minute build runs here)."""
    monkeypatch.setenv("DPPO_CACHE", str(tmp_path / "cache"))
    built = tmp_path / "cache" / f"embedded-{spec_hash(EMBEDDED_SPECS['embedded'])}"
    built.mkdir(parents=True)
    (built / "model.safetensors").write_bytes(b"stand-in")
    return built


def test_build_source_and_stale_shipped_weights_use_the_local_build(tmp_path, monkeypatch):
    built = _fake_build(tmp_path, monkeypatch)
    monkeypatch.setenv("DPPO_EMBEDDED_SOURCE", "build")
    assert dppo_model.embedded_model_dir("embedded") == built
    monkeypatch.setenv("DPPO_EMBEDDED_SOURCE", "shipped")
    folder = _copy_shipped(tmp_path, monkeypatch)
    meta = json.loads((folder / "warm_start.json").read_text())
    (folder / "warm_start.json").write_text(json.dumps({**meta, "spec_hash": "0" * 12}))  # built by other code
    assert dppo_model.shipped_model_dir("embedded") is None
    assert dppo_model.embedded_model_dir("embedded") == built


def test_a_bad_source_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("DPPO_EMBEDDED_SOURCE", "download")
    with pytest.raises(ValueError, match="DPPO_EMBEDDED_SOURCE must be one of"):
        embedded_model_dir("embedded")
