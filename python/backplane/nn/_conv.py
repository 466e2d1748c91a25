"""Layers of convolutional networks (torch.nn names, argument order, initialisation and
state_dict keys): Conv2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, BatchNorm2d, Dropout,
ModuleList. The same initialisation draws as the C++ bp::nn layers, so one manual_seed gives the
same model in both and on every device."""
import math

from .. import _core
from .._runtime import no_grad
from . import functional as F


def _pair(v, what):
    if isinstance(v, int):
        return (v, v)
    v = tuple(v)
    if len(v) != 2 or not all(isinstance(x, int) for x in v):
        raise TypeError(f"{what} must be an int or a pair of ints, got {v!r}")
    return v


def _dev_dtype(device, dtype):
    dev = _core.device(device) if device is not None else _core.default_device()
    dt = _core._as_dtype(dtype) if dtype is not None else _core.dtype.float32
    return dev, dt


def _module_classes():
    from . import Module, Parameter  # defined before this file is imported
    return Module, Parameter


Module, Parameter = _module_classes()


class Conv2d(Module):
    """2-D cross-correlation over [N, C, H, W] (torch.nn.Conv2d). weight [out, in / groups,
    kH, kW] and bias [out] uniform in +-1/sqrt(fan_in) (kaiming_uniform_ with a=sqrt(5))."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, padding_mode="zeros", device=None, dtype=None):
        super().__init__()
        if padding_mode != "zeros":
            raise ValueError(f"Conv2d: padding_mode {padding_mode!r} is not supported "
                             "(only 'zeros')")
        if groups < 1 or in_channels < 1 or out_channels < 1:
            raise _core.ShapeError(f"Conv2d: in_channels ({in_channels}), out_channels "
                                   f"({out_channels}) and groups ({groups}) must be >= 1")
        if in_channels % groups or out_channels % groups:
            raise _core.ShapeError(f"Conv2d: in_channels ({in_channels}) and out_channels "
                                   f"({out_channels}) must be multiples of groups ({groups})")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _pair(kernel_size, "Conv2d: kernel_size")
        self.stride = _pair(stride, "Conv2d: stride")
        self.padding = _pair(padding, "Conv2d: padding")
        self.dilation = _pair(dilation, "Conv2d: dilation")
        if min(self.kernel_size) < 1 or min(self.stride) < 1 or min(self.dilation) < 1 \
                or min(self.padding) < 0:
            raise _core.ShapeError(f"Conv2d: kernel_size, stride and dilation must be >= 1 and "
                                   f"padding >= 0, got kernel_size={self.kernel_size}, stride="
                                   f"{self.stride}, dilation={self.dilation}, padding="
                                   f"{self.padding}")
        dev, dt = _dev_dtype(device, dtype)
        kh, kw = self.kernel_size
        bound = 1.0 / math.sqrt(in_channels // groups * kh * kw)
        self.weight = Parameter(_core._uniform([out_channels, in_channels // groups, kh, kw],
                                               -bound, bound, dev, dt))
        if bias:
            self.bias = Parameter(_core._uniform([out_channels], -bound, bound, dev, dt))
        else:
            self.register_parameter("bias", None)

    def forward(self, input):
        return F.conv2d(input, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)

    def extra_repr(self):
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}")
        if self.padding != (0, 0):
            s += f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s


class MaxPool2d(Module):
    """torch.nn.MaxPool2d (stride defaults to kernel_size); with return_indices the call gives
    (values, indices)."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False,
                 ceil_mode=False):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode

    def forward(self, input):
        return F.max_pool2d(input, self.kernel_size, self.stride, self.padding, self.dilation,
                            self.ceil_mode, self.return_indices)

    def extra_repr(self):
        stride = self.kernel_size if self.stride is None else self.stride
        return (f"kernel_size={self.kernel_size}, stride={stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Module):
    """torch.nn.AvgPool2d (divisor_override is not supported)."""

    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad

    def forward(self, input):
        return F.avg_pool2d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad)

    def extra_repr(self):
        stride = self.kernel_size if self.stride is None else self.stride
        return f"kernel_size={self.kernel_size}, stride={stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    """torch.nn.AdaptiveAvgPool2d."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, input):
        return F.adaptive_avg_pool2d(input, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"


class BatchNorm2d(Module):
    """torch.nn.BatchNorm2d: weight 1 and bias 0 (affine), buffers running_mean 0,
    running_var 1 and num_batches_tracked (int64, 0-d) when track_running_stats. momentum None
    is the cumulative average 1 / num_batches_tracked."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None):
        super().__init__()
        if num_features < 1:
            raise _core.ShapeError(f"BatchNorm2d: num_features must be >= 1, got {num_features}")
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        dev, dt = _dev_dtype(device, dtype)
        if affine:
            self.weight = Parameter(_core._full([num_features], 1.0, dev, dt))
            self.bias = Parameter(_core._full([num_features], 0.0, dev, dt))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", _core._full([num_features], 0.0, dev, dt))
            self.register_buffer("running_var", _core._full([num_features], 1.0, dev, dt))
            self.register_buffer("num_batches_tracked",
                                 _core._full([], 0.0, dev, _core.dtype.int64))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def forward(self, input):
        if input.ndim != 4:
            raise _core.ShapeError(f"BatchNorm2d: expected a 4-d input [N, C, H, W], got shape "
                                   f"{tuple(input.shape)}")
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            with no_grad():
                count = self.num_batches_tracked
                count.add_(_core._full([], 1.0, count.device, count.dtype))
            if self.momentum is None:
                factor = 1.0 / float(count.item())
        use_batch = self.training or self.running_mean is None
        track = not self.training or self.track_running_stats
        return F.batch_norm(input, self.running_mean if track else None,
                            self.running_var if track else None, self.weight, self.bias,
                            use_batch, factor, self.eps)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class Dropout(Module):
    """torch.nn.Dropout: zeroes elements with probability p in training (the Philox mask, the
    same on every device for one seed) and scales the rest by 1 / (1 - p)."""

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: probability p must be in [0, 1], got {p}")
        if inplace:
            raise ValueError("Dropout: inplace=True is not supported")
        self.p = p

    def forward(self, input):
        return F.dropout(input, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}, inplace=False"


class ModuleList(Module):
    """torch.nn.ModuleList: modules held in order under "0", "1", ...; not callable."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def append(self, module):
        if not isinstance(module, Module):
            raise TypeError(f"ModuleList: {type(module).__name__} is not a Module")
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules):
        for m in modules:
            self.append(m)
        return self

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, index):
        mods = list(self._modules.values())
        if isinstance(index, slice):
            return ModuleList(mods[index])
        try:
            return mods[index]
        except IndexError:
            raise IndexError(f"ModuleList: index {index} is out of range for {len(mods)} "
                             "modules") from None

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleList is not callable: run its modules from the owning "
                                  "module's forward()")
