#!/usr/bin/env bash
# GPU checks of the convolutional networks (issue 26) beyond tools/gpu/conv.sh's kernels, for the
# GPU machine (PyTorch, cuDNN and NVIDIA's OpenCL driver present):
#   - ResNet-18 against PyTorch: make_resnet_fixture.py writes the narrow fixture CI reads
#     (copied to $OUT) and a full-width one (width 64, batch 8); bp_nn_tests ResNetFixture
#     compares logits, loss, gradients and running statistics on cpu:0 and cuda:0 for both;
#   - LeNet-5 on the digits: example-lenet on cuda:0, cpu:0 and NVIDIA's OpenCL, one seed,
#     accuracies and their spread (tests/nn/lenet_devices.py);
#   - the new ops' conformance cases on NVIDIA's OpenCL; device tests on cuda:0 (gradients of
#     every new op, graph threads);
#   - bp-bench-resnet against bench/resnet/torch_resnet.py in one command (compare.py, REPEAT
#     interleaved runs): training images/s f32 and bf16, eager and graph, inference b1 / b256.
#
#   bash tools/gpu/convnets.sh BUILD_DIR [REPEAT=3]
set -uo pipefail
build=${1:?usage: bash tools/gpu/convnets.sh BUILD_DIR [REPEAT]}
repeat=${2:-3}
out=${OUT:-convnets-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
if [ -z "${BACKPLANE_CUDNN_LIBRARY:-}" ] && ! ldconfig -p | grep -q 'libcudnn.so.9 '; then
  dir=$(python3 -c 'import os, nvidia.cudnn as c; print(os.path.join(list(c.__path__)[0], "lib"))' \
    2>/dev/null)
  [ -n "$dir" ] && [ -e "$dir/libcudnn.so.9" ] && export BACKPLANE_CUDNN_LIBRARY=$dir/libcudnn.so.9
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
fx=tests/fixtures/torch
STEP_TIMEOUT=60 step fixture.w8 python3 $fx/make_resnet_fixture.py --out "$out/resnet18_w8.safetensors"
STEP_TIMEOUT=60 step fixture.w64 python3 $fx/make_resnet_fixture.py --width 64 --batch 8 \
  --out /tmp/resnet18_w64.safetensors
for w in w8 w64; do
  f="$out/resnet18_w8.safetensors"
  [ $w = w64 ] && f=/tmp/resnet18_w64.safetensors
  BP_RESNET_FIXTURE=$f BACKPLANE_PLUGINS=cpu,cuda STEP_TIMEOUT=120 STEP_TAIL=12 \
    step "resnet.$w" "$build/bin/bp_nn_tests" --gtest_filter='ResNetFixture.*'
done
ocl=$(nvidia_opencl_dir) || ocl=""
STEP_TIMEOUT=150 STEP_TAIL=4 step lenet.cuda python3 tests/nn/lenet_devices.py \
  --binary "$build/bin/example-lenet" --data tests/fixtures/digits/digits.safetensors \
  --devices cuda:0,cpu:0
if [ -n "$ocl" ]; then
  OCL_ICD_VENDORS=$ocl STEP_TIMEOUT=100 STEP_TAIL=4 step lenet.nvidia-opencl python3 \
    tests/nn/lenet_devices.py --binary "$build/bin/example-lenet" \
    --data tests/fixtures/digits/digits.safetensors --devices opencl:0,cpu:0
  OCL_ICD_VENDORS=$ocl STEP_TIMEOUT=150 step conformance.nvidia-opencl \
    "$build/bin/bp-conformance" --plugin "$build/lib/backplane/plugins/libbackplane-opencl.so" \
    --filter "kernels.*" --seed "$(seed)"
  grep -E "^FAIL" "$out/conformance.nvidia-opencl.log" | head -20
fi
BP_TEST_DEVICES=cuda:0 STEP_TIMEOUT=120 STEP_TAIL=4 step device.cuda0 \
  "$build/bin/bp_device_tests" --gtest_brief=1
# Both sides with cuDNN's heuristics, then both with its algorithm search (cudnn.benchmark).
for mode in 0 1; do
  BACKPLANE_CUDNN_BENCHMARK=$mode STEP_TIMEOUT=240 STEP_TAIL=12 step "compare.resnet.bench$mode" \
    python3 bench/compare.py --bp "$build/bin/bp-bench-resnet" \
    --ref-bin bench/resnet/torch_resnet.py --device cuda:0 --repeat "$repeat" \
    --json "$out/compare-resnet-bench$mode.json"
done
echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
