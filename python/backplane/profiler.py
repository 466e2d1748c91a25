"""torch.profiler's interface over the C++ profiler (bp::profiler): every launch and copy with
its device time, host ranges from record_function, a per-op summary and a Chrome trace.

    with backplane.profiler.profile() as prof:
        with backplane.profiler.record_function("step"):
            loss = model(x).sum()
    print(prof.key_averages().table(row_limit=10))
    prof.export_chrome_trace("trace.json")      # chrome://tracing or ui.perfetto.dev

One session runs at a time in the process; its records stay until the next one starts.
"""
import functools

from . import _core


class ProfilerActivity:
    """torch.profiler.ProfilerActivity: Backplane records host and every device together."""
    CPU = "cpu"
    CUDA = "cuda"


class FunctionEventAvg:
    """One row of key_averages(): an op name or copy kind over every device."""

    __slots__ = ("key", "count", "device_time_total", "cpu_time_total", "bytes")

    def __init__(self, key, count, device_time_total, cpu_time_total, bytes):
        self.key, self.count = key, count
        self.device_time_total, self.cpu_time_total, self.bytes = (device_time_total,
                                                                   cpu_time_total, bytes)

    @property
    def device_time(self):
        """Mean device time per call, microseconds."""
        return self.device_time_total / self.count if self.count else 0.0

    cuda_time = device_time
    cuda_time_total = property(lambda self: self.device_time_total)

    def __repr__(self):
        return (f"<FunctionEventAvg key={self.key} count={self.count} "
                f"device_time_total={self.device_time_total:.3f}us>")


class EventList(list):
    """key_averages(): rows sorted by total device time, largest first."""

    def table(self, sort_by=None, row_limit=100):
        """The summary as a text table (name, calls, device total, mean and share, host total
        and mean); rows sorted by device time (sort_by is accepted for torch's spelling)."""
        return _core._profiler_table(max(0, int(row_limit or 0)))


class profile:
    """A profiling session as a context manager (torch.profiler.profile). activities is
    accepted for compatibility: host ranges and every device's work are always recorded.
    device_time=False skips the per-launch device events (cheaper; host times only)."""

    def __init__(self, activities=None, record_shapes=True, profile_memory=False,
                 with_stack=False, device_time=True):
        self.record_shapes = bool(record_shapes)
        self.device_time = bool(device_time)

    def start(self):
        _core._profiler_start(self.device_time, self.record_shapes)

    def stop(self):
        _core._profiler_stop()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def step(self):
        """torch's schedule step: a no-op (the whole session is recorded)."""

    def key_averages(self):
        return EventList(FunctionEventAvg(**row) for row in _core._profiler_key_averages())

    def export_chrome_trace(self, path):
        """Writes the session as Chrome trace-event JSON (atomically)."""
        _core._profiler_save(str(path))

    def trace_json(self):
        return _core._profiler_trace_json()


class record_function:
    """A named host range in the trace (torch.profiler.record_function), as a context manager
    or a decorator; costs one flag load when no session runs."""

    def __init__(self, name):
        self.name = str(name)
        self._range = _core._Range(self.name)

    def __enter__(self):
        self._range.enter()
        return self

    def __exit__(self, *exc):
        self._range.exit()
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with record_function(self.name):
                return fn(*args, **kwargs)

        return wrapper


__all__ = ["profile", "record_function", "ProfilerActivity", "EventList", "FunctionEventAvg"]
