"""The convolutional family from Python: torch.nn.functional-style functions against NumPy
float64 references, their gradients against finite differences, the layers' state and modes,
the refusals, LeNet on scikit-learn's digits and ResNet-18 against the PyTorch fixture."""
import os

import numpy as np
import pytest

import backplane as bp
from backplane import nn
from backplane.nn import functional as F

from conftest import tol

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIGITS = os.path.join(ROOT, "tests", "fixtures", "digits", "digits.safetensors")
RESNET_FIXTURE = os.path.join(ROOT, "tests", "fixtures", "torch", "resnet18_w8.safetensors")


def has(device, *ops):
    """Whether the device has every named catalogue op in f32 (else the test is skipped)."""
    return all(device.supports(op, bp.float32) for op in ops)


def need(device, *ops):
    if not has(device, *ops):
        pytest.skip(f"{device} lacks one of {ops}")


def conv2d_ref(x, w, b, stride, pad, dil, groups):
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    p = (h + 2 * pad[0] - dil[0] * (r - 1) - 1) // stride[0] + 1
    q = (wd + 2 * pad[1] - dil[1] * (s - 1) - 1) // stride[1] + 1
    y = np.zeros((n, k, p, q))
    kg = k // groups
    for g in range(groups):
        for i in range(r):
            for j in range(s):
                patch = xp[:, g * cg:(g + 1) * cg,
                           i * dil[0]:i * dil[0] + stride[0] * (p - 1) + 1:stride[0],
                           j * dil[1]:j * dil[1] + stride[1] * (q - 1) + 1:stride[1]]
                y[:, g * kg:(g + 1) * kg] += np.einsum("nchw,kc->nkhw", patch,
                                                       w[g * kg:(g + 1) * kg, :, i, j])
    return y if b is None else y + b[None, :, None, None]


def close(t, ref, dtype=bp.float32, scale=1.0):
    rtol, atol = tol(dtype)
    np.testing.assert_allclose(t.numpy().astype(np.float64), ref, rtol=rtol * scale,
                               atol=atol * scale * max(1.0, float(np.abs(ref).max())))


def test_conv2d_matches_numpy(device, rng):
    need(device, "conv2d")
    x = rng.standard_normal((2, 4, 9, 7)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 2)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    y = F.conv2d(bp.tensor(x, device=device), bp.tensor(w, device=device),
                 bp.tensor(b, device=device), stride=(2, 1), padding=(1, 2), dilation=(2, 1),
                 groups=2)
    close(y, conv2d_ref(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64),
                        (2, 1), (1, 2), (2, 1), 2), scale=20)


