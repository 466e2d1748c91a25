#!/usr/bin/env bash
# GPU check and benchmark of the communicators (docs/distributed.md) on the
# GPUs of one machine, N ranks (one process per GPU). For the 2 x H200 machine:
#   bash tools/gpu/dist.sh BUILD_DIR            (N = 2)
#   bash tools/gpu/dist.sh BUILD_DIR -n 4       (bigger machines)
#   bash tools/gpu/dist.sh BUILD_DIR --batch 1024   (training batch per GPU; default 4096)
# Logs under $OUT (else ./dist-out). Steps, each under a time limit:
#   smi             bp-smi: comm-nccl loaded and available (NCCL from PyTorch's pip packages)
#   conformance     bp-conformance --comm nccl --world-size N: every collective, dtype and
#                   reduction on N ranks against a float64 reference, timeout and abort
#   collectives     bp_dist_rank collectives on cuda:<local rank>: every dtype and reduction
#                   through bp::dist (NCCL), non-contiguous tensors, point to point
#   ddp             bp_dist_rank ddp on the GPUs: DDP = one process on the combined batch
#   bandwidth       bp-bench-dist and PyTorch + NCCL (torch_dist.py): all_reduce, all_gather,
#                   reduce_scatter in f32 and bf16 at 64 KiB, 1, 4, 64 and 256 MiB, bus
#                   bandwidth; the per-call time of a 4-byte all_reduce (latency)
#   multi_gpu       bp-exercise-multi_gpu: one process, matmuls on every GPU vs one GPU
#   training        MLP 4096-4096-4096-10, batch 4096 per GPU, SGD: 1, 2, 4, ... and N GPUs (DDP),
#                   both libraries; and the loss curve of N GPUs vs 1 GPU on the combined batch
# Pass: every row of the summary says PASS, and the table ends with ALL GOALS MET (bandwidth
# >= 0.95x PyTorch + NCCL at every size and dtype, W-GPU training >= 0.9*W x the samples/s of 1 GPU, the
# N-GPU loss curve within 1e-4 of the 1-GPU curve on the combined batch).
set -uo pipefail
build=${1:?usage: bash tools/gpu/dist.sh BUILD_DIR [-n N]}
shift
n=2
batch=4096  # per GPU in the training comparison (compute-bound: see README)
only=""      # --only smi,conformance,collectives,ddp,bandwidth,training,multi_gpu: those steps
while [ $# -gt 0 ]; do
  case "$1" in
    -n) n=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${OUT:-dist-out}
mkdir -p "$out"

# Every process: no NVLink SHARP / multicast (KINDS.md), the same for PyTorch's NCCL.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nccl_dir=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
if [ -n "$nccl_dir" ] && [ -e "$nccl_dir/lib/libnccl.so.2" ]; then
  export BACKPLANE_NCCL_LIBRARY="$nccl_dir/lib/libnccl.so.2"
fi
echo "BACKPLANE_NCCL_LIBRARY=${BACKPLANE_NCCL_LIBRARY:-unset (libnccl.so.2 from the loader path)}"
export BACKPLANE_DIST_TIMEOUT=${BACKPLANE_DIST_TIMEOUT:-120}

rows=()
want() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }
run() {  # run NAME LIMIT_S CMD...
  local name=$1 limit=$2
  shift 2
  echo "=== $name: $*"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  tail -n 8 "$out/$name.txt"
  local last
  last=$(grep -E "passed, [0-9]+ failed|checks passed|RESULT|available|ALL GOALS|SOME GOALS" \
    "$out/$name.txt" | tail -n 1 | cut -c1-110)
  rows+=("$(printf '%-18s %-4s rc=%-3s %4ss  %s' "$name" "$([ $rc = 0 ] && echo PASS || echo FAIL)" \
    "$rc" $((SECONDS - t0)) "$last")")
  return $rc
}
# torchrun N SCRIPT ARGS... as a command for run() (timeout runs programs, not shell functions).
# PyTorch brings its own libraries: none of the bundle's (LD_LIBRARY_PATH) may shadow them.
torchrun_cmd() {
  echo env LD_LIBRARY_PATH= python3 -m torch.distributed.run --standalone \
    --nproc_per_node="$1" "${@:2}"
}

if want smi; then
  run smi 60 "$build/tools/bp-smi"
  grep -A1 "comm-nccl" "$out/smi.txt" | head -n 2
fi
want conformance && run conformance 280 "$build/bin/bp-conformance" --comm nccl \
  --world-size "$n" --json "$out/conformance.json"
want collectives && run collectives 240 "$build/bin/bp-run" -n "$n" "$build/bin/bp_dist_rank" \
  collectives --device local
want ddp && run ddp 120 "$build/bin/bp-run" -n "$n" "$build/bin/bp_dist_rank" ddp
if want bandwidth; then
  run bp_collectives 300 "$build/bin/bp-run" -n "$n" "$build/bin/bp-bench-dist" collectives
  run torch_collectives 300 $(torchrun_cmd "$n" "$top/bench/dist/torch_dist.py" collectives)
  run bp_latency 120 "$build/bin/bp-run" -n "$n" "$build/bin/bp-bench-dist" latency
  run torch_latency 120 $(torchrun_cmd "$n" "$top/bench/dist/torch_dist.py" latency)
fi
worlds=1
for w in 2 4 8 16 32; do [ "$w" -lt "$n" ] && worlds="$worlds $w"; done
[ "$n" -gt 1 ] && worlds="$worlds $n"
if want training; then
  for w in $worlds; do
    run "bp_ddp$w" 200 "$build/bin/bp-run" -n "$w" "$build/bin/bp-bench-dist" ddp --batch "$batch"
    run "torch_ddp$w" 200 $(torchrun_cmd "$w" "$top/bench/dist/torch_dist.py" ddp --batch "$batch")
  done
  for w in 1 "$n"; do
    run "bp_curve$w" 200 "$build/bin/bp-run" -n "$w" "$build/bin/bp-bench-dist" curve
  done
fi
# One process driving every GPU of the machine (walkthrough item 16 of docs/names.md).
want multi_gpu && run multi_gpu 120 "$build/bin/bp-exercise-multi_gpu"
python3 "$top/bench/dist/compare_dist.py" "$out" "$n" | tee "$out/table.txt"
[ -f "$out/multi_gpu.txt" ] && tail -n 1 "$out/multi_gpu.txt"
echo "=== summary (communicators on $n x $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1))"
printf '%s\n' "${rows[@]}" | tee "$out/summary.txt"
