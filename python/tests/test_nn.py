"""nn modules, state dicts, save/load with map_location, losses and optimisers, against
float64 NumPy references."""
import json
import math
import struct

import numpy as np
import pytest

import backplane as bp
from backplane import nn
from backplane.nn import functional as F
from conftest import DEVICES


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.LazyLinear(8)
        self.out = nn.Linear(8, 2)
        self.register_buffer("scale", bp.full((2,), 0.5))
        self.note = "plain attribute"

    def forward(self, x):
        return self.out(F.relu(self.hidden(x))) * self.scale


def test_custom_module_registers_parameters_buffers_and_children(rng):
    net = MLP()
    assert [k for k, _ in net.named_parameters()] == ["out.weight", "out.bias"]
    assert not list(net.hidden.parameters()) and net.has_uninitialized_parameters()
    x = bp.tensor(rng.uniform(-1, 1, (4, 3)))
    x = x.float()
    y = net(x)
    assert y.shape == (4, 2)
    assert [k for k, _ in net.named_parameters()] == ["hidden.weight", "hidden.bias",
                                                      "out.weight", "out.bias"]
    assert list(net.state_dict()) == ["scale", "hidden.weight", "hidden.bias", "out.weight",
                                      "out.bias"]  # own entries first, as in PyTorch
    assert [k for k, _ in net.named_buffers()] == ["scale"]
    assert net.note == "plain attribute" and [n for n, _ in net.named_children()] == ["hidden",
                                                                                      "out"]
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in net.parameters())
    assert repr(net) == ("MLP(\n  (hidden): LazyLinear(in_features=3, out_features=8, bias=True)"
                         "\n  (out): Linear(in_features=8, out_features=2, bias=True)\n)")
    with pytest.raises(TypeError, match="parameter 'weight'"):
        net.out.weight = bp.ones(2, 8)
    assert not net.eval().training and not net.out.training and net.train().hidden.training


def test_linear_matches_numpy_and_its_initialisation_bound(device, rng):
    bp.manual_seed(7)
    lin = nn.Linear(5, 3, device=device)
    bound = 1 / math.sqrt(5)
    w, b = lin.weight.numpy(), lin.bias.numpy()
    assert lin.weight.device is device and w.shape == (3, 5) and b.shape == (3,)
    assert (np.abs(w) <= bound).all() and (np.abs(b) <= bound).all() and np.std(w) > 0.1
    bp.manual_seed(7)
    np.testing.assert_array_equal(nn.Linear(5, 3).weight.numpy(), w)  # same on every device
    x = rng.uniform(-1, 1, (4, 5)).astype(np.float32)
    out = lin(bp.tensor(x, device=device)).numpy().astype(np.float64)
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.T + b, rtol=1e-5, atol=1e-6)
    # leading dims of any rank (and none), as torch.nn.Linear; the bias's gradient sums them
    x3 = rng.uniform(-1, 1, (2, 3, 5)).astype(np.float32)
    t3 = bp.tensor(x3, device=device)
    out3 = lin(t3)
    np.testing.assert_allclose(out3.numpy(), x3.astype(np.float64) @ w.T + b, rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(lin(bp.tensor(x[0], device=device)).numpy(),
                               x[0].astype(np.float64) @ w.T + b, rtol=1e-5, atol=1e-6)
    g = rng.uniform(-1, 1, (2, 3, 3)).astype(np.float32)
    (out3 * bp.tensor(g, device=device)).sum().backward()
    np.testing.assert_allclose(lin.bias.grad.numpy(), g.astype(np.float64).sum((0, 1)),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lin.weight.grad.numpy(),
                               np.einsum("abo,abi->oi", g.astype(np.float64), x3), rtol=1e-5,
                               atol=1e-6)
    assert nn.Linear(5, 3, bias=False).bias is None
    with pytest.raises(bp.DTypeError, match="linear"):
        F.linear(bp.tensor(x, device=device), lin.weight.to(bp.float64))
    with pytest.raises(bp.ShapeError, match="in_features=5"):
        lin(bp.ones(2, 4, device=device))


def test_sequential_indexing_and_iteration():
    net = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 1))
    assert len(net) == 3 and isinstance(net[1], nn.ReLU) and isinstance(net[-1], nn.Linear)
    assert [type(m).__name__ for m in net] == ["Linear", "ReLU", "Linear"]
    assert len(net[:2]) == 2
    with pytest.raises(IndexError, match="out of range"):
        net[3]
    assert [k for k, _ in net.named_parameters()] == ["0.weight", "0.bias", "2.weight",
                                                      "2.bias"]


