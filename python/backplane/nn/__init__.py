"""Neural-network modules in the manner of torch.nn: Module with named parameters, buffers and
children, Linear / LazyLinear, activations, Sequential, losses.

Note [Module state in Python]
  Attributes holding a Parameter become parameters, attributes holding a Module become
  children, register_buffer adds buffers; keys follow PyTorch's state_dict ("0.weight",
  "block.0.bias"), so files written here load into the PyTorch model of the same structure and
  the other way round (backplane.save / backplane.load, safetensors).
  - to(device) / to(dtype) move every parameter and buffer in place (Tensor._set_data, like
    PyTorch's `param.data = fn(param.data)`), with its gradient: the Parameter objects stay
    the same, so an optimiser built before the move keeps updating the model (build it after
    a LazyLinear has run once, though: until then it has no parameters).
  - load_state_dict copies the given values into the existing parameters, on the parameters'
    devices (like PyTorch); an uninitialised LazyLinear takes the shapes, values and devices of
    the given tensors. Everything is checked before anything changes.
"""
from collections import OrderedDict, namedtuple
import math

from .. import _core
from .._core import Tensor
from .._runtime import no_grad
from . import functional, init, utils
from .functional import cross_entropy, mse_loss  # noqa: F401


class Parameter(Tensor):
    """A tensor that a Module registers as a parameter: a leaf that requires grad and shares
    memory with the tensor it was made from."""

    __slots__ = ()

    def __init__(self, data, requires_grad=True):
        super().__init__(data.detach())
        self.requires_grad_(requires_grad)


LoadResult = namedtuple("LoadResult", ["missing_keys", "unexpected_keys"])


