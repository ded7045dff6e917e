"""``local_reparameterization``: sample pre-activations, not weights (Kingma, Salimans & Welling 2015)."""

from __future__ import annotations

from pyro.poutine.handlers import _make_handler

from .gaussian_weights import GaussianWeightMessenger

__all__ = ["LocalReparameterizationMessenger", "local_reparameterization"]


class LocalReparameterizationMessenger(GaussianWeightMessenger):
    r"""For Linear and Conv layers with a Normal-family posterior, sample each example's pre-activation

    .. math:: b \sim \mathcal N\big(F(x, \mu_W) + \mu_b,\; F(x^2, \sigma_W^2) + \sigma_b^2\big)

    (:math:`F` the layer's linear map) instead of one weight matrix per batch:
    the same marginal distribution of every pre-activation as weight sampling,
    independent across examples, so gradients have lower variance, and
    :math:`B \times` outputs noise draws replace one per weight. Other layers keep
    plain weight sampling; a non-Normal posterior is refused with an error.
    Wrap the ELBO or prediction call::

        with local_reparameterization():
            svi.step(x, y)

    :param num_particles: S > 1 draws S particles in one pass (see
        :class:`~pyrobnn.handlers.gaussian_weights.GaussianWeightMessenger`).
    :param batch_size: the number of rows of the input (needed when ``num_particles > 1``).
    """

    mode = "local"
    handler_name = "local_reparameterization"


@_make_handler(LocalReparameterizationMessenger)
def local_reparameterization(fn=None, num_particles=1, batch_size=None):  # noqa: D103
    ...
