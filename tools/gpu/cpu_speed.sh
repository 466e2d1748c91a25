#!/usr/bin/env bash
# The CPU backend against PyTorch on the GPU machine's host CPU (issue 14; backends/cpu/README.md).
#
# Here, after building (Release, BP_BUILD_TESTS=ON), pack the BLAS libraries xz-compressed into
# the build folder (the plugin's oneDNN and OpenBLAS, 76 MiB as they are, 11 MiB packed; and the
# candidates the build does not link: OpenBLAS's OpenMP build, BLIS's pthread and OpenMP
# builds), bundle as usual, and drop the two big uncompressed copies so the carry stays under
# 64 MiB (this script, and tools/gpu/cpu_speed_env.sh for any other program, put them back):
#     bash tools/gpu/cpu_speed.sh --pack build-device
#     ../shared/tools/device-bundle build-device
#     rm -f .device/lib/libdnnl.so.2 .device/lib/libopenblas.so.0
# There (repo root, .device carried; needs nothing compiled there):
#     bash tools/gpu/cpu_speed.sh .device/build
# Steps, each logged to $OUT/<step>.log (or ./cpu-speed-out):
#   tests      cpu_vmath_test (ulp bounds on that CPU's ISA) and cpu_plugin_test
#   blas       bp-blas-bench: every candidate at 1 and all threads, oneTBB tiles, concurrent callers
#   bench      compare.py --device cpu:0 (PyTorch CPU in the same run), matmul in tbb tiles
#   bench_omp  the matmul rows with BACKPLANE_CPU_MATMUL_THREADS=openmp
#   mlp/train  bp-bench-mlp and bp-bench-train on cpu:0 vs PyTorch, both matmul modes
#   thresholds cpu_threshold_bench (the serial thresholds, since the kernels changed)
# QUICK=1 shortens every step (a smoke test of the script, not a measurement).
# Pass: tests rc=0; in "bench", matmul f32 1024 and 2048 >= 0.9x, add/mul/exp/sum/norm >= 0.9x,
# 1-element add queued <= 0.5x of libtorch's ~1.5 us; MLP forward and SGD step ratio <= 1.1.
set -uo pipefail
if [ "${1:-}" = "--pack" ]; then
  build=${2:?usage: cpu_speed.sh --pack BUILD_DIR}
  arch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
  python3 - "$build/cpu-speed-libs.tar.xz" "$arch" <<'PY'
import os, sys, tarfile
out, arch = sys.argv[1], sys.argv[2]
with tarfile.open(out, "w:xz") as t:
    for d, lib in [("linked", "libdnnl.so.2"), ("linked", "libopenblas.so.0"),
                   ("openblas-openmp", "libopenblas.so.0"), ("blis-pthread", "libblis.so.4"),
                   ("blis-openmp", "libblis.so.4")]:
        if d == "linked":  # what the plugin resolves here
            p = f"/usr/lib/{arch}/{lib}"
            t.add(os.path.realpath(p), arcname=f"{d}/{lib}")
            continue
        p = f"/usr/lib/{arch}/{d}/{lib}"
        if os.path.exists(p):
            t.add(os.path.realpath(p), arcname=f"{d}/{lib}")
print(out, os.path.getsize(out) >> 20, "MiB")
PY
  exit
fi

build=${1:-.device/build}
out=${OUT:-cpu-speed-out}
mkdir -p "$out"
[ -f .device/env.sh ] && source .device/env.sh
_bp_had_libs=${BP_CPU_LIBS:-}
source "$(dirname "${BASH_SOURCE[0]}")/cpu_speed_env.sh" "$build"
[ -z "$_bp_had_libs" ] && [ -n "${BP_CPU_LIBS:-}" ] && trap 'rm -rf "$BP_CPU_LIBS"' EXIT
export PYTHONUNBUFFERED=1
q=() iters=100 reps=15
[ -n "${QUICK:-}" ] && q=(--quick) iters=5 reps=2
summary=()
step() {  # step NAME CMD...
  local name=$1
  shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  tail -n 30 "$out/$name.log"
  summary+=("$name rc=$rc $((SECONDS - t0))s")
}
bin() { echo "$build/bin/$1"; }

lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|Flags' | cut -c1-200 > "$out/cpu.txt"
cat "$out/cpu.txt"

step tests_vmath "$(bin cpu_vmath_test)" --gtest_brief=1
step tests_plugin "$(bin cpu_plugin_test)" --gtest_brief=1

# BLAS candidates: what the plugin links (found through LD_LIBRARY_PATH) and the packed ones.
cands=()
plugin=$(find "$build" -name 'libbackplane-cpu.so' | head -1)
for pair in "onednn=dnnl:libdnnl.so.2" "openblas-pthread=openblas:libopenblas.so.0"; do
  name=${pair%%:*} lib=${pair#*:}
  path=$(ldd "$plugin" | awk -v l="$lib" '$1 == l {print $3}')
  [ -n "$path" ] && cands+=("$name:$path")
done
if [ -n "${BP_CPU_LIBS:-}" ]; then
  tmp=$BP_CPU_LIBS
  [ -f "$tmp/openblas-openmp/libopenblas.so.0" ] && cands+=("openblas-openmp=openblas:$tmp/openblas-openmp/libopenblas.so.0")
  [ -f "$tmp/blis-pthread/libblis.so.4" ] && cands+=("blis-pthread=blis:$tmp/blis-pthread/libblis.so.4")
  [ -f "$tmp/blis-openmp/libblis.so.4" ] && cands+=("blis-openmp=blis:$tmp/blis-openmp/libblis.so.4")
fi
step blas "$(bin bp-blas-bench)" "${q[@]}" "${cands[@]}"

step bench python3 bench/compare.py --bp "$(bin bp-bench)" --device cpu:0 "${q[@]}" \
  --json "$out/bench.json"
BACKPLANE_CPU_MATMUL_THREADS=openmp step bench_omp python3 bench/compare.py --bp "$(bin bp-bench)" \
  --device cpu:0 --only matmul "${q[@]}"
step mlp "$(bin bp-bench-mlp)" --device cpu:0 --iters $iters --warmup 10
step train "$(bin bp-bench-train)" --device cpu:0 --iters $((iters / 2)) --warmup 5
export BACKPLANE_CPU_MATMUL_THREADS=openmp
step mlp_omp "$(bin bp-bench-mlp)" --device cpu:0 --iters $iters --warmup 10
step train_omp "$(bin bp-bench-train)" --device cpu:0 --iters $((iters / 2)) --warmup 5
unset BACKPLANE_CPU_MATMUL_THREADS
step thresholds "$(bin cpu_threshold_bench)" $reps

echo "=== summary"
{
  printf '%s\n' "${summary[@]}"
  echo "--- cpu:0 vs PyTorch (bench, matmul in oneTBB tiles):"
  grep -E '^(add|exp|mul|sum|norm|matmul|1-element)' "$out/bench.log"
  echo "--- matmul with BACKPLANE_CPU_MATMUL_THREADS=openmp:"
  grep -E '^matmul' "$out/bench_omp.log"
  for s in mlp train mlp_omp train_omp; do echo "--- $s:"; grep -E '^cpu' "$out/$s.log"; done
  echo "--- blas candidates (GFLOP/s):"
  grep -vE '^#' "$out/blas.log"
  echo "--- thresholds:"
  grep -E '=>' "$out/thresholds.log"
} | tee "$out/summary.txt"
