"""The GPU check replayed in an environment that imitates the lent GPU node's image (docs/usage.md, "A GPU node
without a package index"): the image's torch, transformers and accelerate, no math-verify, no vLLM, no flash-attn,
dppo not installed, a `.venv-gpu` left by a failed bootstrap (a venv without torch), and math-verify only as the
wheels scripts/gpu_wheels.sh fetches. Run by ./run_tests.sh in `.venv-min` (`bash scripts/bootstrap.sh min`), whose
interpreter is the image's `python3` here; elsewhere skipped (the main environment has math-verify)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_gpu_check import assert_dry_run, gpu_check

ROOT = Path(__file__).resolve().parents[1]
IMAGE = {"torch": "2.11.", "transformers": "5.17.", "accelerate": "1.15."}  # the H200 image's (docs/usage.md)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("math_verify") is not None,
                                reason="needs the image-like environment .venv-min (run by ./run_tests.sh)")


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A copy of the checkout as it travels to the node (tracked and untracked-not-ignored files), with a torch-less
    .venv-gpu in it, the wheels gpu_wheels.sh fetches in its .whl/, and a PATH whose python3 is this interpreter."""
    root = tmp_path_factory.mktemp("node")
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    checkout = root / "checkout"
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            (checkout / name).write_bytes((ROOT / name).read_bytes())
    (checkout / "bench/gpu_check.sh").chmod(0o755)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(checkout / ".venv-gpu")], check=True)
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    (bin_dir / "python3").chmod(0o755)
    fetched = subprocess.run(["bash", "scripts/gpu_wheels.sh"], cwd=checkout, capture_output=True, text=True,
                             env={**os.environ, "PYTHON": sys.executable}, timeout=300)
    assert fetched.returncode == 0, fetched.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    return checkout, env


def test_this_interpreter_imitates_the_image():
    import accelerate
    import torch
    import transformers

    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "accelerate": accelerate.__version__}
    assert all(versions[k].startswith(v) for k, v in IMAGE.items()), versions
    for absent in ("math_verify", "vllm", "flash_attn"):
        assert importlib.util.find_spec(absent) is None, absent
    assert "site-packages" not in importlib.util.find_spec("dppo").origin  # the checkout's, as on the node


def test_the_wheels_fit_and_install_into_a_target_that_scores_rewards(node, tmp_path):
    checkout, env = node
    wheels = sorted((checkout / ".whl").glob("*.whl"))
    assert {w.name.split("-")[0] for w in wheels} == {"math_verify", "latex2sympy2_extended",
                                                      "antlr4_python3_runtime"}
    assert sum(w.stat().st_size for w in wheels) < 64 * 2**20
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site),
                    *map(str, wheels)], check=True, capture_output=True)
    code = ("from dppo.reward import math_reward; import math_verify; "
            "print(math_reward('\\\\boxed{\\\\frac{1}{2}}', '0.5'), math_reward('\\\\boxed{3}', '0.5'), "
            "math_verify.__file__)")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={**env, "PYTHONPATH": f"{site}:{checkout}"})
    assert done.returncode == 0, done.stderr
    right, wrong, where = done.stdout.split()
    assert (right, wrong) == ("1.0", "0.0") and where.startswith(str(site)), done.stdout


def test_the_documented_call_picks_the_interpreter_with_torch_and_ends_decisively(node, tmp_path):
    """`bash bench/gpu_check.sh --out DIR` exactly as docs/usage.md gives it for the node: no PYTHON, a .venv-gpu
    without torch beside python3 with torch (no CUDA here: the CPU dry run), the wheels installed first."""
    checkout, env = node
    done = subprocess.run(["bash", "bench/gpu_check.sh", "--out", str(tmp_path)], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=1800)
    out = done.stdout + done.stderr[-3000:]
    assert done.stdout.startswith(f"gpu_check.sh: python3 (Python {sys.version.split()[0]}), torch sees: cpu"), out
    from json import loads

    verdicts = {r["check"]: r["verdict"] for r in loads((tmp_path / "gpu_check.json").read_text())["rows"]
                if r["verdict"]}
    assert_dry_run(done.returncode, verdicts, out, tmp_path)
    rows = {r["check"]: r["value"] for r in loads((tmp_path / "gpu_check.json").read_text())["rows"]}
    assert "dppo-gpu-check-site" in rows["reward_checker"], rows["reward_checker"]  # the wheels', not an install
    assert rows["torch"].startswith(IMAGE["torch"]), rows["torch"]


def test_without_the_wheels_the_missing_checker_fails_in_one_line(node, tmp_path):
    checkout, env = node
    rc, verdicts, out = gpu_check("--only", "packed", out=tmp_path, python=sys.executable,
                                  env={"GPU_CHECK_WHEELS": str(tmp_path / "none"), "PYTHONPATH": ""})
    assert rc == 1 and verdicts["reward_checker"] == "FAIL", out
    assert verdicts["packed_fp32"] == verdicts["packed_bf16"] == "PASS", out
    assert "reward_checker: the reward's answer checker math-verify cannot be imported" in out, out
