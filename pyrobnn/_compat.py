"""The private Pyro and PyTorch internals pyrobnn borrows, in one place.

Each name here is not part of its library's documented API and may move in a
release; ``tests/test_compat.py`` imports and exercises every one, so a
breaking upgrade fails there with the name, not deep inside a training run.
Public APIs (``pyro.poutine.runtime.effectful``, ``get_plates``,
``pyro.poutine.util.site_is_subsample``) are imported where they are used.
"""

from __future__ import annotations

from torch import nn
from torch._C import DisableTorchFunctionSubclass
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

__all__ = [
    "BatchNormBase",
    "DisableTorchFunctionSubclass",
    "DropoutBase",
    "TorchDispatchMode",
    "pyro_context",
    "pyro_name",
    "pyro_samples",
    "tree_flatten",
    "tree_map",
]

BatchNormBase = nn.modules.batchnorm._NormBase
"""Base of BatchNorm and InstanceNorm layers (kept deterministic by default)."""

DropoutBase = nn.modules.dropout._DropoutNd
"""Base of the dropout layers (switched on for MC dropout)."""


def pyro_samples(module: nn.Module) -> dict:
    """The ``PyroSample`` attributes of a PyroModule: ``{attribute: prior or callable}``."""
    return getattr(module, "_pyro_samples", {})


def pyro_name(module: nn.Module) -> str:
    """A PyroModule's full name prefix (its sites are named ``<prefix>.<attribute>``)."""
    return module._pyro_name


def pyro_context(module: nn.Module):
    """A PyroModule's context manager: inside it, parameters go through Pyro's param store."""
    return module._pyro_context
