"""``local_reparameterization``: sample pre-activations, not weights (Kingma, Salimans & Welling 2015)."""

from __future__ import annotations

import torch

from pyrobnn.handlers.estimator_messenger import EstimatorMessenger
from pyrobnn.handlers.moments import affine_moments

__all__ = ["LocalReparameterizationMessenger"]


class LocalReparameterizationMessenger(EstimatorMessenger):
    r"""For Linear and Conv layers with a Normal-family posterior, sample each example's pre-activation

    .. math:: b \sim \mathcal N\big(F(x, \mu_W) + \mu_b,\; F(x^2, \sigma_W^2) + \sigma_b^2\big)

    (:math:`F` the layer's linear map; the moments are VDP++'s for a deterministic input,
    :func:`~pyrobnn.handlers.moments.affine_moments`) instead of one weight matrix per batch: the same
    marginal distribution of every pre-activation as weight sampling, independent across
    examples, so gradients have lower variance. Other operations see one weight sample.
    Wrap the ELBO or prediction call::

        with local_reparameterization():
            svi.step(x, y)

    Under S particles, a Linear layer on one row per example samples S pre-activations per
    example; a layer whose input has several rows per example (a convolution, a linear map of
    tokens) applies S weight samples instead, because per-position noise would ignore that
    positions share weights. Without particles a convolution samples every position
    independently, the usual approximation of Kingma et al. (2015) and Molchanov et al. (2017).

    :param num_particles: S > 1 draws S particles in one pass (:mod:`pyrobnn.handlers.particles`).
    :param batch_size: the number of rows of the input (needed when ``num_particles > 1``).
    """

    handler = "local_reparameterization"

    def layer(self, op, x, weight, bias=None, *rest, **kwargs):
        if self.particles is not None and x.dim() > 2:
            return self.sampled_layer(op, x, weight, bias, *rest, **kwargs)
        moments = affine_moments(op, x, weight, bias, *rest, **kwargs)
        mean, std = moments.loc, moments.variance.clamp_min(1e-16).sqrt()
        if self.particles is not None and self.particles.is_first(x):  # S draws of moments computed once
            noise = torch.randn((self.particles.count,) + mean.shape, dtype=mean.dtype, device=mean.device)
            return torch.addcmul(mean, std, noise).flatten(0, 1)
        return torch.addcmul(mean, std, torch.randn_like(mean))
