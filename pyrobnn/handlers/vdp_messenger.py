"""``vdp``: variance-only density propagation (VDP++, Dera et al.) instead of sampling."""

from __future__ import annotations

import torch
from torch.distributions import Categorical, Independent, Normal

from pyrobnn.distributions import MomentCategorical
from pyrobnn.handlers.estimator_messenger import EstimatorMessenger
from pyrobnn.handlers.moments import Moments, affine_moments

__all__ = ["VDPMessenger"]


class VDPMessenger(EstimatorMessenger):
    r"""Run the network deterministically on means and variances instead of sampled weights.

    Every Normal-family weight site becomes a :class:`~pyrobnn.handlers.gaussian_weight.GaussianWeight`
    whose Linear/Conv layers return :class:`~pyrobnn.handlers.moments.Moments` (mean and variance of each
    unit, no covariances, :func:`~pyrobnn.handlers.moments.affine_moments`); every following operation
    propagates them by the rules of :mod:`pyrobnn.handlers.moments`, so the same network and the same
    diagonal Normal posterior used for Bayes by Backprop give the output mean and variance in one
    pass::

        with vdp():
            out = poutine.replay(model.net, trace=poutine.trace(guide).get_trace())(x)
        out.loc, out.variance

    An operation without a rule raises an error naming it. A KL without a closed form (e.g.
    against the scale-mixture prior) is estimated on one weight sample.

    A model that builds its observation itself from the propagated output (a Pyro model written by hand) has it
    scored as VDP++ scores a ``BayesianNetwork``'s: ``Normal(mu, sigma)`` with ``mu`` propagated moments
    :math:`(m, v)` as :math:`\mathcal N(m, v + \sigma^2)`, ``Categorical(logits=...)`` by eq. 11
    (:class:`~pyrobnn.distributions.MomentCategorical` of the softmax's moments).
    """

    handler = "vdp"

    stochastic = False

    def __init__(self, num_particles: int = 1, batch_size: int | None = None, *, warn: bool = True):
        if num_particles != 1:
            raise ValueError("vdp propagates moments deterministically: "
                             f"num_particles must be 1, got {num_particles!r}")
        super().__init__(warn=warn)

    def _pyro_sample(self, msg):
        if msg["is_observed"] and not msg["done"]:
            observation = _moment_observation(msg["fn"])
            if observation is not None:
                msg["fn"] = observation
                return
        super()._pyro_sample(msg)

    def layer(self, op, x, weight, bias=None, *rest, **kwargs):
        return affine_moments(op, x, weight, bias, *rest, **kwargs)

    def other(self, func, args, kwargs):
        return Moments.dispatch(func, args, kwargs)


def _moment_observation(fn):
    """The VDP++ observation model of a distribution whose parameter is propagated :class:`Moments` (a Normal's
    location, a Categorical's logits), else None."""
    events = 0
    while isinstance(fn, Independent):
        events, fn = events + fn.reinterpreted_batch_ndims, fn.base_dist
    if isinstance(fn, Normal) and isinstance(fn.loc, Moments):
        observation = Normal(fn.loc.loc, (fn.loc.variance + fn.scale.square()).sqrt())
    elif isinstance(fn, Categorical) and isinstance(fn.logits, Moments):
        probs = torch.softmax(fn.logits, -1)
        observation = MomentCategorical(probs.loc, probs.variance)
    else:
        return None
    return observation.to_event(events) if events else observation
