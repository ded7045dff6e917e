"""pyrobnn: Bayesian neural networks on Pyro.

The layers, from the ground up (``tests/core/test_layers.py`` enforces them): ground utilities (``checks``,
``files``, ``device``, ``checkpoint``, ``_compat``); ``distributions``, ``data``, ``networks``; ``handlers``
(how a model runs); ``model`` (what it is); ``guides`` (posterior families); ``infer`` (ELBO, SVI, prediction,
NUTS); ``analysis``; ``methods`` (each method as an object: how it trains, the posterior it returns); ``cli``.
"""

from pyrobnn._version import __version__
from pyrobnn.analysis.evaluate import evaluate
from pyrobnn.guides import (
    AdditiveDropoutGuide,
    DropoutGuide,
    MixtureNodeGuide,
    MultiplicativeDropoutGuide,
    NormalGuide,
    PointGuide,
    PosteriorDraws,
    SiteGuide,
)
from pyrobnn.handlers import flipout, kl_annealing, local_reparameterization, vdp, weight_sampling
from pyrobnn.infer import MeanFieldELBO, Optim, fit, predict, predict_moments, sample_posterior, svi_step
from pyrobnn.model import (
    BayesianNetwork,
    Categorical,
    Gaussian,
    GaussianPrior,
    HeteroscedasticGaussian,
    LogUniformPrior,
    NodePrior,
    Prior,
    ScaleMixturePrior,
    bayesian,
    bayesian_sites,
    last_layer,
)

__all__ = [
    "__version__",
    "AdditiveDropoutGuide",
    "BayesianNetwork",
    "Categorical",
    "DropoutGuide",
    "Gaussian",
    "GaussianPrior",
    "HeteroscedasticGaussian",
    "LogUniformPrior",
    "MeanFieldELBO",
    "MixtureNodeGuide",
    "MultiplicativeDropoutGuide",
    "NodePrior",
    "NormalGuide",
    "Optim",
    "PointGuide",
    "PosteriorDraws",
    "Prior",
    "ScaleMixturePrior",
    "SiteGuide",
    "bayesian",
    "bayesian_sites",
    "evaluate",
    "fit",
    "flipout",
    "kl_annealing",
    "last_layer",
    "local_reparameterization",
    "predict",
    "predict_moments",
    "sample_posterior",
    "svi_step",
    "vdp",
    "weight_sampling",
]
