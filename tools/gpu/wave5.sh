#!/usr/bin/env bash
# The GPU-machine commands of this wave (one H100), in parts that each fit one 10-minute call:
#   kernels  tools/gpu/transformer.sh with the cuDNN attention passes (Note [cuDNN attention]):
#            attention tests three ways, conformance, the GPTs, bench/compare.py's attention rows
#            REPEAT times (medians) and the deterministic / own-kernel rows; the fused AdamW
#            tests and its conformance on cuda:0; the asynchronous error tests on cuda:0 (an
#            out-of-range gather named at the next synchronisation, and at the op itself under
#            BACKPLANE_LAUNCH_BLOCKING=1)
#   python   tools/gpu/python.sh on <build>/python (a BP_BUILD_PYTHON=ON tree): pytest on cuda:0
#            with PyTorch and CuPy, the d2l example, op-overhead and DLPack benchmarks
#   gpt2     bench/gpt2/gpt2_compare.py on cuda:0 (logits, a bf16 AdamW step, tokens/s against
#            PyTorch eager, torch.compile and f32) and on cpu:0 (the comparisons)
#
#   source .device/env.sh && bash tools/gpu/wave5.sh .device/build kernels|python|gpt2 [REPEAT]
# TRANSFORMER=0 leaves out transformer.sh in `kernels` (only the attention tests run).
set -uo pipefail
build=${1:?usage: bash tools/gpu/wave5.sh BUILD_DIR kernels|python|gpt2 [REPEAT]}
part=${2:?usage: bash tools/gpu/wave5.sh BUILD_DIR kernels|python|gpt2 [REPEAT]}
repeat=${3:-3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${OUT:-wave5-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
source "$here/tools/gpu/common.sh"
plugin=$build/lib/backplane/plugins/libbackplane-cuda.so

case "$part" in
  kernels)
    if [ "${TRANSFORMER:-1}" = 1 ]; then
      OUT="$out/transformer" GPT_STEPS=${GPT_STEPS:-100} OWN_KERNELS=1 \
        bash "$here/tools/gpu/transformer.sh" "$build" "$repeat"
    else  # the attention tests only
      STEP_TIMEOUT=120 STEP_TAIL=4 step cuda_transformer_test "$build/bin/cuda_transformer_test" \
        --gtest_brief=1
    fi
    STEP_TIMEOUT=180 STEP_TAIL=4 step cuda_plugin_test "$build/bin/cuda_plugin_test" \
      --gtest_brief=1
    STEP_TIMEOUT=120 STEP_TAIL=6 step nn.fused_adam.cuda0 env BP_TEST_DEVICES=cuda:0 \
      "$build/bin/bp_nn_tests" --gtest_filter='*FusedAdam*' --gtest_brief=1
    STEP_TIMEOUT=120 STEP_TAIL=4 step conformance.adamw.cuda0 "$build/bin/bp-conformance" \
      --plugin "$plugin" --device cuda:0 --filter kernels.adamw --seed "$(seed)"
    STEP_TIMEOUT=120 STEP_TAIL=12 step async_errors.cuda0 "$build/bin/bp_unit_tests" \
      --gtest_filter='AsyncErrors.Cuda*' --gtest_brief=1
    STEP_TIMEOUT=120 STEP_TAIL=8 step conformance.errors.cuda0 "$build/bin/bp-conformance" \
      --plugin "$plugin" --device cuda:0 --filter 'errors.*' --seed "$(seed)"
    ;;
  python)
    OUT="$out/python" bash "$here/tools/gpu/python.sh" "$build/python"
    ;;
  gpt2)
    export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
    export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    STEP_TIMEOUT=480 STEP_TAIL=30 step gpt2.cuda0 python3 "$here/bench/gpt2/gpt2_compare.py" \
      --device cuda:0 --bench --json "$out/gpt2-cuda0.json" --markdown "$out/gpt2-cuda0.md"
    STEP_TIMEOUT=100 STEP_TAIL=8 step gpt2.cpu0 python3 "$here/bench/gpt2/gpt2_compare.py" \
      --device cpu:0 --cmp-batch 1 --json "$out/gpt2-cpu0.json"
    ;;
  *)
    echo "wave5.sh: unknown part '$part' (kernels, python or gpt2)" >&2
    exit 2
    ;;
esac
echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary-$part.txt"
