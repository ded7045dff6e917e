"""pyrobnn: Bayesian neural networks on Pyro."""

from .bayesian import bayesian, bayesian_sites, last_layer
from .elbo import MeanFieldELBO
from .guides import NormalGuide, SiteGuide
from .handlers import kl_annealing
from .likelihoods import Categorical, Gaussian, HeteroscedasticGaussian
from .model import BayesianNetwork
from .priors import GaussianPrior, Prior, ScaleMixturePrior

__version__ = "0.1.0"

__all__ = [
    "BayesianNetwork",
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
