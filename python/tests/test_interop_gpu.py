"""Exchange with PyTorch and CuPy (where installed): zero-copy checked by pointer, writes seen
on the other side, and stream ordering (Note [DLPack streams]) checked with long work on a
side stream. Runs on the GPU machine (tools/gpu/python.sh); PyTorch's cpu tests run wherever
PyTorch is installed."""
import gc

import numpy as np
import pytest

import backplane as bp
from conftest import GPU_DEVICES

try:
    import torch
except ImportError:
    torch = None
try:
    import cupy
    cupy.cuda.runtime.getDeviceCount()
except Exception:  # not installed, or no driver
    cupy = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
needs_torch_cuda = pytest.mark.skipif(
    torch is None or not GPU_DEVICES or not torch.cuda.is_available(),
    reason="needs PyTorch with CUDA and a cuda device")
needs_cupy = pytest.mark.skipif(cupy is None or not GPU_DEVICES,
                                reason="needs CuPy and a cuda device")


def live():
    """(live exports, live imports). Imported CUDA memory is handed back once the freeing
    stream is idle (at the latest at the next synchronisation), hence the synchronize."""
    gc.collect()
    bp.synchronize()
    return bp._core._dlpack_live()


def torch_devices():
    out = ["cpu"] if torch is not None else []
    if torch is not None and GPU_DEVICES and torch.cuda.is_available():
        out.append("cuda:0")
    return out


@needs_torch
@pytest.mark.parametrize("where", torch_devices())
def test_torch_round_trip_shares_memory(where):
    before = live()
    dev = bp.device(where)
    t = bp.arange(8, device=dev, dtype=bp.float32).reshape(2, 4)
    x = torch.from_dlpack(t)
    assert x.data_ptr() == t.data_ptr() and x.device == torch.device(where)
    assert x.dtype == torch.float32 and tuple(x.shape) == (2, 4)
    x[1, 3] = 100
    torch.cuda.synchronize() if where != "cpu" else None
    assert t[1, 3].item() == 100
    t[0] = -1
    bp.synchronize(dev)  # our write is on our stream; torch reads on its own
    assert x[0].tolist() == [-1, -1, -1, -1]
    y = torch.arange(6, dtype=torch.float64, device=where).reshape(3, 2)
    u = bp.from_dlpack(y)
    assert u.data_ptr() == y.data_ptr() and u.device is dev and u.dtype == bp.float64
    u += 1
    bp.synchronize(dev)
    assert y.tolist() == [[1, 2], [3, 4], [5, 6]]
    v = bp.from_dlpack(y.t())  # a transposed view keeps its strides
    assert v.stride() == (1, 2) and v.tolist() == y.t().tolist()
    for dt, bdt in [(torch.bfloat16, bp.bfloat16), (torch.float16, bp.float16),
                    (torch.int64, bp.int64), (torch.bool, bp.bool), (torch.uint8, bp.uint8)]:
        z = torch.ones(3, dtype=dt, device=where)
        w = bp.from_dlpack(z)
        assert w.dtype == bdt and w.data_ptr() == z.data_ptr()
        assert torch.from_dlpack(w).dtype == dt
    with pytest.raises(bp.DTypeError, match="complex"):
        bp.from_dlpack(torch.ones(2, dtype=torch.complex64, device=where))
    del t, x, y, u, v, z, w
    assert live() == before


@needs_torch
@pytest.mark.parametrize("where", torch_devices())
def test_torch_lifetimes_producer_deleted_first(where):
    before = live()
    dev = bp.device(where)
    base = dev.memory_stats()["allocated"]
    t = bp.arange(1 << 16, device=dev)
    x = torch.from_dlpack(t)
    del t
    gc.collect()
    assert x.sum().item() == (1 << 16) * ((1 << 16) - 1) / 2
    assert dev.memory_stats()["allocated"] >= base + 4 * (1 << 16)
    del x
    gc.collect()
    bp.synchronize(dev)
    assert dev.memory_stats()["allocated"] == base and live() == before
    y = torch.arange(1 << 16, dtype=torch.float32, device=where)
    ptr = y.data_ptr()
    u = bp.from_dlpack(y)
    del y
    gc.collect()
    assert u.data_ptr() == ptr and u.sum().item() == (1 << 16) * ((1 << 16) - 1) / 2
    assert live()[1] == before[1] + 1
    del u
    gc.collect()
    bp.synchronize(dev)
    assert live() == before


