"""backplane.utils: data loading (backplane.utils.data)."""
from . import data  # noqa: F401

__all__ = ["data"]
