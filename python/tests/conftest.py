"""Shared fixtures: a fresh random seed per session (printed, BP_TEST_SEED reproduces it) and
the devices to run on (every device the registry finds, or BP_TEST_DEVICES=cuda:0,cpu:0)."""
import os

import numpy as np
import pytest

import backplane as bp

SEED = int(os.environ.get("BP_TEST_SEED", int.from_bytes(os.urandom(4), "little")))


def pytest_report_header(config):
    return [f"backplane from {os.path.dirname(bp.__file__)}",
            f"seed {SEED} (BP_TEST_SEED={SEED} reproduces this run)",
            "devices " + ", ".join(str(d) for d in _devices())]


def _devices():
    names = os.environ.get("BP_TEST_DEVICES")
    if names:
        return [bp.device(n) for n in names.split(",") if n]
    return list(bp.devices())


DEVICES = _devices()
GPU_DEVICES = [d for d in DEVICES if d.type == "cuda"]


@pytest.fixture
def rng(request):
    """A NumPy generator seeded from the session seed and the test's name."""
    bp.manual_seed(SEED)
    return np.random.default_rng([SEED, abs(hash(request.node.nodeid)) % (2**32)])


@pytest.fixture(params=DEVICES, ids=str)
def device(request):
    return request.param


def tol(dtype):
    """(rtol, atol) for comparing against a float64 NumPy reference."""
    return {bp.float32: (2e-5, 1e-6), bp.float64: (1e-12, 1e-14), bp.float16: (2e-3, 1e-4),
            bp.bfloat16: (1.6e-2, 1e-3)}.get(dtype, (0, 0))
