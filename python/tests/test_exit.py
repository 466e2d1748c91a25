"""Leaving Python with work queued on every device (Note [Exit] in core/src/runtime/registry.cpp):
SystemExit, sys.exit from a thread's caller and the end of the script, each run several times
with a new, empty PoCL kernel cache (so PoCL compiles the first launches on its own thread while
the interpreter shuts down). Every run must exit with the expected status and no signal."""
import os
import subprocess
import sys
import uuid

import pytest

from conftest import SEED

PROGRAM = """
import sys
import backplane as bp
bp.manual_seed({seed})
keep = []
for d in bp.devices():
    x = bp.rand((96, 96), device=d)
    keep.append((x.exp().sqrt() @ x).sum())
print("queued on", len(keep), "devices", flush=True)
{leave}
"""

LEAVE = {
    "system_exit": ("raise SystemExit(3)", 3),
    "sys_exit": ("sys.exit(0)", 0),
    "end_of_script": ("", 0),
    "uncaught_error": ("raise RuntimeError('leaving with an error')", 1),
}
RUNS = int(os.environ.get("BP_EXIT_RUNS", "3"))


@pytest.mark.parametrize("how", sorted(LEAVE))
def test_exit_with_queued_work(how, tmp_path):
    code, status = LEAVE[how]
    crashes = []
    for i in range(RUNS):
        cache = tmp_path / f"pocl-{uuid.uuid4().hex}"
        cache.mkdir()
        env = dict(os.environ, POCL_CACHE_DIR=str(cache))
        r = subprocess.run([sys.executable, "-c", PROGRAM.format(seed=SEED + i, leave=code)],
                           env=env, capture_output=True, text=True, timeout=300)
        if r.returncode != status or "queued on" not in r.stdout:
            crashes.append(f"run {i}: status {r.returncode} (expected {status})\n"
                           f"stdout: {r.stdout}\nstderr: {r.stderr[-2000:]}")
    print(f"{how}: runs {RUNS}, failed {len(crashes)}")
    assert not crashes, "\n".join(crashes)


LEAK_PROGRAM = """
import numpy as np
import backplane as bp
from backplane import nn
keep = [bp.device("cpu"), bp.devices(), bp.default_device()]
net = nn.Sequential(nn.Linear(3, 2)).to(bp.try_gpu())
opt = bp.optim.Adam(net.parameters())
for d in bp.devices():
    x = bp.ones(3, device=d) + np.ones(3, np.float32)
    keep.append((x, x.device, repr(x)))
loader = bp.utils.data.DataLoader(bp.utils.data.TensorDataset(bp.ones(4, 3)), batch_size=2,
                                  num_workers=2)
keep.append(list(loader))



class Producer:  # a type whose exchange table from_dlpack looks up (and caches: it has none)
    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


keep.append(bp.from_dlpack(Producer(np.ones(3))))
try:
    import torch  # (the leak report came with and without PyTorch loaded)
    keep.append(bp.from_dlpack(torch.ones(3)))  # through torch's exchange table, cached
except ImportError:
    pass
print("done", flush=True)
"""


def test_nothing_leaks_at_interpreter_exit():
    """nanobind reports instances, types or functions still alive when the interpreter ends;
    the package must leave none (with or without PyTorch)."""
    r = subprocess.run([sys.executable, "-c", LEAK_PROGRAM], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr[-2000:]
    assert "leak" not in r.stderr.lower(), r.stderr[-4000:]


FORCED_LEAK = """
import ctypes
import sys
import types
import backplane as bp
d = bp.device("cpu")
ctypes.pythonapi.Py_IncRef(ctypes.py_object(d))  # a reference nobody gives back: a real leak
{setup}
print("done", flush=True)
"""


@pytest.mark.parametrize("setup, reported", [
    ("", True),
    ("sys.modules.setdefault('torch', types.ModuleType('torch'))", True),
    ("import _pytest", True),
    ("sys.modules.setdefault('torch', types.ModuleType('torch')); import _pytest", False),
])
def test_leak_report_is_off_only_under_pytest_with_torch(setup, reported):
    """Note [Leak reports under pytest with PyTorch]: a leaked Device is reported at exit unless
    both PyTorch and pytest are loaded (pytest's state then outlives the interpreter)."""
    r = subprocess.run([sys.executable, "-c", FORCED_LEAK.format(setup=setup)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "done" in r.stdout, r.stderr[-2000:]
    assert ("leaked 1 instances" in r.stderr) == reported, r.stderr[-2000:]
