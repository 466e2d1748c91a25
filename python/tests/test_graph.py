"""Graphs from Python (backplane.Graph, backplane.graph, backplane.capture) on every device and
in both modes: replay with updated inputs, a captured training step against the eager one, and
the refusals (CaptureError), which leave the capture open."""
import numpy as np
import pytest

import backplane as bp
from backplane import nn
from conftest import DEVICES

MODES = ["automatic", "recorded"]


@pytest.mark.parametrize("mode", MODES)
def test_capture_replays_with_updated_inputs(device, mode, rng):
    xv = rng.uniform(-2, 2, 500).astype(np.float32)
    bv = rng.uniform(-2, 2, 500).astype(np.float32)
    x, b = bp.tensor(xv, device=device), bp.tensor(bv, device=device)
    g = bp.Graph()
    with bp.graph(g, device, mode) as same:
        assert same is g and g.capturing and bp.is_capturing(device)
        y = (x + b).relu() * 3.0
    assert not g.capturing and not bp.is_capturing(device)
    assert g.num_ops == 3 and g.pool_bytes > 0
    assert g.native == (mode == "automatic" and device.type == "cuda")
    assert "ops=3" in repr(g)
    for _ in range(3):
        g.replay()
        np.testing.assert_allclose(y.numpy(), np.maximum(xv + bv, 0) * 3.0, rtol=1e-6)
        xv = rng.uniform(-2, 2, 500).astype(np.float32)
        x.copy_(bp.tensor(xv, device=device))


@pytest.mark.parametrize("mode", MODES)
def test_refused_ops_raise_capture_error_and_keep_the_capture(device, mode, rng):
    x = bp.tensor(rng.uniform(-1, 1, 8).astype(np.float32), device=device)
    g = bp.Graph()
    g.begin_capture(device, mode)
    try:
        y = x * 2.0
        for fn, fragment in [(lambda: y.numpy(), "cannot be captured"),
                             (lambda: y.sum().item(), "cannot be captured"),
                             (lambda: bp.synchronize(), "synchronize"),
                             (lambda: bp.randn(4, device=device), "randn"),
                             (lambda: bp.Graph().begin_capture(device, mode),
                              "while another capture is open on this device")]:
            with pytest.raises(bp.CaptureError, match=fragment):
                fn()
            assert g.capturing
    except BaseException:
        g.abort_capture()  # a failing check must not leave the device capturing
        raise
    g.end_capture()
    g.replay()
    np.testing.assert_allclose(y.numpy(), x.numpy() * 2.0, rtol=1e-6)


def test_an_exception_in_the_block_drops_the_capture(device):
    g = bp.Graph()
    x = bp.ones(4, device=device)
    with pytest.raises(bp.CaptureError):
        with bp.graph(g, device):
            (x + 1).sum().item()
    assert g.empty and not bp.is_capturing(device)
    assert (x + 1).numpy().tolist() == [2.0] * 4
    with pytest.raises(bp.Error, match="not one of"):
        bp.capture(lambda: None, device, "eager")
    with pytest.raises(TypeError):
        bp.graph("not a graph")


@pytest.mark.parametrize("mode", MODES)
def test_a_captured_training_step_replays_like_the_eager_one(device, mode, rng):
    def make():
        bp.manual_seed(11)
        net = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3)).to(device)
        return net, bp.optim.SGD(net.parameters(), lr=0.1)

    eager, opt_e = make()
    net, opt = make()
    batch = lambda: (bp.tensor(rng.uniform(-1, 1, (16, 6)).astype(np.float32), device=device),
                     bp.tensor(rng.integers(0, 3, 16), device=device))
    x, labels = batch()
    holder = {}

    def step():
        opt.zero_grad()
        holder["loss"] = nn.functional.cross_entropy(net(x), labels)
        holder["loss"].backward()
        opt.step()

    g = bp.capture(step, device, mode)
    for _ in range(3):
        bx, by = batch()
        opt_e.zero_grad()
        loss_e = nn.functional.cross_entropy(eager(bx), by)
        loss_e.backward()
        opt_e.step()
        x.copy_(bx)
        labels.copy_(by)
        g.replay()
        assert holder["loss"].item() == pytest.approx(loss_e.item(), rel=1e-6)
    for pe, pc in zip(eager.parameters(), net.parameters()):
        np.testing.assert_allclose(pc.numpy(), pe.numpy(), rtol=1e-5, atol=1e-6)
