"""A cell cached before the selector flags became aliases of ``--method`` keeps its key: the keys below were computed
at a6ca7fd, when ``--ensemble``, ``--laplace``, ``--swag`` and ``--sgmcmc`` were options of every cell's
configuration (:data:`pyrobnn.studies.cells.FORMER_SELECTORS`)."""

from __future__ import annotations

import pytest

from pyrobnn.studies.cells import make_cell

MOONS = ["--dataset", "two-moons", "--epochs", "3"]

KEYS = {
    "bbb": (MOONS, {"method": "bbb"}, {"seed": 1}, "994c4ac43913"),
    "swag": (MOONS, {"method": "swag"}, {"seed": 0}, "b217a1a197aa"),
    "ensemble-3": (MOONS, {"method": "ensemble-3"}, {"seed": 0}, "2aba5c039a84"),
    "sgld": (MOONS, {"method": "sgld"}, {"seed": 0}, "6b1f61934cea"),
    "laplace": (MOONS, {"method": "laplace"}, {"seed": 0}, "e8a1996e3c5e"),
    "ivon": (MOONS, {"method": "ivon"}, {"seed": 0}, "8b145ba5f116"),
    "multiswag-2": (MOONS, {"method": "multiswag-2"}, {"seed": 0}, "502a4634510f"),
    "guide": (MOONS, {"guide": "dropout"}, {"seed": 0}, "6e7402765c1c"),
    "nuts": (MOONS, {"method": "nuts"}, {"seed": 0}, "6afc909ec3f3"),
}


@pytest.mark.parametrize("label", sorted(KEYS))
def test_a_cell_keeps_the_key_it_had_before_the_selectors_became_aliases(label):
    base, axes, replicate, key = KEYS[label]
    assert make_cell(base, axes, replicate, label).key == key


def test_the_quick_uci_studys_cells_keep_their_keys(data_root):
    base = ["--dataset", "uci-yacht", "--hidden", "50", "--epochs", "400", "--batch-size", "128", "--grid",
            "protocol", "--num-samples", "1000", "--data-root", str(data_root)]
    cell = make_cell(base, {"method": "mcdropout"}, {"split": 0}, "method=mcdropout", ("--lr", "0.01"))
    assert cell.key == "c5b58f7564b9"  # its rate once in the base, now in the label's settings
