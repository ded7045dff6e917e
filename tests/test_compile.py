"""A compiled SVI step (``fit(compile=...)``, ``svi_step(compile=...)``): the eager step's loss and gradients."""

from __future__ import annotations

import warnings

import pyro
import pytest
import torch

from pyrobnn import BayesianNetwork, NormalGuide, ScaleMixturePrior, fit
from pyrobnn.infer.optim import make_optimizer
from pyrobnn.infer.svi import svi_step
from pyrobnn.networks import MLP


def _step(estimator, compile, prior=None, seed=0, steps=1, validation=True):
    """Loss, NLL, KL and every gradient of a step from the same initial state and seed (lr 0: nothing moves)."""
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = BayesianNetwork(MLP(6, (8,), 3), prior=prior, num_data=100)
    guide = NormalGuide(model, init_rho=-2.0)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    optim = torch.optim.SGD(guide.parameters(), lr=0.0)
    pyro.set_rng_seed(seed)
    with pyro.validation_enabled(validation):
        for _ in range(steps):
            terms = svi_step(model, guide, optim, x, y, estimator=estimator, compile=compile)
    grads = {name: p.grad.clone() for name, p in guide.named_parameters()}
    return terms, grads


@pytest.mark.parametrize("validation", [False, True], ids=["gradients-recorded", "terms-compiled"])
@pytest.mark.parametrize("estimator,prior", [("sample", None), ("sample", ScaleMixturePrior()), ("vdp", None),
                                             ("local", None), ("flipout", None)])
def test_the_compiled_step_has_the_eager_loss_and_gradients(estimator, prior, validation):
    # aot_eager: dynamo and AOT autograd run by eager kernels, so the random draws are the eager ones and the
    # comparison is exact up to floating point
    eager, eager_grads = _step(estimator, False, prior, validation=validation)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled, compiled_grads = _step(estimator, "aot_eager", prior, validation=validation)
    fell_back = [w for w in caught if "training eagerly" in str(w.message)]
    # the recorded step and its gradient (fit runs without Pyro's validation) compile as one graph whatever the
    # estimator; with validation (values read) the terms are compiled alone, and Dynamo cannot follow the lazy
    # weights of local reparameterization and flipout (a tensor subclass)
    expected = validation and estimator in ("local", "flipout")
    assert bool(fell_back) == expected, [str(w.message) for w in fell_back]
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert eager_grads.keys() == compiled_grads.keys()
    for name in eager_grads:
        torch.testing.assert_close(eager_grads[name], compiled_grads[name], rtol=1e-5, atol=1e-6)
    assert any(g.abs().sum() > 0 for g in compiled_grads.values())


def _failing_backend(graph, example_inputs):
    raise RuntimeError("this backend compiles nothing")


def test_a_model_that_cannot_compile_trains_eagerly_after_one_warning():
    torch._dynamo.register_backend(_failing_backend, name="pyrobnn_test_failing")
    eager, eager_grads = _step("sample", False, steps=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fallen, fallen_grads = _step("sample", "pyrobnn_test_failing", steps=3)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "pyrobnn_test_failing" in messages[0] and "eagerly" in messages[0], messages
    torch.testing.assert_close(eager.loss, fallen.loss)
    for name in eager_grads:
        torch.testing.assert_close(eager_grads[name], fallen_grads[name])


def test_fit_refuses_a_compile_value_that_is_no_backend():
    model = BayesianNetwork(MLP(6, (8,), 3), num_data=16)
    guide = NormalGuide(model)
    with pytest.raises(ValueError, match="compile must be True, False or the name"):
        fit(model, guide, torch.randn(16, 6), torch.randint(0, 3, (16,)), epochs=1, compile=3, progress=False)


def test_fit_with_compile_trains():
    torch.manual_seed(0)
    x = torch.randn(64, 6)
    y = (x[:, 0] > 0).long()
    model = BayesianNetwork(MLP(6, (8,), 2), num_data=64)
    guide = NormalGuide(model, init_rho=-4.0)
    history = fit(model, guide, x, y, epochs=4, batch_size=32, compile="aot_eager", progress=False,
                  optimizer=lambda model, guide: make_optimizer(guide.parameters(), lr=0.05))
    assert history["loss"][-1] < history["loss"][0]


def test_the_inductor_step_draws_the_eager_noise_and_fuses_the_rest():
    # the recorded step and its gradient compile as one graph; inductor takes torch's random draws
    # (fallback_random), so the loss and gradients are the eager ones up to the fused arithmetic
    eager, eager_grads = _step("sample", False, ScaleMixturePrior(), steps=2, validation=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback to eager steps
        compiled, compiled_grads = _step("sample", True, ScaleMixturePrior(), steps=2, validation=False)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    for name in eager_grads:
        torch.testing.assert_close(eager_grads[name], compiled_grads[name], rtol=1e-4, atol=1e-5)
