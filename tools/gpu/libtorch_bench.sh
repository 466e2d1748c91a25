#!/usr/bin/env bash
# Per-op costs of Backplane (bp-bench) against libtorch's C++ API (bench/libtorch/torch_per_op.cpp)
# in one command on the GPU machine, so every per-op ratio is C++ against C++ (issue 13).
#
#   bash tools/gpu/libtorch_bench.sh BUILD_DIR [REPEAT=3] [DEVICE=cuda:0]...
#
# Compiles torch_per_op.cpp with g++ against the headers and libraries of the PyTorch pip
# package (torch/include, torch/lib; CUDA headers from /usr/local/cuda), then runs
# bench/compare.py --ref-bin on the per-op rows (1-element add queued, in place, with a sync;
# alloc+free 1 MiB; 1000 tiny add_ eager and replayed from a graph: bp::Graph against
# at::cuda::CUDAGraph), REPEAT interleaved runs, medians. Output under $OUT (else ./libtorch-out).
set -euo pipefail
build=${1:?usage: bash tools/gpu/libtorch_bench.sh BUILD_DIR [REPEAT] [DEVICE]...}
repeat=${2:-3}
shift $(($# >= 2 ? 2 : 1))
devices=("$@")
[ ${#devices[@]} -gt 0 ] || devices=(cuda:0 cpu:0)
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${OUT:-libtorch-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)

# PyTorch brings its own libraries: none of the bundle's (LD_LIBRARY_PATH) may shadow them.
torch_dir=$(env LD_LIBRARY_PATH= python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')
abi=$(env LD_LIBRARY_PATH= python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
# The CUDA runtime PyTorch ships (the graph rows call it through c10::cuda and CUDAGraph).
cudart=$(ls "$torch_dir"/../nvidia/cu*/lib/libcudart.so.* 2>/dev/null | head -n 1)
[ -n "$cudart" ] || cudart=$(ls "$torch_dir"/../nvidia/cuda_runtime/lib/libcudart.so.* 2>/dev/null | head -n 1)
echo "libtorch from $torch_dir (CXX11 ABI $abi), CUDA headers from $cuda_inc"
t0=$SECONDS
g++ -O2 -std=c++17 -DBP_TORCH_CUDA -D_GLIBCXX_USE_CXX11_ABI="$abi" \
  -isystem "$torch_dir/include" -isystem "$torch_dir/include/torch/csrc/api/include" \
  -isystem "$cuda_inc" "$top/bench/libtorch/torch_per_op.cpp" -o "$out/torch-per-op" \
  -L"$torch_dir/lib" -Wl,-rpath,"$torch_dir/lib" -Wl,--no-as-needed \
  -ltorch -ltorch_cpu -ltorch_cuda -lc10 -lc10_cuda ${cudart:+"$cudart" -Wl,-rpath,"$(dirname "$cudart")"}
echo "compiled in $((SECONDS - t0)) s"
cat >"$out/torch-per-op.sh" <<SH
#!/bin/sh
exec env LD_LIBRARY_PATH= "$out/torch-per-op" "\$@"
SH
chmod +x "$out/torch-per-op.sh"

for d in "${devices[@]}"; do
  for only in "1-element" "alloc+free" "1000 tiny"; do
    tag=${only// /_}
    tag=${tag%%-*}
    python3 "$top/bench/compare.py" --bp "$build/bin/bp-bench" --device "$d" --only "$only" \
      --repeat "$repeat" --ref-bin "$out/torch-per-op.sh" --json "$out/${d/:/}-$tag.json" \
      2>"$out/${d/:/}-$tag.err" | tee -a "$out/table.txt"
  done
done
