#!/usr/bin/env bash
# The reproduction: bootstrap .venv, run every study notebook at CPU scale on the embedded default (papermill),
# then paper_figures (every table and figure of docs/method.md §6 into figures/). Executed notebooks are kept under
# experiments/results/notebooks/.
#
#   ./reproduce.sh                          every study, then paper_figures
#   ./reproduce.sh --study main_results     one study (a notebook name), then paper_figures
#   ./reproduce.sh --study packing -f my.yaml   papermill parameter file for the study
#   ./reproduce.sh --profile paper          paper-scale parameter files experiments/paper/<study>.yaml (GPUs):
#                                           each training run its own `accelerate launch` over all local GPUs
#   ./reproduce.sh --profile paper --dry-run   print every command and the estimated GPU-hours per study
#   ./reproduce.sh --train CONFIG.yaml [--field value ...]   one training run (dppo train)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
STUDIES=(main_results algorithms scale ablations gradient_variance packing case_study)
study="" params="" profile="cpu" dry_run=0 train=()
fail() { echo "reproduce.sh: $1" >&2; exit 2; }
value() { [ $# -ge 2 ] && [ -n "$2" ] && [ "${2#--}" = "$2" ] || fail "$1 needs a value (see --help)"; }
# flags first: a bad one (or --help) never waits for the environment to be installed
while [ $# -gt 0 ]; do
  case "$1" in
    --train) value "$@"; [ -f "$2" ] || fail "--train config file '$2' not found"; shift; train=("$@"); break ;;
    --study) value "$@"; study="$2"; shift 2 ;;
    -f|--parameters) value "$@"; [ -f "$2" ] || fail "parameter file '$2' not found"; params="$2"; shift 2 ;;
    --profile) value "$@"; profile="$2"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) fail "unknown option '$1' (see --help)" ;;
  esac
done
[ "$profile" = cpu ] || [ "$profile" = paper ] || fail "--profile must be cpu or paper, got '$profile'"
if [ -n "$study" ]; then
  [ -f "notebooks/$study.ipynb" ] || fail "--study must be one of: ${STUDIES[*]} paper_figures train, got '$study'"
  STUDIES=("$study")
fi
bash scripts/bootstrap.sh
if [ ${#train[@]} -gt 0 ]; then exec .venv/bin/dppo train --config "${train[@]}"; fi
if [ "$dry_run" = 1 ]; then
  exec .venv/bin/python -m dppo.budget --profile "$profile" ${study:+--study "$study"}
fi
mkdir -p experiments/results/notebooks
for nb in "${STUDIES[@]}"; do
  args=()
  if [ -n "$params" ]; then args=(-f "$params")
  elif [ "$profile" = paper ] && [ -f "experiments/paper/$nb.yaml" ]; then args=(-f "experiments/paper/$nb.yaml"); fi
  [ "$nb" = paper_figures ] && continue
  echo "[reproduce] $nb $(date +%T)"
  DPPO_SMOKE=0 .venv/bin/papermill "notebooks/$nb.ipynb" "experiments/results/notebooks/$nb.ipynb" --cwd . \
    --progress-bar "${args[@]}"
done
echo "[reproduce] paper_figures $(date +%T)"
DPPO_SMOKE=0 .venv/bin/papermill notebooks/paper_figures.ipynb experiments/results/notebooks/paper_figures.ipynb --cwd .
ls -l figures/
