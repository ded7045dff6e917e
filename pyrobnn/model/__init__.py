"""What the model is, p(w) p(y | x, w): priors, likelihoods, the conversion of a network, node latents,
:class:`BayesianNetwork` (the Pyro model around any ``nn.Module``) and the protocol every model of a network
satisfies (:class:`NetworkModel`; :class:`TracedModel` reads a Pyro model written by hand)."""

from pyrobnn.model.bayesian_network import BayesianNetwork
from pyrobnn.model.conversion import bayesian, bayesian_sites, last_layer
from pyrobnn.model.likelihoods import (
    LIKELIHOODS,
    Categorical,
    Gaussian,
    HeteroscedasticGaussian,
    Likelihood,
    NormalObservation,
    likelihood_of,
)
from pyrobnn.model.priors import PRIORS, GaussianPrior, LogUniformPrior, NodePrior, Prior, ScaleMixturePrior
from pyrobnn.model.protocol import NetworkModel, Site, TracedModel, network_model, scale_observations

__all__ = [
    "LIKELIHOODS", "PRIORS", "BayesianNetwork", "Categorical", "Gaussian", "GaussianPrior", "HeteroscedasticGaussian",
    "Likelihood", "LogUniformPrior", "NetworkModel", "NodePrior", "NormalObservation", "Prior", "ScaleMixturePrior",
    "Site", "TracedModel", "bayesian", "bayesian_sites", "last_layer", "likelihood_of", "network_model",
    "scale_observations",
]
