"""The step engine (``pyrobnn.infer.step``): one executor vocabulary (``compile="auto" | "none" | "trace" |
"inductor"``), every mode with the eager step's losses, gradients and random draws for the same seed, the ``auto``
rule and its fallbacks, and an explicit mode that cannot run saying so."""

from __future__ import annotations

import warnings

import pyro
import pytest
import torch

from pyrobnn import BayesianNetwork, DropoutGuide, NormalGuide, ScaleMixturePrior, fit
from pyrobnn.infer import recording
from pyrobnn.infer import step as step_module
from pyrobnn.infer.elbo import MeanFieldELBO
from pyrobnn.infer.optim import Optim
from pyrobnn.infer.recording import auto_mode
from pyrobnn.infer.step import ExecutorFailed, Step, svi_step
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
    engine that ran them."""
    model, guide = _regression(guide, prior)
    x, y = _data()
    optim = torch.optim.SGD([*guide.parameters(), *model.parameters()], lr=0.0)
    elbo = MeanFieldELBO(num_particles, vectorize_particles=True, estimator=estimator)
    pyro.set_rng_seed(3)
    out = []
    with pyro.validation_enabled(validation):
        for _ in range(steps):
            terms = svi_step(model, guide, optim, x[:32], y[:32], elbo=elbo, compile=compile)
            out.append((terms, {name: p.grad.clone() for name, p in guide.named_parameters()}))
    return out, step_module._STEPS[guide][id(model), step_module._settings(elbo), compile]


def _same(first, second, rtol=1e-6, atol=1e-6):
    for (a, grads_a), (b, grads_b) in zip(first, second):
        for u, v in zip(a, b):
            torch.testing.assert_close(torch.as_tensor(u), torch.as_tensor(v), rtol=rtol, atol=atol)
        assert grads_a.keys() == grads_b.keys()
        for name in grads_a:
            torch.testing.assert_close(grads_a[name], grads_b[name], rtol=10 * rtol, atol=atol)


@pytest.mark.parametrize("validation", [False, True])
@pytest.mark.parametrize("guide,estimator,num_particles,prior", [
    ("dropout", "local", 1, None), ("normal", "sample", 5, ScaleMixturePrior()), ("normal", "local", 1, None),
    ("normal", "flipout", 2, None), ("normal", "vdp", 1, None)])
def test_the_recorded_step_has_the_eager_losses_gradients_and_draws(guide, estimator, num_particles, prior,
                                                                    validation):
    # Pyro's argument validation (values read on the host) is off while recording: with it on or off the loss and
    # its gradient are recorded as one graph, replayed with the eager draws
    eager, engine = _steps(guide, estimator, "none", num_particles, prior, validation=validation)
    assert engine.executor == "none" and not engine.graphs
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback
        traced, engine = _steps(guide, estimator, "trace", num_particles, prior, validation=validation)
    assert engine.executor == "trace" and len(engine.graphs) == 1
    _same(eager, traced)
    if estimator != "vdp":  # (VDP++ propagates moments: it draws nothing)
        assert eager[0][0].loss != eager[1][0].loss  # each step draws anew, in the replay too


@pytest.mark.slow
def test_the_inductor_step_draws_the_eager_noise_and_fuses_the_rest():
    # inductor takes torch's random draws (fallback_random), so the loss and gradients are the eager ones up to the
    # fused arithmetic
    eager, _ = _steps("normal", "sample", "none", 2, ScaleMixturePrior(), steps=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        compiled, engine = _steps("normal", "sample", "inductor", 2, ScaleMixturePrior(), steps=2)
    assert engine.executor == "inductor"
    _same(eager, compiled, rtol=1e-4, atol=1e-4)


def _fit(compile, beta=None, epochs=6):
    model, guide = _regression("dropout")
    x, y = _data()
    options = {} if beta is None else {"beta": beta}
    history = fit(model, guide, x, y, epochs=epochs, batch_size=32, optimizer=Optim(lr=0.01), compile=compile,
                  seed=4, progress=False, device="cpu", **options)
    return history, {name: p.detach().clone() for name, p in guide.named_parameters()}


def test_fit_by_default_records_its_step_and_trains_as_the_eager_fit():
    # 70 rows in batches of 32: two batch shapes, so two recordings; Adam moves the parameters between replays.
    # 34 epochs of 3 steps: enough steps to repay a recording (recording.RECORD_STEPS_CPU)
    eager, eager_params = _fit("none", epochs=34)
    default, default_params = _fit("auto", epochs=34)
    assert eager.compile == "none" and default.compile == "trace" and "CPU" in default.compile_reason
    for key in ("loss", "nll", "kl"):
        torch.testing.assert_close(torch.tensor(default[key]), torch.tensor(eager[key]), rtol=1e-5, atol=1e-6)
    for name in eager_params:
        torch.testing.assert_close(default_params[name], eager_params[name], rtol=1e-5, atol=1e-6)
    assert default["loss"][-1] < default["loss"][0]


def _ramp(epoch, step, steps):
    return min(1.0, (epoch * steps + step + 1) / 12)


def test_a_beta_that_changes_every_step_is_an_input_of_one_recording(monkeypatch):
    # beta enters the graph as a tensor: a warm-up schedule replays the recording of each batch shape (two here)
    eager, _ = _fit("none", beta=_ramp, epochs=5)
    recordings, record = [], step_module.record

    def counting(fn, inputs):
        recordings.append(inputs[0].shape)
        return record(fn, inputs)

    monkeypatch.setattr(step_module, "record", counting)
    traced, _ = _fit("trace", beta=_ramp, epochs=5)
    assert len(recordings) == 2, recordings
    torch.testing.assert_close(torch.tensor(traced["loss"]), torch.tensor(eager["loss"]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(traced["kl"]), torch.tensor(eager["kl"]), rtol=1e-5, atol=1e-6)


def test_auto_falls_back_with_one_line_and_an_explicit_mode_refuses(monkeypatch):
    """A step that cannot be recorded: auto trains eagerly after one warning saying why; compile="trace" is an
    error naming the mode and the way out. An inductor that cannot compile: auto replays the recording instead."""
    eager, _ = _steps("dropout", "local", "none")

    def failing(fn, inputs):
        raise RuntimeError("a value read on the host")

    monkeypatch.setattr(step_module, "record", failing)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fallen, engine = _steps("dropout", "local", "auto")
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "runs none" in messages[0] and "value read on the host" in messages[0], messages
    assert engine.executor == "none"
    _same(eager, fallen)
    with pytest.raises(ExecutorFailed, match=r"compile='trace' cannot run this step .*compile='auto'.*compile='none'"):
        _steps("dropout", "local", "trace")
    monkeypatch.undo()

    def no_inductor(graph, inputs, mode):
        if mode == "inductor":
            raise RuntimeError("no C++ compiler")
        return replay(graph, inputs, mode)

    replay = recording.replay
    monkeypatch.setattr(step_module, "replay", no_inductor)
    model, guide = _regression("normal")
    x, y = _data()
    explicit = Step(model, guide, MeanFieldELBO(estimator="sample"), "inductor")
    with pytest.raises(ExecutorFailed, match="compile='inductor' cannot run this step .*no C.. compiler"):
        explicit(x[:32], y[:32], 1.0)
    monkeypatch.setattr(step_module, "inductor_repays", lambda *args: (True, "a long run"))
    engine = Step(model, guide, MeanFieldELBO(estimator="sample"), "auto", steps=10**6, device=torch.device("cpu"))
    assert engine.executor == "trace"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(recording.PROBE_STEPS + 3):  # the probe's steps, then inductor asked for, and refused
            engine(x[:32], y[:32], 1.0)
    assert engine.executor == "trace" and len(caught) == 1 and "no C++ compiler" in str(caught[0].message)


def test_a_step_past_its_recordings_runs_eagerly_and_says_so(monkeypatch):
    monkeypatch.setattr(step_module, "MAX_GRAPHS", 1)
    model, guide = _regression("normal")
    x, y = _data()
    engine = Step(model, guide, MeanFieldELBO(estimator="sample"), "trace")
    engine(x[:32], y[:32], 1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in (16, 8):  # two more batch shapes: eager, said once
            terms, gradients = engine(x[:rows], y[:rows], 1.0)
            assert gradients is None and terms.loss.requires_grad
    assert len(engine.graphs) == 1 and len(caught) == 1 and "runs eagerly" in str(caught[0].message)


def test_a_short_run_is_eager_under_auto():
    history, _ = _fit("auto", epochs=2)
    assert history.compile == "none" and "do not repay" in history.compile_reason


def test_the_auto_rule():
    # a convolutional network is recorded too: the replay types its convolution's gradient (recording.typed)
    assert auto_mode(torch.device("cpu"))[0] == "trace"
    assert auto_mode(torch.device("cpu"), steps=recording.RECORD_STEPS_CPU)[0] == "trace"
    assert auto_mode(torch.device("cpu"), steps=recording.RECORD_STEPS_CPU - 1)[0] == "none"
    assert auto_mode(torch.device("cpu"), steps=10**6)[0] == "trace"  # inductor once measured to repay
    assert auto_mode(torch.device("cuda"), steps=10)[0] == "inductor"


@pytest.mark.parametrize("value", [3, True, False, "aot_eager", "script"])
def test_one_vocabulary_for_compile(value):
    model, guide = _regression("normal")
    x, y = _data()
    with pytest.raises(ValueError, match="compile must be one of"):
        fit(model, guide, x, y, epochs=1, compile=value, progress=False)
