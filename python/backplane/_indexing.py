"""Advanced indexing (the keys basic indexing cannot express as a view), called by
Tensor.__getitem__ / __setitem__ in indexing.cpp.

Note [Advanced indexing]
  As in NumPy and PyTorch these give copies: an integer index (a tensor, list or array, 1-D or
  N-D; negative entries count from the end) selects along its dimension, a negative-step slice
  selects the entries in reverse order, and a bool mask covering the leading dimensions keeps
  the entries where it is true. Each is one gather on the tensor's device, so gradients flow.
  A bool mask's positions are read on the host (PyTorch synchronises likewise). Several
  integer indices in one key (NumPy's paired indexing, d2l's `y_hat[[0, 1], y]`) broadcast
  together and pick one entry per position (_paired); several negative-step slices are fine.
  Assignment takes a bool mask of the tensor's shape or a negative-step slice.
"""
import builtins

from ._np import is_numpy, np

from . import _core
from ._core import Tensor
from ._core import dtype as DT


def _items(key):
    return list(key) if isinstance(key, tuple) else [key]


def _is_mask(item):
    if isinstance(item, Tensor):
        return item.dtype == DT.bool
    if isinstance(item, builtins.bool):
        return True
    arr = np.asarray(item) if not isinstance(item, slice) else None
    return arr is not None and arr.dtype == np.bool_


def _is_int(item):
    return isinstance(item, builtins.int) or is_numpy(item, "integer")


def _is_index(item):
    if item is None or item is Ellipsis or _is_int(item):
        return False
    if isinstance(item, slice):
        return False
    return not _is_mask(item)


def _index_tensor(item, n, device, dim):
    """A 1-D or N-D int64 index on `device` with negative entries wrapped; IndexError for an
    entry outside [-n, n) that can be checked on the host."""
    if isinstance(item, slice):
        idx = np.arange(n)[item]
        return _core._from_host(np.ascontiguousarray(idx, dtype=np.int64), DT.int64, device)
    if isinstance(item, Tensor):
        if item.is_floating_point():
            raise IndexError("tensors used as indices must be integer (long, int), byte or bool "
                             f"tensors, got {item.dtype!r}")
        t = item.to(device).to(DT.int64)
        if t.device.type == "cpu":
            _check_bounds(t.numpy(), n, dim)
        return _core.where(t < 0, t + n, t)
    arr = np.asarray(item)
    if arr.dtype.kind not in "iu":
        raise IndexError(f"only integers, slices, None, ..., and integer or bool tensors, lists "
                         f"or arrays are valid indices; got {item!r}")
    arr = arr.astype(np.int64)
    _check_bounds(arr, n, dim)
    arr = np.where(arr < 0, arr + n, arr)
    return _core._from_host(np.ascontiguousarray(arr), DT.int64, device)


def _check_bounds(arr, n, dim):
    if arr.size and (arr.min() < -n or arr.max() >= n):
        bad = arr[(arr < -n) | (arr >= n)].ravel()[0]
        raise IndexError(f"index {bad} is out of range for dimension {dim} of size {n}")


def _select(t, dim, idx):
    """t's entries idx (an int64 tensor, any shape) along dim: t.shape[:dim] + idx.shape +
    t.shape[dim+1:], by one gather."""
    flat = idx.reshape(-1)
    k = flat.shape[0]
    shape = list(t.shape)
    view = [1] * t.ndim
    view[dim] = k
    out_shape = shape[:dim] + [k] + shape[dim + 1:]
    if 0 in out_shape:
        out = _core._full(out_shape, 0.0, t.device, t.dtype)
    else:
        index = flat.reshape(view).expand(out_shape).contiguous()
        out = _core.gather(t, dim, index)
    return out.reshape(shape[:dim] + list(idx.shape) + shape[dim + 1:])


def _consumed_before(items, p, rank):
    consuming = sum(1 for it in items if it is not None and it is not Ellipsis)
    dim = 0
    for it in items[:p]:
        if it is None:
            continue
        dim += rank - consuming if it is Ellipsis else 1
    return dim


def _out_position(items, p, rank):
    """Where the dimension of items[p] is in the result of basic indexing with `items`."""
    consuming = sum(1 for it in items if it is not None and it is not Ellipsis)
    pos = 0
    for it in items[:p]:
        if it is Ellipsis:
            pos += rank - consuming
        elif not _is_int(it):
            pos += 1  # None, slices and index arrays keep (or add) a dimension
    return pos


def _mask_positions(mask, t):
    if isinstance(mask, Tensor):
        m = _core._numpy_as(mask, "indexing with a bool mask")
    else:
        m = np.asarray(mask, dtype=np.bool_)
    if m.ndim == 0:
        raise IndexError("a 0-d bool index is not supported; use backplane.where")
    if tuple(m.shape) != tuple(t.shape[:m.ndim]):
        raise IndexError(f"the bool mask of shape {tuple(m.shape)} does not match the leading "
                         f"dimensions of the indexed tensor of shape {tuple(t.shape)}")
    return m


