"""The sparse VD preset trains as its paper does (Molchanov et al. 2017): the KL off for 5 epochs, then linear to 1
over 15, so a short run at its defaults learns the data, and says that it ended inside the warm-up."""

from __future__ import annotations

import json

import pytest

from pyrobnn.infer.schedules import Geometric, LinearWarmup
from pyrobnn.methods import METHODS
from pyrobnn.methods.rules import SPARSE_VD_BETA, paper_schedule, warmup_note
from tests.support import run_cli


def test_the_preset_carries_its_papers_warm_up_rate_batch_and_mask():
    method = METHODS["vd-additive"]
    assert method.schedule(3) == method.schedule(200) == SPARSE_VD_BETA == LinearWarmup(warmup=5, anneal=15)
    assert (method.learning_rate, method.batch_size, method.guide.keywords["mask_pruned"]) == (1e-3, 100, True)
    assert paper_schedule(method.guide, method.prior, 9) == SPARSE_VD_BETA  # a hand-picked prior and guide: the same
    assert "KL weight 0 for 5 epochs then linear to 1 over 15" in method.paper


def test_the_note_says_where_a_run_ends_inside_its_warm_up():
    assert "this 3-epoch run trains without the KL (beta = 0 throughout)" in warmup_note(SPARSE_VD_BETA, 3)
    assert "--epochs 20 or more" in warmup_note(SPARSE_VD_BETA, 3)
    assert "this 8-epoch run ends at beta = 0.2," in warmup_note(SPARSE_VD_BETA, 8)  # (8 - 5) / 15 at its last step
    assert warmup_note(SPARSE_VD_BETA, 20) is None and warmup_note(Geometric(), 1) is None


@pytest.mark.recorded
def test_the_preset_learns_mnist_at_its_defaults(tmp_path, data_root, capsys):
    """2,000 digits, 3 epochs (60 steps): the KL stays off, the network learns (chance 0.1; the rules' warm-up
    over a third of the run pruned it to 73.5 % on 5,000 digits where MAP reached 90.9 %)."""
    if not (data_root / "MNIST" / "raw").is_dir():
        pytest.skip(f"no MNIST under {data_root}")
    out = tmp_path / "run"
    assert run_cli(["train", "--dataset", "mnist", "--data-root", data_root, "--train-size", "2000", "--test-size",
                    "1000", "--epochs", "3", "--method", "vd-additive", "--num-samples", "10", "--no-progress",
                    "--out", out]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert [record["beta"] for record in metrics["history"]] == [0.0, 0.0, 0.0]
    assert metrics["test"]["accuracy"] > 0.8 and metrics["warnings"] == []
    assert "beta: the KL warm-up (LinearWarmup(warmup=5, anneal=15, final=1.0)) reaches beta = 1 at epoch 20" \
        in capsys.readouterr().out
