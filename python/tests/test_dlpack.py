"""DLPack 1.x exchange: zero-copy both ways (checked by pointer and by writes seen on the other
side), versioned and legacy capsules, lifetimes with the producer deleted first, and the bad
cases (a capsule consumed twice, unsupported dtypes and devices, negative strides)."""
import gc
import weakref

import numpy as np
import pytest

import backplane as bp
from conftest import DEVICES

HOST = [d for d in DEVICES if d.type == "cpu"]
NO_ADDRESS = [d for d in DEVICES if d.type == "opencl"]


def live():
    """(live exports, live imports). Imported CUDA memory is handed back once the freeing
    stream is idle (at the latest at the next synchronisation), hence the synchronize."""
    gc.collect()
    bp.synchronize()
    return bp._core._dlpack_live()


def capsule_name(cap):
    return repr(cap).split('"')[1]


@pytest.fixture(autouse=True)
def no_leaks():
    before = live()
    yield
    assert live() == before, "a DLPack export or import was not released"


def test_numpy_reads_and_writes_a_tensor_in_place():
    t = bp.arange(6).reshape(2, 3)  # int64, as torch.arange
    a = np.from_dlpack(t)
    assert a.ctypes.data == t.data_ptr() and a.dtype == np.int64 and a.shape == (2, 3)
    a[1, 2] = 50
    assert t[1, 2].item() == 50
    t[0] = 7
    assert a[0].tolist() == [7, 7, 7]
    assert t.__dlpack_device__() == (1, 0)


def test_tensor_over_numpy_memory_in_place(rng):
    for dt in (np.float32, np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_):
        a = (rng.uniform(0, 5, (3, 4)) > 2) if dt is np.bool_ else \
            rng.uniform(0, 5, (3, 4)).astype(dt)
        t = bp.from_dlpack(a)
        assert t.data_ptr() == a.ctypes.data and t.shape == (3, 4)
        np.testing.assert_array_equal(t.numpy(), a)
    a = np.zeros(4, np.float32)
    t = bp.from_numpy(a)
    t += 1
    assert a.tolist() == [1, 1, 1, 1]
    a[0] = 9
    assert t[0].item() == 9
    assert bp.as_tensor(a).data_ptr() == a.ctypes.data
    assert bp.tensor(a).data_ptr() != a.ctypes.data  # tensor() always copies


def test_strided_views_keep_their_strides():
    t = bp.arange(12, dtype=bp.float32).reshape(3, 4)
    a = np.from_dlpack(t.T)
    assert a.strides == (4, 16) and a.ctypes.data == t.data_ptr()
    np.testing.assert_array_equal(a, np.arange(12, dtype=np.float32).reshape(3, 4).T)
    b = np.from_dlpack(t[1:, ::2])
    np.testing.assert_array_equal(b, [[4, 6], [8, 10]])
    base = np.arange(20, dtype=np.float64).reshape(4, 5)
    v = bp.from_dlpack(base[1:, 1::2])
    assert v.stride() == (5, 2) and v.data_ptr() == base[1:, 1::2].ctypes.data
    np.testing.assert_array_equal(v.numpy(), base[1:, 1::2])
    row = np.arange(3.0)
    e = bp.from_dlpack(np.lib.stride_tricks.as_strided(row, shape=(4, 3), strides=(0, 8)))
    assert e.stride() == (0, 1) and e.tolist() == [[0, 1, 2]] * 4 and e.data_ptr() == \
        row.ctypes.data
    r = bp.from_dlpack(np.broadcast_to(row, (4, 3)))  # read-only: copied
    assert r.stride() == (3, 1) and r.data_ptr() != row.ctypes.data


def test_versioned_and_legacy_capsules():
    t = bp.ones(3)
    legacy = t.__dlpack__()
    assert capsule_name(legacy) == "dltensor"
    versioned = t.__dlpack__(max_version=(1, 0))
    assert capsule_name(versioned) == "dltensor_versioned"
    assert capsule_name(t.__dlpack__(max_version=(0, 8))) == "dltensor"
    a, b = bp.from_dlpack(legacy), bp.from_dlpack(versioned)
    assert capsule_name(legacy) == "used_dltensor"
    assert capsule_name(versioned) == "used_dltensor_versioned"
    assert a.data_ptr() == b.data_ptr() == t.data_ptr()
    del legacy, versioned, a, b  # the unconsumed one above was released by its destructor