def test_pooling_and_softmax_match_numpy(device, rng):
    need(device, "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "softmax", "log_softmax")
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    t = bp.tensor(x, device=device)
    X = x.astype(np.float64).reshape(2, 3, 3, 2, 3, 2)
    values, indices = F.max_pool2d(t, 2, return_indices=True)
    close(values, X.max(axis=(3, 5)))
    flat = np.arange(36).reshape(6, 6).reshape(3, 2, 3, 2).transpose(0, 2, 1, 3).reshape(3, 3, 4)
    arg = x.reshape(2, 3, 3, 2, 3, 2).transpose(0, 1, 2, 4, 3, 5).reshape(2, 3, 3, 3, 4).argmax(-1)
    np.testing.assert_array_equal(indices.numpy(), np.take_along_axis(
        np.broadcast_to(flat, (2, 3, 3, 3, 4)), arg[..., None], -1)[..., 0])
    close(F.avg_pool2d(t, 2), X.mean(axis=(3, 5)))
    close(F.adaptive_avg_pool2d(t, 1), x.astype(np.float64).mean(axis=(2, 3), keepdims=True))
    e = np.exp(x - x.max(1, keepdims=True))
    close(F.softmax(t, 1), e / e.sum(1, keepdims=True))
    close(F.log_softmax(t, 1), np.log(e / e.sum(1, keepdims=True)), scale=4)


def test_indexing_functions(device, rng):
    need(device, "max_dim", "min_dim", "gather", "scatter_add")
    a = rng.standard_normal((4, 5)).astype(np.float32)
    t = bp.tensor(a, device=device)
    r = bp.max(t, 1)
    assert isinstance(r, bp.return_types.max)
    close(r.values, a.max(1))
    np.testing.assert_array_equal(r.indices.numpy(), a.argmax(1))
    np.testing.assert_array_equal(t.min(0, keepdim=True).indices.numpy(), a.argmin(0)[None])
    assert t.argmax().item() == a.argmax()
    np.testing.assert_array_equal(bp.argmin(t, 1).numpy(), a.argmin(1))
    idx = rng.integers(0, 5, (4, 3))
    close(bp.gather(t, 1, bp.tensor(idx, device=device)), np.take_along_axis(a, idx, 1))
    src = rng.standard_normal((4, 3)).astype(np.float32)
    ref = a.astype(np.float64).copy()
    np.add.at(ref, (np.arange(4)[:, None], idx), src)
    close(bp.scatter_add(t, 1, bp.tensor(idx, device=device), bp.tensor(src, device=device)), ref)
    close(bp.clamp(t, -0.5, 0.5), np.clip(a, -0.5, 0.5))
    close(t.clamp(max=0.2), np.minimum(a, 0.2))
    close(bp.var(t, 1), a.astype(np.float64).var(1, ddof=1), scale=4)
    close(t.std(correction=0), a.astype(np.float64).std(), scale=4)
    close(bp.stack([t, t], 1), np.stack([a, a], 1))


def test_gradients_against_finite_differences(rng):
    """f64 on cpu:0: autograd of a small conv net (conv, batch norm, pooling, softmax) against
    central differences."""
    cpu = bp.device("cpu:0")
    if not has(cpu, "conv2d", "batch_norm", "max_pool2d", "log_softmax"):
        pytest.skip("cpu:0 lacks the convolution kernels")
    x = rng.standard_normal((2, 2, 6, 6))
    w = rng.standard_normal((3, 2, 3, 3))
    r = rng.standard_normal((2, 3, 2, 2))

    def loss(xv, wv, grad=False):
        xt = bp.tensor(xv, dtype=bp.float64, device=cpu, requires_grad=grad)
        wt = bp.tensor(wv, dtype=bp.float64, device=cpu, requires_grad=grad)
        y = F.conv2d(xt, wt, padding=1)
        y = F.batch_norm(y, None, None, training=True)
        y = F.log_softmax(F.max_pool2d(y, 3), 1)
        out = (y * bp.tensor(r, dtype=bp.float64, device=cpu)).sum()
        if grad:
            out.backward()
            return xt.grad.numpy(), wt.grad.numpy()
        return out.item()

    gx, gw = loss(x, w, True)
    h = 1e-6
    for arr, g in ((x, gx), (w, gw)):
        fd = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            old = arr[i]
            arr[i] = old + h
            lp = loss(x, w)
            arr[i] = old - h
            lm = loss(x, w)
            arr[i] = old
            fd[i] = (lp - lm) / (2 * h)
        np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-6)


def test_layers_state_and_modes():
    bp.manual_seed(3)
    conv = nn.Conv2d(4, 6, (3, 5), stride=2, padding=1, groups=2)
    assert tuple(conv.weight.shape) == (6, 2, 3, 5)
    assert float(conv.weight.abs().max().item()) <= 1 / np.sqrt(2 * 15)
    bn = nn.BatchNorm2d(6)
    assert list(bn.state_dict()) == ["weight", "bias", "running_mean", "running_var",
                                     "num_batches_tracked"]
    assert bn.num_batches_tracked.dtype == bp.int64 and bn.num_batches_tracked.ndim == 0
    net = nn.Sequential(conv, bn, nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.2), nn.Flatten())
    net.eval()
    assert not bn.training and not net[4].training
    net.train()
    assert bn.training
    blocks = nn.ModuleList([nn.ReLU(), nn.Conv2d(1, 1, 1)])
    assert len(blocks) == 2 and "1.weight" in blocks.state_dict()
    with pytest.raises(NotImplementedError):
        blocks(bp.zeros(1))


