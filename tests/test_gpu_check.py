"""bench/gpu_check.sh, the one prepared GPU check, as a dry run on CPU: every check it can run here passes, what it
cannot is SKIPPED (never passed), and a broken tolerance makes it fail (exit 1). A group that hangs or crashes fails
its own checks and the run still ends, in time, with its table; so does a run stopped by SIGTERM. On CUDA a missing
vLLM or flash-attn fails the paper path (tested on the decision itself). The vLLM checks run in .venv-vllm
(tests/test_vllm.py)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_check as gpu  # noqa: E402


def table(stdout: str) -> dict[str, tuple[str, str, str]]:
    """{check: (value, tolerance, verdict)} of the final table's rows with a verdict."""
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in stdout.splitlines() if ln.startswith("| ")]
    return {r[0]: tuple(r[1:]) for r in rows[2:] if r[3]}


def gpu_check(*args: str) -> tuple[int, dict[str, str], str]:
    """(exit status, {check: verdict}, output) of bench/gpu_check.sh --device cpu."""
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(["bash", "bench/gpu_check.sh", "--device", "cpu", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    return done.returncode, {k: v[2] for k, v in table(done.stdout).items()}, done.stdout + done.stderr[-3000:]


def test_dry_run_passes_what_it_can_and_skips_the_rest():
    rc, verdicts, out = gpu_check()
    assert rc == 0, out
    assert verdicts["packed_fp32"] == verdicts["packed_autocast"] == verdicts["train"] == "PASS", out
    assert verdicts["update_memory"].startswith("SKIPPED"), out
    assert verdicts["paper_path"].startswith("SKIPPED (vLLM and flash-attn not importable"), out
    for name in gpu.GROUPS["vllm"]:  # the main environment has no vLLM
        assert verdicts[name].startswith("SKIPPED (vLLM not importable)"), out
    assert "gpu_check: passed" in out


def test_a_broken_tolerance_fails_the_check_and_the_script():
    rc, verdicts, out = gpu_check("--only", "packed", "--tolerance", "packed_fp32=1e-12")
    assert rc == 1 and verdicts["packed_fp32"] == "FAIL" and verdicts["packed_autocast"] == "PASS", out
    assert "gpu_check: FAILED" in out and "train" not in verdicts


def run_timed(args: list[str], tmp_path, stop_after: str | None = None) -> tuple[int, list[tuple[float, str]], str]:
    """(exit status, [(seconds since start, line)] of stdout as it arrived, stderr's tail) of gpu_check.sh; with
    `stop_after`, SIGTERM once a stdout line containing it has arrived."""
    t0, lines = time.monotonic(), []
    with open(tmp_path / "stderr", "w+") as err:
        proc = subprocess.Popen(["bash", "bench/gpu_check.sh", "--device", "cpu", *args], cwd=ROOT, text=True,
                                env={**os.environ, "PYTHON": sys.executable}, stdout=subprocess.PIPE, stderr=err)
        for line in proc.stdout:
            lines.append((time.monotonic() - t0, line))
            if stop_after and stop_after in line:
                proc.send_signal(signal.SIGTERM)  # as an outer timeout does
                stop_after = None
        rc = proc.wait(timeout=60)
        err.seek(0)
        return rc, lines, err.read()[-3000:]


def test_a_hung_and_a_crashed_group_fail_their_checks_and_the_run_still_ends_with_its_table(tmp_path):
    rc, lines, err = run_timed(["--only", "packed", "--only", "update_memory", "--only", "vllm", "--fault",
                                "packed=crash", "--fault", "vllm=hang", "--limit", "vllm=20"], tmp_path)
    out = "".join(line for _, line in lines)
    rows = table(out)
    assert rc == 1 and "gpu_check: FAILED" in out, out + err
    assert lines[-1][0] < 150, lines[-1]  # the hung group was ended at its limit
    assert rows["paper_path"][2].startswith("SKIPPED") and rows["update_memory"][2].startswith("SKIPPED"), out
    for name in gpu.GROUPS["packed"]:  # the group's process died without a word (as on a CUDA fault)
        assert rows[name][2] == "FAIL" and rows[name][0].startswith("exited with signal SIGABRT"), out
    for name in gpu.GROUPS["vllm"]:
        assert rows[name] == ("timed out after 20 s", "-", "FAIL"), out
    # each row is printed as soon as it is known: env's before the 20 s the hung group took, not with the table
    streamed = next(t for t, line in lines if line.startswith("[") and "paper_path:" in line)
    tabled = next(t for t, line in lines if line.startswith("| check"))
    assert tabled - streamed > 15, lines


def test_sigterm_ends_the_running_group_and_prints_the_table(tmp_path):
    rc, lines, err = run_timed(["--only", "vllm", "--fault", "vllm=hang", "--limit", "vllm=300"], tmp_path,
                               stop_after="paper_path:")
    rows = table("".join(line for _, line in lines))
    assert rc == 1 and lines[-1][0] < 120, lines
    assert rows["paper_path"][2].startswith("SKIPPED"), lines
    for name in gpu.GROUPS["vllm"]:
        assert rows[name][2] == "FAIL" and rows[name][0].startswith("interrupted (SIGTERM)"), lines


def test_on_cuda_a_missing_vllm_or_flash_attn_fails_the_paper_path():
    verdict = gpu.paper_path_verdict
    assert verdict("cuda", True, True) == verdict("cpu", True, True) == "PASS"
    assert verdict("cuda", False, True) == verdict("cuda", True, False) == verdict("cuda", False, False) == "FAIL"
    assert verdict("cpu", False, True) == "SKIPPED (vLLM not importable)"
    assert verdict("cpu", True, False) == "SKIPPED (flash-attn not importable)"
    assert verdict("cpu", False, False) == "SKIPPED (vLLM and flash-attn not importable)"
    assert gpu.missing_verdict("cuda", "vLLM not importable") == "FAIL"  # the vLLM checks' rows too


def test_a_group_gets_its_limit_cut_to_the_budget_left():
    assert gpu.time_limit(120, 500) == 120
    assert gpu.time_limit(120, 100) == 100 - gpu.RESERVE
    assert gpu.time_limit(120, gpu.RESERVE + gpu.MIN_GROUP - 1) is None  # not started
    assert sum(gpu.LIMITS.values()) > gpu.BUDGET  # the budget, not the sum of the limits, bounds a run
