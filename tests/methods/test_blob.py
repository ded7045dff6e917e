"""BLoB as its authors coded it (Wang-ML-Lab/bayesian-peft, modelwrappers/blob.py, scripts/blob/): sigma = G^2 with G
from U(eps/sqrt 2, eps), the KL stepped apart by SGD at their rate, weighted by their cycles of 100 N^(pi/8) / B
steps."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from pyrobnn import BayesianNetwork
from pyrobnn.guides import NormalGuide
from pyrobnn.infer.schedules import KLCycles
from pyrobnn.methods import METHODS
from pyrobnn.methods.registry import BLOB_KL_LR


def blob_weights(step: int, cycle: int) -> float:
    """Their code's pi for its step counter ``self.i`` (from 1): i = self.i % M, or M where it divides."""
    i = step % cycle or cycle
    return 2**i / (2 ** (cycle + 1) - 1)  # exact integers, as Python computes theirs


@pytest.mark.parametrize("num_data, batch_size", [(640, 16), (2490, 32), (64, 16)])
def test_the_kl_cycles_are_blobs_weights_in_the_summed_elbos_units(num_data, batch_size):
    steps = math.ceil(num_data / batch_size)
    schedule = KLCycles().for_data(num_data)
    cycle = int(100 * num_data ** (math.pi / 8) / batch_size)  # their M with --bayes-datasetrescaling, one process
    assert abs(schedule.cycle(num_data, steps) - cycle) <= 1  # B = N / S here
    cycle = schedule.cycle(num_data, steps)
    for t in range(3 * cycle):  # their self.i is t + 1; beta = S pi, the KL counted once an epoch at sum(beta) = S
        beta = schedule(t // steps, t % steps, steps)
        assert beta == pytest.approx(steps * blob_weights(t + 1, cycle), rel=1e-12)
    with pytest.raises(ValueError, match="reads the training-set size"):
        KLCycles()(0, 0, steps)


def test_the_kl_rate_per_example_is_their_rate_per_batch():
    """BLoB steps pi KL by SGD at 0.002 (RoBERTa, batches of 32); pyrobnn steps beta KL = S pi KL at kl_lr / N, so
    kl_lr = 0.002 x 32 takes their step at their batch size."""
    assert BLOB_KL_LR == pytest.approx(0.002 * 32)
    num_data, batch_size = 2490, 32
    steps = math.ceil(num_data / batch_size)
    assert BLOB_KL_LR / num_data * steps == pytest.approx(0.002, rel=0.02)


def test_blobs_sigma_is_g_squared_drawn_as_their_code_draws_it():
    torch.manual_seed(0)
    model = BayesianNetwork(nn.Linear(384, 8), num_data=10)
    guide = METHODS["blob"].guide(model)
    guide(torch.randn(2, 384), torch.zeros(2, dtype=torch.long))
    root = guide.loc_scale("net.weight")[1].detach().sqrt()
    assert root.min() >= 0.05 / math.sqrt(2) - 1e-6 and root.max() <= 0.05 + 1e-6
    assert root.std() == pytest.approx((0.05 - 0.05 / math.sqrt(2)) / math.sqrt(12), rel=0.05)  # uniform
    assert isinstance(guide, NormalGuide) and guide.parameterization == "square"
