r"""Mixture node posterior: the implicit BNN of Trinh, Kaski & Heinonen (2020).

"Scalable Bayesian neural networks by layer-wise input augmentation": the weights are point estimates and
each layer's node latents (:class:`~pyrobnn.priors.NodePrior`, :mod:`pyrobnn.nodes`) get the variational
ensemble posterior (eq. 19)

.. math:: q(z_l) = \frac1K \sum_{k=1}^K \mathcal N(z_l; \mu_{l,k}, \operatorname{diag}\sigma_{l,k}^2),
          \qquad \sigma = \mathrm{softplus}(\rho),

an :class:`~pyrobnn.distributions.EqualMixtureNormal`. Training (their Algorithm 1) splits each minibatch
among the K components: under an estimator handler row r of the batch uses component r mod K
(:class:`~pyrobnn.nodes.NodeDraws`), so the rows of a training batch must be a multiple of K, or the
particles are (S = K·T; in prediction every example then gets T draws from each component). Plain
sampling (no handler, e.g. Pyro's ``SVI`` with ``Trace_ELBO``) draws one :math:`z` per site from the mixture
for the whole batch, an unbiased but noisier estimator; so does ``weight_sampling`` with one particle (``fit``'s
default estimator), which leaves sites alone: train with ``estimator="local"`` or ``num_particles`` = K·T.

The two learning rates of the paper (Table 2: SGD with Nesterov momentum on the weights, a large
constant rate on the variational parameters) are :class:`TwoGroupSGD`; the weights' schedule, flat for
half the run then linear to 1 %, is :class:`FlatThenLinear` (``fit(optimizer=TwoGroupSGD(...),
lr_schedule=FlatThenLinear(epochs))``); the KL weight rises 0 → 1 over the first 2/3 of the run
(:class:`~pyrobnn.schedules.LinearWarmup` with ``anneal = 2 * epochs // 3``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checks import choice, finite, in_range, nonnegative, positive, positive_int
from ..distributions import MIXTURE_KLS, EqualMixtureNormal
from ..priors import NodePrior
from .base import InitLoc, SiteGuide
from .normal import softplus

__all__ = ["MixtureNodeGuide", "TwoGroupSGD", "FlatThenLinear"]


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


@dataclass(frozen=True)
class TwoGroupSGD:
    r"""Optimizer factory ``(model, guide) -> torch.optim.SGD`` with the two parameter groups of implicit BNNs
    (Trinh, Kaski & Heinonen 2020, sec. 3.3 and Table 2):

    - ``"deterministic"``: the network's own parameters (weights :math:`U`, biases, BatchNorm, a learned
      noise scale), SGD with Nesterov momentum and weight decay, learning rate :math:`\lambda_0` (0.05 VGG-16,
      0.1 WRN-28-10), the group a learning-rate schedule applies to;
    - ``"variational"``: the guide's parameters, plain SGD at the constant large rate :math:`\lambda_1` (1.2 to
      4.8 in the paper, about 0.2·K), no weight decay, ``"scheduled": False``.

    Rates and weight decay are those of the paper, whose loss is the mean over the training examples:
    pyrobnn's ELBO sums over the N examples (the minibatch likelihood is scaled by N/B), so the factory divides
    the rates by N = ``model.num_data`` and multiplies the weight decay by N, which gives the same updates.
    ``fit(optimizer=TwoGroupSGD(...))`` sets ``num_data`` before calling it.
    """

    lr: float = 0.05
    variational_lr: float = 1.2
    weight_decay: float = 5e-4
    momentum: float = 0.9
    variational_momentum: float = 0.0

    def __post_init__(self):
        positive("lr (the deterministic weights' learning rate)", self.lr)
        positive("variational_lr (the variational parameters' learning rate)", self.variational_lr)
        nonnegative("weight_decay", self.weight_decay)
        in_range("momentum", self.momentum, 0, 1, "[)")
        in_range("variational_momentum", self.variational_momentum, 0, 1, "[)")

    def __call__(self, model, guide) -> torch.optim.SGD:
        num_data = getattr(model, "num_data", None)
        if not isinstance(num_data, int) or num_data < 1:
            raise ValueError("TwoGroupSGD scales the paper's per-example rates by the training-set size: build the "
                             f"model with num_data=N (fit sets it), got num_data={num_data!r}")
        variational = list(guide.parameters())
        ids = {id(p) for p in variational}
        deterministic = [p for p in dict.fromkeys(model.parameters()) if id(p) not in ids]
        groups = [
            {"params": deterministic, "lr": self.lr / num_data, "weight_decay": self.weight_decay * num_data,
             "momentum": self.momentum, "nesterov": self.momentum > 0, "group": "deterministic", "scheduled": True},
            {"params": variational, "lr": self.variational_lr / num_data, "weight_decay": 0.0,
             "momentum": self.variational_momentum, "nesterov": False, "group": "variational", "scheduled": False},
        ]
        return torch.optim.SGD([g for g in groups if g["params"]], lr=self.lr / num_data)


@dataclass(frozen=True)
class FlatThenLinear:
    r"""Learning-rate multiplier per epoch: 1 until ``start`` of the run, then linear down to ``final`` at
    ``end``, then ``final`` (Trinh et al. 2020, sec. 3.3: from epoch 150 to 270 of 300 down to 0.01·λ0,
    i.e. ``start=0.5, end=0.9``). For ``fit(lr_schedule=...)``; with :class:`TwoGroupSGD` it is meant for the
    ``"deterministic"`` group only (``param_group["scheduled"]``).
    """

    epochs: int
    start: float = 0.5
    end: float = 0.9
    final: float = 0.01

    def __post_init__(self):
        positive_int("epochs", self.epochs)
        in_range("start (fraction of the run before the decay)", self.start, 0, 1)
        in_range("end (fraction of the run where the decay stops)", self.end, 0, 1)
        if self.end < self.start:
            raise ValueError(f"end ({self.end}) must not come before start ({self.start})")
        finite("final (the last multiplier)", self.final)

    def __call__(self, epoch: int) -> float:
        t = epoch / self.epochs
        if t <= self.start:
            return 1.0
        if t >= self.end:
            return self.final
        return 1.0 - (1.0 - self.final) * (t - self.start) / (self.end - self.start)
