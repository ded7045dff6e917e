"""The mechanism every pyrobnn guide shares: one posterior factor per Bayesian site.

A guide is a :class:`~pyro.nn.PyroModule` built from a
:class:`~pyrobnn.BayesianNetwork`. It creates its variational parameters
eagerly (so an optimiser can be built before the first step) and, when called
with the model's arguments, samples every site from ``get_posterior(name, prior)``:
:math:`q(w) = \\prod_s q_s(w_s)`. A new method is a subclass that defines
:meth:`~SiteGuide.setup_site` (its parameters) and :meth:`~SiteGuide.get_posterior` (its
distribution), as Pyro's ``AutoNormalMessenger.get_posterior``.
Because the guide never runs the network, a training step costs one forward
pass (the model's), not two.

Parameters live in Pyro's param store, as an autoguide's do: they are
:class:`~pyro.nn.PyroParam` s in one container per role, named
``<guide name>.<role>.<site>`` (e.g. ``NormalGuide.locs.net.0.weight``), so SVI
with ``pyro.optim``, ``pyro.get_param_store().save/load`` and ``clear`` work as for
an autoguide. A saved fit is restored whether ``pyro.get_param_store().load(path)``
comes before or after the guide is built: values loaded into the store are adopted
in place (:mod:`pyrobnn.model.param_store`), while a second guide built without a
load (a second model, a re-run notebook cell) trains from its own initial values.
Two guides used side by side take different ``name=`` s (or
``pyro.settings.set(module_local_params=True)``).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from abc import ABCMeta, abstractmethod
from typing import Callable, Iterator, Union

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.nn import PyroModule, PyroParam
from torch.distributions.transforms import identity_transform

from pyrobnn._compat import pyro_name
from pyrobnn.distributions import PushedNormal, support_transform
from pyrobnn.model.param_store import claim
from pyrobnn.model.protocol import Site, network_model

__all__ = ["SiteGuide", "InitLoc", "SHARING", "shared_shape", "direct_parameters"]


class _FlatView(torch.autograd.Function):
    """The parameters of one role of a guide, which are views of one flat storage, as that flat tensor: one
    differentiable tensor over every site, whose gradient reaches each site's parameter as a slice (no copy)."""

    @staticmethod
    def forward(ctx, flat, *params):
        ctx.shapes = [p.shape for p in params]
        return flat.detach()

    @staticmethod
    def backward(ctx, grad):
        pieces = grad.split([shape.numel() for shape in ctx.shapes])
        return (None, *(g if g.shape == s else g.view(s) for g, s in zip(pieces, ctx.shapes)))


def _aliases(flat: torch.Tensor, params: list[torch.Tensor]) -> bool:
    """Whether ``params`` are, in order, contiguous consecutive slices of the storage of ``flat``."""
    start, itemsize, offset = flat.data_ptr(), flat.element_size(), 0
    for p in params:
        if p.device != flat.device or p.dtype != flat.dtype or not p.is_contiguous() \
                or p.data_ptr() != start + offset * itemsize:
            return False
        offset += p.numel()
    return offset == flat.numel()

InitLoc = Union[str, Callable[[Site], torch.Tensor]]

_DIRECT = contextvars.ContextVar("pyrobnn_direct_parameters", default=False)


@contextlib.contextmanager
def direct_parameters() -> Iterator[None]:
    """Within this context a :class:`SiteGuide` reads its variational parameters as the ``nn.Parameter`` s
    themselves, without the ``pyro.param`` message a ``PyroModule`` attribute emits.

    Those messages are how ``pyro.infer.SVI`` finds the parameters to hand to ``pyro.optim``; a loop that holds
    its own ``torch.optim`` optimiser over ``guide.parameters()`` (:func:`~pyrobnn.infer.svi.svi_step`) does
    not need them, and they are a large part of a small network's step (a message through every handler on
    Pyro's stack, and ``PyroModule``'s bookkeeping, per parameter per step). The values are the same tensors
    (every parameter of a pyrobnn guide is unconstrained), the param store still holds them
    (:meth:`SiteGuide._claim` runs on every call), and a guide used anywhere else emits its messages as before."""
    token = _DIRECT.set(True)
    try:
        yield
    finally:
        _DIRECT.reset(token)

SHARING = ("weight", "row", "layer")
"""How many values a per-weight quantity (a variance, a dropout rate) has: one per weight, one per
output unit (a row of the weight: VDP++ eq. 12, Kingma et al. 2015 sec. 3.3), or one per layer."""


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


class _GuideMeta(type(PyroModule), ABCMeta):
    """PyroModule's metaclass with ABC's: a :class:`SiteGuide` is a Pyro module whose family methods are abstract."""


