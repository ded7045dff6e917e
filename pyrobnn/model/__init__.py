"""What the model is, p(w) p(y | x, w): priors, likelihoods, the conversion of a network, node latents and
:class:`BayesianNetwork`, the Pyro model around any ``nn.Module``."""

from pyrobnn.model.bayesian_network import BayesianNetwork
from pyrobnn.model.conversion import bayesian, bayesian_sites, last_layer
from pyrobnn.model.likelihoods import LIKELIHOODS, Categorical, Gaussian, HeteroscedasticGaussian, Likelihood
from pyrobnn.model.priors import PRIORS, GaussianPrior, LogUniformPrior, NodePrior, Prior, ScaleMixturePrior

__all__ = [
    "LIKELIHOODS", "PRIORS", "BayesianNetwork", "Categorical", "Gaussian", "GaussianPrior", "HeteroscedasticGaussian",
    "Likelihood", "LogUniformPrior", "NodePrior", "Prior", "ScaleMixturePrior", "bayesian", "bayesian_sites",
    "last_layer",
]
