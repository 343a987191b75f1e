#!/usr/bin/env bash
# The reproduction: bootstrap .venv, run study notebooks (papermill), then paper_figures (the profile's tables and
# figures of docs/method.md §6 into figures/ or figures/<profile>/). Executed notebooks are kept under
# experiments/results/notebooks/.
#
#   ./reproduce.sh                          the main table: T1 (GRPO vs DPPO, 7 seeds, the protocol P1 chose) and F2
#                                           on a real pretrained LLM (SmolLM2-135M-Instruct) (= --profile real --study
#                                           main_results; figures/real/): from the committed run logs where the code
#                                           that trained them is this checkout's (minutes), else trained (~2.1 h)
#   --retrain                               train every run of the studies named again, committed logs and finished
#                                           runs alike (./reproduce.sh --retrain: T1 from scratch, ~2.1 h)
#   ./reproduce.sh --profile real           the paper's tables: T1, F2, T2, T3 (+ Gemma 3 270M), T4, T5, F3, F5 (~8.5 h on 2
#                                           cores; dppo.studies.real_params; runs under experiments/results/real,
#                                           tables in figures/real); with --dry-run: its runs and estimated minutes
#   ./reproduce.sh --profile cpu            every study on the embedded default, the quick profile (~35 min: a 1.0 M
#                                           parameter model; speed rows and smoke), then docs/results.md's table
#   ./reproduce.sh --study main_results     one study (a notebook name) of --profile cpu (or of the profile given),
#                                           then paper_figures
#   ./reproduce.sh --study real_model       table R1, GRPO against DPPO on SmolLM2-135M-Instruct with shared-prompt
#                                           rows, 3 seeds (~80 min on 2 cores; not in --profile cpu for its length)
#   ./reproduce.sh --study packing -f my.yaml   papermill parameter file for the study (its results_dir, if any:
#                                           the runs, tables and figures there, never the committed figures/)
#   ./reproduce.sh --profile paper          paper-scale parameter files experiments/paper/<study>.yaml (GPUs):
#                                           each training run its own `accelerate launch` over all local GPUs
#   ./reproduce.sh --profile paper --dry-run   print every command and the estimated GPU-hours per study
#   ./reproduce.sh --profile paper --toy    the paper profile end to end at toy scale on CPU (everything it changes:
#                                           experiments/paper/toy.yaml; output under experiments/results/toy/)
#   --study may be given more than once (e.g. --study main_results --study case_study)
#   ./reproduce.sh --train CONFIG.yaml [--field value ...]   one training run (dppo train)
#   ./reproduce.sh --lab                    open JupyterLab on notebooks/ (every notebook runs interactively)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
mapfile -t STUDIES < <(python3 dppo/studies.py)  # the study registry (dppo.studies), in order; stdlib only
mapfile -t ALL_STUDIES < <(python3 dppo/studies.py --all)  # and those run only when named (real_model: ~80 min)
study=() params="" profile="" dry_run=0 train=() lab=0 toy=0
fail() { echo "reproduce.sh: $1" >&2; exit 2; }
value() { [ $# -ge 2 ] && [ -n "$2" ] && [ "${2#--}" = "$2" ] || fail "$1 needs a value (see --help)"; }
# flags first: a bad one (or --help) never waits for the environment to be installed
while [ $# -gt 0 ]; do
  case "$1" in
    --train) value "$@"; [ -f "$2" ] || fail "--train config file '$2' not found"; shift; train=("$@"); break ;;
    --study) value "$@"; study+=("$2"); shift 2 ;;
    -f|--parameters) value "$@"; [ -f "$2" ] || fail "parameter file '$2' not found"; params="$2"; shift 2 ;;
    --profile) value "$@"; profile="$2"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --toy) toy=1; shift ;;
    --retrain) export DPPO_RETRAIN=1; shift ;;  # dppo.results.RETRAIN_ENV
    --lab) lab=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#'; exit 0 ;;
    *) fail "unknown option '$1' (see --help)" ;;
  esac
