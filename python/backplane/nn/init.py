"""In-place parameter initialisation (torch.nn.init), drawn from the Philox generator so one
manual_seed gives the same values on every device."""
import math

from .. import _core
from .._runtime import no_grad


def _fill_from(tensor, values):
    with no_grad():
        tensor.copy_(values)
    return tensor


def uniform_(tensor, a=0.0, b=1.0):
    return _fill_from(tensor, _core._uniform(list(tensor.shape), float(a), float(b),
                                             tensor.device, tensor.dtype))


def normal_(tensor, mean=0.0, std=1.0):
    values = _core._randn(list(tensor.shape), tensor.device, tensor.dtype) * float(std)
    return _fill_from(tensor, values + float(mean))


def constant_(tensor, val):
    with no_grad():
        tensor.fill_(float(val))
    return tensor


def zeros_(tensor):
    return constant_(tensor, 0.0)


def ones_(tensor):
    return constant_(tensor, 1.0)


def _fans(tensor):
    if tensor.ndim < 2:
        raise _core.ShapeError("xavier init needs a tensor with at least 2 dimensions, got "
                               f"shape {tuple(tensor.shape)}")
    receptive = 1
    for s in tensor.shape[2:]:
        receptive *= s
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def xavier_uniform_(tensor, gain=1.0):
    fan_in, fan_out = _fans(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound)


def xavier_normal_(tensor, gain=1.0):
    fan_in, fan_out = _fans(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))
