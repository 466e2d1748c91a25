"""Gradient utilities (torch.nn.utils)."""
from .. import _core


def clip_grad_norm_(parameters, max_norm):
    """Scales the gradients in place so that their global L2 norm is at most `max_norm`;
    returns the norm before clipping as a 0-d tensor on the parameters' device (None when no
    parameter has a gradient). Never reads the device (no host sync)."""
    if isinstance(parameters, _core.Tensor):
        parameters = [parameters]
    return _core.clip_grad_norm_(list(parameters), float(max_norm))
