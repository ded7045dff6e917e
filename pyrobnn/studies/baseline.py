"""A study's baseline: the label every other label is compared with, or the values of some of its axes, matched
within each combination of the others.

In a study of ``dataset`` x ``method``, ``baseline = "method=mcdropout"`` compares each label with the label that
has ``method=mcdropout`` and its own values on every other axis: ``dataset=uci-concrete method=bbb`` with
``dataset=uci-concrete method=mcdropout``, never with another data set. A full label
(``"dataset=uci-boston method=mcdropout"``, or its ``name=value`` pairs in any order) is one baseline for every
label. For a label :math:`\\ell` with axis values :math:`a(\\ell)` and a baseline fixing the values :math:`b` of the
named axes, the label it is compared with is the one whose axes are :math:`a(\\ell)` updated by :math:`b`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

__all__ = ["Baseline", "resolve_baseline"]


@dataclass(frozen=True)
class Baseline:
    """A resolved baseline.

    :param text: the baseline as given (a label, or ``name=value`` pairs separated by spaces).
    :param axes: the axis values it fixes (those of its label for a full label).
    :param within: the axes it is matched within, in the study's order (empty: one baseline for every label).
    :param of: each label -> the label it is compared with (itself for a baseline; None where that label is not in
        the study, e.g. its cells have not run).
    """

    text: str
    axes: dict[str, str]
    within: tuple[str, ...]
    of: dict[str, Optional[str]]


def _axis_values(labels: Mapping[str, Mapping[str, str]]) -> dict[str, list[str]]:
    """``{axis: its values, in order of appearance}`` over the labels' axes."""
    values: dict[str, list[str]] = {}
    for axes in labels.values():
        for name, value in axes.items():
            values.setdefault(name, [])
            if value not in values[name]:
                values[name].append(value)
    return values


def _error(text: str, reason: str, labels: Mapping[str, Mapping[str, str]]) -> ValueError:
    values = _axis_values(labels)
    fix = "give one of its labels: " + ", ".join(repr(label) for label in labels)
    if values:
        name, first = list(values.items())[-1][0], list(values.values())[-1][0]
        fix += (", or NAME=VALUE of some axes, each label then compared with the one of the same other axes "
                f"(e.g. --baseline {name}={first}); its axes are "
                + "; ".join(f"{axis}: {', '.join(found)}" for axis, found in values.items()))
    return ValueError(f"--baseline {text!r} {reason}; {fix}")


def _pairs(text: str, labels: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """``"method=mcdropout hidden=800 800"`` -> ``{"method": "mcdropout", "hidden": "800 800"}``: a word with ``=``
    starts an axis's value, a word without one continues it (values with spaces); each checked against the axes."""
    values = _axis_values(labels)
    pairs: dict[str, str] = {}
    last = None
    for word in text.split():
        name, equals, value = word.partition("=")
        if not equals:
            if last is None:
                raise _error(text, "is not a label of the study, nor NAME=VALUE of its axes", labels)
            pairs[last] += " " + word
            continue
        if name not in values:
            raise _error(text, f"names {name!r}, not an axis of the study", labels)
        if name in pairs:
            raise _error(text, f"gives axis {name!r} twice", labels)
        pairs[name], last = value, name
    if not pairs:
        raise _error(text, "is empty", labels)
    for name, value in pairs.items():
        if value not in values[name]:
            raise _error(text, f"gives {name}={value}, not a value of axis {name!r}", labels)
    return pairs


def resolve_baseline(text: str, labels: Mapping[str, Mapping[str, str]]) -> Baseline:
    """The :class:`Baseline` of ``text`` in a study whose labels are ``labels`` (``{label: {axis: value}}``, in the
    study's order): a label is one baseline for all; ``name=value`` pairs of some axes are matched within the
    others.

    :raises ValueError: ``text`` names no label, an unknown axis or value, or values no label has together; the
        message names ``--baseline`` and lists the labels and the axes.
    """
    if not isinstance(text, str):
        raise ValueError(f"--baseline must be a label or NAME=VALUE of some axes, got {text!r}")
    if text in labels:
        return Baseline(text, dict(labels[text]), (), {label: text for label in labels})
    pairs = _pairs(text, labels)
    by_axes = {frozenset(axes.items()): label for label, axes in labels.items()}
    of = {label: by_axes.get(frozenset({**axes, **pairs}.items())) for label, axes in labels.items()}
    if not any(of[label] == label for label in labels):
        raise _error(text, "matches no label (no label has these values together)", labels)
    within = tuple(name for name in _axis_values(labels) if name not in pairs)
    return Baseline(text, pairs, within, of)
