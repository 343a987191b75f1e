#!/usr/bin/env bash
# The paper path on one GPU with a verdict (bench/gpu_check.py: one table of check, value, tolerance, PASS / FAIL /
# SKIPPED; exit 1 on any FAIL). <= 5 minutes, no downloads. Options go to gpu_check.py (--device cpu: the dry run the
# test suite runs; --tolerance NAME=VALUE; --only GROUP).
# On a machine whose python3 already has torch + transformers + accelerate (e.g. the lent GPU machine):
#   bash bench/gpu_check.sh            # uses python3 (or $PYTHON) and the repo on PYTHONPATH
# Packages dppo needs that the machine lacks (math-verify, ...) can be carried as wheels in .whl/
# (see the device tool's README); they are installed to /tmp/site first.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
exec timeout 300 "$PY" bench/gpu_check.py "$@"
