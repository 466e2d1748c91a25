#!/usr/bin/env bash
# Issue 32: minimal pytest files beside a copy of python/tests/conftest.py, each run alone, to
# find which import or fixture of test_interop_gpu.py makes nanobind report leaked Device
# objects at exit (tools/gpu/leak_bisect.sh: every test of that file does, none of
# test_dlpack_c_api.py's).
#   source .device/env.sh
#   bash tools/gpu/leak_pytest_variants.sh BUILD_DIR
set -uo pipefail
build=$(cd "${1:?usage: bash tools/gpu/leak_pytest_variants.sh BUILD_DIR}" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
py=${BP_PYTHON:-python3}
dir=$(mktemp -d)
cp "$here/python/tests/conftest.py" "$dir/"
variant() {
  local name=$1 body=$2
  printf '%s\n\n\ndef test_nothing():\n    pass\n' "$body" > "$dir/test_$name.py"
  local log
  log=$(cd "$dir" && "$py" -m pytest -q -p no:cacheprovider "test_$name.py" 2>&1)
  printf '%-28s leak-lines=%s\n' "$name" "$(grep -c leaked <<<"$log")"
  grep -m2 "leaked\|rror" <<<"$log" | sed 's/^/    /'
  rm -f "$dir/test_$name.py"
}
variant plain 'import backplane as bp'
variant conftest_import 'import backplane as bp
from conftest import GPU_DEVICES'
variant torch 'import torch
import backplane as bp'
variant torch_conftest 'import backplane as bp
from conftest import GPU_DEVICES
import torch'
variant cupy 'import backplane as bp
import cupy
cupy.cuda.runtime.getDeviceCount()'
variant cupy_conftest 'import backplane as bp
from conftest import GPU_DEVICES
import cupy
cupy.cuda.runtime.getDeviceCount()'
variant cupy_only_import 'import backplane as bp
from conftest import GPU_DEVICES
import cupy'
variant torch_cupy_conftest 'import backplane as bp
from conftest import GPU_DEVICES
import torch
import cupy
cupy.cuda.runtime.getDeviceCount()'
variant interop_header "$(sed -n '/^import gc/,/^def live/p' "$here/python/tests/test_interop_gpu.py" | sed '$d')"
# Without Backplane: does a parametrised fixture's object outlive the interpreter under pytest
# when PyTorch is imported? ("sentinel freed" missing means pytest's state was never freed.)
sentinel='import os
import pytest


class S:
    def __del__(self, _w=os.write):
        _w(2, b"sentinel freed\n")


@pytest.fixture(params=[S()], ids=str)
def s(request):
    return request.param


def test_s(s):
    pass'
sentinel_run() {
  local name=$1 head=$2
  printf '%s\n%s\n' "$head" "$sentinel" > "$dir/test_$name.py"
  local log
  log=$(cd "$dir" && "$py" -m pytest -q -p no:cacheprovider "test_$name.py" 2>&1)
  printf '%-28s sentinel-freed=%s leak-lines=%s\n' "$name" "$(grep -c "sentinel freed" <<<"$log")" \
    "$(grep -c leaked <<<"$log")"
  rm -f "$dir/test_$name.py"
}
sentinel_run sentinel_plain ''
sentinel_run sentinel_torch 'import torch'
sentinel_run sentinel_torch_cuda 'import torch
torch.ones(1, device="cuda")'
sentinel_run sentinel_bp_torch 'import torch
import backplane as bp'
# typing's caches (nanobind discussion 13): cleared by an atexit hook before finalisation
variant torch_typing_cleanup 'import atexit
import typing
import torch
import backplane as bp
atexit.register(lambda: [f() for f in typing._cleanups])'
variant torch_gc_atexit 'import atexit
import gc
import torch
import backplane as bp
import conftest
def _drop():
    conftest.DEVICES.clear()
    conftest.GPU_DEVICES.clear()
    gc.collect()
atexit.register(_drop)'
rm -rf "$dir"
