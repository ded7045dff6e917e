"""What a method requires lives in the method: every refusal of the command line about a method's settings (or about
a run the method cannot take) is the method's own (:class:`~pyrobnn.methods.Refused`), raised from Python with the
method's field names and reported by the command line with its options, one line, nothing written; and a run builds
its method once."""

from __future__ import annotations

import dataclasses
from functools import partial

import pytest
import torch

from pyrobnn.guides import MixtureNodeGuide, NormalGuide
from pyrobnn.infer.optim import GuideRateOptim, Optim, StepDecay
from pyrobnn.infer.schedules import Constant, Geometric
from pyrobnn.methods import METHODS, Method, Refused, Variational, resolve_method
from pyrobnn.model import BayesianNetwork, Gaussian
from pyrobnn.model.priors import LogUniformPrior, NodePrior
from pyrobnn.networks import MLP
from tests.support import MOONS, error_line, run_cli


def _model(hidden=(8,), dropout=0.0, likelihood=None, **selection):
    return BayesianNetwork(MLP(2, hidden, 2, dropout=dropout), likelihood, num_data=100, **selection)


def _replace(name, **changes):
    return lambda: dataclasses.replace(METHODS[name], **changes)


def _check(name, model=None, **run):
    return lambda: METHODS[name].check(model() if callable(model) else model, **run)


def _fit(name, y, **options):
    x = torch.randn(40, 2)
    return lambda: resolve_method(name).fit(MLP(2, (4,), 2 if y == "classes" else 1), x,
                                     torch.randint(0, 2, (40,)) if y == "classes" else torch.randn(40, 1),
                                     epochs=1, **options)


SWAG = ["--method", "swag", "--epochs", "4"]
SGHMC = ["--method", "sghmc", "--epochs", "6"]
NUTS = ["mcmc", "--train-size", "30", "--hidden", "4", "--num-samples", "5", "--warmup", "5", "--no-progress"]