def test_a_capsule_can_be_consumed_only_once():
    cap = bp.ones(2).__dlpack__(max_version=(1, 1))
    bp.from_dlpack(cap)
    with pytest.raises(BufferError, match="already consumed"):
        bp.from_dlpack(cap)
    cap = np.ones(2).__dlpack__()
    bp.from_dlpack(cap)
    with pytest.raises(BufferError, match="already consumed"):
        bp.from_dlpack(cap)


def test_lifetime_numpy_producer_deleted_first():
    a = np.arange(1000, dtype=np.float32)
    ref = weakref.ref(a)
    t = bp.from_dlpack(a)
    exports, imports = live()
    del a
    gc.collect()
    assert ref() is not None  # the DLPack capsule's owner keeps the array alive
    assert t.sum().item() == 499500
    del t
    gc.collect()
    assert ref() is None and live()[1] == imports - 1


@pytest.mark.parametrize("dev", HOST, ids=str)
def test_lifetime_backplane_producer_deleted_first(dev):
    before = dev.memory_stats()["allocated"]
    t = bp.arange(1000, device=dev)
    a = np.from_dlpack(t)
    assert live()[0] >= 1
    del t
    gc.collect()
    assert a.sum() == 499500 and dev.memory_stats()["allocated"] >= before + 4000
    del a
    gc.collect()
    assert dev.memory_stats()["allocated"] == before


def test_chained_exchange_keeps_memory_until_the_last_holder():
    a = np.arange(6, dtype=np.float32)
    ref, ptr = weakref.ref(a), a.ctypes.data
    t = bp.from_dlpack(a)
    b = np.from_dlpack(t)  # numpy -> backplane -> numpy, one memory
    del a, t
    gc.collect()
    assert ref() is not None and b.ctypes.data == ptr
    b[0] = 42
    del b
    gc.collect()
    assert ref() is None


def test_unsupported_inputs_give_clear_errors():
    with pytest.raises(bp.DTypeError, match="complex64"):
        bp.from_dlpack(np.ones(3, np.complex64))
    with pytest.raises(bp.DTypeError, match="int16"):
        bp.from_dlpack(np.ones(3, np.int16))
    with pytest.raises(bp.ShapeError, match="negative stride"):
        bp.from_dlpack(np.arange(5.0)[::-1])
    with pytest.raises(TypeError, match="no __dlpack__"):
        bp.from_dlpack([1, 2, 3])

    class FakeOpenCL:
        def __dlpack_device__(self):
            return (4, 0)  # kDLOpenCL

        def __dlpack__(self, **kwargs):
            raise AssertionError("must not be asked for data")

    with pytest.raises(bp.UnsupportedError, match="device type 4"):
        bp.from_dlpack(FakeOpenCL())
    t = bp.ones(2)
    with pytest.raises(BufferError, match="stream must be None"):
        t.__dlpack__(stream=5)
    with pytest.raises(BufferError, match="copy=False"):
        t.__dlpack__(dl_device=(2, 0), copy=False)
    with pytest.raises(BufferError, match="only copy to the host"):
        t.__dlpack__(dl_device=(2, 0))


def test_copy_and_read_only():
    t = bp.arange(4)
    c = bp.from_dlpack(t.__dlpack__(max_version=(1, 1), copy=True))
    assert c.data_ptr() != t.data_ptr() and c.tolist() == [0, 1, 2, 3]
    a = np.arange(4.0)
    assert bp.from_dlpack(a, copy=True).data_ptr() != a.ctypes.data
    a.flags.writeable = False
    r = bp.from_dlpack(a)  # a read-only producer: copied, since tensors are writable
    assert r.data_ptr() != a.ctypes.data and r.tolist() == [0, 1, 2, 3]
    with pytest.raises(BufferError, match="read-only"):
        bp.from_dlpack(a, copy=False)
    g = bp.ones(2, requires_grad=True)
    assert np.from_dlpack(g).ctypes.data == g.data_ptr()


