"""torch.distributed's interface over bp::dist: a process group across processes and hosts
(NCCL for CUDA memory, Gloo for host memory, host staging for the rest), its collectives
returning Work, and DistributedDataParallel. Launch the ranks with `python -m backplane.run
-n N script.py` (or bp-run); without a launcher the process is a group of one.

Note [Python DDP]
  DistributedDataParallel(module) broadcasts the module's parameters and buffers from rank 0,
  then registers a post-accumulate hook on every parameter: when backward has finished a
  parameter's gradient, its average over the ranks is started (an asynchronous all_reduce
  with AVG; it counts as started once the call returned), and the hook of the last parameter
  waits for all of them, so the gradients are averaged when backward() returns (a failed
  reduction raises there) and the optimiser steps on the same values on every rank. The hooks
  hold the wrapper weakly, so nothing is kept alive past it.
  An iteration that did not finish (backward interrupted by an exception such as an
  OutOfMemory, a parameter that got no gradient: PyTorch's find_unused_parameters=False
  behaviour) is dropped by the next forward() or synchronize_gradients(), which raise once,
  naming the parameters, and reset the iteration state, so the wrapper stays usable. With more
  than one rank the other ranks may be waiting in reductions this rank never started, or would
  pair them with the next iteration's, so the process group is aborted with the same message:
  every rank learns at once (PeerError) instead of waiting out the timeout, and training resumes
  from a new group, as with the C++ DistributedDataParallel (Note [DDP errors]).
"""
import weakref

from . import _core
from ._core import ReduceOp, Work
from .nn import Module

__all__ = ["init_process_group", "destroy_process_group", "is_initialized", "get_rank",
           "get_world_size", "get_local_rank", "local_device", "ReduceOp", "Work",
           "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
           "reduce_scatter_tensor", "send", "recv", "isend", "irecv", "barrier",
           "DistributedDataParallel", "launch_env", "flight_record", "shrink_group"]


def init_process_group(backend=None, init_method=None, rank=-1, world_size=-1, timeout=None,
                       checks="first_call", nonblocking=False):
    """Joins the default process group. rank, world_size and init_method default to the
    launcher's environment (bp-run, torchrun, Open MPI, PMIx, MPICH, Slurm: see launch_env());
    backend is "gloo", "nccl" or pairs "cpu:gloo,cuda:nccl" (None: per device type); timeout
    is seconds or a datetime.timedelta. checks compares each collective signature across ranks
    the first time it is issued ("first_call"), every call ("every_call", for debugging a
    mismatch) or never ("off"); nonblocking asks for non-blocking NCCL communicators."""
    if timeout is None:
        seconds = 0.0
    elif hasattr(timeout, "total_seconds"):
        seconds = timeout.total_seconds()
    else:
        seconds = float(timeout)
    _core._dist_init(int(rank), int(world_size), init_method or "", seconds, backend or "",
                     str(checks), bool(nonblocking))


def launch_env():
    """What init_process_group() would read from the launcher's variables: a dict with rank,
    world_size, local_rank, launcher ("torchrun", "slurm", ...), variables, init_method and
    init_from. RendezvousError names a malformed or inconsistent variable."""
    return _core._dist_launch_env()


def flight_record():
    """The default group's flight recorder: this rank's last operations, oldest first (a dict
    with rank, world_size, failed, failure and entries, each with id, seq, op, description,
    check, state and age_ms)."""
    import json
    return json.loads(_core._dist_flight_record())


def shrink_group(excluded_ranks=None):
    """Fault recovery, as torch.distributed's shrink_group: every surviving rank calls it after
    a PeerError; the default group becomes the group of the survivors (ranks renumbered in
    their old order). excluded_ranks names the ranks to drop (old numbers); None lets the
    survivors agree through the store on who is alive. Returns the ranks dropped."""
    return list(_core._dist_shrink([int(r) for r in (excluded_ranks or [])]))


def destroy_process_group():
    _core._dist_destroy()


def is_initialized():
    return _core._dist_is_initialized()


def get_rank():
    return _core._dist_rank()


def get_world_size():
    return _core._dist_world_size()


def get_local_rank():
    return _core._dist_local_rank()


def local_device(type="cuda"):
    """cuda:<local rank> (modulo the GPUs), or cpu:0 without a device of that type."""
    return _core._dist_local_device(type)


def _done(work, async_op):
    if async_op:
        return work
    work.wait()
    return None


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """tensor = op over the ranks of tensor, in place."""
    _no_group(group)
    return _done(_core._dist_all_reduce(tensor, op), async_op)


