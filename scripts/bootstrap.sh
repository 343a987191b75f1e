#!/usr/bin/env bash
# Create the project virtualenv (.venv) and install dppo with its dev extras, idempotently.
# Re-runs only when pyproject.toml or this script change. CPU torch is pinned (torch==2.13.0) so a
# bare `torch` requirement never pulls a multi-GB CUDA build on CPU machines; override with
# DPPO_TORCH_SPEC (e.g. "torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${DPPO_VENV:-.venv}"
PY="${PYTHON:-python3}"
TORCH_SPEC="${DPPO_TORCH_SPEC:-torch==2.13.0}"
want="$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -d' ' -f1) $TORCH_SPEC"
stamp="$VENV/.dppo-installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "import dppo, torch" 2>/dev/null; then
  exit 0
fi
echo "[bootstrap] setting up $VENV (python: $($PY --version 2>&1))"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
# shellcheck disable=SC2086
"$VENV/bin/python" -m pip install -q $TORCH_SPEC 2>&1 | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -m pip install -q -e ".[dev]" 2>&1 | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -c "import dppo, torch, transformers, math_verify; print('[bootstrap] torch', torch.__version__, '| transformers', transformers.__version__)"
echo "$want" > "$stamp"
