"""The executors of a step (``pyrobnn.infer.recording``): the recorded replay of a convolutional network (its
gradient's list of booleans typed for TorchScript, or the FX graph's own Python), with eager's losses and gradients;
what each executor costs, kept per graph, and ``auto``'s move to inductor once it repays; and the one executor
policy, the same in the SVI step, the batched NUTS and the command line."""

from __future__ import annotations

import json
import warnings

import pyro
import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

from pyrobnn import BayesianNetwork, NormalGuide, fit
from pyrobnn.infer import recording
from pyrobnn.infer import step as step_module
from pyrobnn.infer.batched_nuts import BatchedNUTS
from pyrobnn.infer.elbo import MeanFieldELBO
from pyrobnn.infer.recording import ExecutorCosts, ExecutorFailed, inductor_repays, replay
from pyrobnn.infer.step import Step
from pyrobnn.model.likelihoods import Categorical
from pyrobnn.networks import build_net
from tests.support import MOONS, error_line, run_cli


def _conv_net():
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(3 * 3 * 3, 4))


def _conv_problem():
    pyro.clear_param_store()
    torch.manual_seed(0)
    model = BayesianNetwork(_conv_net(), Categorical(), num_data=40)
    guide = NormalGuide(model, init_rho=-3.0)
    generator = torch.Generator().manual_seed(1)
    return model, guide, torch.randn(16, 1, 8, 8, generator=generator), torch.randint(0, 4, (16,), generator=generator)


def _run(compile, steps=3, estimator="sample", length=None):
    """Losses and gradients of ``steps`` steps of the convolutional network at learning rate 0 (in a run of
    ``length`` steps), and the engine."""
    model, guide, x, y = _conv_problem()
    engine = Step(model, guide, MeanFieldELBO(estimator=estimator), compile, steps=length, device=torch.device("cpu"))
    optim = torch.optim.SGD(engine.tensors()[:len(list(guide.parameters()))], lr=0.0)
    pyro.set_rng_seed(2)
    out = []
    for _ in range(steps):
        terms, gradients = engine(x, y, 1.0)
        step_module.update(optim, terms.loss, gradients)
        out.append((float(terms.loss.detach()), {n: p.grad.clone() for n, p in guide.named_parameters()}))
    return out, engine


def _same(first, second, tolerance=1e-6):
    for (loss_a, grads_a), (loss_b, grads_b) in zip(first, second):
        assert loss_a == pytest.approx(loss_b, rel=tolerance, abs=tolerance)
        for name in grads_a:
            torch.testing.assert_close(grads_a[name], grads_b[name], rtol=10 * tolerance, atol=tolerance)


def test_a_convolutions_gradient_step_is_replayed_by_the_fx_graphs_python():
    # TorchScript's tracer has no type for convolution_backward's (and batch norm's backward's) list of booleans:
    # replay("trace") gives the FX graph, which runs the recorded operations with eager's numbers
    x = torch.randn(4, 1, 8, 8)
    net = _conv_net()
    params = list(net.parameters())

    def step(x, *values):
        loss = net(x).square().sum()
        return (loss.detach(), *torch.autograd.grad(loss, params))

    graph = make_fx(step)(x, *params)
    targets = {str(n.target) for n in graph.graph.nodes}
    assert "aten.convolution_backward.default" in targets and "aten.native_batch_norm_backward.default" in targets
    with pytest.raises(RuntimeError, match="unsupported argument type"):
        torch.jit.trace(graph, (x, *params), check_trace=False)
    replayed = replay(graph, (x, *params), "trace")
    assert isinstance(replayed, torch.fx.GraphModule)
    expected = step(x, *params)
    for a, b in zip(replayed(x, *params), expected):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("estimator", ["sample", "local", "flipout"])
def test_the_recorded_convolutional_step_has_the_eager_losses_gradients_and_draws(estimator):
    eager, _ = _run("none", estimator=estimator)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback
        traced, engine = _run("trace", estimator=estimator)
    assert engine.executor == "trace"
    (recorded,) = engine.graphs.values()
    assert isinstance(recorded.run, torch.fx.GraphModule)  # typed calls: the FX graph's Python replays it
    _same(eager, traced)
    assert eager[0][0] != eager[1][0]  # each step draws anew, in the replay too


def test_a_convolutional_run_with_a_partial_last_batch_replays_both_shapes():
    """LeNet-5 on CIFAR-shaped inputs, 40 examples in batches of 16: the last batch of 8 records a second graph and
    the next epoch goes back to the first. Two traced graphs with typed TorchScript calls made TorchScript's
    interpreter fail there (torch 2.14: "stack.size() >= inst.N" INTERNAL ASSERT, or a segmentation fault); the
    replay now has eager's losses."""
    losses = {}
    for compile in ("none", "trace"):
        pyro.clear_param_store()
        torch.manual_seed(0)
        x, y = torch.randn(40, 3, 32, 32), torch.randint(0, 10, (40,))
        model = BayesianNetwork(build_net("lenet5-cifar", x.shape[1:], 10), Categorical(), num_data=40)
        pyro.set_rng_seed(0)
        history = fit(model, NormalGuide(model), x, y, epochs=2, batch_size=16, compile=compile, progress=False)
        assert history.compile == compile
        losses[compile] = [epoch["loss"] for epoch in history.epochs]
    assert losses["trace"] == pytest.approx(losses["none"], rel=1e-5)


