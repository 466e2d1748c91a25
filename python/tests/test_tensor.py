"""Tensors: creation, arithmetic with broadcasting and Python numbers, comparisons, indexing
views, reductions, matmul, casts, host reads and printing, against NumPy in float64."""
import numpy as np
import pytest

import backplane as bp
from conftest import tol


def f32(rng, *shape):
    """Fresh random float32 values in [-2, 2), never all zeros."""
    return rng.uniform(-2, 2, size=shape).astype(np.float32)


def close(t, ref, dtype=bp.float32):
    rtol, atol = tol(dtype)
    assert t.dtype == dtype
    np.testing.assert_allclose(t.numpy().astype(np.float64), ref, rtol=rtol, atol=atol)


# ---- creation --------------------------------------------------------------------------------

def test_tensor_dtypes_follow_the_data():
    assert bp.tensor([1, 2, 3]).dtype == bp.int64  # Note [Default dtype]
    assert bp.tensor([1.5, 2.0]).dtype == bp.float32
    assert bp.tensor([True, False]).dtype == bp.bool
    assert bp.tensor(np.arange(3)).dtype == bp.int64
    assert bp.tensor(np.arange(3, dtype=np.int32)).dtype == bp.int32
    assert bp.tensor(np.ones(2)).dtype == bp.float64
    assert bp.tensor(np.ones(2, np.float16)).dtype == bp.float16
    assert bp.tensor(np.ones(2, np.uint8)).dtype == bp.uint8
    assert bp.tensor([1, 2], dtype=bp.int64).tolist() == [1, 2]
    assert bp.tensor([1, 2], dtype="int32").dtype == bp.int32
    assert bp.tensor([1, 2], dtype=np.float64).dtype == bp.float64
    assert bp.tensor(3.5).shape == () and bp.tensor(3.5).item() == 3.5
    t = bp.tensor([[1, 2], [3, 4]], dtype=bp.bfloat16)
    assert t.dtype == bp.bfloat16 and t.tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_tensor_copies_its_data():
    a = np.arange(4, dtype=np.float32)
    t = bp.tensor(a)
    a[0] = 100
    assert t.tolist() == [0, 1, 2, 3]


def test_bad_creation_arguments():
    with pytest.raises(bp.ShapeError, match="rectangular"):
        bp.tensor([[1, 2], [3]])
    with pytest.raises(bp.DTypeError, match="int16"):
        bp.tensor(np.arange(3, dtype=np.int16))
    with pytest.raises(TypeError, match="unknown dtype 'complex64'"):
        bp.zeros(2, dtype="complex64")
    with pytest.raises(bp.DTypeError, match="unsupported dtype"):
        bp.zeros(2, dtype=np.complex64)
    with pytest.raises(bp.DTypeError):
        bp.tensor(["a", "b"])
    with pytest.raises(ValueError, match="non-negative"):
        bp.zeros(2, -1)
    with pytest.raises(bp.ShapeError, match="integers"):
        bp.ones(2.5)


def test_size_forms_and_fill_values(device):
    for t in (bp.zeros(2, 3, device=device), bp.zeros((2, 3), device=device),
              bp.zeros([2, 3], device=device)):
        assert t.shape == (2, 3) and t.device is device and t.tolist() == [[0.0] * 3] * 2
    assert bp.ones(4, dtype=bp.int32, device=device).tolist() == [1, 1, 1, 1]
    assert bp.full((2,), 7.5, device=device).tolist() == [7.5, 7.5]
    assert bp.empty(0, 3, device=device).shape == (0, 3)
    z = bp.zeros_like(bp.ones(2, 2, dtype=bp.int64, device=device))
    assert z.dtype == bp.int64 and z.device is device and z.tolist() == [[0, 0], [0, 0]]
    assert bp.ones_like(z).tolist() == [[1, 1], [1, 1]]
    assert bp.full_like(z, 3).tolist() == [[3, 3], [3, 3]]


def test_arange(device):
    assert bp.arange(5, device=device).tolist() == [0, 1, 2, 3, 4]
    assert bp.arange(5, dtype=bp.int64, device=device).tolist() == [0, 1, 2, 3, 4]
    assert bp.arange(2, 8, 2, device=device).tolist() == [2, 4, 6]
    np.testing.assert_allclose(bp.arange(0, 1, 0.25, device=device).numpy(), [0, .25, .5, .75])
    assert bp.arange(3, 1, device=device).shape == (0,)
    assert bp.arange(5, 0, -2, dtype=bp.int32, device=device).tolist() == [5, 3, 1]


