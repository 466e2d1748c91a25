"""Mixed precision (torch.amp): ``autocast`` and ``GradScaler``.

    >>> with backplane.autocast("cuda", dtype=backplane.bfloat16):
    ...     loss = backplane.nn.functional.cross_entropy(model(x), y)   # matmuls in bf16
    >>> loss.backward()                                                   # f32 gradients

Inside an enabled ``autocast`` region for a device type, matmul, linear, conv2d and
scaled_dot_product_attention run in the region's dtype (bf16 or f16) and the ops of the f32 list
(softmax, log_softmax, layer_norm, batch_norm, sum, exp, log, pow, the losses, ...) in f32, on
tensors of a device of that type; the list is the C++ Note [Autocast op lists] (docs/models.md,
"Mixed precision"). Regions nest; ``enabled=False`` switches autocast off inside one. The state
is per thread, as in PyTorch. A device type without a device, or a dtype its devices cannot run
the lower-precision ops in, raises (DeviceError, DTypeError) rather than running in f32.

``GradScaler`` scales the loss for f16 training and skips the optimiser step when a gradient is
inf or nan (torch.amp.GradScaler: init_scale 65536, growth_factor 2, backoff_factor 0.5,
growth_interval 2000).
"""
import functools

from . import _core
from ._core import autocast_supported_dtypes, clear_autocast_cache, get_autocast_dtype
from ._core import is_autocast_enabled


class autocast:
    """torch.autocast(device_type, dtype=None, enabled=True): a context manager or decorator.
    dtype defaults to float16 on "cuda" and bfloat16 elsewhere. cache_enabled is accepted for
    PyTorch compatibility; parameter casts are always cached for the region."""

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if not isinstance(device_type, str):
            raise _core.DeviceError(f"autocast: device_type must be a str such as 'cuda' or "
                                    f"'cpu', got {type(device_type).__name__}")
        self.device_type = device_type
        self.fast_dtype = dtype
        self._enabled = bool(enabled)
        self._states = []

    def __enter__(self):
        state = _core._AutocastState()
        state.enter(self.device_type, self.fast_dtype, self._enabled)
        self._states.append(state)
        return self

    def __exit__(self, *exc):
        self._states.pop().exit()
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with autocast(self.device_type, self.fast_dtype, self._enabled):
                return fn(*args, **kwargs)

        return wrapper


class GradScaler:
    """torch.amp.GradScaler: scale(loss) before backward(), unscale_(optimizer) before
    gradient clipping, step(optimizer) (skipped when a gradient is inf or nan), update().
    `device` is accepted for PyTorch compatibility (the scale is kept on the host; the inf/nan
    checks run on the gradients' devices)."""

    def __init__(self, device="cuda", init_scale=2.0 ** 16, growth_factor=2.0,
                 backoff_factor=0.5, growth_interval=2000, enabled=True):
        self._device = device
        self._s = _core._GradScaler(float(init_scale), float(growth_factor),
                                    float(backoff_factor), int(growth_interval), bool(enabled))

    def scale(self, outputs):
        """outputs * scale: a tensor, or a list/tuple of tensors (each scaled)."""
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        return self._s.scale(outputs)

    def unscale_(self, optimizer):
        self._s.unscale_(optimizer)

    def step(self, optimizer, *args, **kwargs):
        """Runs optimizer.step() unless a gradient was inf or nan; returns None as PyTorch's
        does for optimisers whose step returns nothing."""
        if args or kwargs:
            raise _core.UnsupportedError("GradScaler.step: extra arguments (a closure) are not "
                                         "supported")
        self._s.step(optimizer)
        return None

    def update(self, new_scale=None):
        if new_scale is not None and not isinstance(new_scale, (int, float)):
            new_scale = float(new_scale.item())
        self._s.update(None if new_scale is None else float(new_scale))

    def get_scale(self):
        return self._s.get_scale()

    def get_growth_factor(self):
        return self._s.get_growth_factor()

    def get_backoff_factor(self):
        return self._s.get_backoff_factor()

    def get_growth_interval(self):
        return self._s.get_growth_interval()

    def is_enabled(self):
        return self._s.is_enabled()

    def state_dict(self):
        """PyTorch's keys: scale, growth_factor, backoff_factor, growth_interval,
        _growth_tracker (an empty dict when disabled)."""
        sd = dict(self._s.state_dict())
        for key in ("growth_interval", "_growth_tracker"):
            if key in sd:
                sd[key] = int(sd[key])
        return sd

    def load_state_dict(self, state_dict):
        self._s.load_state_dict({k: float(v) for k, v in state_dict.items()})


__all__ = ["autocast", "GradScaler", "is_autocast_enabled", "get_autocast_dtype",
           "autocast_supported_dtypes", "clear_autocast_cache"]
