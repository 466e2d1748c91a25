#!/usr/bin/env bash
# GPU checks of the contracts work (issue 18, items 1 and 2), for the GPU machine:
#   - cuda_plugin_test (op table, attribute ids, add/sub with alpha through the ABI);
#   - bp-conformance on cuda:0, every suite: concurrency.one_stream_threads (8 threads queue
#     matmul + add on ONE fresh stream, first use included; reserved memory back to its baseline
#     afterwards), kernels.find_kernel_id, kernels.attrs_minor1_layout, kernels.{add,sub}_alpha*;
#     then one_stream_threads alone 5 more times with fresh seeds;
#   - the same threading test against the CUDA plugin as it was before the fix (ABI 1.1, built
#     from commit 65ed411), when BP_BEFORE_CUDA_PLUGIN names it or BUILD_DIR/before holds it:
#     its first-matmul workspace set-up races, and the leaked workspaces show in `reserved`;
#   - bp_device_tests on cuda:0: add_ with alpha and the dtype-domain errors;
#   - bp-bench per-op overhead on cuda:0 (1-element add queued / with a sync), for comparison
#     with README.md's 3.98 / 9.72 us (compare only within one run on one machine).
#
#   bash tools/gpu/contracts.sh BUILD_DIR
#
# Pass: every "after" line of the summary says rc=0; the "before" lines (when run) say rc=1 with
# concurrency.one_stream_threads FAILing on "reserved memory grew". Logs go to $OUT (or
# ./contracts-out). About 3 minutes on the H100.
set -uo pipefail
build=${1:?usage: bash tools/gpu/contracts.sh BUILD_DIR}
# The backend test programs dlopen the plugin of the build tree they were built in unless told.
export BP_CUDA_PLUGIN=${BP_CUDA_PLUGIN:-$build/lib/backplane/plugins/libbackplane-cuda.so}
out=${OUT:-contracts-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
before=${BP_BEFORE_CUDA_PLUGIN:-$build/before/libbackplane-cuda.so}
STEP_TAIL=4
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# The PASS/FAIL line of one test in a log, shortened for the summary.
result() { grep -m1 -E "^(PASS|FAIL|SKIP) +$2" "$out/$1.log" | cut -c1-170; }

step after.cuda_plugin_test "$build/bin/cuda_plugin_test" --gtest_brief=1
step after.conformance.cuda0 "$build/bin/bp-conformance" --device cuda:0 --seed "$(seed)" \
  --json "$out/conformance-cuda0.json"
for i in 1 2 3 4 5; do
  step "after.one_stream_threads.$i" "$build/bin/bp-conformance" --device cuda:0 \
    --filter 'concurrency.one_stream_threads' --seed "$(seed)"
done
if [ -f "$before" ]; then
  for i in 1 2 3; do
    step "before.one_stream_threads.$i" "$build/bin/bp-conformance" --plugin "$before" \
      --device cuda:0 --filter 'concurrency.one_stream_threads' --seed "$(seed)"
  done
else
  summary+=("before.*: skipped (no $before)")
fi
step after.device_tests.cuda0 env BP_TEST_DEVICES=cuda:0 "$build/bin/bp_device_tests" \
  --gtest_filter='*AddInPlaceWithAlpha*:*DtypeDomain*:*CastsAndInPlace*' --gtest_brief=1
step after.bench.queued "$build/bin/bp-bench" --device cuda:0 --only queued
step after.bench.synced "$build/bin/bp-bench" --device cuda:0 --only synced

echo "=== summary"
{
  printf '%s\n' "${summary[@]}"
  echo "--- the threading test"
  result after.conformance.cuda0 'concurrency.one_stream_threads'
  for i in 1 2 3 4 5; do result "after.one_stream_threads.$i" 'concurrency.one_stream_threads'; done
  if [ -f "$before" ]; then
    for i in 1 2 3; do result "before.one_stream_threads.$i" 'concurrency.one_stream_threads'; done
  fi
  echo "--- ABI 1.2 on cuda:0"
  for t in 'kernels.find_kernel_id' 'kernels.attrs_minor1_layout' 'kernels.add_alpha\[' \
    'kernels.sub_alpha_inplace\['; do
    result after.conformance.cuda0 "$t"
  done
  tail -n 1 "$out/after.conformance.cuda0.log"
  echo "--- per-op overhead (bp-bench, us/op)"
  grep -hE '^ +1-element' "$out/after.bench.queued.log" "$out/after.bench.synced.log" || true
} | tee "$out/summary.txt"
