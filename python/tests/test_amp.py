"""Mixed precision: backplane.autocast's op lists, nesting, the decorator, gradients through the
casts, a small MLP trained in autocast against its f32 run, GradScaler's skipping and growth,
and the refusals (the C++ tests/nn/amp_test.cpp in Python)."""
import math

import numpy as np
import pytest

import backplane as bp
from backplane import nn
from backplane.amp import GradScaler
import backplane.nn.functional as F

LOW = [bp.bfloat16, bp.float16]


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def skip_unless_supported(device, dtype):
    if dtype not in bp.amp.autocast_supported_dtypes(device.type):
        pytest.skip(f"{device.type} does not run autocast in {dtype}")


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_ops_follow_the_lists(device, dtype, rng):
    skip_unless_supported(device, dtype)
    a = bp.tensor(f32(rng, 4, 8), device=device)
    b = bp.tensor(f32(rng, 8, 5), device=device)
    w = bp.tensor(f32(rng, 5, 8), device=device)
    low = bp.tensor(f32(rng, 4, 8), device=device).to(dtype)
    labels = bp.tensor(np.array([0, 3, 7, 1], dtype=np.int64), device=device)
    with bp.autocast(device.type, dtype=dtype):
        assert bp.is_autocast_enabled(device.type)
        assert bp.get_autocast_dtype(device.type) == dtype
        assert bp.matmul(a, b).dtype == dtype
        assert (a @ b).dtype == dtype
        assert F.linear(a, w).dtype == dtype
        # with an f32 bias too (one fused op: the bias no longer promotes the output to f32)
        assert F.linear(a, w, bp.tensor(f32(rng, 5), device=device)).dtype == dtype
        assert bp.softmax(low, 1).dtype == bp.float32
        assert F.layer_norm(low, [8]).dtype == bp.float32
        assert F.cross_entropy(low, labels).dtype == bp.float32
        assert F.mse_loss(low, low).dtype == bp.float32
        assert low.sum().dtype == bp.float32
        assert (low + a).dtype == bp.float32
        assert F.relu(low).dtype == dtype
    assert not bp.is_autocast_enabled(device.type)
    assert bp.matmul(a, b).dtype == bp.float32


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_nesting_disabling_and_the_decorator(device, dtype, rng):
    skip_unless_supported(device, dtype)
    a = bp.tensor(f32(rng, 3, 4), device=device)
    b = bp.tensor(f32(rng, 4, 2), device=device)

    @bp.autocast(device.type, dtype=dtype)
    def product(x, y):
        return bp.matmul(x, y)

    with bp.autocast(device.type, dtype=dtype):
        with bp.autocast(device.type, enabled=False):
            assert bp.matmul(a, b).dtype == bp.float32
            assert product(a, b).dtype == dtype
            assert bp.matmul(a, b).dtype == bp.float32
        assert bp.matmul(a, b).dtype == dtype
    assert product(a, b).dtype == dtype
    assert bp.matmul(a, b).dtype == bp.float32


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_gradients_of_f32_leaves_are_f32(device, dtype, rng):
    skip_unless_supported(device, dtype)
    x0, w0 = f32(rng, 6, 8), f32(rng, 5, 8)
    x = bp.tensor(x0, device=device, requires_grad=True)
    w = bp.tensor(w0, device=device, requires_grad=True)
    with bp.autocast(device.type, dtype=dtype):
        y = F.linear(x, w)
        loss = (y * y).sum()
    assert y.dtype == dtype and loss.dtype == bp.float32
    loss.backward()
    assert w.grad.dtype == bp.float32 and x.grad.dtype == bp.float32
    # 2 y^T x with the operands as the dtype holds them.
    xr = bp.tensor(x0).to(dtype).to(bp.float64).numpy()
    wr = bp.tensor(w0).to(dtype).to(bp.float64).numpy()
    ref = 2 * (xr @ wr.T).T @ xr
    err = np.linalg.norm(w.grad.numpy() - ref) / np.linalg.norm(ref)
    assert err < (2e-2 if dtype == bp.bfloat16 else 4e-3), err


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_mlp_trains_like_its_f32_run(device, dtype, rng):
    skip_unless_supported(device, dtype)
    x0, t0 = f32(rng, 32, 16), f32(rng, 32, 4)
    w1, w2 = 0.25 * f32(rng, 32, 16), 0.25 * f32(rng, 4, 32)

    def run(amp):
        x, t = bp.tensor(x0, device=device), bp.tensor(t0, device=device)
        a = bp.tensor(w1, device=device, requires_grad=True)
        b = bp.tensor(w2, device=device, requires_grad=True)
        opt = bp.optim.SGD([a, b], lr=0.1)
        # A scale at which no f16 gradient overflows (dW1 sums 32 rows), so that no step is
        # skipped and the two runs stay step for step comparable.
        scaler = GradScaler(device.type, init_scale=256.0, enabled=amp and dtype == bp.float16)
        losses = []
        for _ in range(8):
            opt.zero_grad()
            with bp.autocast(device.type, dtype=dtype, enabled=amp):
                loss = F.mse_loss(F.linear(F.relu(F.linear(x, a)), b), t)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            losses.append(loss.item())
        return np.array(losses)

    ref, got = run(False), run(True)
    assert ref[-1] < ref[0] and got[-1] < got[0]
    # Two products in the dtype per step, weights drifting by its rounding: 16x its matmul
    # tolerance (1e-2 bf16, 2e-3 f16).
    np.testing.assert_allclose(got, ref, rtol=16 * (1e-2 if dtype == bp.bfloat16 else 2e-3))


