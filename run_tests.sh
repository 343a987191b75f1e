#!/usr/bin/env bash
# The test command: bootstraps .venv (and .venv-vllm, with vLLM for CPU) if needed, then runs the whole CPU test
# suite in the main environment, then the vLLM tests in theirs. Extra arguments go to the main pytest (e.g.
# ./run_tests.sh -k losses); DPPO_SKIP_VLLM=1 skips the vLLM environment. The smoke runs of an earlier suite
# (experiments/results/smoke) are removed first, and a run folder is reused only by the config and code that made it.
#
# The main suite runs in two parts: every test file on 2 workers (pytest-xdist, one file per worker at a time, one
# intra-op thread each: tests/conftest.py), then, alone on the machine, the tests marked `serial` (the study
# notebooks, which time paired runs and share their smoke runs; the contention and time-limit tests). .venv-vllm is
# set up meanwhile, in the background (its log is printed if it fails).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
bash scripts/bootstrap.sh
rm -rf experiments/results/smoke  # scratch runs of the notebook tests: every suite starts without old ones
vllm=0
if [ "${DPPO_SKIP_VLLM:-0}" != 1 ] && [ $# -eq 0 ]; then
  vllm=1 vllm_log="$(mktemp)"
  bash scripts/bootstrap.sh vllm > "$vllm_log" 2>&1 & vllm_setup=$!
  trap 'kill "$vllm_setup" 2>/dev/null || true' EXIT  # an interrupted suite leaves no install running
fi
failed=0
part() {  # one pytest run of the main suite; "no tests selected" (exit 5: e.g. -k naming tests of the other part) is not a failure
  local rc=0
  .venv/bin/python -m pytest "$@" || rc=$?
  [ "$rc" = 0 ] || [ "$rc" = 5 ] || failed=1
}
part -n 2 --dist loadfile -m "not serial" "$@"
if [ "$vllm" = 1 ]; then  # before the serial part, which must have the machine to itself
  if ! wait "$vllm_setup"; then
    cat "$vllm_log" >&2; echo "[run_tests] setting up .venv-vllm failed (its log above)" >&2; exit 1
  fi
  trap - EXIT
  cat "$vllm_log"
fi
part -m serial "$@"
if [ "$vllm" = 1 ]; then
  .venv-vllm/bin/python -m pytest -o addopts=-ra -p no:cacheprovider tests/test_vllm.py || failed=1
fi
exit "$failed"
