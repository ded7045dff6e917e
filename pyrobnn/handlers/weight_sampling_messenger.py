"""``weight_sampling``: Bayes by Backprop's weight samples, S particles in one pass (Blundell et al. 2015)."""

from __future__ import annotations

from torch.distributions import Normal

from pyrobnn.handlers.estimator_messenger import EstimatorMessenger
from pyrobnn.handlers.families import base_distribution

__all__ = ["WeightSamplingMessenger"]


class WeightSamplingMessenger(EstimatorMessenger):
    r"""Sample whole weights, :math:`w_s = \mu + \sigma \odot \epsilon_s` (Blundell et al. 2015), for
    S particles at once: every Linear/Conv layer applies its S weight samples in one batched call
    (a batched matrix product, a grouped convolution), so an S-particle ELBO costs one pass of the
    network instead of S. Each particle is exactly one draw of the network under :math:`q(w)`,
    shared by the examples of the batch, as without the handler. A Monte-Carlo KL (e.g. against the
    scale-mixture prior) scores the same S draws. With ``num_particles=1`` it changes nothing
    for a Normal-family site (the guide's sample is the weight); sites of the other families of
    :mod:`pyrobnn.handlers.families` (MC dropout, mixture nodes) get their per-example draws at any S::

        with weight_sampling(num_particles=5, batch_size=len(x)):
            loss = MeanFieldELBO().differentiable_loss(model, guide, x, y)

    :param num_particles: S, the number of weight samples.
    :param batch_size: the number of rows of the input (needed when ``num_particles > 1``).
    """

    handler = "weight_sampling"

    def _pyro_sample(self, msg):
        if (self.particles is None and msg["value"] is None and not msg["is_observed"]
                and isinstance(base_distribution(msg["fn"]), Normal)):
            self._acted += 1
            return  # one particle: the guide's own sample is the weight
        super()._pyro_sample(msg)

    layer = EstimatorMessenger.sampled_layer
