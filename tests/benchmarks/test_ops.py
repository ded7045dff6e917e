"""The step's ATen operations (benchmarks/ops.py) and the joint posterior that keeps them few, against per-site
computations."""

from __future__ import annotations

import sys

import pyro
import pytest
import torch
from torch.distributions import kl_divergence

from pyrobnn import BayesianNetwork, MeanFieldELBO, NormalGuide, ScaleMixturePrior
from pyrobnn.guides.base import SiteGuide
from pyrobnn.handlers import vdp
from pyrobnn.networks import MLP
from tests.support import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
ops = pytest.importorskip("ops")


def test_the_counter_counts_each_dispatched_operation_and_each_host_read():
    x = torch.ones(3)
    with ops.OpCounter() as counter:
        y = (x * 2 + 1).sum()
        y.item()
    assert dict(counter.ops) == {"aten.mul": 1, "aten.add": 1, "aten.sum": 1, "aten._local_scalar_dense": 1}
    assert dict(counter.syncs) == {"aten._local_scalar_dense": 1}


def test_python_calls_counts_each_call_of_a_python_function_or_a_builtin():
    def inner(values):
        return len(values)

    def step():
        inner([1])
        inner([2, 3])

    assert ops.python_calls(step, warmup=0) == 5  # step, inner twice, len twice
    assert ops.python_calls(lambda: None, warmup=0) == 1
    # by origin: this file's functions are "other", len a builtin, torch.nn.functional.relu torch's Python
    assert ops.python_calls_by_origin(step, warmup=0) == {"pyro": 0, "pyrobnn": 0, "torch": 0, "builtin": 2,
                                                          "other": 3}
    relu = ops.python_calls_by_origin(lambda: torch.nn.functional.relu(torch.zeros(1)), warmup=0)
    assert relu["torch"] >= 1 and relu["pyro"] == relu["pyrobnn"] == 0


def _model_guide(prior=None, seed=0):
    torch.manual_seed(seed)
    model = BayesianNetwork(MLP(5, (7, 4), 3), prior=prior, num_data=50)
    return model, NormalGuide(model, init_rho=-1.5)


def _kl_and_grads(guide, kl):
    guide.zero_grad()
    kl.backward(retain_graph=True)
    return kl.detach(), {name: p.grad.clone() for name, p in guide.named_parameters()}


@pytest.mark.parametrize("prior", [None, ScaleMixturePrior()])
def test_the_joint_kl_is_the_sum_of_the_site_kls_with_the_same_gradients(prior):
    model, guide = _model_guide(prior)
    x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))
    guide_trace = pyro.poutine.trace(guide).get_trace(x, y)
    model_trace = pyro.poutine.trace(pyro.poutine.replay(model, trace=guide_trace)).get_trace(x, y)
    joint = guide_trace.nodes[guide.site_names[0]]["fn"].base_dist.joint
    values = {i: guide_trace.nodes[name]["value"] for i, name in enumerate(guide.site_names)}
    prior_fn = model_trace.nodes[guide.site_names[0]]["fn"]
    fused = _kl_and_grads(guide, joint.kl(prior_fn, values))
    reference = 0.0
    for i, name in enumerate(guide.site_names):  # per site, from the guide's own (non-joint) posterior
        q, p, w = guide.posterior(name), model_trace.nodes[name]["fn"], values[i]
        reference = reference + (kl_divergence(q, p) if prior is None else q.log_prob(w) - p.log_prob(w))
    expected = _kl_and_grads(guide, reference)
    torch.testing.assert_close(fused[0], expected[0], rtol=1e-5, atol=1e-4)
    for name in expected[1]:
        torch.testing.assert_close(fused[1][name], expected[1][name], rtol=1e-4, atol=1e-5)


def test_the_elbo_through_the_joint_posterior_equals_the_per_site_elbo():
    model, guide = _model_guide()
    x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))
    with vdp():  # deterministic (moments, no draw): the whole loss and its gradient compare
        terms = MeanFieldELBO().terms(model, guide, x, y)
    joint = _kl_and_grads(guide, terms.loss)

    def per_site(*args, **kwargs):
        guide._claim()
        return SiteGuide.forward(guide, *args, **kwargs)

    with vdp():
        reference = MeanFieldELBO().terms(model, per_site, x, y)
    expected = _kl_and_grads(guide, reference.loss)
    torch.testing.assert_close(terms.kl, reference.kl)
    torch.testing.assert_close(terms.nll, reference.nll)
    torch.testing.assert_close(joint[0], expected[0])
    for name in expected[1]:
        torch.testing.assert_close(joint[1][name], expected[1][name])


