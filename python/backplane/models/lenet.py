"""LeNet-5 as Dive into Deep Learning builds it, sized for scikit-learn's 8x8 digits padded to
16x16 (the C++ examples/lenet/lenet.hpp is the same model, drawn in the same order)."""
from .. import _core, nn


def LeNet(activation="relu", device=None, dtype=None):  # noqa: N802  (a model constructor)
    """Conv(1->6, 5, pad 2), act, AvgPool 2, Conv(6->16, 5), act, AvgPool 2, Flatten,
    Linear(64->120), act, Linear(120->84), act, Linear(84->10); act is sigmoid (the book) or
    relu."""
    acts = {"sigmoid": nn.Sigmoid, "relu": nn.ReLU}
    if activation not in acts:
        raise ValueError(f"LeNet: activation must be 'sigmoid' or 'relu', got {activation!r}")
    act = acts[activation]
    kw = {"device": device, "dtype": dtype}
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2, **kw), act(), nn.AvgPool2d(2, 2),
        nn.Conv2d(6, 16, 5, **kw), act(), nn.AvgPool2d(2, 2), nn.Flatten(),
        nn.Linear(16 * 2 * 2, 120, **kw), act(), nn.Linear(120, 84, **kw), act(),
        nn.Linear(84, 10, **kw))


def digits_images(u8):
    """Digits of values 0..16 (uint8 [N, 8, 8]) as LeNet's input: float32 [N, 1, 16, 16] in
    [0, 1] with the image in the middle."""
    n = u8.shape[0]
    x = _core._full([n, 1, 16, 16], 0.0, u8.device, _core.dtype.float32)
    x[:, :, 4:12, 4:12] = (u8.to(_core.dtype.float32) / 16.0).unsqueeze(1)
    return x
