#!/usr/bin/env bash
# GPU checks of the convolutional family on the CUDA backend (issue 26), for the GPU machine:
#   - where cuDNN is: libcudnn.so.9 on the loader's path, else PyTorch's pip package
#     (nvidia/cudnn/lib), exported as BACKPLANE_CUDNN_LIBRARY;
#   - cuda_conv_test (cuDNN wiring against float64, batch norm statistics, dropout's mask, the
#     softmax paths, deferred index errors, a missing cuDNN) and cuda_plugin_test;
#   - bp-conformance on cuda:0, every suite (the 20 new ops against their float64 references
#     included), with a fresh seed;
#   - bench/compare.py --only conv2d / pool rows: Backplane against PyTorch (cuDNN) in the same
#     command, REPEAT interleaved runs, medians (bp-bench's Note [Convolution rows]); the conv
#     rows again with BACKPLANE_CUDNN_BENCHMARK=1 (cuDNN's algorithms timed once per shape).
#
#   bash tools/gpu/conv.sh BUILD_DIR [REPEAT=3]
#
# ONLY_CONV=1 skips the pooling and cudnnFind rows. Pass: every summary line says rc=0. Logs and
# JSON go to $OUT (or ./conv-out).
set -uo pipefail
build=${1:?usage: bash tools/gpu/conv.sh BUILD_DIR [REPEAT]}
repeat=${2:-3}
export BP_CUDA_PLUGIN=${BP_CUDA_PLUGIN:-$build/lib/backplane/plugins/libbackplane-cuda.so}
out=${OUT:-conv-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
STEP_TAIL=${STEP_TAIL:-8}
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ -z "${BACKPLANE_CUDNN_LIBRARY:-}" ] && ! ldconfig -p | grep -q 'libcudnn.so.9 '; then
  dir=$(python3 -c 'import os, nvidia.cudnn as c; print(os.path.join(list(c.__path__)[0], "lib"))' \
    2>/dev/null)
  [ -n "$dir" ] && [ -e "$dir/libcudnn.so.9" ] && export BACKPLANE_CUDNN_LIBRARY=$dir/libcudnn.so.9
fi
echo "BACKPLANE_CUDNN_LIBRARY=${BACKPLANE_CUDNN_LIBRARY:-unset: libcudnn.so.9 from the loader path}"

# Per-step limits (seconds) fit the whole script in about six minutes on the H100.
STEP_TIMEOUT=60 STEP_TAIL=40 step cuda_conv_test "$build/bin/cuda_conv_test" --gtest_brief=1
STEP_TIMEOUT=${CONFORMANCE_TIMEOUT:-120} step conformance.cuda0 "$build/bin/bp-conformance" \
  --device cuda:0 --filter "${CONFORMANCE_FILTER:-*}" --seed "$(seed)" \
  --json "$out/conformance-cuda0.json"
grep -E "^FAIL" "$out/conformance.cuda0.log" | head -40
rows="conv2d pool2d"
[ -n "${ONLY_CONV:-}" ] && rows=conv2d
for only in $rows; do
  STEP_TIMEOUT=${COMPARE_TIMEOUT:-70} STEP_TAIL=40 step "compare.$only" python3 bench/compare.py \
    --bp "$build/bin/bp-bench" --device cuda:0 --only "$only" --repeat "$repeat" \
    --json "$out/compare-$only.json"
done
# The same convolutions with cuDNN's algorithms timed once per shape (cudnnFind*Ex), against
# PyTorch's default (cudnn.benchmark off).
[ -n "${ONLY_CONV:-}" ] || BACKPLANE_CUDNN_BENCHMARK=1 STEP_TIMEOUT=${COMPARE_TIMEOUT:-70} STEP_TAIL=40 \
  step compare.conv2d.find python3 bench/compare.py --bp "$build/bin/bp-bench" \
  --device cuda:0 --only conv2d --repeat "$repeat" --json "$out/compare-conv2d-find.json"
STEP_TIMEOUT=60 step cuda_plugin_test "$build/bin/cuda_plugin_test" --gtest_brief=1 \
  --gtest_filter="${PLUGIN_TEST_FILTER:-*}"

echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
