"""Every private Pyro/PyTorch name pyrobnn borrows (pyrobnn._compat) still exists and behaves as used."""

from __future__ import annotations

import pyro
import torch
from pyro.nn import PyroModule, PyroParam, PyroSample
from torch import nn

from pyrobnn import _compat


def test_every_borrowed_name_is_exported():
    for name in _compat.__all__:
        assert getattr(_compat, name) is not None, name


def test_layer_bases_cover_the_layers_pyrobnn_treats_specially():
    assert (isinstance(nn.BatchNorm2d(3), _compat.BatchNormBase)
            and isinstance(nn.InstanceNorm1d(3), _compat.BatchNormBase))
    assert isinstance(nn.Dropout(0.5), _compat.DropoutBase) and isinstance(nn.Dropout2d(0.5), _compat.DropoutBase)
    assert not isinstance(nn.LayerNorm(3), _compat.BatchNormBase)


def test_pytree_and_torch_function_helpers():
    leaves, _ = _compat.tree_flatten(((1, [2, 3]), {"a": 4}))
    assert leaves == [1, 2, 3, 4]
    assert _compat.tree_map(lambda v: v * 10, (1, [2])) == (10, [20])

    class Marked(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            raise AssertionError("subclass dispatch should be disabled")

    x = torch.Tensor._make_subclass(Marked, torch.ones(2), False)
    with _compat.DisableTorchFunctionSubclass():
        assert torch.equal(x + 1, torch.full((2,), 2.0))


def test_dispatch_mode_sees_aten_calls():
    seen = []

    class Record(_compat.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Record():
        torch.ones(3).mul(2)
    assert any("mul" in name for name in seen)


def test_pyro_module_internals():
    module = PyroModule[nn.Linear](2, 3)
    module.weight = PyroSample(pyro.distributions.Normal(0.0, 1.0).expand([3, 2]).to_event(2))
    module.scale = PyroParam(torch.ones(3))
    assert set(_compat.pyro_samples(module)) == {"weight"}
    assert _compat.pyro_samples(nn.Linear(2, 3)) == {}
    assert _compat.pyro_name(module) == ""
    outer = PyroModule()
    outer.layer = module
    assert _compat.pyro_name(module) == "layer"
    with _compat.pyro_context(outer):  # inside the context parameters go through the param store
        module.scale
    assert "layer.scale" in pyro.get_param_store()


def test_a_recording_shares_one_fake_tensor_mode_and_inductor_compiles_a_graph():
    from torch.fx.experimental.proxy_tensor import make_fx

    with _compat.tracing(_compat.TracingContext(_compat.FakeTensorMode(allow_fallback_kernels=True))):
        graph = make_fx(lambda a: (a * 2 + 1,))(torch.ones(3))
    compiled = _compat.inductor_compile(graph, [torch.ones(3)])
    assert torch.equal(compiled(torch.arange(3.0))[0], torch.tensor([1.0, 3.0, 5.0]))
