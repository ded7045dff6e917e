"""Argument checks shared across pyrobnn: a bad value gets an error that names the argument.

Scalar checks take ``(name, value, ...)`` and return the value converted (``float`` or ``int``), so
``self.scale = positive("scale (noise standard deviation)", scale)`` validates and stores in one
line. ``name`` is the argument as the caller knows it, with what it means where the bare name would
not say: the message reads ``"<name> must be <requirement>, got <value>"``. Booleans are refused
wherever a number is expected (``True`` is an ``int`` to Python).

Tensor checks take ``(tensor, ..., what=...)`` and return nothing; ``what`` names the tensor in
the message.
"""

from __future__ import annotations

import math
import numbers
import re
import warnings
from typing import Callable, Iterable, Sequence

import torch

__all__ = [
    "finite", "positive", "nonnegative", "in_range", "positive_int", "nonnegative_int", "choice",
    "multiples_near", "check_probs", "check_labels", "one_line", "deprecated", "renamed_keywords", "REMOVED_IN",
]

REMOVED_IN = "0.2"
"""The release that removes the names deprecated in this one: a renamed public name keeps working, with a
``DeprecationWarning`` naming its successor, for one release."""


def deprecated(old: str, new: str, stacklevel: int = 3) -> None:
    """A ``DeprecationWarning`` that ``old`` (a renamed public name, as the user wrote it) is now ``new``, pointed at
    the caller's caller (``stacklevel``): the old name still works until :data:`REMOVED_IN`."""
    warnings.warn(f"{old} is deprecated: use {new} ({old} is removed in pyrobnn {REMOVED_IN})", DeprecationWarning,
                  stacklevel=stacklevel)


def renamed_keywords(function: str, given: dict, renamed: dict[str, str], stacklevel: int = 5) -> None:
    """Keyword arguments ``given`` to ``function`` beyond its own: each a key of ``renamed`` (old keyword -> what
    replaced it) warns by :func:`deprecated` (``stacklevel`` 5: at the caller of ``function`` when ``function``
    calls this through one helper); any other is the ``TypeError`` Python gives an unknown keyword."""
    for name in given:
        if name not in renamed:
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")
    for name in given:
        deprecated(f"{function}({name}=...)", renamed[name], stacklevel=stacklevel)


def _number(name: str, value, requirement: str, ok: Callable = lambda v: True, integer: bool = False):
    """``value`` as an ``int`` (``integer``) or a finite ``float``, if it is one and ``ok(value)``."""
    kind = numbers.Integral if integer else numbers.Real
    if (isinstance(value, bool) or not isinstance(value, kind)
            or not (integer or math.isfinite(value)) or not ok(value)):
        raise ValueError(f"{name} must be {requirement}, got {value!r}")
    return int(value) if integer else float(value)


def finite(name: str, value, unit: str = "") -> float:
    """``value`` as a float if it is a finite number; ``unit`` (e.g. ``"dB"``) is named in the message."""
    return _number(name, value, "a finite number" + (f" ({unit})" if unit else ""))


def positive(name: str, value) -> float:
    """``value`` as a float if it is a finite number > 0."""
    return _number(name, value, "a finite number > 0", lambda v: v > 0)


def nonnegative(name: str, value) -> float:
    """``value`` as a float if it is a finite number >= 0."""
    return _number(name, value, "a finite number >= 0", lambda v: v >= 0)


def in_range(name: str, value, low: float, high: float, ends: str = "[]") -> float:
    """``value`` as a float if it lies between ``low`` and ``high``; ``ends`` says which ends belong to
    the interval: ``"[]"`` both, ``"()"`` neither, ``"[)"`` or ``"(]"`` one. A probability strictly
    between 0 and 1 is ``in_range(name, p, 0, 1, "()")``."""
    if ends not in ("[]", "()", "[)", "(]"):
        raise ValueError(f"ends must be '[]', '()', '[)' or '(]', got {ends!r}")

    def inside(v):
        return (low <= v if ends[0] == "[" else low < v) and (v <= high if ends[1] == "]" else v < high)

    return _number(name, value, f"a number in {ends[0]}{low}, {high}{ends[1]}", inside)


