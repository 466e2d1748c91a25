"""Layers of transformers (torch.nn names, argument order, initialisation and state_dict keys):
LayerNorm, Embedding, GELU, MultiheadAttention. The same initialisation draws as the C++ bp::nn
layers (nn_transformer.hpp), so one manual_seed gives the same model in both and on every
device."""
import math

from .. import _core
from .._runtime import no_grad
from . import functional as F
from ._conv import Module, Parameter, _dev_dtype
from . import Linear


def _normal(shape, std, dev, dt):
    """N(0, std) drawn in f32 from the default Philox generator, then cast (as the C++ layers)."""
    with no_grad():
        return (_core._randn(list(shape), dev, _core.dtype.float32) * std).to(dt)


class LayerNorm(Module):
    """Normalisation over the trailing normalized_shape (torch.nn.LayerNorm): weight ones, bias
    zeros when elementwise_affine."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 device=None, dtype=None):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(d) for d in normalized_shape)
        if not self.normalized_shape or min(self.normalized_shape) < 1:
            raise _core.ShapeError(f"LayerNorm: normalized_shape {self.normalized_shape} needs "
                                   "one dimension or more, each >= 1")
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        dev, dt = _dev_dtype(device, dtype)
        shape = list(self.normalized_shape)
        if elementwise_affine:
            self.weight = Parameter(_core._full(shape, 1.0, dev, dt))
            if bias:
                self.bias = Parameter(_core._full(shape, 0.0, dev, dt))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, input):
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class Embedding(Module):
    """A lookup table weight [num_embeddings, embedding_dim] drawn from N(0, 1)
    (torch.nn.Embedding); an index outside [0, num_embeddings) is an IndexError."""

    def __init__(self, num_embeddings, embedding_dim, device=None, dtype=None):
        super().__init__()
        if num_embeddings < 0 or embedding_dim < 0:
            raise _core.ShapeError(f"Embedding: sizes must be non-negative, got num_embeddings="
                                   f"{num_embeddings}, embedding_dim={embedding_dim}")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        dev, dt = _dev_dtype(device, dtype)
        self.weight = Parameter(_normal((num_embeddings, embedding_dim), 1.0, dev, dt))

    def forward(self, input):
        return F.embedding(input, self.weight)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}"


class GELU(Module):
    """torch.nn.GELU(approximate='none' | 'tanh')."""

    def __init__(self, approximate="none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention with kdim = vdim = embed_dim: in_proj_weight [3E, E]
    (xavier_uniform_), in_proj_bias [3E] (zeros), out_proj a Linear(E, E) with a zero bias.

    forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False) returns (output, weights) as PyTorch does:
    - attn_mask [L, S] or [N * num_heads, L, S]: bool True means "may not attend" (PyTorch's
      MultiheadAttention convention, the opposite of scaled_dot_product_attention's), a float
      mask is added to the scores;
    - key_padding_mask [N, S] ([S] unbatched): bool True ignores that key, float is added;
    - is_causal without a mask masks the future (PyTorch requires the mask as well);
    - need_weights=True computes the attention explicitly and returns the weights after
      dropout, [N, L, S] averaged over heads (average_attn_weights) or [N, num_heads, L, S];
      need_weights=False uses the fused scaled_dot_product_attention and returns None."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None):
        super().__init__()
        if add_bias_kv or add_zero_attn or kdim not in (None, embed_dim) \
                or vdim not in (None, embed_dim):
            raise NotImplementedError("MultiheadAttention: add_bias_kv, add_zero_attn and "
                                      "kdim/vdim other than embed_dim are not supported")
        if embed_dim < 1 or num_heads < 1 or embed_dim % num_heads:
            raise _core.ShapeError(f"MultiheadAttention: embed_dim ({embed_dim}) must be a "
                                   f"positive multiple of num_heads ({num_heads})")
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, dropout
        self.batch_first = batch_first
        dev, dt = _dev_dtype(device, dtype)
        bound = math.sqrt(6.0 / (4 * embed_dim))
        self.in_proj_weight = Parameter(_core._uniform([3 * embed_dim, embed_dim], -bound, bound,
                                                       dev, dt))
        if bias:
            self.in_proj_bias = Parameter(_core._full([3 * embed_dim], 0.0, dev, dt))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, device=dev, dtype=dt)
        if bias:
            with no_grad():
                self.out_proj.bias.copy_(_core._full([embed_dim], 0.0, dev, dt))

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        r = query.ndim
        if r not in (2, 3) or key.ndim != r or value.ndim != r:
            raise _core.ShapeError(f"MultiheadAttention: query {tuple(query.shape)}, key "
                                   f"{tuple(key.shape)} and value {tuple(value.shape)} must all "
                                   "be [L, N, E] ([N, L, E] with batch_first) or [L, E]")
        unbatched = r == 2

        def to_nle(t):
            if unbatched:
                return t.unsqueeze(0)
            return t if self.batch_first else t.transpose(0, 1)

        q, k, v = to_nle(query), to_nle(key), to_nle(value)
        E, H = self.embed_dim, self.num_heads
        N, L, S = q.shape[0], q.shape[1], k.shape[1]
        w, b = self.in_proj_weight, self.in_proj_bias

        def proj(x, part, length):
            y = x.matmul(w[part * E:(part + 1) * E].t())
            if b is not None:
                y = y + b[part * E:(part + 1) * E]
            return y.reshape(N, length, H, E // H).transpose(1, 2)

        mask = self._additive_mask(attn_mask, key_padding_mask, q, N, L, S, unbatched)
        qh, kh, vh = proj(q, 0, L), proj(k, 1, S), proj(v, 2, S)
        p = self.dropout if self.training else 0.0
        causal = is_causal and mask is None
        weights = None
        if need_weights:
            if causal:  # -inf above the diagonal, as scaled_dot_product_attention's is_causal
                mask = _core.triu(_core._full([L, S], -math.inf, q.device, q.dtype), 1)
            scores = qh.matmul(kh.transpose(-2, -1)) * (1.0 / math.sqrt(E // H))
            if mask is not None:
                scores = scores + mask
            weights = F.softmax(scores, -1)
            if p > 0.0:
                weights = F.dropout(weights, p)
            o = weights.matmul(vh)
            if average_attn_weights:
                weights = weights.mean(1)
            if unbatched:
                weights = weights.squeeze(0)
        else:
            o = F.scaled_dot_product_attention(qh, kh, vh, mask, p, causal)
        y = self.out_proj(o.transpose(1, 2).reshape(N, L, E))
        if unbatched:
            y = y.squeeze(0)
        elif not self.batch_first:
            y = y.transpose(0, 1)
        return y, weights

    def _additive_mask(self, attn_mask, key_padding_mask, q, N, L, S, unbatched):
        """attn_mask and key_padding_mask as one float mask added to the scores ([L, S],
        [N, H, L, S] or [N, 1, 1, S] and their sum), or None."""
        H = self.num_heads

        def additive(m, what):
            if m.dtype == _core.dtype.bool:
                return _core._full(list(m.shape), 0.0, q.device, q.dtype).masked_fill(
                    m, -math.inf)
            if not m.dtype.is_floating_point:
                raise _core.DTypeError(f"MultiheadAttention: {what} must be bool or floating, "
                                       f"got {m.dtype}")
            return m.to(q.dtype)

        out = None
        if attn_mask is not None:
            m = additive(attn_mask, "attn_mask")
            if m.ndim == 3:
                if tuple(m.shape) != (N * H, L, S):
                    raise _core.ShapeError(f"MultiheadAttention: a 3-D attn_mask must be "
                                           f"[{N * H}, {L}, {S}] (N * num_heads, L, S), got "
                                           f"{list(m.shape)}")
                m = m.reshape(N, H, L, S)
            elif tuple(m.shape) != (L, S):
                raise _core.ShapeError(f"MultiheadAttention: a 2-D attn_mask must be [{L}, {S}] "
                                       f"(L, S), got {list(m.shape)}")
            out = m
        if key_padding_mask is not None:
            want = (S,) if unbatched else (N, S)
            if tuple(key_padding_mask.shape) != want:
                raise _core.ShapeError(f"MultiheadAttention: key_padding_mask must be "
                                       f"{list(want)}, got {list(key_padding_mask.shape)}")
            m = additive(key_padding_mask, "key_padding_mask").reshape(N, 1, 1, S)
            out = m if out is None else out + m
        return out

    def extra_repr(self):
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}"
