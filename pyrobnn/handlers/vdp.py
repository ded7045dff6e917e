"""``vdp``: variance-only density propagation (VDP++, paper 002) instead of sampling."""

from __future__ import annotations

from pyro.poutine.handlers import _make_handler

from .gaussian_weights import GaussianWeightMessenger

__all__ = ["VDPMessenger", "vdp"]


class VDPMessenger(GaussianWeightMessenger):
    r"""Run the network deterministically on means and variances instead of sampled weights.

    Every Normal-family weight site becomes a :class:`~pyrobnn.gaussian_weight.GaussianWeight`
    in ``"moments"`` mode: Linear/Conv layers return :class:`~pyrobnn.moments.Moments`
    (mean and variance of each unit, no covariances) and the following operations propagate
    them by the rules of :mod:`pyrobnn.moments`, so the same network and the same diagonal
    Normal posterior used for Bayes by Backprop give the output mean and variance in one
    pass::

        with vdp():
            out = poutine.replay(model.net, trace=poutine.trace(guide).get_trace())(x)
        out.loc, out.variance

    An operation without a rule raises an error naming it.
    """

    mode = "moments"
    handler_name = "vdp"


@_make_handler(VDPMessenger)
def vdp(fn=None):  # noqa: D103 (docstring comes from the messenger)
    ...
