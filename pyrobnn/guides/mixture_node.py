r"""Mixture node posterior: the implicit BNN of Trinh, Kaski & Heinonen (2020).

"Scalable Bayesian neural networks by layer-wise input augmentation": the weights are point estimates and
each layer's node latents (:class:`~pyrobnn.model.priors.NodePrior`, :mod:`pyrobnn.model.nodes`) get the variational
ensemble posterior (eq. 19)

.. math:: q(z_l) = \frac1K \sum_{k=1}^K \mathcal N(z_l; \mu_{l,k}, \operatorname{diag}\sigma_{l,k}^2),
          \qquad \sigma = \mathrm{softplus}(\rho),

an :class:`~pyrobnn.distributions.EqualMixtureNormal`. Training (their Algorithm 1) splits each minibatch
among the K components: under an estimator handler row r of the batch uses component r mod K
(:class:`~pyrobnn.handlers.node_draws.NodeDraws`), so the rows of a training batch must be a multiple of K, or the
particles are (S = K·T; in prediction every example then gets T draws from each component). Plain
sampling (no handler, e.g. Pyro's ``SVI`` with ``Trace_ELBO``) draws one :math:`z` per site from the mixture
for the whole batch, an unbiased but noisier estimator; so does ``weight_sampling`` with one particle (``fit``'s
default estimator), which leaves sites alone: train with ``estimator="local"`` or ``num_particles`` = K·T.

The two learning rates of the paper (Table 2: SGD with Nesterov momentum on the weights, a large
constant rate on the variational parameters) are :class:`~pyrobnn.infer.optim.TwoGroupSGD`; the weights' schedule, flat
for half the run then linear to 1 %, is :class:`~pyrobnn.infer.optim.FlatThenLinear` (``fit(optimizer=TwoGroupSGD(...,
schedule=FlatThenLinear(epochs)))``); the KL weight rises 0 → 1 over the first 2/3 of the run
(:class:`~pyrobnn.infer.schedules.LinearWarmup` with ``anneal = 2 * epochs // 3``).
"""

from __future__ import annotations

import torch

from pyrobnn.checks import choice, nonnegative, positive, positive_int
from pyrobnn.distributions import MIXTURE_KLS, EqualMixtureNormal, softplus
from pyrobnn.guides.base import InitLoc, SiteGuide
from pyrobnn.model.priors import NodePrior

__all__ = ["MixtureNodeGuide"]


class MixtureNodeGuide(SiteGuide):
    r"""The K-component mixture posterior over the node sites of an implicit BNN (see the module docstring).

    Initialisation (the paper's): :math:`\mu_k \sim \mathcal N(\mathrm{loc}, \sigma_0^2)` around the
    ``init_loc`` (by default the prior mean 1), :math:`\sigma_k \sim |\mathcal N(0.05, 0.02^2)|`.

    :param model: a :class:`~pyrobnn.BayesianNetwork` built with ``prior=NodePrior(...)``.
    :param num_components: K.
    :param init_scale: :math:`\sigma_0`, the spread of the initial means (0.75 for VGG-16, 0.5 for
        WideResNet-28-10 in the paper).
    :param init_sigma: mean and standard deviation of the initial :math:`\sigma` of every latent.
    :param kl: the KL term, ``"mixture_mean"`` (the paper's, eq. 22-24) or ``"entropy_bound"`` (an upper bound
        of the true KL), see :class:`~pyrobnn.distributions.EqualMixtureNormal`.
    :param entropy_weight: :math:`\gamma \ge 0`, the entropy bonus of the γ-ELBO (Trinh et al. 2022).
    :param init_loc: centre of the initial means (default ``"module"``: the node references, 1).
    """

    def __init__(self, model, num_components: int = 4, init_scale: float = 0.5,
                 init_sigma: tuple[float, float] = (0.05, 0.02), kl: str = "mixture_mean",
                 entropy_weight: float = 0.0, init_loc: InitLoc = "module", *, name: str | None = None):
        self.num_components = positive_int("num_components (K, the mixture components)", num_components)
        self.init_scale = nonnegative("init_scale (spread of the initial component means)", init_scale)
        if not (isinstance(init_sigma, (tuple, list)) and len(init_sigma) == 2):
            raise ValueError(f"init_sigma must be (mean, std) of the initial sigmas, got {init_sigma!r}")
        self.init_sigma = (positive("init_sigma[0] (mean of the initial sigmas)", init_sigma[0]),
                           nonnegative("init_sigma[1] (std of the initial sigmas)", init_sigma[1]))
        self.kl = choice("kl", kl, MIXTURE_KLS)
        self.entropy_weight = nonnegative("entropy_weight (gamma of the entropy bonus)", entropy_weight)
        super().__init__(model, init_loc, name=name)

    def setup_site(self, site, loc):
        if not isinstance(site.prior, NodePrior):
            raise ValueError(f"MixtureNodeGuide covers node latents, but site {site.name!r} has the prior "
                             f"{site.prior!r}: build the model with BayesianNetwork(net, prior=NodePrior(...))")
        shape = (self.num_components,) + tuple(loc.shape)
        like = dict(dtype=loc.dtype, device=loc.device)
        locs = loc + self.init_scale * torch.randn(shape, **like)
        sigmas = (self.init_sigma[0] + self.init_sigma[1] * torch.randn(shape, **like)).abs().clamp_min(1e-6)
        self.add_param(site, "locs", locs)
        self.add_param(site, "rhos", sigmas.expm1().log())  # softplus^-1

    def get_posterior(self, name, prior):
        locs = self.param(name, "locs")
        return EqualMixtureNormal(locs, softplus(self.param(name, "rhos")), self.kl, self.entropy_weight)
