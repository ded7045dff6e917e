"""One statement per default, one name per class: the algorithms of ``pyrobnn.infer`` take the papers' settings
without defaults of their own (the methods hold them), the command line's defaults are the methods' (and LoRA's
the network's), and the optimizer factories of SWAG and SG-MCMC are ``SWAGCollector`` and ``SGMCMCOptimizer`` (their
former names, the methods' now, deprecated)."""

from __future__ import annotations

import inspect

import pytest

from pyrobnn.cli.options import MCMCOptions, MethodOptions, ModelOptions, OptimOptions, RunConfig
from pyrobnn.infer import ivon, mcmc, sgmcmc, swag
from pyrobnn.methods import IVON, METHODS, NUTS, SGMCMC, SWAG, Variational
from pyrobnn.networks.hf import LoRA

EMPTY = inspect.Parameter.empty


def _defaults(function) -> dict:
    return {name: p.default for name, p in inspect.signature(function).parameters.items()}


def test_the_algorithms_state_none_of_the_papers_settings():
    assert _defaults(swag.fit_swag)["rank"] is EMPTY and _defaults(swag.fit_swag)["num_samples"] is EMPTY
    assert _defaults(swag.SWAGCollector)["rank"] is EMPTY and _defaults(swag.fit_swag)["optimizer"] is EMPTY
    assert all(_defaults(sgmcmc.SGMCMCOptimizer)[name] is EMPTY for name in ("lr", "friction", "temperature", "cycles",
                                                                             "exploration"))
    assert all(_defaults(ivon.IVONOptim)[name] is EMPTY for name in ("lr", "ess", "hess_init", "beta1", "beta2",
                                                                     "weight_decay"))
    assert all(_defaults(mcmc.sample_posterior)[name] is EMPTY for name in ("num_samples", "warmup", "num_chains"))
    # the sampler's own settings are stated by the sampler, and NUTS reads them there
    assert all(getattr(NUTS(), name) == _defaults(mcmc.sample_posterior)[name]
               for name in ("target_accept", "max_tree_depth", "init_jitter", "map_steps", "sampler"))


def test_the_presets_restate_none_of_their_classes_settings():
    assert METHODS["swag"].rank == SWAG().rank and METHODS["swag"].swa_lr == SWAG().swa_lr
    assert METHODS["ivon"].hess_init == IVON().hess_init and METHODS["ivon"].num_samples == IVON().num_samples


def test_the_command_lines_defaults_are_the_methods():
    method, optim, model = MethodOptions(), OptimOptions(), ModelOptions()
    assert (method.swag_rank, method.sgmcmc_temperature, method.sgmcmc_chains) == (SWAG().rank, SGMCMC().temperature,
                                                                                   SGMCMC().chains)
    assert (method.ivon_hess_init, method.ivon_beta1, method.ivon_beta2) == (IVON().hess_init, IVON().beta1,
                                                                             IVON().beta2)
    assert (optim.batch_size, optim.num_particles, optim.estimator) == (Variational().batch_size,
                                                                         Variational().num_particles,
                                                                         Variational().estimator)
    nuts = MCMCOptions()
    assert (nuts.num_samples, nuts.warmup, nuts.num_chains, nuts.target_accept) == (NUTS().num_samples, NUTS().warmup,
                                                                                   NUTS().num_chains,
                                                                                   NUTS().target_accept)
    assert (model.lora_rank, model.lora_alpha, tuple(model.lora_targets)) == (LoRA().r, LoRA().alpha, LoRA().targets)
    assert RunConfig().method_options == method


@pytest.mark.parametrize("module, old, new", [(swag, "SWAG", "SWAGCollector"),
                                              (sgmcmc, "SGMCMC", "SGMCMCOptimizer")])
def test_the_former_names_of_the_optimizer_factories_are_deprecated(module, old, new):
    with pytest.warns(DeprecationWarning, match=f"{new}"):
        assert getattr(module, old) is getattr(module, new)
