"""The DLPack 1.3 C exchange API (Note [DLPack C exchange API]): Tensor's
__dlpack_c_exchange_api__ table called as C code would call it (through ctypes), and
from_dlpack consuming the tables of other types (one built here, and PyTorch's where installed):
values, strides, dtypes, flags, versions, lifetimes on both sides and the refusals."""
import ctypes
import gc

import numpy as np
import pytest

import backplane as bp
from conftest import DEVICES

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(
    torch is None or not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"),
    reason="needs PyTorch with the DLPack C exchange API (2.10 or later)")

# ---- the C declarations of dlpack.h 1.3 ---------------------------------------------------------

c_int, c_int32, c_int64, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p, c_char_p = (
    ctypes.c_int, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint8, ctypes.c_uint16,
    ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_char_p)
POINTER = ctypes.POINTER


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32),
                ("dtype", DLDataType), ("shape", POINTER(c_int64)),
                ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion), ("manager_ctx", c_void_p), ("deleter", DELETER),
    ("flags", c_uint64), ("dl_tensor", DLTensor)]
READ_ONLY, IS_COPIED = 1, 2

# The table's functions are called with the GIL held and set a Python error when they return -1:
# PYFUNCTYPE keeps the GIL and raises that error.
SET_ERROR = ctypes.CFUNCTYPE(None, c_void_p, c_char_p, c_char_p)
ALLOCATOR = ctypes.PYFUNCTYPE(c_int, POINTER(DLTensor), POINTER(POINTER(DLManagedTensorVersioned)),
                              c_void_p, SET_ERROR)
FROM_PY = ctypes.PYFUNCTYPE(c_int, ctypes.py_object, POINTER(POINTER(DLManagedTensorVersioned)))
TO_PY = ctypes.PYFUNCTYPE(c_int, POINTER(DLManagedTensorVersioned), POINTER(c_void_p))
DLTENSOR_FROM_PY = ctypes.PYFUNCTYPE(c_int, ctypes.py_object, POINTER(DLTensor))
WORK_STREAM = ctypes.PYFUNCTYPE(c_int, c_int32, c_int32, POINTER(c_void_p))


class DLPackExchangeAPIHeader(ctypes.Structure):
    pass


DLPackExchangeAPIHeader._fields_ = [("version", DLPackVersion),
                                    ("prev_api", POINTER(DLPackExchangeAPIHeader))]


class DLPackExchangeAPI(ctypes.Structure):
    _fields_ = [("header", DLPackExchangeAPIHeader), ("managed_tensor_allocator", ALLOCATOR),
                ("managed_tensor_from_py_object_no_sync", FROM_PY),
                ("managed_tensor_to_py_object_no_sync", TO_PY),
                ("dltensor_from_py_object_no_sync", DLTENSOR_FROM_PY),
                ("current_work_stream", WORK_STREAM)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.argtypes = (ctypes.py_object, c_char_p)
_capsule_pointer.restype = c_void_p
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.argtypes = (c_void_p, c_char_p, c_void_p)
_capsule_new.restype = ctypes.py_object


def api_of(cls):
    """The DLPackExchangeAPI that cls.__dlpack_c_exchange_api__ holds."""
    cap = cls.__dlpack_c_exchange_api__
    return DLPackExchangeAPI.from_address(_capsule_pointer(cap, b"dlpack_exchange_api"))


API = api_of(bp.Tensor)


def export(t, api=API):
    out = POINTER(DLManagedTensorVersioned)()
    assert api.managed_tensor_from_py_object_no_sync(t, ctypes.byref(out)) == 0
    return out


def to_object(m, api=API):
    """api's managed_tensor_to_py_object_no_sync(m): the object, its new reference taken over."""
    out = c_void_p()
    assert api.managed_tensor_to_py_object_no_sync(m, ctypes.byref(out)) == 0
    obj = ctypes.cast(out, ctypes.py_object).value
    ctypes.pythonapi.Py_DecRef(ctypes.py_object(obj))  # the reference the call returned
    return obj


ITEMSIZE = {bp.float32: 4, bp.float64: 8, bp.float16: 2, bp.bfloat16: 2, bp.int32: 4,
            bp.int64: 8, bp.uint8: 1, bp.bool: 1}
DL_TYPE = {bp.float32: (2, 32), bp.float64: (2, 64), bp.float16: (2, 16), bp.bfloat16: (4, 16),
           bp.int32: (0, 32), bp.int64: (0, 64), bp.uint8: (1, 8), bp.bool: (6, 8)}
NP_VIEW = {bp.float32: np.float32, bp.float64: np.float64, bp.float16: np.float16,
           bp.bfloat16: np.uint16, bp.int32: np.int32, bp.int64: np.int64, bp.uint8: np.uint8,
           bp.bool: np.bool_}


def host_values(dl, dtype):
    """The elements a host DLTensor describes, read through its pointer, shape and strides (as
    float64; bfloat16 bits widened exactly to float32 first)."""
    shape = [dl.shape[k] for k in range(dl.ndim)]
    strides = [dl.strides[k] for k in range(dl.ndim)]
    item = ITEMSIZE[dtype]
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if all(shape) else 0
    raw = (ctypes.c_char * max(span * item, 1)).from_address(dl.data + dl.byte_offset)
    a = np.ndarray(shape, NP_VIEW[dtype], buffer=raw, strides=[s * item for s in strides])
    if dtype == bp.bfloat16:
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float64)


