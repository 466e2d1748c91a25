"""Devices (d2l's try_gpu / try_all_gpus), availability, memory statistics, synchronisation
and the no_grad mode."""
import functools

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


class no_grad:
    """Switches gradient recording off on this thread, as a context manager
    (``with backplane.no_grad():``) or a decorator (``@backplane.no_grad()``), like
    torch.no_grad."""

    def __init__(self):
        self._states = []

    def __enter__(self):
        state = _core._NoGradState()
        state.enter()
        self._states.append(state)
        return self

    def __exit__(self, *exc):
        self._states.pop().exit()
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with no_grad():
                return fn(*args, **kwargs)

        return wrapper
