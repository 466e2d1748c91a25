"""Optimisers (torch.optim.SGD, Adam, AdamW) and learning-rate schedulers
(backplane.optim.lr_scheduler), implemented in C++: every update runs in place on the
parameters' device, without reading anything back to the host.

Adam and AdamW take fused=True (keyword, as torch.optim): each step then updates a group's
parameters and state with one fused op per device, dtype and step count (a multi-tensor kernel
on cuda), and op by op on a device whose plugin lacks it; results equal the per-op update's
within the dtype's rounding (C++ Note [Fused optimiser step]).

They hold the parameter tensors given at construction; Module.to moves parameters in place, so
an optimiser built before the move keeps working (build it after a LazyLinear has run once).

Note [Optimiser state in Python]
  params is a list of tensors or, as in torch.optim, a list of dicts ({"params": [...],
  "lr": 0.1, ...}), one parameter group each; options a group leaves out take the
  constructor's values. param_groups gives one dict per group whose assignments write through
  (group["lr"] = x, as schedulers do; any option the optimiser has, "betas" as a pair;
  "params" cannot be reassigned). state_dict() follows torch.optim: {"state": {index: {"step":
  n, "momentum_buffer" or "exp_avg", "exp_avg_sq": tensor}}, "param_groups": [{...,
  "params": [0, 1, ...]}]} with the state tensors shared, not copied; load_state_dict checks
  the optimiser kind, the groups and every shape before it changes anything (the C++
  Note [Optimiser state]).
"""
from .. import _core
from .._core import SGD, Adam, AdamW, Optimizer


def _to_python(options):
    out = dict(options)
    if "beta1" in out:
        out["betas"] = (out.pop("beta1"), out.pop("beta2"))
    if "nesterov" in out:
        out["nesterov"] = bool(out["nesterov"])
    return out


def _to_core(options):
    out = {}
    for key, value in options.items():
        if key == "betas":
            b1, b2 = value
            out["beta1"], out["beta2"] = float(b1), float(b2)
        elif key != "params":
            out[key] = float(value)
    return out


class _ParamGroup(dict):
    """One parameter group whose assignments write through (Note [Optimiser state in
    Python])."""

    def __init__(self, opt, index):
        super().__init__({"params": opt._group_params(index),
                          **_to_python(opt._group_options(index))})
        self._opt, self._index = opt, index

    def __setitem__(self, key, value):
        if key == "params":
            raise _core.UnsupportedError("param_groups: 'params' cannot be reassigned; use "
                                         "add_param_group for more parameters")
        for k, v in _to_core({key: value}).items():
            self._opt._set_group_option(self._index, k, v)
        super().__setitem__(key, value)


def _param_groups(self):
    return [_ParamGroup(self, i) for i in range(self._group_count())]


def _add_param_group(self, group):
    if not isinstance(group, dict) or "params" not in group:
        raise TypeError("add_param_group: expected a dict with 'params'")
    params = group["params"]
    params = [params] if isinstance(params, _core.Tensor) else list(params)
    self._add_param_group(params, _to_core(group))


def _state_dict(self):
    from .._tensor import tensor

    sd = self._state_dict()
    for entry in sd["state"].values():  # torch keeps "step" as a 0-d float32 cpu tensor
        entry["step"] = tensor(float(entry["step"]), dtype=_core.dtype.float32, device="cpu")
    sd["param_groups"] = [{**_to_python({k: v for k, v in g.items() if k != "params"}),
                           "params": g["params"]} for g in sd["param_groups"]]
    return sd


def _load_state_dict(self, state_dict):
    groups = [{**_to_core(g), "params": list(g.get("params", []))}
              for g in state_dict.get("param_groups", [])]
    self._load_state_dict({"state": {int(k): dict(v) for k, v in
                                     state_dict.get("state", {}).items()},
                           "param_groups": groups})


Optimizer.param_groups = property(_param_groups, doc="torch's param_groups (Note [Optimiser "
                                  "state in Python]).")
Optimizer.add_param_group = _add_param_group
Optimizer.state_dict = _state_dict
Optimizer.load_state_dict = _load_state_dict
Optimizer.state = property(lambda self: _state_dict(self)["state"],
                           doc="Per-parameter state by index (torch's optimizer.state).")

from . import lr_scheduler  # noqa: E402  (uses Optimizer above)

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "lr_scheduler"]
