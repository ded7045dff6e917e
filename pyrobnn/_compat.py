"""The private Pyro and PyTorch internals pyrobnn borrows, in one place.

Each name here is not part of its library's documented API and may move in a
release; ``tests/core/test_compat.py`` imports and exercises every one, so a
breaking upgrade fails there with the name, not deep inside a training run.
Public APIs (``pyro.poutine.runtime.effectful``, ``get_plates``,
``pyro.poutine.util.site_is_subsample``) are imported where they are used.
"""

from __future__ import annotations

from torch import nn
from torch._C import DisableTorchFunctionSubclass
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

try:  # one fake-tensor mode for a whole make_fx recording (pyrobnn.infer.recording)
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
except ImportError:  # another torch: make_fx builds a mode per node
    TracingContext = tracing = FakeTensorMode = None

__all__ = [
    "BatchNormBase",
    "FakeTensorMode",
    "TracingContext",
    "inductor_cache_dir",
    "inductor_compile",
    "tracing",
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
    """The ``PyroSample`` attributes of a PyroModule: ``{attribute: prior or callable}``; none for a plain module
    (read from its own ``__dict__``: a wrapper that forwards attributes, as ``peft``'s does, must not lend its
    child's)."""
    return module.__dict__.get("_pyro_samples", {})


def pyro_name(module: nn.Module) -> str:
    """A PyroModule's full name prefix (its sites are named ``<prefix>.<attribute>``)."""
    return module._pyro_name


def pyro_context(module: nn.Module):
    """A PyroModule's context manager: inside it, parameters go through Pyro's param store."""
    return module._pyro_context


def inductor_compile(graph, example_inputs: list, options: dict | None = None):
    """``torch._inductor.compile``: an fx graph of ATen operations compiled by TorchInductor, without Dynamo's
    guards (imported when first used: the import takes seconds). It compiles inside a tracing context whose fake
    mode has a shape environment, which inductor's FX graph cache needs (without one it bypasses the cache): a
    later process compiling the same graph loads it from :func:`inductor_cache_dir` in seconds."""
    from torch._inductor import compile as compile_graph

    if TracingContext is None:  # another torch: no cache
        return compile_graph(graph, example_inputs, options=options)
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with tracing(TracingContext(FakeTensorMode(shape_env=ShapeEnv()))):
        return compile_graph(graph, example_inputs, options=options)


def inductor_cache_dir() -> str:
    """The folder of TorchInductor's on-disk caches (``TORCHINDUCTOR_CACHE_DIR``, else a per-user folder of the
    temporary directory), created if missing."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()
