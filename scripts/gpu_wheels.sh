#!/usr/bin/env bash
# The wheels dppo needs beyond a fixed GPU image with no package index (docs/usage.md, "A GPU node without a package
# index"), fetched here into an ignored folder that travels beside the checkout:
#   bash scripts/gpu_wheels.sh [DIR]        DIR defaults to .whl (ignored by git)
# An image with torch, transformers, accelerate, pandas, pyyaml, tqdm, psutil, safetensors and sympy (the H200
# image: docs/usage.md) lacks only the reward's answer checker: math-verify and its own pure-Python dependencies.
# Pure-Python wheels for CPython 3.12 on x86-64 Linux (the image's; override with GPU_WHEELS_PYTHON=3.11 etc.), no
# dependency resolution (--no-deps: every wheel is named here, one version each), refused when the folder would be
# over 64 MiB (what travels to the node with the checkout). bench/gpu_check.sh installs DIR's wheels into a --target
# folder before it starts:
#   python3 -m pip install --no-index --no-deps --target /tmp/site DIR/*.whl && export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DIR="${1:-.whl}"
PYVER="${GPU_WHEELS_PYTHON:-3.12}"
WHEELS=(  # the versions .venv tests (pyproject's math-verify>=0.9; scripts/bootstrap.sh installs the newest)
  "math-verify==0.9.0"              # dppo.reward: parse and verify the answer
  "latex2sympy2_extended==1.11.0"   # math-verify's LaTeX parser
  "antlr4-python3-runtime==4.13.2"  # latex2sympy2_extended's parser runtime (exactly this version)
)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 any)
mkdir -p "$DIR"
args=(--no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp -d "$DIR")
for p in "${PLATFORMS[@]}"; do args+=(--platform "$p"); done
PY="${PYTHON:-python3}"
if ! "$PY" -m pip download -q "${args[@]}" "${WHEELS[@]}" 2> >(grep -v "^WARNING: Location" >&2); then
  echo "gpu_wheels.sh: pip download failed (its error above): this machine needs a package index" >&2
  exit 1
fi
bytes=$(du -sb "$DIR" | cut -f1)
if [ "$bytes" -gt $((64 * 1024 * 1024)) ]; then
  echo "gpu_wheels.sh: $DIR holds $bytes bytes, over the 64 MiB that travels with the checkout" >&2
  exit 1
fi
echo "gpu_wheels.sh: $(ls "$DIR"/*.whl | wc -l) wheels, $((bytes / 1024)) KiB in $DIR (CPython $PYVER)"
