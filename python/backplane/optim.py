"""Optimisers (torch.optim.SGD, torch.optim.Adam), implemented in C++: every update runs in
place on the parameters' device, without reading anything back to the host.

They hold the parameter tensors given at construction: build them after moving the model with
to(device) and after a LazyLinear has run once (Note [Module state in Python])."""
from ._core import SGD, Adam, Optimizer

__all__ = ["Optimizer", "SGD", "Adam"]
