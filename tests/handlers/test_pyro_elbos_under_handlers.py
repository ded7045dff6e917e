"""Pyro's own ELBOs work under every estimator handler, for every posterior family with a lazy value.

At f307a6a ``Trace_ELBO`` under ``weight_sampling(num_particles=4)`` raised ``ParticlesUnsupported`` on a plain MLP
and ``MixtureNodeGuide`` under ``local_reparameterization()`` raised a ``TypeError``: Pyro scored the handlers'
lazy values with ``log_prob``. Now both sites of a lazy value score the draws the layers used
(:class:`~pyrobnn.handlers.lazy_value.ScoredByDraws`), so ``Trace_ELBO`` is an unbiased estimate of the same ELBO
as :class:`~pyrobnn.MeanFieldELBO` (which uses closed-form KLs where they exist).
"""

from __future__ import annotations

import pyro
import pytest
import torch
from pyro.infer import Trace_ELBO

from pyrobnn import BayesianNetwork, DropoutGuide, MeanFieldELBO, MixtureNodeGuide, NodePrior, NormalGuide
from pyrobnn.data import two_moons
from pyrobnn.distributions import dropout_kl_constant
from pyrobnn.handlers import estimator
from pyrobnn.networks import MLP

FAMILIES = {
    "normal": lambda: (lambda m: NormalGuide(m, init_rho=-3.0), None),
    "dropout": lambda: (lambda m: DropoutGuide(m, rate=0.2), None),
    "mixture-node": lambda: (lambda m: MixtureNodeGuide(m, num_components=2), NodePrior(0.3)),
}
CASES = [(est, s) for est in ("sample", "local", "flipout") for s in (1, 4)] + [("vdp", 1)]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("name, particles", CASES)
def test_trace_elbo_under_each_handler_estimates_the_mean_field_elbo(family, name, particles):
    data = two_moons(n=96, n_train=64, seed=0)
    make_guide, prior = FAMILIES[family]()
    model = BayesianNetwork(MLP(2, (8,), 2), prior=prior, num_data=64)
    guide = make_guide(model)
    losses = {"trace": [], "mean-field": []}
    for i in range(40):
        for key, elbo in (("trace", Trace_ELBO()), ("mean-field", MeanFieldELBO())):
            pyro.set_rng_seed(i)
            with estimator(name, particles, 64):
                loss = elbo.differentiable_loss(model, guide, data.x_train, data.y_train)
            assert torch.isfinite(loss)
            losses[key].append(loss.item())
    trace, mean_field = torch.tensor(losses["trace"]), torch.tensor(losses["mean-field"])
    if family == "dropout":  # Trace_ELBO scores the full cross-entropy: the KL plus a constant (no gradient)
        mean_field += sum(dropout_kl_constant(guide.posterior(n), s.prior_distribution())
                          for n, s in zip(guide.site_names, model.sites()))
    difference = trace - mean_field
    standard_error = difference.std() / len(difference) ** 0.5
    assert abs(difference.mean()) <= 4 * standard_error + 1e-3 * mean_field.abs().mean()


def test_trace_elbo_gradients_reach_the_guide_under_particles():
    data = two_moons(n=96, n_train=64, seed=0)
    model = BayesianNetwork(MLP(2, (8,), 2), num_data=64)
    guide = NormalGuide(model)
    with estimator("sample", 4, 64):
        Trace_ELBO().differentiable_loss(model, guide, data.x_train, data.y_train).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in guide.parameters())
