"""A fit saved with Pyro's param store is restored in a new process, whether the store is loaded before or after
the model and guide are built (as an autoguide's), including the deterministic weights of an implicit BNN."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pyro
import pytest
import torch

from pyrobnn import BayesianNetwork, MixtureNodeGuide, NodePrior, NormalGuide, fit, predict
from pyrobnn.data import two_moons
from pyrobnn.infer.elbo import MeanFieldELBO
from pyrobnn.infer.optim import Optim
from pyrobnn.networks import MLP

BUILD = {
    "normal": "model = BayesianNetwork(MLP(2, (16,), 2), num_data=200)\nguide = NormalGuide(model, init_rho=-4.0)",
    "node": ("model = BayesianNetwork(MLP(2, (16,), 2), prior=NodePrior(0.3), num_data=200)\n"
             "guide = MixtureNodeGuide(model, num_components=2)"),
}

PREDICT = """
pyro.set_rng_seed(11)
probs = predict(model, guide, data.x_test, num_samples=8)["probs"]
"""


def _train_and_save(kind, tmp_path):
    data = two_moons(n=300, n_train=200, seed=3)
    pyro.set_rng_seed(0)
    namespace = dict(BayesianNetwork=BayesianNetwork, MLP=MLP, NormalGuide=NormalGuide, NodePrior=NodePrior,
                     MixtureNodeGuide=MixtureNodeGuide)
    exec(BUILD[kind], namespace)
    model, guide = namespace["model"], namespace["guide"]
    fit(model, guide, data.x_train, data.y_train, epochs=3, batch_size=50, optimizer=Optim(lr=0.02),
        elbo=MeanFieldELBO(estimator="local"), progress=False, device="cpu")
    pyro.set_rng_seed(11)
    probs = predict(model, guide, data.x_test, num_samples=8)["probs"]
    path = tmp_path / "store.pt"
    pyro.get_param_store().save(path)
    torch.save(probs, tmp_path / "probs.pt")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(BUILD))
@pytest.mark.parametrize("order", ["load-then-build", "build-then-load"])
def test_a_fit_reloaded_in_a_new_process_predicts_exactly_as_before(kind, order, tmp_path):
    path = _train_and_save(kind, tmp_path)
    build = BUILD[kind]
    load = f"pyro.get_param_store().load({str(path)!r})"
    steps = f"{load}\n{build}" if order == "load-then-build" else f"{build}\n{load}"
    script = textwrap.dedent("""
        import pyro, torch
        from pyrobnn import BayesianNetwork, MixtureNodeGuide, NodePrior, NormalGuide, predict
        from pyrobnn.data import two_moons
        from pyrobnn.networks import MLP
        torch.set_num_threads(1)
        data = two_moons(n=300, n_train=200, seed=3)
        pyro.set_rng_seed(123)  # other initial weights than the fit's: only the load can restore them
    """) + steps + PREDICT + f"torch.save(probs, {str(tmp_path / 'reloaded.pt')!r})\n"
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)
    expected, got = torch.load(tmp_path / "probs.pt"), torch.load(tmp_path / "reloaded.pt")
    assert torch.equal(expected, got)
    assert expected.argmax(-1).float().std() > 0  # a trained classifier, not a constant


def test_a_guide_built_again_without_a_load_trains_its_own_parameters():
    data = two_moons(n=300, n_train=200, seed=3)
    first = BayesianNetwork(MLP(2, (8,), 2), num_data=200)
    NormalGuide(first)
    second_model = BayesianNetwork(MLP(2, (8,), 2), num_data=200)
    second = NormalGuide(second_model)  # same names: it replaces the first guide's entries
    before = {n: p.detach().clone() for n, p in second.named_parameters()}
    fit(second_model, second, data.x_train, data.y_train, epochs=1, batch_size=50, progress=False, device="cpu")
    store = pyro.get_param_store()
    for name, parameter in second.named_parameters():
        assert not torch.equal(parameter, before[name]), name  # the optimiser trained what the guide uses
    assert any(store[n] is p for n in store.keys() for p in second.parameters())


def test_a_loaded_entry_of_another_shape_is_refused_with_its_name(tmp_path):
    BayesianNetwork(MLP(2, (8,), 2), prior=NodePrior(0.3), num_data=10)
    pyro.get_param_store().save(tmp_path / "small.pt")
    pyro.clear_param_store()
    pyro.get_param_store().load(tmp_path / "small.pt")
    with pytest.raises(ValueError, match=r"'net.\d.weight' of shape \(8, 2\).*\(16, 2\)"):
        BayesianNetwork(MLP(2, (16,), 2), prior=NodePrior(0.3), num_data=10)
