#!/usr/bin/env bash
# One GPU-machine call for this wave's remaining measurements (issues 26, 27 and 32):
#   pool        bp_device_tests' pooling cases and bp-conformance's pool ops on cuda:0 (the
#               max-pool kernels do their window arithmetic in int32 now: Note [CUDA pooling])
#   pool_bench  bench/compare.py --only pool2d (forward and the new backward row) against
#               PyTorch, REPEAT interleaved runs
#   conv        cuda_conv_test, bp-conformance's conv2d cases on cuda:0, and bench/compare.py
#               --only "conv2d fwd" against PyTorch (the graph-API plan walks mode A's whole
#               list, then the fallback list: Note [cuDNN graph convolutions])
#   engines     tools/gpu/cudnn_engines.cpp: every graph-API engine configuration for the
#               stride-2 convolution row (64x32x32 to 128, batch 256) in f32 and bf16, timed
#   torch_cudnn which engine PyTorch's convolution runs for that row (cuDNN's API log, grepped)
#   dlpack      bench/python/dlpack_import_cost.py pinned to three cores, twice each (issue 32)
#   chargpt     the character GPT's training step on cpu:0 against PyTorch CPU (issue 27)
# From the repository root with .device carried (tools/gpu/cpu_speed.sh --pack BUILD, then
# ../shared/tools/device-bundle BUILD):
#     bash tools/gpu/wave7.sh .device/build [REPEAT=3]
# STEPS picks steps (default: all, in the order above). Logs go to $OUT (or ./wave7-out).
set -uo pipefail
build=${1:-.device/build}
repeat=${2:-3}
out=${OUT:-wave7-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
[ -f .device/env.sh ] && source .device/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/cpu_speed_env.sh" "$build"
[ -n "${BP_CPU_LIBS:-}" ] && trap 'rm -rf "$BP_CPU_LIBS"' EXIT
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 STEP_TAIL=${STEP_TAIL:-30}
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
steps=${STEPS:-pool pool_bench conv engines torch_cudnn dlpack chargpt}
want() { case " $steps " in *" $1 "*) return 0 ;; esac; return 1; }

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
want pool && BP_TEST_DEVICES=cuda:0 step pool.tests "$build/bin/bp_device_tests" \
  --gtest_filter='*ool*' --gtest_brief=1
want pool && STEP_TIMEOUT=120 step pool.conformance "$build/bin/bp-conformance" \
  --device cuda:0 --filter 'pool' --seed "$(seed)"
want pool_bench && STEP_TIMEOUT=150 STEP_TAIL=20 step pool_bench python3 bench/compare.py \
  --bp "$build/bin/bp-bench" --device cuda:0 --only pool2d --repeat "$repeat" \
  --json "$out/compare-pool2d.json"
want conv && STEP_TIMEOUT=90 step conv.tests "$build/bin/cuda_conv_test" --gtest_brief=1
want conv && STEP_TIMEOUT=150 step conv.conformance "$build/bin/bp-conformance" \
  --device cuda:0 --filter 'conv2d' --seed "$(seed)"
want conv && STEP_TIMEOUT=200 STEP_TAIL=20 step conv.bench python3 bench/compare.py \
  --bp "$build/bin/bp-bench" --device cuda:0 --only "conv2d fwd" --repeat "$repeat" \
  --json "$out/compare-conv2d.json"
if want engines; then
  src=tools/gpu/cudnn_engines.cpp
  inc=$(ls -d /usr/local/cuda/include 2>/dev/null)
  step engines.build g++ -O2 -I"$inc" "$src" -o "$out/cudnn_engines" -L/usr/local/cuda/lib64 \
    -lcudnn -lcudart
  STEP_TAIL=60 step engines.f32 "$out/cudnn_engines" 256 64 32 32 128 3 3 2 1 f32
  STEP_TAIL=60 step engines.bf16 "$out/cudnn_engines" 256 64 32 32 128 3 3 2 1 bf16
fi
if want torch_cudnn; then
  cat >"$out/torch_conv.py" <<'PY'
import torch, torch.nn.functional as F
torch.backends.cudnn.allow_tf32 = False
for dt in (torch.float32, torch.bfloat16):
    x = torch.randn(256, 64, 32, 32, device="cuda", dtype=dt)
    w = torch.randn(128, 64, 3, 3, device="cuda", dtype=dt)
    for _ in range(3):
        F.conv2d(x, w, None, 2, 1)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(20):
        F.conv2d(x, w, None, 2, 1)
    e.record()
    e.synchronize()
    print(dt, "ms", s.elapsed_time(e) / 20)
PY
  step torch_cudnn.time python3 "$out/torch_conv.py"
  CUDNN_LOGLEVEL_DBG=3 CUDNN_LOGDEST_DBG="$out/torch-cudnn-api.log" \
    step torch_cudnn.log python3 "$out/torch_conv.py"
  STEP_TAIL=60 step torch_cudnn.grep bash -c "ls -la '$out/torch-cudnn-api.log'; grep -n -i -E \
    'GLOBAL_INDEX|engineId|eng[0-9]|knob|cudnnBackendExecute' '$out/torch-cudnn-api.log' | \
    cut -c1-200 | awk '!seen[\$0]++' | head -60"
  # Keep what comes back small.
  [ -f "$out/torch-cudnn-api.log" ] && head -c 3000000 "$out/torch-cudnn-api.log" \
    >"$out/torch-cudnn-api.head.log" && rm -f "$out/torch-cudnn-api.log"
fi
want dlpack && PYTHONPATH=$build/python step dlpack bash -c \
  'for c in 1 5 9 1 5 9; do taskset -c $c python3 bench/python/dlpack_import_cost.py; done'
want chargpt && PYTHONPATH=$build/python STEP_TIMEOUT=300 STEP_TAIL=20 step chargpt \
  python3 bench/gpt2/gpt2_compare.py --config char --device cpu:0 --bench --bench-cpu \
  --no-compile --batch 8 --warmup 2 --steps 3 --windows 5 --seed 7 \
  --json "$out/chargpt-cpu.json" --markdown "$out/chargpt-cpu.md"
echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
# What comes back is limited in files: the logs travel as one archive.
(cd "$out" && tar czf logs.tar.gz --exclude=logs.tar.gz --exclude=cudnn_engines --exclude='*.json' \
  --exclude='*.md' . && find . -maxdepth 1 -type f ! -name logs.tar.gz ! -name '*.json' \
  ! -name '*.md' -delete)
