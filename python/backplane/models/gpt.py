"""The GPT of nanoGPT (Karpathy's model.py): token and position embeddings, pre-norm blocks of
causal self-attention and a GELU MLP, a final LayerNorm and an output head tied to the token
embedding. state_dict keys are nanoGPT's (transformer.wte.weight, transformer.h.0.attn.c_attn.
weight, ...; lm_head.weight is the tied token embedding and is not stored twice). The C++
bp::nn::GPT (nn_transformer.hpp) is the same model, drawn in the same order, so one manual_seed
gives the same weights in both."""
import math
from dataclasses import dataclass

from .. import _core, nn
from .._runtime import no_grad
from ..nn import functional as F
from ..nn._transformer import _normal


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True
    gelu_approximate: str = "none"  # the MLP's GELU; "tanh" is GPT-2's (C++ GPTConfig)


def _linear(n_in, n_out, bias, std, dev, dt):
    lin = nn.Linear(n_in, n_out, bias=bias, device=dev, dtype=dt)
    with no_grad():
        lin.weight.copy_(_normal((n_out, n_in), std, dev, dt))
        if bias:
            lin.bias.copy_(_core._full([n_out], 0.0, dev, dt))
    return lin


class _Holder(nn.Module):
    """Holds named children (nanoGPT's nn.ModuleDict); not callable."""

    def forward(self, *args):
        raise RuntimeError("transformer is not callable: GPT runs its children")


class CausalSelfAttention(nn.Module):
    def __init__(self, c, dev, dt):
        super().__init__()
        self.n_head, self.dropout = c.n_head, c.dropout
        proj_std = 0.02 / math.sqrt(2 * c.n_layer)
        self.c_attn = _linear(c.n_embd, 3 * c.n_embd, c.bias, 0.02, dev, dt)
        self.c_proj = _linear(c.n_embd, c.n_embd, c.bias, proj_std, dev, dt)

    def forward(self, x):
        B, T, C = x.shape
        qkv = self.c_attn(x)

        def head(part):
            return qkv[:, :, part * C:(part + 1) * C].reshape(B, T, self.n_head,
                                                              C // self.n_head).transpose(1, 2)

        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(head(0), head(1), head(2), None, p, True)
        y = self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return F.dropout(y, self.dropout, self.training)


class MLP(nn.Module):
    def __init__(self, c, dev, dt):
        super().__init__()
        self.dropout, self.approximate = c.dropout, c.gelu_approximate
        self.c_fc = _linear(c.n_embd, 4 * c.n_embd, c.bias, 0.02, dev, dt)
        self.c_proj = _linear(4 * c.n_embd, c.n_embd, c.bias, 0.02 / math.sqrt(2 * c.n_layer),
                              dev, dt)

    def forward(self, x):
        h = F.gelu(self.c_fc(x), approximate=self.approximate)
        return F.dropout(self.c_proj(h), self.dropout, self.training)


class Block(nn.Module):
    def __init__(self, c, dev, dt):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c.n_embd, bias=c.bias, device=dev, dtype=dt)
        self.attn = CausalSelfAttention(c, dev, dt)
        self.ln_2 = nn.LayerNorm(c.n_embd, bias=c.bias, device=dev, dtype=dt)
        self.mlp = MLP(c, dev, dt)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """logits [B, T, vocab_size] for int64 tokens [B, T] (T <= block_size)."""

    def __init__(self, config, device=None, dtype=None):
        super().__init__()
        c = self.config = config
        if c.n_embd % c.n_head or min(c.vocab_size, c.block_size, c.n_head, c.n_embd) < 1:
            raise _core.ShapeError(f"GPT: sizes must be >= 1 and n_embd ({c.n_embd}) a multiple "
                                   f"of n_head ({c.n_head})")
        if c.gelu_approximate not in ("none", "tanh"):
            raise _core.Error(f"GPT: gelu_approximate must be \"none\" or \"tanh\", got "
                              f"{c.gelu_approximate!r}")
        dev = _core.device(device) if device is not None else _core.default_device()
        dt = _core._as_dtype(dtype) if dtype is not None else _core.dtype.float32
        t = _Holder()
        t.wte = nn.Embedding(c.vocab_size, c.n_embd, device=dev, dtype=dt)
        t.wpe = nn.Embedding(c.block_size, c.n_embd, device=dev, dtype=dt)
        with no_grad():
            t.wte.weight.copy_(_normal((c.vocab_size, c.n_embd), 0.02, dev, dt))
            t.wpe.weight.copy_(_normal((c.block_size, c.n_embd), 0.02, dev, dt))
        t.h = nn.ModuleList([Block(c, dev, dt) for _ in range(c.n_layer)])
        t.ln_f = nn.LayerNorm(c.n_embd, bias=c.bias, device=dev, dtype=dt)
        self.transformer = t

    def forward(self, idx):
        if idx.ndim != 2:
            raise _core.ShapeError(f"GPT: tokens must be [B, T] int64, got {tuple(idx.shape)}")
        T = idx.shape[1]
        if T > self.config.block_size:
            raise _core.ShapeError(f"GPT: sequence length {T} exceeds block_size "
                                   f"{self.config.block_size}")
        t = self.transformer
        pos = _core._arange(T, idx.device, _core.dtype.int64)
        x = F.dropout(t.wte(idx) + t.wpe(pos), self.config.dropout, self.training)
        for block in t.h:
            x = block(x)
        x = t.ln_f(x)
        # The head tied to the token embedding as linear(x, wte), as the C++ GPT: under autocast
        # the dense [V, C] weight is cast (a transposed view cast element by element took 0.3 ms
        # of a GPT-2 step), and its gradient is [V, C] as the embedding's, with no transposed add.
        return F.linear(x, t.wte.weight)

    def num_params(self):
        """Parameters without the position embedding (nanoGPT's get_num_params())."""
        return sum(p.numel() for k, p in self.named_parameters()
                   if k != "transformer.wpe.weight")
