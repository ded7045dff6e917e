"""``METHODS`` is a mapping of every method's name: the registered names, and any member of a family by lookup."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from pyrobnn.methods import FAMILIES, METHOD_NAMES, METHODS, SWAG, Ensemble, Variational, resolve_method
from pyrobnn.methods.registry import mixture_nodes


def test_every_family_name_is_a_key():
    assert isinstance(METHODS, Mapping)
    ensemble, ibnn, multiswag = METHODS["ensemble-3"], METHODS["ibnn-2"], METHODS["multiswag-4"]
    assert isinstance(ensemble, Ensemble) and ensemble.members == 3
    assert isinstance(ibnn, Variational) and ibnn.guide.keywords["num_components"] == 2 and ibnn.num_samples == 10
    assert isinstance(multiswag, SWAG) and multiswag.members == 4
    assert METHODS["ibnn-2"] is ibnn  # built once, then the same object
    assert METHODS["ensemble-5"] is METHODS.get("ensemble-5") is resolve_method("ensemble-5")  # the registered one
    assert METHODS["ibnn-2"].guide.keywords == mixture_nodes(2).guide.keywords
    assert resolve_method("multiswag-4") is multiswag


def test_in_agrees_with_lookup_and_iteration_lists_the_registered_names():
    for name in ("bbb", "ensemble-3", "ibnn-2", "multiswag-4", "ensemble-12"):
        assert name in METHODS and METHODS.get(name) is METHODS[name]
    for name in ("bbbb", "ensemble-0", "ensemble-", "ibnn-2-3", "Ensemble-3", 3, None, ("bbb",)):
        assert name not in METHODS and METHODS.get(name) is None
    names = list(METHODS)
    assert len(METHODS) == len(names) == len(METHOD_NAMES) and "ensemble-5" in names and "ensemble-3" not in names
    assert dict(METHODS.items()).keys() == set(names) and {name.split("-")[0] for name in names} >= set(FAMILIES)


def test_an_unknown_name_is_a_key_error_naming_the_methods():
    with pytest.raises(KeyError, match="'bbbb' is not a method; the methods are bbb, bbb-local.*ensemble-M"):
        METHODS["bbbb"]
    with pytest.raises(ValueError, match="--method ensemble-0: unknown method; choose one of bbb"):
        resolve_method("ensemble-0")
