"""Every method name gives the numbers it gave before methods became library objects: the same command line and seed,
against figures recorded at c1a0518 (main before the change) on this 2-core CPU (torch 2.14.1, pyro 1.9.2), with
one intra-op thread (tests/conftest.py)."""

from __future__ import annotations

import json

import pytest

from tests.support import run_cli

TOY = ["--dataset", "two-moons", "--train-size", "96", "--test-size", "64", "--hidden", "8", "--batch-size", "32",
       "--epochs", "4", "--num-samples", "8", "--no-progress", "--seed", "3"]
NUTS = ["--dataset", "two-moons", "--train-size", "64", "--test-size", "32", "--hidden", "4", "--num-samples", "20",
        "--warmup", "20", "--num-chains", "2", "--no-progress", "--seed", "3"]

RECORDED = {
    "map": {"loss": 1.1759245660569932, "nll": 0.7276502847671509, "accuracy": 0.515625},
    "bbb": {"loss": 3.3068372938368054, "nll": 0.7275938987731934, "accuracy": 0.515625},
    "bbb-local": {"loss": 3.354474279615614, "nll": 0.7275921106338501, "accuracy": 0.515625},
    "flipout": {"loss": 3.339172787136502, "nll": 0.7275925874710083, "accuracy": 0.515625},
    "mcdropout": {"loss": 0.7710241476694742, "nll": 0.7252946496009827, "accuracy": 0.515625},
    "vd-additive": {"loss": 2.1770669089423285, "nll": 0.7090638875961304, "accuracy": 0.515625},
    "vd-multiplicative": {"loss": 1.4386343955993652, "nll": 0.7086220979690552, "accuracy": 0.515625},
    "variational-dense": {"loss": 2.773912641737196, "nll": 0.7276332378387451, "accuracy": 0.515625},
    "vdp": {"loss": 129.57605658637152, "nll": 0.7156046628952026, "accuracy": 0.515625},
    "ibnn-2": {"loss": 0.9782564110226102, "nll": 0.7156530022621155, "accuracy": 0.515625},
    "ensemble-2": {"loss": 1.1011815865834553, "nll": 0.6939291954040527, "accuracy": 0.515625},
    "laplace": {"loss": 1.1759245660569932, "nll": 0.7294176816940308, "accuracy": 0.515625},
    "swag": {"loss": 1.0912326441870797, "nll": 0.6656929850578308, "accuracy": 0.71875},
    "multiswag-2": {"loss": 0.9835192892286512, "nll": 0.621056854724884, "accuracy": 0.765625},
    "sgld": {"loss": 1.1145775583055284, "nll": 0.6723835468292236, "accuracy": 0.5625},
    "sghmc": {"loss": 1.1118842495812309, "nll": 0.675137996673584, "accuracy": 0.546875},
    "csghmc": {"loss": 0.9421800507439507, "nll": 0.5909115076065063, "accuracy": 0.8125},
    "nuts": {"nll": 0.1918281614780426, "accuracy": 0.9375},
}
"""``pyrobnn train --method NAME`` + :data:`TOY` at c1a0518: the last epoch's loss per example and the test NLL and
accuracy of ``metrics.json`` (``nuts``: ``pyrobnn mcmc --method nuts`` + :data:`NUTS`, its ``diagnostics.json``)."""


@pytest.mark.parametrize("name", [name for name in RECORDED if name != "nuts"])
def test_each_method_name_gives_the_numbers_it_gave_before(name, tmp_path):
    assert run_cli(["train", "--method", name, *TOY, "--out", tmp_path / "run"]) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    got = {"loss": metrics["history"][-1]["loss"], "nll": metrics["test"]["nll"],
           "accuracy": metrics["test"]["accuracy"]}
    assert got == pytest.approx(RECORDED[name], rel=1e-5, abs=1e-7)


def test_nuts_gives_the_numbers_it_gave_before(tmp_path):
    assert run_cli(["mcmc", "--method", "nuts", *NUTS, "--out", tmp_path / "nuts"]) == 0
    test = json.loads((tmp_path / "nuts" / "diagnostics.json").read_text())["test"]
    assert {k: test[k] for k in RECORDED["nuts"]} == pytest.approx(RECORDED["nuts"], rel=1e-5, abs=1e-7)