def test_backplane_to_backplane_shares_memory(device):
    if device.type == "opencl":
        pytest.skip("OpenCL memory has no address")
    t = bp.arange(4, device=device)
    u = bp.from_dlpack(t)
    assert u.data_ptr() == t.data_ptr() and u.device is device and u is not t
    u += 1
    assert t.tolist() == [1, 2, 3, 4]


@pytest.mark.skipif(not NO_ADDRESS, reason="no OpenCL device")
@pytest.mark.parametrize("dev", NO_ADDRESS, ids=str)
def test_opencl_tensors_cannot_be_exported(dev):
    t = bp.ones(3, device=dev)
    with pytest.raises(bp.UnsupportedError, match=str(dev)):
        t.__dlpack__()
    with pytest.raises(NotImplementedError):
        t.__dlpack_device__()


def test_bad_arguments_name_what_was_wrong_and_consume_nothing():
    a = np.arange(3.0)
    with pytest.raises(TypeError, match=r"from_dlpack: copy must be True, False or None, "
                                        r"got 'maybe' \(str\)"):
        bp.from_dlpack(a, copy="maybe")
    cap = bp.arange(3).__dlpack__()
    with pytest.raises(TypeError, match=r"copy must be True, False or None, got 1 \(int\)"):
        bp.from_dlpack(cap, copy=1)
    assert capsule_name(cap) == "dltensor", "a refused import must not consume the capsule"
    assert bp.from_dlpack(cap).tolist() == [0, 1, 2]
    t = bp.ones(2)
    with pytest.raises(TypeError, match=r"__dlpack__: copy must be True, False or None"):
        t.__dlpack__(copy="yes")
    with pytest.raises(TypeError, match=r"__dlpack__: dl_device is 'cpu' \(str\); expected a "
                                        r"tuple \(device_type, device_id\) of two integers"):
        t.__dlpack__(dl_device="cpu")
    with pytest.raises(ValueError, match=r"dl_device is \(1, 1099511627776\); DLPack device "
                                         r"types and ids are 32-bit"):
        t.__dlpack__(dl_device=(1, 2**40))
    with pytest.raises(TypeError, match=r"max_version is '1.0' \(str\); expected a tuple "
                                        r"\(major, minor\)"):
        t.__dlpack__(max_version="1.0")

    class BadDevice:
        def __init__(self, dev):
            self.dev = dev

        def __dlpack_device__(self):
            return self.dev

        def __dlpack__(self, **kwargs):
            raise AssertionError("must not be asked for data")

    for bad, shown in [("cpu", r"'cpu' \(str\)"), ((1,), r"\(1,\) \(tuple\)"),
                       ((1, "0"), r"\(1, '0'\) \(tuple\)"), (None, r"None \(NoneType\)")]:
        with pytest.raises(TypeError, match=r"from_dlpack: \S*BadDevice\.__dlpack_device__\(\) "
                                            r"returned " + shown + r"; expected a tuple "
                                            r"\(device_type, device_id\)"):
            bp.from_dlpack(BadDevice(bad))


def test_a_device_string_with_a_lone_surrogate_is_a_value_error():
    for spec, pos in [("\udcff", 0), ("cpu:\udcff", 4)]:
        with pytest.raises(ValueError, match=r"device string '.*\\udcff' is not valid Unicode: "
                                             r"a lone surrogate \(U\+DCFF\) at position "
                                             + str(pos) + r" has no UTF-8 form; a device string "
                                             r"is ASCII, such as 'cpu:0'"):
            bp.device(spec)
    with pytest.raises(ValueError, match=r"device string"):
        bp.ones(2, device="cpu\ud800")
    with pytest.raises(ValueError, match=r"device string"):
        bp.from_dlpack(np.arange(3.0), device="\udcff")
    with pytest.raises(ValueError, match=r"dtype name 'float\\udcff' is not valid Unicode"):
        bp.zeros(2, dtype="float\udcff")
