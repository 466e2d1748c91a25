#!/usr/bin/env bash
# GPU check of plugin ABI 1.2's native handles and external memory on cuda:0 (docs/tensors.md,
# "Native handles and external memory"). Runs, each under a time limit:
#   cuda_native_test    the CUDA plugin's slots against cudaMalloc'd, pinned, managed and
#                       other-device memory and foreign cudaStream_t (release checked to run
#                       only once the freeing stream is idle)
#   device_native       bp_device_tests' NativeTest on cuda:0 and cpu:0 (from_blob aliasing,
#                       native addresses of views, import_stream, typed errors)
#   conformance_native  bp-conformance --device cuda:0, suites abi and native
#   conformance_cuda    the whole bp-conformance on cuda:0 (kernels read buffers through the
#                       tagged-handle resolution this change added)
#   cuda_plugin_test    the CUDA plugin's own tests, for the same reason
# Usage: bash tools/gpu/native.sh BUILD_DIR   (logs under $OUT, else ./native-out)
# Pass: every row of the summary says PASS.
set -uo pipefail
build=${1:?usage: bash tools/gpu/native.sh BUILD_DIR}
# The backend test programs dlopen the plugin of the build tree they were built in unless told.
export BP_CUDA_PLUGIN=${BP_CUDA_PLUGIN:-$build/lib/backplane/plugins/libbackplane-cuda.so}
out=${OUT:-native-out}
mkdir -p "$out"
rows=()
run() {  # run NAME LIMIT_S CMD...
  local name=$1 limit=$2
  shift 2
  echo "=== $name: $*"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  tail -n 12 "$out/$name.log"
  local last
  last=$(grep -E "^\[  (PASSED|FAILED)|passed, [0-9]+ failed" "$out/$name.log" | tail -n 1)
  rows+=("$(printf '%-20s %-4s rc=%-3s %4ss  %s' "$name" "$([ $rc = 0 ] && echo PASS || echo FAIL)" \
    "$rc" $((SECONDS - t0)) "$last")")
}
run cuda_native_test 45 "$build/bin/cuda_native_test" --gtest_brief=1
run device_native 45 env BP_TEST_DEVICES=cuda:0,cpu:0 "$build/bin/bp_device_tests" \
  --gtest_filter='*NativeTest*' --gtest_brief=1
run conformance_native 45 "$build/bin/bp-conformance" --device cuda:0 --filter 'abi.*' \
  --filter 'native.*' --json "$out/conformance_native.json"
grep -E "^(PASS|FAIL|SKIP) +native\." "$out/conformance_native.log" | cut -c1-220
run conformance_cuda 110 "$build/bin/bp-conformance" --device cuda:0 --json "$out/conformance_cuda.json"
run cuda_plugin_test 110 "$build/bin/cuda_plugin_test" --gtest_brief=1
echo "=== summary (native handles on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1))"
printf '%s\n' "${rows[@]}" | tee "$out/summary.txt"
