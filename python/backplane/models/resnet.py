"""ResNet-18 in its CIFAR shape: torchvision's resnet18 with a 3x3 stride-1 first convolution
and no max pooling, with torchvision's module names (state_dict keys), so a PyTorch model's
state_dict (e.g. through safetensors) loads as it is. `width` scales every layer (64 is
ResNet-18). Same as the C++ examples/resnet/resnet.hpp."""
import math

from .. import _core, nn
from .._runtime import no_grad
from ..nn import functional as F


def _kaiming_normal_fan_out(w):
    """torchvision's init: kaiming_normal_(mode='fan_out', nonlinearity='relu')."""
    fan_out = w.shape[0] * w.shape[2] * w.shape[3]
    with no_grad():
        w.copy_(_core._randn(list(w.shape), w.device, w.dtype) * math.sqrt(2.0 / fan_out))


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False, **kw)
        self.bn1 = nn.BatchNorm2d(planes, **kw)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False, **kw)
        self.bn2 = nn.BatchNorm2d(planes, **kw)
        _kaiming_normal_fan_out(self.conv1.weight)
        _kaiming_normal_fan_out(self.conv2.weight)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            conv = nn.Conv2d(inplanes, planes, 1, stride, bias=False, **kw)
            _kaiming_normal_fan_out(conv.weight)
            self.downsample = nn.Sequential(conv, nn.BatchNorm2d(planes, **kw))

    def forward(self, x):
        out = self.bn1(self.conv1(x)).relu()
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return (out + identity).relu()


class ResNet18(nn.Module):
    def __init__(self, num_classes=10, width=64, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False, **kw)
        _kaiming_normal_fan_out(self.conv1.weight)
        self.bn1 = nn.BatchNorm2d(width, **kw)
        inplanes = width
        for i in range(4):
            planes, stride = width << i, (1 if i == 0 else 2)
            setattr(self, f"layer{i + 1}",
                    nn.Sequential(BasicBlock(inplanes, planes, stride, **kw),
                                  BasicBlock(planes, planes, 1, **kw)))
            inplanes = planes
        self.fc = nn.Linear(inplanes, num_classes, **kw)

    def forward(self, x):
        x = self.bn1(self.conv1(x)).relu()
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = F.adaptive_avg_pool2d(x, 1)
        return self.fc(x.flatten(1))


def resnet18_cifar(num_classes=10, width=64, device=None, dtype=None):
    return ResNet18(num_classes, width, device, dtype)