def broadcast(tensor, src=0, group=None, async_op=False):
    """tensor = rank src's tensor, in place."""
    _no_group(group)
    return _done(_core._dist_broadcast(tensor, int(src)), async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """output = the ranks' inputs along a new first dimension (or any shape holding
    world * input.numel() elements)."""
    _no_group(group)
    return _done(_core._dist_all_gather(output_tensor, input_tensor), async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """tensor_list[r] = rank r's tensor (torch's list form)."""
    _no_group(group)
    world = get_world_size()
    if len(tensor_list) != world:
        raise _core.ShapeError(f"all_gather: tensor_list has {len(tensor_list)} tensors for a "
                               f"group of {world}")
    out = _core._empty([world] + list(tensor.shape), tensor.device, tensor.dtype)
    _core._dist_all_gather(out, tensor).wait()
    for r, t in enumerate(tensor_list):
        t.copy_(out[r])
    return _done(_NoWork(), async_op) if async_op else None


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    """output = op over the ranks of this rank's chunk of input."""
    _no_group(group)
    return _done(_core._dist_reduce_scatter(output, input, op), async_op)


def send(tensor, dst, group=None):
    _no_group(group)
    _core._dist_send(tensor, int(dst)).wait()


def recv(tensor, src, group=None):
    _no_group(group)
    _core._dist_recv(tensor, int(src)).wait()
    return int(src)


def isend(tensor, dst, group=None):
    _no_group(group)
    return _core._dist_send(tensor, int(dst))


def irecv(tensor, src, group=None):
    _no_group(group)
    return _core._dist_recv(tensor, int(src))


def barrier(group=None):
    _no_group(group)
    _core._dist_barrier()


class _NoWork:
    def wait(self, timeout=None):
        return None

    def is_completed(self):
        return True


def _no_group(group):
    if group is not None:
        raise _core.UnsupportedError("only the default process group is available from Python "
                                     "(group=None)")


class DistributedDataParallel(Module):
    """torch.nn.parallel.DistributedDataParallel for a module whose parameters are initialised
    and on one device (Note [Python DDP]); state_dict keys get the prefix "module."."""

    def __init__(self, module, device_ids=None, broadcast_buffers=True):
        super().__init__()
        if not is_initialized():
            raise _core.Error("DistributedDataParallel: no process group; call "
                              "backplane.distributed.init_process_group() first")
        if module.has_uninitialized_parameters():
            raise _core.Error("DistributedDataParallel: the module has uninitialised (lazy) "
                              "parameters; run it once on an example batch first")
        self.module = module
        params = [p for p in module.parameters() if p.requires_grad]
        devices = {str(p.device) for p in params}
        if len(devices) > 1:
            raise _core.Error(f"DistributedDataParallel: parameters on several devices "
                              f"({', '.join(sorted(devices))}); move the module to one")
        for p in module.parameters():
            _core._dist_broadcast(p.detach(), 0).wait()
        if broadcast_buffers:
            for b in module.buffers():
                _core._dist_broadcast(b, 0).wait()
        object.__setattr__(self, "_ddp_params", params)
        object.__setattr__(self, "_ddp_names", {id(p): n for n, p in module.named_parameters()})
        object.__setattr__(self, "_ddp_pending", [])
        object.__setattr__(self, "_ddp_ready", set())
        ref = weakref.ref(self)
        hooks = []
        for k, p in enumerate(params):
            def hook(t, k=k, ref=ref):
                ddp = ref()
                if ddp is not None:
                    ddp._on_grad(k, t)
            hooks.append((p, _core._register_post_accumulate_grad_hook(p, hook)))
        object.__setattr__(self, "_ddp_hooks", hooks)

    def _on_grad(self, k, param):
        self._ddp_pending.append(_core._dist_all_reduce(param.grad, ReduceOp.AVG))
        self._ddp_ready.add(k)
        if len(self._ddp_ready) == len(self._ddp_params):
            self._finish_backward()

    def _reset_iteration(self):
        object.__setattr__(self, "_ddp_pending", [])
        self._ddp_ready.clear()

    def _finish_backward(self):
        """Waits for every started average; a failure resets the iteration and is raised."""
        pending = self._ddp_pending
        self._reset_iteration()
        for w in pending:
            w.wait()

    def _drop_unfinished_iteration(self):
        """Note [Python DDP]: raises once for an iteration whose backward did not finish."""
        if not self._ddp_ready and not self._ddp_pending:
            return
        missing = [self._ddp_names.get(id(p), "?") for k, p in enumerate(self._ddp_params)
                   if k not in self._ddp_ready]
        shown = ", ".join(missing[:8]) + (", ..." if len(missing) > 8 else "")
        msg = (f"DistributedDataParallel: the last backward did not finish: {len(missing)} of "
               f"{len(self._ddp_params)} parameter(s) got no gradient ({shown}), so their "
               f"averages never started; either backward was interrupted by an exception, or a "
               f"parameter does not take part in the loss (unused parameters are not "
               f"supported). The iteration is dropped")
        self._reset_iteration()  # the started averages' Works are let go (they may never end)
        if get_world_size() > 1:
            msg += "; the ranks are out of step, so the process group is aborted"
            _core._dist_abort(msg)
        raise _core.Error(msg)

    def synchronize_gradients(self):
        """Waits until every started gradient average has finished; raises for an iteration
        whose backward did not finish (Note [Python DDP])."""
        self._drop_unfinished_iteration()

    def forward(self, *args, **kwargs):
        self._drop_unfinished_iteration()
        return self.module(*args, **kwargs)

    def __del__(self):
        for p, hook_id in getattr(self, "_ddp_hooks", []):
            try:
                _core._remove_post_accumulate_grad_hook(p, hook_id)
            except Exception:  # noqa: BLE001  (interpreter shutdown)
                pass



