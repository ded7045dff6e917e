"""``flipout``: one weight perturbation per batch, decorrelated per example (Wen et al. 2018)."""

from __future__ import annotations

from pyro.poutine.handlers import _make_handler

from .gaussian_weights import GaussianWeightMessenger

__all__ = ["FlipoutMessenger", "flipout"]


class FlipoutMessenger(GaussianWeightMessenger):
    r"""Flipout estimator for Linear and Conv layers with a Normal-family posterior:

    .. math:: y_n = F(x_n, \mu_W) + \big(F(x_n \odot s_n, \Delta W)\big) \odot r_n + b,
              \quad \Delta W = \sigma_W \odot \epsilon

    with one :math:`\epsilon \sim \mathcal N(0, I)` per batch and independent random
    signs :math:`s_n, r_n \in \{\pm 1\}` per example: each example sees the weight
    :math:`\mu_W + \Delta W \odot r_n s_n^\top`, which is distributed as
    :math:`q(W)`, while examples are decorrelated. Other layers keep plain weight
    sampling; a non-Normal posterior is refused with an error.

    :param num_particles: S > 1 gives every particle its own perturbation and signs, all in one
        pass (see :class:`~pyrobnn.handlers.gaussian_weights.GaussianWeightMessenger`).
    :param batch_size: the number of rows of the input (needed when ``num_particles > 1``).
    """

    mode = "flipout"
    handler_name = "flipout"


@_make_handler(FlipoutMessenger)
def flipout(fn=None, num_particles=1, batch_size=None):  # noqa: D103 (docstring comes from the messenger)
    ...