def reference(t):
    return t.to(bp.float32).numpy().astype(np.float64) if t.dtype == bp.bfloat16 else \
        t.numpy().astype(np.float64)


def live():
    gc.collect()
    bp.synchronize()
    return bp._core._dlpack_live()


@pytest.fixture(autouse=True)
def no_leaks():
    before = live()
    yield
    assert live() == before, "a DLPack export or import was not released"


def random_tensor(rng, dtype, shape):
    if dtype == bp.bool:
        return bp.tensor(rng.uniform(0, 1, shape) > 0.5)
    if dtype in (bp.int32, bp.int64, bp.uint8):
        return bp.tensor(rng.integers(0, 100, shape)).to(dtype)
    return bp.tensor(rng.uniform(-10, 10, shape)).to(dtype)


def views(t):
    """t, its transpose, a stepped slice and a column: contiguous and strided views."""
    return [t, t.t(), t[::2, 1:], t[:, 2]]


# ---- the producer -------------------------------------------------------------------------------

def test_the_table_is_a_static_dlpack_1_3_capsule():
    cap = bp.Tensor.__dlpack_c_exchange_api__
    assert repr(cap).startswith('<capsule object "dlpack_exchange_api"')
    assert type(bp.ones(2)).__dlpack_c_exchange_api__ is cap
    assert (API.header.version.major, API.header.version.minor) == (1, 3)
    assert not API.header.prev_api
    for name, _ in DLPackExchangeAPI._fields_[1:]:
        assert ctypes.cast(getattr(API, name), c_void_p).value, f"{name} is NULL"
    addr = _capsule_pointer(cap, b"dlpack_exchange_api")
    assert bp._core._dlpack_c_exchange_api_of(bp.Tensor) == addr  # from_dlpack uses it too
    assert bp._core._dlpack_c_exchange_api_of(np.ndarray) == 0


@pytest.mark.parametrize("dtype", list(ITEMSIZE), ids=str)
def test_managed_export_describes_values_strides_and_dtype(rng, dtype):
    for t in views(random_tensor(rng, dtype, (4, 6))):
        m = export(t)
        mt = m.contents
        dl = mt.dl_tensor
        assert (mt.version.major, mt.version.minor) == (1, 3)
        assert mt.flags == 0  # writable, not a copy
        assert (dl.device.device_type, dl.device.device_id) == (1, 0)
        assert dl.ndim == t.dim() and dl.byte_offset == 0
        assert (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes) == (*DL_TYPE[dtype], 1)
        assert tuple(dl.shape[k] for k in range(dl.ndim)) == t.shape
        assert tuple(dl.strides[k] for k in range(dl.ndim)) == t.stride()
        assert dl.data == t.data_ptr()
        np.testing.assert_array_equal(host_values(dl, dtype), reference(t))
        assert bp._core._dlpack_live()[0] >= 1
        mt.deleter(m)


