"""One method, three doors, the same numbers: every registry method (the families at a small size) fitted from Python
(``METHODS[m].fit``), by ``pyrobnn train --method m`` and as the one cell of a study, with the same options and seed,
gives the same test metrics, on a classification set (two moons) and a regression set (the sinusoid, its noise by
the method's rule from every door); and an explicit option reaches the method whichever door it came through."""

from __future__ import annotations

import dataclasses
import json

import pyro
import pytest

from pyrobnn.data import load_dataset
from pyrobnn.infer.optim import Optim
from pyrobnn.methods import METHODS, NUTS, resolve_method
from pyrobnn.model import Gaussian
from pyrobnn.networks import build_net
from pyrobnn.studies import Study
from tests.support import ADAPTER_METHODS, run_cli

SEED = 3
SETS = {"two-moons": ["--train-size", "64", "--test-size", "32"],
        "sinusoid": ["--train-size", "64", "--test-size", "32"]}
TRAIN = ["--hidden", "8", "--epochs", "2", "--batch-size", "32", "--num-samples", "4", "--seed", str(SEED),
         "--no-progress"]
SAMPLE = ["--hidden", "4", "--num-samples", "6", "--warmup", "6", "--num-chains", "2", "--seed", str(SEED),
          "--no-progress"]
NUTS_NOISE = 0.1
"""The fixed noise of a NUTS regression: NUTS samples the weights and holds the likelihood fixed (``pyrobnn mcmc``'s
``--likelihood.scale``)."""

NAMES = sorted({*(name for name in METHODS if name not in ADAPTER_METHODS), "ensemble-2", "multiswag-2",
                "ibnn-2"} - {"ensemble-5", "multiswag-5", "ibnn-4"})
"""Every method of the registry that a small network runs (adapter methods: tests/support.ADAPTER_METHODS), the
families at two members or components."""


def _python(name: str, dataset: str) -> dict:
    """``METHODS[name].fit`` on the data the command line loads, tested as it tests."""
    method = resolve_method(name)
    nuts = isinstance(method, NUTS)
    method = dataclasses.replace(method, **(dict(num_samples=6, warmup=6, num_chains=2) if nuts else
                                            dict(batch_size=32, num_samples=4)))
    data = load_dataset(dataset, None, train_size=64, test_size=32, seed=SEED)
    hidden = (4,) if nuts else (8,)
    likelihood = Gaussian(NUTS_NOISE) if nuts and data.task == "regression" else None
    posterior = method.fit(lambda: build_net("mlp", data.input_shape, data.num_outputs, hidden=hidden),
                           data.x_train, data.y_train, likelihood=likelihood, epochs=2, seed=SEED,
                           **({} if nuts else {"compile": "auto"}))
    pyro.set_rng_seed(SEED)
    return posterior.evaluate(data.x_test, data.y_test)


def _argv(name: str, dataset: str) -> tuple[str, list[str]]:
    method = resolve_method(name)
    if method.command == "mcmc":
        noise = ["--likelihood.scale", str(NUTS_NOISE)] if dataset != "two-moons" else []
        return "mcmc", ["--dataset", dataset, *SETS[dataset], *SAMPLE, *noise, "--method", name]
    return "train", ["--dataset", dataset, *SETS[dataset], *TRAIN, "--method", name]


def _command_line(name: str, dataset: str, out) -> dict:
    command, argv = _argv(name, dataset)
    assert run_cli([command, *argv, "--out", out]) == 0
    report = "metrics.json" if command == "train" else "diagnostics.json"
    return json.loads((out / report).read_text())["test"]


def _study(name: str, dataset: str, out) -> dict:
    """The study of one cell whose base is the command line's arguments (``--method`` among them: the base of a
    sampling method's study is written for its command, ``--num-samples`` its draws)."""
    _, argv = _argv(name, dataset)
    records = Study(base=argv).run(out, progress=False)
    assert [record["status"] for record in records] == ["done"], records
    return records[0]["metrics"]


