"""Where tensors live: ``auto|cpu|cuda`` resolution, the device a model is on, and how much memory a call takes
there (so that prediction can bound its passes by what it measures)."""

from __future__ import annotations

import os
import resource
import sys
import weakref
from typing import Callable

import torch
from torch import nn

from pyrobnn._compat import TorchDispatchMode, tree_flatten

__all__ = ["resolve_device", "device_of", "DEVICE_METAVAR", "peak_bytes", "memory_budget", "DEFAULT_CPU_BUDGET",
           "process_peak_bytes"]


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


DEFAULT_CPU_BUDGET = 2 * 1024**3
"""At most this many bytes (2 GiB) of activations per pass on a CPU unless told otherwise, and never more than a
quarter of the memory the system has available."""


class _LiveBytes(TorchDispatchMode):
    """The peak of the bytes held by the storages that operations create while the mode is active: each new
    storage counts from its creation until its tensor is freed (views and in-place results add nothing)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._storages: set[int] = set()

    def _free(self, key: int, size: int) -> None:
        self._storages.discard(key)
        self.live -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
                storage = tensor.untyped_storage()
                key, size = storage.data_ptr(), storage.nbytes()
                if size and key not in self._storages:
                    self._storages.add(key)
                    self.live += size
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(tensor, self._free, key, size)
        return out


def peak_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """The most memory that ``fn()`` holds at once beyond what was allocated before it: the CUDA allocator's peak
    on a GPU; on a CPU the peak of the bytes its operations' results hold (:class:`_LiveBytes`)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        return max(torch.cuda.max_memory_allocated(device) - before, 0)
    mode = _LiveBytes()
    with mode:
        fn()
    return mode.peak


def _available_cpu_bytes() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def memory_budget(device: torch.device, max_memory: int | None = None) -> int:
    """Bytes one pass may hold on ``device``: ``max_memory`` when given, else half the free memory of a GPU, or
    on a CPU :data:`DEFAULT_CPU_BUDGET` and at most a quarter of the available memory."""
    if max_memory is not None:
        if isinstance(max_memory, bool) or not isinstance(max_memory, int) or max_memory < 1:
            raise ValueError(f"max_memory must be a number of bytes >= 1, got {max_memory!r}")
        return max_memory
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free // 2
    return min(DEFAULT_CPU_BUDGET, _available_cpu_bytes() // 4)


def process_peak_bytes(device: torch.device) -> int:
    """The most memory this process has held so far: the CUDA allocator's peak on a GPU, the peak resident set
    size (``getrusage``) on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux
