#!/usr/bin/env bash
# GPU checks of the fused ops of issue 14 (one-pass sumsq/norm, linear with bias and ReLU) on
# the GPU machine:
#   - cuda_plugin_test (the support matrix now lists sumsq, norm, linear for every float dtype);
#   - bp_device_tests' FusedTest and MathTest on cuda:0, and on NVIDIA's OpenCL driver where it
#     exists (selected with OCL_ICD_VENDORS);
#   - bp-conformance kernels on cuda:0 (the sumsq/norm/linear cases among them);
#   - the benchmark table on cuda:0 against PyTorch, medians of REPEAT interleaved runs
#     (bench/compare.py: norm against torch.linalg.vector_norm), and the MLP forward
#     (Sequential Linear-ReLU-Linear, now one fused linear+ReLU) and SGD training step.
#
#   bash tools/gpu/fused.sh BUILD_DIR [REPEAT=5]
#
# Pass: every line of the summary says rc=0; "norm" in the compare table at >= 0.95x.
set -uo pipefail
build=${1:?usage: bash tools/gpu/fused.sh BUILD_DIR [REPEAT]}
repeat=${2:-5}
out=${OUT:-fused-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

step cuda_plugin_test env BP_TEST_SEED="$(seed)" "$build/bin/cuda_plugin_test" --gtest_brief=1
step device.cuda0 env BP_TEST_SEED="$(seed)" BP_TEST_DEVICES=cuda:0 "$build/bin/bp_device_tests" \
  --gtest_filter='*FusedTest*:*MathTest*' --gtest_brief=1
if vendors=$(nvidia_opencl_dir); then
  step device.opencl.nvidia env OCL_ICD_VENDORS="$vendors" BP_TEST_SEED="$(seed)" \
    BP_TEST_DEVICES=opencl:0 "$build/bin/bp_device_tests" --gtest_filter='*FusedTest*' \
    --gtest_brief=1
fi
step conformance.cuda0 "$build/bin/bp-conformance" --device cuda:0 --filter 'kernels.*' \
  --seed "$(seed)" --json "$out/conformance-cuda0.json"
step compare python3 bench/compare.py --bp "$build/bin/bp-bench" --device cuda:0 \
  --repeat "$repeat" --json "$out/compare-cuda0.json"
step mlp "$build/bin/bp-bench-mlp" --device cuda:0
[ -x "$build/bin/bp-bench-train" ] && step train "$build/bin/bp-bench-train" --device cuda:0

echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
