"""Tensor creation and the Python-level parts of Tensor (repr, tolist, to, casts).

Note [Default dtype]
  As in PyTorch: Python ints (and nested lists of them) become int64, floats float32, bools
  bool; arange with integer arguments is int64; full takes the fill value's kind. NumPy arrays
  keep their dtype (float64 stays float64), as torch.tensor(ndarray) does. Ops promote mixed
  dtypes (Note [Type promotion] in tensor.hpp), so the walkthrough's (z + 2).exp() of an int64
  z is float32, as in PyTorch.
"""
import builtins
import functools
import math

from ._np import is_numpy, np

from . import _core
from ._core import Tensor
from ._core import dtype as DT

_NUMPY_NAMES = {
    DT.float32: "float32",
    DT.float64: "float64",
    DT.float16: "float16",
    DT.int32: "int32",
    DT.int64: "int64",
    DT.uint8: "uint8",
    DT.bool: "bool_",
}


@functools.cache
def _from_numpy_dtypes():
    """NumPy dtype -> Backplane dtype (built on first use: Note [Lazy NumPy] in _np.py)."""
    return {np.dtype(getattr(np, v)): k for k, v in _NUMPY_NAMES.items()}


def _dtype(d, default=DT.float32):
    return default if d is None else _core._as_dtype(d)


def _device(d):
    return _core.default_device() if d is None else _core.device(d)


def _size(size, what):
    if len(size) == 1 and isinstance(size[0], (list, tuple)):
        size = tuple(size[0])
    for s in size:
        if not (isinstance(s, builtins.int) or is_numpy(s, "integer")) or isinstance(
                s, builtins.bool):
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
    host = np.asarray(arr, dtype=getattr(np, _NUMPY_NAMES[dt]), order="C")
    return _core._from_host(host, dt, device)


def _infer_dtype(data, arr):
    if is_numpy(data, "ndarray", "generic"):
        from_numpy_dtypes = _from_numpy_dtypes()
        if arr.dtype.kind == "f" and arr.dtype not in from_numpy_dtypes:
            raise _core.DTypeError(f"tensor(): NumPy dtype {arr.dtype} is not supported; "
                                   "use float16, float32 or float64")
        if arr.dtype in from_numpy_dtypes:
            return from_numpy_dtypes[arr.dtype]
        if arr.dtype.kind in "iu":
            raise _core.DTypeError(f"tensor(): NumPy dtype {arr.dtype} is not supported; "
                                   "use int32, int64, uint8 or pass dtype=")
        raise _core.DTypeError(f"tensor(): NumPy dtype {arr.dtype} is not supported")
    if arr.dtype.kind == "b":
        return DT.bool
    if arr.dtype.kind in "iu":
        return DT.int64  # Note [Default dtype]
    if arr.dtype.kind == "f":
        return DT.float32
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
    if hasattr(data, "__dlpack__") and not is_numpy(data, "ndarray", "generic"):
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
    if not is_numpy(array, "ndarray"):
        raise TypeError(f"from_numpy: expected a numpy.ndarray, got {type(array).__name__}")
    from ._dlpack import from_dlpack

    return from_dlpack(array)


def empty(*size, dtype=None, device=None, requires_grad=False):
    """A tensor of uninitialised values."""
    return _finish(_core._empty(_size(size, "empty"), _device(device), _dtype(dtype)),
                   requires_grad)


def _scalar_dtype(value):
    """The dtype a Python number gives (Note [Default dtype])."""
    if isinstance(value, builtins.bool) or is_numpy(value, "bool_"):
        return DT.bool
    if isinstance(value, builtins.int) or is_numpy(value, "integer"):
        return DT.int64
    return DT.float32


def full(size, fill_value, dtype=None, device=None, requires_grad=False):
    """A tensor of `fill_value`; its dtype follows the value (int64, float32, bool) unless
    `dtype` is given."""
    if isinstance(size, builtins.int):
        size = (size,)
    dt = _dtype(dtype, _scalar_dtype(fill_value))
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
    """start, start + step, ... below end (0 .. start-1 when end is None); int64 when every
    argument is an integer, float32 otherwise, unless `dtype` says (Note [Default dtype])."""
    if end is None:
        start, end = 0, start
    if step == 0:
        raise _core.ShapeError("arange: step must not be zero")
    ints = all((isinstance(v, builtins.int) or is_numpy(v, "integer"))
               and not isinstance(v, builtins.bool) for v in (start, end, step))
    dt = _dtype(dtype, DT.int64 if ints else DT.float32)
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


def _host_array(t, call):
    """The values as a NumPy array; `call` names the user's call in sync-debug reports."""
    return _core._numpy_as(t._to_dtype(DT.float32) if t.dtype == DT.bfloat16 else t, call)


def _repr(self):
    """PyTorch's form: tensor([1., 2., 3.], device='cuda:0'); cpu and float32/int64/bool are
    implied."""
    arr = _host_array(self, "repr()")
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
    """The values as (nested) Python numbers (waits for the device; no NumPy involved)."""
    return _core._tolist(self, "tolist()")


def _iter(self):
    if self.ndim == 0:
        raise TypeError("iteration over a 0-d tensor")
    return (self[i] for i in range(self.shape[0]))


