"""Model definitions of the examples: LeNet-5 (d2l), ResNet-18 in its CIFAR shape and nanoGPT's
GPT, with PyTorch's module names and state_dict keys."""
from .lenet import LeNet, digits_images
from .resnet import BasicBlock, ResNet18, resnet18_cifar
from .gpt import GPT, GPTConfig

__all__ = ["LeNet", "digits_images", "BasicBlock", "ResNet18", "resnet18_cifar", "GPT", "GPTConfig"]
