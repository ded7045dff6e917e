r"""The model protocol: what pyrobnn's inference reads from a Pyro model of a network.

A Pyro model of a neural network is :math:`p(w)\,p(\theta)\prod_n p(y_n \mid x_n, w, \theta)`: weights
:math:`w` with priors (``PyroSample`` attributes of ``nn.Linear`` / ``nn.Conv*`` modules), perhaps other global
latents :math:`\theta` (a noise scale), and one observed site. The guides, the estimator handlers, ``predict`` /
``evaluate``, ``sample_posterior`` and ``fit`` read from it what :class:`NetworkModel` writes down:

- its latent sites (:class:`Site`): name, prior, shape, support, and which module parameter each one is;
- its observed site, as a :class:`~pyrobnn.model.likelihoods.Likelihood` that maps the network's *output* (a
  tensor) to the observation's distribution and summarises the predictive of S outputs;
- its data-size scaling: ``num_data`` N, so a minibatch of B examples counts N/B times.

Two models satisfy it:

- :class:`~pyrobnn.BayesianNetwork`, which pyrobnn builds around any ``nn.Module`` and which knows all of this
  without running (its fast path);
- :class:`TracedModel`, which finds it by running any Pyro model once under ``poutine.trace``, as Pyro's autoguides
  do (``AutoNormal._setup_prototype``): a ``PyroModule`` written the way Pyro's tutorials write a Bayesian network
  (``PyroModule[nn.Linear]`` layers whose ``weight`` and ``bias`` are ``PyroSample`` priors, a noise scale from
  its own prior, ``pyro.sample("obs", ..., obs=y)`` under ``pyro.plate("data", ...)``), or a plain model function.

:func:`network_model` returns the model itself when it satisfies the protocol, else its :class:`TracedModel` (one
per model object, shared by every guide and function that receives the model).
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

import torch
from pyro import poutine
from pyro.distributions import constraints
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample
from torch import nn

from pyrobnn._compat import pyro_samples
from pyrobnn.handlers.particles import current_particles
from pyrobnn.model.likelihoods import Likelihood, likelihood_of
from pyrobnn.model.priors import Prior

__all__ = ["NetworkModel", "Site", "TracedModel", "network_model", "INIT_SUFFIX", "LAYER_TYPES",
           "scale_observations"]

INIT_SUFFIX = "_init"
"""A module's buffer ``<attribute>_init`` holds the reference value of a site that pyrobnn made (shape, dtype,
device, and the initial value of a guide's means)."""

LAYER_TYPES: tuple[type, ...] = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
"""The layers whose weights the estimator handlers act on (``F.linear``, ``F.convNd``)."""


@dataclass(frozen=True, eq=False)
class Site:
    """One latent site of a model of a network.

    :param name: the Pyro site name (``layer1.weight``; a ``PyroSample`` attribute is named by its module).
    :param module: the module whose ``PyroSample`` attribute ``attr`` the site is, or None (a ``pyro.sample`` in
        the model's code, e.g. a noise scale).
    :param attr: the attribute's name.
    :param prior: the :class:`~pyrobnn.model.priors.Prior` that made it (a site pyrobnn converted), or None (the
        user's own prior).
    :param value: a value of the site (from the trace that found it), for sites whose module keeps no reference
        buffer.
    :param distribution: the prior distribution traced at a site outside any module.
    :param plates: the plates the site is sampled in (a local latent, one value per example, has some).
    """

    name: str
    module: nn.Module | None = None
    attr: str | None = None
    prior: Prior | None = None
    value: torch.Tensor | None = None
    distribution: object | None = None
    plates: tuple[str, ...] = ()

    @property
    def init(self) -> torch.Tensor:
        """A value of the site: the parameter's value at conversion time (e.g. pretrained) for a site pyrobnn
        made, else the value it took when it was traced (a draw of its prior)."""
        if self.module is not None and self.attr + INIT_SUFFIX in self.module._buffers:
            return self.module._buffers[self.attr + INIT_SUFFIX]
        return self.value

    @property
    def shape(self) -> torch.Size:
        return self.init.shape

    def prior_distribution(self):
        """The site's prior, as the model samples it (a ``PyroSample``'s callable is called with its module, as
        ``PyroModule`` does)."""
        if self.module is None:
            return self.distribution
        prior = pyro_samples(self.module)[self.attr]
        return prior if hasattr(prior, "sample") else prior(self.module)

    @property
    def support(self):
        return self.prior_distribution().support

    @property
    def is_parameter(self) -> bool:
        """Whether the site is a real-valued parameter of a module (a ``PyroSample`` attribute on the reals): the
        sites a posterior family of :mod:`pyrobnn.guides` models. Others (a noise scale, any constrained latent)
        get the mean-field Normal of the unconstrained space (:meth:`~pyrobnn.guides.SiteGuide.covers`)."""
        return self.module is not None and _is_real(self.support)

    @property
    def layer(self) -> nn.Module | None:
        """The ``nn.Linear`` / ``nn.Conv*`` module whose ``weight`` or ``bias`` the site is, else None."""
        if isinstance(self.module, LAYER_TYPES) and self.attr in ("weight", "bias"):
            return self.module
        return None


