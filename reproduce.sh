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
#   ./reproduce.sh --lab                    open JupyterLab on notebooks/ (every notebook runs interactively)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
mapfile -t STUDIES < <(python3 dppo/studies.py)  # the study registry (dppo.studies), in order; stdlib only
study="" params="" profile="cpu" dry_run=0 train=() lab=0
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
    --lab) lab=1; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) fail "unknown option '$1' (see --help)" ;;
  esac
done
[ "$profile" = cpu ] || [ "$profile" = paper ] || fail "--profile must be cpu or paper, got '$profile'"
if [ -n "$study" ]; then
  [ -f "notebooks/$study.ipynb" ] || fail "--study must be one of: ${STUDIES[*]} paper_figures train, got '$study'"
  STUDIES=("$study")
fi
if [ "$profile" = paper ] && [ "$dry_run" = 0 ]; then  # GPUs first: never install CUDA wheels where none can run
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 || fail "--profile paper needs NVIDIA GPUs \
(nvidia-smi finds none here); --profile paper --dry-run prints the plan on any machine"
  bash scripts/bootstrap.sh gpu
  VENV=.venv-gpu
  "$VENV/bin/python" -m dppo.launch --check-gpu || exit 2
else
  bash scripts/bootstrap.sh
  VENV=.venv
fi
if [ ${#train[@]} -gt 0 ]; then exec "$VENV/bin/dppo" train --config "${train[@]}"; fi
if [ "$lab" = 1 ]; then  # as root (containers) jupyter refuses to start without --allow-root
  exec .venv/bin/jupyter lab notebooks/ $([ "$(id -u)" = 0 ] && echo --allow-root); fi
if [ "$dry_run" = 1 ]; then
  exec .venv/bin/python -m dppo.budget --profile "$profile" ${study:+--study "$study"}
fi
mkdir -p experiments/results/notebooks
# Live progress: the notebooks' runs append to this file (dppo.progress): run i/n, step, ETA; followed here.
export DPPO_PROGRESS_FILE="$PWD/experiments/results/progress.log"
: > "$DPPO_PROGRESS_FILE"
tail -n +1 -F "$DPPO_PROGRESS_FILE" 2>/dev/null &
follower=$!
trap 'kill $follower 2>/dev/null || true' EXIT
summary=() t_all=$SECONDS
run_notebook() {  # name, then papermill's extra arguments
  local nb="$1" t0=$SECONDS; shift
  echo "[reproduce] $(date +%T) study $nb (notebooks/$nb.ipynb -> experiments/results/notebooks/$nb.ipynb)" >> "$DPPO_PROGRESS_FILE"
  DPPO_SMOKE=0 "$VENV/bin/papermill" "notebooks/$nb.ipynb" "experiments/results/notebooks/$nb.ipynb" --cwd . \
    --no-progress-bar "$@"
  summary+=("$(awk -v n="$nb" -v s=$((SECONDS - t0)) 'BEGIN { printf "%-18s %5.1f min", n, s / 60 }')")
}
for nb in "${STUDIES[@]}"; do
  args=()
  if [ -n "$params" ]; then args=(-f "$params")
  elif [ "$profile" = paper ] && [ -f "experiments/paper/$nb.yaml" ]; then args=(-f "experiments/paper/$nb.yaml"); fi
  [ "$nb" = paper_figures ] && continue
  run_notebook "$nb" "${args[@]}"
done
if [ "$profile" = paper ]; then run_notebook paper_figures -f experiments/paper/paper_figures.yaml
else run_notebook paper_figures; fi
sleep 1
kill $follower 2>/dev/null || true
echo
echo "[reproduce] done in $(( (SECONDS - t_all) / 60 )) min $(( (SECONDS - t_all) % 60 )) s; time per study:"
printf '  %s\n' "${summary[@]}"
figs=figures; [ "$profile" = paper ] && figs=figures/paper
echo "[reproduce] regenerated ($figs/): $(ls "$figs" | tr '\n' ' ')"
echo "[reproduce] executed notebooks, with every table and figure inline: experiments/results/notebooks/"