def test_managed_export_of_a_scalar_and_of_an_empty_tensor(rng):
    s = bp.tensor(float(rng.uniform(-5, 5)))
    m = export(s)
    assert m.contents.dl_tensor.ndim == 0
    assert host_values(m.contents.dl_tensor, bp.float32) == s.item()
    m.contents.deleter(m)
    e = bp.zeros(0, 3)
    m = export(e)
    dl = m.contents.dl_tensor
    assert (dl.ndim, dl.shape[0], dl.shape[1]) == (2, 0, 3)
    m.contents.deleter(m)


def test_the_export_keeps_the_memory_after_the_producer_is_deleted(rng):
    values = rng.uniform(-3, 3, 1 << 14).astype(np.float32)
    t = bp.tensor(values)
    dev = t.device
    base = dev.memory_stats()["allocated"]
    m = export(t[1::3])
    del t
    gc.collect()
    assert dev.memory_stats()["allocated"] == base  # the block is still held
    np.testing.assert_array_equal(host_values(m.contents.dl_tensor, bp.float32), values[1::3])
    m.contents.deleter(m)
    gc.collect()
    assert dev.memory_stats()["allocated"] < base  # and let go by the deleter


def test_an_export_holds_the_storage_not_the_autograd_graph(rng):
    w = bp.tensor(rng.uniform(-1, 1, 5).astype(np.float32), requires_grad=True)
    y = w * 2
    m = export(y)
    np.testing.assert_allclose(host_values(m.contents.dl_tensor, bp.float32),
                               reference(w.detach()) * 2, rtol=1e-6)
    m.contents.deleter(m)


@pytest.mark.parametrize("dtype", list(ITEMSIZE), ids=str)
def test_dltensor_export_is_non_owning(rng, dtype):
    before = bp._core._dlpack_live()
    for t in views(random_tensor(rng, dtype, (4, 6))):
        dl = DLTensor()
        assert API.dltensor_from_py_object_no_sync(t, ctypes.byref(dl)) == 0
        assert bp._core._dlpack_live() == before  # nothing to release
        assert dl.data == t.data_ptr() and dl.ndim == t.dim()
        assert tuple(dl.shape[k] for k in range(dl.ndim)) == t.shape
        assert tuple(dl.strides[k] for k in range(dl.ndim)) == t.stride()
        assert (dl.dtype.code, dl.dtype.bits) == DL_TYPE[dtype]
        np.testing.assert_array_equal(host_values(dl, dtype), reference(t))


@pytest.mark.parametrize("dtype", list(ITEMSIZE), ids=str)
def test_round_trip_through_to_py_object_shares_memory(rng, dtype):
    t = random_tensor(rng, dtype, (5, 4))
    for v in views(t):
        u = to_object(export(v))
        assert type(u) is bp.Tensor and u.dtype == dtype and u.device is v.device
        assert u.shape == v.shape and u.stride() == v.stride() and u.data_ptr() == v.data_ptr()
        np.testing.assert_array_equal(reference(u), reference(v))
    if dtype == bp.float32:
        u = to_object(export(t.t()))
        u[0, 1] = 123.5  # writes land in the producer's memory
        assert t[1, 0].item() == 123.5
        del t
        gc.collect()
        assert live()[0] >= 1 and u[0, 1].item() == 123.5  # u keeps the export alive


