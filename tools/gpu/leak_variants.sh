#!/usr/bin/env bash
# Issue 32: which step of a PyTorch + Backplane program makes nanobind report leaked objects at
# interpreter exit. Each variant is a fresh interpreter; prints its exit code and the first lines
# of any leak report. Run on the GPU machine after `source .device/env.sh`:
#   bash tools/gpu/leak_variants.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: bash tools/gpu/leak_variants.sh BUILD_DIR}
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
py=${BP_PYTHON:-python3}
run() {
  local name=$1 code=$2
  local log
  log=$("$py" -c "$code" 2>&1)
  local rc=$?
  local leaks
  leaks=$(grep -c "leaked" <<<"$log")
  printf '%-34s rc=%s leak-lines=%s\n' "$name" "$rc" "$leaks"
  grep -m4 "leaked\|Error" <<<"$log" | sed 's/^/    /'
  return 0
}
run bp-cuda 'import backplane as bp; x = bp.ones(3, device="cuda:0"); print(x.sum().item())'
run torch-import-then-bp-cpu 'import torch, backplane as bp; print(bp.ones(3).sum().item())'
run bp-then-torch-cpu 'import backplane as bp, torch; print(bp.ones(3).sum().item())'
run torch-bp-cuda 'import torch, backplane as bp; x = bp.ones(3, device="cuda:0"); print(x.sum().item())'
run torch-cuda-bp-cuda 'import torch, backplane as bp; torch.ones(1, device="cuda"); x = bp.ones(3, device="cuda:0"); print(x.sum().item())'
run bp-to-torch 'import torch, backplane as bp; t = torch.from_dlpack(bp.ones(3, device="cuda:0")); print(t.sum().item())'
run bp-to-torch-del 'import torch, backplane as bp; t = torch.from_dlpack(bp.ones(3, device="cuda:0")); print(t.sum().item()); del t; import gc; gc.collect()'
run torch-to-bp 'import torch, backplane as bp; x = bp.from_dlpack(torch.ones(3, device="cuda")); print(x.sum().item())'
run torch-to-bp-del 'import torch, backplane as bp; x = bp.from_dlpack(torch.ones(3, device="cuda")); print(x.sum().item()); del x; import gc; gc.collect()'
run bp-to-torch-cpu 'import torch, backplane as bp; t = torch.from_dlpack(bp.ones(3)); print(t.sum().item())'
run torch-to-bp-cpu 'import torch, backplane as bp; x = bp.from_dlpack(torch.ones(3)); print(x.sum().item())'
run exchange-api-query 'import torch, backplane as bp; print(bp._core._dlpack_c_exchange_api_of(torch.Tensor) is not None)'
run torch-device-attr 'import torch, backplane as bp; d = bp.device("cuda:0"); print(torch.device(str(d)))'
# test_interop_gpu.py leaks in every single test, test_dlpack_c_api.py in none: the former also
# imports CuPy and lists the devices (conftest).
run devices-list 'import backplane as bp; D = list(bp.devices()); print(D)'
run torch-devices-list 'import torch, backplane as bp; D = list(bp.devices()); print(D)'
run cupy-import 'import backplane as bp, cupy; print(bp.ones(2).sum().item())'
run cupy-count 'import backplane as bp, cupy; cupy.cuda.runtime.getDeviceCount(); print(bp.ones(2).sum().item())'
run cupy-devices-list 'import backplane as bp, cupy; D = list(bp.devices()); print(D)'
run cupy-count-devices-list 'import backplane as bp, cupy; cupy.cuda.runtime.getDeviceCount(); D = list(bp.devices()); print(D)'
run cupy-count-devices-del 'import backplane as bp, cupy; cupy.cuda.runtime.getDeviceCount(); D = list(bp.devices()); del D'
run cupy-first-devices-list 'import cupy, backplane as bp; cupy.cuda.runtime.getDeviceCount(); D = list(bp.devices()); print(D)'
run cupy-cuda-device 'import backplane as bp, cupy; cupy.cuda.runtime.getDeviceCount(); d = bp.device("cuda:0"); print(d)'
run cupy-opencl-device 'import backplane as bp, cupy; cupy.cuda.runtime.getDeviceCount(); d = bp.device("opencl:0"); print(d)'
run opencl-device 'import backplane as bp; d = bp.device("opencl:0"); print(d)'