class Module:
    """Base class of every layer and model (torch.nn.Module). Note [Module state in Python]."""

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_lazy", OrderedDict())  # name -> shape pattern (-1 = unknown)
        object.__setattr__(self, "training", True)

    # ---- attributes ----
    def __setattr__(self, name, value):
        params = self.__dict__.get("_parameters")
        if params is None:
            raise AttributeError("Module.__init__() must run before attributes are assigned "
                                 "(call super().__init__() first)")
        if isinstance(value, Parameter):
            self._forget(name)
            params[name] = value
            self._lazy.pop(name, None)
        elif isinstance(value, Module):
            self._forget(name)
            self._modules[name] = value
        elif name in params:
            if value is not None:
                raise TypeError(f"cannot assign {type(value).__name__} to parameter '{name}' "
                                "(a Parameter or None is expected)")
            params[name] = None
        elif name in self._buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign {type(value).__name__} to buffer '{name}' "
                                "(a Tensor or None is expected)")
            self._buffers[name] = value
        elif name in self._modules:
            if value is not None:
                raise TypeError(f"cannot assign {type(value).__name__} to child module "
                                f"'{name}' (a Module or None is expected)")
            self._modules[name] = None
        else:
            object.__setattr__(self, name, value)

    def _forget(self, name):
        self.__dict__.pop(name, None)
        for d in (self._parameters, self._buffers, self._modules):
            d.pop(name, None)

    def __getattr__(self, name):
        d = self.__dict__
        for key in ("_parameters", "_buffers", "_modules"):
            if key in d and name in d[key]:
                return d[key][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for d in (self._parameters, self._buffers, self._modules):
            if name in d:
                del d[name]
                return
        object.__delattr__(self, name)

    def register_parameter(self, name, param):
        """Adds a parameter (a Parameter, or None for an absent optional one)."""
        self._check_name(name)
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"register_parameter: '{name}' must be a Parameter or None, got "
                            f"{type(param).__name__}")
        self._parameters[name] = param

    def register_buffer(self, name, tensor):
        """Adds a tensor that is state but not a parameter (saved, moved by to())."""
        self._check_name(name)
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"register_buffer: '{name}' must be a Tensor or None")
        self._buffers[name] = tensor

    def add_module(self, name, module):
        self._check_name(name)
        self._modules[name] = module

    register_module = add_module

    def _check_name(self, name):
        if not isinstance(name, str) or not name or "." in name:
            raise KeyError(f"invalid name {name!r}: names are non-empty strings without '.'")

    def _register_lazy(self, name, pattern):
        self._parameters[name] = None
        self._lazy[name] = tuple(pattern)

    # ---- computation ----
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ---- traversal ----
    def named_modules(self, prefix=""):
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(prefix + ("." if prefix else "") + name)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_children(self):
        for name, m in self._modules.items():
            if m is not None:
                yield name, m

    def children(self):
        for _, m in self.named_children():
            yield m

    def named_parameters(self, prefix="", recurse=True):
        """(key, parameter) pairs, depth first in registration order; uninitialised lazy
        parameters are left out."""
        mods = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mp, m in mods:
            for name, p in m._parameters.items():
                if p is not None:
                    yield (mp + "." if mp else "") + name, p

    def parameters(self, recurse=True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix="", recurse=True):
        mods = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mp, m in mods:
            for name, b in m._buffers.items():
                if b is not None:
                    yield (mp + "." if mp else "") + name, b

    def buffers(self, recurse=True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def has_uninitialized_parameters(self):
        return any(m._lazy for m in self.modules())

    def apply(self, fn):
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # ---- state ----
    def state_dict(self):
        """Parameters and buffers by key, detached (sharing memory with the module's tensors).
        Uninitialised lazy parameters are left out."""
        out = OrderedDict()
        for mp, m in self.named_modules():
            for name, t in list(m._parameters.items()) + list(m._buffers.items()):
                if t is not None:
                    out[(mp + "." if mp else "") + name] = t.detach()
        return out

    def load_state_dict(self, state_dict, strict=True):
        """Copies `state_dict`'s tensors into the parameters and buffers (Note [Module state in
        Python]). strict: missing or unexpected keys are a ShapeError naming them; otherwise
        they are returned in LoadResult(missing_keys, unexpected_keys)."""
        expected = OrderedDict()  # key -> (module, name, kind, pattern)
        for mp, m in self.named_modules():
            pre = mp + "." if mp else ""
            for name, p in m._parameters.items():
                if p is not None:
                    expected[pre + name] = (m, name, "param", tuple(p.shape))
                elif name in m._lazy:
                    expected[pre + name] = (m, name, "lazy", m._lazy[name])
            for name, b in m._buffers.items():
                if b is not None:
                    expected[pre + name] = (m, name, "buffer", tuple(b.shape))
        missing = [k for k in expected if k not in state_dict]
        unexpected = [k for k in state_dict if k not in expected]
        if strict and (missing or unexpected):
            parts = []
            if missing:
                parts.append("missing keys " + ", ".join(missing))
            if unexpected:
                parts.append("unexpected keys " + ", ".join(unexpected))
            raise _core.ShapeError("load_state_dict: " + "; ".join(parts))
        for key, (m, name, kind, pattern) in expected.items():
            if key not in state_dict:
                continue
            t = state_dict[key]
            if not isinstance(t, Tensor):
                raise TypeError(f"load_state_dict: '{key}' must be a Tensor, got "
                                f"{type(t).__name__}")
            shape = tuple(t.shape)
            fits = len(shape) == len(pattern) and all(p in (-1, s)
                                                      for p, s in zip(pattern, shape))
            if not fits:
                raise _core.ShapeError(f"load_state_dict: '{key}' has shape {shape}, the module "
                                       f"expects {tuple(pattern)} (-1: any)")
            if kind != "buffer" and not t.is_floating_point():
                raise _core.DTypeError(f"load_state_dict: parameter '{key}' needs a floating "
                                       f"dtype, got {t.dtype!r}")
        with no_grad():
            for key, (m, name, kind, _) in expected.items():
                if key not in state_dict:
                    continue
                t = state_dict[key]
                if kind == "lazy":
                    setattr(m, name, Parameter(t.detach().clone()))
                    m._on_materialized()
                elif kind == "param":
                    m._parameters[name].copy_(t)
                else:
                    m._buffers[name].copy_(t)
        return LoadResult(missing, unexpected)

    # ---- placement and mode ----
    def _replace_tensors(self, fn):
        with no_grad():
            for m in self.modules():
                for p in list(m._parameters.values()) + list(m._buffers.values()):
                    if p is None:
                        continue
                    new = fn(p)
                    if new is p:
                        continue
                    g = p.grad
                    p._set_data(new.detach())
                    if g is not None:
                        p.grad = fn(g)
        return self

    def to(self, *args, **kwargs):
        """Moves (to(device)) and/or casts (to(dtype), floating tensors only) every parameter
        and buffer. Returns self. Note [Module state in Python]."""
        device = kwargs.pop("device", None)
        dt = kwargs.pop("dtype", None)
        if kwargs:
            raise TypeError(f"to(): unexpected keyword arguments {sorted(kwargs)}")
        for a in args:
            if isinstance(a, _core.dtype):
                dt = a
            else:
                try:
                    device = _core.device(a)
                except _core.DeviceError as device_error:
                    try:
                        dt = _core._as_dtype(a)
                    except (_core.DTypeError, TypeError):
                        raise device_error from None  # 'cuda' without CUDA: the reason
        if dt is not None:
            dt = _core._as_dtype(dt)
            if not dt.is_floating_point:
                raise _core.DTypeError(f"Module.to(): parameters need a floating dtype, got "
                                       f"{dt!r}")
        dev = _core.device(device) if device is not None else None

        def fn(t):
            if dev is not None:
                t = t._to_device(dev)
            if dt is not None and t.is_floating_point():
                t = t._to_dtype(dt)
            return t

        return self._replace_tensors(fn)

    def cpu(self):
        return self.to(_core.device("cpu"))

    def cuda(self, device=None):
        if device is None:
            device = 0
        if isinstance(device, int):
            device = f"cuda:{device}"
        return self.to(_core.device(device))

    def float(self):
        return self.to(_core.dtype.float32)

    def double(self):
        return self.to(_core.dtype.float64)

    def half(self):
        return self.to(_core.dtype.float16)

    def train(self, mode=True):
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, requires_grad=True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none=True):
        """Drops every parameter's gradient."""
        for p in self.parameters():
            p.grad = None

    def _on_materialized(self):
        """Called after load_state_dict materialised a lazy parameter of this module."""

    # ---- printing ----
    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = []
        for name, m in self._modules.items():
            body = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {body}")
        head = type(self).__name__ + "(" + self.extra_repr()
        if not lines:
            return head + ")"
        return head + "\n" + "\n".join(lines) + "\n)"


