"""The transformer family from Python: torch.nn.functional-style functions against NumPy
float64 references, gradients against central differences, the layers' state_dict keys, the
refusals, and a GPT that learns a periodic sequence."""
import math

import numpy as np
import pytest

import backplane as bp
from backplane import nn
from backplane.nn import functional as F

from conftest import tol

OPS = ("layer_norm", "gelu", "silu", "embedding", "scaled_dot_product_attention", "triu", "tril",
       "cumsum", "sin", "cos", "rsqrt")


def need(device, *ops):
    if not all(device.supports(op, bp.float32) for op in ops):
        pytest.skip(f"{device} lacks one of {ops}")


def close(t, ref, dtype=bp.float32, scale=1.0):
    rtol, atol = tol(dtype)
    np.testing.assert_allclose(t.numpy().astype(np.float64), ref, rtol=rtol * scale,
                               atol=atol * scale * max(1.0, float(np.abs(ref).max())))


def softmax(s):
    m = s.max(-1, keepdims=True)
    e = np.exp(s - m)
    return e / e.sum(-1, keepdims=True)


def test_functions_match_numpy(device, rng):
    need(device, *OPS)
    x = rng.uniform(-3, 3, (4, 6, 32))
    w, b = rng.uniform(0.5, 2, 32), rng.uniform(-1, 1, 32)
    t = bp.tensor(x, device=device)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    ref = (x - mean) / np.sqrt(var + 1e-5) * w + b
    close(F.layer_norm(t, (32,), bp.tensor(w, device=device), bp.tensor(b, device=device)), ref,
          scale=4)
    erf = np.vectorize(math.erf)
    close(F.gelu(t), 0.5 * x * (1 + erf(x / math.sqrt(2))))
    close(F.gelu(t, approximate="tanh"),
          0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))))
    close(F.silu(t), x / (1 + np.exp(-x)))
    close(bp.triu(t, 1), np.triu(x, 1))
    close(bp.tril(t), np.tril(x))
    close(bp.cumsum(t, 1), np.cumsum(x, 1), scale=8)
    close(bp.sin(t), np.sin(x))
    close(t.cos(), np.cos(x))
    close(bp.rsqrt(t.abs() + 0.5), 1 / np.sqrt(np.abs(x) + 0.5))
    mask = x > 0
    close(t.masked_fill(bp.tensor(mask, device=device), -2.0), np.where(mask, -2.0, x))
    table = rng.uniform(-1, 1, (10, 5))
    idx = rng.integers(0, 10, (3, 7))
    close(F.embedding(bp.tensor(idx, device=device), bp.tensor(table, device=device)), table[idx])


@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_numpy(device, rng, causal):
    need(device, "scaled_dot_product_attention")
    q, k, v = (rng.uniform(-1, 1, (2, 3, 9, 8)) for _ in range(3))
    s = q @ k.swapaxes(-1, -2) / math.sqrt(8)
    if causal:
        s = np.where(np.tril(np.ones((9, 9), bool)), s, -np.inf)
    ref = softmax(s) @ v
    got = F.scaled_dot_product_attention(*(bp.tensor(a, device=device) for a in (q, k, v)),
                                         is_causal=causal)
    close(got, ref, scale=4)
    # A boolean attn_mask (True keeps) runs the composite and agrees.
    keep = rng.uniform(size=(9, 9)) > 0.3
    keep[:, 0] = True
    ref = softmax(np.where(keep, q @ k.swapaxes(-1, -2) / math.sqrt(8), -np.inf)) @ v
    got = F.scaled_dot_product_attention(*(bp.tensor(a, device=device) for a in (q, k, v)),
                                         attn_mask=bp.tensor(keep, device=device))
    close(got, ref, scale=4)


def test_gradients_flow_through_the_fused_ops(rng):
    cpu = bp.device("cpu:0")
    x = bp.tensor(rng.uniform(-1, 1, (2, 2, 5, 4)), dtype=bp.float64, device=cpu,
                  requires_grad=True)
    y = F.scaled_dot_product_attention(x, x, x, is_causal=True)
    y = F.layer_norm(F.gelu(y), (4,))
    y.sum().backward()
    g = x.grad.numpy()
    # Central differences of the same function.
    def f(a):
        t = bp.tensor(a, dtype=bp.float64, device=cpu)
        return F.layer_norm(F.gelu(F.scaled_dot_product_attention(t, t, t, is_causal=True)),
                            (4,)).sum().item()
    a = x.detach().numpy().copy()
    for i in [(0, 0, 0, 0), (1, 1, 4, 3), (0, 1, 2, 1)]:
        e = np.zeros_like(a)
        e[i] = 1e-6
        fd = (f(a + e) - f(a - e)) / 2e-6
        assert abs(fd - g[i]) < 1e-6 * max(1, abs(fd)), (i, fd, g[i])


def test_layers_and_refusals():
    mha = nn.MultiheadAttention(16, 4)
    assert sorted(mha.state_dict()) == ["in_proj_bias", "in_proj_weight", "out_proj.bias",
                                        "out_proj.weight"]
    out, weights = mha(bp.randn(5, 2, 16), bp.randn(7, 2, 16), bp.randn(7, 2, 16))
    assert tuple(out.shape) == (5, 2, 16) and weights is None
    ln = nn.LayerNorm(8)
    assert sorted(ln.state_dict()) == ["bias", "weight"]
    assert tuple(nn.Embedding(10, 3).weight.shape) == (10, 3)
    assert "tanh" in repr(nn.GELU("tanh"))
    with pytest.raises(bp.IndexError, match="index 10"):
        F.embedding(bp.tensor([1, 10], dtype=bp.int64), bp.zeros(10, 3))
    with pytest.raises(IndexError):
        F.embedding(bp.tensor([-1], dtype=bp.int64), bp.zeros(10, 3))
    with pytest.raises(bp.DTypeError, match="indices must be int64, got f32"):
        F.embedding(bp.tensor([1.0]), bp.zeros(10, 3))
    with pytest.raises(bp.ShapeError, match=r"query \[2x4x8x16\], key \[2x4x8x12\]"):
        F.scaled_dot_product_attention(bp.zeros(2, 4, 8, 16), bp.zeros(2, 4, 8, 12),
                                       bp.zeros(2, 4, 8, 16))
    with pytest.raises(bp.ShapeError, match="must end in normalized_shape"):
        F.layer_norm(bp.zeros(2, 5), (4,))
    with pytest.raises(bp.DTypeError, match="mask must be bool"):
        bp.zeros(3).masked_fill(bp.zeros(3), 1.0)


def test_gpt_trains_and_has_nanogpt_keys():
    cfg = bp.models.GPTConfig(block_size=16, vocab_size=11, n_layer=2, n_head=2, n_embd=32)
    bp.manual_seed(3)
    gpt = bp.models.GPT(cfg)
    keys = set(gpt.state_dict())
    for k in ("transformer.wte.weight", "transformer.wpe.weight", "transformer.h.1.ln_2.bias",
              "transformer.h.0.attn.c_attn.weight", "transformer.h.0.mlp.c_proj.weight",
              "transformer.ln_f.weight"):
        assert k in keys, k
    seq = (np.arange(8)[:, None] + np.arange(17)[None, :]) % 5
    x, y = bp.tensor(seq[:, :16]), bp.tensor(seq[:, 1:])
    opt = bp.optim.Adam(gpt.parameters(), lr=3e-3)
    losses = []
    for _ in range(60):
        loss = F.cross_entropy(gpt(x).reshape(-1, 11), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 1.5 and losses[-1] < 0.2, losses[::10]
