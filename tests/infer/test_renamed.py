"""The public names renamed since the last release still work, for one release, with a ``DeprecationWarning`` naming
what replaced them: ``fit(estimator=, num_particles=, precision=)``,
``sample_posterior(jit=, compiler=)``, ``MCMCResult.posterior()`` and ``MCMCResult.num_draws``. Each old spelling
gives what the new one gives, run in the same test."""

from __future__ import annotations

import re

import pyro
import pytest
import torch
from torch import nn

from pyrobnn import BayesianNetwork, Gaussian, NormalGuide, fit, sample_posterior
from pyrobnn.guides import PosteriorDraws
from pyrobnn.infer.elbo import MeanFieldELBO
from tests.support import nuts


def _at_the_callers_line(record):
    """Every warning of ``record`` points at a line of this file (the user's call), not inside pyrobnn."""
    assert record and all(warning.filename == __file__ for warning in record), [w.filename for w in record]


def _trained(**options):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
    model = BayesianNetwork(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
    guide = NormalGuide(model)
    history = fit(model, guide, x, y, epochs=2, batch_size=16, progress=False, **options)
    return history["loss"], {name: value.detach().clone() for name, value in pyro.get_param_store().items()}


def test_fits_objective_keywords_warn_and_train_as_their_elbo():
    message = re.escape("fit(estimator=...) is deprecated: use elbo=MeanFieldELBO(estimator=...) "
                        "(fit(estimator=...) is removed in pyrobnn 0.2)")
    with pytest.warns(DeprecationWarning, match=message) as record:
        old = _trained(estimator="local", num_particles=2, compile="none")
    _at_the_callers_line(record)
    new = _trained(elbo=MeanFieldELBO(2, vectorize_particles=True, estimator="local"), compile="none")
    assert old[0] == new[0] and all(torch.equal(old[1][name], new[1][name]) for name in new[1])
    with pytest.warns(DeprecationWarning, match=r"fit\(precision=\.\.\.\).*elbo=MeanFieldELBO\(precision=\.\.\.\)"):
        assert _trained(precision="fp32", compile="none")[0] == _trained(compile="none")[0]


def test_an_old_keyword_beside_its_successor_or_an_unknown_one_is_refused():
    with pytest.raises(ValueError, match="estimator and elbo= both set the objective"), \
            pytest.warns(DeprecationWarning):
        _trained(estimator="local", elbo=MeanFieldELBO())
    with pytest.raises(TypeError, match="fit\\(\\) got an unexpected keyword argument 'estimatr'"):
        _trained(estimatr="local")


def _sampled(**options):
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x = torch.randn(32, 4)
    model = BayesianNetwork(nn.Linear(4, 1), Gaussian(scale=0.5), num_data=32)
    return sample_posterior(model, x, x.sum(-1, keepdim=True),
                            **nuts(num_samples=10, warmup=10, num_chains=2, **options))


@pytest.mark.parametrize("old, new", [(dict(jit=True), "trace"), (dict(compiler="script"), "trace"),
                                      (dict(compiler="eager"), "none")])
def test_samplers_compile_keywords_warn_and_sample_as_their_mode(old, new):
    (name,) = old
    with pytest.warns(DeprecationWarning, match=rf"sample_posterior\({name}=\.\.\.\) is deprecated") as record:
        result = _sampled(**old)
    _at_the_callers_line(record)
    assert result.diagnostics["compile"] == new
    expected = _sampled(compile=new)
    assert all(torch.equal(result.draws[site], expected.draws[site]) for site in expected.draws)


def test_mcmc_results_posterior_and_num_draws_warn_and_give_guide_and_len():
    result = _sampled(compile="none")
    with pytest.warns(DeprecationWarning, match=r"MCMCResult\.posterior\(\) is deprecated: use MCMCResult\.guide\(\)") \
            as record:
        guide = result.posterior()
    _at_the_callers_line(record)
    assert isinstance(guide, PosteriorDraws)
    assert all(torch.equal(guide.draws()[site], result.guide().draws()[site]) for site in result.draws)
    with pytest.warns(DeprecationWarning, match=r"MCMCResult\.num_draws is deprecated: use len\(result\)"):
        assert result.num_draws == len(result) == 20
