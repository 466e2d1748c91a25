#!/usr/bin/env bash
# The Python package on a GPU machine: the pytest suite with PyTorch and CuPy on cuda:0
# (zero-copy checked by pointer, stream ordering with long work on side streams), the d2l
# example, and the two benchmarks against PyTorch. Logs and JSON go to $OUT (or ./python-out).
#
#   On the development machine (builds a cp312 wheel for Hopper and collects the libraries its
#   plugins need that a bare machine lacks, oneTBB and OpenBLAS, into .device/python):
#     bash tools/gpu/python.sh build            # BP_PYTHON=/path/to/python3.12 to choose
#   On the GPU machine, from the repository root (carry .device/python):
#     bash tools/gpu/python.sh [WHEEL | DIR]    # default: .device/python/*.whl
#   DIR may be a folder holding the `backplane` package (site-packages, or <build>/python of a
#   BP_BUILD_PYTHON=ON tree; then <build>/lib is added to LD_LIBRARY_PATH).
#
# Pass: every step rc=0; pytest reports no failures with the torch/cupy/cuda tests run (not
# skipped); the benchmark tables show the ratios (goals: per-op add <= 0.8x PyTorch, DLPack
# import/export/round trip <= 1.0x).
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$top"

if [ "${1:-}" = build ]; then
  set -e
  py=${BP_PYTHON:-/root/.pyenv/versions/3.12.1/bin/python3}
  out=.device/python
  rm -rf "$out" && mkdir -p "$out/lib"
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.device/' "$exclude" 2>/dev/null || echo '/.device/' >> "$exclude"
  # A persistent build folder (build/wheel-gpu) with ccache: a second build after a change
  # recompiles only what changed.
  cache=()
  command -v ccache >/dev/null &&
    cache=(-Cbuild-dir=build/wheel-gpu -Ccmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache
      -Ccmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache
      -Ccmake.define.CMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  "$py" -m pip wheel --no-deps -w "$out" . \
    -Ccmake.define.BP_BUILD_CUDA=ON -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90 "${cache[@]}"
  whl=$(ls "$out"/backplane-*.whl)
  tmp=$(mktemp -d)
  "$py" -m zipfile -e "$whl" "$tmp"
  skip='/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas[^/]*|libnvrtc[^/]*|libOpenCL)\.so'
  find "$tmp" -name '*.so' -print0 | xargs -0 ldd 2>/dev/null | awk '/=> \//{print $3}' |
    sort -u | grep -E '^/(usr/)?lib' | grep -Ev "$skip" | while read -r lib; do cp -L "$lib" "$out/lib/"; done
  rm -rf "$tmp"
  # The CPU plugin's BLAS libraries (oneDNN, OpenBLAS: ~75 MiB) go xz-compressed, so the carried
  # folder stays under the device tool's 64 MiB; the run below unpacks them.
  packed=$(cd "$out/lib" && ls libdnnl.so* libopenblas.so* 2>/dev/null || true)
  if [ -n "$packed" ]; then
    (cd "$out/lib" && tar -cJf ../lib-packed.tar.xz $packed && rm -f $packed)
  fi
  ls -la "$out" "$out/lib"
  echo "carry .device/python ($(du -sh "$out" | cut -f1)); run: bash tools/gpu/python.sh"
  exit 0
fi

out=${OUT:-python-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
src=${1:-}
[ -z "$src" ] && src=$(ls .device/python/backplane-*.whl 2>/dev/null | head -n 1)
[ -n "$src" ] || { echo "python.sh: no wheel given and none in .device/python (run 'bash tools/gpu/python.sh build' where the toolchain is)" >&2; exit 2; }
site=$(mktemp -d)
if [ -f "$src" ]; then
  python3 -m pip install --no-deps --no-index --target "$site" "$src" > "$out/install.log" 2>&1 ||
    { cat "$out/install.log"; exit 2; }
else
  site=$(cd "$src" && pwd)
  [ -d "$site/../lib" ] && export LD_LIBRARY_PATH="$site/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
if [ -f .device/python/lib-packed.tar.xz ]; then
  unpacked=$(mktemp -d)
  tar -xJf .device/python/lib-packed.tar.xz -C "$unpacked"
  export LD_LIBRARY_PATH="$unpacked${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
for d in .device/python/lib .device/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$top/$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
# NVIDIA's OpenCL driver is not registered with the ICD loader there: a vendors folder holding
# an nvidia.icd that names it selects it (docs/backends.md, "opencl").
if [ -e /usr/local/nvidia/lib64/libnvidia-opencl.so.1 ] && [ -z "${OCL_ICD_VENDORS:-}" ]; then
  mkdir -p "$out/opencl-vendors"
  echo /usr/local/nvidia/lib64/libnvidia-opencl.so.1 > "$out/opencl-vendors/nvidia.icd"
  export OCL_ICD_VENDORS=$(cd "$out/opencl-vendors" && pwd)
fi

summary=()
step() {  # step NAME CMD... (each step at most BP_STEP_TIMEOUT seconds, default 240)
  local name=$1
  shift
  echo "=== $name: $*"
  local t0=$SECONDS
  timeout "${BP_STEP_TIMEOUT:-240}" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  tail -n 30 "$out/$name.log"
  summary+=("$(printf '%-16s rc=%-3s %4ss' "$name" "$rc" "$((SECONDS - t0))")")
}
step report python3 -m backplane
step versions python3 -c "import backplane, numpy, torch; print(backplane.__file__, numpy.__version__, torch.__version__, torch.cuda.get_device_name(0)); import cupy; print('cupy', cupy.__version__)"
step pytest python3 -m pytest -q -rs -p no:cacheprovider python/tests --junitxml="$out/pytest.xml"
grep -E "^(FAILED|ERROR) " "$out/pytest.log" | head -n 20
step example python3 examples/python/gpu_computing.py
step bench_op python3 bench/python/op_overhead.py --device cuda:0 --json "$out/op_overhead.json"
step bench_dlpack python3 bench/python/dlpack_roundtrip.py --device cuda:0 --json "$out/dlpack_cuda.json"
step bench_dlpack_cpu python3 bench/python/dlpack_roundtrip.py --device cpu:0 --json "$out/dlpack_cpu.json"
echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
grep -h '^|' "$out/bench_op.log" "$out/bench_dlpack.log" "$out/bench_dlpack_cpu.log" 2>/dev/null | tee -a "$out/summary.txt"
tail -n 1 "$out/pytest.log" | tee -a "$out/summary.txt"
