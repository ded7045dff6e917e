"""pyrobnn: Bayesian neural networks on Pyro."""

from .conversion import bayesian, bayesian_sites, last_layer
from .elbo import MeanFieldELBO
from .guides import (
    AdditiveDropoutGuide,
    DropoutGuide,
    MixtureNodeGuide,
    MultiplicativeDropoutGuide,
    NormalGuide,
    PointGuide,
    SiteGuide,
)
from .handlers import flipout, kl_annealing, local_reparameterization, vdp, weight_sampling
from .likelihoods import Categorical, Gaussian, HeteroscedasticGaussian
from .model import BayesianNetwork
from .priors import GaussianPrior, LogUniformPrior, NodePrior, Prior, ScaleMixturePrior

__version__ = "0.1.0"

__all__ = [
    "AdditiveDropoutGuide",
    "BayesianNetwork",
    "DropoutGuide",
    "MixtureNodeGuide",
    "NodePrior",
    "PointGuide",
    "LogUniformPrior",
    "MultiplicativeDropoutGuide",
    "flipout",
    "local_reparameterization",
    "vdp",
    "weight_sampling",
    "Categorical",
    "Gaussian",
    "GaussianPrior",
    "HeteroscedasticGaussian",
    "MeanFieldELBO",
    "NormalGuide",
    "Prior",
    "ScaleMixturePrior",
    "SiteGuide",
    "bayesian",
    "bayesian_sites",
    "kl_annealing",
    "last_layer",
]
