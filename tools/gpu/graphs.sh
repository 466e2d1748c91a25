#!/usr/bin/env bash
# GPU checks of graphs and the eager per-op path (issue 13) on the GPU machine:
#   - bp_device_tests' GraphTest (native CUDA graphs and the recorded list) on cuda:0, and on
#     NVIDIA's OpenCL driver where it exists; the rest of bp_device_tests on cuda:0;
#   - bp-conformance graphs.* on the CUDA and OpenCL plugins, and the whole kit on cuda:0;
#   - bp-launch-floor (REPEAT runs): the host time of a one-element op layer by layer (empty
#     launch, add kernel, the plugin's launch slot, libbackplane in place and with an output,
#     1000 ops replayed from a graph);
#   - per-op and 1000-op graph replay costs against libtorch C++ (tools/gpu/libtorch_bench.sh:
#     at::cuda::CUDAGraph), medians of REPEAT interleaved runs, on cuda:0 and cpu:0;
#   - bp-bench-train on cuda:0: the MLP step eager and replayed from a bp::Graph, against
#     PyTorch's eager step and its CUDA-graph replay, and the losses of both compared.
#
#   bash tools/gpu/graphs.sh BUILD_DIR [REPEAT=5]
set -uo pipefail
build=${1:?usage: bash tools/gpu/graphs.sh BUILD_DIR [REPEAT]}
repeat=${2:-5}
out=${OUT:-graphs-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

step graphs.cuda0 env BP_TEST_SEED="$(seed)" BP_TEST_DEVICES=cuda:0 "$build/bin/bp_device_tests" \
  --gtest_filter='*GraphTest*' --gtest_brief=1
if vendors=$(nvidia_opencl_dir); then
  step graphs.opencl.nvidia env OCL_ICD_VENDORS="$vendors" BP_TEST_SEED="$(seed)" \
    BP_TEST_DEVICES=opencl:0 "$build/bin/bp_device_tests" --gtest_filter='*GraphTest*' \
    --gtest_brief=1
  step conformance.graphs.opencl env OCL_ICD_VENDORS="$vendors" "$build/bin/bp-conformance" \
    --plugin "$build/lib/backplane/plugins/libbackplane-opencl.so" --filter 'graphs.*' \
    --seed "$(seed)"
fi
step conformance.graphs.cuda "$build/bin/bp-conformance" \
  --plugin "$build/lib/backplane/plugins/libbackplane-cuda.so" --filter 'graphs.*' --seed "$(seed)"
for r in $(seq "$repeat"); do
  STEP_TAIL=9 step "launch-floor.$r" "$build/bin/bp-launch-floor" --device cuda:0
done
STEP_TIMEOUT=400 step libtorch bash "$(dirname "${BASH_SOURCE[0]}")/libtorch_bench.sh" "$build" \
  "$repeat" cuda:0 cpu:0
STEP_TAIL=30 STEP_TIMEOUT=300 step train "$build/bin/bp-bench-train" --device cuda:0 --iters 200 \
  --warmup 20
step device.cuda0 env BP_TEST_SEED="$(seed)" BP_TEST_DEVICES=cuda:0 "$build/bin/bp_device_tests" \
  --gtest_brief=1
STEP_TIMEOUT=300 step conformance.cuda0 "$build/bin/bp-conformance" --device cuda:0 \
  --seed "$(seed)" --json "$out/conformance-cuda0.json"
step cuda_plugin_test env BP_TEST_SEED="$(seed)" "$build/bin/cuda_plugin_test" --gtest_brief=1

echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
