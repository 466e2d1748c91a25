"""NumPy, imported on first use (Note [Lazy NumPy]).

Note [Lazy NumPy]
  `import backplane` does not import NumPy: it costs more than the rest of the package together
  (about 0.1-0.2 s of a cold start on a small machine), and a program that never builds a tensor
  from a list or array, prints one or asks for `numpy()` does not need it. Modules use `np`, a
  stand-in whose first attribute access imports NumPy, and `is_numpy(value, *names)` for type
  checks, which needs no import: before NumPy is imported no value can be a NumPy object.
  `tolist()` and `item()` read values without NumPy (the bindings build Python numbers).
"""
import sys

__all__ = ["np", "is_numpy"]


class _NumPy:
    """numpy's attributes, imported on first access."""

    __slots__ = ()

    def __getattr__(self, name):
        import numpy

        return getattr(numpy, name)

    def __repr__(self):
        return "<numpy, imported on first use>"


np = _NumPy()


def is_numpy(value, *names):
    """isinstance(value, (numpy.<name>, ...)) without importing NumPy."""
    mod = sys.modules.get("numpy")
    if mod is None:
        return False
    return isinstance(value, tuple(getattr(mod, n) for n in names))
