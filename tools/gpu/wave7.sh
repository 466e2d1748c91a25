#!/usr/bin/env bash
# GPU checks of the session of 2026-12-01 (issue 27's GPT-2 step: the fused cross_entropy of ABI
# 1.8, the one-read layer_norm backward, wide strided copies), for the GPU machine (PyTorch
# present):
#   conformance  bp-conformance on cuda:0 and on NVIDIA's OpenCL driver for cross_entropy, copy,
#                layer_norm and the reductions, with a fresh seed
#   nn           the nn tests of the loss, layer norm, GPT and transformer layers on cuda:0, and
#                the asynchronous-error tests (a bad target is reported at the next sync)
#   bench        bench/compare.py for the cross_entropy and head-transpose copy rows (Backplane
#                against PyTorch in one command, three interleaved runs)
#   gpt2         bench/gpt2/gpt2_compare.py --bench on cuda:0 (logits, a bf16 step, tokens/s;
#                GPT2_ARGS adds options, e.g. --no-compile)
#   profile      bench/gpt2/gpt2_profile.py on cuda:0 (device time per op, both libraries)
#   resnet       where a ResNet-18 bf16 training step's device time goes, Backplane (its trace)
#                and PyTorch (channels-last autocast), bench/resnet/trace_top.py
# Each part logs to $OUT/<step>.log; the summary lists rc and time per step.
#
#   source .device/env.sh
#   bash tools/gpu/wave7.sh BUILD_DIR PART...
set -uo pipefail
build=${1:?usage: bash tools/gpu/wave7.sh BUILD_DIR PART...}
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${OUT:-wave7-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
source "$here/tools/gpu/common.sh"
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
py=${BP_PYTHON:-python3}
plugins=$build/lib/backplane/plugins
filters=(--filter 'kernels.cross_entropy*' --filter 'kernels.copy*' --filter 'kernels.layer_norm*'
  --filter 'kernels.sum*' --filter 'kernels.mean*' --filter 'kernels.log_softmax*')

for part in "$@"; do
  case "$part" in
    conformance)
      STEP_TIMEOUT=300 STEP_TAIL=4 step conformance.cuda0 "$build/bin/bp-conformance" \
        --plugin "$plugins/libbackplane-cuda.so" --device cuda:0 "${filters[@]}" --seed "$(seed)"
      if vendors=$(nvidia_opencl_dir); then
        STEP_TIMEOUT=300 STEP_TAIL=4 step conformance.opencl-nvidia env OCL_ICD_VENDORS="$vendors" \
          "$build/bin/bp-conformance" --plugin "$plugins/libbackplane-opencl.so" --device opencl:0 \
          "${filters[@]}" --seed "$(seed)"
      fi
      ;;
    nn)
      STEP_TIMEOUT=300 STEP_TAIL=6 step nn.cuda0 env BP_TEST_DEVICES=cuda:0 "$build/bin/bp_nn_tests" \
        --gtest_filter='*CrossEntropy*:*ross*:*ayerNorm*:*Gpt*:*Transformer*:*Attention*' \
        --gtest_brief=1
      STEP_TIMEOUT=200 STEP_TAIL=6 step async_errors env BP_TEST_DEVICES=cuda:0 \
        "$build/bin/bp_unit_tests" --gtest_filter='*Async*' --gtest_brief=1
      ;;
    bench)
      for only in cross_entropy "copy heads" layer_norm; do
        STEP_TIMEOUT=300 STEP_TAIL=10 step "bench.${only// /_}" "$py" "$here/bench/compare.py" \
          --bp "$build/bin/bp-bench" --device cuda:0 --only "$only" --repeat 3 \
          --json "$out/bench-${only// /_}.json"
      done
      ;;
    gpt2)
      STEP_TIMEOUT=480 STEP_TAIL=24 step gpt2.bench "$py" "$here/bench/gpt2/gpt2_compare.py" \
        --device cuda:0 --bench --json "$out/gpt2-cuda0.json" --markdown "$out/gpt2-cuda0.md" \
        ${GPT2_ARGS:-}
      ;;
    profile)
      STEP_TIMEOUT=400 STEP_TAIL=60 step gpt2.profile "$py" "$here/bench/gpt2/gpt2_profile.py" \
        --device cuda:0 --out "$out/gpt2-profile"
      ;;
    resnet)
      STEP_TIMEOUT=300 STEP_TAIL=3 step resnet.bp env BACKPLANE_TRACE="$out/resnet-bf16-trace.json" \
        "$build/bin/bp-bench-resnet" --device cuda:0 --only resnet18_train_bf16_b256 --iters 5
      STEP_TIMEOUT=120 STEP_TAIL=28 step resnet.bp.top "$py" "$here/bench/resnet/trace_top.py" \
        "$out/resnet-bf16-trace.json" --top 25
      STEP_TIMEOUT=300 STEP_TAIL=34 step resnet.torch.top "$py" "$here/bench/resnet/trace_top.py" \
        --torch --dtype bf16 --top 25
      rm -f "$out/resnet-bf16-trace.json"
      ;;
    *)
      echo "wave7.sh: unknown part '$part' (conformance, nn, bench, gpt2, profile or resnet)" >&2
      exit 2
      ;;
  esac
done
echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
