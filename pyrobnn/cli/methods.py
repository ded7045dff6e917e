"""Methods by name: presets that bundle a prior, a guide, an estimator, a β schedule and their paper's settings.

One registry, :data:`METHODS`, read by ``pyrobnn train --method``, the studies (``--vary method=bbb,mcdropout``)
and the examples. A preset is a set of overrides of :class:`~pyrobnn.cli.options.RunConfig` fields, addressed by
their dotted path (``"guide.name"``, ``"optim.estimator"``, ``"optim.beta.name"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Method", "METHODS", "method_overrides"]


@dataclass(frozen=True)
class Method:
    """A named method: ``overrides`` of the run configuration (dotted field paths), and the paper it follows."""

    overrides: dict[str, Any] = field(default_factory=dict)
    paper: str = ""


METHODS: dict[str, Method] = {
    "bbb": Method({"prior.name": "scale-mixture", "guide.name": "normal", "optim.estimator": "sample"},
                  "Blundell et al. 2015, Weight Uncertainty in Neural Networks"),
    "bbb-local": Method({"prior.name": "gaussian", "guide.name": "normal", "optim.estimator": "local"},
                        "Kingma, Salimans & Welling 2015, local reparameterization"),
    "mcdropout": Method({"prior.name": "gaussian", "guide.name": "dropout", "optim.estimator": "local"},
                        "Gal & Ghahramani 2016, Dropout as a Bayesian Approximation"),
    "map": Method({"prior.name": "gaussian", "guide.name": "point"}, "maximum a posteriori"),
    "vd-additive": Method({"prior.name": "log-uniform", "guide.name": "additive", "optim.estimator": "local"},
                          "Molchanov et al. 2017, Variational Dropout Sparsifies Deep Neural Networks"),
}
"""Every preset by name (the registry the CLI, the studies and the examples read)."""


def method_overrides(name: str) -> dict[str, Any]:
    """The overrides of method ``name``; an unknown name is a ``ValueError`` listing the known ones."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}: choose one of {', '.join(METHODS)}")
    return dict(METHODS[name].overrides)
