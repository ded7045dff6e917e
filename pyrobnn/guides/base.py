"""The mechanism every pyrobnn guide shares: one posterior factor per Bayesian site.

A guide is a :class:`~pyro.nn.PyroModule` built from a
:class:`~pyrobnn.BayesianNetwork`. It creates its variational parameters
eagerly (so an optimiser can be built before the first step) and, when called
with the model's arguments, samples every site from ``get_posterior(name)``:
:math:`q(w) = \\prod_s q_s(w_s)`. A new method is a subclass that defines
:meth:`setup_site` (its parameters) and :meth:`get_posterior` (its
distribution), in the spirit of Pyro's ``AutoNormalMessenger.get_posterior``.
Because the guide never runs the network, a training step costs one forward
pass (the model's), not two.
"""

from __future__ import annotations

from typing import Callable, Union

import pyro
import torch
from pyro.nn import PyroModule
from torch import nn

from ..conversion import Site

__all__ = ["SiteGuide", "InitLoc", "SHARING", "shared_shape"]

InitLoc = Union[str, Callable[[Site], torch.Tensor]]

SHARING = ("weight", "row", "layer")
"""How many values a per-weight quantity (a variance, a dropout rate) has: one per weight, one per
output unit (a row of the weight: paper 002 eq. 12, Kingma et al. 2015 sec. 3.3), or one per layer."""


def shared_shape(shape: torch.Size, share: str) -> torch.Size:
    """The shape of a quantity of a weight of ``shape`` shared as ``share`` (broadcastable to ``shape``)."""
    if share not in SHARING:
        raise ValueError(f"share must be one of {SHARING}, got {share!r}")
    if share == "weight" or len(shape) == 0:
        return torch.Size(shape)
    if share == "row":
        return torch.Size(shape[:1] + (1,) * (len(shape) - 1))
    return torch.Size(())


def _initial_loc(site: Site, init_loc: InitLoc) -> torch.Tensor:
    if callable(init_loc):
        value = torch.as_tensor(init_loc(site), dtype=site.init.dtype, device=site.init.device)
        if value.shape != site.shape:
            raise ValueError(
                f"init_loc returned shape {tuple(value.shape)} for site {site.name!r}, "
                f"expected {tuple(site.shape)}"
            )
        return value
    if init_loc == "module":
        return site.init.clone()
    if init_loc == "prior":
        return site.prior(site.init).sample()
    if init_loc == "zeros":
        return torch.zeros_like(site.init)
    raise ValueError(
        f"init_loc must be 'module' (the network's current weights), 'prior', 'zeros' or a "
        f"callable(site) -> tensor, got {init_loc!r}"
    )


class SiteGuide(PyroModule):
    """Base class of mean-field guides over the sites of a :class:`~pyrobnn.BayesianNetwork`.

    :param model: the Pyro model whose sites this guide covers.
    :param init_loc: initial posterior location: ``"module"`` (the network's
        current, e.g. pretrained, weights), ``"prior"`` (a prior draw),
        ``"zeros"``, or a callable ``site -> tensor``.
    """

    def __init__(self, model, init_loc: InitLoc = "module"):
        super().__init__()
        sites = model.sites()
        self.site_names: list[str] = [site.name for site in sites]
        self._keys = {site.name: site.name.replace(".", "__") for site in sites}
        for site in sites:
            self.setup_site(site, _initial_loc(site, init_loc))

    # -- what a method defines ------------------------------------------------------
    def setup_site(self, site: Site, loc: torch.Tensor) -> None:
        """Create the variational parameters of ``site`` with :meth:`add_param`."""
        raise TypeError(f"{type(self).__name__} must override setup_site()")

    def get_posterior(self, name: str) -> pyro.distributions.TorchDistribution:
        """The posterior factor :math:`q(w_{name})`, event shape = the parameter's shape."""
        raise TypeError(f"{type(self).__name__} must override get_posterior()")

    def loc_scale(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior mean and standard deviation of site ``name`` (Normal-family guides)."""
        raise TypeError(f"{type(self).__name__} has no Normal-family posterior (no loc_scale())")

    def log_alpha(self, name: str) -> torch.Tensor:
        r""":math:`\log\alpha = \log(\sigma^2/\mu^2)`, the dropout-rate parameter of each weight."""
        loc, scale = self.loc_scale(name)
        return 2 * (scale.log() - loc.abs().log())

    pruning_rule: str = "snr"
    """The principled pruning rule of this posterior family (a key of :data:`pyrobnn.prune.METHODS`)."""

    pruned: dict[str, float] = {}
    """What :meth:`prune_` writes into each variational parameter (by role) where a weight is removed:
    a point mass at zero (mean 0, vanishing variance)."""

    @torch.no_grad()
    def prune_(self, name: str, keep: torch.Tensor) -> None:
        """Remove the weights of site ``name`` where ``keep`` is False (in place)."""
        expected = self.get_posterior(name).event_shape
        if keep.shape != expected:
            raise ValueError(f"mask for {name!r} has shape {tuple(keep.shape)}, expected {tuple(expected)}")
        for role, value in self.pruned.items():
            param = self.param(name, role)
            if param.shape == keep.shape:  # a shared (per-row/layer) parameter serves kept weights too
                param.masked_fill_(~keep.to(param.device), value)

    def median(self) -> dict[str, torch.Tensor]:
        """A point value per site (the posterior median), for deterministic prediction."""
        return {name: self.get_posterior(name).mean.detach() for name in self.site_names}

    # -- shared mechanism -----------------------------------------------------------
    def add_param(self, site: Site | str, role: str, value: torch.Tensor) -> None:
        name = site.name if isinstance(site, Site) else site
        setattr(self, f"{self._keys[name]}_{role}", nn.Parameter(value.detach().clone()))

    def param(self, name: str, role: str) -> torch.Tensor:
        return getattr(self, f"{self._keys[name]}_{role}")

    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        return {name: pyro.sample(name, self.get_posterior(name)) for name in self.site_names}
