#!/usr/bin/env bash
# One GPU-machine command for this wave's communicator and mixed-precision work (2 or 4 GPUs):
#   1. tools/gpu/dist.sh's smi, NCCL conformance (capabilities and comm_shrink included),
#      collectives, ddp and bandwidth steps on all GPUs (bus bandwidth 64 KiB..256 MiB and the
#      4-byte latency against PyTorch + NCCL);
#   2. fault recovery on NCCL: a rank killed mid-training, the survivors shrink (re-initialise)
#      and train on; a planned shrink of a healthy group (ncclCommShrink); a MismatchError
#      followed by re-initialisation (every-call checks);
#   3. descriptor checks once per signature and every call, on cuda (flight recorder labels);
#   4. the NCCL plugin leaves the calling thread's current device alone (review F19; 2 GPUs);
#   5. autocast and GradScaler tests on cuda:0, and the character GPT trained under bf16
#      autocast on cuda:0.
#
#   source .device/env.sh && bash tools/gpu/wave4.sh .device/build
set -uo pipefail
build=${1:?usage: bash tools/gpu/wave4.sh BUILD_DIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${OUT:-wave4-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
n=$(nvidia-smi -L | wc -l)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export BACKPLANE_DIST_TIMEOUT=${BACKPLANE_DIST_TIMEOUT:-60}
nccl_dir=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
[ -n "$nccl_dir" ] && [ -e "$nccl_dir/lib/libnccl.so.2" ] &&
  export BACKPLANE_NCCL_LIBRARY="$nccl_dir/lib/libnccl.so.2"
rows=()
step() {  # step NAME LIMIT_S EXPECTED_STATUS CMD...
  local name=$1 limit=$2 want=$3
  shift 3
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  local last
  last=$(grep -E "passed|failed|PASSED|FAILED|val loss|RESULT" "$out/$name.log" | tail -n 1 | cut -c1-100)
  rows+=("$(printf '%-34s %-4s rc=%-3s %4ss  %s' "$name" "$([ "$rc" = "$want" ] && echo PASS || echo FAIL)" \
    "$rc" $((SECONDS - t0)) "$last")")
}
OUT=$out/dist bash "$here/dist.sh" "$build" -n "$n" --only smi,conformance,collectives,ddp,bandwidth \
  > "$out/dist.log" 2>&1
run="$build/bin/bp-run"
rank="$build/bin/bp_dist_rank"
victim=$((n > 2 ? 2 : 1))
step shrink.kill "$((120))" 137 "$run" --keep-going -n "$n" "$rank" shrink --device cuda \
  --victim "$victim" --kill-step 5
step shrink.planned 120 0 "$run" -n "$n" "$rank" shrink --device cuda --victim "$victim" \
  --kill-step 6 --retire --explicit
step shrink.after_mismatch 120 0 env BACKPLANE_DIST_CHECK=full "$run" -n "$n" "$rank" shrink \
  --device cuda --mismatch --kill-step 3
step checks.first_call 60 0 "$run" -n "$n" "$rank" collectives --device local --only checks
step checks.every_call 60 0 env BACKPLANE_DIST_CHECK=full "$run" -n "$n" "$rank" collectives \
  --device local --only checks
step nccl.current_device 60 0 "$build/bin/bp_dist_tests" \
  --gtest_filter='GroupOfOne.NcclLeavesTheCallingThreadsCurrentDevice'
step amp.cuda 300 0 env BP_TEST_DEVICES=cuda:0 "$build/bin/bp_nn_tests" \
  --gtest_filter='Devices/AutocastTest.*:Devices/AutocastRefusalTest.*:Devices/GradScalerTest.*'
step gpt.autocast_bf16.cuda 180 0 "$build/bin/example-gpt" --device cuda:0 --layers 2 --heads 2 \
  --width 64 --context 64 --batch 16 --steps 200 --dropout 0 --lr 3e-3 --eval-every 100 \
  --autocast bf16 --max-loss 2.7
for s in shrink.kill shrink.planned shrink.after_mismatch; do
  grep -E "0 failed|FAIL|UNCAUGHT" "$out/$s.log" | head -n 6
done
grep -v "^$" "$out/dist/table.txt" | grep -v "missing\|0.000$"
printf '%s\n' "${rows[@]}" | tee "$out/summary.txt"
tail -n 12 "$out/dist/summary.txt"