def _array(self, dtype=None, copy=None):
    if self.dtype == DT.bfloat16:
        arr = _host_array(self, "__array__()")
    else:
        arr = _core._numpy_as(self, "__array__()")
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
            except _core.DeviceError as device_error:
                try:
                    dt = _core._as_dtype(a)
                except (_core.DTypeError, TypeError):
                    # Not a dtype either: the device's reason ('cuda' without CUDA says why
                    # there is none, a bad name lists the devices that exist).
                    raise device_error from None
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


def _operand(value, device):
    """The tensor an array operand of an operator becomes (Note [Python operands] in
    tensor.cpp): on the other operand's device, keeping its dtype."""
    try:
        return as_tensor(value, device=device)
    except _core.Error:
        return tensor(np.ascontiguousarray(value), device=device)  # e.g. negative strides


def _copyto(self, other):
    """MXNet's copyto: into the tensor `other` (returned), or to the device `other` (a copy)."""
    if isinstance(other, Tensor):
        other.copy_(self)
        return other
    return self.copy_to(_core.device(other))


def _data_get(self):
    """torch's Tensor.data: this tensor's values without autograd history (shares memory)."""
    return self.detach()


def _data_set(self, value):
    if not isinstance(value, Tensor):
        raise TypeError(f"data: expected a Tensor, got {type(value).__name__}")
    self._set_data(value.detach())


def _split(self, split_size_or_sections, dim=0):
    """torch.split: views of `split_size` entries along `dim` (the last one may be shorter),
    or of the given section sizes."""
    n = self.shape[dim]
    if isinstance(split_size_or_sections, builtins.int):
        size = split_size_or_sections
        if size <= 0:
            raise _core.ShapeError(f"split: split_size must be positive, got {size}")
        sizes = [min(size, n - s) for s in range(0, n, size)] or [0]
    else:
        sizes = [builtins.int(v) for v in split_size_or_sections]
        if sum(sizes) != n or any(v < 0 for v in sizes):
            raise _core.ShapeError(f"split: sections {sizes} do not add up to the size {n} of "
                                   f"dim {dim}")
    out, start = [], 0
    for size in sizes:
        out.append(self.narrow(dim, start, size))
        start += size
    return tuple(out)


def _chunk(self, chunks, dim=0):
    """torch.chunk: at most `chunks` views of equal size along `dim` (the last smaller)."""
    if chunks <= 0:
        raise _core.ShapeError(f"chunk: chunks must be positive, got {chunks}")
    n = self.shape[dim]
    return _split(self, max(1, -(-n // chunks)), dim)


def _masked_fill(self, mask, value):
    """torch.masked_fill: `value` where the bool `mask` (broadcast to this shape) is true."""
    if not isinstance(mask, Tensor) or mask.dtype != DT.bool:
        raise _core.DTypeError("masked_fill: the mask must be a bool tensor")
    if isinstance(value, Tensor):
        fill = value.to(self.dtype)
    else:
        fill = _core._full([], builtins.float(value), self.device, self.dtype)
    return _core.where(mask, fill, self)


class RemovableHandle:
    """What register_post_accumulate_grad_hook returns: remove() unregisters the hook."""

    __slots__ = ("_tensor", "_id")

    def __init__(self, tensor, hook_id):
        self._tensor, self._id = tensor, hook_id

    def remove(self):
        if self._id is not None:
            _core._remove_post_accumulate_grad_hook(self._tensor, self._id)
            self._id = None


def _register_post_accumulate_grad_hook(self, hook):
    """torch's Tensor.register_post_accumulate_grad_hook: hook(tensor) runs each time backward
    has finished this leaf's gradient (it may read or replace tensor.grad)."""
    return RemovableHandle(self, _core._register_post_accumulate_grad_hook(self, hook))


def _masked_fill_(self, mask, value):
    """In-place masked_fill."""
    return self.copy_(_masked_fill(self, mask, value))


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
    "as_in_ctx": lambda self, ctx: self._to_device(_core.device(ctx)),
    "copyto": _copyto,
    "split": _split,
    "chunk": _chunk,
    "masked_fill": _masked_fill,
    "masked_fill_": _masked_fill_,
    "register_post_accumulate_grad_hook": _register_post_accumulate_grad_hook,
    "float": _cast(DT.float32),
    "double": _cast(DT.float64),
    "half": _cast(DT.float16),
    "bfloat16": _cast(DT.bfloat16),
    "int": _cast(DT.int32),
    "long": _cast(DT.int64),
    "bool": _cast(DT.bool),
}.items():
    setattr(Tensor, _name, _fn)
# NumPy defers binary operators to Tensor, so `ndarray + tensor` is a Backplane tensor, not a
# silent host copy (Note [Python operands] in tensor.cpp).
Tensor.__array_priority__ = 1000
Tensor.__array_ufunc__ = None
Tensor.ctx = property(lambda self: self.device, doc="MXNet's name of the tensor's device.")
Tensor.data = property(_data_get, _data_set)


def _dtype_repr(self):
    return f"backplane.{self.name}"


DT.__repr__ = _dtype_repr
DT.__str__ = _dtype_repr
DT.itemsize = property(lambda self: _core._dtype_itemsize(self))
DT.is_floating_point = property(
    lambda self: self in (DT.float32, DT.float64, DT.float16, DT.bfloat16))
