#!/usr/bin/env bash
# One-command set-up for a fresh Debian/Ubuntu machine (run as root or with sudo):
#
#   bash tools/setup.sh demo   installs and builds only what the demo runs (core, the plugins
#                              this machine can use, bp-smi, the examples) and runs bp-smi plus
#                              the device walkthrough on the best device found (the first GPU,
#                              else the CPU)
#   bash tools/setup.sh test   installs, builds (with the CUDA plugin when nvcc exists), and
#                              runs every test; then `pip install .` into a fresh virtual
#                              environment and the Python tests (pytest); then an
#                              AddressSanitizer+UBSan build runs the unit and device tests, a
#                              ThreadSanitizer build of core and the cpu plugin runs the unit,
#                              device, stress and exit tests, each libFuzzer target runs
#                              briefly, and the documentation site is built and checked
#
# Environment: BP_JOBS (parallel build jobs), BP_SKIP_INSTALL=1 (packages already present),
# BP_SKIP_PYTHON=1, BP_SKIP_SANITIZE=1 (neither sanitizer build), BP_SKIP_TSAN=1,
# BP_FUZZ_SECONDS (per fuzz target, default 10), BP_PYTHON (the interpreter for the Python
# package; default python3), BP_WHEEL_CUDA=1 (build the wheel's CUDA plugin too; the test run
# builds it without, see python_tests below).
set -euo pipefail
mode=${1:-test}
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$top"
jobs=${BP_JOBS:-$(nproc)}

install_packages() {
  [ "${BP_SKIP_INSTALL:-0}" = 1 ] && return 0
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  if [ "${1:-}" = demo ]; then
    $sudo apt-get install -y -qq --no-install-recommends $(demo_packages) >/dev/null
    return 0
  fi
  $sudo apt-get install -y -qq --no-install-recommends \
    build-essential cmake ninja-build clang libclang-rt-dev pkg-config file python3 \
    libtbb-dev libopenblas-dev libdnnl-dev libsleef-dev libtomlplusplus-dev nlohmann-json3-dev \
    libgtest-dev ocl-icd-opencl-dev opencl-headers pocl-opencl-icd python3-dev python3-venv \
    libgloo-dev iproute2 ccache chromium \
    >/dev/null
}

# What the demo builds with: no clang, GoogleTest, Gloo or Chromium (tests and CI only).
demo_packages() {
  echo build-essential cmake ninja-build pkg-config file python3 ccache \
    libtbb-dev libopenblas-dev libdnnl-dev libsleef-dev libtomlplusplus-dev nlohmann-json3-dev \
    ocl-icd-opencl-dev opencl-headers pocl-opencl-icd
}

# nvcc is often installed outside PATH.
for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
  [ -x "$d/nvcc" ] && ! command -v nvcc >/dev/null && export PATH="$d:$PATH"
done

cuda_args() {
  if command -v nvcc >/dev/null; then
    # Build for the local GPU when there is one, else for Hopper (compile check only).
    if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
      echo "-DBP_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native"
    else
      echo "-DBP_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90"
    fi
  else
    echo "-DBP_BUILD_CUDA=OFF"
  fi
}

# Compiler launcher: ccache when installed (a second run, or another clone under ccache's
# base_dir, recompiles only what changed).
launcher_args() {
  if command -v ccache >/dev/null; then
    echo "-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache" \
      "-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"
  fi
}

# ccache keys on absolute paths unless they fall under its base directory: with the clone's
# parent folder as base_dir (and the working directory left out of the hash), two clones side
# by side compile to the same keys, so a second clone reuses the first clone's objects. A
# CCACHE_BASEDIR already set is kept.
ccache_env() {
  command -v ccache >/dev/null || return 0
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(dirname "$top")}
  export CCACHE_NOHASHDIR=1
}
ccache_env

# Every build uses a preset of CMakePresets.json (release, asan, tsan).
build_release() {
  # shellcheck disable=SC2046
  cmake --preset release $(cuda_args) $(launcher_args) "$@"
  cmake --build --preset release -j "$jobs"
}

