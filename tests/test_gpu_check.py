"""bench/gpu_check.sh, the one prepared GPU check, as a dry run on CPU: every check it can run here passes, what it
cannot is NOT AVAILABLE HERE (never passed) and the run exits 3 with the list; a broken tolerance makes it fail
(exit 1). A group that hangs or crashes fails its own checks and the run still ends, in time, with its table; so
does a run stopped by SIGTERM. The table comes back whole as files (json, md), the console stays short. The groups'
GPU limits add up to 8 minutes with the machine's start. The vLLM checks run in .venv-vllm (tests/test_vllm.py); the
same dry run in an environment that imitates the GPU image (no math-verify, no vLLM, the image's torch /
transformers / accelerate) is tests/test_gpu_image.py."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_check as gpu  # noqa: E402

CONSOLE = 12_000  # characters of a run's console that come back from a lent GPU node (docs/usage.md)


def table(stdout: str) -> dict[str, str]:
    """{check: verdict} of the console's short table."""
    rows = [[c.strip() for c in ln.strip().strip("|").split(" | ")] for ln in stdout.splitlines() if ln.startswith("| ")]
    return {r[0]: r[1] for r in rows[2:]}


def gpu_check(*args: str, out: Path, python: str = sys.executable, env: dict | None = None
              ) -> tuple[int, dict[str, str], str]:
    """(exit status, {check: verdict as in the json file}, console output) of bench/gpu_check.sh --device cpu."""
    env = {**os.environ, "PYTHON": python, **(env or {})}
    done = subprocess.run(["bash", "bench/gpu_check.sh", "--device", "cpu", "--out", str(out), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=1800)
    result = json.loads((out / "gpu_check.json").read_text())
    verdicts = {r["check"]: r["verdict"] for r in result["rows"] if r["verdict"]}
    return done.returncode, verdicts, done.stdout + done.stderr[-3000:]


def assert_dry_run(rc: int, verdicts: dict[str, str], out: str, folder: Path) -> None:
    """What the CPU dry run of an environment without vLLM and flash-attn must end with (also tests/test_gpu_image.py)."""
    assert rc == 3, out
    for name in ("torch", "dppo_imports", "reward_checker", "packed_fp32", "packed_bf16", "train", "fsdp_update"):
        assert verdicts[name] == "PASS", (name, out)
    absent = ("vllm", "flash_attn", "packed_flash", "update_memory", "mfu", "train_fsdp", *gpu.GROUPS["vllm"])
    for name in absent:
        assert verdicts[name].startswith("NOT AVAILABLE HERE ("), (name, out)
    assert set(verdicts) == {c for checks in gpu.GROUPS.values() for c in checks}, verdicts
    assert f"gpu_check: NOT AVAILABLE HERE (exit 3): 7 passed; not verified here: {', '.join(absent[:5])}" in out
    assert len(out) < CONSOLE / 2, len(out)  # the console is the short form; the files hold every row whole
    page = (folder / "gpu_check.md").read_text()
    assert all(f"| {name} " in page for name in verdicts) and "exit 3" in page
    assert (folder / "gpu_check.log").stat().st_size > 0  # the groups' own output, kept off the console
    assert table(out) == {k: v.split(" (")[0] for k, v in verdicts.items()}


def test_dry_run_passes_what_it_can_and_says_what_it_could_not(tmp_path):
    """The packed and FSDP2 groups with this environment's (the newest) versions; the whole dry run, train included,
    runs in the image-like environment (tests/test_gpu_image.py: `assert_dry_run`), the trainer here in
    tests/test_trainer.py."""
    rc, verdicts, out = gpu_check("--only", "packed", "--only", "fsdp", out=tmp_path)
    assert rc == 3, out
    for name in ("torch", "dppo_imports", "reward_checker", "packed_fp32", "packed_bf16", "fsdp_update"):
        assert verdicts[name] == "PASS", (name, out)
    assert verdicts["mfu"].startswith("NOT AVAILABLE HERE (a CPU's bf16 matrix rate"), out  # no bound holds on a CPU
    assert verdicts["vllm"] == "NOT AVAILABLE HERE (vLLM not importable: ModuleNotFoundError: No module named 'vllm')"
    assert verdicts["update_memory"] == "NOT AVAILABLE HERE (device memory is measured on CUDA only)"
    assert "train" not in verdicts and table(out) == {k: v.split(" (")[0] for k, v in verdicts.items()}
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["device"] == "cpu" and result["verdict"] == "NOT AVAILABLE HERE" and result["exit"] == 3
    fsdp = next(r["value"] for r in result["rows"] if r["check"] == "fsdp_update")  # FSDP2 at world size 1
    assert "sharded: True" in fsdp and "head tied: True" in fsdp and "cpu_ram_efficient_loading True" in fsdp, fsdp


def test_a_broken_tolerance_fails_the_check_and_the_script(tmp_path):
    rc, verdicts, out = gpu_check("--only", "packed", "--tolerance", "packed_fp32=1e-12", out=tmp_path)
    assert rc == 1 and verdicts["packed_fp32"] == "FAIL" and verdicts["packed_bf16"] == "PASS", out
    assert "gpu_check: FAIL (exit 1)" in out and "FAILED: packed_fp32;" in out and "train" not in verdicts


def test_verdicts_and_exit_codes():
    rep = gpu.Report(gpu.TOLERANCES)
    rep.info("device", "x")
    rep.passed("torch", "2.x")
    assert rep.verdict() == "PASS" and gpu.EXIT[rep.verdict()] == 0
    rep.na("vllm", "vLLM not importable")
    assert rep.verdict() == "NOT AVAILABLE HERE" and gpu.EXIT[rep.verdict()] == 3
    assert gpu.summary(rep) == "gpu_check: NOT AVAILABLE HERE (exit 3): 1 passed; not verified here: vllm"
    rep.check("packed_fp32", 1.0)  # over its tolerance
    assert rep.verdict() == "FAIL" and gpu.EXIT[rep.verdict()] == 1
    rep.check("mfu", float("nan"))  # a NaN never passes
    assert rep.names("FAIL") == ["packed_fp32", "mfu"]
    assert len(set(gpu.EXIT.values())) == 3 and 2 not in gpu.EXIT.values()  # 2: argparse's usage error


def test_the_groups_limits_add_up_to_eight_minutes_of_gpu_time_with_the_start():
    assert gpu.START_UP + sum(gpu.LIMITS.values()) + gpu.RESERVE <= gpu.GPU_SECONDS == 8 * 60
    assert gpu.BUDGET == sum(gpu.LIMITS.values()) + gpu.RESERVE  # the budget runs every group to its limit
    assert set(gpu.LIMITS) == set(gpu.GROUPS)
    assert gpu.time_limit(120, 500) == 120
    assert gpu.time_limit(120, 100) == 100 - gpu.RESERVE
    assert gpu.time_limit(120, gpu.RESERVE + gpu.MIN_GROUP - 1) is None  # not started
    shell = (ROOT / "bench/gpu_check.sh").read_text()  # the outer backstop is above the CPU dry run's budget
    assert int(shell.split("GPU_CHECK_TIMEOUT:-")[1].split("}")[0]) > gpu.BUDGET * gpu.CPU_SLOWDOWN


def run_timed(args: list[str], tmp_path, stop_after: str | None = None) -> tuple[int, list[tuple[float, str]], str]:
    """(exit status, [(seconds since start, line)] of stdout as it arrived, stderr's tail) of gpu_check.sh; with
    `stop_after`, SIGTERM once a stdout line containing it has arrived."""
    t0, lines = time.monotonic(), []
    with open(tmp_path / "stderr", "w+") as err:
        proc = subprocess.Popen(["bash", "bench/gpu_check.sh", "--device", "cpu", "--out", str(tmp_path / "out"),
                                 *args], cwd=ROOT, text=True, env={**os.environ, "PYTHON": sys.executable},
                                stdout=subprocess.PIPE, stderr=err)
        for line in proc.stdout:
            lines.append((time.monotonic() - t0, line))
            if stop_after and stop_after in line:
                proc.send_signal(signal.SIGTERM)  # as an outer timeout does
                stop_after = None
        rc = proc.wait(timeout=60)
        err.seek(0)
        return rc, lines, err.read()[-3000:]


def test_a_hung_and_a_crashed_group_fail_their_checks_and_the_run_still_ends_with_its_table(tmp_path):
    rc, lines, err = run_timed(["--only", "packed", "--only", "vllm", "--fault", "packed=crash", "--fault",
                                "vllm=hang", "--limit", "vllm=20"], tmp_path)
    out = "".join(line for _, line in lines)
    rows = {r["check"]: r for r in json.loads((tmp_path / "out/gpu_check.json").read_text())["rows"]}
    assert rc == 1 and "gpu_check: FAIL (exit 1)" in out, out + err
    assert lines[-1][0] < 150, lines[-1]  # the hung group was ended at its limit
    assert rows["vllm"]["verdict"].startswith("NOT AVAILABLE HERE"), out
    for name in gpu.GROUPS["packed"]:  # the group's process died without a word (as on a CUDA fault)
        assert rows[name]["verdict"] == "FAIL" and rows[name]["value"].startswith("exited with signal SIGABRT"), out
    for name in gpu.GROUPS["vllm"]:
        assert (rows[name]["value"], rows[name]["verdict"]) == ("timed out after 20 s", "FAIL"), out
    # each row is printed as soon as it is known: env's before the 20 s the hung group took, not with the table
    streamed = next(t for t, line in lines if line.startswith("[") and "reward_checker:" in line)
    tabled = next(t for t, line in lines if line.startswith("| check"))
    assert tabled - streamed > 15, lines


def test_sigterm_ends_the_running_group_and_writes_the_table(tmp_path):
    rc, lines, err = run_timed(["--only", "vllm", "--fault", "vllm=hang", "--limit", "vllm=300"], tmp_path,
                               stop_after="flash_attn:")
    rows = {r["check"]: r for r in json.loads((tmp_path / "out/gpu_check.json").read_text())["rows"]}
    assert rc == 1 and lines[-1][0] < 120, lines
    assert rows["torch"]["verdict"] == "PASS", lines
    for name in gpu.GROUPS["vllm"]:
        assert rows[name]["verdict"] == "FAIL" and rows[name]["value"].startswith("interrupted (SIGTERM)"), lines


def test_without_torch_the_run_still_ends_with_a_table_that_says_so(tmp_path):
    """An interpreter without torch (a failed bootstrap's .venv-gpu): the main process imports none, so the table
    still comes, every check fails, and no group is started after the env group finds no torch."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    done = subprocess.run(["bash", "bench/gpu_check.sh", "--device", "cpu", "--out", str(tmp_path / "out")], cwd=ROOT,
                          env={**os.environ, "PYTHON": str(venv / "bin/python")}, capture_output=True, text=True,
                          timeout=120)
    rows = {r["check"]: r for r in json.loads((tmp_path / "out/gpu_check.json").read_text())["rows"]}
    assert done.returncode == 1, done.stdout + done.stderr
    assert rows["torch"]["value"] == "not importable: ModuleNotFoundError: No module named 'torch'", rows["torch"]
    assert rows["train"]["value"] == "not run: no usable torch (the torch row)", rows["train"]


def fake_result(device: str, verdicts: dict[str, str], date: str = "2026-12-05 10:00 UTC") -> dict:
    rows = [{"check": c, "value": "v", "tolerance": "-", "verdict": v} for c, v in verdicts.items()]
    return {"date": date, "machine": "NVIDIA H200" if device == "cuda" else "cpu", "host": "h", "device": device,
            "python": "3.12", "verdict": "FAIL", "exit": 1, "summary": "s", "took_s": 1.0, "budget_s": 390,
            "rows": rows}


def test_docs_gpu_column_is_generated_from_the_returned_tables():
    """docs/where.md's "what has run where" says "not yet" for a GPU row exactly when no returned table
    (bench/gpu_check_results/*.json) ran one of its checks on CUDA; `--record` keeps it so."""
    text = (ROOT / "docs/where.md").read_text()
    assert gpu.regenerate_docs(text, gpu.returned_results()) == text, "docs/where.md: run bench/gpu_check.py --record"
    covered = {line.split(" | ")[0].removeprefix("| ").strip() for line in text.splitlines() if line.startswith("| ")}
    assert set(gpu.RAN_WHERE) <= covered  # every mapped row is in the table
    # a returned GPU table fills the rows its checks ran (PASS or FAIL), and only those; a CPU one fills none
    results = [fake_result("cuda", {"packed_bf16": "PASS", "train": "FAIL", "vllm_logprobs": "NOT AVAILABLE HERE (x)"}),
               fake_result("cpu", {"update_memory": "PASS"})]
    results = [r | {"file": f"{i}.json"} for i, r in enumerate(results)]
    filled = gpu.regenerate_docs(text, results)
    rows = {line.split(" | ")[0].removeprefix("| ").strip(): line.split(" | ")[-1] for line in filled.splitlines()
            if line.startswith("| ") and line.split(" | ")[0].removeprefix("| ").strip() in gpu.RAN_WHERE}
    assert rows["precision"].startswith("`packed_bf16` PASS, `train` FAIL (NVIDIA H200, 2026-12-05"), rows
    assert rows["vLLM"] == rows["memory plans"] == gpu.NOT_YET + " |", rows
    assert gpu.regenerate_docs(filled, []) == gpu.regenerate_docs(text, [])  # regenerating is idempotent


def test_record_files_a_returned_table_and_regenerates_the_docs(tmp_path, monkeypatch):
    docs = tmp_path / "where.md"
    docs.write_text((ROOT / "docs/where.md").read_text())
    monkeypatch.setattr(gpu, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(gpu, "DOCS", docs)
    returned = tmp_path / "gpu_check.json"
    returned.write_text(json.dumps(fake_result("cuda", {"update_memory": "PASS", "fsdp_update": "PASS"})))
    real = gpu.returned_results
    monkeypatch.setattr(gpu, "returned_results", lambda folder=tmp_path / "results": real(folder))
    assert gpu.main(["--record", str(returned)]) == 0
    assert gpu.main(["--record", str(returned)]) == 0  # a second run that day gets its own name
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == [
        "2026-12-05-nvidia-h200-2.json", "2026-12-05-nvidia-h200-2.md", "2026-12-05-nvidia-h200.json",
        "2026-12-05-nvidia-h200.md"]
    line = next(ln for ln in docs.read_text().splitlines() if ln.startswith("| memory plans |"))
    assert line.endswith("`update_memory` PASS (NVIDIA H200, 2026-12-05: [table](../bench/gpu_check_results/"
                         "2026-12-05-nvidia-h200.md)); `update_memory` PASS (NVIDIA H200, 2026-12-05: [table]"
                         "(../bench/gpu_check_results/2026-12-05-nvidia-h200-2.md)) |"), line
