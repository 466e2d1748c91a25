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


def _fan_in_out(tensor):
    if tensor.ndim < 2:
        raise _core.ShapeError("fan in and fan out need a tensor with at least 2 dimensions, "
                               f"got shape {tuple(tensor.shape)}")
    return _fans(tensor)


def calculate_gain(nonlinearity, param=None):
    """torch.nn.init.calculate_gain for the linear, relu and leaky_relu families."""
    if nonlinearity in ("linear", "conv1d", "conv2d", "conv3d", "sigmoid"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1 + slope * slope))
    raise ValueError(f"calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def kaiming_uniform_(tensor, a=0.0, mode="fan_in", nonlinearity="leaky_relu"):
    """torch.nn.init.kaiming_uniform_: uniform in +-gain * sqrt(3 / fan)."""
    fan_in, fan_out = _fan_in_out(tensor)
    fan = fan_in if mode == "fan_in" else fan_out
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / fan)
    return uniform_(tensor, -bound, bound)


def kaiming_normal_(tensor, a=0.0, mode="fan_in", nonlinearity="leaky_relu"):
    """torch.nn.init.kaiming_normal_: normal with std gain / sqrt(fan)."""
    fan_in, fan_out = _fan_in_out(tensor)
    fan = fan_in if mode == "fan_in" else fan_out
    return normal_(tensor, 0.0, calculate_gain(nonlinearity, a) / math.sqrt(fan))
