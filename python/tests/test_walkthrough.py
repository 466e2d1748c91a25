"""The GPU walkthrough (docs/names.md, d2l's "GPU computing") in Python, with the
values the notebooks print."""
import numpy as np
import pytest

import backplane as bp
from conftest import DEVICES

OTHER = [d for d in DEVICES if d.type != "cpu"]


def test_devices_and_counts():
    cpu = bp.device("cpu")
    assert cpu is bp.device("cpu:0") and str(cpu) == "cpu:0" and cpu.type == "cpu"
    assert repr(cpu) == "device(type='cpu', index=0)"
    n = bp.num_gpus()
    assert n == bp.num_devices("cuda") and n >= 0
    # try_gpu(10) on a machine with fewer GPUs is the CPU, not an error.
    assert bp.try_gpu(10) is (bp.device("cuda:10") if n > 10 else cpu)
    gpus = bp.try_all_gpus()
    assert gpus == ([bp.device(f"cuda:{i}") for i in range(n)] if n else [cpu])
    assert bp.try_gpu() is (bp.device("cuda:0") if n else cpu)
    assert isinstance(cpu.name, str) and cpu.name
    assert cpu.properties()["total_memory"] > 0


def test_is_available_gives_the_reason():
    assert bp.is_available("cpu")
    assert bp.is_available("cpu").reason == ""
    missing = bp.is_available("no_such_backend")
    assert not missing and "no_such_backend" in missing.reason
    available, reason = bp.is_available("cuda")
    assert available == (bp.num_gpus() > 0)
    if not available:
        assert reason


def test_missing_device_is_an_error_listing_what_exists():
    # A well-formed name of a missing device is a handle (as torch.device), whose use raises.
    missing = bp.device("cuda:10" if bp.num_gpus() <= 10 else "cuda:99")
    assert isinstance(missing, bp.AbsentDevice)
    with pytest.raises(bp.DeviceError) as e:
        bp.zeros(1, device=missing)
    assert isinstance(e.value, RuntimeError) and "cuda" in str(e.value)
    with pytest.raises(bp.DeviceError, match="CUDA:0"):
        bp.device("CUDA:0")


def test_default_tensor_lives_on_the_cpu_and_prints_values_then_device():
    x = bp.tensor([1, 2, 3])
    assert x.device is bp.device("cpu:0")
    assert x.dtype == bp.int64 and x.shape == (3,)  # as torch.tensor([1, 2, 3])
    assert str(x) == "[1 2 3]\n<Tensor 3 i64 @cpu:0>"
    assert repr(x) == "tensor([1, 2, 3])"


@pytest.mark.parametrize("dev", DEVICES, ids=str)
def test_create_directly_on_a_device(dev):
    before = dev.memory_stats()["allocated"]
    x = bp.ones(2, 3, device=dev)
    y = bp.rand(2, 3, device=dev)
    assert x.device is dev and y.device is dev
    assert dev.memory_stats()["allocated"] >= before + 2 * 24
    np.testing.assert_array_equal(x.numpy(), np.ones((2, 3), np.float32))
    v = y.numpy()
    assert ((v >= 0) & (v < 1)).all() and len(set(v.ravel().tolist())) > 1
    if dev.type != "cpu":
        assert repr(x) == f"tensor([[1., 1., 1.],\n        [1., 1., 1.]], device='{dev}')"


@pytest.mark.parametrize("dev", DEVICES, ids=str)
def test_copy_to_always_copies_and_to_returns_the_same_tensor(dev):
    x = bp.tensor([1, 2, 3])
    y = x.copy_to(dev)
    assert y is not x and not y.shares_storage(x) and y.device is dev
    assert y.copy_to(dev) is not y
    assert y.to(dev) is y
    assert y.as_in_context(dev) is y
    z = x.to(dev)
    assert (z is x) == (dev.type == "cpu" and dev.index == 0)


