#!/usr/bin/env bash
# The test command: bootstraps .venv (and .venv-vllm, with vLLM for CPU) if needed, then runs the whole CPU test
# suite: pytest in the main environment, then the vLLM tests in theirs. Extra arguments go to the main pytest
# (e.g. ./run_tests.sh -k losses); DPPO_SKIP_VLLM=1 skips the vLLM environment. The smoke runs of an earlier suite
# (experiments/results/smoke) are removed first, and a run folder is reused only by the config and code that made it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
bash scripts/bootstrap.sh
rm -rf experiments/results/smoke  # scratch runs of the notebook tests: every suite starts without old ones
.venv/bin/python -m pytest "$@"
if [ "${DPPO_SKIP_VLLM:-0}" != 1 ] && [ $# -eq 0 ]; then
  bash scripts/bootstrap.sh vllm
  exec .venv-vllm/bin/python -m pytest -o addopts=-ra -p no:cacheprovider tests/test_vllm.py
fi
