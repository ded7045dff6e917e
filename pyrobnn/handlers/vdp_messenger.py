"""``vdp``: variance-only density propagation (VDP++, Dera et al.) instead of sampling."""

from __future__ import annotations

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
    """

    stochastic = False

    def __init__(self, num_particles: int = 1, batch_size: int | None = None):
        if num_particles != 1:
            raise ValueError("vdp propagates moments deterministically: "
                             f"num_particles must be 1, got {num_particles!r}")
        super().__init__()

    def layer(self, op, x, weight, bias=None, *rest, **kwargs):
        return affine_moments(op, x, weight, bias, *rest, **kwargs)

    def other(self, func, args, kwargs):
        return Moments.dispatch(func, args, kwargs)
