"""torch.autograd's functions: grad, and the gradient modes under their torch.autograd names."""
from . import _core
from ._core import Tensor
from ._runtime import enable_grad, inference_mode, no_grad, set_grad_enabled


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
         allow_unused=False):
    """The gradients of `outputs` (a tensor or a sequence of them, seeded with `grad_outputs`,
    else with 1 for one-element outputs) with respect to `inputs`, as a tuple, without changing
    any tensor's .grad (torch.autograd.grad). An input the outputs do not depend on is an
    error, or None with allow_unused=True. Graphs stay usable (retain_graph is implied);
    create_graph (higher-order gradients) is not supported."""
    if create_graph:
        raise _core.UnsupportedError("autograd.grad: create_graph=True (higher-order gradients) "
                                     "is not supported; backward runs without recording")
    single_out = isinstance(outputs, Tensor)
    outs = [outputs] if single_out else list(outputs)
    ins = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    if grad_outputs is None:
        seeds = [None] * len(outs)
    elif isinstance(grad_outputs, Tensor):
        seeds = [grad_outputs]
    else:
        seeds = list(grad_outputs)
    if len(seeds) != len(outs):
        raise _core.ShapeError(f"autograd.grad: {len(outs)} outputs but {len(seeds)} "
                               "grad_outputs")
    total = [None] * len(ins)
    for out, seed in zip(outs, seeds):
        got = _core._autograd_grad(out, ins, seed, True)
        total = [g if t is None else (t if g is None else t + g) for t, g in zip(total, got)]
    if not allow_unused:
        for k, g in enumerate(total):
            if g is None:
                raise _core.Error(f"autograd.grad: input {k} was not used to compute the "
                                  "outputs (pass allow_unused=True to get None)")
    return tuple(total)


__all__ = ["grad", "no_grad", "enable_grad", "set_grad_enabled", "inference_mode"]