def test_load_state_dict_checks_before_changing_anything():
    net = nn.Sequential(nn.Linear(3, 2))
    before = net[0].weight.numpy().copy()
    good = {"0.weight": bp.ones(2, 3), "0.bias": bp.zeros(2)}
    with pytest.raises(bp.ShapeError, match="missing keys 0.bias"):
        net.load_state_dict({"0.weight": bp.ones(2, 3)})
    with pytest.raises(bp.ShapeError, match="unexpected keys 1.weight"):
        net.load_state_dict({**good, "1.weight": bp.ones(1)})
    with pytest.raises(bp.ShapeError, match=r"'0.weight' has shape \(3, 2\)"):
        net.load_state_dict({"0.weight": bp.ones(3, 2), "0.bias": bp.zeros(2)})
    with pytest.raises(bp.DTypeError, match="floating"):
        net.load_state_dict({"0.weight": bp.ones(2, 3, dtype=bp.int32), "0.bias": bp.zeros(2)})
    np.testing.assert_array_equal(net[0].weight.numpy(), before)
    r = net.load_state_dict({"0.weight": bp.ones(2, 3), "x": bp.ones(1)}, strict=False)
    assert r.missing_keys == ["0.bias"] and r.unexpected_keys == ["x"]
    assert net[0].weight.tolist() == [[1.0] * 3] * 2


def test_module_to_dtype_and_zero_grad():
    net = nn.Sequential(nn.Linear(3, 2))
    net(bp.ones(1, 3)).sum().backward()
    assert net[0].weight.grad is not None
    net.double()
    assert net[0].weight.dtype == bp.float64 and net[0].weight.grad.dtype == bp.float64
    assert isinstance(net[0].weight, nn.Parameter) and net[0].weight.is_leaf
    net.zero_grad()
    assert net[0].weight.grad is None
    with pytest.raises(bp.DTypeError, match="floating"):
        net.to(bp.int32)


