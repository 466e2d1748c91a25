#!/usr/bin/env bash
# Issue 32's DLPack import cost on the GPU machine's host, and the graph tests whose code the
# import change touched (Note [Buffers a graph keeps] in core/src/graph/graph.cpp), on cuda:0
# (native graphs) and cpu:0. From the repository root with .device carried (a Release build with
# BP_BUILD_PYTHON, `tools/gpu/cpu_speed.sh --pack BUILD`, then ../shared/tools/device-bundle):
#     bash tools/gpu/import_cost.sh [.device/build]
# Steps, each logged to $OUT/<step>.log (or ./import-cost-out), tails printed:
#   cpu       the CPU's model
#   counts    what one shared_ptr costs there with and without enable_shared_from_this (the
#             Buffer had it until this change), compiled here with g++ -O2
#   dlpack    bench/python/dlpack_import_cost.py pinned to cores 1, 5 and 9, twice each
#   graphs    bp_device_tests' Graph* suites on cuda:0 and cpu:0
#   native    bp_device_tests' NativeTest and the DLPack pytest cases on cuda:0
set -uo pipefail
build=${1:-.device/build}
out=${OUT:-import-cost-out}
mkdir -p "$out"
[ -f .device/env.sh ] && source .device/env.sh
# The cpu plugin's oneDNN and OpenBLAS, packed by `tools/gpu/cpu_speed.sh --pack`.
source "$(dirname "${BASH_SOURCE[0]}")/cpu_speed_env.sh" "$build"
[ -n "${BP_CPU_LIBS:-}" ] && trap 'rm -rf "$BP_CPU_LIBS"' EXIT
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 STEP_TAIL=${STEP_TAIL:-30}
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
steps=${STEPS:-cpu counts dlpack graphs native}
want() { case " $steps " in *" $1 "*) return 0 ;; esac; return 1; }
# The counts step's program (common.sh's step runs commands under timeout, not functions).
if want counts; then
  cat > "$out/counts.cpp" <<'CPP'
#include <chrono>
#include <cstdio>
#include <memory>
struct Plain { long x[8]; };
struct Shared : std::enable_shared_from_this<Shared> { long x[8]; };
template <class T> double ns(int n) {
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    auto p = std::make_shared<T>();
    asm volatile("" : : "r"(p.get()) : "memory");
  }
  auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
}
int main() {
  for (int r = 0; r < 5; ++r)
    std::printf("make_shared+drop: plain %.1f ns, enable_shared_from_this %.1f ns\n",
                ns<Plain>(5000000), ns<Shared>(5000000));
}
CPP
fi
want cpu && step cpu bash -c "lscpu | grep -E 'Model name|^CPU\(s\)' | cut -c1-120"
want counts && step counts bash -c \
  "g++ -O2 -pthread '$out/counts.cpp' -o '$out/counts' && taskset -c 1 '$out/counts'"
want dlpack && PYTHONPATH=$build/python step dlpack bash -c \
  'for c in 1 5 9 1 5 9; do taskset -c $c python3 bench/python/dlpack_import_cost.py; done'
want graphs && step graphs env BP_TEST_DEVICES=cuda:0,cpu:0 "$build/bin/bp_device_tests" \
  --gtest_filter='*Graph*' --gtest_brief=1
want native && PYTHONPATH=$build/python BP_TEST_DEVICES=cuda:0,cpu:0 step native bash -c \
  "$build/bin/bp_device_tests --gtest_filter='*NativeTest*' --gtest_brief=1 &&
   python3 -m pytest -q -x python/tests -k 'dlpack or graph'"
echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