def test_random_is_reproducible_and_the_same_on_every_device(device):
    bp.manual_seed(123)
    a = bp.rand(1000, device=device).numpy()
    bp.manual_seed(123)
    b = bp.rand(1000).numpy()
    np.testing.assert_array_equal(a, b)
    assert 0 <= a.min() and a.max() < 1 and abs(a.mean() - 0.5) < 0.05
    n = bp.randn(20000, device=device).numpy()
    assert abs(n.mean()) < 0.05 and abs(n.std() - 1) < 0.05
    g = bp.normal(3.0, 0.5, (20000,), device=device).numpy()
    assert abs(g.mean() - 3) < 0.05 and abs(g.std() - 0.5) < 0.05


# ---- arithmetic ------------------------------------------------------------------------------

def test_binary_ops_broadcast_like_numpy(device, rng):
    a, b = f32(rng, 3, 1), f32(rng, 1, 4)
    b[b == 0] = 1
    ta, tb = bp.tensor(a, device=device), bp.tensor(b, device=device)
    A, B = a.astype(np.float64), b.astype(np.float64)
    close(ta + tb, A + B)
    close(ta - tb, A - B)
    close(ta * tb, A * B)
    close(ta / tb, A / B)
    close(-ta, -A)
    close(abs(ta), np.abs(A))
    close(ta @ tb, A @ B)
    close(bp.maximum(ta, tb), np.maximum(A, B))
    close(bp.minimum(ta, tb), np.minimum(A, B))


def test_python_numbers_on_either_side(device, rng):
    a = f32(rng, 5)
    a[a == 0] = 0.5
    t, A = bp.tensor(a, device=device), a.astype(np.float64)
    close(t + 2, A + 2)
    close(2 + t, 2 + A)
    close(t - 1.5, A - 1.5)
    close(1.5 - t, 1.5 - A)
    close(t * 3, A * 3)
    close(3 * t, 3 * A)
    close(t / 4, A / 4)
    close(4 / t, 4 / A)
    close(t ** 2, A ** 2)
    close(abs(t) ** 0.5, np.abs(A) ** 0.5)
    close(2 ** t, 2 ** A)
    close(t + np.float32(1), A + 1)
    i = bp.tensor([1, 2, 3], dtype=bp.int64, device=device)
    assert (i * 2 + 1).tolist() == [3, 5, 7] and (i * 2).dtype == bp.int64


def test_math_functions(device, rng):
    a = rng.uniform(0.1, 2, size=7).astype(np.float32)
    t, A = bp.tensor(a, device=device), a.astype(np.float64)
    for name, ref in [("exp", np.exp(A)), ("log", np.log(A)), ("sqrt", np.sqrt(A)),
                      ("tanh", np.tanh(A)), ("sigmoid", 1 / (1 + np.exp(-A))),
                      ("relu", np.maximum(A - 1, 0))]:
        x = t - 1 if name == "relu" else t
        close(getattr(x, name)(), ref)
        close(getattr(bp, name)(x), ref)
    close(t.pow(3), A ** 3)
    close(bp.pow(t, t), A ** A)


def test_comparisons_give_bool_tensors(device, rng):
    a, b = f32(rng, 6), f32(rng, 6)
    b[0] = a[0]
    ta, tb = bp.tensor(a, device=device), bp.tensor(b, device=device)
    for got, ref in [(ta == tb, a == b), (ta != tb, a != b), (ta < tb, a < b),
                     (ta <= tb, a <= b), (ta > tb, a > b), (ta >= tb, a >= b),
                     (ta > 0, a > 0), (ta < 0.5, a < 0.5), (ta == a[1], a == a[1]),
                     (ta >= 0, a >= 0), (ta <= 0, a <= 0)]:
        assert got.dtype == bp.bool
        np.testing.assert_array_equal(got.numpy(), ref)
    w = bp.where(ta > 0, ta, tb)
    np.testing.assert_array_equal(w.numpy(), np.where(a > 0, a, b))
    np.testing.assert_array_equal(bp.where(ta > 0, ta, 0.0).numpy(), np.where(a > 0, a, 0))
    assert (ta == None) is False  # noqa: E711  (not a tensor: identity comparison)


