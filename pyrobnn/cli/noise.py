r"""The noise of a regression in ``pyrobnn train``: :math:`y \sim \mathcal N(f(x; w), \sigma^2)`, and what
:math:`\sigma` is when the run does not say.

A run that sets the noise keeps it: ``--likelihood.scale S`` (fixed; a ``--grid`` point's ``likelihood.scale`` or
``tau`` sets it the same way), ``--likelihood.learn-scale`` (learned from S), ``--likelihood heteroscedastic`` (one
per input). A run that does not learns :math:`\sigma` as a point estimate with the network, through
:math:`\log\sigma` (:class:`~pyrobnn.model.likelihoods.Gaussian` with ``learn_scale``), from
:data:`STARTING_SCALE` = 1: the spread of the standardised target, the noise of a network that explains nothing.
It starts above any noise the data can show, so the run is never overconfident by its noise while it learns, and it
falls to what the residuals show as the network fits them (the point estimate of :math:`\sigma` that maximises the
run's objective, as a deep ensemble's member learns its noise, Lakshminarayanan et al. 2017).

A learned noise is one scale of one network. A posterior that replays the draws of several networks' weights in
one network (:attr:`~pyrobnn.methods.Method.replays_weights`: a deep ensemble, MultiSWAG, SG-MCMC draws) would
predict every draw with the first network's noise, so ``--likelihood.learn-scale`` is refused for it before anything
is loaded; left unset, its noise is fixed at :data:`STARTING_SCALE` (:func:`noise_options`) and the run's header
says so, with the way to choose it on the training rows (``--grid likelihood.scale=...``).
"""

from __future__ import annotations

import dataclasses

from torch import nn

from pyrobnn.cli.options import PROTOCOL, TAU, grid_entry
from pyrobnn.model.likelihoods import Gaussian, HeteroscedasticGaussian

__all__ = ["STARTING_SCALE", "NOISE_GRID", "noise_options", "default_noise_applies",
           "check_noise", "noise_summary", "noise_record"]

STARTING_SCALE = 1.0
"""The noise standard deviation of a regression that does not set it, in the units of the standardised target (its
own spread): learned from there, or held there by a posterior that cannot learn it."""

NOISE_GRID = "likelihood.scale=0.4,0.7,1.0"
"""The ``--grid`` the messages suggest to choose a fixed noise on the training rows (``examples/table_study.py``'s)."""


def noise_options(options, method):
    """Likelihood ``options`` with the noise resolved: as given when ``--likelihood.scale`` is set; unset,
    :data:`STARTING_SCALE`, learned unless ``method``'s draws replay several networks' weights in one
    (:attr:`~pyrobnn.methods.Method.replays_weights`)."""
    if options.scale is not None:
        return options
    learn = options.learn_scale or not method.replays_weights
    return dataclasses.replace(options, scale=STARTING_SCALE, learn_scale=learn)


def default_noise_applies(cfg, task: str) -> bool:
    """Whether a ``pyrobnn train`` run on a data set of ``task`` takes the default noise of :func:`noise_options`:
    a Gaussian regression (``--likelihood gaussian``, or ``auto`` for a regression) whose noise neither
    ``--likelihood.scale`` nor its ``--grid`` sets (``likelihood.scale``, ``tau``, or ``protocol``'s noise precisions,
    which a run that learns its noise leaves out)."""
    options = cfg.likelihood
    gaussian = options.name == "gaussian" or (options.name == "auto" and task == "regression")
    if options.scale is not None or not gaussian:
        return False
    for spec in cfg.optim.grid:
        entry = grid_entry(spec)
        if entry is not None and entry[0] in (TAU, "likelihood.scale"):
            return False
        if spec.strip() == PROTOCOL and not options.learn_scale:
            return False
    return True


def _label(cfg, method) -> str:
    return f"--method {cfg.method}" if cfg.method else type(method).__name__


def check_noise(cfg, method) -> None:
    """Before anything is loaded: ``--likelihood.learn-scale`` for a ``method`` whose draws replay several networks'
    weights in one network is a ``ValueError`` naming the fix."""
    why = method.replays_weights
    if cfg.likelihood.learn_scale and why:
        raise ValueError(f"--likelihood.learn-scale: {_label(cfg, method)}: {why}, so a noise each one learned "
                         f"would be lost (every draw would be predicted with the first one's); fix the noise with "
                         f"--likelihood.scale S, or choose it on the training rows with --grid {NOISE_GRID}")


def _learned(likelihood: Gaussian) -> bool:
    return isinstance(likelihood.log_scale, nn.Parameter)


def noise_summary(cfg, model, method) -> str:
    """The run header's words for the noise (``""`` for a classifier): fixed or learned, from what, and why a
    default is what it is."""
    likelihood = model.likelihood
    if isinstance(likelihood, HeteroscedasticGaussian):
        return "noise learned per input"
    if not isinstance(likelihood, Gaussian):
        return ""
    scale, options = f"{float(likelihood.scale.detach()):.4g}", cfg.likelihood
    if options.scale is not None:
        return f"noise learned from {scale}" if _learned(likelihood) else f"noise {scale} (fixed)"
    if options.learn_scale:
        return f"noise learned from {scale} (the standardised target's spread)"
    if _learned(likelihood):
        return f"noise learned from {scale} (the standardised target's spread; --likelihood.scale S fixes it)"
    return (f"noise {scale} (the standardised target's spread, fixed: {_label(cfg, method)}: "
            f"{method.replays_weights}; choose it with --grid {NOISE_GRID})")


def noise_record(cfg, model, data) -> dict | None:
    """What ``metrics.json`` records of the noise after training (None for a classifier or a heteroscedastic one):
    ``scale`` (in the standardised target's units), ``scale_in_target_units`` (times the target's standard
    deviation, when it was standardised), ``learned`` and ``default`` (whether the run left it unset)."""
    likelihood = model.likelihood
    if not isinstance(likelihood, Gaussian):
        return None
    scale = float(likelihood.scale.detach())
    record = {"scale": scale, "learned": _learned(likelihood), "default": cfg.likelihood.scale is None}
    if data.y_std is not None and data.y_std.numel() == 1:
        record["scale_in_target_units"] = scale * float(data.y_std)
    return record
