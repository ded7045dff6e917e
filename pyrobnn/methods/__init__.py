"""Methods as library objects: a method builds its prior and guide, trains its own way and returns a posterior that
predicts, evaluates, draws, saves and loads.

    from pyrobnn.methods import METHODS
    posterior = METHODS["bbb"].fit(network, x, y, epochs=10)
    posterior.evaluate(x_test, y_test)

:mod:`~pyrobnn.methods.base` (the :class:`Method` contract and SVI), :mod:`~pyrobnn.methods.posthoc` (ensembles,
Laplace, SWAG, SG-MCMC, temperature scaling), :mod:`~pyrobnn.methods.nuts`, :mod:`~pyrobnn.methods.ivon`,
:mod:`~pyrobnn.methods.sngp`,
:mod:`~pyrobnn.methods.posterior` (the :class:`Posterior` protocol), :mod:`~pyrobnn.methods.rules` (the papers'
rules that depend on the run), :mod:`~pyrobnn.methods.lora` (a pretrained network's fine-tuning settings:
:func:`finetuned`) and :mod:`~pyrobnn.methods.registry` (every method by name).
"""

from pyrobnn.infer.draws import Draws
from pyrobnn.methods.base import Method, Refused, Variational
from pyrobnn.methods.ivon import IVON
from pyrobnn.methods.lora import LaplaceLoRA, finetuned
from pyrobnn.methods.nuts import NUTS
from pyrobnn.methods.posterior import (
    EmpiricalPosterior,
    Posterior,
    TemperedPosterior,
    VariationalPosterior,
    load_posterior,
)
from pyrobnn.methods.posthoc import SGMCMC, SWAG, Ensemble, Laplace, TemperatureScaled
from pyrobnn.methods.registry import FAMILIES, METHOD_NAMES, METHODS, resolve_method
from pyrobnn.methods.sngp import SNGP, SNGPPosterior

DRAWS_KINDS = Draws.KINDS
"""Every kind of ``draws.pt`` (an empirical posterior ``{site: (runs, draws, ...)}``) -> what it holds: the kinds of
the methods' posteriors (``ensemble``, ``laplace``, ``swag``, ``sgmcmc``, ``mcmc``, ...)."""

__all__ = ["Method", "Variational", "Refused", "Ensemble", "Laplace", "SWAG", "SGMCMC", "NUTS", "IVON", "SNGP",
           "TemperatureScaled", "LaplaceLoRA", "Posterior", "VariationalPosterior", "EmpiricalPosterior",
           "TemperedPosterior", "SNGPPosterior", "load_posterior", "METHODS", "FAMILIES", "METHOD_NAMES",
           "resolve_method", "DRAWS_KINDS", "finetuned"]