RULES = {
    # rule: (Python, the command line, what both say: Python's words, the command line's)
    "SWAG fits SGD's iterates": (
        _replace("swag", optimizer=Optim("adam", 0.05)), ["train", *SWAG, "--optimizer", "adam"],
        "SWAG fits its Gaussian to SGD's iterates: {optimizer.name} must be sgd (got adam)"),
    "SWAG's rank is 2 at least": (
        _replace("swag", rank=1), ["train", *SWAG, "--swag.rank", "1"], "{rank} (K, the deviations kept) must be at "
                                                                          "least 2"),
    "SWAG's SWA rate is its rate's end": (
        _replace("swag", optimizer=Optim("sgd", 0.002)), ["train", *SWAG, "--lr", "0.002"],
        "{optimizer.lr} 0.002 is below SWAG's SWA rate {swa_lr} 0.01"),
    "SWAG's SWA rate is its only schedule": (
        _replace("swag", optimizer=Optim("sgd", 0.05, schedule=StepDecay(2, 0.5))),
        ["train", *SWAG, "--lr-step", "2"], "{swa_lr} sets SWAG's learning-rate schedule: drop {optimizer.schedule}"),
    "SWAG collects two iterates": (
        lambda: dataclasses.replace(METHODS["swag"], start=3).check(epochs=4),
        ["train", *SWAG, "--swag.start", "3"], "{start} 3 leaves one epoch of the 4 ({epochs}) to collect"),
    "a deep ensemble starts from MAP fits": (
        _replace("ensemble-5", guide=NormalGuide), ["train", "--method", "ensemble-2", "--guide", "normal"],
        "starts from MAP fits: {guide} must be point estimates (PointGuide), got NormalGuide"),
    "the Laplace approximation starts from a MAP fit": (
        _replace("laplace", guide=NormalGuide), ["train", "--method", "laplace", "--guide", "normal"],
        "the Laplace approximation starts from MAP fits: {guide} must be point estimates"),
    "SG-MCMC's prior is no weight decay": (
        _replace("sghmc", optimizer=Optim(lr=0.01, weight_decay=1e-3)), ["train", *SGHMC, "--weight-decay", "0.001"],
        "{optimizer.weight_decay} 0.001 does not apply to SG-MCMC"),
    "SG-MCMC's step follows its sampler's schedule": (
        _replace("sghmc", optimizer=Optim(lr=0.01, schedule=StepDecay(2, 0.5))), ["train", *SGHMC, "--lr-step", "2"],
        "{optimizer.schedule} StepDecay does not apply to SG-MCMC"),
    "SG-MCMC has one step size": (
        _replace("sghmc", optimizer=GuideRateOptim(lr=0.01, factor=10.0)),
        ["train", *SGHMC, "--variational-lr-factor", "10"], "{optimizer.factor} 10 does not apply to SG-MCMC"),
    "SG-MCMC draws one weight a step": (
        _replace("sghmc", num_particles=2), ["train", *SGHMC, "--num-particles", "2"],
        "{num_particles} 2 does not apply to SG-MCMC"),
    "SG-MCMC samples the posterior": (
        _replace("sghmc", beta=Geometric()), ["train", *SGHMC, "--beta", "geometric"],
        "SG-MCMC samples the posterior, whose KL weight is 1: drop {beta}"),
    "SG-MCMC keeps a draw": (
        lambda: dataclasses.replace(METHODS["sghmc"], cycles=2, exploration=0.9, batch_size=34).check(epochs=3,
                                                                                                       rows=100),
        ["train", *SGHMC, "--epochs", "3", "--batch-size", "34", "--sgmcmc.cycles", "2", "--sgmcmc.exploration",
         "0.9"], "{sampler} sghmc: no epoch of the 3 (3 steps each) ends past the exploration of its cycle"),
    "SG-MCMC's chains are one stacked network": (
        lambda: dataclasses.replace(METHODS["sghmc"], chains=2).check(epochs=6, validation=True),
        ["train", *SGHMC, "--sgmcmc.chains", "2", "--val-size", "10"],
        "{chains} 2 run as one stacked network, which takes no {validation}"),
    "a mixture predicts with every component": (
        lambda: dataclasses.replace(METHODS["ibnn-4"], num_samples=10), ["train", "--method", "ibnn-4",
                                                                         "--num-samples", "10"],
        "{num_samples} 10 must be a multiple of {guide.num_components} 4"),
    "a mixture's batches split among its components": (
        lambda: dataclasses.replace(METHODS["ibnn-4"], batch_size=8, num_particles=2).check(epochs=1, rows=42),
        ["train", "--method", "ibnn-4", "--batch-size", "8", "--num-samples", "4", "--train-size", "42"],
        "{guide.num_components} 4, {batch_size} 8, {num_particles} 2 on 42 training examples"),
    "VDP++ propagates moments without particles": (
        lambda: Variational(estimator="vdp", num_particles=4), ["train", "--estimator", "vdp", "--num-particles", "4"],
        "{num_particles} 4 does not apply to {estimator} vdp"),
    "IVON is its own optimiser": (
        _replace("ivon", optimizer=Optim()), ["train", "--method", "ivon", "--optimizer", "sgd"],
        "IVON is its own optimiser"),
    "IVON's prior is its weight decay": (
        _replace("ivon", beta=Constant(0.5)), ["train", "--method", "ivon", "--beta", "constant", "--beta.value",
                                               "0.5"],
        "IVON trains on the likelihood alone, its prior being the weight decay: {beta} must be Constant(0.0)"),
    "a noise of one network is lost in a replay of several": (
        _fit("ensemble-2", "values", likelihood=Gaussian(1.0, learn_scale=True)),
        ["train", "--method", "ensemble-2", "--dataset", "sinusoid", "--likelihood.learn-scale"],
        "{likelihood.learn_scale}: its 2 members' weights are replayed in one network"),
    "NUTS samples weights, not the implicit BNN's nodes": (
        _replace("nuts", prior=NodePrior()), [*NUTS, "--prior", "node"], "{prior} node does not apply to NUTS"),
    "NUTS needs a proper prior": (
        _replace("nuts", prior=LogUniformPrior()), [*NUTS, "--prior", "log-uniform"],
        "{prior} has no proper density for NUTS"),
    "NUTS's acceptance target is a probability": (
        _replace("nuts", target_accept=1.5), [*NUTS, "--target-accept", "1.5"], "{target_accept}"),
    "NUTS runs full batch": (
        _check("nuts", epochs=1, rows=20_000), [*NUTS, "--train-size", "20000"],
        "{rows} 20000: NUTS runs full batch and takes at most 10000 training points"),
    "NUTS explores one dimension per weight": (
        _check("nuts", partial(_model, hidden=(80, 80)), epochs=1),
        [*NUTS, "--hidden", "80", "80"], "{network}: the network has 6882 Bayesian weights; NUTS samples at most"),
    "NUTS needs a deterministic potential": (
        _check("nuts", partial(_model, dropout=0.5), epochs=1), None,
        "{network.dropout} does not apply to NUTS"),
    "NUTS holds the likelihood fixed": (
        _check("nuts", partial(_model, likelihood=Gaussian(1.0, learn_scale=True)), epochs=1), None,
        "{likelihood.learn_scale} does not apply to NUTS"),
}
"""Every rule of a method the command line reports (None: a Python model the command line cannot build: it samples
an mlp without dropout, under a fixed noise, which its options refuse before)."""


def _words(template: str, name) -> str:
    for field in Refused(None, template).fields():
        template = template.replace("{" + field + "}", name(field))
    return template


@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_rule_of_a_method_is_raised_from_python_in_its_fields_words(rule):
    python, _, said = RULES[rule]
    with pytest.raises(Refused) as raised:
        python()
    assert _words(said, lambda field: field) in str(raised.value)


@pytest.mark.parametrize("rule", sorted(rule for rule, (_, argv, _) in RULES.items() if argv is not None))
def test_each_rule_of_a_method_is_one_line_of_the_command_line_in_its_options(rule, tmp_path, capsys):
    from pyrobnn.cli.methods import flag_of

    python, argv, said = RULES[rule]
    with pytest.raises(Refused) as raised:
        python()
    command = argv[0]
    base = MOONS if command == "train" and "--dataset" not in argv else []
    assert run_cli([*argv[:1], *base, *argv[1:], "--out", tmp_path / "run"]) == 2
    assert _words(said, lambda field: flag_of(raised.value.method, field, command)) in error_line(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["map", "swag", "ivon", "sgld", "bbb"])
def test_a_train_run_builds_its_method_once(name, tmp_path, monkeypatch):
    built = []
    original = Method.__post_init__
    monkeypatch.setattr(Method, "__post_init__", lambda self: (built.append(type(self).__name__), original(self)))
    assert run_cli(["train", *MOONS, "--method", name, "--epochs", "2", "--out", tmp_path / "run"]) == 0
    assert len(built) == 1, built


def test_a_mixture_guides_components_come_from_its_guide():
    assert METHODS["ibnn-4"].components == 4 and METHODS["bbb"].components == 0
    assert Variational(guide=partial(MixtureNodeGuide, num_components=3), num_samples=9).components == 3
