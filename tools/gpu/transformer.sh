#!/usr/bin/env bash
# GPU checks of the transformer family's CUDA kernels (issue 27, ABI 1.5), for the GPU machine
# (PyTorch present):
#   - cuda_transformer_test (embedding_backward's summation order bit for bit, embedding's
#     deferred index errors, attention's backward over chunks of query rows) and
#     cuda_plugin_test's support matrix (the 16 new ops listed);
#   - bp-conformance on cuda:0 for the 16 new ops (layer_norm, gelu, silu, embedding, attention
#     and their backward ops, triu, tril, cumsum, sin, cos, rsqrt) against their float64
#     references, plus gather and scatter_add (whose deferred index errors the embedding ops
#     share), with a fresh seed; then every suite on cuda:0 (nothing else regressed);
#   - example-gpt on cuda:0: CI's small configuration (nn.gpt_char's flags, loss below 2.3 at
#     step 600), then the full character GPT (6 layers, 6 heads, 384 wide, context 256, dropout
#     0.2) for GPT_STEPS steps (default 300) with 300 sampled bytes;
#   - bench/compare.py --only sdpa: Backplane's attention forward and forward+backward against
#     torch.nn.functional.scaled_dot_product_attention at L = 1024, 4096 and 16384 (bp-bench's
#     Note [Attention rows]), REPEAT interleaved runs, medians; with OWN_KERNELS=1 the
#     forward+backward rows again with BACKPLANE_CUDNN_ATTENTION=deterministic and =0 (Note
#     [cuDNN attention]).
# Without ALL the whole script fits one 10-minute command on the H100 (budget: tests and
# conformance ~2 min, the GPTs ~3 min, the comparison ~2 min per REPEAT).
#
#   source .device/env.sh   # when the machine has one
#   bash tools/gpu/transformer.sh BUILD_DIR [REPEAT=1]
#
# Pass: every summary line says rc=0 and the conformance logs show no FAIL. Logs and JSON go to
# $OUT (or ./transformer-out).
set -uo pipefail
build=${1:?usage: bash tools/gpu/transformer.sh BUILD_DIR [REPEAT]}
repeat=${2:-1}
out=${OUT:-transformer-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
STEP_TAIL=${STEP_TAIL:-8}
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
plugin=$build/lib/backplane/plugins/libbackplane-cuda.so
STEP_TIMEOUT=120 STEP_TAIL=20 step cuda_transformer_test "$build/bin/cuda_transformer_test" \
  --gtest_brief=1
# Note [cuDNN attention]: the attention cases on Backplane's own kernels, and a bad setting.
BACKPLANE_CUDNN_ATTENTION=0 STEP_TIMEOUT=120 STEP_TAIL=8 step cuda_transformer_test.own_kernels \
  "$build/bin/cuda_transformer_test" --gtest_brief=1 --gtest_filter='CudaTransformer.Attention*'
BACKPLANE_CUDNN_ATTENTION=deterministic STEP_TIMEOUT=120 STEP_TAIL=8 \
  step cuda_transformer_test.cudnn_deterministic "$build/bin/cuda_transformer_test" \
  --gtest_brief=1 --gtest_filter='CudaTransformer.Attention*'
BACKPLANE_CUDNN_ATTENTION=bogus STEP_TIMEOUT=60 STEP_TAIL=4 step cuda_transformer_test.bad_setting \
  "$build/bin/cuda_transformer_test" --gtest_brief=1 \
  --gtest_filter='CudaTransformer.AttentionRefusesABadCudnnSetting'
STEP_TIMEOUT=60 STEP_TAIL=10 step cuda_plugin_test.list_ops "$build/bin/cuda_plugin_test" \
  --gtest_filter='CudaPlugin.PropertiesAndListOps'
filters=()
for op in layer_norm gelu silu embedding scaled_dot_product_attention triu tril cumsum sin cos \
  rsqrt gather scatter_add; do
  filters+=(--filter "kernels.$op")
done
STEP_TIMEOUT=${CONFORMANCE_TIMEOUT:-180} step conformance.transformer.cuda0 \
  "$build/bin/bp-conformance" --plugin "$plugin" --device cuda:0 "${filters[@]}" \
  --seed "$(seed)" --json "$out/conformance-transformer-cuda0.json"
grep -E "^FAIL|UNSUPPORTED|declared" "$out/conformance.transformer.cuda0.log" | head -40
BACKPLANE_CUDNN_ATTENTION=0 STEP_TIMEOUT=${CONFORMANCE_TIMEOUT:-180} step \
  conformance.sdpa_own_kernels.cuda0 "$build/bin/bp-conformance" --plugin "$plugin" \
  --device cuda:0 --filter kernels.scaled_dot_product_attention --seed "$(seed)"
if [ -n "${ALL:-}" ]; then
  STEP_TIMEOUT=${CONFORMANCE_TIMEOUT:-180} step conformance.all.cuda0 \
    "$build/bin/bp-conformance" --plugin "$plugin" --device cuda:0 --seed "$(seed)" \
    --json "$out/conformance-all-cuda0.json"
  grep -E "^FAIL" "$out/conformance.all.cuda0.log" | head -40
fi
if [ -x "$build/bin/example-gpt" ] && [ -d /usr/share/common-licenses ]; then
  STEP_TIMEOUT=120 STEP_TAIL=4 step gpt.small.cuda0 "$build/bin/example-gpt" --device cuda:0 \
    --layers 2 --heads 2 --width 64 --context 64 --batch 16 --steps 600 --dropout 0 --lr 3e-3 \
    --eval-every 100 --max-loss 2.3
  STEP_TIMEOUT=${GPT_TIMEOUT:-200} STEP_TAIL=16 step gpt.full.cuda0 "$build/bin/example-gpt" \
    --device cuda:0 --steps "${GPT_STEPS:-300}" --eval-every 100 --sample 300
fi
STEP_TIMEOUT=${COMPARE_TIMEOUT:-240} STEP_TAIL=40 step compare.sdpa python3 bench/compare.py \
  --bp "$build/bin/bp-bench" --device cuda:0 --only sdpa --repeat "$repeat" \
  --json "$out/compare-sdpa.json"
if [ -n "${OWN_KERNELS:-}" ]; then  # the same rows on cuDNN's deterministic backward, our kernels
  BACKPLANE_CUDNN_ATTENTION=deterministic STEP_TIMEOUT=${COMPARE_TIMEOUT:-240} STEP_TAIL=40 \
    step compare.sdpa_deterministic python3 bench/compare.py --bp "$build/bin/bp-bench" \
    --device cuda:0 --only "sdpa fwd+bwd" --repeat "$repeat" \
    --json "$out/compare-sdpa-deterministic.json"
  BACKPLANE_CUDNN_ATTENTION=0 STEP_TIMEOUT=${COMPARE_TIMEOUT:-240} STEP_TAIL=40 \
    step compare.sdpa_own_kernels python3 bench/compare.py --bp "$build/bin/bp-bench" \
    --device cuda:0 --only "sdpa fwd+bwd" --repeat "$repeat" \
    --json "$out/compare-sdpa-own-kernels.json"
fi
echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
