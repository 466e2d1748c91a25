"""save / load in the safetensors format (readable by safetensors.torch and safetensors.numpy).

Note [Saved containers]
  A safetensors file holds named tensors. save() accepts a dict of tensors (a state_dict), a
  Module (its state_dict), a list or tuple of tensors, or one tensor; the container kind is
  kept in the file's metadata ("backplane.container") so load() gives back the same kind:
  dict (an OrderedDict of the file's tensors), list, or the tensor.
"""
from collections import OrderedDict

from . import _core
from ._core import Tensor

_KIND = "backplane.container"


def save(obj, path, metadata=None):
    """Writes `obj` (Note [Saved containers]) atomically to `path` (a temporary file, fsync,
    rename): a failure leaves any previous file as it was. Tensors may live on any device."""
    from .nn import Module

    meta = dict(metadata or {})
    if isinstance(obj, Module):
        obj = obj.state_dict()
    if isinstance(obj, Tensor):
        tensors, kind = {"tensor": obj}, "tensor"
    elif isinstance(obj, (list, tuple)):
        tensors, kind = {str(i): t for i, t in enumerate(obj)}, "list"
    elif isinstance(obj, dict):
        tensors, kind = dict(obj), "dict"
    else:
        raise TypeError(f"save: expected a Module, a dict of tensors, a list of tensors or a "
                        f"tensor, got {type(obj).__name__}")
    for key, t in tensors.items():
        if not isinstance(key, str):
            raise TypeError(f"save: keys must be strings, got {key!r}")
        if not isinstance(t, Tensor):
            raise TypeError(f"save: '{key}' is a {type(t).__name__}, not a Tensor")
    meta[_KIND] = kind
    _core._save_tensors(tensors, str(path), meta)


def load(path, map_location=None):
    """Reads a file written by save() (or any safetensors file) with every tensor created
    directly on `map_location` (a device or a string such as 'cuda:0'; the default device
    when None), like torch.load(..., map_location=...)."""
    device = _core.device(map_location) if map_location is not None else _core.default_device()
    path = str(path)
    tensors = _core._load_file(path, device)
    kind = _core._load_metadata(path).get(_KIND, "dict")
    if kind == "tensor" and set(tensors) == {"tensor"}:
        return tensors["tensor"]
    if kind == "list" and set(tensors) == {str(i) for i in range(len(tensors))}:
        return [tensors[str(i)] for i in range(len(tensors))]
    return OrderedDict(sorted(tensors.items()))


def load_metadata(path):
    """The __metadata__ of a safetensors file as a dict of strings (reads only the header)."""
    return _core._load_metadata(str(path))


def save_checkpoint(path, model, optimizer, scheduler=None, step=0, metadata=None):
    """Writes a training checkpoint (the C++ Note [Checkpoint files]): `path` (safetensors: the
    model's state_dict under "model.<key>", the optimiser's buffers) and `path` + ".json" (the
    step, the optimiser's groups and step counts, the scheduler's state, the random state and
    `metadata`), each atomically, with one save id. `model` is a Module or a state_dict."""
    from .nn import Module

    state = model.state_dict() if isinstance(model, Module) else dict(model)
    _core._save_checkpoint(str(path), state, optimizer, scheduler, int(step),
                           {str(k): str(v) for k, v in (metadata or {}).items()})


def load_checkpoint(path, model, optimizer, scheduler=None):
    """Restores a checkpoint written by save_checkpoint (here or from C++) into `model` (its
    tensors copied in place, so `optimizer` keeps them), `optimizer`, `scheduler` and the global
    random state; returns (step, metadata). Everything is checked before anything changes: a
    checkpoint of another model is a ShapeError naming the keys, another optimiser or
    scheduler an Error, a sidecar of another save an IOError."""
    from .nn import Module

    state = model.state_dict() if isinstance(model, Module) else dict(model)
    step, metadata = _core._load_checkpoint(str(path), state, optimizer, scheduler)
    return step, dict(metadata)