# The demo's build: core, the plugins this machine can use (cpu; cuda only with nvcc and a
# working GPU driver; opencl where an OpenCL platform is registered), bp-smi and the examples;
# no tests, benchmarks, conformance kit or communicators.
gpu_usable() {
  command -v nvcc >/dev/null && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1
}
build_demo() {
  local cuda=-DBP_BUILD_CUDA=OFF opencl=-DBP_BUILD_OPENCL=OFF
  local targets=(backplane backplane-cpu bp-smi example-devices example-tensors example-model
    example-train)
  if gpu_usable; then
    cuda="-DBP_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native"
    targets+=(backplane-cuda)
  fi
  if compgen -G "/etc/OpenCL/vendors/*.icd" >/dev/null; then
    opencl=-DBP_BUILD_OPENCL=ON
    targets+=(backplane-opencl)
  fi
  # shellcheck disable=SC2046,SC2086
  cmake --preset release $cuda $opencl -DBP_BUILD_TESTS=OFF -DBP_BUILD_BENCH=OFF \
    -DBP_BUILD_GLOO=OFF -DBP_BUILD_NCCL=OFF $(launcher_args)
  cmake --build --preset release -j "$jobs" --target "${targets[@]}"
}

# pip install . (scikit-build-core + nanobind from PyPI) into a fresh virtual environment, then
# the Python tests against that installed wheel, run from outside the source package. The
# CUDA plugin inside the wheel is left out here unless BP_WHEEL_CUDA=1: build_release already
# compiled the same sources, and nvcc would add minutes to every CI run for a plugin that
# cannot run on a machine without a GPU (tools/gpu/python.sh builds and tests the full wheel).
python_tests() {
  local py=${BP_PYTHON:-python3} venv=build/python-venv t0=$SECONDS
  local cuda=-Ccmake.define.BP_BUILD_CUDA=OFF
  [ "${BP_WHEEL_CUDA:-0}" = 1 ] && cuda=-Ccmake.define.BP_BUILD_CUDA=ON
  # With ccache, the wheel builds in build-wheel (not a fresh temporary folder), so a second
  # run or another clone under ccache's base_dir reuses the compiled objects. build-wheel sits
  # beside build/ and uses build/'s compilers, so the core and plugin sources that
  # build_release compiled have the same ccache keys (paths are relative to the build folder,
  # flags are the same Release flags): only the Python module and nanobind compile here.
  local cache=()
  if command -v ccache >/dev/null; then
    cache=(-Cbuild-dir=build-wheel -Ccmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache
      -Ccmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
    local lang compiler
    for lang in C CXX; do
      compiler=$(sed -n "s/^CMAKE_${lang}_COMPILER:[A-Z]*=//p" build/CMakeCache.txt 2>/dev/null)
      [ -n "$compiler" ] && cache+=("-Ccmake.define.CMAKE_${lang}_COMPILER=$compiler")
    done
  fi
  rm -rf "$venv"
  "$py" -m venv "$venv"
  CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$venv/bin/python" -m pip install -q ".[test]" "$cuda" \
    "${cache[@]}"
  echo "python: pip install . took $((SECONDS - t0)) s"
  "$venv/bin/pytest" -q python/tests
  echo "python: install and tests took $((SECONDS - t0)) s"
}

# The documentation site (docs/, mkdocs.yml): MkDocs Material at the versions pinned in
# docs/requirements.txt, built with warnings as errors (links and anchors validated), then
# every page opened in headless Chromium and every internal link of the HTML checked
# (tools/docs-check.py). BP_DOCS_SHOTS=DIR keeps a screenshot of each page.
docs_site() {
  local py=${BP_PYTHON:-python3} venv=build/docs-venv
  [ -x "$venv/bin/mkdocs" ] || "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q -r docs/requirements.txt
  NO_MKDOCS_2_WARNING=1 "$venv/bin/mkdocs" build --strict --quiet --site-dir build/site
  "$venv/bin/python" tools/docs-check.py build/site ${BP_DOCS_SHOTS:+--shots "$BP_DOCS_SHOTS"}
}

# timed LABEL CMD...: runs CMD and records its wall time for the summary. Call it as a plain
# command (not after || or in a condition), so that set -e still stops at a failing step.
timings=()
timed() {
  local label=$1 t0=$SECONDS
  shift
  "$@"
  timings+=("$(printf '%-28s %5d s' "$label" $((SECONDS - t0)))")
  echo "== tools/setup.sh: step '$label' took $((SECONDS - t0)) s (total $SECONDS s)"
}

asan_step() {
  # shellcheck disable=SC2046
  cmake --preset asan $(launcher_args)
  cmake --build --preset asan -j "$jobs" --target bp_unit_tests bp_device_tests \
    bp_hot_path_tests bp-fixtures bp-smi backplane-cpu
  # intercept_tls_get_addr=0: GCC 12's LeakSanitizer misreads the dynamic TLS of dlopen'd
  # plugins on glibc 2.36 (log_threads=1 shows "DTLS 7 at 0x67c-0x5000177e", a bogus range) and
  # its tracer dies reading it ("Tracer caught signal 11: addr=0x680 ... LeakSanitizer has
  # encountered a fatal error") after a test passed (unit.Fallback.MlpWithoutMatmulMatchesCpu
  # every time, MathTest on some machines). Leaks are still checked; DTLS blocks are not roots.
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:intercept_tls_get_addr=0 \
    ctest --output-on-failure -j "$jobs" -R '^(unit|device)\.' --timeout 600)
}