def getitem(t, key):
    items = _items(key)
    masks = [i for i, it in enumerate(items) if _is_mask(it)]
    if masks:
        if len(items) != 1:
            raise _core.UnsupportedError("a bool mask combined with other indices is not "
                                         "supported; index with the mask alone (t[mask])")
        m = _mask_positions(items[0], t)
        flat = t.reshape([-1] + list(t.shape[m.ndim:]))
        pos = np.flatnonzero(m.ravel()).astype(np.int64)
        return _select(flat, 0, _core._from_host(pos, DT.int64, t.device))
    ints = [i for i, it in enumerate(items) if _is_index(it)]
    if len(ints) > 1 or (ints and any(_is_int(it) for it in items)):
        return _paired(t, items)  # integers beside an index array are advanced too (NumPy)
    rank = t.ndim
    # Every advanced item becomes a selection along its dimension; basic indexing (views)
    # does the rest with a full slice in its place.
    out = t
    rest = list(items)
    reshaped_at = None
    for p, it in enumerate(items):
        if not (_is_index(it) or (isinstance(it, slice) and (it.step or 1) < 0)):
            continue
        dim = _consumed_before(items, p, rank)
        if dim >= rank:
            raise IndexError(f"too many indices for a tensor of dimension {rank}")
        idx = _index_tensor(it, t.shape[dim], t.device, dim)
        if idx.ndim != 1:
            reshaped_at = (p, idx.shape)
            idx = idx.reshape(-1)
        out = _select(out, dim, idx)
        rest[p] = slice(None)
    out = out[tuple(rest)]
    if reshaped_at is not None:
        p, shape = reshaped_at
        pos = _out_position(items, p, rank)
        s = list(out.shape)
        out = out.reshape(s[:pos] + list(shape) + s[pos + 1:])
    return out


def _paired(t, items):
    """NumPy's paired indexing, for a key with several integer-array indices (d2l's
    `y_hat[[0, 1], y]`): the index arrays, and the integers beside them, broadcast together to
    one shape B and pick the entries t[i0, i1, ...] of each position; their dimensions become
    B, in the place of the first when they are adjacent in the key, else in front (NumPy's and
    PyTorch's rule). One gather on the tensor's device over the advanced dimensions flattened,
    so gradients flow."""
    rank = t.ndim
    if any(it is None for it in items):
        raise _core.UnsupportedError("None (a new axis) in a key with several integer-array "
                                     "indices is not supported; add the axis afterwards with "
                                     "unsqueeze")
    if sum(1 for it in items if it is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    consuming = sum(1 for it in items if it is not Ellipsis)
    if consuming > rank:
        raise IndexError(f"too many indices for a tensor of dimension {rank}")
    full = []
    for it in items:
        full.extend([slice(None)] * (rank - consuming) if it is Ellipsis else [it])
    full.extend([slice(None)] * (rank - len(full)))
    adv = [d for d, it in enumerate(full) if _is_index(it) or _is_int(it)]
    idx = [_index_tensor(np.asarray(full[d]) if _is_int(full[d]) else full[d], t.shape[d],
                         t.device, d) for d in adv]
    try:
        shape = list(np.broadcast_shapes(*[tuple(i.shape) for i in idx]))
    except ValueError:
        raise IndexError("shape mismatch: indexing arrays could not be broadcast together with "
                         "shapes " + " ".join(str(tuple(i.shape)) for i in idx)) from None
    lin = None  # the flat position over the advanced dimensions, row-major
    for d, i in zip(adv, idx):
        lin = i if lin is None else lin * t.shape[d] + i
    lin = lin.expand(shape) if list(lin.shape) != shape else lin
    rest = [d for d in range(rank) if d not in adv]
    flat = t.permute(adv + rest).reshape([-1] + [t.shape[d] for d in rest])
    out = _select(flat, 0, lin.contiguous())
    out = out[(slice(None),) * len(shape) + tuple(full[d] for d in rest)]
    if adv == list(range(adv[0], adv[-1] + 1)) and adv[0] > 0:
        nb, k = len(shape), adv[0]  # the k leading (sliced) dimensions go back in front
        out = out.permute(list(range(nb, nb + k)) + list(range(nb)) +
                          list(range(nb + k, out.ndim)))
    return out


def setitem(t, key, value):
    items = _items(key)
    if len(items) == 1 and _is_mask(items[0]):
        mask = items[0]
        if not isinstance(mask, Tensor):
            mask = _core._from_host(np.ascontiguousarray(np.asarray(mask, dtype=np.bool_)),
                                    DT.bool, t.device)
        if tuple(mask.shape) != tuple(t.shape):
            raise _core.UnsupportedError(f"assignment through a bool mask needs the mask to "
                                         f"have the tensor's shape {tuple(t.shape)}, got "
                                         f"{tuple(mask.shape)}")
        if isinstance(value, Tensor):
            fill = value.to(t.dtype)
            if fill.numel() != 1:
                raise _core.UnsupportedError("assignment through a bool mask takes a number or "
                                             "a one-element tensor")
            fill = fill.reshape([])
        else:
            fill = _core._full([], builtins.float(value), t.device, t.dtype)
        t.copy_(_core.where(mask.to(t.device), fill, t))
        return
    if all(not _is_index(it) and not _is_mask(it) for it in items):
        # Negative-step slices: the same entries as a positive-step view, in reverse order.
        rank = t.ndim
        view_items, flipped = [], []
        for p, it in enumerate(items):
            if isinstance(it, slice) and (it.step or 1) < 0:
                idx = np.arange(t.shape[_consumed_before(items, p, rank)])[it]
                if idx.size == 0:
                    return
                view_items.append(slice(builtins.int(idx[-1]), builtins.int(idx[0]) + 1,
                                        -(it.step or 1)))
                flipped.append(p)
            else:
                view_items.append(it)
        view = t[tuple(view_items)]
        if not isinstance(value, Tensor):
            view[...] = value
            return
        src = value.to(t.device).expand(list(view.shape)).contiguous()
        for p in flipped:
            d = _out_position(view_items, p, rank)
            k = src.shape[d]
            rev = _core._from_host(np.arange(k - 1, -1, -1, dtype=np.int64), DT.int64, t.device)
            src = _select(src, d, rev)
        view[...] = src
        return
    raise _core.UnsupportedError("assignment through integer-array indices is not supported; "
                                 "assign through a bool mask of the tensor's shape, or use "
                                 "scatter_add")