def test_refusals():
    x = bp.zeros(2, 3, 8, 8)
    with pytest.raises(bp.ShapeError, match="has 3 channels but weight"):
        F.conv2d(x, bp.zeros(4, 2, 3, 3))
    with pytest.raises(bp.ShapeError, match="stride must be >= 1"):
        F.conv2d(x, bp.zeros(4, 3, 3, 3), stride=0)
    with pytest.raises(bp.ShapeError, match="padding must be >= 0"):
        F.conv2d(x, bp.zeros(4, 3, 3, 3), padding=-1)
    with pytest.raises(bp.ShapeError, match="the output would be"):
        F.max_pool2d(x, 9)
    with pytest.raises(bp.ShapeError, match="running_mean must be"):
        F.batch_norm(x, bp.zeros(4), bp.ones(4))
    with pytest.raises(bp.DTypeError, match="index must be int64"):
        bp.gather(bp.zeros(2, 2), 1, bp.zeros(2, 2, dtype=bp.int32))
    with pytest.raises(bp.Error, match="probability p"):
        F.dropout(x, 2.0)
    with pytest.raises(TypeError, match="kernel_size must be an int or a pair"):
        F.max_pool2d(x, (1, 2, 3))


def _digits(device):
    data = bp.load(DIGITS, map_location="cpu")
    xtr = bp.models.digits_images(data["x_train"])
    xte = bp.models.digits_images(data["x_test"]).to(device)
    return xtr, data["y_train"], xte, data["y_test"].to(device)


def train_lenet(device, epochs=40, seed=0, lr=0.1, batch=32):
    xtr, ytr, xte, yte = _digits(device)
    bp.manual_seed(seed)
    net = bp.models.LeNet("relu", device=device)
    opt = bp.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    order_rng = np.random.default_rng(seed)
    n = xtr.shape[0]
    for _ in range(epochs):
        perm = order_rng.permutation(n)
        for s in range(0, n, batch):
            idx = bp.tensor(perm[s:s + batch], dtype=bp.int64)
            xb = bp.gather(xtr, 0, idx.reshape(-1, 1, 1, 1).expand(idx.shape[0], 1, 16, 16))
            yb = bp.gather(ytr, 0, idx)
            opt.zero_grad()
            loss = F.cross_entropy(net(xb.to(device)), yb.to(device))
            loss.backward()
            opt.step()
    net.eval()
    with bp.no_grad():
        pred = net(xte).argmax(1)
    return (pred == yte).to(bp.float32).mean().item()


@pytest.mark.skipif(not os.path.exists(DIGITS), reason="digits fixture absent")
def test_lenet_digits(device):
    need(device, "conv2d", "avg_pool2d", "avg_pool2d_backward", "conv2d_backward_weight")
    if not has(bp.device("cpu:0"), "gather"):
        pytest.skip("cpu:0 lacks gather")
    acc = train_lenet(device)
    print(f"LeNet on {device}: test accuracy {acc:.4f}")
    assert acc >= 0.95


@pytest.mark.skipif(not os.path.exists(RESNET_FIXTURE),
                    reason="run tests/fixtures/torch/make_resnet_fixture.py where PyTorch is")
def test_resnet18_matches_pytorch_fixture(device):
    need(device, "conv2d", "batch_norm_backward")
    f = bp.load(RESNET_FIXTURE, map_location=device)
    state = {k[6:]: v for k, v in f.items() if k.startswith("state.")}
    net = bp.models.ResNet18(10, 8, device=device)
    net.load_state_dict(state)

    def rel(a, b):
        a, b = a.numpy().astype(np.float64), b.numpy().astype(np.float64)
        return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)

    net.eval()
    with bp.no_grad():
        assert rel(net(f["input"]), f["logits_eval"]) <= 1e-4
    net.train()
    logits = net(f["input"])
    loss = F.cross_entropy(logits, f["labels"])
    assert rel(logits, f["logits_train"]) <= 1e-4
    loss.backward()
    for k, p in net.named_parameters():
        assert rel(p.grad, f["grad." + k]) <= 1e-3, k