# ThreadSanitizer: core and the cpu plugin; unit, device (graphs and their threads, the
# profiler, native handles: the C++ side of DLPack), stress and exit tests. PoCL's own threads
# race on LLVM state at each program family's first opencl launch, a report no suppression can
# name (tools/tsan.supp), so the opencl plugin is neither built nor loaded here (the tsan preset
# sets BP_BUILD_OPENCL=OFF). Suppressions cover third-party libraries only, each with its reason.
# Run without ASLR, so that TSan's fixed memory layout fits whatever vm.mmap_rnd_bits the kernel
# uses.
tsan_step() {
  # shellcheck disable=SC2046
  cmake --preset tsan $(launcher_args) -DBP_EXIT_RUNS=2
  cmake --build --preset tsan -j "$jobs" --target bp_unit_tests bp_device_tests \
    bp_hot_path_tests bp_stress_tests bp_exit_program bp-fixtures bp-smi backplane-cpu
  (cd build-tsan &&
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$top/tools/tsan.supp" \
      BACKPLANE_PLUGINS=cpu setarch "$(uname -m)" -R \
      ctest --output-on-failure -j "$jobs" -R '^(unit|device|stress|exit)\.' --timeout 900)
}

case "$mode" in
  demo)
    install_packages demo
    build_demo
    build/tools/bp-smi
    echo
    build/bin/example-devices
    echo
    build/bin/example-tensors
    if [ -x build/bin/example-model ]; then echo; (cd build && bin/example-model); fi
    ;;
  test)
    timed install install_packages
    timed "build (release)" build_release -DBP_BUILD_TESTS=ON
    timed "ctest (release)" bash -c "cd build && ctest --output-on-failure -j $jobs --timeout 600"
    if [ "${BP_SKIP_PYTHON:-0}" != 1 ]; then timed "python (pip install, pytest)" python_tests; fi
    if [ "${BP_SKIP_SANITIZE:-0}" != 1 ]; then
      timed "asan+ubsan build+tests" asan_step
      if [ "${BP_SKIP_TSAN:-0}" != 1 ]; then timed "tsan build+tests" tsan_step; fi
    fi
    timed "docs site (build, check)" docs_site
    if [ -x tests/fuzz/run_fuzz.sh ] && command -v clang++ >/dev/null; then
      timed "fuzz build+runs" bash tests/fuzz/run_fuzz.sh "${BP_FUZZ_SECONDS:-10}"
    fi
    echo "== tools/setup.sh test: wall time per step"
    printf '%s\n' "${timings[@]}"
    printf '%-28s %5d s\n' total "$SECONDS"
    ;;
  *)
    echo "usage: bash tools/setup.sh demo|test" >&2
    exit 2
    ;;
esac
