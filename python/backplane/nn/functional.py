"""Functional forms of the layers and losses (torch.nn.functional)."""
from .. import _core
from .._core import Tensor

relu = _core.relu
sigmoid = _core.sigmoid
tanh = _core.tanh


def linear(input, weight, bias=None):
    """input @ weight.T + bias, with weight [out, in] and bias [out]: one fused op (the bias
    added in the product's epilogue where the device can). input, weight and bias share a
    dtype (DTypeError otherwise; under autocast all three run in the lower dtype)."""
    return _core.linear(input, weight, bias)


def softmax(input, dim=-1):
    """exp(x - max) / sum(exp(x - max)) along `dim` (one stable op, catalogue softmax)."""
    return _core.softmax(input, dim)


def log_softmax(input, dim=-1):
    """x - max - log(sum(exp(x - max))) along `dim` (one stable op, catalogue log_softmax)."""
    return _core.log_softmax(input, dim)


conv2d = _core.conv2d
layer_norm = _core.layer_norm
gelu = _core.gelu
silu = _core.silu
embedding = _core.embedding
scaled_dot_product_attention = _core.scaled_dot_product_attention
avg_pool2d = _core.avg_pool2d
adaptive_avg_pool2d = _core.adaptive_avg_pool2d
batch_norm = _core.batch_norm
dropout = _core.dropout


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """torch.nn.functional.max_pool2d; with return_indices the positions h * W + w too."""
    return _core.max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode,
                            return_indices)


def _reduce(loss, reduction, what):
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"{what}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def mse_loss(input, target, reduction="mean"):
    """(input - target)^2, averaged (reduction='mean'), summed ('sum') or per element
    ('none'). The shapes must be equal (ShapeError otherwise)."""
    if reduction == "mean":
        return _core.mse_loss(input, target)
    if tuple(input.shape) != tuple(target.shape):
        raise _core.ShapeError(f"mse_loss: input of shape {tuple(input.shape)} and target of "
                               f"shape {tuple(target.shape)} differ")
    return _reduce((input - target) ** 2, reduction, "mse_loss")


def cross_entropy(input, target, reduction="mean", *, ignore_index=-100, label_smoothing=0.0):
    """torch.nn.functional.cross_entropy over class indices: input [N, C] (or [N, C, d1, ...])
    logits, target [N] (or [N, d1, ...]) int64/int32 classes. Per row
    -(1 - e) log softmax(input)[target] - (e / C) sum log softmax(input) with
    e = label_smoothing; rows whose target is ignore_index add nothing. reduction 'mean'
    (over the rows not ignored), 'sum' or 'none'. One fused op forward and backward where the
    device has it (the logits read in their own dtype, also under autocast); a class outside
    [0, C) that is not ignore_index is an IndexError."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got "
                         f"{reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got "
                         f"{label_smoothing!r}")
    return _core.cross_entropy(input, target, reduction, ignore_index, label_smoothing)


__all__ = ["Tensor", "relu", "sigmoid", "tanh", "linear", "softmax", "log_softmax", "mse_loss",
           "cross_entropy", "conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
           "batch_norm", "dropout"]
