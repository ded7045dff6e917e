"""Guides: one posterior family per module. See :class:`~pyrobnn.guides.base.SiteGuide`."""

from .additive_dropout import AdditiveDropoutGuide
from .base import SiteGuide
from .multiplicative_dropout import MultiplicativeDropoutGuide
from .normal import NormalGuide

GUIDES = {
    "normal": NormalGuide,
    "additive": AdditiveDropoutGuide,
    "multiplicative": MultiplicativeDropoutGuide,
}
"""Guides selectable by name (``pyrobnn train --guide``); ``normal`` also takes
``--parameterization log_variance`` (variational dense)."""

__all__ = ["SiteGuide", "NormalGuide", "AdditiveDropoutGuide", "MultiplicativeDropoutGuide", "GUIDES"]
