r"""The noise of a regression in ``pyrobnn train``, as a person reads it: :math:`y \sim \mathcal N(f(x; w),
\sigma^2)`, and what :math:`\sigma` is when the run does not say.

The rule is the method's (:func:`pyrobnn.methods.rules.regression_noise`, the same from Python): a run that sets
the noise keeps it (``--likelihood.scale S``, fixed; a ``--grid`` point's ``likelihood.scale`` or ``tau`` sets it the
same way; ``--likelihood.learn-scale``: learned from S; ``--likelihood heteroscedastic``: one per input); a run that
does not learns :math:`\sigma` from :data:`STARTING_SCALE` = 1, the spread of the standardised target, unless its
method's draws replay several networks' weights in one network (a deep ensemble, MultiSWAG, SG-MCMC), which fixes it
there and refuses ``--likelihood.learn-scale``. Here: the header's words for it (:func:`noise_summary`), what
``metrics.json`` records (:func:`noise_record`), and whether a study's cell takes the default
(:func:`default_noise_applies`).
"""

from __future__ import annotations

import dataclasses

from torch import nn

from pyrobnn.cli.options import PROTOCOL, TAU, grid_entry
from pyrobnn.methods.rules import STARTING_SCALE, regression_noise
from pyrobnn.model.likelihoods import Gaussian, HeteroscedasticGaussian

__all__ = ["STARTING_SCALE", "NOISE_GRID", "noise_options", "default_noise_applies", "noise_summary", "noise_record"]

NOISE_GRID = "likelihood.scale=0.4,0.7,1.0"
"""The ``--grid`` the messages suggest to choose a fixed noise on the training rows (``examples/table_study.py``'s)."""


def noise_options(options, method):
    """Likelihood ``options`` with the noise resolved by ``method``'s rule
    (:func:`~pyrobnn.methods.rules.regression_noise`): as given when ``--likelihood.scale`` is set; unset,
    :data:`STARTING_SCALE`, learned unless ``method``'s draws replay several networks' weights in one."""
    if options.scale is not None:
        return options
    return dataclasses.replace(options, scale=STARTING_SCALE,
                               learn_scale=_learned(regression_noise(method, None, options.learn_scale)))


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
