"""Guides: one posterior family per module. See :class:`~pyrobnn.guides.base.SiteGuide`."""

from .base import SiteGuide
from .normal import NormalGuide

GUIDES = {"normal": NormalGuide}
"""Guides selectable by name (``pyrobnn train --guide``)."""

__all__ = ["SiteGuide", "NormalGuide", "GUIDES"]
