#!/usr/bin/env bash
# GPU checks of this wave (sessions of 2026-11-27 and 2026-12-01), for the GPU machine (PyTorch
# present):
#   leak     issue 32: the GPU pytest files that load PyTorch with CUDA, with the leak-check
#            plugin (tools/gpu/pytest_leakcheck.py) listing what holds a Device at exit, then
#            with LEAK_CLEAR=1; the nanobind report, if any, is in each log
#   profile  issue 27: bench/gpt2/gpt2_profile.py on cuda:0 (device time per op, Backplane and
#            PyTorch, batch 8 x 1024 bf16 training steps)
#   startup  issue 29: bp-bench-startup on the GPU host, the first cuda op included
#   pytest   the whole Python suite on the GPU host (as tools/gpu/python.sh runs it)
#   events   cuda_event_test and the async-error tests (the event-record fast path)
#   reduce   bp-conformance on cuda:0 for every reduction and log_softmax, the nn tests of the
#            losses and linear on cuda:0
#   gpt2     bench/gpt2/gpt2_compare.py --bench on cuda:0 (tokens/s against PyTorch)
#   loss     the fused cross_entropy (ABI 1.8), copy and layer_norm: bp-conformance on cuda:0
#            and on NVIDIA's OpenCL driver for them and the reductions, the nn tests of the loss,
#            layer norm, GPT, transformer and attention on cuda:0, the async-error tests
#   rows     bench/compare.py for the cross_entropy, head-transpose copy, layer_norm and
#            batch_norm rows (Backplane against PyTorch in one command, three interleaved runs)
#   resnet   where a ResNet-18 bf16 autocast training step's device time goes (Backplane's trace,
#            its steady-state half, and PyTorch's profiler; bench/resnet/trace_top.py), then
#            bench/compare.py for the training rows against bench/resnet/torch_resnet.py
# Each part logs to $OUT/<step>.log; the summary lists rc and time per step.
#
#   source .device/env.sh
#   bash tools/gpu/wave6.sh BUILD_DIR PART...
set -uo pipefail
build=${1:?usage: bash tools/gpu/wave6.sh BUILD_DIR PART...}
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${OUT:-wave6-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONUNBUFFERED=1
source "$here/tools/gpu/common.sh"
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
export LD_LIBRARY_PATH="$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
py=${BP_PYTHON:-python3}

for part in "$@"; do
  case "$part" in
    leak)
      for f in test_interop_gpu test_dlpack_c_api; do
        STEP_TIMEOUT=300 STEP_TAIL=40 step "leak.$f" env PYTHONPATH="$here/tools/gpu:$PYTHONPATH" \
          "$py" -m pytest -q -p pytest_leakcheck "$here/python/tests/$f.py"
        STEP_TIMEOUT=300 STEP_TAIL=12 step "leak.$f.cleared" env LEAK_CLEAR=1 \
          PYTHONPATH="$here/tools/gpu:$PYTHONPATH" "$py" -m pytest -q -p pytest_leakcheck \
          "$here/python/tests/$f.py"
      done
      ;;
    profile)
      STEP_TIMEOUT=400 STEP_TAIL=60 step gpt2.profile "$py" "$here/bench/gpt2/gpt2_profile.py" \
        --device cuda:0 --out "$out/gpt2-profile"
      ;;
    startup)
      STEP_TIMEOUT=300 STEP_TAIL=8 step startup "$build/bin/bp-bench-startup" --runs 21 \
        --python "$py" --case cpp_trivial --case python_first_op --case bp_smi \
        --case cuda_first_op --case cuda_first_op_all_plugins
      ;;
    pytest)
      STEP_TIMEOUT=600 STEP_TAIL=15 step pytest "$py" -m pytest -q "$here/python/tests"
      ;;
    events)
      STEP_TIMEOUT=200 STEP_TAIL=6 step cuda_event_test "$build/bin/cuda_event_test" --gtest_brief=1
      STEP_TIMEOUT=200 STEP_TAIL=6 step async_errors env BP_TEST_DEVICES=cuda:0 \
        "$build/bin/bp_unit_tests" --gtest_filter='*Async*' --gtest_brief=1
      ;;
    reduce)
      STEP_TIMEOUT=300 STEP_TAIL=6 step conformance.reduce "$build/bin/bp-conformance" \
        --plugin "$build/lib/backplane/plugins/libbackplane-cuda.so" --device cuda:0 \
        --filter 'kernels.sum*' --filter 'kernels.mean*' --filter 'kernels.max*' \
        --filter 'kernels.norm*' --filter 'kernels.sumsq*' --filter 'kernels.log_softmax*' \
        --filter 'kernels.linear*' --filter 'kernels.scatter_add*' --filter 'kernels.gather*' \
        --seed "$(seed)"
      STEP_TIMEOUT=300 STEP_TAIL=6 step nn.losses env BP_TEST_DEVICES=cuda:0 \
        "$build/bin/bp_nn_tests" --gtest_filter='*ross*:*Loss*:*Linear*:*Train*:*Gpt*' \
        --gtest_brief=1
      ;;
    loss)
      filters=(--filter 'kernels.cross_entropy*' --filter 'kernels.copy*'
        --filter 'kernels.layer_norm*' --filter 'kernels.sum*' --filter 'kernels.mean*'
        --filter 'kernels.norm*' --filter 'kernels.sumsq*' --filter 'kernels.log_softmax*')
      STEP_TIMEOUT=300 STEP_TAIL=6 step conformance.loss "$build/bin/bp-conformance" \
        --plugin "$build/lib/backplane/plugins/libbackplane-cuda.so" --device cuda:0 \
        "${filters[@]}" --seed "$(seed)"
      if vendors=$(nvidia_opencl_dir); then
        STEP_TIMEOUT=300 STEP_TAIL=4 step conformance.loss.opencl-nvidia env \
          OCL_ICD_VENDORS="$vendors" "$build/bin/bp-conformance" \
          --plugin "$build/lib/backplane/plugins/libbackplane-opencl.so" --device opencl:0 \
          "${filters[@]}" --seed "$(seed)"
      fi
      STEP_TIMEOUT=300 STEP_TAIL=8 step nn.cross_entropy env BP_TEST_DEVICES=cuda:0 \
        "$build/bin/bp_nn_tests" \
        --gtest_filter='*CrossEntropy*:*ross*:*ayerNorm*:*Gpt*:*Transformer*:*Attention*' \
        --gtest_brief=1
      STEP_TIMEOUT=200 STEP_TAIL=6 step async_errors.loss env BP_TEST_DEVICES=cuda:0 \
        "$build/bin/bp_unit_tests" --gtest_filter='*Async*' --gtest_brief=1
      ;;
    rows)
      for only in cross_entropy "copy heads" layer_norm batch_norm; do
        STEP_TIMEOUT=300 STEP_TAIL=10 step "bench.${only// /_}" "$py" "$here/bench/compare.py" \
          --bp "$build/bin/bp-bench" --device cuda:0 --only "$only" --repeat 3 \
          --json "$out/bench-${only// /_}.json"
      done
      ;;
    resnet)
      STEP_TIMEOUT=300 STEP_TAIL=3 step resnet.trace env BACKPLANE_TRACE="$out/resnet-trace.json" \
        "$build/bin/bp-bench-resnet" --device cuda:0 --only resnet18_train_bf16_b256 --iters 40
      STEP_TIMEOUT=120 STEP_TAIL=28 step resnet.bp.top "$py" "$here/bench/resnet/trace_top.py" \
        "$out/resnet-trace.json" --top 25 --last 0.5
      rm -f "$out/resnet-trace.json"
      STEP_TIMEOUT=300 STEP_TAIL=34 step resnet.torch.top "$py" "$here/bench/resnet/trace_top.py" \
        --torch --dtype bf16 --top 25
      STEP_TIMEOUT=300 STEP_TAIL=8 step resnet.compare "$py" "$here/bench/compare.py" \
        --bp "$build/bin/bp-bench-resnet" --ref-bin "$here/bench/resnet/torch_resnet.py" \
        --device cuda:0 --only resnet18_train --repeat 3 --json "$out/resnet.json"
      ;;
    gpt2)
      STEP_TIMEOUT=420 STEP_TAIL=24 step gpt2.bench "$py" "$here/bench/gpt2/gpt2_compare.py" \
        --device cuda:0 --bench --json "$out/gpt2-cuda0.json" --markdown "$out/gpt2-cuda0.md" ${GPT2_ARGS:-}
      ;;
    *)
      echo "wave6.sh: unknown part '$part' (leak, profile, startup, pytest, events, reduce, loss," \
        "rows, resnet or gpt2)" >&2
      exit 2
      ;;
  esac
done
echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
