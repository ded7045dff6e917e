"""Guides: one posterior family per module. See :class:`~pyrobnn.guides.base.SiteGuide`."""

from .additive_dropout import AdditiveDropoutGuide
from .base import SiteGuide
from .dropout import DropoutGuide
from .mixture_node import FlatThenLinear, MixtureNodeGuide, TwoGroupSGD
from .multiplicative_dropout import MultiplicativeDropoutGuide
from .normal import NormalGuide
from .point import PointGuide

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
           "PointGuide", "MixtureNodeGuide", "TwoGroupSGD", "FlatThenLinear", "GUIDES"]
