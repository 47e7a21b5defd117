"""CIFAR-10 with ResNet-20: a plug-in task with a deeper model and BatchNorm buffers.

``task = "examples.resnet:task"`` (or ``--preset resnet``). The data, the folder
lookup, the provenance and the backdoor trigger are the built-in CIFAR-10 task's
(:mod:`task.tasks.cifar10`); only the model differs: ResNet-20 of He et al., "Deep
Residual Learning for Image Recognition" (CVPR 2016, Sec. 4.2), the CIFAR network
federated-learning papers use: a 3x3 convolution with 16 channels, then 3 stages of
3 basic blocks (16, 32, 64 channels; the first block of stages 2 and 3 halves the
side with stride 2 and pads the shortcut's new channels with zeros, the paper's
option A), global average pooling and one linear layer: 269,722 parameters. Every
convolution is followed by BatchNorm, so the model's ``state_dict()`` also holds
running means and variances (float32) and ``num_batches_tracked`` counters (int64):
they travel, are averaged, calibrated and stored (coded storage codes the counters
exactly). Images enter as uint8 and are normalised inside the model, as the built-in
CNN does.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from task.tasks import cifar10


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm and a shortcut (He et al. 2016, Fig. 2).

    Parameters
    ----------
    cin, cout : int
        Input and output channels (``cout`` = ``cin`` or 2 ``cin``).
    stride : int
        1, or 2 to halve the side (the shortcut then subsamples and zero-pads).
    """

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.stride, self.pad = stride, cout - cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, cin, H, W) float -> (B, cout, H / stride, W / stride)."""
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x[:, :, ::self.stride, ::self.stride] if self.stride > 1 else x
        if self.pad:  # option A: the new channels of the shortcut are zeros
            shortcut = F.pad(shortcut, (0, 0, 0, 0, 0, self.pad))
        return F.relu(out + shortcut)


class ResNet20(nn.Module):
    """ResNet-20 for 3x32x32 images (n = 3 blocks a stage, 6 n + 2 = 20 layers).

    Parameters
    ----------
    num_classes : int
        Output classes (10).
    width : int
        Channels of the first stage (16; then 2x and 4x).
    """

    def __init__(self, num_classes: int = 10, width: int = 16) -> None:
        super().__init__()
        self.mean, self.std = cifar10.NORMALISATION  # Python floats: no buffers
        self.conv = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        blocks, cin = [], width
        for stage, cout in enumerate((width, 2 * width, 4 * width)):
            for i in range(3):
                blocks.append(BasicBlock(cin, cout, 2 if stage and i == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):  # He et al. 2015's initialisation
                nn.init.kaiming_normal_(module.weight, mode="fan_out",
                                        nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, num_classes) of images (B, 3, 32, 32), uint8 or float in [0, 1]."""
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        mean = torch.tensor(self.mean, device=x.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, device=x.device).view(1, -1, 1, 1)
        out = F.relu(self.bn(self.conv((x - mean) / std)))
        out = self.blocks(out)
        return self.fc(F.adaptive_avg_pool2d(out, 1).flatten(1))


def resnet20(num_classes: int) -> nn.Module:
    """The task's model factory: a fresh :class:`ResNet20`."""
    return ResNet20(num_classes)


task = replace(cifar10.task, name="cifar10-resnet20", model=resnet20)
"""The plug-in: the built-in CIFAR-10 task with ResNet-20 as its model."""