def test_the_parameters_share_one_storage_again_after_something_replaced_it():
    model, guide = _model_guide()
    x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))
    name = guide.site_names[0]
    param = guide._unconstrained(name, "locs")
    before = param.detach().clone()
    guide(x, y)
    param.data = param.data.clone()  # e.g. what .to(device) does to each parameter
    flat, shapes = guide.flat("locs")
    torch.testing.assert_close(flat[: before.numel()].view(before.shape), before)
    assert param.data_ptr() == flat.data_ptr() and shapes[0] == before.shape
    optim = torch.optim.SGD(guide.parameters(), lr=0.1)
    MeanFieldELBO().differentiable_loss(model, guide, x, y).backward()
    optim.step()  # the update of each site's parameter is the flat storage's
    assert not torch.equal(guide.flat("locs")[0][: before.numel()].view(before.shape), before)
    assert torch.equal(guide.flat("locs")[0][: before.numel()].view(before.shape), param.detach())


@pytest.mark.parametrize("method", ["bbb", "local_reparam", "flipout"])
def test_a_step_dispatches_no_more_operations_than_bayesian_torch_and_reads_nothing_back(method):
    pytest.importorskip("bayesian_torch")
    x, y = torch.rand(8, 1, 28, 28), torch.randint(0, 10, (8,))
    counts = {}
    with pyro.validation_enabled(False):
        for name, step in ops.training_steps("mlp400", x, y, (method, ops.COUNTERPART[method])).items():
            counts[name] = ops.count(step)
    ours, theirs = counts[method], counts[ops.COUNTERPART[method]]
    assert ours.total <= theirs.total, (ours.ops, theirs.ops)
    assert not ours.syncs


def test_the_two_hand_written_floors_take_the_same_step():
    """torch_bbb with F.softplus and with pyrobnn's softplus: from the same seed, the same parameters after three
    steps (to float32 rounding), so the suite's two floors differ in time only."""
    x, y = torch.rand(8, 1, 28, 28), torch.randint(0, 10, (8,))
    steps = ops.training_steps("mlp400", x, y, ("torch_bbb", "torch_bbb_same_softplus"))
    updated = {}
    for name, step in steps.items():
        torch.manual_seed(1)
        for _ in range(3):
            step()
        updated[name] = [p.detach().clone() for p in step.parameters]
    assert len(updated["torch_bbb"]) == 8  # locations and rho of two weights and two biases
    for ours, theirs in zip(updated["torch_bbb"], updated["torch_bbb_same_softplus"]):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_the_suite_reports_every_method_and_its_ratio_to_det(monkeypatch, capsys):
    """benchmarks/suite.py end to end at the smallest size: one network, one round, BBB by the default executor and
    by the recorded step (no inductor: its compilation takes minutes), no compiled det."""
    import json

    import suite

    monkeypatch.setattr(sys, "argv", ["suite.py", "--devices", "cpu", "--networks", "mlp400", "--compiled",
                                      "--small-batch", "0", "--rounds", "1", "--steps", "1", "--no-memory",
                                      "--threads", "1", "--modes", "auto", "trace", "--mode-methods", "bbb"])
    suite.main()
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["cpu"]["mlp400"]
    methods = [m for m in ops.METHODS if m in ("det", "torch_bbb", "torch_bbb_same_softplus", *ops.ESTIMATOR_OF)]
    for method in methods:
        assert figures[f"{method}_ms"] > 0 and figures[f"{method}_ops"] > 0
        if method != "det":
            assert figures[f"{method}_ratio"] == pytest.approx(figures[f"{method}_ms"] / figures["det_ms"], abs=0.011)
    assert figures["bbb_ops"] < figures["torch_bbb_ops"]
    for mode in ("auto", "trace"):
        assert figures[f"bbb_{mode}_ms"] > 0
    assert figures["bbb_auto_vs_fastest"] == pytest.approx(
        figures["bbb_auto_ms"] / min(figures["bbb_ms"], figures["bbb_trace_ms"]), abs=0.01)
    assert figures["bbb_auto_vs_eager"] == pytest.approx(figures["bbb_auto_ms"] / figures["bbb_ms"], abs=0.01)
    assert not any(key.endswith("_compiled_ms") for key in figures)


def test_the_step_profile_names_the_operations_of_a_step_and_log1p_and_uniform_are_not_among_them():
    """benchmarks/profile_step.py on tiny steps: ms per step by operation; BBB draws its weight noise
    (``aten::normal_``) and computes σ without ``aten::log1p`` (no vectorised CPU kernel in some builds); flipout draws
    its signs as bits of random integers (``aten::random_``), not one ``aten::uniform_`` number per sign."""
    profile_step = pytest.importorskip("profile_step")
    bbb = profile_step.profile("mlp400", "bbb", batch=8, steps=2, device=torch.device("cpu"))
    assert bbb["aten::normal_"] > 0 and "aten::log1p" not in bbb
    assert list(bbb.values()) == sorted(bbb.values(), reverse=True)
    flipout = profile_step.profile("mlp400", "flipout", batch=8, steps=2, device=torch.device("cpu"))
    assert flipout["aten::random_"] > 0 and "aten::uniform_" not in flipout
