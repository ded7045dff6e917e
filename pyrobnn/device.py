"""Where tensors live: ``auto|cpu|cuda`` resolution and the device a model is on."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["resolve_device", "device_of"]


DEVICE_METAVAR = "{auto,cpu,cuda,cuda:N}"
"""The device choices as the command line shows them (:func:`resolve_device` takes each)."""


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` (CUDA when present, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        return torch.device("cpu")
    if isinstance(device, str) and device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} but CUDA is not available here: use --device cpu or auto")
        return torch.device(device)
    raise ValueError(f"device must be one of {DEVICE_METAVAR}, got {device!r}")


def device_of(*modules: nn.Module) -> torch.device:
    """The device of the first parameter or buffer found in ``modules`` (CPU if they hold none)."""
    for module in modules:
        for tensor in (*module.parameters(), *module.buffers()):
            return tensor.device
    return torch.device("cpu")
