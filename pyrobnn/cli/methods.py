"""Methods by name: presets that bundle a prior, a guide, an estimator, a β schedule and their paper's settings.

One registry, :data:`METHODS`, read by ``pyrobnn train --method``, the studies (``--vary method=bbb,mcdropout``)
and the examples. A preset is the command-line arguments it stands for (``--prior scale-mixture --guide normal``),
placed before the user's own, so an option the user names wins; ``command`` says which command runs it
(``train``, or ``mcmc`` for NUTS on small full-batch data).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Method", "METHODS", "method_args"]


@dataclass(frozen=True)
class Method:
    """A named method: the arguments it stands for, the command that runs it, and the paper it follows."""

    args: tuple[str, ...]
    paper: str = ""
    command: str = "train"


METHODS: dict[str, Method] = {
    "bbb": Method(("--prior", "scale-mixture", "--guide", "normal", "--estimator", "sample"),
                  "Blundell et al. 2015, Weight Uncertainty in Neural Networks"),
    "bbb-local": Method(("--prior", "gaussian", "--guide", "normal", "--estimator", "local"),
                        "Kingma, Salimans & Welling 2015, local reparameterization"),
    "mcdropout": Method(("--prior", "gaussian", "--guide", "dropout", "--estimator", "local"),
                        "Gal & Ghahramani 2016, Dropout as a Bayesian Approximation"),
    "map": Method(("--prior", "gaussian", "--guide", "point"), "maximum a posteriori"),
    "vd-additive": Method(("--prior", "log-uniform", "--guide", "additive", "--estimator", "local"),
                          "Molchanov et al. 2017, Variational Dropout Sparsifies Deep Neural Networks"),
}
"""Every preset by name (the registry the CLI, the studies and the examples read)."""


def method_args(name: str) -> tuple[str, ...]:
    """The arguments method ``name`` stands for; an unknown name is a ``ValueError`` listing the known ones."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}: choose one of {', '.join(METHODS)}")
    return METHODS[name].args
