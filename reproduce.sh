#!/usr/bin/env bash
# The main job on the embedded default: bootstrap .venv, then train GRPO on the embedded task and
# print per-split accuracy before and after. Usage: ./reproduce.sh [CONFIG.yaml] [--field value ...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
bash scripts/bootstrap.sh
config="experiments/cpu/grpo.yaml"
if [ $# -gt 0 ] && [[ "$1" != --* ]]; then config="$1"; shift; fi
exec .venv/bin/dppo train --config "$config" "$@"
