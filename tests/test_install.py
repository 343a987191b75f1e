"""What the README's install commands give a new user: `jupyter lab` in the environment, extras pip can resolve
(flash-attn is a documented separate step, never an extra that fails to build)."""

import json
import shlex
import subprocess
import sys
from importlib.metadata import requires
from pathlib import Path

import yaml


def test_jupyterlab_is_installed_with_the_notebooks():
    assert (Path(sys.executable).parent / "jupyter-lab").is_file()


def test_extras_name_no_package_that_cannot_build_from_pip():
    reqs = requires("dppo") or []
    assert not any(r.startswith("flash-attn") or r.startswith("flash_attn") for r in reqs), reqs
    assert any(r.startswith("datasets") and 'extra == "data"' in r for r in reqs)
    assert any(r.startswith("vllm") and 'extra == "gpu"' in r for r in reqs)
    # dppo.trl subclasses TRL internals: the extra pins the TRL minor it is tested against, and the tests install it
    assert any(r.startswith("trl==1.16.") and 'extra == "trl"' in r for r in reqs), reqs


ENV_TEST = "test_environment_yml_pip_part_resolves_in_a_fresh_virtualenv"


def start_environment_yml_resolution(workdir: Path) -> subprocess.Popen:
    """Resolve the pip part of environment.yml (what conda hands to pip) in a new virtualenv under `workdir`, against
    the package index, with every dependency (vLLM, CUDA torch) but no download of their wheels (`--dry-run
    --report`). Mostly network waits: conftest starts it when the test is collected, so it overlaps the suite."""
    root = Path(__file__).resolve().parents[1]
    env = yaml.safe_load((root / "environment.yml").read_text())
    pip_part = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert not any("flash" in p for p in pip_part)
    args = [a for p in pip_part for a in p.split()]
    py = workdir / "venv" / "bin" / "python"
    script = (f"{shlex.quote(sys.executable)} -m venv {shlex.quote(str(workdir / 'venv'))} && "
              f"{shlex.quote(str(py))} -m pip install --dry-run --quiet --report {shlex.quote(str(workdir / 'r.json'))} "
              + " ".join(shlex.quote(a) for a in args))
    return subprocess.Popen(["bash", "-c", script], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_environment_yml_pip_part_resolves_in_a_fresh_virtualenv(request, tmp_path):
    """conda cannot be installed here: pip resolves environment.yml's pip part in a fresh virtualenv (above);
    flash-attn stays a separate, documented step."""
    started = getattr(request.config, "_env_resolution", None)
    proc, workdir = started or (start_environment_yml_resolution(tmp_path), tmp_path)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    names = {i["metadata"]["name"].lower() for i in json.loads((workdir / "r.json").read_text())["install"]}
    assert {"dppo", "torch", "vllm", "datasets", "accelerate", "transformers", "pytest"} <= names, names
