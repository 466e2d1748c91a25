#!/usr/bin/env bash
# ResNet-18 on the GPU machine's host CPU against PyTorch's CPU path (issue 26's 16-core table),
# with where the step's time goes on both sides. Needs a bundle packed as tools/gpu/cpu_speed.sh
# describes (Release build with BP_BUILD_BENCH; `cpu_speed.sh --pack`, device-bundle, the two
# big copies dropped). There, from the repository root with .device carried:
#     bash tools/gpu/cpu_resnet.sh [.device/build]
# Steps (STEPS="a b ..." runs a subset), each logged to $OUT/<step>.log (or ./cpu-resnet-out),
# tails printed:
#   cpu         the CPU's model, core count and its AMX / AVX-512 bf16 flags
#   dlpack      bench/python/dlpack_import_cost.py pinned to cores 1, 5 and 9 in turn (when
#               <build>/python exists)
#   compare     bench/compare.py, every ResNet-18 row on cpu:0, medians of REPEAT (1) runs
#   compare_tbb the same with BACKPLANE_CPU_LOOPS=tbb (every loop on oneTBB's workers, also
#               right after a convolution: Note [OpenMP loops] in backends/cpu/cpu_kernels.cpp)
#   mlp         bp-bench-mlp and bp-bench-train (PyTorch in each) with BACKPLANE_CPU_LOOPS=auto,
#               tbb and openmp
#   variants    Backplane's rows alone (bp-bench-resnet) under other settings (VARIANTS below:
#               OpenMP's spinning, Note [OpenMP spinning]; the cpu backend's convolution knobs,
#               backends/cpu/README.md)
#   verbose     oneDNN's implementation names (ONEDNN_VERBOSE) of one bf16 and one f32 training
#               step on both sides, counted
#   trace       Backplane's f32 and bf16 training steps traced (BACKPLANE_TRACE), ops summed by
#               name
#   torch_prof  PyTorch's profile of the same steps on the CPU
# QUICK=1: one run each (a smoke test of the script).
set -uo pipefail
build=${1:-.device/build}
out=${OUT:-cpu-resnet-out}
mkdir -p "$out"
[ -f .device/env.sh ] && source .device/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/cpu_speed_env.sh" "$build"
[ -n "${BP_CPU_LIBS:-}" ] && trap 'rm -rf "$BP_CPU_LIBS"' EXIT
export PYTHONUNBUFFERED=1
repeat=${REPEAT:-1}
[ -n "${QUICK:-}" ] && repeat=1
steps=${STEPS:-cpu dlpack compare compare_tbb mlp variants verbose trace torch_prof}
summary=()
step() {  # step NAME CMD...
  local name=$1
  shift
  case " $steps " in *" $name "*) ;; *) return ;; esac
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  tail -n 40 "$out/$name.log"
  summary+=("$name rc=$rc $((SECONDS - t0))s")
}
res=$build/bin/bp-bench-resnet
ref=bench/resnet/torch_resnet.py
cmp=(python3 bench/compare.py --bp "$res" --ref-bin "$ref" --device cpu:0 --quick)
cpu_info() {
  lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|L3' | cut -c1-120
  echo "flags: $(grep -o -w -E 'amx_[a-z0-9]+|avx512_bf16|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  python3 -c "import torch; print('torch', torch.__version__, 'threads', torch.get_num_threads(), torch.backends.mkldnn.is_available())"
}
# oneDNN's verbose lines "onednn_verbose,exec,cpu,<kind>,<impl>,<prop>,..." counted by kind,
# implementation and propagation.
count_impls() {
  grep -E '^(onednn|dnnl)_verbose,.*exec' | awk -F, '{
    for (i = 1; i < NF && $i != "exec"; ++i) {}
    print $(i+2), $(i+3), $(i+4) }' | sort | uniq -c | sort -rn | head -25
}
verbose() {
  for dt in bf16 f32; do
    echo "--- backplane train_${dt}"
    ONEDNN_VERBOSE=1 "$res" --device cpu:0 --quick --only "train_${dt}_b" --iters 1 2>&1 | count_impls
    echo "--- torch train_${dt}"
    ONEDNN_VERBOSE=1 python3 "$ref" --device cpu:0 --quick --only "train_${dt}_b" --iters 1 2>&1 |
      count_impls
  done
}
step cpu cpu_info
[ -d "$build/python" ] && PYTHONPATH=$build/python LD_LIBRARY_PATH=$build/lib:$LD_LIBRARY_PATH \
  step dlpack bash -c 'for c in 1 5 9; do taskset -c $c python3 bench/python/dlpack_import_cost.py; done'
step compare "${cmp[@]}" --repeat "$repeat" --json "$out/resnet18-cpu.json"
BACKPLANE_CPU_LOOPS=tbb step compare_tbb "${cmp[@]}" --repeat "$repeat" \
  --json "$out/resnet18-cpu-tbb.json"
# The MLP benchmarks (PyTorch inside each) under both threading modes.
mlp_modes() {
  local m
  for m in BACKPLANE_CPU_LOOPS=auto BACKPLANE_CPU_LOOPS=tbb BACKPLANE_CPU_LOOPS=openmp; do
    echo "--- $m"
    env "$m" "$build/bin/bp-bench-mlp" --device cpu:0 --iters 100 --warmup 10 2>&1 | grep -E '^ *cpu|ratio'
    env "$m" "$build/bin/bp-bench-train" --device cpu:0 --iters 50 --warmup 5 2>&1 | grep -E '^ *cpu|ratio'
  done
}
step mlp mlp_modes
# VARIANTS: "SETTING[,SETTING]:ROWS ..." (ROWS a --only substring, "all" for every row); the
# default compares every loop on OpenMP, OpenMP's threads sleeping between regions, the batch
# chunks, bf16 weight gradients in bf16 and plain layouts.
variants() {
  local v env only
  for v in ${VARIANTS:-BACKPLANE_CPU_LOOPS=openmp:all OMP_WAIT_POLICY=passive:all \
    BACKPLANE_CPU_CONV_THREADS=tbb:all BACKPLANE_CPU_CONV_BF16_WGRAD=native:bf16 \
    BACKPLANE_CPU_CONV_LAYOUT=plain:all}; do
    env=${v%%:*} only=${v#*:}
    [ "$only" = all ] && only=""
    echo "--- $env ${only:+(--only $only)}"
    env ${env//,/ } "$res" --device cpu:0 --quick ${only:+--only "$only"} 2>&1 |
      grep -o '"metric": "[^"]*", "device": "[^"]*", "value": [0-9.]*' | sed 's/"device": "cpu:0", //'
  done
}
step variants variants
step verbose verbose
traces() {
  local dt
  for dt in f32 bf16; do
    echo "--- backplane train_${dt}"
    BACKPLANE_TRACE=$out/trace.json "$res" --device cpu:0 --quick --only "train_${dt}_b" \
      --iters 5 > /dev/null &&
      python3 bench/resnet/trace_top.py "$out/trace.json" --top 25 --last 0.5
    rm -f "$out/trace.json"
  done
}
step trace traces
torch_profiles() {
  local dt
  for dt in f32 bf16; do
    echo "--- torch train_${dt}"
    python3 bench/resnet/trace_top.py --torch --device cpu --dtype "$dt" --batch 32 --top 25
  done
}
step torch_prof torch_profiles
echo "=== summary"
printf '%s\n' "${summary[@]}"
