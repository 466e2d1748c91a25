"""NumPy imported on first use (Note [Lazy NumPy] in backplane/_np.py): `import backplane`, ops,
`tolist()` and `item()` run without it; building from arrays, `numpy()` and `repr` import it;
`tolist()` gives PyTorch's values and types for every dtype."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import backplane as bp


def _run(code):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)


def test_import_and_first_op_do_not_import_numpy():
    r = _run("""
        import sys
        import backplane as bp
        t = bp.ones([2, 3]) + 1.0
        assert t.tolist() == [[2.0] * 3] * 2, t.tolist()
        assert (t.sum().item(), float(t[0, 0])) == (12.0, 2.0)
        assert bp.arange(4).tolist() == [0, 1, 2, 3]
        assert bp.full([2], True).tolist() == [True, True]
        assert "numpy" not in sys.modules, "numpy was imported"
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_numpy_is_imported_when_needed():
    r = _run("""
        import sys
        import backplane as bp
        t = bp.tensor([[1.5, 2.5]])       # from a list: through NumPy
        assert "numpy" in sys.modules
        assert t.numpy().tolist() == [[1.5, 2.5]]
        assert isinstance(bp.ones([2]).numpy(), sys.modules["numpy"].ndarray)
        print(repr(bp.zeros([2])))
    """)
    assert r.returncode == 0 and r.stdout.strip() == "tensor([0., 0.])", r.stderr


@pytest.mark.parametrize("dtype", [bp.float32, bp.float64, bp.float16, bp.bfloat16, bp.int32,
                                   bp.int64, bp.uint8, bp.bool])
def test_tolist_values_and_types(device, rng, dtype):
    shape = (2, 3, 4)
    if dtype == bp.bool:
        ref = rng.random(shape) < 0.5
    elif dtype in (bp.int32, bp.int64, bp.uint8):
        hi = {bp.int32: 2**31 - 1, bp.int64: 2**62, bp.uint8: 255}[dtype]
        ref = rng.integers(0 if dtype == bp.uint8 else -hi, hi, size=shape)
    else:
        ref = rng.standard_normal(shape) * 100
    t = bp.tensor(ref.tolist(), dtype=dtype, device=device)
    got = t.tolist()
    want = t.to(bp.float32 if dtype == bp.bfloat16 else dtype).numpy().tolist()
    assert got == want
    floating = (bp.float32, bp.float64, bp.float16, bp.bfloat16)
    kind = bool if dtype == bp.bool else float if dtype in floating else int
    assert all(type(x) is kind for row in got for col in row for x in col)
    if dtype == bp.int64:  # beyond float64's 53 bits: exact
        assert got == ref.tolist()


def test_tolist_shapes(device):
    assert bp.full([], 7, device=device).tolist() == 7  # 0-d: the number
    assert bp.ones([0, 3], device=device).tolist() == []
    assert bp.ones([2, 0], device=device).tolist() == [[], []]
    t = bp.arange(12, device=device).reshape([3, 4]).transpose(0, 1)  # a strided view
    assert t.tolist() == np.arange(12).reshape(3, 4).T.tolist()