class Linear(Module):
    """y = x @ weight.T + bias, weight [out, in], bias [out]; initialised like torch.nn.Linear
    (uniform in +-1/sqrt(in)) from the Philox generator, in the same order as the C++
    bp::nn::Linear, so one manual_seed gives the same model in both and on every device."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        if in_features < 0 or out_features < 0:
            raise _core.ShapeError(f"Linear: feature counts must be non-negative, got "
                                   f"in_features={in_features}, out_features={out_features}")
        self.out_features = out_features
        self._has_bias = bias
        self._materialize(in_features, _core.device(device) if device is not None
                          else _core.default_device(),
                          _core._as_dtype(dtype) if dtype is not None else _core.dtype.float32)

    def _materialize(self, in_features, device, dtype):
        bound = 1.0 / math.sqrt(in_features) if in_features > 0 else 0.0
        self.weight = Parameter(_core._uniform([self.out_features, in_features], -bound, bound,
                                               device, dtype))
        if self._has_bias:
            self.bias = Parameter(_core._uniform([self.out_features], -bound, bound, device,
                                                 dtype))
        else:
            self.register_parameter("bias", None)
            self._lazy.pop("bias", None)

    @property
    def in_features(self):
        w = self._parameters.get("weight")
        return -1 if w is None else w.shape[1]

    def forward(self, input):
        w = self._parameters.get("weight")
        if w is None:
            raise _core.ShapeError(f"{type(self).__name__}: the parameters are not initialised "
                                   "(run a LazyLinear once or load it)")
        # bp::linear refuses an input that does not end in in_features (ShapeError naming it)
        return _core.linear(input, w, self._parameters.get("bias"))

    def extra_repr(self):
        inf = self.in_features
        return (f"in_features={inf if inf >= 0 else '?'}, out_features={self.out_features}, "
                f"bias={self._has_bias}")


class LazyLinear(Linear):
    """A Linear whose in_features is taken from the first input (torch.nn.LazyLinear, MXNet's
    Dense(units)): the first call creates the parameters on the input's device with its
    floating dtype; loading a state dict into it takes the shapes from the file. Until then
    parameters() does not list them: run the model once before building an optimiser."""

    def __init__(self, out_features, bias=True):
        Module.__init__(self)
        if out_features < 0:
            raise _core.ShapeError(f"LazyLinear: out_features must be non-negative, got "
                                   f"{out_features}")
        self.out_features = out_features
        self._has_bias = bias
        self._register_lazy("weight", (out_features, -1))
        if bias:
            self._register_lazy("bias", (out_features,))
        else:
            self._parameters["bias"] = None

    def forward(self, input):
        if self._parameters.get("weight") is None:
            if input.ndim == 0:
                raise _core.ShapeError("LazyLinear: cannot infer in_features from a 0-d input")
            if not input.is_floating_point():
                raise _core.DTypeError("LazyLinear: the first input must be floating (its dtype "
                                       f"becomes the parameters' dtype), got {input.dtype!r}")
            self._materialize(input.shape[-1], input.device, input.dtype)
        return Linear.forward(self, input)


class ReLU(Module):
    def forward(self, input):
        return input.relu()


class Sigmoid(Module):
    def forward(self, input):
        return input.sigmoid()


class Tanh(Module):
    def forward(self, input):
        return input.tanh()


class Identity(Module):
    def forward(self, input):
        return input


class Flatten(Module):
    """Flattens dims start_dim..end_dim (all but the batch dimension by default)."""

    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, input):
        return input.flatten(self.start_dim, self.end_dim)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Sequential(Module):
    """Children named "0", "1", ... run in order, each on the previous one's output."""

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            for name, m in modules[0].items():
                self.add_module(name, m)
        else:
            for m in modules:
                self.append(m)

    def append(self, module):
        if not isinstance(module, Module):
            raise TypeError(f"Sequential: {type(module).__name__} is not a Module")
        self.add_module(str(len(self._modules)), module)
        return self

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, index):
        mods = list(self._modules.values())
        if isinstance(index, slice):
            return Sequential(*mods[index])
        try:
            return mods[index]
        except IndexError:
            raise IndexError(f"Sequential: index {index} is out of range for "
                             f"{len(mods)} layers") from None

    def forward(self, input):
        for m in self._modules.values():
            input = m(input)
        return input


