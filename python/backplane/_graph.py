"""Graphs as a context manager, in the manner of torch.cuda.graph:

    >>> g = bp.Graph()
    >>> with bp.graph(g, device):           # nothing runs inside: the ops are captured
    ...     y = model(x)
    >>> x.copy_(next_batch); g.replay()     # y holds model(next_batch)

See README "Graphs" for what can be captured and what raises CaptureError.
"""
from ._core import Graph


class graph:
    """Captures the ops queued on `device` (None: the default device) inside the `with` block
    into `g`, a new backplane.Graph. An exception inside the block drops the capture and
    propagates; on normal exit the capture ends and `g` can replay."""

    def __init__(self, g: Graph, device=None, mode: str = "automatic"):
        if not isinstance(g, Graph):
            raise TypeError(f"graph(): expected a backplane.Graph, got {type(g).__name__}")
        self.g, self.device, self.mode = g, device, mode

    def __enter__(self):
        self.g.begin_capture(self.device, self.mode)
        return self.g

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.g.abort_capture()
            return False
        self.g.end_capture()
        return False
