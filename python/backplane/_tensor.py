"""Tensor creation and the Python-level parts of Tensor (repr, tolist, to, casts).

Note [Default dtype]
  Python numbers become float32 unless `dtype=` says otherwise (ints too: tensor([1, 2, 3]) is
  float32, as in MXNet's NumPy interface and the C++ bp::tensor), because ops do not promote
  dtypes and the walkthrough's (z + 2).exp() must work on it. NumPy arrays keep their dtype
  (float64 stays float64), as torch.tensor(ndarray) does. bool data becomes bool.
"""
import builtins
import math

import numpy as np

from . import _core
from ._core import Tensor
from ._core import dtype as DT

_NUMPY_OF = {
    DT.float32: np.float32,
    DT.float64: np.float64,
    DT.float16: np.float16,
    DT.int32: np.int32,
    DT.int64: np.int64,
    DT.uint8: np.uint8,
    DT.bool: np.bool_,
}
_FROM_NUMPY = {np.dtype(v): k for k, v in _NUMPY_OF.items()}


def _dtype(d, default=DT.float32):
    return default if d is None else _core._as_dtype(d)


def _device(d):
    return _core.default_device() if d is None else _core.device(d)


def _size(size, what):
    if len(size) == 1 and isinstance(size[0], (list, tuple)):
        size = tuple(size[0])
    for s in size:
        if not isinstance(s, (builtins.int, np.integer)) or isinstance(s, builtins.bool):
            raise _core.ShapeError(f"{what}: sizes must be integers, got {size!r}")
        if s < 0:
            raise _core.ShapeError(f"{what}: sizes must be non-negative, got {tuple(size)!r}")
    return [builtins.int(s) for s in size]


def _finish(t, requires_grad):
    if requires_grad:
        t.requires_grad_(True)
    return t


def _from_array(arr, dt, device):
    """Uploads a host array as `dt` (bfloat16 goes through float32 on the device)."""
    if dt == DT.bfloat16:
        return _core._from_host(np.asarray(arr, dtype=np.float32, order="C"), DT.float32,
                                device)._to_dtype(dt)
    host = np.asarray(arr, dtype=_NUMPY_OF[dt], order="C")
    return _core._from_host(host, dt, device)


def _infer_dtype(data, arr):
    if isinstance(data, np.ndarray) or isinstance(data, np.generic):
        if arr.dtype.kind == "f" and arr.dtype not in _FROM_NUMPY:
            raise _core.DTypeError(f"tensor(): NumPy dtype {arr.dtype} is not supported; "
                                   "use float16, float32 or float64")
        if arr.dtype in _FROM_NUMPY:
            return _FROM_NUMPY[arr.dtype]
        if arr.dtype.kind in "iu":
            raise _core.DTypeError(f"tensor(): NumPy dtype {arr.dtype} is not supported; "
                                   "use int32, int64, uint8 or pass dtype=")
        raise _core.DTypeError(f"tensor(): NumPy dtype {arr.dtype} is not supported")
    if arr.dtype.kind == "b":
        return DT.bool
    if arr.dtype.kind in "iuf":
        return DT.float32  # Note [Default dtype]
    raise _core.DTypeError(f"tensor(): cannot make a tensor of {type(data).__name__} data "
                           f"(NumPy sees dtype {arr.dtype}); expected numbers, bools or "
                           "nested lists of them")


def tensor(data, dtype=None, device=None, requires_grad=False):
    """A new tensor holding a copy of `data` (numbers, nested lists, NumPy arrays, tensors)
    on `device` (the default device when None). Note [Default dtype]."""
    dev = _device(device)
    if isinstance(data, Tensor):
        t = data.detach().copy_to(dev)
        if dtype is not None:
            t = t._to_dtype(_dtype(dtype))
        return _finish(t, requires_grad)
    if hasattr(data, "__dlpack__") and not isinstance(data, (np.ndarray, np.generic)):
        from ._dlpack import from_dlpack

        return tensor(from_dlpack(data), dtype=dtype, device=dev, requires_grad=requires_grad)
    try:
        arr = np.asarray(data)
    except ValueError as e:
        raise _core.ShapeError(f"tensor(): the data is not rectangular ({e})") from None
    dt = _dtype(dtype, None) if dtype is not None else _infer_dtype(data, arr)
    if arr.dtype.kind not in "biuf":
        raise _core.DTypeError(f"tensor(): cannot make a tensor of {type(data).__name__} data "
                               f"(NumPy sees dtype {arr.dtype})")
    return _finish(_from_array(arr, dt, dev), requires_grad)


