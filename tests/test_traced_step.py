"""The traced SVI step (``fit(compile="trace")``, ``svi_step(compile="trace")``): recorded once per batch shape,
replayed after, with the eager step's losses, gradients and random draws."""

from __future__ import annotations

import warnings

import pyro
import pytest
import torch

from pyrobnn import BayesianNetwork, DropoutGuide, NormalGuide, ScaleMixturePrior, fit
from pyrobnn.infer import svi as svi_module
from pyrobnn.infer.optim import Optim
from pyrobnn.infer.svi import TRACE, svi_step
from pyrobnn.model.likelihoods import Gaussian
from pyrobnn.networks import MLP


def _regression(guide: str, prior=None):
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = BayesianNetwork(MLP(5, (16,), 1), Gaussian(scale=0.5), prior=prior, num_data=70)
    if guide == "dropout":
        return model, DropoutGuide(model, rate=0.1)
    return model, NormalGuide(model, init_rho=-3.0)


def _data():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(70, 5, generator=generator)
    return x, x[:, :1].sin() + 0.1 * torch.randn(70, 1, generator=generator)


def _steps(guide, estimator, compile, num_particles=1, prior=None, steps=3, validation=True):
    """Terms and gradients of ``steps`` steps at learning rate 0 (nothing moves, every step draws anew), and the
    step's recorder (None for the eager step)."""
    model, guide = _regression(guide, prior)
    x, y = _data()
    optim = torch.optim.SGD([*guide.parameters(), *model.parameters()], lr=0.0)
    pyro.set_rng_seed(3)
    out = []
    with pyro.validation_enabled(validation):
        for _ in range(steps):
            terms = svi_step(model, guide, optim, x[:32], y[:32], estimator=estimator, num_particles=num_particles,
                             compile=compile)
            out.append((terms, {name: p.grad.clone() for name, p in guide.named_parameters()}))
    return out, svi_module._COMPILED[guide][compile, estimator] if compile else None


@pytest.mark.parametrize("validation", [False, True], ids=["gradients-recorded", "terms-recorded"])
@pytest.mark.parametrize("guide,estimator,num_particles,prior", [
    ("dropout", "local", 1, None), ("normal", "sample", 5, ScaleMixturePrior()), ("normal", "local", 1, None),
    ("normal", "flipout", 2, None), ("normal", "vdp", 1, None)])
def test_the_traced_step_has_the_eager_losses_gradients_and_draws(guide, estimator, num_particles, prior,
                                                                   validation):
    # without validation the backward pass is recorded too; with it (values read to check arguments) the terms are
    # recorded alone and differentiated by autograd
    eager, _ = _steps(guide, estimator, False, num_particles, prior, validation=validation)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback to eager steps
        traced, recorder = _steps(guide, estimator, TRACE, num_particles, prior, validation=validation)
    if validation:
        assert not recorder.graphs and recorder.fallback.graphs and recorder.failed is not None
    else:  # one recording: where the first one moved the parameters (into one flat storage) it is made again
        assert len(recorder.graphs) == 1 and not recorder.fallback.graphs, recorder.failed
    for (a, grads_a), (b, grads_b) in zip(eager, traced):
        for u, v in zip(a, b):
            torch.testing.assert_close(torch.as_tensor(u), torch.as_tensor(v), rtol=1e-6, atol=1e-6)
        assert grads_a.keys() == grads_b.keys()
        for name in grads_a:
            torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-6)
    if estimator != "vdp":  # (VDP++ propagates moments: it draws nothing)
        assert eager[0][0].loss != eager[1][0].loss  # each step draws anew, in the replay too


def _fit(compile, beta=None, epochs=6):
    model, guide = _regression("dropout")
    x, y = _data()
    options = {} if beta is None else {"beta": beta}
    history = fit(model, guide, x, y, epochs=epochs, batch_size=32, optimizer=Optim(lr=0.01), compile=compile,
                  seed=4, progress=False, device="cpu", **options)
    return history, {name: p.detach().clone() for name, p in guide.named_parameters()}


def test_fit_with_a_traced_step_trains_as_the_eager_fit():
    # 70 rows in batches of 32: two batch shapes, so two recordings; Adam moves the parameters between replays
    eager, eager_params = _fit(False)
    traced, traced_params = _fit(TRACE)
    for key in ("loss", "nll", "kl"):
        torch.testing.assert_close(torch.tensor(traced[key]), torch.tensor(eager[key]), rtol=1e-5, atol=1e-6)
    for name in eager_params:
        torch.testing.assert_close(traced_params[name], eager_params[name], rtol=1e-5, atol=1e-6)
    assert traced["loss"][-1] < traced["loss"][0]


def _ramp(epoch, step, steps):
    return min(1.0, (epoch * steps + step + 1) / 12)


def test_a_beta_that_changes_every_step_is_an_input_of_one_recording(monkeypatch):
    # beta enters the graph as a tensor: a warm-up schedule replays the recording of each batch shape (two here)
    eager, _ = _fit(False, beta=_ramp, epochs=5)
    recordings, trace = [], svi_module.torch.jit.trace

    def counting(*args, **kwargs):
        recordings.append(args[1][0].shape)
        return trace(*args, **kwargs)

    monkeypatch.setattr(svi_module.torch.jit, "trace", counting)
    traced, _ = _fit(TRACE, beta=_ramp, epochs=5)
    assert len(recordings) == 2, recordings
    torch.testing.assert_close(torch.tensor(traced["loss"]), torch.tensor(eager["loss"]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(traced["kl"]), torch.tensor(eager["kl"]), rtol=1e-5, atol=1e-6)


def test_a_model_that_cannot_be_traced_trains_eagerly_after_one_warning(monkeypatch):
    eager, _ = _steps("dropout", "local", False)

    def failing(*args, **kwargs):
        raise RuntimeError("this model cannot be traced")

    monkeypatch.setattr(svi_module.torch.jit, "trace", failing)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fallen, _ = _steps("dropout", "local", TRACE)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "cannot be traced" in messages[0] and "eagerly" in messages[0], messages
    for (a, _), (b, _) in zip(eager, fallen):
        torch.testing.assert_close(a.loss, b.loss)