CLASSIFIERS = {"sngp", "map-ts"}
"""Methods of a classifier only (SNGP's mean-field softmax, map-ts's temperature): on the regression set each door
refuses them alike."""


@pytest.mark.parametrize(("name", "dataset"), [(name, dataset) for name in NAMES for dataset in sorted(SETS)
                                               if not (name in CLASSIFIERS and dataset == "sinusoid")])
def test_python_the_command_line_and_a_study_give_the_same_metrics(name, dataset, tmp_path):
    python = _python(name, dataset)
    line = _command_line(name, dataset, tmp_path / "train")
    cell = _study(name, dataset, tmp_path / "study")
    assert set(python) <= set(line) and set(python) <= set(cell)
    for metric, value in python.items():
        assert line[metric] == pytest.approx(value, rel=1e-6, abs=1e-7), (metric, "pyrobnn train")
        assert cell[metric] == pytest.approx(value, rel=1e-6, abs=1e-7), (metric, "a study's cell")


@pytest.mark.parametrize("name", sorted(CLASSIFIERS))
def test_a_classifiers_method_refuses_a_regression_through_every_door(name, tmp_path, capsys):
    with pytest.raises(ValueError, match="classifier's method") as python:
        _python(name, "sinusoid")
    assert run_cli(["train", *_argv(name, "sinusoid")[1], "--out", tmp_path / "train"]) != 0
    assert f"error: {python.value}" in capsys.readouterr().err
    assert not (tmp_path / "train").exists()
    records = Study(base=_argv(name, "sinusoid")[1]).run(tmp_path / "study", progress=False)
    assert records[0]["status"] != "done" and str(python.value) in str(records[0].get("error"))


EXPLICIT = {"mcdropout": (["--lr", "0.004"], lambda m: dataclasses.replace(m, optimizer=Optim(lr=0.004))),
            "swag": (["--lr", "0.02", "--swag.lr", "0.02"],
                     lambda m: dataclasses.replace(m, optimizer=Optim("sgd", 0.02), swa_lr=0.02)),
            "ivon": (["--lr", "0.02"], lambda m: dataclasses.replace(m, lr=0.02)),
            "sgld": (["--lr", "0.02"], lambda m: dataclasses.replace(m, optimizer=Optim(lr=0.02)))}
"""An option written beside a method (its rate), as each door takes it."""


@pytest.mark.parametrize("name", sorted(EXPLICIT))
def test_an_explicit_rate_reaches_the_method_through_every_door(name, tmp_path):
    options, changed = EXPLICIT[name]
    method = changed(resolve_method(name))
    data = load_dataset("two-moons", None, train_size=64, test_size=32, seed=SEED)
    posterior = dataclasses.replace(method, batch_size=32, num_samples=4).fit(
        lambda: build_net("mlp", data.input_shape, data.num_outputs, hidden=(8,)), data.x_train, data.y_train,
        epochs=2, seed=SEED, compile="auto")
    pyro.set_rng_seed(SEED)
    python = posterior.evaluate(data.x_test, data.y_test)
    _, argv = _argv(name, "two-moons")
    assert run_cli(["train", *argv, *options, "--out", tmp_path / "train"]) == 0
    report = json.loads((tmp_path / "train" / "metrics.json").read_text())
    base = [token for token in argv if token not in ("--method", name)]  # the rate in a study's base, the method
    records = Study(base=[*base, *options], vary={"method": [name]}).run(tmp_path / "study", progress=False)
    assert report["config"]["optim"]["lr"] == method.learning_rate == float(options[1])
    for metric, value in python.items():
        assert report["test"][metric] == pytest.approx(value, rel=1e-6, abs=1e-7), metric
        assert records[0]["metrics"][metric] == pytest.approx(value, rel=1e-6, abs=1e-7), metric
