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


def _fake_venv(tmp_path: Path, driver: str = "") -> tuple[Path, Path, dict]:
    """A venv whose python logs each call and whose pip fails on the second install with a resolver error; a fake
    nvidia-smi reporting `driver` (none when empty)."""
    venv, log, bin_dir = tmp_path / "venv", tmp_path / "calls.log", tmp_path / "bin"
    (venv / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    (venv / "bin" / "python").write_text(
        "#!/usr/bin/env bash\n"
        f"echo \"$*\" >> {shlex.quote(str(log))}\n"
        f"if [ \"$1 $2\" = '-m pip' ] && [ $(grep -c -- '-m pip' {shlex.quote(str(log))}) -ge 2 ]; then\n"
        "  echo 'ERROR: ResolutionImpossible: vllm 0.31.0 depends on torch==2.13.0' >&2; exit 1\nfi\nexit 0\n")
    (venv / "bin" / "python").chmod(0o755)
    if driver:
        (bin_dir / "nvidia-smi").write_text(f"#!/usr/bin/env bash\necho {driver}\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "DPPO_VENV": str(venv), "DPPO_GPU_VENV": str(venv), "HOME": str(tmp_path)}
    return venv, log, env


def test_bootstrap_stops_at_the_first_failed_pip_call_with_pips_error(tmp_path):
    """A resolver conflict (or a failed flash-attn build) ends scripts/bootstrap.sh at that pip call, pip's own error
    on screen — not as a line "not importable" after every later install ran (the old `pip ... || true`)."""
    root = Path(__file__).resolve().parents[1]
    _, log, env = _fake_venv(tmp_path)
    done = subprocess.run(["bash", str(root / "scripts/bootstrap.sh")], capture_output=True, text=True, env=env)
    assert done.returncode != 0
    assert "ResolutionImpossible" in done.stderr and "failed: pip install" in done.stderr, done.stderr
    calls = log.read_text().splitlines()
    assert sum(c.startswith("-m pip") for c in calls) == 2, calls  # pip upgrade, then the failing one: nothing after


def test_bootstrap_gpu_refuses_a_driver_too_old_for_the_pinned_torch(tmp_path):
    root = Path(__file__).resolve().parents[1]
    _, log, env = _fake_venv(tmp_path, driver="570.86.15")
    done = subprocess.run(["bash", str(root / "scripts/bootstrap.sh"), "gpu"], capture_output=True, text=True, env=env)
    assert done.returncode != 0 and "570.86.15 is older than 580" in done.stderr, done.stderr
    assert not any(c.startswith("-m pip install") and "vllm" in c for c in log.read_text().splitlines())
    _, _, env = _fake_venv(tmp_path / "none")
    done = subprocess.run(["bash", str(root / "scripts/bootstrap.sh"), "gpu"], capture_output=True, text=True, env=env)
    assert done.returncode != 0 and "no NVIDIA GPU" in done.stderr, done.stderr
