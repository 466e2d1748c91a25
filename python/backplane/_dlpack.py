"""DLPack 1.x exchange with NumPy, PyTorch, CuPy and any array-API library (implemented in
C++, python/src/dlpack.cpp: Note [DLPack streams], Note [DLPack lifetimes])."""
from ._core import from_dlpack

__all__ = ["from_dlpack"]
