"""Data-parallel SVI (pyrobnn.infer.distributed) with two gloo processes on the CPU against one process.

One start of two processes runs every scenario and saves what it saw; the tests compare it with the
same computation done here in one process on the concatenated batch (float64, fixed seeds).
"""

from __future__ import annotations

import contextlib
import os
import socket

import pyro
import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from pyrobnn import BayesianNetwork, NormalGuide
from pyrobnn.infer import distributed as ddp
from pyrobnn.infer.elbo import MeanFieldELBO
from pyrobnn.infer.optim import Optim, make_optimizer
from pyrobnn.infer.svi import fit, svi_step

WORLD = 2
NUM_DATA = 64  # the global N the likelihood is scaled by
INIT_SEED, NOISE_SEED = 10, 123


def _problem(seed: int, batchnorm: bool = False):
    """A 5-7-3 MLP with Bayesian weights and a deterministic output bias (a model parameter), its guide;
    ``batchnorm`` puts a BatchNorm layer (running statistics) on the inputs."""
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    net = nn.Sequential(nn.BatchNorm1d(5) if batchnorm else nn.Identity(), nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    model = BayesianNetwork(net, num_data=NUM_DATA, exclude=["3.bias", nn.BatchNorm1d])
    guide = NormalGuide(model, init_rho=-2.0)
    return model, guide


def _batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(8, 5, generator=generator), torch.randint(0, 3, (8,), generator=generator)


def _classification_data():
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(NUM_DATA, 5, generator=generator)
    return x, (x @ torch.randn(5, 3, generator=generator)).argmax(-1)


def _state(model, guide, what: str) -> dict[str, torch.Tensor]:
    """The values (``what="data"``) or gradients (``"grad"``) of every parameter, by name."""
    named = [*(("guide." + n, p) for n, p in guide.named_parameters()),
             *(("model." + n, p) for n, p in model.named_parameters())]
    return {name: getattr(p, what).detach().clone() for name, p in named}


def _two_steps(model, guide, x, y) -> dict:
    """One Adam step with weight sampling (same seed: the same weight sample), then one under vdp."""
    optim = make_optimizer([*guide.parameters(), *model.parameters()], "adam", lr=0.01)
    record = {}
    for estimator in ("sample", "vdp"):
        pyro.set_rng_seed(NOISE_SEED)
        svi_step(model, guide, optim, x, y, elbo=MeanFieldELBO(estimator=estimator))
        record[estimator] = {"grad": _state(model, guide, "grad"), "after": _state(model, guide, "data")}
    return record


def _worker(index: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(index), LOCAL_RANK=str(index),
                      WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    with ddp.process_group("gloo", timeout=60) as device:
        assert device == torch.device("cpu") and ddp.rank() == index and ddp.world_size() == WORLD
        x, y = ddp.shard(*_batch())
        model, guide = _problem(INIT_SEED + index)  # different until data_parallel broadcasts rank 0's
        averager = ddp.data_parallel(model, guide)
        record = {"initial": _state(model, guide, "data"), "steps": _two_steps(model, guide, x, y)}
        averager.remove()
        svi_step(model, guide, make_optimizer(guide.parameters(), lr=0.01), x, y, elbo=MeanFieldELBO(estimator="vdp"))
        record["removed_grad"] = _state(model, guide, "grad")

        model, guide = _problem(INIT_SEED, batchnorm=True)
        with ddp.data_parallel(model, guide):
            svi_step(model, guide, make_optimizer(guide.parameters(), lr=0.01), x, y,
                     elbo=MeanFieldELBO(estimator="vdp"))
        record["running"] = [model.net[0].running_mean.clone(), model.net[0].running_var.clone()]

        xs, ys = ddp.shard(*_classification_data())
        model, guide = _problem(20 + index)
        with ddp.data_parallel(model, guide):
            history = fit(model, guide, xs, ys, epochs=4, batch_size=8, optimizer=Optim(lr=0.05),
                          elbo=MeanFieldELBO(estimator="local"), num_data=ddp.world_size() * len(xs),
                          seed=ddp.rank_seed(0), device=device, progress=False)
            record["fit"] = {"loss": history["loss"], "final": _state(model, guide, "data"),
                             "difference": ddp.max_parameter_difference(model, guide)}
    torch.save(record, os.path.join(out, f"rank{index}.pt"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """What each of the two gloo processes saw (one start for the whole module, ~5-10 s)."""
    out = tmp_path_factory.mktemp("ddp")
    # spawn, not fork: a forked child cannot run autograd once the parent has started autograd's worker threads
    # (which an earlier test in the same session may have done), so each child imports torch, pyro and pyrobnn anew
    mp.start_processes(_worker, args=(_free_port(), str(out)), nprocs=WORLD, start_method="spawn")
    return [torch.load(out / f"rank{index}.pt") for index in range(WORLD)]


@pytest.fixture
def float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.fixture
def single(float64) -> dict:
    """The same two steps in one process on the concatenated batch of 8 (the two shards of 4)."""
    model, guide = _problem(INIT_SEED)
    return {"initial": _state(model, guide, "data"), "steps": _two_steps(model, guide, *_batch())}


def _assert_close(actual: dict, expected: dict, **tolerance) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], msg=lambda m: f"{name}: {m}", **tolerance)


@pytest.mark.slow
def test_processes_start_from_rank0_parameters(ranks, single):
    for record in ranks:  # rank 1 was built from another seed
        _assert_close(record["initial"], single["initial"], rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["sample", "vdp"])
def test_averaged_gradient_is_the_gradient_of_the_concatenated_batch(ranks, single, estimator):
    """(1/P) sum_r grad[(N/B) sum_{B_r} NLL + KL] = grad[(N/(P B)) sum NLL + KL]: KL once, likelihood by N/(PB)."""
    expected = single["steps"][estimator]["grad"]
    assert any(name.startswith("model.") for name in expected)  # a deterministic parameter is averaged too
    for record in ranks:
        _assert_close(record["steps"][estimator]["grad"], expected, rtol=1e-10, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["sample", "vdp"])
def test_a_step_leaves_identical_parameters_equal_to_one_process(ranks, single, estimator):
    after = [record["steps"][estimator]["after"] for record in ranks]
    _assert_close(after[1], after[0], rtol=0, atol=0)
    _assert_close(after[0], single["steps"][estimator]["after"], rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_running_statistics_are_averaged(ranks, float64):
    """The average of the shards' running means is the running mean of the concatenated batch."""
    model, guide = _problem(INIT_SEED, batchnorm=True)
    svi_step(model, guide, make_optimizer(guide.parameters(), lr=0.01), *_batch(),
             elbo=MeanFieldELBO(estimator="vdp"))
    (mean0, var0), (mean1, var1) = ranks[0]["running"], ranks[1]["running"]
    assert torch.equal(mean0, mean1) and torch.equal(var0, var1)
    torch.testing.assert_close(mean0, model.net[0].running_mean, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(mean0, torch.zeros_like(mean0))


@pytest.mark.slow
def test_removed_averager_leaves_each_process_its_own_gradient(ranks):
    grads = [record["removed_grad"] for record in ranks]
    assert any(not torch.allclose(grads[0][name], grads[1][name]) for name in grads[0])


@pytest.mark.recorded
@pytest.mark.slow
def test_fit_trains_data_parallel_unchanged(ranks):
    for record in ranks:
        losses = record["fit"]["loss"]
        assert losses[-1] < 0.8 * losses[0], losses
        assert record["fit"]["difference"] == 0.0
    _assert_close(ranks[1]["fit"]["final"], ranks[0]["fit"]["final"], rtol=0, atol=0)


def test_one_process_without_torchrun_changes_nothing(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    x, y = _classification_data()
    with ddp.process_group() as device:
        assert (ddp.rank(), ddp.world_size(), ddp.rank_seed(3)) == (0, 1, 3)
        xs, ys = ddp.shard(x, y)
        assert torch.equal(xs, x) and torch.equal(ys, y)
        after = []
        for parallel in (True, False):  # the same step with and without data_parallel
            model, guide = _problem(0)
            with ddp.data_parallel(model, guide.to(device)) if parallel else contextlib.nullcontext():
                assert ddp.max_parameter_difference(model, guide) == 0.0
                pyro.set_rng_seed(NOISE_SEED)
                svi_step(model, guide, make_optimizer(guide.parameters(), lr=0.01), xs[:8], ys[:8])
            after.append(_state(model, guide, "data"))
        _assert_close(after[0], after[1], rtol=0, atol=0)


def test_bad_inputs_get_clear_errors(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    x, y = _classification_data()
    with pytest.raises(ValueError, match="at least one tensor"):
        ddp.shard()
    with pytest.raises(ValueError, match="different numbers of examples"):
        ddp.shard(x, y[:-1])
    with pytest.raises(ValueError, match="at least one"):
        ddp.shard(x[:0])
    with pytest.raises(TypeError, match="first \\(example\\) dimension"):
        ddp.shard(x, [1, 2])
    with pytest.raises(ValueError, match="backend must be one of"):
        ddp.setup("mpi")
    with pytest.raises(ValueError, match="timeout"):
        ddp.setup("gloo", timeout=-1)
    with pytest.raises(ValueError, match="seed must be"):
        ddp.rank_seed(-1)
    with pytest.raises(TypeError, match="torch.nn.Modules"):
        ddp.data_parallel(nn.Linear(2, 2), "guide")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="nccl.*gloo"):
            ddp.setup("nccl")
