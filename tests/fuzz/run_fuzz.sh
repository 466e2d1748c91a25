#!/usr/bin/env bash
# Builds the safetensors fuzz target with clang (libFuzzer + AddressSanitizer) and runs it for a
# bounded time on the seed corpus. Exit status: 0 when no crash was found.
#
#   tests/fuzz/run_fuzz.sh [seconds=60] [build-dir=<repo>/build-fuzz]
#
# New inputs go to <build-dir>/fuzz-corpus (the committed seeds stay as they are); a crash
# leaves its input in <build-dir>/fuzz-artifacts and is printed.
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${2:-$root/build-fuzz}"
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

# Only what the target needs. The top-level CMakeLists adds tests/ (and so tests/fuzz) only
# with BP_BUILD_TESTS=ON; where that is so, configure with it on (nothing else gets built).
mkdir -p "$build"
configure OFF
if ! ninja -C "$build" -t targets all 2>/dev/null | grep -q '^fuzz_safetensors:'; then
  configure ON
fi
ninja -C "$build" -j "$jobs" fuzz_safetensors

mkdir -p "$build/fuzz-corpus" "$build/fuzz-artifacts"
echo "fuzz_safetensors: running for ${seconds}s"
"$build/bin/fuzz_safetensors" "$build/fuzz-corpus" "$root/tests/fuzz/corpus/safetensors" \
  -dict="$root/tests/fuzz/safetensors.dict" \
  -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -malloc_limit_mb=512 \
  -artifact_prefix="$build/fuzz-artifacts/" -print_final_stats=1