@pytest.mark.parametrize("src", DEVICES, ids=str)
@pytest.mark.parametrize("dst", DEVICES, ids=str)
def test_save_and_load_onto_a_chosen_device(src, dst, tmp_path, rng):
    net = nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.Linear(4, 1)).to(src)
    x = bp.tensor(rng.uniform(-1, 1, (3, 5)).astype(np.float32), device=src)
    ref = net(x).numpy()
    path = tmp_path / "net.safetensors"
    bp.save(net, path)
    state = bp.load(path, map_location=dst)
    assert all(t.device is dst for t in state.values())
    clone = nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.Linear(4, 1)).to(dst)
    clone.load_state_dict(state)
    assert clone[0].weight.device is dst and clone[2].weight.device is dst
    # The parameters arrive bit for bit; the outputs agree to f32 rounding across devices (two
    # devices' matmuls may sum in different orders) and exactly on the same device.
    for name, t in net.state_dict().items():
        np.testing.assert_array_equal(state[name].numpy(), t.numpy())
    out = clone(x.to(dst)).numpy()
    if src is dst:
        np.testing.assert_array_equal(out, ref)
    else:
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_saved_containers_and_the_file_format(tmp_path):
    x = bp.arange(4, dtype=bp.float32)
    bp.save(x, tmp_path / "x")
    assert bp.load(tmp_path / "x").tolist() == [0, 1, 2, 3]
    bp.save([x, x * 2], tmp_path / "xs")
    a, b = bp.load(tmp_path / "xs")
    assert b.tolist() == [0, 2, 4, 6]
    bp.save({"w": x}, tmp_path / "d", metadata={"epoch": "3"})
    assert bp.load(tmp_path / "d")["w"].tolist() == [0, 1, 2, 3]
    assert bp.load_metadata(tmp_path / "d")["epoch"] == "3"
    raw = (tmp_path / "d").read_bytes()  # safetensors: u64 header length, JSON, data
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    assert header["w"] == {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
    np.testing.assert_array_equal(np.frombuffer(raw[8 + n:], np.float32), [0, 1, 2, 3])
    with pytest.raises(TypeError, match="not a Tensor"):
        bp.save({"w": 3}, tmp_path / "bad")


def test_bad_files_raise_ioerror_naming_the_path(tmp_path):
    with pytest.raises(bp.IOError) as e:
        bp.load(tmp_path / "missing.safetensors")
    assert isinstance(e.value, OSError) and "missing.safetensors" in str(e.value)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(OSError, match="bad.safetensors"):
        bp.load(bad)


def test_losses_against_numpy(device, rng):
    p = rng.uniform(-1, 1, (6, 3)).astype(np.float32)
    t = rng.uniform(-1, 1, (6, 3)).astype(np.float32)
    P, T = p.astype(np.float64), t.astype(np.float64)
    tp, tt = bp.tensor(p, device=device), bp.tensor(t, device=device)
    np.testing.assert_allclose(F.mse_loss(tp, tt).item(), ((P - T) ** 2).mean(), rtol=1e-5)
    np.testing.assert_allclose(nn.MSELoss("sum")(tp, tt).item(), ((P - T) ** 2).sum(),
                               rtol=1e-5)
    np.testing.assert_allclose(nn.MSELoss("none")(tp, tt).numpy(), (P - T) ** 2, rtol=1e-5,
                               atol=1e-7)
    with pytest.raises(bp.ShapeError):
        F.mse_loss(tp, tt[:, :1])
    labels = rng.integers(0, 3, 6)
    lse = np.log(np.exp(P).sum(1))
    per = lse - P[np.arange(6), labels]
    tl = bp.tensor(labels, device=device)
    np.testing.assert_allclose(F.cross_entropy(tp, tl).item(), per.mean(), rtol=1e-5)
    np.testing.assert_allclose(nn.CrossEntropyLoss("none")(tp, tl).numpy(), per, rtol=1e-5)
    np.testing.assert_allclose(nn.CrossEntropyLoss("sum")(tp, tl).item(), per.sum(), rtol=1e-5)
    # A class index outside [0, C) is an error naming it on every reduction (the 'none' and
    # 'sum' paths once built a one-hot mask, where such a row silently added nothing).
    bad = labels.copy()
    bad[rng.integers(0, 6)] = 3
    for reduction in ("mean", "sum", "none"):
        with pytest.raises(bp.Error, match="target 3 "):
            F.cross_entropy(tp, bp.tensor(bad, device=device), reduction=reduction).numpy()
    with pytest.raises(bp.DTypeError, match="i64 or i32 class indices"):
        F.cross_entropy(tp, tl.to(bp.float32), reduction="sum")
    np.testing.assert_allclose(F.softmax(tp).numpy(), np.exp(P - lse[:, None]), rtol=1e-5)
    with pytest.raises(ValueError, match="reduction"):
        F.mse_loss(tp, tt, reduction="avg")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_options_against_numpy(device, rng, reduction):
    """ignore_index, label_smoothing and [N, C, d] logits, loss and gradient, against float64."""
    n, c, d = 4, 6, 3
    x = rng.uniform(-3, 3, (n, c, d)).astype(np.float32)
    t = rng.integers(0, c, (n, d))
    t[rng.integers(0, n), rng.integers(0, d)] = 2  # ignore_index 2 is also a class
    e, ignore = 0.15, 2
    X = np.moveaxis(x.astype(np.float64), 1, -1)  # [n, d, c]
    lse = np.log(np.exp(X).sum(-1))
    logp = X - lse[..., None]
    picked = np.take_along_axis(logp, t[..., None], -1)[..., 0]
    per = -(1 - e) * picked - e * logp.mean(-1)
    keep = t != ignore
    per = np.where(keep, per, 0.0)
    onehot = np.eye(c)[t]
    dper = np.where(keep[..., None], np.exp(logp) - (1 - e) * onehot - e / c, 0.0)
    tx = bp.tensor(x, device=device, requires_grad=True)
    loss = F.cross_entropy(tx, bp.tensor(t, device=device), reduction=reduction,
                           ignore_index=ignore, label_smoothing=e)
    if reduction == "none":
        np.testing.assert_allclose(loss.numpy(), per, rtol=2e-5, atol=1e-6)
        w = rng.uniform(-1, 1, (n, d)).astype(np.float32)
        loss.backward(bp.tensor(w, device=device))
        want = dper * w[..., None]
    else:
        scale = 1.0 / keep.sum() if reduction == "mean" else 1.0
        np.testing.assert_allclose(loss.item(), per.sum() * scale, rtol=2e-5)
        loss.backward()
        want = dper * scale
    np.testing.assert_allclose(tx.grad.numpy(), np.moveaxis(want, -1, 1), rtol=2e-5, atol=1e-6)
    m = nn.CrossEntropyLoss(reduction, ignore_index=ignore, label_smoothing=e)
    np.testing.assert_allclose(m(tx, bp.tensor(t, device=device)).numpy(), loss.numpy(),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="label_smoothing must be in"):
        F.cross_entropy(tx, bp.tensor(t, device=device), label_smoothing=-0.5)
    with pytest.raises(ValueError, match="reduction must be"):
        F.cross_entropy(tx, bp.tensor(t, device=device), reduction="avg")


def _sgd_reference(w, grads, lr, momentum, wd):
    buf = None
    for g in grads:
        d = g + wd * w
        buf = d if buf is None else momentum * buf + d
        w = w - lr * buf
    return w


def test_sgd_and_adam_steps_against_numpy(device, rng):
    w0 = rng.uniform(-1, 1, 5)
    x = rng.uniform(-1, 1, 5)
    for make, ref in [
        (lambda ps: bp.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
         "sgd"),
        (lambda ps: bp.optim.Adam(ps, lr=0.01, betas=(0.8, 0.99)), "adam"),
    ]:
        w = bp.tensor(w0, device=device, requires_grad=True)
        opt = make([w])
        grads = []
        for _ in range(3):
            opt.zero_grad()
            loss = (w * bp.tensor(x, device=device)).exp().sum()
            loss.backward()
            grads.append(w.grad.numpy().copy())
            opt.step()
        W = w0.copy()
        if ref == "sgd":
            # each gradient depends on the weights of its step: recompute the reference chain
            buf = None
            for _ in range(3):
                g = x * np.exp(W * x) + 0.01 * W
                buf = g if buf is None else 0.9 * buf + g
                W = W - 0.1 * buf
        else:
            m = v = 0
            for t in range(1, 4):
                g = x * np.exp(W * x)
                m = 0.8 * m + 0.2 * g
                v = 0.99 * v + 0.01 * g * g
                W = W - 0.01 / (1 - 0.8 ** t) * m / (np.sqrt(v) / np.sqrt(1 - 0.99 ** t) + 1e-8)
        np.testing.assert_allclose(w.numpy(), W, rtol=1e-10, atol=1e-12)
    assert bp.optim.SGD([w], lr=0.5).lr == 0.5
    with pytest.raises(bp.Error, match="LazyLinear"):
        bp.optim.SGD(nn.LazyLinear(2).parameters(), lr=0.1)
    with pytest.raises(bp.Error, match="does not require grad"):
        bp.optim.SGD([bp.ones(2)], lr=0.1)


def test_clip_grad_norm_and_init(device):
    w = bp.tensor([3.0, 4.0], device=device, requires_grad=True)
    (w * w / 2).sum().backward()  # grad = w, norm 5
    norm = nn.utils.clip_grad_norm_([w], 1.0)
    assert abs(norm.item() - 5) < 1e-5
    np.testing.assert_allclose(w.grad.numpy(), [0.6, 0.8], rtol=1e-5)
    p = nn.Parameter(bp.zeros(200, 100, device=device))
    nn.init.normal_(p, 1.0, 0.01)
    assert abs(p.mean().item() - 1) < 1e-3 and p.requires_grad and p.device is device
    nn.init.xavier_uniform_(p)
    # U(-b, b) with b = sqrt(6 / (fan_in + fan_out)), drawn in float32: the largest magnitude may
    # round up to b as float32 stores it (relative 2^-24 above b), never further; 20,000 draws
    # come within 1% of b.
    bound = math.sqrt(6 / 300)
    assert 0.99 * bound <= p.abs().max().item() <= bound * (1 + 2**-22)
    nn.init.zeros_(p)
    assert p.abs().max().item() == 0
