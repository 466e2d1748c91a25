"""torch.* functions of the convolutional family (C++ functions.hpp): max/min along a dim with
indices (torch.return_types-like named tuples), argmax/argmin, gather, scatter_add, clamp,
var/std, softmax/log_softmax, triu/tril, cumsum, masked_fill, sin/cos/rsqrt; also bound as Tensor methods with PyTorch's names."""
from collections import namedtuple

from . import _core
from ._core import Tensor


class return_types:  # noqa: N801  (torch.return_types)
    """The named tuples of functions that return values and indices."""
    max = namedtuple("max", ["values", "indices"])
    min = namedtuple("min", ["values", "indices"])


_tensor_max = Tensor.max
_tensor_min = Tensor.min


def _axis(dim, keepdim, axis, keepdims):
    if axis is not None:
        if dim is not None:
            raise TypeError("give dim or axis, not both")
        dim = axis
    return dim, bool(keepdim or keepdims)


def max(input, dim=None, keepdim=False, *, axis=None, keepdims=False):  # noqa: A001
    """torch.max: the largest value (dim None), (values, indices) along an int dim, the
    largest values over a tuple of dims, or the elementwise maximum with another tensor.
    NumPy's axis= and keepdims= are accepted too."""
    dim, keepdim = _axis(dim, keepdim, axis, keepdims)
    if isinstance(dim, Tensor):
        return _core.maximum(input, dim)
    if isinstance(dim, int):
        return return_types.max(*_core._max_dim(input, dim, keepdim))
    return _tensor_max(input, dim, keepdim)


def min(input, dim=None, keepdim=False, *, axis=None, keepdims=False):  # noqa: A001
    """torch.min, as max."""
    dim, keepdim = _axis(dim, keepdim, axis, keepdims)
    if isinstance(dim, Tensor):
        return _core.minimum(input, dim)
    if isinstance(dim, int):
        return return_types.min(*_core._min_dim(input, dim, keepdim))
    return _tensor_min(input, dim, keepdim)


argmax = _core.argmax
argmin = _core.argmin
gather = _core.gather
scatter_add = _core.scatter_add
clamp = _core.clamp
clip = _core.clamp
var = _core.var
std = _core.std
softmax = _core.softmax
log_softmax = _core.log_softmax
triu = _core.triu
tril = _core.tril
cumsum = _core.cumsum
masked_fill = _core.masked_fill
sin = _core.sin
cos = _core.cos
rsqrt = _core.rsqrt


def _method(fn):
    def method(self, *args, **kwargs):
        return fn(self, *args, **kwargs)

    method.__name__ = fn.__name__
    method.__doc__ = fn.__doc__
    return method


for _name, _fn in {"max": max, "min": min, "argmax": argmax, "argmin": argmin, "gather": gather,
                   "scatter_add": scatter_add, "clamp": clamp, "clip": clamp, "var": var,
                   "std": std, "softmax": softmax, "log_softmax": log_softmax, "triu": triu,
                   "tril": tril, "cumsum": cumsum, "masked_fill": masked_fill, "sin": sin,
                   "cos": cos, "rsqrt": rsqrt}.items():
    setattr(Tensor, _name, _method(_fn))

def _device_supports(self, op, dtype=_core.dtype.float32):
    """Whether this device has catalogue op `op` (a name such as "conv2d") for `dtype`."""
    return _core._supports(self, op, dtype)


_core.Device.supports = _device_supports

__all__ = ["return_types", "max", "min", "argmax", "argmin", "gather", "scatter_add", "clamp",
           "clip", "var", "std", "softmax", "log_softmax", "triu", "tril", "cumsum",
           "masked_fill", "sin", "cos", "rsqrt"]