def test_dtype_and_shape_mismatches_are_typed_errors(device):
    a = bp.ones(3, device=device)
    assert (a + bp.ones(3, dtype=bp.int32, device=device)).dtype == bp.float32  # promotion
    with pytest.raises(bp.DTypeError) as e:
        a @ bp.ones(3, dtype=bp.int32, device=device)
    assert isinstance(e.value, TypeError) and "matmul" in str(e.value)
    with pytest.raises(bp.ShapeError) as e:
        a + bp.ones(4, device=device)
    assert isinstance(e.value, ValueError) and "cannot be broadcast" in str(e.value)
    with pytest.raises(bp.ShapeError, match="matmul"):
        bp.ones(2, 3, device=device) @ bp.ones(2, 3, device=device)
    i = bp.ones(3, dtype=bp.int64, device=device)
    with pytest.raises(bp.DTypeError, match="float cannot be stored in place"):
        i += 0.5
    with pytest.raises(TypeError):
        a + "x"


def test_in_place_operators_change_the_memory(device, rng):
    a = f32(rng, 2, 3)
    t = bp.tensor(a, device=device)
    row = t[1]
    ident = id(t)
    t += 1
    t -= bp.tensor([0.5, 0.5, 0.5], device=device)
    t *= 2
    t /= 4
    t *= bp.full((2, 1), 3.0, device=device)
    assert id(t) == ident
    ref = ((a.astype(np.float64) + 1 - 0.5) * 2 / 4) * 3
    close(t, ref)
    close(row, ref[1])
    t.fill_(2).mul_(3).add_(bp.ones(3, device=device), alpha=-1)
    assert t.tolist() == [[5.0] * 3] * 2
    assert t.zero_().tolist() == [[0.0] * 3] * 2
    t.copy_(bp.tensor(a))
    close(t, a.astype(np.float64))


def test_in_place_on_a_tensor_that_requires_grad_is_refused():
    w = bp.ones(3, requires_grad=True)
    with pytest.raises(bp.Error, match="no_grad"):
        w += 1
    with pytest.raises(bp.Error, match="no_grad"):
        w[0] = 5
    with bp.no_grad():
        w += 1
        w[0] = 5
    assert w.tolist() == [5.0, 2.0, 2.0] and w.requires_grad


# ---- indexing --------------------------------------------------------------------------------

KEYS = [1, -1, (0, 2), (-1, -2, 1), slice(1, 3), slice(None, None, 2), (slice(None), 1),
        (..., 1), (1, ...), (None, 1), (slice(None), None, slice(1, 4, 2)), (..., None),
        (0, slice(1, None), slice(None, None, 3)), (slice(5, 1),), (slice(-3, None), -1, 2),
        (slice(None, None, 7), slice(None), slice(2, 3))]


@pytest.mark.parametrize("key", KEYS, ids=repr)
def test_indexing_gives_views_like_numpy(device, rng, key):
    a = f32(rng, 4, 3, 5)
    t = bp.tensor(a, device=device)
    v = t[key]
    ref = a[key]
    assert v.shape == ref.shape
    np.testing.assert_array_equal(v.numpy(), ref)
    if v.numel():
        assert v.shares_storage(t)


def test_assignment_through_indices_writes_the_base(device):
    t = bp.zeros(3, 4, device=device)
    t[1] = 5
    t[:, 2] = bp.tensor([1, 2, 3], device=device)
    t[0, ::2] = bp.tensor([7, 8], device=device)
    t[..., -1] = 9
    t[2, :2] = [4, 5]
    t[2, 2:3] = np.array([6.0])
    ref = np.zeros((3, 4), np.float32)
    ref[1] = 5
    ref[:, 2] = [1, 2, 3]
    ref[0, ::2] = [7, 8]
    ref[..., -1] = 9
    ref[2, :3] = [4, 5, 6]
    np.testing.assert_array_equal(t.numpy(), ref)


def test_bad_indices(device):
    t = bp.zeros(2, 3, device=device)
    with pytest.raises(IndexError, match="out of range"):
        t[2]
    with pytest.raises(IndexError, match="out of range"):
        t[0, -4]
    with pytest.raises(IndexError, match="too many indices"):
        t[0, 0, 0]
    with pytest.raises(IndexError, match="single ellipsis"):
        t[..., ...]
    with pytest.raises(TypeError, match="valid indices"):
        t["a"]
    with pytest.raises(TypeError):
        t[0] = object()
    with pytest.raises(ValueError):
        t[0] = [1, 2]
    with pytest.raises(bp.DTypeError, match="whole number"):
        bp.zeros(2, dtype=bp.int32, device=device)[0] = 0.5


# ---- reductions, matmul, views ---------------------------------------------------------------

