"""Optimisers (torch.optim.SGD, torch.optim.Adam), implemented in C++: every update runs in
place on the parameters' device, without reading anything back to the host.

They hold the parameter tensors given at construction; Module.to moves parameters in place, so
an optimiser built before the move keeps working (build it after a LazyLinear has run once).

Note [Optimiser state in Python]
  param_groups is one group (a dict with "params" and the hyper-parameters); assigning
  group["lr"] changes the optimiser's learning rate, as schedulers do in PyTorch. state_dict()
  follows torch.optim: {"state": {index: {"momentum_buffer": t} or {"exp_avg", "exp_avg_sq",
  "step"}}, "param_groups": [{..., "params": [0, 1, ...]}]}, with the state tensors shared, not
  copied; load_state_dict checks the group's size and every shape before it changes anything.
"""
from . import _core
from ._core import SGD, Adam, Optimizer


class _ParamGroup(dict):
    """A param group whose "lr" writes through to the optimiser (Note [Optimiser state in
    Python])."""

    def __init__(self, opt, values):
        super().__init__(values)
        self._opt = opt

    def __setitem__(self, key, value):
        if key == "lr":
            self._opt.lr = float(value)
        elif key == "params" or key not in self or self[key] != value:
            raise _core.UnsupportedError(f"param_groups: '{key}' cannot be changed after the "
                                         "optimiser was built (only 'lr' can)")
        super().__setitem__(key, value)

    def __getitem__(self, key):
        if key == "lr":
            return self._opt.lr
        return super().__getitem__(key)


def _param_groups(self):
    return [_ParamGroup(self, {"params": list(self.params), "lr": self.lr,
                               **self._options()})]


def _state_dict(self):
    state = {}
    for name, per_param in self._state().items():
        for k, t in enumerate(per_param):
            if t is not None:
                state.setdefault(k, {})[name] = t
    group = {key: value for key, value in self.param_groups[0].items() if key != "params"}
    group["lr"] = self.lr
    group["params"] = list(range(len(self.params)))
    return {"state": state, "param_groups": [group]}


def _load_state_dict(self, state_dict):
    groups = state_dict.get("param_groups")
    if not isinstance(groups, list) or len(groups) != 1:
        raise _core.ShapeError("load_state_dict: expected one param group, got "
                               f"{len(groups) if isinstance(groups, list) else groups!r}")
    n = len(self.params)
    if len(groups[0].get("params", [])) != n:
        raise _core.ShapeError(f"load_state_dict: the group has {len(groups[0]['params'])} "
                               f"parameters, this optimiser {n}")
    names = {}
    for k, entry in state_dict.get("state", {}).items():
        k = int(k)
        if not 0 <= k < n:
            raise _core.ShapeError(f"load_state_dict: state for parameter {k} of {n}")
        for name, t in entry.items():
            names.setdefault(name, [None] * n)[k] = t
    self._load_state(names)
    if "lr" in groups[0]:
        self.lr = float(groups[0]["lr"])


Optimizer.param_groups = property(_param_groups, doc="torch's param_groups: one group; "
                                   "group['lr'] = x sets the learning rate.")
Optimizer.state_dict = _state_dict
Optimizer.load_state_dict = _load_state_dict
Optimizer.state = property(lambda self: _state_dict(self)["state"],
                           doc="Per-parameter state by index (torch's optimizer.state).")

__all__ = ["Optimizer", "SGD", "Adam"]
