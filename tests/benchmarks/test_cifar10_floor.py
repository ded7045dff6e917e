"""benchmarks/cifar10_floor.py, the plain-PyTorch reference of examples/cifar10.py's det, at CI size on CIFAR-10."""

from __future__ import annotations

import math
import sys

import pytest

from tests.support import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import cifar10_floor  # noqa: E402


@pytest.mark.recorded
@pytest.mark.slow
def test_floor_trains_and_reports(data_root, capsys):
    if not (data_root / "cifar10-jpeg.tar.gz").is_file() and not (data_root / "cifar-10-batches-py").is_dir():
        pytest.skip("no CIFAR-10 under the data root")
    result = cifar10_floor.main(["--model", "resnet18", "--width", "0.125", "--epochs", "3", "--train-size", "1024",
                                 "--test-size", "512", "--batch-size", "64", "--lr", "0.05", "--device", "cpu",
                                 "--data-root", str(data_root)])
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith('{"model": "resnet18"')
    losses = result["last_batch_loss"]
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
    assert result["accuracy"] > 0.15  # chance is 0.10 on 512 test images (sd 0.013)
    assert 0.0 <= result["ece"] <= 1.0 and math.isfinite(result["nll"])
