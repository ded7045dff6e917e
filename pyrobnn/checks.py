"""Argument checks shared across pyrobnn: a bad value gets a ``ValueError`` that names the argument."""

from __future__ import annotations

import math

__all__ = ["finite", "positive_int"]


def finite(name: str, value, unit: str = "") -> float:
    """``value`` as a float, or a ``ValueError`` naming the argument when it is not a finite number
    (booleans are refused too); ``unit`` (e.g. ``"dB"``) is named in the message."""
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number{f' ({unit})' if unit else ''}, got {value!r}")
    return float(value)


def positive_int(name: str, value) -> int:
    """``value``, or a ``ValueError`` naming the argument when it is not an integer >= 1 (booleans refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value
