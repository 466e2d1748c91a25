"""Asynchronous errors from Python (Note [Asynchronous errors]): the classes, and on a CUDA
device an out-of-range gather raised at the next read as backplane.AsyncError naming the op."""
import pytest

import backplane as bp
from conftest import GPU_DEVICES


def test_async_error_classes():
    assert issubclass(bp.AsyncError, bp.PluginError)
    assert issubclass(bp.DeviceLost, bp.AsyncError)
    assert issubclass(bp.AsyncError, RuntimeError)
    assert (bp.AsyncError.op, bp.AsyncError.device, bp.AsyncError.op_id,
            bp.AsyncError.severity) == ("", "", 0, "")


@pytest.mark.parametrize("device", GPU_DEVICES or [None], ids=str)
def test_out_of_range_gather_is_named_at_the_next_read(device, rng):
    if device is None:
        pytest.skip("needs a cuda device (the error is found on the device)")
    x = bp.tensor(rng.standard_normal((4, 3)).tolist(), device=device)
    bad = 4 + int(rng.integers(0, 100))
    index = bp.tensor([[0, 1, 2], [bad, 0, 1]], device=device)
    y = bp.gather(x, 0, index)  # queued: the index is checked on the device
    with pytest.raises(bp.AsyncError) as info:
        y.tolist()
    e = info.value
    assert e.op == "gather" and e.device == str(device) and e.op_id > 0, str(e)
    assert e.severity in ("op_failed", "stream_poisoned"), e.severity
    assert str(bad) in str(e), str(e)
    assert not isinstance(e, bp.DeviceLost)
    # The device keeps working after the error was reported.
    assert (bp.ones([2], device=device) + 1).tolist() == [2.0, 2.0]
