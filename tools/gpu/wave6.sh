#!/usr/bin/env bash
# GPU checks of this wave (session of 2026-11-27), for the GPU machine (PyTorch present):
#   leak     issue 32: the GPU pytest files that load PyTorch with CUDA, with the leak-check
#            plugin (tools/gpu/pytest_leakcheck.py) listing what holds a Device at exit, then
#            with LEAK_CLEAR=1; the nanobind report, if any, is in each log
#   profile  issue 27: bench/gpt2/gpt2_profile.py on cuda:0 (device time per op, Backplane and
#            PyTorch, batch 8 x 1024 bf16 training steps)
#   startup  issue 29: bp-bench-startup on the GPU host, the first cuda op included
#   pytest   the whole Python suite on the GPU host (as tools/gpu/python.sh runs it)
#   events   cuda_event_test and the async-error tests (the event-record fast path)
#   reduce   bp-conformance on cuda:0 for every reduction and log_softmax, the nn tests of the
#            losses and linear on cuda:0
#   gpt2     bench/gpt2/gpt2_compare.py --bench on cuda:0 (tokens/s against PyTorch)
#   loss     the fused cross_entropy (ABI 1.8): bp-conformance on cuda:0 for both ops and the
#            reductions, the nn and async-error tests of the loss on cuda:0, and bench/compare.py
#            --only cross_entropy (Backplane against PyTorch in one command)
# Each part logs to $OUT/<step>.log; the summary lists rc and time per step.
#
#   source .device/env.sh
#   bash tools/gpu/wave6.sh BUILD_DIR PART...
set -uo pipefail
build=${1:?usage: bash tools/gpu/wave6.sh BUILD_DIR PART...}
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${OUT:-wave6-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
source "$here/tools/gpu/common.sh"
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
py=${BP_PYTHON:-python3}

for part in "$@"; do
  case "$part" in
    leak)
      for f in test_interop_gpu test_dlpack_c_api; do
        STEP_TIMEOUT=300 STEP_TAIL=40 step "leak.$f" env PYTHONPATH="$here/tools/gpu:$PYTHONPATH" \
          "$py" -m pytest -q -p pytest_leakcheck "$here/python/tests/$f.py"
        STEP_TIMEOUT=300 STEP_TAIL=12 step "leak.$f.cleared" env LEAK_CLEAR=1 \
          PYTHONPATH="$here/tools/gpu:$PYTHONPATH" "$py" -m pytest -q -p pytest_leakcheck \
          "$here/python/tests/$f.py"
      done
      ;;
    profile)
      STEP_TIMEOUT=400 STEP_TAIL=60 step gpt2.profile "$py" "$here/bench/gpt2/gpt2_profile.py" \
        --device cuda:0 --out "$out/gpt2-profile"
      ;;
    startup)
      STEP_TIMEOUT=300 STEP_TAIL=8 step startup "$build/bin/bp-bench-startup" --runs 21 \
        --python "$py" --case cpp_trivial --case python_first_op --case bp_smi \
        --case cuda_first_op --case cuda_first_op_all_plugins
      ;;
    pytest)
      STEP_TIMEOUT=600 STEP_TAIL=15 step pytest "$py" -m pytest -q "$here/python/tests"
      ;;
    events)
      STEP_TIMEOUT=200 STEP_TAIL=6 step cuda_event_test "$build/bin/cuda_event_test" --gtest_brief=1
      STEP_TIMEOUT=200 STEP_TAIL=6 step async_errors env BP_TEST_DEVICES=cuda:0 \
        "$build/bin/bp_unit_tests" --gtest_filter='*Async*' --gtest_brief=1
      ;;
    reduce)
      STEP_TIMEOUT=300 STEP_TAIL=6 step conformance.reduce "$build/bin/bp-conformance" \
        --plugin "$build/lib/backplane/plugins/libbackplane-cuda.so" --device cuda:0 \
        --filter 'kernels.sum*' --filter 'kernels.mean*' --filter 'kernels.max*' \
        --filter 'kernels.norm*' --filter 'kernels.sumsq*' --filter 'kernels.log_softmax*' \
        --filter 'kernels.linear*' --filter 'kernels.scatter_add*' --filter 'kernels.gather*' \
        --seed "$(seed)"
      STEP_TIMEOUT=300 STEP_TAIL=6 step nn.losses env BP_TEST_DEVICES=cuda:0 \
        "$build/bin/bp_nn_tests" --gtest_filter='*ross*:*Loss*:*Linear*:*Train*:*Gpt*' \
        --gtest_brief=1
      ;;
    loss)
      STEP_TIMEOUT=300 STEP_TAIL=6 step conformance.loss "$build/bin/bp-conformance" \
        --plugin "$build/lib/backplane/plugins/libbackplane-cuda.so" --device cuda:0 \
        --filter 'kernels.cross_entropy*' --filter 'kernels.sum*' --filter 'kernels.mean*' \
        --filter 'kernels.norm*' --filter 'kernels.sumsq*' --filter 'kernels.layer_norm*' \
        --seed "$(seed)"
      STEP_TIMEOUT=300 STEP_TAIL=8 step nn.cross_entropy env BP_TEST_DEVICES=cuda:0 \
        "$build/bin/bp_nn_tests" --gtest_filter='*CrossEntropy*:*ross*:*ayerNorm*:*Gpt*' --gtest_brief=1
      STEP_TIMEOUT=200 STEP_TAIL=6 step async_errors.loss env BP_TEST_DEVICES=cuda:0 \
        "$build/bin/bp_unit_tests" --gtest_filter='*Async*' --gtest_brief=1
      STEP_TIMEOUT=300 STEP_TAIL=14 step bench.cross_entropy "$py" "$here/bench/compare.py" \
        --bp "$build/bin/bp-bench" --device cuda:0 --only cross_entropy --repeat 3 --json "$out/cross-entropy.json"
      ;;
    gpt2)
      STEP_TIMEOUT=420 STEP_TAIL=24 step gpt2.bench "$py" "$here/bench/gpt2/gpt2_compare.py" \
        --device cuda:0 --bench --json "$out/gpt2-cuda0.json" --markdown "$out/gpt2-cuda0.md" ${GPT2_ARGS:-}
      ;;
    *)
      echo "wave6.sh: unknown part '$part' (leak, profile, startup, pytest, events, reduce, loss or gpt2)" >&2
      exit 2
      ;;
  esac
done
echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