def as_tensor(data, dtype=None, device=None):
    """Like tensor(), but without a copy when `data` already is a tensor of that dtype on that
    device, or an array that can be shared (NumPy on cpu, DLPack producers on their device)."""
    dev = _device(device) if device is not None else None
    if isinstance(data, Tensor):
        t = data if dev is None else data._to_device(dev)
        return t if dtype is None else t._to_dtype(_dtype(dtype))
    if hasattr(data, "__dlpack__"):
        from ._dlpack import from_dlpack

        try:
            t = from_dlpack(data)
        except (_core.UnsupportedError, _core.DTypeError, BufferError):
            t = None
        if t is not None:
            return as_tensor(t, dtype=dtype, device=dev)
    return tensor(data, dtype=dtype, device=dev)


def from_numpy(array):
    """A cpu tensor sharing memory with the NumPy array (writes on either side are seen by the
    other), like torch.from_numpy."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy: expected a numpy.ndarray, got {type(array).__name__}")
    from ._dlpack import from_dlpack

    return from_dlpack(array)


def empty(*size, dtype=None, device=None, requires_grad=False):
    """A tensor of uninitialised values."""
    return _finish(_core._empty(_size(size, "empty"), _device(device), _dtype(dtype)),
                   requires_grad)


def full(size, fill_value, dtype=None, device=None, requires_grad=False):
    if isinstance(size, builtins.int):
        size = (size,)
    dt = _dtype(dtype)
    return _finish(_core._full(_size((size,), "full"), builtins.float(fill_value), _device(device),
                               dt), requires_grad)


def zeros(*size, dtype=None, device=None, requires_grad=False):
    return _finish(_core._full(_size(size, "zeros"), 0.0, _device(device), _dtype(dtype)),
                   requires_grad)


def ones(*size, dtype=None, device=None, requires_grad=False):
    return _finish(_core._full(_size(size, "ones"), 1.0, _device(device), _dtype(dtype)),
                   requires_grad)


def rand(*size, dtype=None, device=None, requires_grad=False):
    """Uniform in [0, 1) from the Philox generator: one manual_seed gives the same values on
    every device."""
    return _finish(_core._rand(_size(size, "rand"), _device(device), _dtype(dtype)),
                   requires_grad)


def randn(*size, dtype=None, device=None, requires_grad=False):
    """Standard normal values from the Philox generator."""
    return _finish(_core._randn(_size(size, "randn"), _device(device), _dtype(dtype)),
                   requires_grad)


def uniform(low, high, size, dtype=None, device=None, requires_grad=False):
    """Uniform in [low, high)."""
    if isinstance(size, builtins.int):
        size = (size,)
    return _finish(_core._uniform(_size((size,), "uniform"), builtins.float(low),
                                  builtins.float(high), _device(device), _dtype(dtype)),
                   requires_grad)


def normal(mean, std, size, dtype=None, device=None, requires_grad=False):
    """Normal values with the given mean and standard deviation (d2l's torch.normal(0, 0.01,
    size=...))."""
    if isinstance(size, builtins.int):
        size = (size,)
    t = _core._randn(_size((size,), "normal"), _device(device), _dtype(dtype))
    if std != 1:
        t = t * builtins.float(std)
    if mean != 0:
        t = t + builtins.float(mean)
    return _finish(t, requires_grad)


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False):
    """start, start + step, ... below end (0 .. start-1 when end is None); float32 unless
    `dtype` says otherwise (Note [Default dtype])."""
    if end is None:
        start, end = 0, start
    if step == 0:
        raise _core.ShapeError("arange: step must not be zero")
    dt = _dtype(dtype)
    n = max(0, math.ceil((end - start) / step))
    if start == 0 and step == 1 and dt != DT.bool:
        return _finish(_core._arange(n, _device(device), dt), requires_grad)
    values = start + step * np.arange(n, dtype=np.float64)
    return _finish(_from_array(values, dt, _device(device)), requires_grad)


def _like(t, dtype, device):
    return (_dtype(dtype, t.dtype), t.device if device is None else _core.device(device))


def empty_like(t, dtype=None, device=None):
    dt, dev = _like(t, dtype, device)
    return _core._empty(list(t.shape), dev, dt)


def zeros_like(t, dtype=None, device=None):
    dt, dev = _like(t, dtype, device)
    return _core._full(list(t.shape), 0.0, dev, dt)


def ones_like(t, dtype=None, device=None):
    dt, dev = _like(t, dtype, device)
    return _core._full(list(t.shape), 1.0, dev, dt)


def full_like(t, fill_value, dtype=None, device=None):
    dt, dev = _like(t, dtype, device)
    return _core._full(list(t.shape), builtins.float(fill_value), dev, dt)


def rand_like(t, dtype=None, device=None):
    dt, dev = _like(t, dtype, device)
    return _core._rand(list(t.shape), dev, dt)


def randn_like(t, dtype=None, device=None):
    dt, dev = _like(t, dtype, device)
    return _core._randn(list(t.shape), dev, dt)


# ---- Python-level Tensor methods ------------------------------------------------------------


def _host_array(t):
    return (t._to_dtype(DT.float32) if t.dtype == DT.bfloat16 else t).numpy()


def _repr(self):
    """PyTorch's form: tensor([1., 2., 3.], device='cuda:0'); cpu and float32/int64/bool are
    implied."""
    arr = _host_array(self)
    prefix = "tensor("
    if arr.dtype.kind == "f":
        body = np.array2string(arr, separator=", ", prefix=prefix, precision=4,
                               floatmode="maxprec_equal", threshold=1000, edgeitems=3)
    else:
        body = np.array2string(arr, separator=", ", prefix=prefix, threshold=1000, edgeitems=3)
    extras = []
    if self.numel() == 0 and self.ndim != 1:
        extras.append(f"size={tuple(self.shape)}")
    dev = self.device
    if dev.type != "cpu":
        extras.append(f"device='{dev}'")
    if self.dtype not in (DT.float32, DT.int64, DT.bool):
        extras.append(f"dtype={self.dtype!r}")
    if self.requires_grad:
        extras.append("requires_grad=True")
    return prefix + body + "".join(", " + e for e in extras) + ")"


def _str(self):
    """The C++ form: the values, then <Tensor 3 f32 @cuda:0> (walkthrough item 5)."""
    return _core._to_string(self)


def _format(self, spec):
    if spec and self.numel() == 1:
        return format(self.item(), spec)
    return format(str(self), spec)


def _tolist(self):
    """The values as (nested) Python numbers (waits for the device)."""
    return _host_array(self).tolist()


def _iter(self):
    if self.ndim == 0:
        raise TypeError("iteration over a 0-d tensor")
    return (self[i] for i in range(self.shape[0]))


def _array(self, dtype=None, copy=None):
    arr = self.numpy()
    if dtype is not None:
        arr = arr.astype(dtype, copy=False)
    return arr.copy() if copy else arr


def _to(self, *args, **kwargs):
    """to(device), to(dtype), to(device, dtype), to(other_tensor), with keywords device= and
    dtype=: the tensor itself when nothing changes, else a new tensor."""
    device = kwargs.pop("device", None)
    dt = kwargs.pop("dtype", None)
    copy = kwargs.pop("copy", False)
    kwargs.pop("non_blocking", None)
    if kwargs:
        raise TypeError(f"to(): unexpected keyword arguments {sorted(kwargs)}")
    for a in args:
        if isinstance(a, Tensor):
            device, dt = a.device, a.dtype
        elif isinstance(a, _core.Device):
            device = a
        elif isinstance(a, DT):
            dt = a
        elif isinstance(a, str):
            try:
                device = _core.device(a)
            except _core.DeviceError:
                try:
                    dt = _core._as_dtype(a)
                except _core.DTypeError:
                    raise _core.DeviceError(f"to(): '{a}' is neither a device nor a dtype") from None
        elif hasattr(a, "type") and hasattr(a, "index"):  # torch.device
            device = a
        else:
            dt = a
    t = self
    if device is not None:
        dev = _core.device(device)
        t = t.copy_to(dev) if copy else t._to_device(dev)
        copy = False
    if dt is not None:
        t = t._to_dtype(_core._as_dtype(dt))
    if copy and t is self:
        t = t.clone()
    return t


def _cuda(self, device=None):
    """This tensor on cuda:`device` (cuda:0 when None)."""
    if device is None:
        device = 0
    if isinstance(device, builtins.int):
        device = f"cuda:{device}"
    return self._to_device(_core.device(device))


def _cast(dt):
    def method(self):
        return self._to_dtype(dt)

    method.__name__ = dt.name
    method.__doc__ = f"This tensor as {dt.name} (itself when it already is)."
    return method


for _name, _fn in {
    "__repr__": _repr,
    "__str__": _str,
    "__format__": _format,
    "__iter__": _iter,
    "__array__": _array,
    "tolist": _tolist,
    "to": _to,
    "cuda": _cuda,
    "as_in_context": lambda self, device: self._to_device(_core.device(device)),
    "float": _cast(DT.float32),
    "double": _cast(DT.float64),
    "half": _cast(DT.float16),
    "bfloat16": _cast(DT.bfloat16),
    "int": _cast(DT.int32),
    "long": _cast(DT.int64),
    "bool": _cast(DT.bool),
}.items():
    setattr(Tensor, _name, _fn)
# NumPy defers binary operators to Tensor, so `ndarray + tensor` is not a silent host copy.
Tensor.__array_priority__ = 1000


def _dtype_repr(self):
    return f"backplane.{self.name}"


DT.__repr__ = _dtype_repr
DT.__str__ = _dtype_repr
DT.itemsize = property(lambda self: _core._dtype_itemsize(self))
DT.is_floating_point = property(
    lambda self: self in (DT.float32, DT.float64, DT.float16, DT.bfloat16))
