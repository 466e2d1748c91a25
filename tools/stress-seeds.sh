#!/usr/bin/env bash
# Runs the kernel test suites again and again, each time with a fresh random seed, to show that
# no seed makes them fail (issue 17: a CI that is never flaky). Not part of CI: it takes hours.
#
#   tools/stress-seeds.sh [BUILD_DIR=build] [RUNS=50] [SUITE...]
#
# Suites (default: all that were built):
#   cpu        backends' cpu_plugin_test (its own cases), with the measured thresholds
#   cpu-par    cpu_plugin_test's SharedCases.AllKernels and matmul tiles (the conformance kit's
#              kernels cases in process) with BACKPLANE_CPU_SERIAL_THRESHOLD=64 (oneTBB paths)
#   opencl     opencl_plugin_test on every OpenCL device
#   cuda       cuda_plugin_test (skips itself without a GPU)
#   device     bp_device_tests' MathTest and FusedTest on every device
#   conf-cpu   bp-conformance --device cpu:0 --filter 'kernels.*'
#   conf-opencl  the same on opencl:0
#   conf-cuda  the same on cuda:0 (skips itself without a GPU)
# Every run gets a new 64-bit seed (BP_TEST_SEED for the gtest programs, --seed for
# bp-conformance). A failing run's seed, command and output land in $OUT (or
# BUILD_DIR/stress-seeds) as <suite>-<seed>.log, and the summary names them. Exit status 0 when
# every run passed.
set -uo pipefail
set -f  # the commands carry globs for --filter

build="${1:-build}"
runs="${2:-50}"
shift $(($# > 2 ? 2 : $#))
suites=("$@")
out="${OUT:-$build/stress-seeds}"
mkdir -p "$out"

have() { [ -x "$build/bin/$1" ]; }
if [ ${#suites[@]} -eq 0 ]; then
  have cpu_plugin_test && suites+=(cpu cpu-par)
  have opencl_plugin_test && suites+=(opencl)
  have cuda_plugin_test && suites+=(cuda)
  have bp_device_tests && suites+=(device)
  if have bp-conformance; then
    suites+=(conf-cpu)
    have opencl_plugin_test && suites+=(conf-opencl)
    have cuda_plugin_test && suites+=(conf-cuda)
  fi
fi

# The command of one suite for one seed.
command_of() {
  local suite=$1 seed=$2
  case "$suite" in
    cpu) echo "env BP_TEST_SEED=$seed $build/bin/cpu_plugin_test --gtest_filter=-SharedCases.*" ;;
    cpu-par) echo "env BP_TEST_SEED=$seed BACKPLANE_CPU_SERIAL_THRESHOLD=64 $build/bin/cpu_plugin_test --gtest_filter=SharedCases.AllKernels:*MatmulTest*" ;;
    opencl) echo "env BP_TEST_SEED=$seed $build/bin/opencl_plugin_test" ;;
    cuda) echo "env BP_TEST_SEED=$seed $build/bin/cuda_plugin_test" ;;
    device) echo "env BP_TEST_SEED=$seed $build/bin/bp_device_tests --gtest_filter=*MathTest*:*FusedTest*" ;;
    conf-cpu) echo "$build/bin/bp-conformance --device cpu:0 --filter kernels.* --seed $seed" ;;
    conf-opencl) echo "$build/bin/bp-conformance --device opencl:0 --filter kernels.* --seed $seed" ;;
    conf-cuda)
      if "$build/bin/bp-conformance" --device cuda:0 --filter kernels.add_contiguous --list 2>/dev/null |
        grep -q 'kernels.add_contiguous\[cuda:0'; then
        echo "$build/bin/bp-conformance --device cuda:0 --filter kernels.* --seed $seed"
      else
        echo "true"  # no GPU here
      fi
      ;;
    *) echo "unknown suite '$suite'" >&2; return 1 ;;
  esac
}

declare -A passed failed seconds
failures=()
start=$(date +%s)
echo "stress-seeds: $runs runs of: ${suites[*]} (build $build, logs in $out)"
for ((r = 1; r <= runs; r++)); do
  for suite in "${suites[@]}"; do
    seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
    cmd=$(command_of "$suite" "$seed") || exit 2
    t0=$(date +%s)
    if $cmd >"$out/current.log" 2>&1; then
      passed[$suite]=$((${passed[$suite]:-0} + 1))
    else
      failed[$suite]=$((${failed[$suite]:-0} + 1))
      { echo "# $cmd"; cat "$out/current.log"; } >"$out/$suite-$seed.log"
      failures+=("$suite seed $seed: $out/$suite-$seed.log")
      echo "run $r: $suite FAILED with seed $seed ($cmd)"
    fi
    seconds[$suite]=$((${seconds[$suite]:-0} + $(date +%s) - t0))
  done
  echo "run $r/$runs done ($(($(date +%s) - start)) s, ${#failures[@]} failures so far)"
done
rm -f "$out/current.log"

echo
printf '%-12s %7s %7s %9s\n' suite passed failed seconds
for suite in "${suites[@]}"; do
  printf '%-12s %7d %7d %9d\n' "$suite" "${passed[$suite]:-0}" "${failed[$suite]:-0}" \
    "${seconds[$suite]:-0}"
done
echo "total: $(($(date +%s) - start)) s, ${#failures[@]} failed runs"
for f in "${failures[@]}"; do echo "  $f"; done
[ ${#failures[@]} -eq 0 ]
