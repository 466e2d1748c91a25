#!/usr/bin/env bash
# GPU checks of the profiler (issue 15) on the GPU machine:
#   - the profiler's device tests on cuda:0 and cpu:0 and the Trainer's progress test;
#   - a trace, a memory snapshot and the per-op table of the MLP training step on cuda:0
#     (bp-profile-mlp-step), turned into HTML pages by tools/bp-memviz;
#   - the cost: bp-profiler-overhead (1-element add, profiler off vs on, interleaved) on cuda:0
#     and cpu:0, and compare.py's 1-element add (profiler compiled in, off) for the table.
#
#   bash tools/gpu/profiler.sh BUILD_DIR
#
# Pass: every line of the summary says rc=0. Outputs in $OUT (or ./profiler-out).
set -uo pipefail
build=${1:?usage: bash tools/gpu/profiler.sh BUILD_DIR}
out=${OUT:-profiler-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
STEP_TAIL=25
STEP_TIMEOUT=180
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

step tests.device env BP_TEST_SEED="$(seed)" BP_TEST_DEVICES=cuda:0,cpu:0 \
  "$build/bin/bp_device_tests" --gtest_filter='*Profiler*' --gtest_brief=1
step tests.trainer env BP_TEST_DEVICES=cuda:0,cpu:0 "$build/bin/bp_nn_tests" \
  --gtest_filter='*TrainerWritesPlainProgress*' --gtest_brief=1
step mlp_step "$build/bin/bp-profile-mlp-step" cuda:0 "$out/mlp_cuda" 5
step memviz bash -c "python3 tools/bp-memviz '$out/mlp_cuda.trace.json' -o '$out/mlp_cuda_trace.html' &&
  python3 tools/bp-memviz '$out/mlp_cuda.snapshot.json' -o '$out/mlp_cuda_snapshot.html'"
step overhead.cuda "$build/bin/bp-profiler-overhead" cuda:0 20000 7
step overhead.cpu "$build/bin/bp-profiler-overhead" cpu:0 20000 7
step tiny_add python3 bench/compare.py --bp "$build/bin/bp-bench" --device cuda:0 \
  --only 1-element --repeat 3

echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
