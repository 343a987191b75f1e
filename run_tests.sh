#!/usr/bin/env bash
# The test command: bootstraps .venv if needed, then runs the whole CPU test suite.
# Extra arguments go to pytest (e.g. ./run_tests.sh -k losses).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest "$@"