def long_torch_work(stream, x, cycles=2_000_000_000):
    """Queues ~1 s of GPU spinning on `stream` (torch.cuda._sleep never blocks the host, unlike
    a loop of matmuls whose set-up may), then writes 1 into x (on that stream)."""
    with torch.cuda.stream(stream):
        torch.cuda._sleep(cycles)
        x.fill_(1)


@needs_torch_cuda
def test_import_orders_after_the_producers_stream():
    side = torch.cuda.Stream()
    x = torch.zeros(1 << 20, device="cuda:0")
    torch.cuda.synchronize()
    long_torch_work(side, x)
    assert not side.query()  # the premise: the producer's work is still running
    with torch.cuda.stream(side):
        # Through torch's C exchange table (torch >= 2.10): its current_work_stream names
        # `side`, and our stream waits for it (an event; Note [DLPack C exchange API]); through
        # __dlpack__(stream=ours) on older torch, which makes our stream wait for `side`.
        t = bp.from_dlpack(x)
    # Had the producer or we synchronised the device instead of ordering streams with an
    # event, `side` would be idle here.
    assert not side.query()
    assert t.sum().item() == 1 << 20  # ran after the long work on our stream


@needs_torch_cuda
def test_export_orders_the_consumers_stream_after_ours():
    dev = GPU_DEVICES[0]
    t = bp.zeros(1 << 20, device=dev)
    a = bp.rand(4096, 4096, device=dev)
    for _ in range(300):
        a = (a @ a) / 4096.0
    t += a[0, :1] * 0 + 1  # the last write comes after ~1 s of work on our stream
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.from_dlpack(t)  # our __dlpack__(stream=side): side waits for our event
        total = x.sum()
    done = torch.cuda.Event()
    done.record(side)
    assert not done.query()  # side is still waiting: we did not synchronise the device
    side.synchronize()  # torch's item() would read on another stream than side's
    assert total.item() == 1 << 20


@needs_torch_cuda
def test_export_free_waits_for_the_consumers_stream():
    """Review F4 (Note [DLPack export frees]): the consumer drops its tensor while its stream
    still has a kernel queued that reads it; our next allocations of the same size must not get
    the block before that kernel ran. Before the fix every element of y was wrong in 4 of 5
    trials on an H100 (14 instead of 2)."""
    dev = GPU_DEVICES[0]
    n = 1 << 24
    for trial in range(5):
        side = torch.cuda.Stream()
        x = bp.full(n, 1.0, device=dev)
        with torch.cuda.stream(side):
            t = torch.from_dlpack(x)  # exported for `side`
            torch.cuda._sleep(2_000_000_000)  # ~1 s of spinning on side before the read
            y = t * 2
        del t, x  # the deleter runs now; side's kernels still have to read the block
        others = [bp.full(n, 7.0, device=dev) for _ in range(4)]
        side.synchronize()
        assert torch.all(y == 2).item(), f"trial {trial}: the block was reused under the reader"
        assert all(o[:4].tolist() == [7.0] * 4 for o in others)


needs_torch_cuda_table = pytest.mark.skipif(
    torch is None or not GPU_DEVICES or not torch.cuda.is_available()
    or not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"),
    reason="needs PyTorch with CUDA and the DLPack C exchange API (2.10 or later)")


def our_work_stream(dev):
    """Our current_work_stream for `dev`, as a torch stream (Note [DLPack C exchange API])."""
    import ctypes
    from test_dlpack_c_api import API
    s = ctypes.c_void_p()
    ordinal = bp.ones(1, device=dev).__dlpack_device__()[1]
    assert API.current_work_stream(2, ordinal, ctypes.byref(s)) == 0
    if not s.value:
        return torch.cuda.default_stream(ordinal)
    return torch.cuda.ExternalStream(s.value, device=f"cuda:{ordinal}")


