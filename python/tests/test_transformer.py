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
    assert tuple(out.shape) == (5, 2, 16) and tuple(weights.shape) == (2, 5, 7)
    out, weights = mha(bp.randn(5, 2, 16), bp.randn(7, 2, 16), bp.randn(7, 2, 16),
                       need_weights=False)
    assert tuple(out.shape) == (5, 2, 16) and weights is None
    with pytest.raises(bp.ShapeError, match=r"a 2-D attn_mask must be \[5, 7\] \(L, S\), got "
                                            r"\[5, 6\]"):
        mha(bp.randn(5, 2, 16), bp.randn(7, 2, 16), bp.randn(7, 2, 16),
            attn_mask=bp.zeros(5, 6, dtype=bp.bool))
    with pytest.raises(bp.ShapeError, match=r"key_padding_mask must be \[2, 7\], got \[7\]"):
        mha(bp.randn(5, 2, 16), bp.randn(7, 2, 16), bp.randn(7, 2, 16),
            key_padding_mask=bp.zeros(7, dtype=bp.bool))
    with pytest.raises(bp.DTypeError, match="attn_mask must be bool or floating, got backplane.int64"):
        mha(bp.randn(5, 2, 16), bp.randn(7, 2, 16), bp.randn(7, 2, 16),
            attn_mask=bp.zeros(5, 7, dtype=bp.int64))
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


def mha_reference(mha, q, k, v, attn_mask=None, key_padding_mask=None, causal=False,
                  average=True):
    """torch.nn.MultiheadAttention's forward in float64 NumPy (inputs [L, N, E]); bool masks
    are True where attention is not allowed, as PyTorch's MultiheadAttention takes them."""
    f64 = lambda t: t.detach().numpy().astype(np.float64)  # noqa: E731
    W, b = f64(mha.in_proj_weight), f64(mha.in_proj_bias)
    Wo, bo = f64(mha.out_proj.weight), f64(mha.out_proj.bias)
    E, H = mha.embed_dim, mha.num_heads
    D = E // H
    q, k, v = (x.transpose(1, 0, 2) for x in (q, k, v))  # [N, L, E]
    N, L, S = q.shape[0], q.shape[1], k.shape[1]

    def proj(x, part):
        y = x @ W[part * E:(part + 1) * E].T + b[part * E:(part + 1) * E]
        return y.reshape(N, -1, H, D).transpose(0, 2, 1, 3)

    s = proj(q, 0) @ proj(k, 1).transpose(0, 1, 3, 2) / math.sqrt(D)
    if attn_mask is not None:
        s = s + np.where(attn_mask, -np.inf, 0.0)
    if key_padding_mask is not None:
        s = s + np.where(key_padding_mask, -np.inf, 0.0)[:, None, None, :]
    if causal:
        s = s + np.triu(np.full((L, S), -np.inf), 1)
    w = softmax(s)
    o = (w @ proj(v, 2)).transpose(0, 2, 1, 3).reshape(N, L, E) @ Wo.T + bo
    return o.transpose(1, 0, 2), (w.mean(1) if average else w)


@pytest.mark.parametrize("case", ["plain", "attn_mask", "key_padding", "both", "causal"])
def test_multihead_attention_matches_pytorch_semantics(device, rng, case):
    """Output and weights of nn.MultiheadAttention against PyTorch's forward in float64, with
    PyTorch's bool-mask convention (True = may not attend: before, a bool attn_mask was passed
    to scaled_dot_product_attention, where True means the opposite); the fused path
    (need_weights=False) gives the same output."""
    need(device, "scaled_dot_product_attention", "triu")
    L, S, N, E, H = 5, 7, 3, 16, 4
    bp.manual_seed(int(rng.integers(1 << 31)))
    mha = nn.MultiheadAttention(E, H, device=device)
    with bp.no_grad():
        mha.in_proj_bias.copy_(bp.tensor(rng.standard_normal(3 * E).astype(np.float32) * 0.1)
                               .to(device))
        mha.out_proj.bias.copy_(bp.tensor(rng.standard_normal(E).astype(np.float32) * 0.1)
                                .to(device))
    q, k, v = (rng.standard_normal((n, N, E)).astype(np.float32) for n in (L, S, S))
    am = kpm = None
    if case in ("attn_mask", "both"):
        am = rng.random((L, S)) < 0.4
        am[:, 0] = False  # every query keeps a key
    if case in ("key_padding", "both"):
        kpm = rng.random((N, S)) < 0.4
        kpm[:, 0] = False
    on = lambda a: None if a is None else bp.tensor(a).to(device)  # noqa: E731
    args = dict(attn_mask=on(am), key_padding_mask=on(kpm), is_causal=case == "causal")
    tq, tk, tv = on(q), on(k), on(v)
    for average in (True, False):
        out, w = mha(tq, tk, tv, average_attn_weights=average, **args)
        ref_out, ref_w = mha_reference(mha, q, k, v, am, kpm, case == "causal", average)
        close(out, ref_out, scale=10)
        close(w, ref_w, scale=10)
        assert tuple(w.shape) == ((N, L, S) if average else (N, H, L, S))
    fused, none = mha(tq, tk, tv, need_weights=False, **args)
    assert none is None
    close(fused, ref_out, scale=10)
    if am is not None:  # masked positions have no weight at all
        assert np.all(w.numpy()[:, :, am] == 0)
    # Unbatched: [L, E] in, [L, S] weights out.
    out1, w1 = mha(on(q[:, 0]), on(k[:, 0]), on(v[:, 0]), attn_mask=on(am),
                   key_padding_mask=None if kpm is None else on(kpm[0]),
                   is_causal=case == "causal")
    ref1, refw1 = mha_reference(mha, q[:, :1], k[:, :1], v[:, :1], am,
                                None if kpm is None else kpm[:1], case == "causal")
    close(out1, ref1[:, 0], scale=10)
    close(w1, refw1[0], scale=10)


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