class SiteGuide(PyroModule, metaclass=_GuideMeta):
    """Base class of mean-field guides over the latent sites of a model of a network
    (:class:`~pyrobnn.model.protocol.NetworkModel`).

    The posterior family (:meth:`setup_site`, :meth:`get_posterior`) covers the sites it models
    (:meth:`covers`: the real-valued parameters of modules, a network's weights); every other latent site (a noise
    scale, any constrained latent) gets a mean-field Normal in the unconstrained space, pushed through Pyro's
    ``biject_to(support)`` (:meth:`setup_fallback`, :meth:`fallback_posterior`), as ``AutoNormal`` gives every
    site. A discrete latent, or one sampled inside a plate (one value per example), is refused, naming the site.

    A :class:`~pyrobnn.BayesianNetwork` lists its sites, so the guide makes its parameters when it is built; a Pyro
    model written by hand is read by running it (:class:`~pyrobnn.model.protocol.TracedModel`), on the guide's first
    call with the model's arguments, as Pyro's autoguides do (``fit`` makes that call before it builds the
    optimiser).

    :param model: the Pyro model whose latent sites this guide covers.
    :param init_loc: initial posterior location: ``"module"`` (the network's
        current, e.g. pretrained, weights; for a site of a traced model, the value it took when traced, a draw
        of its prior), ``"prior"`` (a prior draw), ``"zeros"``, or a callable ``site -> tensor``.
    :param name: prefix of the parameters' names in Pyro's param store (default: the class name).
    """

    shared_storage: bool = True
    """Whether :meth:`flat` packs a role's parameters into one storage (else it concatenates them, a copy per
    call: :func:`~pyrobnn.infer.replicas.fit_replicas` trains stacked parameters that are no views of it)."""

    fallback_init_scale: float = 0.1
    """The initial standard deviation of the unconstrained Normal of the sites the family does not cover
    (``AutoNormal``'s ``init_scale``)."""

    def __init__(self, model, init_loc: InitLoc = "module", *, name: str | None = None):
        super().__init__(type(self).__name__ if name is None else name)
        self.__dict__["_network"] = network_model(model)  # not a child module: the model's sites keep their names
        self.init_loc = init_loc
        self.site_names: list[str] = []
        self.family_names: list[str] = []
        self._family: set[str] = set()
        self._params: list[tuple[str, str, str]] = []
        if getattr(self._network, "traced", True):
            self._setup()

    @property
    def ready(self) -> bool:
        """Whether the guide knows its sites (and has made its parameters)."""
        return self.__dict__.get("_ready", False)

    def _setup(self) -> None:
        sites = self._network.sites()  # none for BayesianNetwork(deterministic=True): maximum likelihood
        for site in sites:
            _check_coverable(site, type(self).__name__)
        self.site_names = [site.name for site in sites]
        self.family_names = [site.name for site in sites if self.covers(site)]
        self._family = set(self.family_names)
        self._priors = {site.name: site.prior_distribution for site in sites}
        for site in sites:
            loc = _initial_loc(site, self.init_loc)
            if site.name in self._family:
                self.setup_site(site, loc)
            else:
                self.setup_fallback(site, loc)
        # (param-store name, role, site) of every variational parameter
        self._params = [(f"{pyro_name(self)}.{role}.{site}", role, site)
                        for role, container in self.named_children()
                        for site in (key[: -len("_unconstrained")] for key, _ in container.named_parameters())]
        self._claim()
        self.__dict__["_ready"] = True
        self.sites_ready()

    def sites_ready(self) -> None:
        """Called once the sites are known and their parameters made (a family may check its options against
        the site names)."""

    def covers(self, site: Site) -> bool:
        """Whether the family models ``site`` (default: a real-valued parameter of a module,
        :attr:`~pyrobnn.model.protocol.Site.is_parameter`); the other sites get :meth:`fallback_posterior`."""
        return site.is_parameter

    # -- what a family defines (the contract: both abstract) ------------------------
    @abstractmethod
    def setup_site(self, site: Site, loc: torch.Tensor) -> None:
        """Create the variational parameters of ``site`` with :meth:`add_param`."""

    @abstractmethod
    def get_posterior(self, name: str,
                      prior: pyro.distributions.TorchDistribution) -> pyro.distributions.TorchDistribution:
        """The posterior factor :math:`q(w_{name})` (event shape = the parameter's shape), given the site's prior."""

    def loc_scale(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior mean and standard deviation of site ``name`` (Normal-family guides)."""
        raise TypeError(f"{type(self).__name__} has no Normal-family posterior (no loc_scale())")

    def log_alpha(self, name: str) -> torch.Tensor:
        r""":math:`\log\alpha = \log(\sigma^2/\mu^2)`, the dropout-rate parameter of each weight."""
        loc, scale = self.loc_scale(name)
        return 2 * (scale.log() - loc.abs().log())

    num_components: int = 1
    """K: row r of a batch under an estimator handler uses mixture component r mod K
    (:func:`~pyrobnn.handlers.node_draws.row_components`); 1 for every family but the mixture node guide."""

    pruning_rule: str = "snr"
    """The principled pruning rule of this posterior family (a key of :data:`pyrobnn.analysis.prune.METHODS`)."""

    pruned_values: dict[str, float] = {}
    """What :meth:`prune_` writes into each variational parameter (by role) where a weight is removed:
    a point mass at zero (mean 0, vanishing variance)."""

    @torch.no_grad()
    def prune_(self, name: str, keep: torch.Tensor) -> None:
        """Remove the weights of site ``name`` where ``keep`` is False (in place)."""
        expected = self.posterior(name).event_shape
        if keep.shape != expected:
            raise ValueError(f"mask for {name!r} has shape {tuple(keep.shape)}, expected {tuple(expected)}")
        for role, value in self.pruned_values.items():
            param = self.param(name, role)
            if param.shape == keep.shape:  # a shared (per-row/layer) parameter serves kept weights too
                param.masked_fill_(~keep.to(param.device), value)

    def setup_fallback(self, site: Site, loc: torch.Tensor) -> None:
        r"""The parameters of a site the family does not cover: the location (``locs``) and
        :math:`\rho` (``rhos``, :math:`\sigma = \mathrm{softplus}(\rho)`) of a Normal in the unconstrained space,
        starting at ``loc`` (mapped there) with :math:`\sigma` = :attr:`fallback_init_scale`."""
        unconstrained = support_transform(site.prior_distribution()).inv(loc)
        self.add_param(site, "locs", unconstrained)
        rho = math.log(math.expm1(self.fallback_init_scale))
        self.add_param(site, "rhos", torch.full_like(unconstrained, rho))

    def fallback_posterior(self, name: str, prior) -> pyro.distributions.TorchDistribution:
        r""":math:`q(\theta) = T_\#\,\mathcal N(\mu, \sigma^2)`, :math:`T` =
        :func:`~pyrobnn.distributions.support_transform` (``biject_to(prior.support)``, or the prior's own transform
        when it is a push-forward of a Normal): the mean-field Normal of the unconstrained space pushed to the support
        (Pyro's ``AutoNormalMessenger``); a plain Normal on the reals."""
        loc, scale = self.param(name, "locs"), F.softplus(self.param(name, "rhos"))
        transform = support_transform(prior)
        if transform is identity_transform:
            return dist.Normal(loc, scale).to_event(loc.dim())
        return PushedNormal(loc, scale, transform)

    def fallback_value(self, name: str, prior) -> torch.Tensor:
        r"""The median of :meth:`fallback_posterior`: :math:`T(\mu)`."""
        return support_transform(prior)(self.param(name, "locs"))

    def posterior(self, name: str) -> pyro.distributions.TorchDistribution:
        """:meth:`get_posterior` of site ``name`` against the model's prior (:meth:`fallback_posterior` for a site
        the family does not cover)."""
        prior = self._priors[name]()
        if name in self._family:
            return self.get_posterior(name, prior)
        return self.fallback_posterior(name, prior)

    def median(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        r"""A point value per site, the posterior median (the mean of these symmetric families; :math:`T(\mu)` of a
        site's unconstrained Normal), for deterministic prediction; takes and ignores the model's arguments, as an
        autoguide's."""
        return {name: (self.posterior(name).mean if name in self._family
                       else self.fallback_value(name, self._priors[name]())).detach() for name in self.site_names}

    # -- shared mechanism -----------------------------------------------------------
    def flat(self, role: str) -> tuple[torch.Tensor, list[torch.Size]] | None:
        """The variational parameters ``role`` of every site as one differentiable flat tensor (site order), and
        their shapes; None when they cannot share one storage (sites on several devices or dtypes).

        Each site's parameter stays its own ``nn.Parameter`` in Pyro's param store (read here through it, so SVI
        and ``pyro.optim`` see it), but its data is a slice of one flat storage per role, made on first use and
        again whenever something replaced it (``.to(device)``): so an elementwise function of all the weights
        (noise, :math:`\\sigma`, a KL) is one operation over the flat tensor, and its gradient reaches the sites'
        parameters as views."""
        params = [self.param(name, role) for name in self.family_names]
        if not all(isinstance(p, torch.nn.Parameter) for p in params):  # a constrained parameter: no flat view
            return None
        if not self.shared_storage:
            return torch.cat([p.reshape(-1) for p in params]), [p.shape for p in params]
        storage = self.__dict__.setdefault("_flat_storage", {})
        flat = storage.get(role)
        if flat is None or not _aliases(flat, params):
            if len({(p.device, p.dtype) for p in params}) != 1:
                return None
            with torch.no_grad():
                flat = torch.cat([p.detach().reshape(-1) for p in params])
                offset = 0
                for p in params:
                    p.data = flat[offset: offset + p.numel()].view(p.shape)
                    offset += p.numel()
            storage[role] = flat
        return _FlatView.apply(flat, *params), [p.shape for p in params]

    def add_param(self, site: Site | str, role: str, value: torch.Tensor) -> None:
        """Create the variational parameter ``role`` (e.g. ``"locs"``) of ``site``, initialised to ``value``:
        a :class:`~pyro.nn.PyroParam` named ``<guide name>.<role>.<site name>`` in Pyro's param store."""
        name = site.name if isinstance(site, Site) else site
        if not hasattr(self, role):
            setattr(self, role, PyroModule())
        module = getattr(self, role)
        *path, attr = name.split(".")
        for part in path:
            if not hasattr(module, part):
                setattr(module, part, PyroModule())
            module = getattr(module, part)
        setattr(module, attr, PyroParam(value.detach().clone()))  # unconstrained (direct_parameters reads it so)

    def _leaf(self, name: str, role: str) -> tuple[PyroModule, str]:
        """The module that holds the variational parameter ``role`` of site ``name``, and its attribute there
        (the ``PyroParam``'s name).

        Found by walking the guide's nested containers once and kept (``PyroModule.__getattr__`` runs Pyro's
        bookkeeping at every level of the walk, which a training step would otherwise pay for every parameter);
        the leaf itself is read with ``getattr`` at every use, so it still syncs with Pyro's param store and emits
        its ``param`` message."""
        leaves = self.__dict__.setdefault("_leaves", {})
        leaf = leaves.get((role, name))
        if leaf is None:
            module = getattr(self, role)
            *path, attr = name.split(".")
            for part in path:
                module = getattr(module, part)
            leaf = leaves[role, name] = (module, attr)
        return leaf

    def param(self, name: str, role: str) -> torch.Tensor:
        """The variational parameter ``role`` of site ``name`` (the param store's value inside a guide call)."""
        if _DIRECT.get():  # unconstrained: the parameter itself (direct_parameters)
            return self._unconstrained(name, role)
        module, attr = self._leaf(name, role)
        return getattr(module, attr)

    def _claim(self) -> None:
        """Make Pyro's param store hold this guide's parameters under its names (:func:`pyrobnn.model.param_store.
        claim`): values loaded into the store, before or after the guide was built, are adopted in place; entries
        of another pyrobnn guide of the same name are replaced."""
        owner = f"{type(self).__name__} {pyro_name(self)!r}"
        for fullname, role, site in self._params:
            claim(fullname, self._unconstrained(site, role), owner)

    def _unconstrained(self, name: str, role: str) -> torch.Tensor:
        """The ``nn.Parameter`` behind the variational parameter ``role`` of site ``name``."""
        module, attr = self._leaf(name, role)
        return module._parameters[attr + "_unconstrained"]

    def set_up(self, *args, **kwargs) -> None:
        """Find the sites by running the model on its arguments, if not yet known, and make the parameters."""
        if not self.ready:
            self._network.trace(*args, **kwargs)
            self._setup()

    def forward(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        self.set_up(*args, **kwargs)
        self._claim()
        return {name: pyro.sample(name, self.posterior(name)) for name in self.site_names}


def _check_coverable(site: Site, guide: str) -> None:
    """A latent site a mean-field guide over global latents can cover: continuous, outside any plate."""
    prior = site.prior_distribution()
    if prior.support.is_discrete:
        raise ValueError(f"{guide}: site {site.name!r} is discrete ({type(prior).__name__}): pyrobnn's guides cover "
                         "continuous latents; enumerate it out (pyro.infer.config_enumerate with TraceEnum_ELBO) or "
                         "condition the model on its value (pyro.condition)")
    if site.plates:
        raise ValueError(f"{guide}: site {site.name!r} is sampled inside plate {site.plates[0]!r} (a local latent, one "
                         "value per example): pyrobnn's guides cover global latents (weights, a noise scale); use "
                         "Pyro's AutoNormal for a model with local latents")
