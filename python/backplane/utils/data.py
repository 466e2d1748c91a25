"""torch.utils.data's Dataset, TensorDataset and DataLoader.

Note [DataLoader]
  An epoch draws its order (shuffle: a permutation from a NumPy generator seeded once from
  `seed`, else a fresh random seed, so one seed gives one sequence of epochs), cuts it into
  batches (drop_last drops a short last one) and collates each batch: a TensorDataset gathers
  the rows of each tensor at once (one gather on the tensors' device), other datasets are read
  item by item and stacked (default_collate: tensors, numbers, NumPy arrays, tuples, lists and
  dicts of them). With num_workers > 0, that many threads prepare the next
  prefetch_factor * num_workers batches while the training loop runs; batches come out in
  order. pin_memory puts each cpu batch in page-locked host memory of the first GPU
  (pin_memory_device to choose), ready to be moved to it; without a GPU it does nothing.
"""
import builtins
import collections
from concurrent.futures import ThreadPoolExecutor

from .._np import is_numpy, np

from .. import _core
from .._core import Tensor


class Dataset:
    """A map-style dataset: __getitem__(index) and __len__."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} does not define __getitem__")

    def __len__(self):
        raise NotImplementedError(f"{type(self).__name__} does not define __len__")


class TensorDataset(Dataset):
    """Examples along the first dimension of tensors of equal length: item i is
    (t[i] for t in tensors)."""

    def __init__(self, *tensors):
        if not tensors:
            raise _core.ShapeError("TensorDataset: give at least one tensor")
        n = None
        for t in tensors:
            if not isinstance(t, Tensor):
                raise TypeError(f"TensorDataset: expected tensors, got {type(t).__name__}")
            if t.ndim == 0:
                raise _core.ShapeError("TensorDataset: a 0-d tensor has no examples")
            if n is not None and t.shape[0] != n:
                raise _core.ShapeError(f"TensorDataset: the tensors' first dimensions differ "
                                       f"({n} and {t.shape[0]})")
            n = t.shape[0]
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self):
        return self.tensors[0].shape[0]


def default_collate(batch):
    """Stacks a list of samples: tensors along a new first dimension, numbers into a tensor,
    NumPy arrays through tensors, tuples, lists and dicts element-wise."""
    first = batch[0]
    if isinstance(first, Tensor):
        return _core.stack(list(batch), 0)
    if is_numpy(first, "ndarray"):
        from .._tensor import tensor
        return tensor(np.stack(batch))
    if isinstance(first, (builtins.bool, builtins.int, builtins.float)) or is_numpy(first, "generic"):
        from .._tensor import tensor
        return tensor(list(batch))
    if isinstance(first, collections.abc.Mapping):
        return {k: default_collate([b[k] for b in batch]) for k in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(default_collate(list(s)) for s in zip(*batch)))
    if isinstance(first, (tuple, list)):
        return [default_collate(list(s)) for s in zip(*batch)] if isinstance(first, list) \
            else tuple(default_collate(list(s)) for s in zip(*batch))
    raise TypeError(f"default_collate: cannot batch samples of type {type(first).__name__}")


def _pin(obj, device):
    if isinstance(obj, Tensor):
        return _core._pin_memory(obj, device) if obj.device.type == "cpu" else obj
    if isinstance(obj, tuple):
        return type(obj)(*(_pin(o, device) for o in obj)) if hasattr(obj, "_fields") \
            else tuple(_pin(o, device) for o in obj)
    if isinstance(obj, list):
        return [_pin(o, device) for o in obj]
    if isinstance(obj, dict):
        return {k: _pin(v, device) for k, v in obj.items()}
    return obj


class DataLoader:
    """Batches of a dataset (torch.utils.data.DataLoader). Note [DataLoader]."""

    def __init__(self, dataset, batch_size=1, shuffle=False, num_workers=0, pin_memory=False,
                 drop_last=False, collate_fn=None, seed=None, prefetch_factor=2,
                 pin_memory_device=None):
        if batch_size is None or batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be a positive integer, got "
                             f"{batch_size!r}")
        if num_workers < 0:
            raise ValueError(f"DataLoader: num_workers must be >= 0, got {num_workers}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.num_workers = int(num_workers)
        self.drop_last = bool(drop_last)
        self.collate_fn = collate_fn
        self.prefetch_factor = max(1, int(prefetch_factor))
        if seed is None:
            seed = int.from_bytes(np.random.default_rng().bytes(8), "little")
        self._rng = np.random.default_rng(seed)
        self.pin_memory = bool(pin_memory)
        self._pin_device = None
        if self.pin_memory:
            if pin_memory_device is not None:
                self._pin_device = _core.device(pin_memory_device)
            else:
                gpus = [d for d in _core.devices() if d.type != "cpu"]
                self._pin_device = gpus[0] if gpus else None

    def __len__(self):
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _batches(self):
        n = len(self.dataset)
        order = self._rng.permutation(n) if self.shuffle else np.arange(n)
        stop = (n // self.batch_size) * self.batch_size if self.drop_last else n
        return [order[s:min(s + self.batch_size, stop)] for s in range(0, stop, self.batch_size)]

    def _load(self, rows):
        ds = self.dataset
        if self.collate_fn is None and isinstance(ds, TensorDataset):
            idx = _core._from_host(np.ascontiguousarray(rows, dtype=np.int64),
                                   _core.dtype.int64, ds.tensors[0].device)
            batch = tuple(t[idx.to(t.device)] for t in ds.tensors)
        else:
            batch = (self.collate_fn or default_collate)([ds[int(i)] for i in rows])
        if self._pin_device is not None:
            batch = _pin(batch, self._pin_device)
        return batch

    def __iter__(self):
        batches = self._batches()
        if self.num_workers == 0:
            for rows in batches:
                yield self._load(rows)
            return
        depth = self.prefetch_factor * self.num_workers
        with ThreadPoolExecutor(max_workers=self.num_workers,
                                thread_name_prefix="backplane-loader") as pool:
            pending = collections.deque()
            it = iter(batches)
            for rows in it:
                pending.append(pool.submit(self._load, rows))
                if len(pending) >= depth:
                    break
            while pending:
                batch = pending.popleft().result()
                nxt = next(it, None)
                if nxt is not None:
                    pending.append(pool.submit(self._load, nxt))
                yield batch


__all__ = ["Dataset", "TensorDataset", "DataLoader", "default_collate"]