class MSELoss(Module):
    def __init__(self, reduction="mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, input, target):
        return mse_loss(input, target, self.reduction)


class CrossEntropyLoss(Module):
    """torch.nn.CrossEntropyLoss over class indices (functional.cross_entropy)."""

    def __init__(self, reduction="mean", *, ignore_index=-100, label_smoothing=0.0):
        super().__init__()
        self.reduction = reduction
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, input, target):
        return cross_entropy(input, target, self.reduction, ignore_index=self.ignore_index,
                             label_smoothing=self.label_smoothing)


from ._conv import (  # noqa: E402  (they build on Module and Parameter above)
    AdaptiveAvgPool2d,
    AvgPool2d,
    BatchNorm2d,
    Conv2d,
    Dropout,
    MaxPool2d,
    ModuleList,
)
from ._transformer import (  # noqa: E402
    GELU,
    Embedding,
    LayerNorm,
    MultiheadAttention,
)

__all__ = ["Parameter", "Module", "Linear", "LazyLinear", "ReLU", "Sigmoid", "Tanh",
           "Identity", "Flatten", "Sequential", "MSELoss", "CrossEntropyLoss", "LoadResult",
           "Conv2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "BatchNorm2d", "Dropout",
           "ModuleList", "LayerNorm", "Embedding", "GELU", "MultiheadAttention", "functional",
           "init", "utils"]