def foreign_managed(array, flags=0, version=(1, 3), null_strides=False):
    """A DLManagedTensorVersioned over a NumPy array, made as another framework would: its
    deleter counts its calls (the ctypes objects stay referenced by the returned holder).
    null_strides: strides NULL, which DLPack reads as row-major (the array must be C-contiguous)."""
    holder = {"deleted": 0, "array": array}
    shape = (c_int64 * array.ndim)(*array.shape)
    strides = (c_int64 * array.ndim)(*[s // array.itemsize for s in array.strides])
    code = {np.dtype(np.float32): (2, 32), np.dtype(np.int64): (0, 64),
            np.dtype(np.complex64): (5, 64)}[array.dtype]

    def deleter(_):
        holder["deleted"] += 1

    holder["deleter"] = DELETER(deleter)
    m = DLManagedTensorVersioned(
        DLPackVersion(*version), None, holder["deleter"], flags,
        DLTensor(array.ctypes.data, DLDevice(1, 0), array.ndim, DLDataType(*code, 1), shape,
                 None if null_strides else strides, 0))
    holder.update(m=m, shape=shape, strides=strides)
    return ctypes.pointer(m), holder


def test_to_py_object_of_foreign_memory_zero_copy_then_the_deleter_once(rng):
    a = rng.uniform(-1, 1, (3, 8)).astype(np.float32)[:, ::2]
    m, h = foreign_managed(a)
    u = to_object(m)
    assert u.data_ptr() == a.ctypes.data and u.stride() == (8, 2)
    np.testing.assert_array_equal(u.numpy(), a)
    u += 1  # writable: the producer sees it
    np.testing.assert_allclose(a, u.numpy())
    assert h["deleted"] == 0
    del u
    gc.collect()
    assert h["deleted"] == 1


def test_imports_one_after_another_keep_their_own_shape_and_strides(rng):
    # An import reads the shape and strides into reused per-thread vectors: each import must
    # see only its own, including NULL strides (row-major) after a strided one and a rank
    # change either way.
    arrays = [rng.uniform(-1, 1, (4, 6, 5)).astype(np.float32)[::2, :, 1::2],
              rng.uniform(-1, 1, (7, 3)).astype(np.float32),
              rng.uniform(-1, 1, (9,)).astype(np.float32)[::3],
              rng.uniform(-1, 1, (2, 3, 4, 5)).astype(np.float32)]
    null = [False, True, False, True]
    for _ in range(2):
        kept = []
        for a, n in zip(arrays, null):
            m, h = foreign_managed(a, null_strides=n)
            u = to_object(m)
            assert u.shape == a.shape
            assert u.stride() == tuple(s // a.itemsize for s in a.strides)
            np.testing.assert_array_equal(u.numpy(), a)
            kept.append((u, h))
        del u
        for _, h in kept:
            assert h["deleted"] == 0
        kept.clear()
        gc.collect()


def test_the_benchmark_loop_imports_and_releases_every_tensor(rng):
    # bench/python/dlpack_roundtrip.py's "import" rows: from_dlpack's C++ path in a loop; the
    # autouse fixture checks that every import and export was released.
    t = random_tensor(rng, bp.float32, (8, 16))
    ns = bp._core._dlpack_c_exchange_ns(t.t(), None, 200, "import")
    assert 0 < ns < 1e8
    with pytest.raises(ValueError, match="expected 'managed', 'dltensor', 'stream', 'import'"):
        bp._core._dlpack_c_exchange_ns(t, None, 1, "imports")


def test_to_py_object_copies_a_read_only_tensor(rng):
    a = rng.uniform(-1, 1, (4, 3)).astype(np.float32)
    m, h = foreign_managed(a, flags=READ_ONLY | IS_COPIED)
    u = to_object(m)
    assert u.data_ptr() != a.ctypes.data  # Backplane tensors are writable: a copy
    np.testing.assert_array_equal(u.numpy(), a)
    u += 1
    assert not np.array_equal(u.numpy(), a)
    del u
    gc.collect()
    assert h["deleted"] == 1


def test_to_py_object_refusals_call_the_deleter():
    a = np.ones(3, np.float32)
    m, h = foreign_managed(a, version=(2, 0))
    with pytest.raises(BufferError, match="DLPack 2.0.*major version 1"):
        to_object(m)
    assert h["deleted"] == 1  # the ownership was handed over: the deleter ran at once
    m, h = foreign_managed(np.ones(3, np.complex64))
    with pytest.raises(bp.DTypeError, match="unsupported dtype complex64"):
        to_object(m)
    assert h["deleted"] == 1
    with pytest.raises(ValueError, match="tensor is NULL"):
        API.managed_tensor_to_py_object_no_sync(None, ctypes.byref(c_void_p()))


def test_from_py_object_refuses_other_types():
    out = POINTER(DLManagedTensorVersioned)()
    with pytest.raises(TypeError, match="expected a backplane.Tensor, got numpy.ndarray"):
        API.managed_tensor_from_py_object_no_sync(np.ones(2), ctypes.byref(out))
    with pytest.raises(TypeError, match="dltensor_from_py_object_no_sync: expected a backplane"):
        API.dltensor_from_py_object_no_sync([1.0], ctypes.byref(DLTensor()))
    assert not out


@pytest.mark.skipif(not [d for d in DEVICES if d.type == "opencl"], reason="no OpenCL device")
def test_opencl_tensors_raise_buffer_error():
    t = bp.ones(3, device=[d for d in DEVICES if d.type == "opencl"][0])
    with pytest.raises(BufferError, match="opencl"):
        export(t)
    with pytest.raises(BufferError, match="opencl"):
        API.dltensor_from_py_object_no_sync(t, ctypes.byref(DLTensor()))


class Errors:
    def __init__(self):
        self.got = []
        self.fn = SET_ERROR(lambda ctx, kind, msg: self.got.append((kind.decode(), msg.decode())))


def allocate(shape, code_bits, device=(1, 0)):
    dims = (c_int64 * len(shape))(*shape)
    proto = DLTensor(None, DLDevice(*device), len(shape), DLDataType(*code_bits, 1), dims, None, 0)
    out = POINTER(DLManagedTensorVersioned)()
    errors = Errors()
    rc = API.managed_tensor_allocator(ctypes.byref(proto), ctypes.byref(out), None, errors.fn)
    return rc, out, errors.got


@pytest.mark.parametrize("dtype", list(ITEMSIZE), ids=str)
def test_allocator_makes_a_contiguous_writable_tensor(rng, dtype):
    rc, m, errors = allocate((3, 5, 2), DL_TYPE[dtype])
    assert rc == 0 and not errors
    dl = m.contents.dl_tensor
    assert (dl.device.device_type, dl.ndim, dl.dtype.code, dl.dtype.bits) == \
        (1, 3, *DL_TYPE[dtype])
    assert [dl.strides[k] for k in range(3)] == [10, 2, 1] and m.contents.flags == 0
    u = to_object(m)
    assert u.shape == (3, 5, 2) and u.dtype == dtype and u.is_contiguous()
    v = random_tensor(rng, dtype, (3, 5, 2))
    u.copy_(v)
    np.testing.assert_array_equal(reference(u), reference(v))


def test_allocator_errors_go_through_set_error():
    before = live()
    rc, m, errors = allocate((2,), (5, 64))
    assert rc == -1 and not m and errors[0][0] == "TypeError"
    assert "managed_tensor_allocator: unsupported dtype complex64" in errors[0][1]
    rc, m, errors = allocate((2, -1), (2, 32))
    assert rc == -1 and errors[0][0] == "ValueError" and "negative size -1" in errors[0][1]
    rc, m, errors = allocate((2,), (2, 32), device=(4, 0))
    assert rc == -1 and errors[0][0] == "ValueError" and "DLPack device type 4" in errors[0][1]
    # 2^60 bytes: beyond any machine's address space, so refused even where the kernel
    # overcommits (8 TiB was granted on the GPU machine's host).
    rc, m, errors = allocate((1 << 27, 1 << 30), (2, 64))
    assert rc == -1 and errors[0][0] == "MemoryError", errors
    assert live() == before


def test_current_work_stream():
    s = c_void_p(12345)
    assert API.current_work_stream(1, 0, ctypes.byref(s)) == 0 and s.value is None
    if not [d for d in DEVICES if d.type == "cuda"]:
        with pytest.raises(bp.DeviceError, match="CUDA device 0"):
            API.current_work_stream(2, 0, ctypes.byref(s))


# ---- the consumer -------------------------------------------------------------------------------

class Producer:
    """An array type whose __dlpack_c_exchange_api__ table is built here (Python functions
    behind C pointers): it exports a NumPy array, counts the calls and refuses __dlpack__, so
    from_dlpack can only have used the table."""

    def __init__(self, array, flags=0):
        self.array, self.flags, self.handed = array, flags, []

    def __dlpack__(self, **kwargs):
        raise AssertionError("from_dlpack used __dlpack__ although the type has a table")

    def __dlpack_device__(self):
        return (1, 0)


CALLS = {"from_py": 0, "stream": 0}
HANDED = []  # every managed tensor a Producer handed out, kept until the end of the session


def _producer_from_py(obj, out):
    CALLS["from_py"] += 1
    m, holder = foreign_managed(obj.array, flags=obj.flags)
    obj.handed.append(holder)
    HANDED.append(holder)
    out[0] = m
    return 0


def _producer_stream(device_type, device_id, out):
    CALLS["stream"] += 1
    out[0] = None
    return 0


def _refuse_allocate(*_):
    return -1


def _refuse_to_py(*_):
    return -1


def _refuse_dltensor(*_):
    return -1


def make_table(major, prev=None):
    table = DLPackExchangeAPI(
        DLPackExchangeAPIHeader(DLPackVersion(major, 0),
                                ctypes.cast(ctypes.pointer(prev), POINTER(DLPackExchangeAPIHeader))
                                if prev is not None else None),
        ALLOCATOR(_refuse_allocate), FROM_PY(_producer_from_py), TO_PY(_refuse_to_py),
        DLTENSOR_FROM_PY(_refuse_dltensor), WORK_STREAM(_producer_stream))
    return table


TABLE_1 = make_table(1)
TABLE_2_THEN_1 = make_table(2, prev=TABLE_1)
TABLE_2 = make_table(2)
Producer.__dlpack_c_exchange_api__ = _capsule_new(ctypes.addressof(TABLE_1),
                                                  b"dlpack_exchange_api", None)


class ChainedProducer(Producer):
    __dlpack_c_exchange_api__ = _capsule_new(ctypes.addressof(TABLE_2_THEN_1),
                                             b"dlpack_exchange_api", None)


class NewerProducer(Producer):
    """A table of a major version Backplane does not read, without an older one: __dlpack__."""
    __dlpack_c_exchange_api__ = _capsule_new(ctypes.addressof(TABLE_2), b"dlpack_exchange_api",
                                             None)

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)


def test_from_dlpack_consumes_the_producers_table(rng):
    a = rng.uniform(-2, 2, (6, 4)).astype(np.float32)
    before = dict(CALLS)
    p = Producer(a)
    u = bp.from_dlpack(p)
    assert CALLS["from_py"] == before["from_py"] + 1
    assert CALLS["stream"] == before["stream"]  # host memory: no stream to order after
    assert u.data_ptr() == a.ctypes.data
    np.testing.assert_array_equal(u.numpy(), a)
    u[0, 0] = 77.0
    assert a[0, 0] == 77.0
    del u
    gc.collect()
    assert [h["deleted"] for h in p.handed] == [1]
    w = bp.from_dlpack(Producer(a[:, 1::2]), copy=True)  # copy=True still goes through it
    assert w.data_ptr() != a.ctypes.data and CALLS["from_py"] == before["from_py"] + 2
    np.testing.assert_array_equal(w.numpy(), a[:, 1::2])


def test_from_dlpack_of_a_read_only_producer_copies_or_refuses(rng):
    a = rng.uniform(-2, 2, 5).astype(np.float32)
    p = Producer(a, flags=READ_ONLY)
    u = bp.from_dlpack(p)
    assert u.data_ptr() != a.ctypes.data
    np.testing.assert_array_equal(u.numpy(), a)
    q = Producer(a, flags=READ_ONLY)
    with pytest.raises(BufferError, match="read-only and copy=False"):
        bp.from_dlpack(q, copy=False)
    gc.collect()
    assert [h["deleted"] for h in p.handed + q.handed] == [1, 1]


def test_from_dlpack_walks_the_version_chain_and_falls_back_to_dunder(rng):
    a = rng.uniform(-2, 2, 3).astype(np.float32)
    n = CALLS["from_py"]
    assert bp._core._dlpack_c_exchange_api_of(ChainedProducer) == ctypes.addressof(TABLE_1)
    np.testing.assert_array_equal(bp.from_dlpack(ChainedProducer(a)).numpy(), a)
    assert CALLS["from_py"] == n + 1
    assert bp._core._dlpack_c_exchange_api_of(NewerProducer) == 0
    np.testing.assert_array_equal(bp.from_dlpack(NewerProducer(a)).numpy(), a)
    assert CALLS["from_py"] == n + 1  # through __dlpack__


def test_the_table_cache_keeps_no_type_alive():
    import weakref

    class Temporary:
        __dlpack_c_exchange_api__ = bp.Tensor.__dlpack_c_exchange_api__

    assert bp._core._dlpack_c_exchange_api_of(Temporary) == ctypes.addressof(API)
    gone = weakref.ref(Temporary)
    del Temporary
    gc.collect()
    assert gone() is None  # and its cache entry went with it


def test_from_dlpack_of_our_own_tensor_goes_through_our_table(rng):
    t = random_tensor(rng, bp.float64, (3, 4)).t()
    u = bp.from_dlpack(t)
    assert u.data_ptr() == t.data_ptr() and u.stride() == t.stride()
    np.testing.assert_array_equal(u.numpy(), t.numpy())
    p = bp.nn.Linear(3, 2).weight  # a Parameter, a Python subclass: the same table
    assert type(p).__dlpack_c_exchange_api__ is bp.Tensor.__dlpack_c_exchange_api__
    v = to_object(export(p))
    assert v.data_ptr() == p.data_ptr() and not v.requires_grad
    np.testing.assert_array_equal(v.numpy(), p.detach().numpy())


# ---- PyTorch ------------------------------------------------------------------------------------

TORCH_TYPES = [] if torch is None else [
    (torch.float32, bp.float32), (torch.float64, bp.float64), (torch.float16, bp.float16),
    (torch.bfloat16, bp.bfloat16), (torch.int32, bp.int32), (torch.int64, bp.int64),
    (torch.uint8, bp.uint8), (torch.bool, bp.bool)]


@needs_torch
def test_torch_has_a_table_and_from_dlpack_uses_it(rng):
    assert bp._core._dlpack_c_exchange_api_of(torch.Tensor) != 0
    for tdt, bdt in TORCH_TYPES:
        x = torch.from_numpy(rng.uniform(-4, 4, (5, 6))).to(tdt)
        for v in (x, x.t(), x[::2, 1::3]):
            u = bp.from_dlpack(v)
            assert u.dtype == bdt and u.data_ptr() == v.data_ptr()
            assert u.shape == tuple(v.shape) and u.stride() == v.stride()
            np.testing.assert_array_equal(reference(u), v.to(torch.float64).numpy())
    x = torch.zeros(4)
    u = bp.from_dlpack(x)
    u += 2.5
    assert x.tolist() == [2.5] * 4


@needs_torch
@pytest.mark.skipif(torch is None or not hasattr(torch.utils.dlpack, "ReadOnlyTensorWrapper"),
                    reason="needs torch.utils.dlpack.ReadOnlyTensorWrapper")
def test_torch_read_only_export_is_copied():
    x = torch.arange(6, dtype=torch.float32)
    ro = torch.utils.dlpack.ReadOnlyTensorWrapper(x)
    u = bp.from_dlpack(ro)
    assert u.data_ptr() != x.data_ptr() and u.tolist() == x.tolist()
    with pytest.raises(BufferError, match="read-only"):
        bp.from_dlpack(ro, copy=False)


@needs_torch
def test_exchange_with_torch_through_both_tables_keeps_memory_alive(rng):
    torch_api = api_of(torch.Tensor)
    values = rng.uniform(-1, 1, (64, 16)).astype(np.float32)
    t = bp.tensor(values)
    x = to_object(export(t[:, ::2]), api=torch_api)  # ours exported, torch imports
    assert isinstance(x, torch.Tensor) and x.data_ptr() == t.data_ptr()
    assert x.stride() == (16, 2)
    del t
    gc.collect()
    assert live()[0] >= 1
    np.testing.assert_array_equal(x.numpy(), values[:, ::2])  # torch keeps our block
    y = torch.from_numpy(values.copy())
    u = to_object(export(y[3:], api=torch_api))  # torch exported, we import
    assert type(u) is bp.Tensor and u.data_ptr() == y[3:].data_ptr()
    del y
    gc.collect()
    np.testing.assert_array_equal(u.numpy(), values[3:])
    del x, u


@needs_torch
def test_torch_tensor_made_by_our_allocator():
    torch_api = api_of(torch.Tensor)
    rc, m, errors = allocate((4, 2), (2, 32))
    assert rc == 0
    x = to_object(m, api=torch_api)
    x.copy_(torch.arange(8, dtype=torch.float32).reshape(4, 2))
    assert x.sum().item() == 28
