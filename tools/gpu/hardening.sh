#!/usr/bin/env bash
# GPU checks of the hardening work (issue 17), for the GPU machine (CUDA, no oneTBB: ship it):
#   - cuda_plugin_test with the shared dtype-aware comparison and the folded elementwise launch
#     wrappers (cuda_elementwise_ops.cuh), under 3 fresh seeds;
#   - bp_device_tests' MathTest on cuda:0 (SubnormalResults included) under 3 fresh seeds;
#   - bp-conformance kernels on cuda:0;
#   - the concurrency stress (bp_stress_tests) on cuda:0 and cpu:0;
#   - OpenCL through NVIDIA's driver selected with OCL_ICD_VENDORS (a folder holding
#     nvidia.icd), where the driver exists: opencl_plugin_test.
#
#   bash tools/gpu/hardening.sh BUILD_DIR
#
# Pass: every line of the summary says rc=0 (opencl lines say "skipped" without the driver).
# Logs go to $OUT (or ./hardening-out). Runs in about 3 minutes on the H100.
set -uo pipefail
build=${1:?usage: bash tools/gpu/hardening.sh BUILD_DIR}
out=${OUT:-hardening-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
STEP_TAIL=4
STEP_TIMEOUT=200
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

for i in 1 2 3; do
  s=$(seed)
  step "cuda_plugin_test.seed$i" env BP_TEST_SEED="$s" "$build/bin/cuda_plugin_test" --gtest_brief=1
done
step cuda_nodriver_test "$build/bin/cuda_nodriver_test" --gtest_brief=1
for i in 1 2 3; do
  s=$(seed)
  step "device_math.cuda0.seed$i" env BP_TEST_SEED="$s" BP_TEST_DEVICES=cuda:0 \
    "$build/bin/bp_device_tests" --gtest_filter='*MathTest*' --gtest_brief=1
done
step conformance.cuda0.kernels "$build/bin/bp-conformance" --device cuda:0 --filter 'kernels.*' \
  --seed "$(seed)" --json "$out/conformance-cuda0.json"
step stress.cuda0 env BP_TEST_DEVICES=cuda:0,cpu:0 "$build/bin/bp_stress_tests" --gtest_brief=1

nv_ocl=/usr/local/nvidia/lib64/libnvidia-opencl.so.1
if [ -x "$build/bin/opencl_plugin_test" ] && vendors=$(nvidia_opencl_dir); then
  step opencl_plugin_test.nvidia env OCL_ICD_VENDORS="$vendors" \
    "$build/bin/opencl_plugin_test" --gtest_brief=1
  grep -m1 'opencl:0:' "$out/opencl_plugin_test.nvidia.log" || true
else
  summary+=("$(printf '%-28s skipped (no %s or no opencl_plugin_test)' opencl.nvidia "$nv_ocl")")
fi

echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
