"""How a model runs: effect handlers, the lazy values they give latent sites, moment rules, particle layout.

One Messenger per module, named ``<name>_messenger.py`` as in ``pyro.poutine``; the handler
functions, each usable as a context manager or a decorator, are made here. The estimators (how a
layer uses a weight that is still a distribution) are registered in :data:`ESTIMATORS`, the one list
that the API, the run configuration and the command line read; what each does with each posterior
family is the table of :mod:`pyrobnn.handlers.families`.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Union

import torch

from pyrobnn.checks import choice
from pyrobnn.handlers.estimator_messenger import EstimatorMessenger
from pyrobnn.handlers.families import LAZY_VALUES, has_lazy_value, register_lazy_value
from pyrobnn.handlers.flipout_messenger import FlipoutMessenger
from pyrobnn.handlers.kl_annealing_messenger import KLAnnealingMessenger
from pyrobnn.handlers.local_reparameterization_messenger import LocalReparameterizationMessenger
from pyrobnn.handlers.vdp_messenger import VDPMessenger
from pyrobnn.handlers.weight_sampling_messenger import WeightSamplingMessenger

__all__ = [
    "ESTIMATORS",
    "LAZY_VALUES",
    "EstimatorMessenger",
    "FlipoutMessenger",
    "KLAnnealingMessenger",
    "LocalReparameterizationMessenger",
    "VDPMessenger",
    "WeightSamplingMessenger",
    "estimator",
    "flipout",
    "has_lazy_value",
    "kl_annealing",
    "local_reparameterization",
    "register_lazy_value",
    "vdp",
    "weight_sampling",
]


def _apply(messenger, fn):
    """The messenger as a context manager (``fn`` None) or ``fn`` wrapped in it (a decorator)."""
    if fn is None:
        return messenger
    if not callable(fn):
        raise ValueError(f"{fn!r} is not callable: pass the handler's options as keyword arguments")
    return functools.update_wrapper(messenger(fn), fn, updated=())


def kl_annealing(fn: Optional[Callable] = None, beta: Union[float, torch.Tensor] = 1.0, *, validate: bool = True):
    r"""Weight the KL term by β: every latent sample site is scaled by ``beta``, observed sites are not.

    Around an ELBO evaluation the objective becomes
    :math:`\frac{N}{B}\sum_b \mathbb E_q \log p(y_b|x_b,w) - \beta\,\mathrm{KL}(q\|p)` (KL warm-up: Sønderby
    et al. 2016; Molchanov et al. 2017), :class:`~pyrobnn.handlers.kl_annealing_messenger.KLAnnealingMessenger`.
    A context manager, or a decorator of ``fn``.

    :param fn: a callable to run under the handler; None returns the handler as a context manager.
    :param beta: the KL weight, a number or a 0-d tensor, at least 0 (0 switches the KL off).
    :param validate: check that ``beta`` is at least 0 (False: the caller checked it).

    Example::

        with kl_annealing(beta=0.1):
            loss = MeanFieldELBO().differentiable_loss(model, guide, x, y)
    """
    return _apply(KLAnnealingMessenger(beta, validate=validate), fn)


def weight_sampling(fn: Optional[Callable] = None, num_particles: int = 1, batch_size: Optional[int] = None):
    r"""Sample whole weights, :math:`w_s = \mu + \sigma \odot \epsilon_s` (Blundell et al. 2015), S particles in one
    pass.

    Every Linear/Conv layer applies its S weight samples in one batched call, so an S-particle ELBO costs one pass
    of the network (:class:`~pyrobnn.handlers.weight_sampling_messenger.WeightSamplingMessenger`). A context
    manager, or a decorator of ``fn``.

    :param fn: a callable to run under the handler; None returns the handler as a context manager.
    :param num_particles: S, the draws of the network in one pass.
    :param batch_size: the number of rows of the input (needed when ``num_particles > 1``).

    Example::

        with weight_sampling(num_particles=5, batch_size=len(x)):
            loss = MeanFieldELBO().differentiable_loss(model, guide, x, y)
    """
    return _apply(WeightSamplingMessenger(num_particles, batch_size), fn)


def local_reparameterization(fn: Optional[Callable] = None, num_particles: int = 1,
                             batch_size: Optional[int] = None):
    r"""Sample each example's pre-activations instead of one weight per batch (Kingma, Salimans & Welling 2015).

    A Linear or Conv layer with a Normal-family posterior draws
    :math:`b \sim \mathcal N\big(F(x, \mu_W) + \mu_b,\; F(x^2, \sigma_W^2) + \sigma_b^2\big)`, the marginal of
    weight sampling, independently per example, so gradients have a lower variance
    (:class:`~pyrobnn.handlers.local_reparameterization_messenger.LocalReparameterizationMessenger`). A context
    manager, or a decorator of ``fn``.

    :param fn: a callable to run under the handler; None returns the handler as a context manager.
    :param num_particles: S > 1 draws S pre-activations per example in one pass.
    :param batch_size: the number of rows of the input (needed when ``num_particles > 1``).

    Example: the same example twice gets two different draws.

    >>> import pyro, torch
    >>> from pyro import poutine
    >>> from torch import nn
    >>> from pyrobnn import BayesianNetwork, NormalGuide, local_reparameterization
    >>> pyro.clear_param_store(); pyro.set_rng_seed(0)
    >>> model = BayesianNetwork(nn.Linear(4, 3), num_data=32)
    >>> guide = NormalGuide(model, init_rho=-3.0)
    >>> x = torch.ones(2, 4)  # the same example twice
    >>> with local_reparameterization():
    ...     out = poutine.replay(model.net, trace=poutine.trace(guide).get_trace())(x)
    >>> out.shape, bool((out[0] != out[1]).all())
    (torch.Size([2, 3]), True)
    """
    return _apply(LocalReparameterizationMessenger(num_particles, batch_size), fn)


def flipout(fn: Optional[Callable] = None, num_particles: int = 1, batch_size: Optional[int] = None):
    r"""Flipout (Wen et al. 2018): one weight perturbation per batch, decorrelated across examples by random signs.

    A Linear or Conv layer with a Normal-family posterior computes
    :math:`y_n = F(x_n, \mu_W) + F(x_n \odot s_n, \Delta W) \odot r_n + b` with
    :math:`\Delta W = \sigma_W \odot \epsilon` and signs :math:`s_n, r_n \in \{\pm 1\}` per example: each
    example sees a weight distributed as :math:`q(W)`
    (:class:`~pyrobnn.handlers.flipout_messenger.FlipoutMessenger`). A context manager, or a decorator of ``fn``.

    :param fn: a callable to run under the handler; None returns the handler as a context manager.
    :param num_particles: S > 1 gives every particle its own perturbation and signs, in one pass.
    :param batch_size: the number of rows of the input (needed when ``num_particles > 1``).

    Example: five particles of an MLP in one pass; the same example twice sees two different weights in each.

    >>> import pyro, torch
    >>> from pyrobnn import BayesianNetwork, NormalGuide, flipout
    >>> from pyrobnn.networks import MLP
    >>> pyro.clear_param_store(); pyro.set_rng_seed(0)
    >>> model = BayesianNetwork(MLP(4, (8,), 3), num_data=32)
    >>> guide = NormalGuide(model, init_rho=-3.0)
    >>> with flipout(num_particles=5, batch_size=2):
    ...     trace = pyro.poutine.trace(guide).get_trace()
    ...     out = pyro.poutine.replay(model.net, trace=trace)(torch.ones(2, 4))
    >>> out = out.reshape(5, 2, 3)  # the particles' rows, stacked
    >>> bool((out[:, 0] != out[:, 1]).all(-1).any()), bool((out[0] != out[1]).any())
    (True, True)
    """
    return _apply(FlipoutMessenger(num_particles, batch_size), fn)


def vdp(fn: Optional[Callable] = None):
    r"""VDP++: run the network on means and variances instead of sampled weights, deterministically, in one pass.

    Every Normal-family weight becomes a :class:`~pyrobnn.handlers.gaussian_weight.GaussianWeight`; Linear/Conv
    layers return :class:`~pyrobnn.handlers.moments.Moments` and every following operation propagates them by the
    rules of :mod:`pyrobnn.handlers.moments` (:class:`~pyrobnn.handlers.vdp_messenger.VDPMessenger`; Dera et al.).
    :func:`~pyrobnn.infer.predict.predict_moments` predicts with it. A context manager, or a decorator of ``fn``.

    :param fn: a callable to run under the handler; None returns the handler as a context manager.

    Example: a linear layer's output, :math:`\mathcal N(x\mu_W^\top + \mu_b,\; x^2 (\sigma_W^2)^\top + \sigma_b^2)`,
    with the handler as a decorator.

    >>> import pyro, torch
    >>> from torch import nn
    >>> from pyrobnn import BayesianNetwork, NormalGuide, vdp
    >>> pyro.clear_param_store(); pyro.set_rng_seed(0)
    >>> net = nn.Linear(4, 3)
    >>> guide = NormalGuide(BayesianNetwork(net, num_data=32), init_rho=-3.0)
    >>> x = torch.randn(5, 4)
    >>> @vdp
    ... def moments():
    ...     return pyro.poutine.replay(net, trace=pyro.poutine.trace(guide).get_trace())(x)
    >>> out = moments()
    >>> (mu_w, sigma_w), (mu_b, sigma_b) = guide.loc_scale("net.weight"), guide.loc_scale("net.bias")
    >>> torch.allclose(out.loc, x @ mu_w.T + mu_b)
    True
    >>> torch.allclose(out.variance, x**2 @ (sigma_w**2).T + sigma_b**2)
    True
    """
    return _apply(VDPMessenger(), fn)


ESTIMATORS: dict[str, type[EstimatorMessenger]] = {
    "sample": WeightSamplingMessenger,
    "local": LocalReparameterizationMessenger,
    "flipout": FlipoutMessenger,
    "vdp": VDPMessenger,
}
"""Gradient estimators by name: weight sampling (Blundell et al. 2015), local reparameterization
(Kingma et al. 2015), flipout (Wen et al. 2018), VDP++ moment propagation (deterministic, no particles)."""


def estimator(name: str, num_particles: int = 1, batch_size: Optional[int] = None, *,
              warn: bool = True) -> EstimatorMessenger:
    """The handler of estimator ``name`` (a key of :data:`ESTIMATORS`) with S = ``num_particles`` in one pass;
    the deterministic ``"vdp"`` takes none (``num_particles`` must be 1). ``warn=False``: say nothing when it finds
    no site to act on (for a caller that chose the estimator itself)."""
    return ESTIMATORS[choice("estimator", name, ESTIMATORS)](num_particles, batch_size, warn=warn)
