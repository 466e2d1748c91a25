"""Devices (d2l's try_gpu / try_all_gpus), availability, memory statistics, synchronisation
and the gradient modes (no_grad, enable_grad, set_grad_enabled, inference_mode)."""
import functools
import re

from . import _core


class Availability:
    """Whether a backend can be used, and why not: truthy when available.

    >>> backplane.is_available("cuda")
    Availability(available=False, reason='0 devices because CUDA driver not found ...')
    """

    __slots__ = ("available", "reason")

    def __init__(self, available, reason):
        self.available = available
        self.reason = reason

    def __bool__(self):
        return self.available

    def __iter__(self):
        return iter((self.available, self.reason))

    def __repr__(self):
        return f"Availability(available={self.available!r}, reason={self.reason!r})"


def is_available(type="cuda"):
    """Whether the device type has a loaded backend with at least one device, with the reason
    from the plugin load report when it has not."""
    return Availability(*_core._is_available(type))


def num_gpus():
    """The number of CUDA devices (0 when the backend is missing or has none)."""
    return _core.num_devices("cuda")


def try_gpu(i=0):
    """GPU i (cuda:i) if it exists, otherwise cpu:0, like d2l's try_gpu."""
    return _core.try_device(f"cuda:{i}")


def try_all_gpus():
    """Every GPU, or [cpu:0] when there is none, like d2l's try_all_gpus."""
    return _core.all_devices("cuda")


def synchronize(device=None):
    """Waits for the work queued on `device`, or on every device when None."""
    _core._synchronize(device)


def _dev(device):
    return _core.device(device) if device is not None else _core.default_device()


def memory_stats(device=None):
    """{'allocated', 'reserved', 'peak_allocated', 'num_allocs', 'total_allocs'} in bytes /
    counts for `device` (the default device when None). libbackplane counts allocations
    itself; 'reserved' comes from the backend."""
    return _dev(device).memory_stats()


def memory_allocated(device=None):
    """Live bytes handed out on `device`."""
    return memory_stats(device)["allocated"]


def max_memory_allocated(device=None):
    """The peak of memory_allocated since the last reset_peak_memory_stats."""
    return memory_stats(device)["peak_allocated"]


def reset_peak_memory_stats(device=None):
    _dev(device).reset_peak_memory_stats()


def empty_cache(device=None):
    """Returns the cached free memory of `device` to the system."""
    _dev(device).empty_cache()


class _GradMode:
    """Sets gradient recording on this thread to `_enabled` inside a with block or a decorated
    function, and restores what it was after."""

    _enabled = False

    def __init__(self):
        self._states = []

    def _mode(self):
        return self._enabled

    def __enter__(self):
        state = _core._GradModeState()
        state.enter(self._mode())
        self._states.append(state)
        return self

    def __exit__(self, *exc):
        self._states.pop().exit()
        return False

    def _clone(self):
        return type(self)()

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self._clone():
                return fn(*args, **kwargs)

        return wrapper


class no_grad(_GradMode):
    """Switches gradient recording off on this thread, as a context manager
    (``with backplane.no_grad():``) or a decorator (``@backplane.no_grad()``), like
    torch.no_grad."""


class enable_grad(_GradMode):
    """Switches gradient recording on inside a no_grad region (torch.enable_grad)."""

    _enabled = True


class set_grad_enabled(_GradMode):
    """torch.set_grad_enabled(mode): a context manager or decorator setting recording to
    `mode`."""

    def __init__(self, mode):
        super().__init__()
        self._enabled = bool(mode)

    def _clone(self):
        return set_grad_enabled(self._enabled)


class inference_mode(_GradMode):
    """torch.inference_mode(mode=True): recording off (on with mode=False) for evaluation."""

    def __init__(self, mode=True):
        super().__init__()
        self._enabled = not mode

    def _clone(self):
        return inference_mode(not self._enabled)


# ---- device handles -----------------------------------------------------------------------

_SPEC = re.compile(r"^([a-z_][a-z0-9_]*)(?::([0-9]+))?$")


class AbsentDevice:
    """What backplane.device() gives for a device that does not exist here ('cuda' without a
    GPU), as torch.device does: it prints and compares like a device, and every use (creating a
    tensor on it, moving to it, asking its properties) raises the DeviceError that says why it
    is missing, with the driver's reason."""

    __slots__ = ("type", "index", "reason")

    def __init__(self, type, index, reason):
        self.type, self.index, self.reason = type, index, reason

    def __str__(self):
        return f"{self.type}:{self.index}"

    def __repr__(self):
        return f"device(type='{self.type}', index={self.index})"

    def __eq__(self, other):
        return isinstance(other, AbsentDevice) and (self.type, self.index) == (other.type,
                                                                               other.index)

    def __hash__(self):
        return hash((self.type, self.index))

    def _fail(self, *args, **kwargs):
        raise _core.DeviceError(self.reason)

    name = property(_fail)
    backend = property(_fail)
    properties = memory_stats = synchronize = free_memory = _fail
    reset_peak_memory_stats = empty_cache = supports = _fail


def _known_types():
    types = {"cpu", "cuda", "opencl"}
    for r in _core.load_report():
        if r.get("device_type"):
            types.add(r["device_type"])
    return types


def device(spec=None):
    """The device named by `spec` ('cuda:1', 'cuda' = 'cuda:0', 'cpu', a Device, None for the
    default device). A well-formed name of a device that does not exist here gives an
    AbsentDevice whose use raises DeviceError with the reason (torch.device('cuda') on a
    machine without CUDA works the same way); a malformed name is a DeviceError at once."""
    try:
        return _core.device(spec)
    except _core.DeviceError as e:
        if not isinstance(spec, str):
            raise
        m = _SPEC.match(spec)
        if not m or m.group(1) not in _known_types():
            raise
        return AbsentDevice(m.group(1), int(m.group(2) or 0), str(e))
