"""Backplane: tensors and small models on any device, with the names d2l readers know.

    >>> import backplane as bp
    >>> gpu = bp.try_gpu()                # cuda:0, or cpu:0 when there is no GPU
    >>> x = bp.tensor([1, 2, 3])          # on the default device (cpu:0), int64
    >>> y = x.copy_to(gpu)                # always a new tensor
    >>> z = x.to(gpu)                     # x itself when already there
    >>> (z + 2).exp() * y                 # computed on the GPU, stays there
    tensor([ 20.0855, 109.1963, 445.2395], device='cuda:0')

Tensors exchange memory with NumPy, PyTorch and CuPy through DLPack (`from_dlpack`,
`Tensor.__dlpack__`). Errors are subclasses of `backplane.Error` and of the builtin that says
what went wrong (`ShapeError` is a `ValueError`, `DTypeError` a `TypeError`, ...).
"""
import atexit as _atexit
import sys as _sys

from . import _core
from ._core import (
    AsyncError,
    CaptureError,
    Device,
    DeviceError,
    DeviceLost,
    DeviceMismatch,
    DTypeError,
    Error,
    Graph,
    IOError,
    IndexError,
    OutOfMemory,
    PluginError,
    ShapeError,
    SyncError,
    Tensor,
    UnsupportedError,
    abs,
    all_devices,
    allclose,
    allow_tf32,
    capture,
    cat,
    default_device,
    devices,
    dtype,
    exp,
    fallback_stats,
    fallback_table,
    is_capturing,
    is_grad_enabled,
    load_report,
    log,
    manual_seed,
    matmul,
    maximum,
    minimum,
    num_devices,
    pow,
    relu,
    set_allow_tf32,
    set_default_device,
    set_fallback_policy,
    set_sync_debug,
    sigmoid,
    sqrt,
    stack,
    sync_debug,
    tanh,
    try_device,
    where,
)
from ._runtime import (
    AbsentDevice,
    Availability,
    device,
    enable_grad,
    inference_mode,
    set_grad_enabled,
    empty_cache,
    is_available,
    max_memory_allocated,
    memory_allocated,
    memory_stats,
    no_grad,
    num_gpus,
    reset_peak_memory_stats,
    synchronize,
    try_all_gpus,
    try_gpu,
)
from ._tensor import (
    arange,
    as_tensor,
    empty,
    empty_like,
    from_numpy,
    full,
    full_like,
    normal,
    ones,
    ones_like,
    rand,
    rand_like,
    randn,
    randn_like,
    tensor,
    uniform,
    zeros,
    zeros_like,
)
from ._functions import (
    argmax,
    argmin,
    clamp,
    clip,
    cos,
    cumsum,
    gather,
    log_softmax,
    masked_fill,
    max,
    min,
    return_types,
    rsqrt,
    scatter_add,
    sin,
    softmax,
    std,
    tril,
    triu,
    var,
)
from ._dlpack import from_dlpack
from ._graph import graph
from .serialization import load, load_checkpoint, load_metadata, save, save_checkpoint
from . import autograd  # noqa: E402  (it uses the names above)
from . import amp  # noqa: E402
from .amp import autocast, get_autocast_dtype, is_autocast_enabled  # noqa: E402

# Note [Lazy submodules]
#   `import backplane` plus a first op is a start-up goal (issue 29: 100 ms on a 2-core
#   machine), and the layers, optimisers, data loading (concurrent.futures and logging), the
#   models, distributed, the profiler and the Trainer cost about as much to import as the rest of
#   the package. They are imported on first use instead: `backplane.nn` (or `from backplane
#   import nn`, or `import backplane.nn`) imports the submodule then, through the module
#   __getattr__ of PEP 562, and keeps it in this namespace. None of them changes another module
#   when imported, so the order does not matter. As with NumPy (Note [Lazy NumPy]).
_LAZY_SUBMODULES = ("nn", "optim", "distributed", "profiler", "utils", "models", "trainer")
_LAZY_NAMES = {"Trainer": "trainer"}


def __getattr__(name):
    import importlib

    if name in _LAZY_SUBMODULES:
        value = importlib.import_module("." + name, __name__)
    elif name in _LAZY_NAMES:
        value = getattr(importlib.import_module("." + _LAZY_NAMES[name], __name__), name)
    else:
        raise AttributeError(f"module 'backplane' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY_SUBMODULES) | set(_LAZY_NAMES))

__version__ = "0.1.0"

# dtype names as in PyTorch (backplane.float32, backplane.long, ...). Set last and through
# globals() because `bool`, `int` and `float` shadow the builtins in this module's namespace.
globals().update(
    float32=dtype.float32,
    float64=dtype.float64,
    float16=dtype.float16,
    bfloat16=dtype.bfloat16,
    int32=dtype.int32,
    int64=dtype.int64,
    uint8=dtype.uint8,
    bool=dtype.bool,
    float=dtype.float32,
    double=dtype.float64,
    half=dtype.float16,
    int=dtype.int32,
    long=dtype.int64,
)


# Note [Leak reports under pytest with PyTorch]
#   nanobind reports every Backplane object still alive when the interpreter has finished (the
#   leak report Backplane's own tests require to stay empty: python/tests/test_exit.py, with
#   and without PyTorch). Under pytest with PyTorch imported, pytest's session state (its
#   fixtures and their parameters) is never freed: on the GPU machine a pure-Python object that
#   is a fixture's parameter is never finalised once `import torch` is in the test file, with
#   or without Backplane (tools/gpu/leak_pytest_variants.sh, the sentinel cases), so every
#   Device a test suite parametrises over was reported as ours. In that situation only, the
#   report is switched off as the interpreter exits; everywhere else it stays on.
def _foreign_leaks_at_exit():
    if "torch" in _sys.modules and "_pytest" in _sys.modules:
        _core._set_leak_warnings(False)


_atexit.register(_foreign_leaks_at_exit)
