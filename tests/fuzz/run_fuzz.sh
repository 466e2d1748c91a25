#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (libFuzzer + AddressSanitizer) and runs each for a
# bounded time on its seed corpus, one after the other. Exit status: 0 when no target found a
# crash.
#
#   tests/fuzz/run_fuzz.sh [seconds-per-target=60] [build-dir=<repo>/build-fuzz] [target...]
#
# Targets: safetensors device_string config plugin_table store_request store_reply (default:
# all). New inputs go to
# <build-dir>/fuzz-corpus/<target> (the committed seeds in tests/fuzz/corpus/<target> stay as
# they are); a crash leaves its input in <build-dir>/fuzz-artifacts/<target> and is printed.
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${2:-$root/build-fuzz}"
shift $(($# > 2 ? 2 : $#))
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(safetensors device_string config plugin_table store_request store_reply)
export CC="${CC:-clang}" CXX="${CXX:-clang++}"
jobs="${BP_FUZZ_BUILD_JOBS:-$(nproc)}"

configure() {
  cmake -S "$root" -B "$build" -G Ninja \
    -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DBP_BUILD_FUZZ=ON -DBP_SANITIZE=address,fuzzer-no-link \
    -DBP_BUILD_CUDA=OFF -DBP_BUILD_OPENCL=OFF -DBP_BUILD_BENCH=OFF -DBP_BUILD_EXAMPLES=OFF \
    -DBP_BUILD_TESTS="$1" >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log"; exit 1; }
}

# Only what the targets need. The top-level CMakeLists adds tests/ (and so tests/fuzz) only
# with BP_BUILD_TESTS=ON; where that is so, configure with it on (nothing else gets built).
mkdir -p "$build"
configure OFF
if ! ninja -C "$build" -t targets all 2>/dev/null | grep -q '^fuzz_safetensors:'; then
  configure ON
fi
ninja -C "$build" -j "$jobs" "${targets[@]/#/fuzz_}"

# The longest input worth trying for each target.
max_len() {
  case "$1" in
    safetensors) echo 65536 ;;
    config) echo 4096 ;;
    plugin_table) echo 1024 ;;
    store_request | store_reply) echo 8192 ;;
    *) echo 256 ;;
  esac
}

status=0
summary=()
for t in "${targets[@]}"; do
  corpus="$build/fuzz-corpus/$t" artifacts="$build/fuzz-artifacts/$t"
  mkdir -p "$corpus" "$artifacts"
  dict=()
  [ -f "$root/tests/fuzz/$t.dict" ] && dict=(-dict="$root/tests/fuzz/$t.dict")
  echo "fuzz_$t: running for ${seconds}s"
  log="$build/fuzz-$t.log"
  if "$build/bin/fuzz_$t" "$corpus" "$root/tests/fuzz/corpus/$t" "${dict[@]}" \
    -max_total_time="$seconds" -max_len="$(max_len "$t")" -rss_limit_mb=2048 \
    -malloc_limit_mb=512 -artifact_prefix="$artifacts/" -print_final_stats=1 >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    summary+=("fuzz_$t: ${runs:-?} runs in ${seconds}s, no crash")
  else
    status=1
    summary+=("fuzz_$t: FAILED (log $log, inputs in $artifacts)")
    tail -40 "$log"
  fi
done
printf '%s\n' "${summary[@]}"
exit $status