def positive_int(name: str, value) -> int:
    """``value`` as an ``int`` if it is an integer >= 1."""
    return _number(name, value, "a positive integer", lambda v: v >= 1, integer=True)


def nonnegative_int(name: str, value) -> int:
    """``value`` as an ``int`` if it is an integer >= 0."""
    return _number(name, value, "an integer >= 0", lambda v: v >= 0, integer=True)


def multiples_near(value: int, k: int) -> str:
    """The multiples of ``k`` either side of ``value``, for an error message: ``"8 or 12"`` for 10 and 4, ``"4"`` for
    2 and 4 (no positive multiple below)."""
    below = value - value % k
    return f"{below} or {below + k}" if below else str(k)


def choice(name: str, value, options: Iterable):
    """``value`` if it is one of ``options`` (a registry dict's keys, a tuple of names); the message
    lists them."""
    options = tuple(options)
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, options))}; got {value!r}")
    return value


def check_probs(probs, dims: Sequence[str] = ("N", "C"), what: str = "probs") -> None:
    """Raise unless ``probs`` is a non-empty floating-point tensor with one dimension per name in
    ``dims`` (``("S", "N", "C")`` for sampled probabilities), holding probabilities over its last
    dimension: non-negative, finite, summing to 1. One host synchronisation; catches logits passed
    by mistake."""
    shape = f"({', '.join(dims)})"
    if not isinstance(probs, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor of shape {shape}, got {type(probs).__name__}")
    if probs.dim() != len(dims):
        raise ValueError(f"{what} must have shape {shape}, got {tuple(probs.shape)}")
    if not probs.dtype.is_floating_point:
        raise ValueError(f"{what} must be floating-point probabilities, got dtype {probs.dtype}")
    if probs.numel() == 0:
        raise ValueError(f"{what} must not be empty, got shape {tuple(probs.shape)}")
    tol = max(1e-3, 10 * torch.finfo(probs.dtype).eps)
    bad = (probs < 0).any() | ((probs.sum(-1) - 1).abs() > tol).any() | ~torch.isfinite(probs).all()
    if bool(bad):
        raise ValueError(
            f"{what} must hold probabilities: non-negative, finite, summing to 1 over the last "
            "dimension (did you pass logits? apply softmax first)"
        )


def check_labels(y, num_classes: int | None, what: str = "labels", *,
                 num_examples: int | None = None) -> None:
    """Raise unless ``y`` is a 1-d tensor of integer class indices in ``[0, num_classes)``.

    :param num_classes: the number of classes (the network's outputs); ``None`` skips the range check.
    :param what: how the message names ``y`` (``"y"``, ``"training data: labels"``).
    :param num_examples: if given, ``y`` must have shape ``(num_examples,)``.

    The range check costs one host synchronisation.
    """
    if num_classes is not None:
        positive_int("num_classes", num_classes)
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor of integer class indices, got {type(y).__name__}")
    if num_examples is not None and tuple(y.shape) != (num_examples,):
        raise ValueError(
            f"{what} must have shape ({num_examples},), one label per example, got {tuple(y.shape)}"
        )
    if y.dim() != 1:
        raise ValueError(f"{what} must be a 1-d tensor, one label per example, got shape {tuple(y.shape)}")
    if y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool:
        raise ValueError(f"{what} must hold integer class indices (e.g. torch.long), got dtype {y.dtype}")
    if num_classes is None or y.numel() == 0:
        return
    low, high = torch.stack(torch.aminmax(y)).tolist()
    if low < 0 or high >= num_classes:
        raise ValueError(
            f"{what}: label {low if low < 0 else high} is out of range for {num_classes} classes "
            f"(labels must lie in [0, {num_classes - 1}])"
        )


def one_line(text, limit: int | None = None) -> str:
    """A message on one line: no colour codes, no shapes table (which Pyro appends to errors raised at a site),
    white space folded, cut to ``limit`` characters when given."""
    text = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(text).split("Trace Shapes:")[0]).split())
    return text if limit is None or len(text) <= limit else text[:limit - 3] + "..."