@needs_torch_cuda_table
def test_c_api_consumer_on_our_work_stream_is_ordered_both_ways():
    """A consumer of our table that runs on current_work_stream's stream (the protocol's rule)
    reads after our pending writes, and its queued reads come before the block's reuse although
    it calls the deleter at once (the free is ordered on that stream)."""
    from test_dlpack_c_api import api_of, export, to_object
    dev = GPU_DEVICES[0]
    torch_api = api_of(torch.Tensor)
    ours = our_work_stream(dev)
    n = 1 << 24
    for trial in range(3):
        a = bp.rand(2048, 2048, device=dev)
        for _ in range(100):
            a = (a @ a) / 2048.0
        x = bp.zeros(n, device=dev) + (a[0, :1] * 0 + 1)  # written after the matmul chain
        with torch.cuda.stream(ours):
            t = to_object(export(x), api=torch_api)  # no synchronisation anywhere
            torch.cuda._sleep(2_000_000_000)  # ~1 s on our stream before torch's read
            y = t * 2
        del t, x  # the deleter runs now, the read is still queued
        gc.collect()
        others = [bp.full(n, 7.0, device=dev) for _ in range(4)]
        ours.synchronize()
        assert torch.all(y == 2).item(), f"trial {trial}: read before our write or after reuse"
        assert all(o[:4].tolist() == [7.0] * 4 for o in others)


@needs_torch_cuda
def test_c_api_current_work_stream_is_our_default_stream():
    dev = GPU_DEVICES[0]
    x = bp.zeros(1 << 20, device=dev)
    ours = our_work_stream(dev)
    with torch.cuda.stream(ours):
        y = torch.from_dlpack(x)  # __dlpack__(stream=ours): the same stream, no event
        torch.cuda._sleep(2_000_000_000)
        y.fill_(3)
    assert not ours.query()  # the premise: the write is still queued
    assert x.sum().item() == 3 * (1 << 20)  # our next op runs after it: the same stream


@needs_torch_cuda
def test_stream_argument_values():
    t = bp.ones(4, device=GPU_DEVICES[0])
    # torch's default stream has the handle 0, which DLPack spells 1 (0 is ambiguous).
    for s in (None, 1, 2, -1, torch.cuda.current_stream().cuda_stream or 1,
              torch.cuda.Stream().cuda_stream):
        cap = t.__dlpack__(stream=s, max_version=(1, 1))
        assert bp.from_dlpack(cap).data_ptr() == t.data_ptr()
    with pytest.raises(BufferError, match="ambiguous"):
        t.__dlpack__(stream=0)
    with pytest.raises(TypeError, match="stream must be None or an integer"):
        t.__dlpack__(stream="s")
    assert t.__dlpack_device__() == (2, torch.cuda.current_device())
    host = bp.from_dlpack(t.__dlpack__(dl_device=(1, 0), max_version=(1, 1)))
    assert host.device.type == "cpu" and host.tolist() == [1, 1, 1, 1]  # copied on request


@needs_cupy
def test_cupy_round_trip_shares_memory():
    before = live()
    dev = GPU_DEVICES[0]
    t = bp.arange(10, device=dev)
    c = cupy.from_dlpack(t)
    assert c.data.ptr == t.data_ptr() and c.shape == (10,)
    c[3] = 30
    cupy.cuda.Device().synchronize()
    assert t[3].item() == 30
    d = cupy.arange(5, dtype=cupy.float64) * 2
    u = bp.from_dlpack(d)
    assert u.data_ptr() == d.data.ptr and u.device.type == "cuda"
    u *= 10
    bp.synchronize(u.device)
    assert d.get().tolist() == [0, 20, 40, 60, 80]
    del t, c, d, u
    assert live() == before


@needs_cupy
def test_cupy_stream_ordering():
    # ~1 s of GPU spinning that never blocks the host (a matmul loop's set-up may).
    spin = cupy.RawKernel(r"""
    extern "C" __global__ void spin(long long cycles) {
        long long start = clock64();
        while (clock64() - start < cycles) {}
    }""", "spin")
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        x = cupy.zeros(1 << 20, dtype=cupy.float32)
        x += 0  # CuPy compiles its kernels on first use, blocking the host: do it beforehand
        spin((1,), (1,), (cupy.int64(0),))
        s.synchronize()
        spin((1,), (1,), (cupy.int64(2_000_000_000),))
        x += 1
        assert not s.done, "the premise: the producer's work is still running"
        t = bp.from_dlpack(x)  # cupy's __dlpack__(stream=ours) orders our stream after s
        busy_after = not s.done
    # CuPy orders our stream after s with an event, so neither side waited on the host.
    assert busy_after
    assert t.sum().item() == 1 << 20
