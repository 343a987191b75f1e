#!/usr/bin/env bash
# The GPU path on one GPU with a verdict (bench/gpu_check.py): each group of checks in its own process under its own
# time limit, one short line per check as it is known, then the table; PASS / FAIL / NOT AVAILABLE HERE per check;
# exit 0 all passed, 1 a check failed, 3 nothing failed but some checks could not run here (vLLM, flash-attn absent).
# The table and the groups' log go to --out DIR (default $GPU_CHECK_OUT, else experiments/results/gpu_check):
# gpu_check.json, gpu_check.md, gpu_check.log. No downloads. docs/usage.md, "A GPU node without a package index".
#   bash bench/gpu_check.sh [--out DIR] [--only GROUP] [--device cpu] [--tolerance NAME=VALUE] [--limit GROUP=S]
# Python: $PYTHON when set; else the first of .venv-gpu/bin/python and python3 whose torch sees a CUDA GPU (probed,
# never assumed from a folder: a failed bootstrap leaves a .venv-gpu without torch); else the first whose torch
# imports (the CPU dry run); else python3, whose table then says what is missing. Wheels in $GPU_CHECK_WHEELS
# (default .whl/: scripts/gpu_wheels.sh makes it; math-verify for the reward) are installed into a --target folder
# first. The repository goes on PYTHONPATH (dppo is not pip-installed on such a node).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
probe() {  # 0: torch sees CUDA; 3: torch imports, no CUDA; else no usable torch
  local rc=0
  timeout 120 "$1" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)" >/dev/null 2>&1 || rc=$?
  return "$rc"
}
PY="${PYTHON:-}" device=""
if [ -z "$PY" ]; then
  fallback=""
  for candidate in .venv-gpu/bin/python python3; do
    command -v "$candidate" >/dev/null 2>&1 || [ -x "$candidate" ] || continue
    rc=0; probe "$candidate" || rc=$?
    if [ "$rc" = 0 ]; then PY="$candidate" device=cuda; break; fi
    if [ "$rc" = 3 ] && [ -z "$fallback" ]; then fallback="$candidate"; fi
  done
  if [ -z "$PY" ]; then PY="${fallback:-python3}"; [ -n "$fallback" ] && device=cpu; fi
fi
WHEELS="${GPU_CHECK_WHEELS:-.whl}"
if [ -d "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  SITE="${TMPDIR:-/tmp}/dppo-gpu-check-site"
  rm -rf "$SITE"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$WHEELS"/*.whl 2> >(grep -v "^WARNING: Location" >&2) \
    || { echo "gpu_check.sh: installing $WHEELS/*.whl with $PY failed (pip's error above)" >&2; exit 1; }
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
args=()
if [ -n "$device" ]; then
  case " $* " in *" --device "*|*" --device="*) ;; *) args=(--device "$device") ;; esac
fi
echo "gpu_check.sh: $PY ($("$PY" --version 2>&1))${device:+, torch sees: $device}"
# the backstop: the script's own budget (default 390 s on CUDA, 4x on the CPU) ends every group and writes the table
exec timeout -k 10 "${GPU_CHECK_TIMEOUT:-1600}" "$PY" bench/gpu_check.py "${args[@]}" "$@"