def test_a_graph_the_tracer_refuses_is_replayed_by_its_own_python(monkeypatch):
    eager, _ = _run("none")

    def refusing(*args, **kwargs):
        raise RuntimeError("Found an unsupported argument type in the JIT tracer")

    monkeypatch.setattr(torch.jit, "trace", refusing)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        python, engine = _run("trace")
    (recorded,) = engine.graphs.values()
    assert isinstance(recorded.run, torch.fx.GraphModule) and engine.executor == "trace"
    _same(eager, python)


def test_executor_costs_are_kept_per_graph_and_a_broken_file_is_ignored(tmp_path):
    costs = ExecutorCosts(str(tmp_path / "costs.json"))
    assert costs.get("a") == {}
    costs.update("a", trace_ms=2.0)
    costs.update("a", inductor_s=30.0)
    costs.update("b", trace_ms=5.0)
    assert costs.get("a") == {"trace_ms": 2.0, "inductor_s": 30.0} and costs.get("b") == {"trace_ms": 5.0}
    (tmp_path / "costs.json").write_text("{not json")
    assert costs.get("a") == {}
    (tmp_path / "costs.json").write_text(json.dumps([1, 2]))
    assert costs.get("a") == {}


def test_inductor_repays_weighs_the_rest_of_the_run_against_the_compilation(tmp_path):
    costs = ExecutorCosts(str(tmp_path / "costs.json"))
    a, b = recording.INDUCTOR_SECONDS
    estimated = a + b * 400  # nothing measured: its size and the usual fraction of the recorded step
    saving = (1 - recording.INDUCTOR_STEP_FRACTION) * 10.0 / 1e3  # seconds a step
    needed = recording.MARGIN * estimated / saving
    assert inductor_repays("g", 400, 10.0, int(needed) + 1, costs)[0]
    repays, why = inductor_repays("g", 400, 10.0, int(needed) - 1, costs)
    assert not repays and "estimated" in why
    costs.update("g", inductor_s=2.0, inductor_ms=9.0)  # measured: a later run reads inductor's cache
    needed = recording.MARGIN * 2.0 / (1.0 / 1e3)
    assert inductor_repays("g", 400, 10.0, int(needed) + 1, costs)[0]
    repays, why = inductor_repays("g", 400, 10.0, int(needed) - 1, costs)
    assert not repays and "2.0 s measured" in why


def test_auto_times_its_replays_and_moves_a_graph_to_inductor_when_that_repays(tmp_path, monkeypatch):
    """After PROBE_STEPS timed replays the recorded step asks inductor_repays; told yes, the same graph is compiled
    and run from the next step on, with the eager numbers; what each executor cost is kept for the graph."""
    costs = ExecutorCosts(str(tmp_path / "costs.json"))
    monkeypatch.setattr(step_module, "COSTS", costs)
    asked, compiled = [], []

    def repays(key, nodes, trace_ms, left, kept):
        asked.append((key, nodes, trace_ms, left))
        return True, "a long run"

    def counting(graph, inputs, mode):
        compiled.append(mode)
        return replay(graph, inputs, mode)

    monkeypatch.setattr(step_module, "inductor_repays", repays)
    monkeypatch.setattr(step_module, "replay", counting)
    steps = recording.PROBE_STEPS + 4
    eager, _ = _run("none", steps=steps)
    auto, engine = _run("auto", steps=steps, length=1000)
    assert compiled == ["trace", "inductor"] and engine.executor == "inductor"
    ((key, nodes, trace_ms, left),) = asked
    assert nodes > 50 and trace_ms > 0 and left == 1000 - recording.PROBE_STEPS - 1
    assert set(costs.get(key)) == {"trace_ms", "inductor_s"}  # inductor_ms after PROBE_STEPS of its own
    _same(eager, auto, 1e-4)


def _refusing(fn, inputs):
    raise RuntimeError("a value read on the host")


def test_the_batched_nuts_follows_the_same_policy(monkeypatch):
    # explicit: one error naming the mode and the way out; auto: one warning, then the next simpler executor
    monkeypatch.setattr(recording, "make_fx", lambda fn: lambda *inputs: _refusing(fn, inputs))

    def potential(z):
        return 0.5 * (z ** 2).sum(-1), z

    z = torch.zeros(2, 3)
    with pytest.raises(ExecutorFailed, match=r"compile='trace' cannot run the NUTS leapfrog step .*compile='none'"):
        BatchedNUTS(potential, compile="trace").potential(z)
    kernel = BatchedNUTS(potential, compile="auto")
    with pytest.warns(RuntimeWarning, match="the trace executor cannot take the NUTS leapfrog step, so it runs none"):
        assert torch.equal(kernel.potential(z)[0], torch.zeros(2))


def test_an_explicit_mode_that_cannot_run_is_one_line_from_the_command_line_and_nothing_is_written(
        tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(step_module, "record", _refusing)
    out = tmp_path / "run"
    argv = ["train", *MOONS, "--epochs", 4, "--compile", "trace", "--out", out]
    assert run_cli(argv) == 2
    line = error_line(capsys)
    assert "--compile trace cannot run this step" in line and "value read on the host" in line
    assert "--compile auto" in line and "--compile none" in line
    assert not out.exists()
    with pytest.warns(RuntimeWarning, match="so it runs none"):  # auto (100 steps): eagerly, after one warning
        assert run_cli(["train", *MOONS, "--epochs", 50, "--compile", "auto", "--out", out]) == 0
    assert (out / "metrics.json").exists()
