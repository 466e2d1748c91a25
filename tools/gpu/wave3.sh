#!/usr/bin/env bash
# One GPU-machine command that checks this wave's GPU work in a tight device budget:
#   1. tools/gpu/transformer.sh's steps (cuda_transformer_test, the support matrix,
#      bp-conformance of the ABI 1.5 family on cuda:0, the character GPT on cuda:0, attention
#      against PyTorch's scaled_dot_product_attention), with the full GPT shortened to
#      GPT_STEPS (default 150) steps;
#   2. bp-conformance of the ABI 1.5 family on NVIDIA's OpenCL driver;
#   3. the training-state tests (AdamW, schedulers, checkpoint resume) on cuda:0.
#
#   source .device/env.sh && bash tools/gpu/wave3.sh .device/build
set -uo pipefail
build=${1:?usage: bash tools/gpu/wave3.sh BUILD_DIR}
here=$(dirname "${BASH_SOURCE[0]}")
out=${OUT:-wave3-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export OUT=$out
GPT_STEPS=${GPT_STEPS:-150} COMPARE_TIMEOUT=${COMPARE_TIMEOUT:-150} bash "$here/transformer.sh" "$build" 1
source "$here/common.sh"
filters=()
for op in layer_norm gelu silu embedding scaled_dot_product_attention triu tril cumsum sin cos \
  rsqrt; do
  filters+=(--filter "kernels.$op")
done
if vendors=$(nvidia_opencl_dir); then
  STEP_TIMEOUT=150 OCL_ICD_VENDORS=$vendors step conformance.transformer.nvidia_opencl \
    env OCL_ICD_VENDORS="$vendors" "$build/bin/bp-conformance" \
    --plugin "$build/lib/backplane/plugins/libbackplane-opencl.so" --device opencl:0 \
    "${filters[@]}" --seed "$(seed)" --json "$out/conformance-transformer-nvidia-opencl.json"
  grep -E "^FAIL" "$out/conformance.transformer.nvidia_opencl.log" | head -20
fi
STEP_TIMEOUT=120 STEP_TAIL=4 step nn.train_state.cuda0 env BP_TEST_DEVICES=cuda:0 \
  "$build/bin/bp_nn_tests" --gtest_filter='*TrainState*:*Transformer*'
echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary-wave3.txt"
