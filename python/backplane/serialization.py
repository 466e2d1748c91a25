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
