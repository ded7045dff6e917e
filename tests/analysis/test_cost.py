"""pyrobnn.analysis.cost: live-tensor peak memory, interleaved timing, training steps side by side."""

import pytest
import torch

from pyrobnn.analysis.cost import LiveTensorMemory, compare_training_cost, peak_memory, time_steps, training_step
from pyrobnn.networks import MLP

MIB = 2**20


def test_live_tensor_memory_counts_storages_once_and_releases_them():
    with LiveTensorMemory() as tracker:
        a = torch.zeros(MIB // 4)  # 1 MiB of float32
        view = a.view(2, -1)[0]  # a view shares the storage: not counted again
        b = a + 1
        assert tracker.current == 2 * MIB
        del a, view, b
        assert tracker.current == 0
        c = torch.ones(MIB // 8)
        del c
    assert tracker.peak == 2 * MIB


def test_peak_memory_of_a_step_is_its_largest_simultaneous_allocation():
    def step():
        x = torch.ones(MIB // 4)
        y = x * 2  # 2 MiB alive at once
        del x
        return y.sum()

    assert peak_memory(step) == pytest.approx(2.0, abs=1e-3)


def test_peak_memory_sees_the_backward_pass():
    w = torch.randn(256, 256, requires_grad=True)
    x = torch.randn(1024, 256)

    def step():
        (x @ w).relu().sum().backward()

    forward_only = peak_memory(lambda: (x @ w).relu().sum().detach())
    assert peak_memory(step) > forward_only >= 1.0  # the 1 MiB product, plus gradients in backward


def test_time_steps_times_every_method_and_validates():
    ms = time_steps({"a": lambda: torch.ones(10).sum(), "b": lambda: None}, rounds=2, repeats=2, warmup=1)
    assert set(ms) == {"a", "b"} and all(v >= 0 for v in ms.values())
    with pytest.raises(ValueError, match="rounds"):
        time_steps({"a": lambda: None}, rounds=0)


def test_training_steps_side_by_side():
    cost = compare_training_cost(MLP(16, (8,), 3), (16,), 3,
                                 {"det": ("det", "weight"), "bbb": ("sample", "weight"), "vdp": ("vdp", "row")},
                                 batch_size=32, num_data=64, rounds=1, repeats=1)
    assert set(cost) == {"det", "bbb", "vdp"}
    assert cost["det"]["time_ratio"] == cost["det"]["memory_ratio"] == 1.0
    assert cost["vdp"]["peak_mib"] > cost["det"]["peak_mib"] > 0  # means and variances
    assert cost["det"]["s_epoch"] == pytest.approx(cost["det"]["ms_step"] * 2 / 1e3)


def test_bad_methods_are_refused():
    x, y = torch.randn(4, 16), torch.randint(0, 3, (4,))
    with pytest.raises(ValueError, match="method must be 'det' or an estimator"):
        training_step(MLP(16, (8,), 3), x, y, "bogus")
    with pytest.raises(ValueError, match="compile for the det step is 'auto', 'none' or 'inductor'"):
        training_step(MLP(16, (8,), 3), x, y, "det", compile="trace")
    with pytest.raises(ValueError, match="must include 'det'"):
        compare_training_cost(MLP(16, (8,), 3), (16,), 3, {"bbb": ("sample", "weight")})