@pytest.mark.parametrize("dim", [None, 0, 1, -1, (0, 2), (2, 0, 1)], ids=repr)
@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions(device, rng, dim, keepdim):
    a = f32(rng, 3, 4, 5)
    t, A = bp.tensor(a, device=device), a.astype(np.float64)
    axis = tuple(dim) if isinstance(dim, tuple) else dim
    close(t.sum(dim, keepdim), A.sum(axis=axis, keepdims=keepdim))
    close(t.mean(dim=dim, keepdim=keepdim), A.mean(axis=axis, keepdims=keepdim))
    mx, mn = t.max(dim, keepdim=keepdim), t.min(dim, keepdim=keepdim)
    if isinstance(dim, int):  # torch.return_types.max / min: (values, indices)
        np.testing.assert_array_equal(mx.indices.numpy(), A.argmax(axis=axis, keepdims=keepdim))
        np.testing.assert_array_equal(mn.indices.numpy(), A.argmin(axis=axis, keepdims=keepdim))
        mx, mn = mx.values, mn.values
    close(mx, A.max(axis=axis, keepdims=keepdim))
    close(mn, A.min(axis=axis, keepdims=keepdim))
    ref = np.sqrt((A * A).sum(axis=axis, keepdims=keepdim))
    close(t.norm(dim, keepdim), ref)


def test_norm_and_reduction_errors(device, rng):
    a = f32(rng, 4, 5)
    close(bp.tensor(a, device=device).norm(), np.linalg.norm(a.astype(np.float64)))
    with pytest.raises(bp.ShapeError, match="out of range"):
        bp.tensor(a, device=device).sum(2)
    with pytest.raises(bp.ShapeError, match="repeat"):
        bp.tensor(a, device=device).sum((0, 0))


def test_matmul_shapes(device, rng):
    for sa, sb in [((3, 4), (4, 5)), ((2, 3, 4), (4, 2)), ((4,), (4, 3)), ((2, 1, 3, 4),
                                                                            (5, 4, 2))]:
        a, b = f32(rng, *sa), f32(rng, *sb)
        got = bp.matmul(bp.tensor(a, device=device), bp.tensor(b, device=device))
        close(got, a.astype(np.float64) @ b.astype(np.float64))


def test_views(device, rng):
    a = f32(rng, 2, 3, 4)
    t = bp.tensor(a, device=device)
    for got, ref in [(t.reshape(6, 4), a.reshape(6, 4)), (t.reshape((4, -1)), a.reshape(4, -1)),
                     (t.view(2, 12), a.reshape(2, 12)), (t.transpose(0, 2), a.transpose(2, 1, 0)),
                     (t.permute(1, 2, 0), a.transpose(1, 2, 0)), (t.T, a.T),
                     (t.mT, np.swapaxes(a, -1, -2)), (t[0].t(), a[0].T),
                     (t.unsqueeze(1), a[:, None]), (t[:, :1].squeeze(1), a[:, 0]),
                     (t[:1, :1].squeeze(), a[0, 0]), (t.flatten(), a.ravel()),
                     (t.flatten(1), a.reshape(2, 12)), (t[:, :1].expand(2, 3, -1), a[:, :1]
                                                          .repeat(3, 1)),
                     (t.contiguous(), a)]:
        assert got.shape == ref.shape
        np.testing.assert_array_equal(got.numpy(), ref)
    assert t.contiguous() is t
    assert not t.T.is_contiguous() and t.T.contiguous().is_contiguous()
    with pytest.raises(bp.ShapeError, match="view"):
        t.T.view(24)
    assert bp.stack([t, t], 1).shape == (2, 2, 3, 4)
    np.testing.assert_array_equal(bp.cat([t, t], 2).numpy(), np.concatenate([a, a], 2))


def test_geometry_accessors(device):
    t = bp.zeros(2, 3, 4, dtype=bp.float64, device=device)
    assert t.shape == (2, 3, 4) and t.size() == (2, 3, 4) and t.size(-1) == 4
    assert t.ndim == 3 and t.dim() == 3 and t.numel() == 24 and len(t) == 2
    assert t.stride() == (12, 4, 1) and t.T.stride(0) == 1
    assert t.element_size() == 8 and t.nbytes == 192 and t.itemsize == 8
    assert t[1].storage_offset() == 12
    assert t.is_floating_point() and not bp.zeros(1, dtype=bp.int32).is_floating_point()


# ---- casts, host reads, printing -------------------------------------------------------------

