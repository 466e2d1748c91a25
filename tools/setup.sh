#!/usr/bin/env bash
# One-command set-up for a fresh Debian/Ubuntu machine (run as root or with sudo):
#
#   bash tools/setup.sh demo   installs, builds, and runs bp-smi plus the device walkthrough
#                              on the best device found (the first GPU, else the CPU)
#   bash tools/setup.sh test   installs, builds (with the CUDA plugin when nvcc exists), and
#                              runs every test; then `pip install .` into a fresh virtual
#                              environment and the Python tests (pytest); then an
#                              AddressSanitizer+UBSan build runs the unit and device tests, and
#                              the safetensors fuzzer runs briefly
#
# Environment: BP_JOBS (parallel build jobs), BP_SKIP_INSTALL=1 (packages already present),
# BP_SKIP_PYTHON=1, BP_SKIP_SANITIZE=1, BP_FUZZ_SECONDS (default 30), BP_PYTHON (the
# interpreter for the Python package; default python3), BP_WHEEL_CUDA=1 (build the wheel's
# CUDA plugin too; the test run builds it without, see python_tests below).
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
  $sudo apt-get install -y -qq --no-install-recommends \
    build-essential cmake ninja-build clang libclang-rt-dev pkg-config file python3 \
    libtbb-dev libopenblas-dev libdnnl-dev libsleef-dev libtomlplusplus-dev nlohmann-json3-dev \
    libgtest-dev ocl-icd-opencl-dev opencl-headers pocl-opencl-icd python3-dev python3-venv \
    libgloo-dev iproute2 \
    >/dev/null
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

build_release() {
  # shellcheck disable=SC2046
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release $(cuda_args) "$@"
  cmake --build build -j "$jobs"
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
  rm -rf "$venv"
  "$py" -m venv "$venv"
  CMAKE_BUILD_PARALLEL_LEVEL=$jobs "$venv/bin/python" -m pip install -q ".[test]" "$cuda"
  echo "python: pip install . took $((SECONDS - t0)) s"
  "$venv/bin/pytest" -q python/tests
  echo "python: install and tests took $((SECONDS - t0)) s"
}

case "$mode" in
  demo)
    install_packages
    build_release -DBP_BUILD_TESTS=OFF
    build/tools/bp-smi
    echo
    build/bin/example-devices
    echo
    build/bin/example-tensors
    if [ -x build/bin/example-model ]; then echo; (cd build && bin/example-model); fi
    ;;
  test)
    install_packages
    build_release -DBP_BUILD_TESTS=ON
    (cd build && ctest --output-on-failure -j "$jobs" --timeout 600)
    [ "${BP_SKIP_PYTHON:-0}" = 1 ] || python_tests
    if [ "${BP_SKIP_SANITIZE:-0}" != 1 ]; then
      cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
        -DBP_SANITIZE=address,undefined -DBP_BUILD_CUDA=OFF -DBP_BUILD_OPENCL=OFF \
        -DBP_BUILD_BENCH=OFF -DBP_BUILD_EXAMPLES=OFF -DBP_BUILD_TESTS=ON
      cmake --build build-asan -j "$jobs" --target bp_unit_tests bp_device_tests \
        bp-fixtures bp_loader_probe bp-smi backplane-cpu
      (cd build-asan && ASAN_OPTIONS=detect_leaks=1 \
        ctest --output-on-failure -j "$jobs" -R '^(unit|device)\.' --timeout 600)
    fi
    if [ -x tests/fuzz/run_fuzz.sh ] && command -v clang++ >/dev/null; then
      bash tests/fuzz/run_fuzz.sh "${BP_FUZZ_SECONDS:-30}"
    fi
    ;;
  *)
    echo "usage: bash tools/setup.sh demo|test" >&2
    exit 2
    ;;
esac
