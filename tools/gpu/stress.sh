#!/usr/bin/env bash
# tools/stress-seeds.sh on the GPU machine's 16 cores (issue 17): WORKERS copies side by side,
# each RUNS rounds of every kernel suite with fresh seeds (cpu, cpu-par, opencl and conf-opencl
# on NVIDIA's OpenCL driver where it exists, cuda, device on cpu:0/cuda:0/opencl:0, conf-cpu,
# conf-cuda), then one table of passed/failed runs per suite over all workers.
#
#   bash tools/gpu/stress.sh BUILD_DIR [WORKERS=8] [RUNS=3] [SECONDS=540]
#
# A worker still running after SECONDS is stopped; its finished rounds still count (each round
# is logged as it ends). Failing seeds' logs are kept in $OUT/w<k>/ (or ./stress-out).
set -uo pipefail
build=${1:?usage: bash tools/gpu/stress.sh BUILD_DIR [WORKERS] [RUNS] [SECONDS]}
workers=${2:-8}
runs=${3:-3}
limit=${4:-540}
out=${OUT:-stress-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

nv_ocl=/usr/local/nvidia/lib64/libnvidia-opencl.so.1
if [ -e "$nv_ocl" ]; then
  mkdir -p "$out/opencl-vendors"
  echo "$nv_ocl" >"$out/opencl-vendors/nvidia.icd"
  export OCL_ICD_VENDORS="$out/opencl-vendors"
fi
# BP_TEST_DEVICES unset: the device suite runs on every device found.
pids=()
for ((k = 1; k <= workers; k++)); do
  mkdir -p "$out/w$k"
  OUT="$out/w$k" timeout "$limit" bash "$here/tools/stress-seeds.sh" "$build" "$runs" \
    >"$out/w$k/stress.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done

# Rounds finished by each worker, and the failures every worker saw.
python3 - "$out" "$workers" <<'PY'
import glob, os, re, sys
out, workers = sys.argv[1], int(sys.argv[2])
rounds, failures = 0, []
for k in range(1, workers + 1):
    log = os.path.join(out, f"w{k}", "stress.log")
    text = open(log).read() if os.path.exists(log) else ""
    done = re.findall(r"^run (\d+)/\d+ done", text, re.M)
    rounds += int(done[-1]) if done else 0
    failures += re.findall(r"^run \d+: (\S+) FAILED with seed (\d+)", text, re.M)
print(f"stress: {workers} workers, {rounds} complete rounds of every suite, "
      f"{len(failures)} failed runs")
for suite, seed in failures:
    print(f"  FAILED {suite} seed {seed}")
PY