def test_casts_and_to(device):
    t = bp.tensor([1.7, -2.2, 3.0], device=device)
    assert t.to(bp.int32).tolist() == [1, -2, 3]
    assert t.to(bp.float64).dtype == bp.float64
    assert t.to("float16").dtype == bp.float16
    assert t.to(bp.float32) is t
    assert t.long().dtype == bp.int64 and t.double().dtype == bp.float64
    assert t.half().dtype == bp.float16 and t.float() is t
    assert t.bool().tolist() == [True, True, True]
    b = t.bfloat16()
    assert b.dtype == bp.bfloat16
    np.testing.assert_allclose(b.float().numpy(), [1.703125, -2.203125, 3.0])
    both = t.to(bp.device("cpu"), bp.float64)
    assert both.dtype == bp.float64 and both.device is bp.device("cpu")
    assert t.to(t) is t
    assert t.to(device=device, copy=True) is not t
    with pytest.raises(bp.DeviceError, match="sideways"):
        t.to("sideways")


def test_item_and_python_conversions(device):
    assert bp.tensor(2.5, device=device).item() == 2.5
    assert bp.tensor(7, dtype=bp.int64, device=device).item() == 7
    assert isinstance(bp.tensor(7, dtype=bp.int64, device=device).item(), int)
    assert bp.tensor(True, device=device).item() is True
    assert float(bp.tensor([1.5], device=device)) == 1.5
    assert int(bp.tensor([3], dtype=bp.int32, device=device)) == 3
    assert bool(bp.tensor([1.0], device=device)) and not bool(bp.tensor(0.0, device=device))
    assert f"{bp.tensor(0.123456, device=device):.3f}" == "0.123"
    with pytest.raises(bp.ShapeError, match="item"):
        bp.ones(2, device=device).item()
    with pytest.raises(bp.ShapeError, match="ambiguous"):
        bool(bp.ones(2, device=device))
    with pytest.raises(TypeError, match="0-d"):
        list(bp.tensor(1.0, device=device))
    rows = list(bp.tensor([[1, 2], [3, 4]], device=device))
    assert [r.tolist() for r in rows] == [[1, 2], [3, 4]]


def test_numpy_dtypes_and_sharing(device):
    for dt, npdt in [(bp.float32, np.float32), (bp.float64, np.float64),
                     (bp.float16, np.float16), (bp.int32, np.int32), (bp.int64, np.int64),
                     (bp.uint8, np.uint8), (bp.bool, np.bool_)]:
        a = bp.ones(2, 3, dtype=dt, device=device).numpy()
        assert a.dtype == npdt and a.shape == (2, 3) and a.all()
    with pytest.raises(bp.DTypeError, match="bfloat16"):
        bp.ones(2, dtype=bp.bfloat16).numpy()
    t = bp.zeros(2, 3, device=device)
    view = t.T.numpy()
    assert view.shape == (3, 2)
    if device.type == "cpu":  # host memory: numpy() shares it, like torch
        view[0, 1] = 5
        assert t[1, 0].item() == 5
        assert np.asarray(t).base is not None
    np.testing.assert_array_equal(np.asarray(bp.arange(3, device=device)), [0, 1, 2])
    r = np.ones(3) + bp.ones(3)  # NumPy defers to Tensor: a tensor, no silent host copy
    assert isinstance(r, bp.Tensor) and r.dtype == bp.float64 and r.tolist() == [2.0] * 3


def test_repr_like_pytorch():
    assert repr(bp.tensor([1, 2, 3])) == "tensor([1, 2, 3])"
    assert repr(bp.tensor([1.0, 2, 3])) == "tensor([1., 2., 3.])"
    assert repr(bp.tensor(np.arange(3))) == "tensor([0, 1, 2])"
    assert repr(bp.tensor([1, 2], dtype=bp.int32)) == "tensor([1, 2], dtype=backplane.int32)"
    assert repr(bp.tensor([1.5, 2.25], dtype=bp.float64)) == \
        "tensor([1.50, 2.25], dtype=backplane.float64)"
    assert repr(bp.tensor(2.0)) == "tensor(2.)"
    assert repr(bp.tensor([True])) == "tensor([ True])"
    assert repr(bp.zeros(0, 3)) == "tensor([], size=(0, 3))"
    assert repr(bp.ones(2, requires_grad=True)) == "tensor([1., 1.], requires_grad=True)"
    assert repr(bp.tensor([1.0], dtype=bp.bfloat16)) == "tensor([1.], dtype=backplane.bfloat16)"
    assert "..." in repr(bp.zeros(2000))
    assert repr(bp.float16) == "backplane.float16" and bp.int64.itemsize == 8
    assert bp.long is bp.int64 and bp.float is bp.float32 and bp.double is bp.float64
