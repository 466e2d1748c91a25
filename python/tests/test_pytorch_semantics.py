"""Issue 32: PyTorch's semantics where a PyTorch user would otherwise be silently misled. Each
test of a silent-wrong-result case failed before the change it names."""
import numpy as np
import pytest

import backplane as bp
from backplane import nn
from conftest import DEVICES, tol

NON_HOST = [d for d in DEVICES if d.type != "cpu"]


def f32(rng, *shape):
    return rng.uniform(-2, 2, size=shape).astype(np.float32)


# ---- an optimiser built before Module.to keeps training the model --------------------------

@pytest.mark.parametrize("dev", DEVICES, ids=str)
def test_optimiser_built_before_to_updates_the_weights(dev, rng):
    """Before: to() replaced the parameters, the optimiser kept the old ones, and 5 steps left
    the model's weights unchanged without a word."""
    net = nn.Linear(4, 3)
    w, b = net.weight, net.bias
    opt = bp.optim.SGD(net.parameters(), lr=0.1)
    net.to(dev)
    assert net.weight is w and net.bias is b and w.device is dev and w.requires_grad
    x = f32(rng, 5, 4)
    w0, b0 = w.numpy().astype(np.float64), b.numpy().astype(np.float64)
    for _ in range(5):
        opt.zero_grad()
        net(bp.tensor(x, device=dev)).sum().backward()
        opt.step()
    # d(sum y)/dW = column sums of x for every output; d/db = the batch size.
    w_ref = w0 - 5 * 0.1 * np.tile(x.astype(np.float64).sum(0), (3, 1))
    b_ref = b0 - 5 * 0.1 * 5
    rtol, atol = tol(bp.float32)
    np.testing.assert_allclose(net.weight.numpy(), w_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(net.bias.numpy(), b_ref, rtol=rtol, atol=1e-5)


@pytest.mark.parametrize("dev", DEVICES, ids=str)
def test_module_to_moves_gradients_and_keeps_parameter_objects(dev, rng):
    net = nn.Sequential(nn.Linear(3, 2), nn.ReLU(), nn.Linear(2, 1))
    params = list(net.parameters())
    net(bp.tensor(f32(rng, 4, 3))).sum().backward()
    grads = [p.grad.numpy().copy() for p in params]
    net.to(dev)
    for p, g in zip(net.parameters(), grads):
        assert p.device is dev and p.grad.device is dev
        np.testing.assert_array_equal(p.grad.numpy(), g)
    assert [id(p) for p in net.parameters()] == [id(p) for p in params]
    if dev.properties()["supports_f64"]:
        net.double()
        assert all(p.dtype == bp.float64 for p in params)


# ---- NumPy operands on either side ----------------------------------------------------------

@pytest.mark.parametrize("dev", DEVICES, ids=str)
def test_numpy_operands_on_either_side_give_tensors(dev, rng):
    """Before: tensor + ndarray was a NumPy float64 array (a silent host copy) and
    ndarray + tensor raised."""
    a, n = f32(rng, 2, 3), f32(rng, 2, 3)
    t = bp.tensor(a, device=dev)
    for got, ref in [(t + n, a + n), (n + t, n + a), (n - t, n - a), (t * n, a * n),
                     (n / t, n / a), (n * t, n * a)]:
        assert isinstance(got, bp.Tensor) and got.device is dev and got.dtype == bp.float32
        np.testing.assert_allclose(got.numpy(), ref, rtol=2e-6, atol=1e-6)
    r = n[0] @ t.T
    assert isinstance(r, bp.Tensor)
    np.testing.assert_allclose(r.numpy(), n[0] @ a.T, rtol=1e-5, atol=1e-5)
    if dev.properties()["supports_f64"]:
        d = t + np.ones(3)  # a float64 array promotes like a float64 tensor
        assert d.dtype == bp.float64 and d.device is dev
    cmp = n < t
    assert isinstance(cmp, bp.Tensor) and cmp.dtype == bp.bool
    np.testing.assert_array_equal(cmp.numpy(), n < a)
    assert isinstance(np.float32(2) * t, bp.Tensor)
    with pytest.raises(TypeError):
        np.exp(t)  # ufuncs are deferred to the tensor, which has none: use t.exp()


def test_sum_takes_numpy_axis_and_keepdims(rng):
    """Before: m.sum(axis=0) dumped nanobind's signature."""
    a = f32(rng, 3, 4)
    m = bp.tensor(a)
    np.testing.assert_allclose(m.sum(axis=0).numpy(), a.sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m.sum(axis=1, keepdims=True).numpy(), a.sum(1, keepdims=True),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m.mean(axis=(0, 1)).item(), a.mean(dtype=np.float64), rtol=1e-5)
    np.testing.assert_array_equal(m.max(axis=1).values.numpy(), a.max(1))
    with pytest.raises(TypeError, match="dim or axis"):
        m.sum(0, axis=0)


# ---- integer data and type promotion --------------------------------------------------------

def test_integer_literals_and_arange_are_int64():
    """Before: bp.tensor([1, 2, 3]) and bp.arange(3) were float32."""
    assert bp.tensor([1, 2, 3]).dtype == bp.int64
    assert bp.tensor(3).dtype == bp.int64 and bp.tensor(3).item() == 3
    assert bp.arange(3).dtype == bp.int64 and bp.arange(3).tolist() == [0, 1, 2]
    assert bp.arange(1, 7, 2).tolist() == [1, 3, 5]
    assert bp.arange(0, 1, 0.25).dtype == bp.float32
    assert bp.tensor([1.0, 2]).dtype == bp.float32
    assert bp.tensor([True, False]).dtype == bp.bool
    assert bp.full((2,), 7).dtype == bp.int64 and bp.full((2,), 0.5).dtype == bp.float32
    assert repr(bp.tensor([1, 2, 3])) == "tensor([1, 2, 3])"


@pytest.mark.parametrize("dev", DEVICES, ids=str)
def test_type_promotion_follows_pytorch(dev, rng):
    """Before: int + float tensors refused to add and exp of an int tensor said 'cast first'."""
    iv = rng.integers(-50, 50, size=6)
    fv = f32(rng, 6)
    i = bp.tensor(iv, device=dev)
    f = bp.tensor(fv, device=dev)
    s = i + f
    assert s.dtype == bp.float32
    np.testing.assert_allclose(s.numpy(), iv + fv.astype(np.float64), rtol=2e-6, atol=1e-5)
    q = i / bp.tensor(np.where(iv == 0, 1, iv) * 2, device=dev)
    assert q.dtype == bp.float32
    np.testing.assert_allclose(q.numpy(), iv / (np.where(iv == 0, 1, iv) * 2.0), rtol=1e-6)
    h = i / 4
    assert h.dtype == bp.float32
    np.testing.assert_allclose(h.numpy(), iv / 4.0, rtol=1e-6)
    e = bp.tensor([0, 1, 2], device=dev).exp()
    assert e.dtype == bp.float32
    np.testing.assert_allclose(e.numpy(), np.exp([0, 1, 2]), rtol=1e-6)
    assert bp.tensor([4, 9], device=dev).sqrt().tolist() == [2.0, 3.0]
    half = i + 0.5  # a Python float with an int tensor gives float32
    assert half.dtype == bp.float32
    np.testing.assert_allclose(half.numpy(), iv + 0.5)
    assert (i * 2).dtype == bp.int64 and (i * 2).tolist() == (iv * 2).tolist()
    assert (i ** 2).dtype == bp.int64 and (i ** 2).tolist() == (iv ** 2).tolist()
    m = i > 0
    assert (m + 1).dtype == bp.int64 and (m * 1.5).dtype == bp.float32
    assert (m.sum()).dtype == bp.int64 and m.sum().item() == int((iv > 0).sum())
    np.testing.assert_array_equal((i < f).numpy(), iv < fv)
    np.testing.assert_array_equal((i == 3.5).numpy(), iv == 3.5)
    with pytest.raises(bp.DTypeError, match="cannot be stored in place"):
        i += f
    with pytest.raises(bp.DTypeError, match="float cannot be stored in place"):
        i += 0.5
    g = bp.tensor(fv, device=dev)
    g += i
    np.testing.assert_allclose(g.numpy(), fv + iv, rtol=2e-6, atol=1e-5)


def test_accuracy_idiom_counts_matches(rng):
    logits = bp.tensor(f32(rng, 8, 5))
    y = bp.tensor(rng.integers(0, 5, size=8))
    pred = logits.max(1)[1]
    assert pred.dtype == bp.int64
    correct = (pred == y).sum()
    assert correct.dtype == bp.int64
    assert correct.item() == int((logits.numpy().argmax(1) == y.numpy()).sum())
    assert float(correct) / len(y) == correct.item() / 8


# ---- sync-debug -------------------------------------------------------------------------------

# (what to compute on the device, how to read it): the reads see only finished work.
READS = {
    "item()": (lambda t: t.sum(), lambda v: v.item()),
    "float()": (lambda t: t.sum(), float),
    "bool()": (lambda t: t.sum() > 0, bool),
    "int()": (lambda t: t.sum(), int),
    "tolist()": (lambda t: t, lambda v: v.tolist()),
    "numpy()": (lambda t: t, lambda v: v.numpy()),
    "__array__()": (lambda t: t, np.asarray),
    "cpu()": (lambda t: t, lambda v: v.cpu()),
    "repr()": (lambda t: t, repr),
    "str()": (lambda t: t, str),
}


@pytest.mark.skipif(not NON_HOST, reason="needs a device without host memory (cuda, opencl)")
@pytest.mark.parametrize("dev", NON_HOST, ids=str)
@pytest.mark.parametrize("call", sorted(READS))
def test_sync_debug_reports_every_implicit_read_by_its_name(dev, call, rng):
    """Before: tolist, numpy, cpu and repr read device values unreported, item() was named
    to_vector(), and the report still fired after bp.synchronize()."""
    prepare, read = READS[call]
    t = bp.tensor(f32(rng, 4), device=dev)
    bp.set_sync_debug("error")
    try:
        v = prepare(t * 2)  # queued work
        with pytest.raises(bp.SyncError) as e:
            read(v)
        assert f"on {dev} in {call}" in str(e.value)
        v = prepare(t * 3)
        bp.synchronize()
        read(v)  # covered by the explicit synchronisation: quiet
        v = prepare(t + 1)
        dev.synchronize()
        read(v)
        v = prepare(t - 1)  # new work: reported again
        with pytest.raises(bp.SyncError):
            read(v)
    finally:
        bp.set_sync_debug("off")


# ---- d2l aliases and devices that are missing ------------------------------------------------

def test_d2l_aliases(rng):
    net = nn.Sequential(nn.Linear(2, 1))
    assert net[0].weight.data.device is bp.device("cpu")
    assert not net[0].weight.data.requires_grad
    assert net[0].weight.data.shares_storage(net[0].weight)
    x = bp.tensor(f32(rng, 3))
    assert x.ctx is x.device
    cpu = bp.device("cpu")
    assert x.as_in_ctx(cpu) is x
    y = x.copyto(cpu)
    assert y is not x and y.tolist() == x.tolist()
    z = bp.zeros(3)
    assert x.copyto(z) is z and z.tolist() == x.tolist()
    p = net[0].bias
    p.data = bp.ones(1)
    assert net[0].bias is p and p.tolist() == [1.0] and p.requires_grad


@pytest.mark.skipif(bp.num_gpus() > 0, reason="checks a machine without CUDA")
def test_absent_cuda_is_a_handle_whose_use_says_why():
    """Before: bp.device('cuda') raised, and t.to('cuda') said "'cuda' is neither a device nor
    a dtype"."""
    reason = bp.is_available("cuda").reason
    d = bp.device("cuda")
    assert str(d) == "cuda:0" and d.type == "cuda" and d.index == 0
    assert repr(d) == "device(type='cuda', index=0)"
    with pytest.raises(bp.DeviceError) as e:
        bp.zeros(2, device=d)
    assert "cuda" in str(e.value) and "cuda" in d.reason
    assert reason  # is_available says why there is no CUDA
    with pytest.raises(bp.DeviceError) as e:
        bp.ones(2).to("cuda")
    assert "neither" not in str(e.value) and "cuda" in str(e.value)
    with pytest.raises(bp.DeviceError, match="cuda"):
        nn.Linear(2, 1).to("cuda")
    with pytest.raises(bp.DeviceError):
        d.properties()
    with pytest.raises(bp.DeviceError, match="CUDA:0"):
        bp.device("CUDA:0")  # malformed: at once


# ---- the first hour's methods ----------------------------------------------------------------

@pytest.mark.parametrize("dev", DEVICES, ids=str)
def test_split_chunk_masked_fill(dev, rng):
    a = f32(rng, 7, 3)
    t = bp.tensor(a, device=dev)
    parts = t.split(3)
    assert [p.shape for p in parts] == [(3, 3), (3, 3), (1, 3)]
    assert all(p.shares_storage(t) for p in parts)
    np.testing.assert_array_equal(parts[2].numpy(), a[6:])
    parts = t.split([2, 5])
    np.testing.assert_array_equal(parts[1].numpy(), a[2:])
    chunks = t.chunk(3, dim=1)
    assert len(chunks) == 3 and chunks[1].shape == (7, 1)
    with pytest.raises(bp.ShapeError, match="do not add up"):
        t.split([2, 2])
    m = t > 0
    np.testing.assert_array_equal(t.masked_fill(m, 0.0).numpy(), np.where(a > 0, 0, a))
    np.testing.assert_allclose(t.softmax(1).numpy().sum(1), np.ones(7), rtol=1e-5)
    np.testing.assert_array_equal(t.clamp(-1, 1).numpy(), np.clip(a, -1, 1))
    np.testing.assert_allclose(t.std().item(), a.astype(np.float64).std(ddof=1), rtol=1e-5)


@pytest.mark.parametrize("dev", DEVICES, ids=str)
def test_advanced_and_boolean_indexing(dev, rng):
    a = f32(rng, 5, 4)
    t = bp.tensor(a, device=dev)
    idx = [4, 0, -1, 2]
    np.testing.assert_array_equal(t[idx].numpy(), a[idx])
    np.testing.assert_array_equal(t[bp.tensor(idx, device=dev)].numpy(), a[idx])
    np.testing.assert_array_equal(t[:, np.array([3, 1])].numpy(), a[:, [3, 1]])
    np.testing.assert_array_equal(t[1:, [0, 0]].numpy(), a[1:, [0, 0]])
    np.testing.assert_array_equal(t[np.array([[0, 1], [2, 3]])].numpy(),
                                  a[np.array([[0, 1], [2, 3]])])
    np.testing.assert_array_equal(t[t > 0].numpy(), a[a > 0])
    np.testing.assert_array_equal(t[a[:, 0] > 0].numpy(), a[a[:, 0] > 0])
    np.testing.assert_array_equal(t[::-1].numpy(), a[::-1])
    np.testing.assert_array_equal(t[::-2, 1::-1].numpy(), a[::-2, 1::-1])
    np.testing.assert_array_equal(t[..., ::-1].numpy(), a[..., ::-1])
    with pytest.raises(IndexError, match="out of range"):
        t[[5]]
    # Paired indexing: index arrays (and integers beside them) broadcast together, placed as
    # NumPy places them (adjacent: where the first was; separated: in front).
    np.testing.assert_array_equal(t[[0, 1], [1, 2]].numpy(), a[[0, 1], [1, 2]])
    np.testing.assert_array_equal(t[[[0], [4]], [3, -1]].numpy(), a[[[0], [4]], [3, -1]])
    np.testing.assert_array_equal(t[2, [1, 3]].numpy(), a[2, [1, 3]])
    b = f32(rng, 3, 4, 5)
    u3 = bp.tensor(b, device=dev)
    for key in [(1, slice(None), [0, 3]), ([0, 2], slice(None), [4, 1]), (slice(None), [0, 2],
                [1, 4]), (Ellipsis, [2, 0], [3, 3]), ([0, 1], [2, 3], slice(None, None, -1))]:
        np.testing.assert_array_equal(u3[key].numpy(), b[key], err_msg=str(key))
    y = bp.tensor([0, 2], device=dev)  # d2l's cross-entropy: y_hat[[0, 1], y]
    y_hat = bp.tensor([[0.1, 0.3, 0.6], [0.3, 0.2, 0.5]], device=dev)
    np.testing.assert_allclose(y_hat[[0, 1], y].numpy(), [0.1, 0.5])
    with pytest.raises(IndexError, match="could not be broadcast together"):
        t[[0, 1], [0, 1, 2]]
    with pytest.raises(IndexError, match="index 5 is out of range for dimension 0"):
        t[[0, 5], [0, 1]]
    with pytest.raises(bp.UnsupportedError, match="None"):
        t[[0, 1], None, [1, 2]]
    u = bp.tensor(a, device=dev)
    u[u < 0] = 0
    np.testing.assert_array_equal(u.numpy(), np.where(a < 0, 0, a))
    u[::-1] = bp.tensor(a, device=dev)
    np.testing.assert_array_equal(u.numpy(), a[::-1])
    # Gradients flow through a gather.
    w = bp.tensor(a, device=dev, requires_grad=True)
    w[[0, 0, 3]].sum().backward()
    ref = np.zeros_like(a)
    ref[0] = 2
    ref[3] = 1
    np.testing.assert_array_equal(w.grad.numpy(), ref)
    # ... and through a paired gather, repeated pairs accumulating.
    w = bp.tensor(a, device=dev, requires_grad=True)
    w[[0, 4, 0], [1, 2, 1]].sum().backward()
    ref = np.zeros_like(a)
    np.add.at(ref, ([0, 4, 0], [1, 2, 1]), 1)
    np.testing.assert_array_equal(w.grad.numpy(), ref)


def test_grad_modes_and_autograd_grad(rng):
    x = bp.tensor(f32(rng, 4), requires_grad=True)
    with bp.no_grad():
        assert not (x * 2).requires_grad
        with bp.enable_grad():
            assert (x * 2).requires_grad
    with bp.inference_mode():
        assert not (x * 2).requires_grad
    with bp.set_grad_enabled(False):
        assert not bp.is_grad_enabled()
    assert bp.is_grad_enabled()

    @bp.inference_mode()
    def f():
        return x * 2
    assert not f().requires_grad
    w = bp.tensor(f32(rng, 4), requires_grad=True)
    y = (x * x * w).sum()
    gx, gw = bp.autograd.grad(y, [x, w])
    xv, wv = x.numpy().astype(np.float64), w.numpy().astype(np.float64)
    np.testing.assert_allclose(gx.numpy(), 2 * xv * wv, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gw.numpy(), xv * xv, rtol=1e-5, atol=1e-6)
    assert x.grad is None and w.grad is None
    unused = bp.ones(2, requires_grad=True)
    with pytest.raises(bp.Error, match="not used"):
        bp.autograd.grad(y, [unused])
    assert bp.autograd.grad(y, [unused], allow_unused=True) == (None,)


def test_module_list():
    layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    assert len(layers) == 3 and len(list(layers.parameters())) == 6
    assert list(layers.state_dict())[0] == "0.weight"
