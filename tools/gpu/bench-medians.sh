#!/usr/bin/env bash
# Re-measures README.md's benchmark tables as medians of repeated runs (issue 17), on the GPU
# machine: bench/compare.py --repeat N for cuda:0 (Backplane vs PyTorch, interleaved) and the
# MLP forward (bp-bench-mlp vs bench/mlp/torch_mlp.py) N times. Prints the tables with the date
# and the exact commands for README.md; logs and JSON go to $OUT (or ./bench-medians-out).
#
#   bash tools/gpu/bench-medians.sh BUILD_DIR [REPEAT=5]
#
# Pass: every step exits 0 and the summary shows a ratio for every metric of the H100
# table (the medians go into docs/bench-data/h100-ops.json with the printed header line).
set -uo pipefail
build=${1:?usage: bash tools/gpu/bench-medians.sh BUILD_DIR [REPEAT]}
repeat=${2:-5}
out=${OUT:-bench-medians-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
summary=()
step() {  # step NAME CMD...
  local name=$1
  shift
  echo "=== $name: $*"
  local t0=$SECONDS
  timeout 240 "$@" >"$out/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-14s rc=%-3s %4ss' "$name" "$rc" "$((SECONDS - t0))")")
  cat "$out/$name.log" | grep -v '^run [0-9]*/[0-9]* done'
}

step compare python3 bench/compare.py --bp "$build/bin/bp-bench" --device cuda:0 \
  --repeat "$repeat" --json "$out/compare-cuda0.json"

# The MLP forward: bp-bench-mlp prints Backplane's and PyTorch's medians per device; repeat it
# and take the median of the medians (a bash -c loop: timeout runs programs, not functions).
step mlp bash -c 'for ((i = 1; i <= $0; i++)); do "$1" --device cuda:0 || exit 1; done' \
  "$repeat" "$build/bin/bp-bench-mlp"
python3 - "$out/mlp.log" "$repeat" <<'PY' | tee "$out/mlp-medians.txt"
import re, statistics, sys
# Rows of bp-bench-mlp's table: "cuda:0   |  59.7 us  61.0 us |  92.5 us  95.1 us | 0.65x 0.64x"
bp, torch = [], []
for line in open(sys.argv[1]):
    if not line.startswith("cuda:0") or "|" not in line:
        continue
    cells = line.split("|")
    b = re.findall(r"([0-9.]+) us", cells[1])
    t = re.findall(r"([0-9.]+) us", cells[2])
    if b:
        bp.append(float(b[0]))
    if t:
        torch.append(float(t[0]))
print(f"# MLP forward b256 on cuda:0: median of {len(bp)} runs of bp-bench-mlp --device cuda:0")
if bp:
    print(f"Backplane {statistics.median(bp):8.1f} us   runs {[round(x, 1) for x in bp]}")
if torch:
    print(f"PyTorch   {statistics.median(torch):8.1f} us   runs {[round(x, 1) for x in torch]}")
if bp and torch:
    print(f"ratio     {statistics.median(bp) / statistics.median(torch):8.2f}x")
PY

echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
