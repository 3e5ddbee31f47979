"""The paper's three models (§4.1): a small CNN for Fashion-MNIST, a deeper CNN for EMNIST,
and PreAct ResNet-18 for CIFAR-10.

The paper gives the layer counts but not the widths (its Table 2 is missing from the text):
- Fashion-MNIST: 2 conv + 2 max-pool + 2 fully-connected. We use the classic FedAvg CNN
  (5x5 convs with 32 and 64 channels, a 512-unit hidden layer): 582,026 parameters.
- EMNIST: 3 conv + 3 max-pool + 3 fully-connected, "more than 1.6 million parameters".
  3x3 convs with 32/64/128 channels and hidden layers of 1024 and 512 units give 1,822,255
  parameters for the 47 classes of the `balanced` split.
- CIFAR-10: PreAct ResNet-18 (He et al., 2016) in its common CIFAR form (4x4 average pooling
  after the last block, no final BatchNorm), 11,171,146 parameters. BatchNorm running statistics
  are buffers, not parameters; the simulator aggregates them like parameters (see training.py).
"""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

__all__ = ["FMNISTCNN", "EMNISTCNN", "PreActResNet18", "build_model", "num_parameters", "MODEL_FOR_DATASET"]


class FMNISTCNN(nn.Module):
    """Two conv, two max-pool and two fully-connected layers (paper §4.1)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, kernel_size=5)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=5)
        self.fc1 = nn.Linear(64 * 4 * 4, 512)
        self.fc2 = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


class EMNISTCNN(nn.Module):
    """Three conv, three max-pool and three fully-connected layers, > 1.6 M parameters (paper §4.1)."""

    def __init__(self, num_classes: int = 47, in_channels: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3, padding=1)
        self.conv3 = nn.Conv2d(64, 128, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(128 * 3 * 3, 1024)
        self.fc2 = nn.Linear(1024, 512)
        self.fc3 = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)  # 28 -> 14
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # 14 -> 7
        x = F.max_pool2d(F.relu(self.conv3(x)), 2)  # 7 -> 3
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return self.fc3(F.relu(self.fc2(x)))


class _PreActBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.shortcut = None
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(x))
        shortcut = self.shortcut(out) if self.shortcut is not None else x
        out = self.conv1(out)
        out = self.conv2(F.relu(self.bn2(out)))
        return out + shortcut


class PreActResNet18(nn.Module):
    """PreAct ResNet-18 for 32x32 inputs (He et al., 2016); used for CIFAR-10 (paper §4.1)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        layers, in_planes = [], 64
        for planes, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            for s in (stride, 1):
                layers.append(_PreActBlock(in_planes, planes, s))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        self.linear = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(self.conv1(x))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


MODEL_FOR_DATASET = {"fmnist": FMNISTCNN, "emnist": EMNISTCNN, "cifar10": PreActResNet18}


def build_model(dataset: str, num_classes: int, in_channels: int) -> nn.Module:
    """The paper's model for `dataset` (one of MODEL_FOR_DATASET)."""
    if dataset not in MODEL_FOR_DATASET:
        raise ValueError(f"dataset must be one of {sorted(MODEL_FOR_DATASET)}, got {dataset!r}")
    return MODEL_FOR_DATASET[dataset](num_classes=num_classes, in_channels=in_channels)


def num_parameters(model: nn.Module) -> int:
    """Number of trainable parameters d (the dimension of every client update)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
