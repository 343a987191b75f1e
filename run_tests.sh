#!/usr/bin/env bash
# The test command: bootstraps .venv (and .venv-vllm, with vLLM for CPU) if needed, then runs the whole CPU test
# suite in the main environment, then the vLLM tests in theirs. Extra arguments go to the main pytest (e.g.
# ./run_tests.sh -k losses); DPPO_SKIP_VLLM=1 skips the vLLM environment. The smoke runs of an earlier suite
# (experiments/results/smoke) are removed first, and a run folder is reused only by the config and code that made it.
#
# The main suite runs in two parts: every test file on 2 workers (pytest-xdist, one file per worker at a time, one
# intra-op thread each: tests/conftest.py; the longest files first), then, alone on the machine, the tests marked
# `serial` (the study notebooks, which time paired runs and share their smoke runs; the contention and time-limit
# tests; the real model's notebooks took 4.5x their serial time on one thread beside the rest). .venv-vllm is
# set up meanwhile, in the background (its log is printed if it fails).
#
# The lowest versions pyproject.toml claims (the lent GPU node's image: torch 2.11.0, transformers 5.17.0,
# accelerate 1.15.0; no math-verify, vLLM or flash-attn, dppo not installed) are tested last, in .venv-min
# (`bash scripts/bootstrap.sh min`, set up in the background beside .venv-vllm): a subset chosen for coverage of the
# trainer, the estimator, packing, mixed precision and the distributed code (MIN_TESTS), with dppo from PYTHONPATH
# and math-verify installed from the wheels scripts/gpu_wheels.sh fetches (into .whl-test/, ignored), as on the node.
# Then, in the same environment without math-verify on its path, tests/test_gpu_image.py replays bench/gpu_check.sh
# as on the node (a torch-less .venv-gpu beside it, the wheels gpu_wheels.sh fetches; skipped in .venv).
# DPPO_SKIP_MIN=1 skips both.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
bash scripts/bootstrap.sh
rm -rf experiments/results/smoke  # scratch runs of the notebook tests: every suite starts without old ones
setups=()  # background installs: an interrupted suite leaves none running
trap 'for p in "${setups[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
vllm=0
if [ "${DPPO_SKIP_VLLM:-0}" != 1 ] && [ $# -eq 0 ]; then
  vllm=1 vllm_log="$(mktemp)"
  bash scripts/bootstrap.sh vllm > "$vllm_log" 2>&1 & vllm_setup=$!
  setups+=("$vllm_setup")
fi
min=0
if [ "${DPPO_SKIP_MIN:-0}" != 1 ] && [ $# -eq 0 ]; then
  min=1 min_log="$(mktemp)"
  bash scripts/bootstrap.sh min > "$min_log" 2>&1 & min_setup=$!
  setups+=("$min_setup")
fi
failed=0
part() {  # one pytest run of the main suite; "no tests selected" (exit 5: e.g. -k naming tests of the other part) is not a failure
  local rc=0
  .venv/bin/python -m pytest "$@" || rc=$?
  [ "$rc" = 0 ] || [ "$rc" = 5 ] || failed=1
}
ready() {  # ready NAME PID LOG: wait for a background setup; its log, or the suite stops with it
  if ! wait "$2"; then
    cat "$3" >&2; echo "[run_tests] setting up $1 failed (its log above)" >&2; exit 1
  fi
  cat "$3"
}
part -n 2 --dist loadfile --no-loadscope-reorder -m "not serial" "$@"  # files in tests/conftest.py's order
# before the serial part, which must have the machine to itself
if [ "$vllm" = 1 ]; then ready .venv-vllm "$vllm_setup" "$vllm_log"; fi
if [ "$min" = 1 ]; then
  ready .venv-min "$min_setup" "$min_log"
fi
setups=()
part -m serial "$@"
if [ "$vllm" = 1 ]; then
  .venv-vllm/bin/python -m pytest -o addopts=-ra -p no:cacheprovider tests/test_vllm.py || failed=1
fi
if [ "$min" = 1 ]; then
  # .venv-min: what the lowest versions must run (the estimator's fixed-count cases stand for its Bernoulli ones,
  # which take minutes more; resuming a run is left to .venv: minutes, and test_distributed keeps checkpoints)
  MIN_TESTS=(
    tests/test_estimator.py::test_expected_update_gradient_equals_full_gradient
    tests/test_estimator.py::test_update_gradient_equals_hand_written_loss
    tests/test_packing.py tests/test_losses.py tests/test_scoring_memory.py tests/test_mixed_precision.py
    tests/test_distributed.py tests/test_task_reward.py
    tests/test_trainer.py::test_short_run_changes_every_parameter_and_learns
    tests/test_trainer.py::test_dense_and_shared_prompt_packing_train_like_padding_with_denser_batches
    tests/test_trainer.py::test_pruned_work_is_never_computed
    tests/test_trainer.py::test_every_optimizer_update_uses_the_scheduled_learning_rate
    tests/test_trainer.py::test_the_optimizer_steps_with_the_clipped_gradient_and_the_log_has_the_norm_before_clipping
    tests/test_trainer.py::test_the_rollout_engine_sleeps_once_per_step_before_the_update_and_evaluates_in_one_call
  )
  if PYTHON=.venv/bin/python bash scripts/gpu_wheels.sh .whl-test/wheels > /dev/null \
     && rm -rf .whl-test/site \
     && .venv-min/bin/python -m pip install -q --no-index --no-deps --target .whl-test/site .whl-test/wheels/*.whl; then
    PYTHONPATH="$PWD:$PWD/.whl-test/site" .venv-min/bin/python -m pytest -o addopts=-ra -p no:cacheprovider \
      -k "not bernoulli" "${MIN_TESTS[@]}" || failed=1
  else
    echo "[run_tests] the math-verify wheels for .venv-min could not be fetched or installed (the error above)" >&2
    failed=1
  fi
  .venv-min/bin/python -m pytest -o addopts=-ra -p no:cacheprovider tests/test_gpu_image.py || failed=1
fi
exit "$failed"
