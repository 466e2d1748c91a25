#!/usr/bin/env bash
# GPU checks of issue 27's GPT-2 small comparison and the fused AdamW update (ABI 1.6), for the
# GPU machine (PyTorch present):
#   - nn tests FusedAdamTest.* on every device (fused against the per-op update over 20 steps)
#     and cuda_plugin_test's support matrix;
#   - bp-conformance on cuda:0 for adamw (every dtype, 61 parameters in one launch, a
#     parameter of 2^20 elements) against its float64 reference, with a fresh seed;
#   - bench/gpt2/gpt2_compare.py on cuda:0: PyTorch's GPT-2 small weights through safetensors
#     into Backplane's GPT, f32 logits (max |diff| / max |ref| <= 1e-4) and one bf16 autocast
#     AdamW step (losses within 1e-2), then tokens/s at batch 8 x 1024 for PyTorch eager bf16,
#     torch.compile, PyTorch f32, Backplane eager bf16, Backplane graph replay and Backplane f32
#     (JSON and markdown in $OUT); then the comparisons alone on cpu:0 (batch 1 x 1024).
# Budget: about 6 minutes on the H100 (torch.compile's compilation is most of the bench).
#
#   source .device/env.sh
#   bash tools/gpu/gpt2.sh BUILD_DIR [PYTHON]
#
# Pass: every summary line says rc=0; gpt2 logs end with PASS. Logs go to $OUT (or
# ./gpt2-out).
set -uo pipefail
build=${1:?usage: bash tools/gpu/gpt2.sh BUILD_DIR [PYTHON]}
py=${2:-python3}
out=${OUT:-gpt2-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$here/tools/gpu/common.sh"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
plugin=$build/lib/backplane/plugins/libbackplane-cuda.so
STEP_TIMEOUT=120 STEP_TAIL=8 step nn.fused_adam "$build/bin/bp_nn_tests" \
  --gtest_filter='*FusedAdam*' --gtest_brief=1
STEP_TIMEOUT=60 STEP_TAIL=4 step cuda_plugin_test.list_ops "$build/bin/cuda_plugin_test" \
  --gtest_filter='CudaPlugin.PropertiesAndListOps'
STEP_TIMEOUT=120 step conformance.adamw.cuda0 "$build/bin/bp-conformance" --plugin "$plugin" \
  --device cuda:0 --filter kernels.adamw --seed "$(seed)" --json "$out/conformance-adamw.json"
STEP_TIMEOUT=420 STEP_TAIL=24 step gpt2.cuda0 "$py" "$here/bench/gpt2/gpt2_compare.py" \
  --device cuda:0 --bench --json "$out/gpt2-cuda0.json" --markdown "$out/gpt2-cuda0.md"
STEP_TIMEOUT=300 STEP_TAIL=8 step gpt2.cpu0 "$py" "$here/bench/gpt2/gpt2_compare.py" \
  --device cpu:0 --cmp-batch 1 --json "$out/gpt2-cpu0.json"
printf '%s\n' "${summary[@]}"
