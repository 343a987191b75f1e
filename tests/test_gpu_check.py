"""bench/gpu_check.sh, the one prepared GPU check, as a dry run on CPU: every check it can run here passes, what it
cannot is SKIPPED (never passed), and a broken tolerance makes it fail (exit 1). The vLLM checks run in .venv-vllm
(tests/test_vllm.py)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def gpu_check(*args: str) -> tuple[int, dict[str, str], str]:
    """(exit status, {check: verdict}, output) of bench/gpu_check.sh --device cpu."""
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(["bash", "bench/gpu_check.sh", "--device", "cpu", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in done.stdout.splitlines()
            if ln.startswith("| ")]
    return done.returncode, {r[0]: r[3] for r in rows[2:] if r[3]}, done.stdout + done.stderr[-3000:]


def test_dry_run_passes_what_it_can_and_skips_the_rest():
    rc, verdicts, out = gpu_check()
    assert rc == 0, out
    assert verdicts["packed_fp32"] == verdicts["packed_autocast"] == verdicts["train"] == "PASS", out
    assert verdicts["update_memory"].startswith("SKIPPED"), out
    for name in ("vllm_logprobs", "vllm_follows"):  # the main environment has no vLLM
        assert verdicts[name].startswith("SKIPPED (vLLM not importable)"), out
    assert "gpu_check: passed" in out


def test_a_broken_tolerance_fails_the_check_and_the_script():
    rc, verdicts, out = gpu_check("--only", "packed", "--tolerance", "packed_fp32=1e-12")
    assert rc == 1 and verdicts["packed_fp32"] == "FAIL" and verdicts["packed_autocast"] == "PASS", out
    assert "gpu_check: FAILED" in out and "train" not in verdicts
