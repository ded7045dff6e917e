"""Sharing Pyro's param store with a saved fit: which entries pyrobnn owns, and how a loaded one is adopted.

pyrobnn keeps its guides' variational parameters and its models' deterministic parameters (a network's weights
under a node prior, BatchNorm, a learned noise scale) in Pyro's param store under their names, as an autoguide
and a ``PyroModule`` do, so ``pyro.get_param_store().save(path)`` saves a whole fit. An entry is *owned* when a
pyrobnn guide or model put it there. :func:`claim` makes the store hold an object's own parameter under its name:

- an entry that nothing in pyrobnn put there (``pyro.get_param_store().load(path)``, ``pyro.param``) is
  *adopted*: its values are copied into the object's own parameter, in place, so an optimiser already built on
  that parameter keeps training it. Loading before building the guide and model or after gives the same fit;
- an entry owned by another pyrobnn object of the same name (an earlier guide, a re-run notebook cell) is
  replaced: a guide or model built again without a load starts from its own initial values;
- an entry of another shape than the parameter's is a ``ValueError`` that names it.
"""

from __future__ import annotations

import weakref

import pyro
import torch

__all__ = ["claim", "holds", "is_owned"]

_OWNED: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()
"""Every tensor a pyrobnn guide or model has put in Pyro's param store, by id."""


def is_owned(value: torch.Tensor) -> bool:
    """Whether ``value`` was put in the param store by a pyrobnn guide or model."""
    return _OWNED.get(id(value)) is value


def holds(fullname: str, own: torch.Tensor) -> bool:
    """Whether Pyro's param store already holds ``own`` under ``fullname`` (what :func:`claim` ensures): one
    dictionary lookup, for the check every training step makes (the store's ``_params``, which ``PyroModule``
    reads too; its public ``__getitem__`` also builds the constrained value)."""
    return pyro.get_param_store()._params.get(fullname) is own


def claim(fullname: str, own: torch.Tensor, owner: str) -> None:
    """Make Pyro's param store hold ``own`` (an unconstrained ``nn.Parameter``) under ``fullname``, adopting the
    values of an entry loaded there first (module docstring). ``owner`` names the object in errors."""
    if holds(fullname, own):  # every step's case
        return
    store = pyro.get_param_store()
    held = store[fullname] if fullname in store else None  # pyrobnn's parameters are unconstrained (real)
    if held is not None and not is_owned(held):
        if held.shape != own.shape:
            raise ValueError(
                f"Pyro's param store holds {fullname!r} of shape {tuple(held.shape)} (loaded from a file?), but "
                f"{owner} has it of shape {tuple(own.shape)}: load the fit of this network, or "
                "pyro.clear_param_store() first")
        with torch.no_grad():
            own.copy_(held.detach().to(own))
    if held is not None:
        del store[fullname]
    store[fullname] = own
    _OWNED[id(own)] = own
