"""A study's base rates are its optimiser's: a method from an axis that trains with another optimiser (SWAG's SGD) or
is its own (IVON) keeps its own rates, so adding it to a study written for Adam does not train it at Adam's rate."""

from __future__ import annotations

from pyrobnn.cli import parse_config
from pyrobnn.cli.methods import expand_method
from pyrobnn.cli.options import RunConfig
from pyrobnn.studies.cells import make_cell

UCI_QUICK = ["--dataset", "uci-yacht", "--hidden", "50", "--epochs", "400", "--lr", "0.01", "--batch-size", "128"]
"""The base of studies/uci_quick.toml (its grid left out: this test only parses the cells)."""


def _lr(cell) -> float:
    return parse_config(RunConfig, expand_method(["train", *cell.argv])[1:], "pyrobnn train").optim.lr


def test_swag_in_a_study_written_for_adam_trains_at_its_own_rate(data_root):
    base = [*UCI_QUICK, "--data-root", str(data_root)]
    assert _lr(make_cell(base, {"method": "mcdropout"}, {"split": 0}, "method=mcdropout")) == 0.01
    swag = make_cell(base, {"method": "swag"}, {"split": 0}, "method=swag")
    assert "--lr" not in swag.argv and _lr(swag) == 0.05  # SWAG's SGD: Maddox et al.'s rate
    named = make_cell([*base, "--optimizer", "sgd"], {"method": "swag"}, {"split": 0}, "method=swag")
    assert _lr(named) == 0.01  # a base written for SGD sets SWAG's rate
