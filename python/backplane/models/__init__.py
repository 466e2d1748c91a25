"""Model definitions of the examples: LeNet-5 (d2l) and ResNet-18 in its CIFAR shape, with
PyTorch's module names and state_dict keys."""
from .lenet import LeNet, digits_images
from .resnet import BasicBlock, ResNet18, resnet18_cifar

__all__ = ["LeNet", "digits_images", "BasicBlock", "ResNet18", "resnet18_cifar"]