done
if [ -z "$profile" ] && [ ${#study[@]} = 0 ] && [ -z "$params" ] && [ ${#train[@]} = 0 ] && [ "$lab" = 0 ]; then  # no options: the main table, on the real model
  profile=real study=(main_results)
fi
profile="${profile:-cpu}"
[ "$profile" = cpu ] || [ "$profile" = paper ] || [ "$profile" = real ] || fail "--profile must be cpu, paper or \
real, got '$profile'"
[ "$profile" != real ] || mapfile -t STUDIES < <(python3 dppo/studies.py --real)
[ "$toy" = 0 ] || { [ "$profile" = paper ] && [ "$dry_run" = 0 ]; } || fail "--toy goes with --profile paper, \
without --dry-run"
if [ ${#study[@]} -gt 0 ]; then
  for s in "${study[@]}"; do
    [ -f "notebooks/$s.ipynb" ] || fail "--study must be one of: ${ALL_STUDIES[*]} paper_figures train, got '$s'"
  done
  STUDIES=("${study[@]}")
fi
if [ "$profile" = paper ] && [ "$dry_run" = 0 ] && [ "$toy" = 0 ]; then  # GPUs first: never install CUDA wheels where none can run
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
  budget=(); for s in "${study[@]}"; do budget+=(--study "$s"); done
  exec .venv/bin/python -m dppo.budget --profile "$profile" "${budget[@]}"
fi
out=experiments/results
if [ "$toy" = 1 ]; then  # dppo.toy: the notebooks and the runs they launch see DPPO_TOY=1
  export DPPO_TOY=1
  out="$("$VENV/bin/python" -m dppo.toy root)"
  mkdir -p "$out/params"
fi
mkdir -p "$out/notebooks"
if [ "$toy" = 0 ] && [ -z "$params" ]; then  # before any training: the dry run's disk estimate against what is free
  budget=(); for s in "${STUDIES[@]}"; do [ "$s" = paper_figures ] || budget+=(--study "$s"); done
  [ ${#budget[@]} = 0 ] || "$VENV/bin/python" -m dppo.budget --profile "$profile" "${budget[@]}" --check-disk "$out" \
    || exit 3
fi
# Live progress: the notebooks' runs append to this file (dppo.progress): run i/n, step, ETA; followed here.
export DPPO_PROGRESS_FILE="$(cd "$out" && pwd)/progress.log"
: > "$DPPO_PROGRESS_FILE"
tail -n +1 -F "$DPPO_PROGRESS_FILE" 2>/dev/null &
follower=$!
trap 'kill $follower 2>/dev/null || true' EXIT
summary=() t_all=$SECONDS rd=""
run_notebook() {  # name, then papermill's extra arguments
  local nb="$1" t0=$SECONDS; shift
  echo "[reproduce] $(date +%T) study $nb (notebooks/$nb.ipynb -> $out/notebooks/$nb.ipynb)" >> "$DPPO_PROGRESS_FILE"
  DPPO_SMOKE=0 "$VENV/bin/papermill" "notebooks/$nb.ipynb" "$out/notebooks/$nb.ipynb" --cwd . --no-progress-bar "$@"
  summary+=("$(awk -v n="$nb" -v s=$((SECONDS - t0)) 'BEGIN { printf "%-18s %5.1f min", n, s / 60 }')")
}
study_args() {  # the papermill parameter file of a study under this profile (none: the notebook's defaults)
  if [ -n "$params" ] && [ "$1" != paper_figures ]; then echo "$params"
  elif [ "$toy" = 1 ]; then "$VENV/bin/python" -m dppo.toy params "$1" > "$out/params/$1.yaml"; echo "$out/params/$1.yaml"
  elif [ "$profile" = paper ] && [ -f "experiments/paper/$1.yaml" ]; then echo "experiments/paper/$1.yaml"
  elif [ "$profile" = real ]; then mkdir -p "$out/params"
    "$VENV/bin/python" -m dppo.studies --params real "$1" > "$out/params/real_$1.yaml"; echo "$out/params/real_$1.yaml"
  fi
}
for nb in "${STUDIES[@]/paper_figures/}" paper_figures; do  # the studies, then paper_figures once
  [ -n "$nb" ] || continue
  f="$(study_args "$nb")" partial=()
  [ "$nb" = paper_figures ] && [ ${#study[@]} -gt 0 ] && partial=(-p complete False)  # the other studies may be missing
  if [ "$nb" = paper_figures ] && [ -n "$params" ]; then  # a parameter file's results_dir: paper_figures reads it too
    rd="$("$VENV/bin/python" -c 'import sys, yaml; print((yaml.safe_load(open(sys.argv[1])) or {}).get("results_dir", ""))' "$params")"
    [ -n "$rd" ] && partial+=(-p results_dir "$rd")
  fi
  run_notebook "$nb" ${f:+-f "$f"} "${partial[@]}"
done
sleep 1
kill $follower 2>/dev/null || true
echo
echo "[reproduce] done in $(( (SECONDS - t_all) / 60 )) min $(( (SECONDS - t_all) % 60 )) s; time per study:"
printf '  %s\n' "${summary[@]}"
figs="$("$VENV/bin/python" -c 'import os, sys; from dppo import results
print(os.path.relpath(results.figures_dir(sys.argv[2], False, sys.argv[1])))' "$profile" "$rd")"
echo "[reproduce] regenerated ($figs/): $(ls "$figs" | tr '\n' ' ')"
if [ "$figs" = figures ] || [ "$figs" = figures/real ]; then  # the committed figures: the README's results tables
  "$VENV/bin/python" -m dppo.readme  # from them (one source), and the executed paper_figures (every table and figure
  cp "$out/notebooks/paper_figures.ipynb" "$figs/paper_figures.ipynb"  # inline) beside them
fi
echo "[reproduce] executed notebooks, with every table and figure inline: $out/notebooks/"