@pytest.mark.parametrize("dev", DEVICES, ids=str)
def test_computing_on_the_device_keeps_the_result_there(dev):
    x = bp.tensor([1, 2, 3])
    y = x.copy_to(dev)
    z = x.to(dev)
    a = (z + 2).exp() + y
    b = (z + 2).exp() * y
    c = y ** 2
    for t in (a, b, c):
        assert t.device is dev
    np.testing.assert_allclose(a.numpy(), [21.085537, 56.59815, 151.41316], rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), [20.085537, 109.1963, 445.2395], rtol=1e-6)
    np.testing.assert_array_equal(c.numpy(), [1, 4, 9])
    assert str(b).endswith(f"\n<Tensor 3 f32 @{dev}>")
    # The printed values are the tensor's values (the last digit depends on the device's exp).
    body = str(b).split("\n")[0]
    assert body.startswith("[") and body.endswith("]")
    np.testing.assert_allclose([float(v) for v in body[1:-1].split()], b.numpy(), rtol=1e-6)


@pytest.mark.skipif(not OTHER, reason="needs a second device (cuda or opencl)")
@pytest.mark.parametrize("dev", OTHER, ids=str)
def test_operands_on_two_devices_are_an_error_naming_both(dev):
    x = bp.tensor([1, 2, 3])
    y = x.copy_to(dev)
    with pytest.raises(bp.DeviceMismatch) as e:
        x + y
    msg = str(e.value)
    assert "expected all tensors on one device" in msg
    assert str(dev) in msg and "cpu:0" in msg
    assert isinstance(e.value, RuntimeError)


@pytest.mark.parametrize("dev", DEVICES, ids=str)
def test_moving_back_to_the_host_is_explicit(dev):
    y = bp.tensor([1, 2, 3], device=dev)
    h = y.cpu()
    assert h.device is bp.device("cpu") and y.device is dev
    assert (h is y) == (dev.type == "cpu")
    assert y.sum().item() == 6 and isinstance(y.sum().item(), int)
    assert y.tolist() == [1, 2, 3] and isinstance(y.tolist()[0], int)


@pytest.mark.parametrize("dev", DEVICES, ids=str)
def test_lazy_dense_layer_on_a_device_saved_and_loaded(dev, tmp_path):
    net = bp.nn.Sequential(bp.nn.LazyLinear(1))
    net.to(dev)
    x = bp.rand(2, 3, device=dev)
    out = net(x)
    assert out.device is dev and out.shape == (2, 1)
    assert net[0].weight.device is dev and net[0].weight.shape == (1, 3)
    path = tmp_path / "mlp.safetensors"
    bp.save(net.state_dict(), path)
    clone = bp.nn.Sequential(bp.nn.LazyLinear(1))
    clone.load_state_dict(bp.load(path, map_location=dev))
    assert clone[0].weight.device is dev
    np.testing.assert_array_equal(clone(x).numpy(), out.numpy())


def test_training_loop_on_the_first_gpu_or_the_cpu(rng):
    dev = bp.try_gpu()
    true_w = np.array([[2.0, -3.4]], np.float32)
    X = rng.normal(size=(256, 2)).astype(np.float32)
    Y = X @ true_w.T + 4.2
    net = bp.nn.Sequential(bp.nn.LazyLinear(1)).to(dev)
    net(bp.tensor(X[:1], device=dev))
    opt = bp.optim.SGD(net.parameters(), lr=0.1)
    loss_fn = bp.nn.MSELoss()
    losses = []
    for epoch in range(30):
        for i in range(0, 256, 32):
            xb = bp.tensor(X[i:i + 32]).to(dev)
            yb = bp.tensor(Y[i:i + 32]).to(dev)
            loss = loss_fn(net(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
        losses.append(loss.item())
    assert losses[-1] < 1e-4 < losses[0]
    np.testing.assert_allclose(net[0].weight.numpy(), true_w, atol=1e-2)
    np.testing.assert_allclose(net[0].bias.numpy(), [4.2], atol=1e-2)


def test_report_lists_plugins_and_devices():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "backplane"], capture_output=True, text=True,
                         check=True).stdout
    assert "libbackplane-cpu.so: loaded" in out and "cpu:0" in out
    assert "default device: cpu:0" in out
    report = bp.load_report()
    assert any(r["name"] == "cpu" and r["status"] == "loaded" for r in report)
