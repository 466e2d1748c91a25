"""Autograd: requires_grad, backward, grad, no_grad, against analytic float64 gradients."""
import numpy as np
import pytest

import backplane as bp
from conftest import tol


def leaf(a, device, dtype=bp.float32):
    return bp.tensor(a, dtype=dtype, device=device, requires_grad=True)


def close(t, ref, dtype=bp.float32):
    rtol, atol = tol(dtype)
    np.testing.assert_allclose(t.numpy().astype(np.float64), ref, rtol=rtol * 10,
                               atol=atol * 10)


def test_elementwise_and_broadcast_gradients(device, rng):
    a = rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    w = rng.uniform(-1, 1, (1, 4)).astype(np.float32)
    x, y = leaf(a, device), leaf(w, device)
    out = ((x.exp() * y + x ** 2) / 2).sum()
    assert out.requires_grad and not out.is_leaf and x.is_leaf
    out.backward()
    A, W = a.astype(np.float64), w.astype(np.float64)
    close(x.grad, (np.exp(A) * W + 2 * A) / 2)
    close(y.grad, (np.exp(A) / 2).sum(0, keepdims=True))
    assert x.grad.device is device and x.grad.shape == x.shape


def test_matmul_mean_relu_and_views(device, rng):
    a = rng.uniform(-1, 1, (5, 3)).astype(np.float32)
    w = rng.uniform(-1, 1, (3, 2)).astype(np.float32)
    x, m = leaf(a, device), leaf(w, device)
    h = (x @ m).relu()
    loss = h[1:, :].mean() + x.T[0].sum()
    loss.backward()
    A, W = a.astype(np.float64), w.astype(np.float64)
    mask = (A @ W > 0).astype(np.float64)
    dh = np.zeros((5, 2))
    dh[1:] = 1.0 / 8
    dh *= mask
    gx = dh @ W.T
    gx[:, 0] += 1
    close(x.grad, gx)
    close(m.grad, A.T @ dh)


def test_explicit_seed_gradient_and_grad_assignment(device):
    x = leaf([1.0, 2.0, 3.0], device)
    (x * 3).backward(bp.tensor([1.0, 0.5, 2.0], device=device))
    assert x.grad.tolist() == [3.0, 1.5, 6.0]
    x.grad = None
    assert x.grad is None
    with pytest.raises(bp.Error, match="requires"):
        bp.ones(2, device=device).sum().backward()


def test_no_grad_as_context_and_decorator(device):
    x = leaf([1.0, 2.0], device)
    assert bp.is_grad_enabled()
    with bp.no_grad():
        assert not bp.is_grad_enabled()
        y = x * 2
    assert bp.is_grad_enabled() and not y.requires_grad

    @bp.no_grad()
    def f(t):
        return t * 2

    assert not f(x).requires_grad and bp.is_grad_enabled()
    d = x.detach()
    assert not d.requires_grad and d.shares_storage(x)
    x.requires_grad = False
    assert not x.requires_grad
    assert x.requires_grad_() is x and x.requires_grad
