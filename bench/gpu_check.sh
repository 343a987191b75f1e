#!/usr/bin/env bash
# The paper path on one GPU with a verdict (bench/gpu_check.py): each group of checks runs in its own process under
# its own time limit, each row (check, value, tolerance, PASS / FAIL / SKIPPED) is printed as soon as it is known,
# and the run always ends with the table of every row within GPU_CHECK_BUDGET seconds (default 540); exit 1 on any
# FAIL, a group that timed out or crashed included. No downloads. The `timeout` below only backstops the budget.
# Options go to gpu_check.py (--device cpu: the dry run the test suite runs; --only GROUP; --tolerance NAME=VALUE;
# --limit GROUP=SECONDS).
#   bash bench/gpu_check.sh
# Python: $PYTHON when set, else the GPU environment's .venv-gpu/bin/python when it exists, else python3; the repo
# goes on PYTHONPATH. Wheels in .whl/ (packages dppo needs that the environment lacks, e.g. math-verify) are
# installed to /tmp/site first.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv-gpu/bin/python ]; then PY=.venv-gpu/bin/python; else PY=python3; fi
fi
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
BUDGET="${GPU_CHECK_BUDGET:-540}"
exec timeout -k 10 $((BUDGET + 30)) "$PY" bench/gpu_check.py --budget "$BUDGET" "$@"
