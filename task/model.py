"""The paper's image model: a small CNN (the character GPT is :mod:`task.nanogpt`).

CNN (paper: "2 convolution layers, 2 pooling layers and 2 fully connected
layers"): conv 5x5 -> ReLU -> max-pool 2 -> conv 5x5 -> ReLU -> max-pool 2 ->
fc -> ReLU -> fc.  Sized to train 100 clients on a few CPU cores; each image
task's module gives its sizes (:mod:`task.tasks`):

- MNIST / Fashion-MNIST (1x28x28): channels 16, 32, hidden 128: 80,202 parameters;
- CIFAR-10 (3x32x32): channels 32, 64, hidden 128: 259,914 parameters.

Inputs are raw uint8 images; the model scales and normalises them with the
task's per-channel mean and standard deviation held as plain Python floats, so
``state_dict()`` holds trainable parameters only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def _per_channel(value: float | Sequence[float], channels: int, name: str
                 ) -> tuple[float, ...]:
    values = (float(value),) if isinstance(value, (int, float)) else \
        tuple(float(v) for v in value)
    if len(values) == 1:
        values = values * channels
    if len(values) != channels:
        raise ValueError(f"{name} has {len(values)} values; expected 1 or {channels}")
    return values


class CNN(nn.Module):
    """Two conv + two max-pool + two fully connected layers, ReLU.

    Parameters
    ----------
    in_channels : int
        Image channels C (1 or 3).
    image_size : int
        Side H = W of the square images (28 or 32).
    num_classes : int
        Number of output classes.
    mean, std : float or sequence of float
        Per-channel mean / standard deviation of images scaled to [0, 1]
        (one value is repeated over channels).  Stored as Python floats, not
        buffers: ``state_dict()`` holds the trainable parameters only.
    channels : (int, int)
        Output channels of the two 5x5 convolutions.
    hidden : int
        Width of the first fully connected layer.

    Raises
    ------
    ValueError
        If ``mean`` / ``std`` do not match ``in_channels``, a std is not
        positive, or the image is too small for two conv + pool stages.
    """

    def __init__(self, in_channels: int, image_size: int, num_classes: int,
                 mean: float | Sequence[float], std: float | Sequence[float],
                 channels: tuple[int, int] = (16, 32), hidden: int = 128) -> None:
        super().__init__()
        self.mean = _per_channel(mean, in_channels, "mean")
        self.std = _per_channel(std, in_channels, "std")
        if min(self.std) <= 0:
            raise ValueError(f"std={self.std} must be positive")
        side = ((image_size - 4) // 2 - 4) // 2
        if side < 1:
            raise ValueError(f"image_size={image_size} is too small (needs >= 16)")
        self.conv1 = nn.Conv2d(in_channels, channels[0], kernel_size=5)
        self.conv2 = nn.Conv2d(channels[0], channels[1], kernel_size=5)
        self.fc1 = nn.Linear(channels[1] * side * side, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        """Scale and normalise images.

        Parameters
        ----------
        x : torch.Tensor
            (B, C, H, W); uint8 values 0..255 are divided by 255, floating
            values are taken as already in [0, 1].

        Returns
        -------
        torch.Tensor
            float32 (B, C, H, W), ``(x - mean) / std`` per channel.
        """
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        std = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
        return (x - mean) / std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits.

        Parameters
        ----------
        x : torch.Tensor
            Images (B, C, H, W), uint8 or float (see :meth:`normalise`).

        Returns
        -------
        torch.Tensor
            float32 logits, shape (B, num_classes).
        """
        relu, pool = nn.functional.relu, nn.functional.max_pool2d
        x = pool(relu(self.conv1(self.normalise(x))), 2)
        x = pool(relu(self.conv2(x)), 2)
        return self.fc2(relu(self.fc1(x.flatten(1))))