def _is_real(support) -> bool:
    while isinstance(support, constraints.independent):
        support = support.base_constraint
    return support is constraints.real


@runtime_checkable
class NetworkModel(Protocol):
    r"""What pyrobnn's guides, estimators, ``predict`` / ``evaluate``, ``sample_posterior`` and ``fit`` need from
    a model of a network, :math:`p(w)\prod_n p(y_n \mid x_n, w)`.

    - ``model(x, y)`` is the Pyro model: it samples every latent site and observes ``y`` (``y=None``: samples it),
      counting a minibatch of B rows N/B times (N = ``num_data``, set by ``fit``); under an estimator handler
      with S particles (:mod:`pyrobnn.handlers.particles`) it runs S·B rows, particle-major.
    - :meth:`sites` lists the latent sites (:class:`Site`) in the order the model samples them.
    - :attr:`likelihood` is the observed site: ``likelihood.distribution(output)`` is the observation's
      distribution given the network ``output`` of a batch, ``likelihood.predictive(outputs)`` summarises S of
      them, ``likelihood.task`` is ``"classification"`` or ``"regression"``.
    - :meth:`run_net` is the network's output on ``x`` with the latent values in effect (a guide's, replayed with
      ``poutine.replay``; an estimator handler's lazy values); :meth:`net_with` with given values, as a potential
      energy evaluates it.
    - :meth:`check_input` raises a ``ValueError`` for an input that does not fit.
    """

    likelihood: Likelihood
    num_data: int | None

    def __call__(self, x: torch.Tensor, y: torch.Tensor | None = None): ...

    def sites(self) -> list[Site]: ...

    def check_input(self, x: torch.Tensor) -> None: ...

    def run_net(self, x: torch.Tensor, check: bool = True) -> torch.Tensor: ...

    def net_with(self, values: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor: ...


class _ScaleObservations(Messenger):
    """Multiplies the scale of every observed site by ``factor`` (latent sites, and so the KL, are untouched)."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def _pyro_sample(self, msg):
        if msg["is_observed"] and not site_is_subsample(msg):
            msg["scale"] = self.factor * msg["scale"]


class _Unsampled(Messenger):
    """Gives the site ``name`` a placeholder value instead of a draw: its distribution is what is wanted."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def _pyro_sample(self, msg):
        if msg["name"] == self.name and msg["value"] is None:
            fn = msg["fn"]
            msg["value"] = torch.zeros(fn.batch_shape + fn.event_shape)
            msg["done"] = True


def scale_observations(factor: float) -> _ScaleObservations:
    r"""A handler that weighs the observed sites' log-likelihood by ``factor`` and nothing else: the
    :math:`N/B` of a minibatch for a model whose data plate does not subsample (``poutine.scale`` would weigh
    the prior too)."""
    return _ScaleObservations(factor)


@dataclass(frozen=True)
class _Prototype:
    """What one traced run of a model showed: its latent sites, its observed site and how it is scored, the
    per-example input shape, and whether the model scales its own minibatch (a subsampling plate)."""

    sites: list[Site]
    observed: str
    likelihood: Likelihood
    input_shape: tuple
    subsamples: bool


def _parameter_sites(model) -> dict[str, tuple[nn.Module, str]]:
    """``{site name: (module, attribute)}`` of every ``PyroSample`` attribute of the modules of ``model``."""
    if not isinstance(model, nn.Module):
        return {}
    found = {}
    for module in model.modules():
        for attr in pyro_samples(module):
            prefix = getattr(module, "_pyro_name", "")
            found[f"{prefix}.{attr}" if prefix else attr] = (module, attr)
    return found


class TracedModel(nn.Module):
    """Any Pyro model of a network, read by running it once (:class:`NetworkModel`).

    ``TracedModel(model)(x, y)`` runs ``model(x, y)``; :meth:`trace` records, from one run on example data, the
    latent sites, the observed site (the one site observed when ``y`` is given; or ``observed``), the input shape
    and whether the model subsamples its data plate. The network's output is the observed distribution in the
    form of its :class:`~pyrobnn.model.likelihoods.Likelihood` (logits for a ``Categorical``, location and scale
    for a ``Normal``: :func:`~pyrobnn.model.likelihoods.likelihood_of`).

    Its data-size scaling: a model whose data plate subsamples (``pyro.plate("data", size=N, subsample=...)``)
    scales itself; any other's observed sites are weighed by ``num_data`` over the rows of the batch
    (:func:`scale_observations`), as ``BayesianNetwork``'s plate does. Under S particles of an estimator handler
    the input's rows are repeated S times, particle-major, and so are the targets, so the model's own plate covers
    every particle's rows and the observation averages over the particles.

    :param model: the Pyro model, called as ``model(x, y)`` and, to predict, ``model(x)``.
    :param observed: the name of the observed site, when the model observes several.
    :param num_data: N, the training-set size (``fit`` sets it).
    """

    def __init__(self, model: Callable, *, observed: str | None = None, num_data: int | None = None):
        super().__init__()
        if not callable(model):
            raise TypeError(f"model must be a Pyro model (a callable, e.g. a PyroModule), got {type(model).__name__}")
        if isinstance(model, nn.Module):
            self.model = model  # a child, so .to(), .train() and parameters() reach it (its site names unchanged)
        else:
            self.__dict__["model"] = model
        self.observed, self.num_data = observed, num_data
        self._prototype: _Prototype | None = None

    @property
    def traced(self) -> bool:
        """Whether :meth:`trace` has run (the sites are known)."""
        return self._prototype is not None

    def trace(self, x: torch.Tensor, y: torch.Tensor | None = None) -> "TracedModel":
        """Run the model once on ``(x, y)`` (hidden from every handler outside) and record its structure; a
        second call does nothing."""
        if self._prototype is None:
            self._prototype = self._traced_prototype(x, y)
        return self

    def _traced_prototype(self, x, y) -> _Prototype:
        with torch.no_grad():
            trace = poutine.block(poutine.trace(self.model).get_trace)(x, y)
        modules = _parameter_sites(self.model)
        sites, observed, candidates = [], [], []
        for name, node in trace.nodes.items():
            if node["type"] != "sample" or site_is_subsample(node):
                continue
            if node["is_observed"]:
                observed.append(name)
                continue
            if any(frame.size == len(x) for frame in node["cond_indep_stack"]):
                candidates.append(name)  # sampled in a plate over the rows: the observation when y is None
            module, attr = modules.get(name, (None, None))
            plates = tuple(frame.name for frame in node["cond_indep_stack"] if frame.vectorized)
            sites.append(Site(name, module, attr, value=node["value"].detach(),
                              distribution=None if module is not None else node["fn"], plates=plates))
        name = self._observed_site(observed if y is not None else candidates, trace, y is not None)
        sites = [site for site in sites if site.name != name]
        if not sites:
            raise ValueError(f"{self._what()} has no latent site: nothing to infer (its sample statements are "
                             f"{[n for n, s in trace.nodes.items() if s['type'] == 'sample']}); give its weights "
                             "priors (PyroSample) or wrap a plain network in pyrobnn.BayesianNetwork")
        node = trace.nodes[name]
        frames = [f for f in node["cond_indep_stack"] if f.vectorized]
        subsamples = any(f.full_size is not None and f.full_size != f.size for f in frames)
        return _Prototype(sites, name, likelihood_of(node["fn"], name), tuple(x.shape[1:]), subsamples)

    def _observed_site(self, found: list[str], trace, observing: bool) -> str:
        if self.observed is not None:
            node = trace.nodes.get(self.observed)
            if node is None or node["type"] != "sample":
                raise ValueError(f"observed={self.observed!r}: {self._what()} has no sample site of that name; its "
                                 f"sites are {[n for n, s in trace.nodes.items() if s['type'] == 'sample']}")
            return self.observed
        if len(found) == 1:
            return found[0]
        how = "observed when called as model(x, y)" if observing else "sampled in a plate over the rows of x"
        raise ValueError(f"the observed site of {self._what()} cannot be found: {len(found)} sites are {how} "
                         f"({found}); name it: pyrobnn.TracedModel(model, observed='<site>')")

    def _what(self) -> str:
        return f"the model {type(self.model).__name__}" if isinstance(self.model, nn.Module) else \
            f"the model {getattr(self.model, '__name__', repr(self.model))}"

    def _require(self) -> _Prototype:
        if self._prototype is None:
            raise RuntimeError(f"{self._what()} has not been traced: its sites are found by running it once "
                               "(guide(x, y), fit(...) or TracedModel.trace(x, y) do)")
        return self._prototype

    # -- the protocol ----------------------------------------------------------------
    def sites(self) -> list[Site]:
        return list(self._require().sites)

    @property
    def likelihood(self) -> Likelihood:
        return self._require().likelihood

    @property
    def observed_site(self) -> str:
        """The name of the observed site."""
        return self._require().observed

    @property
    def task(self) -> str:
        return self.likelihood.task

    def check_input(self, x: torch.Tensor) -> None:
        expected = self._require().input_shape
        if tuple(x.shape[1:]) != expected:
            raise ValueError(f"input x has per-example shape {tuple(x.shape[1:])} but {self._what()} was traced on "
                             f"{expected} (x must be (batch, {', '.join(map(str, expected))}))")

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """``x``, or its rows repeated for every particle of the estimator around the call."""
        particles = current_particles()
        if particles is not None and len(x) == particles.batch:
            return particles.rows(x)
        return x

    def run_net(self, x: torch.Tensor, check: bool = True) -> torch.Tensor:
        prototype = self._require()
        # the observation's distribution is read from the trace; it is not sampled, and the handlers outside do
        # not see it (it is no latent)
        tracer = poutine.trace(_Unsampled(prototype.observed)(self.model))
        poutine.block(tracer, hide=[prototype.observed])(self._rows(x))
        return prototype.likelihood.output_of(tracer.trace.nodes[prototype.observed]["fn"])

    def net_with(self, values: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return poutine.condition(self.run_net, data=values)(x)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None):
        prototype = self._require()
        batch, particles = len(x), current_particles()
        if particles is not None and batch == particles.batch:
            x, y = particles.rows(x), (None if y is None else particles.repeat(y))
        if prototype.subsamples or (self.num_data is None and len(x) == batch):
            return self.model(x, y)
        with scale_observations((self.num_data or batch) / len(x)):  # N/B, and 1/S over S particles' rows
            return self.model(x, y)


_TRACED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def network_model(model, x: torch.Tensor | None = None, y: torch.Tensor | None = None) -> NetworkModel:
    """``model`` itself when it satisfies :class:`NetworkModel` (a :class:`~pyrobnn.BayesianNetwork`, a
    :class:`TracedModel`), else the :class:`TracedModel` of ``model``: one per model object, so every guide and
    function given the same model shares its trace. With example data ``x`` (and ``y``) a model not yet traced is
    traced on them."""
    if not isinstance(model, TracedModel) and not isinstance(model, NetworkModel):
        adapter = _TRACED.get(model)
        if adapter is None:
            adapter = _TRACED[model] = TracedModel(model)
        model = adapter
    if x is not None and isinstance(model, TracedModel):
        model.trace(x, y)
    return model


def attach_output_hook(net: nn.Module, hook, slot: str):
    """Register ``hook`` (an object with ``detach()``) as a forward hook of ``net`` in ``slot`` (a posterior's
    predictive: ``temperature``, ``linearized``), detaching the hook attached in that slot before: a posterior loaded
    again into the same model replaces its predictive's hook rather than stacking a second one (a temperature
    applied twice, a Laplace perturbation added twice). Returns the hook's handle."""
    attribute = f"_pyrobnn_{slot}_hook"
    previous = getattr(net, attribute, None)
    if previous is not None and previous is not hook:
        previous.detach()
    setattr(net, attribute, hook)
    return net.register_forward_hook(hook)


@contextlib.contextmanager
def output_hooks_removed(net: nn.Module):
    """``net`` without the posterior predictives' hooks of :func:`attach_output_hook` for the block (a copy taken
    inside is the plain network, neither perturbing its outputs nor drawing random numbers), restored after it."""
    slots = {name: value for name, value in vars(net).items()
             if name.startswith("_pyrobnn_") and name.endswith("_hook")}
    hooks = {id(hook) for hook in slots.values()}
    removed = {key: hook for key, hook in net._forward_hooks.items() if id(hook) in hooks}
    for key in removed:
        del net._forward_hooks[key]
    for name in slots:
        delattr(net, name)
    try:
        yield net
    finally:
        net._forward_hooks.update(removed)
        for name, hook in slots.items():
            setattr(net, name, hook)

