"""Guides: one posterior family per module. See :class:`~pyrobnn.guides.base.SiteGuide`."""

from pyrobnn.guides.additive_dropout import AdditiveDropoutGuide
from pyrobnn.guides.base import SiteGuide
from pyrobnn.guides.dropout import DropoutGuide
from pyrobnn.guides.empirical import PosteriorDraws
from pyrobnn.guides.mixture_node import MixtureNodeGuide
from pyrobnn.guides.multiplicative_dropout import MultiplicativeDropoutGuide
from pyrobnn.guides.normal import NormalGuide
from pyrobnn.guides.point import PointGuide

GUIDES = {
    "normal": NormalGuide,
    "additive": AdditiveDropoutGuide,
    "multiplicative": MultiplicativeDropoutGuide,
    "dropout": DropoutGuide,
    "point": PointGuide,
    "mixture-node": MixtureNodeGuide,
}
"""Guides selectable by name (``pyrobnn train --guide``); ``normal`` also takes
``--parameterization log_variance`` (variational dense)."""

__all__ = ["SiteGuide", "NormalGuide", "AdditiveDropoutGuide", "MultiplicativeDropoutGuide", "DropoutGuide",
           "PointGuide", "MixtureNodeGuide", "PosteriorDraws",
           "GUIDES"]
