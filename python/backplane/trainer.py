"""The Trainer (d2l's, and the C++ bp::Trainer's rules): fits a Module on one device.

Note [Python Trainer]
  Trainer(max_epochs, num_gpus, gradient_clip_val, device) picks its device as bp::Trainer
  does: `device` when given, else cpu:0 for num_gpus=0 and the first GPU (of any backend) for
  num_gpus >= 1, else the CPU; training runs on that one device. fit(model, data, loss,
  optimizer) moves the model there (in place, so an optimiser built before keeps working),
  runs a lazy model once on the first batch, then for max_epochs epochs moves each batch to
  the device and runs forward, loss, backward, clipping and the optimiser step. `data` is a
  DataLoader (or any iterable of (inputs..., target) batches) or a d2l DataModule with
  train_dataloader(); loss and optimizer default to the model's loss() and
  configure_optimizers() (d2l's Module), and optimizer may be a function of the parameters.
  A model with training_step(batch) computes its own loss. The epoch's loss is summed on the
  device and read once per epoch; fit returns the mean batch loss of every epoch.
"""
from . import _core
from ._core import Tensor
from .nn.utils import clip_grad_norm_


def _to(obj, device):
    if isinstance(obj, Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(o, device) for o in obj)
    return obj


class Trainer:
    """Note [Python Trainer]."""

    def __init__(self, max_epochs=10, num_gpus=1, gradient_clip_val=0.0, device=None):
        if max_epochs < 0:
            raise ValueError(f"Trainer: max_epochs must be >= 0, got {max_epochs}")
        self.max_epochs = int(max_epochs)
        self.num_gpus = int(num_gpus)
        self.gradient_clip_val = float(gradient_clip_val)
        self.device = _core._trainer_device(self.num_gpus, str(device) if device else "")
        self.optimizer = None

    def fit(self, model, data, loss=None, optimizer=None):
        loader = data.train_dataloader() if hasattr(data, "train_dataloader") else data
        model.to(self.device)
        first = None
        if model.has_uninitialized_parameters():
            first = _to(next(iter(loader)), self.device)
            with _core_no_grad():
                model(*first[:-1])
        if optimizer is None:
            optimizer = model.configure_optimizers()
        elif callable(optimizer) and not hasattr(optimizer, "step"):
            optimizer = optimizer(list(model.parameters()))
        self.optimizer = optimizer
        loss_fn = loss if loss is not None else getattr(model, "loss", None)
        step = getattr(model, "training_step", None)
        if loss_fn is None and step is None:
            raise TypeError("Trainer.fit: give loss=, or a model with loss() or "
                            "training_step()")
        losses = []
        for _ in range(self.max_epochs):
            model.train()
            total, batches = None, 0
            for batch in loader:
                batch = _to(batch, self.device)
                if step is not None and loss is None:
                    value = step(batch)
                else:
                    value = loss_fn(model(*batch[:-1]), batch[-1])
                optimizer.zero_grad()
                value.backward()
                if self.gradient_clip_val > 0:
                    clip_grad_norm_(model.parameters(), self.gradient_clip_val)
                optimizer.step()
                d = value.detach()
                total = d if total is None else total + d
                batches += 1
            if batches == 0:
                raise _core.Error("Trainer.fit: the data yielded no batch")
            losses.append(total.item() / batches)
        return losses


def _core_no_grad():
    from ._runtime import no_grad
    return no_grad()


__all__ = ["Trainer"]