def test_grad_scaler_skips_on_inf_and_halves_the_scale(device, rng):
    w = bp.tensor(f32(rng, 4, 3), device=device, requires_grad=True)
    b = bp.tensor(f32(rng, 4), device=device, requires_grad=True)
    x = bp.tensor(f32(rng, 5, 3), device=device)
    opt = bp.optim.SGD([{"params": [w]}, {"params": [b]}], lr=0.1)
    scaler = GradScaler()
    assert scaler.get_scale() == 65536.0
    scaler.scale(F.linear(x, w, b).sum()).backward()
    g = b.grad.numpy().copy()
    g[1] = np.inf
    b.grad = bp.tensor(g, device=device)
    before = w.numpy().copy()
    scaler.step(opt)
    np.testing.assert_array_equal(w.numpy(), before)
    scaler.update()
    assert scaler.get_scale() == 32768.0
    opt.zero_grad()
    scaler.scale(F.linear(x, w, b).sum()).backward()
    scaler.unscale_(opt)
    np.testing.assert_array_equal(b.grad.numpy(), np.full(4, 5.0, np.float32))
    norm = nn.utils.clip_grad_norm_([w, b], 1.0)  # on the unscaled gradients
    assert norm.item() > 1.0
    scaler.step(opt)
    assert not np.array_equal(w.numpy(), before)
    scaler.update()
    assert scaler.state_dict() == {"scale": 32768.0, "growth_factor": 2.0,
                                   "backoff_factor": 0.5, "growth_interval": 2000,
                                   "_growth_tracker": 1}
    with pytest.raises(bp.Error, match="no optimizer was unscaled or stepped"):
        scaler.update()


def test_grad_scaler_grows_and_round_trips(device, rng):
    w = bp.tensor(f32(rng, 2, 3), device=device, requires_grad=True)
    x = bp.tensor(f32(rng, 4, 3), device=device)
    opt = bp.optim.Adam([w], lr=1e-3)
    scaler = GradScaler(device.type, init_scale=8.0, growth_interval=3)
    scales = []
    for _ in range(7):
        opt.zero_grad()
        scaler.scale(F.linear(x, w).sum()).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    assert scales == [8, 8, 16, 16, 16, 32, 32]
    other = GradScaler()
    other.load_state_dict(scaler.state_dict())
    assert other.state_dict() == scaler.state_dict()
    with pytest.raises(bp.Error, match='missing key "scale"'):
        other.load_state_dict({"growth_factor": 2.0})


def test_refusals(device):
    with pytest.raises(bp.DTypeError, match="is not a lower-precision dtype"):
        with bp.autocast(device.type, dtype=bp.float32):
            pass
    with pytest.raises(bp.DeviceError, match="no device of type 'nosuchdevice'"):
        with bp.autocast("nosuchdevice"):
            pass
    assert not bp.is_autocast_enabled(device.type)
    for dtype in LOW:
        if dtype in bp.amp.autocast_supported_dtypes(device.type):
            continue
        with pytest.raises(bp.DTypeError, match=f"autocast on '{device.type}' supports"):
            with bp.autocast(device.type, dtype=dtype):
                pass
