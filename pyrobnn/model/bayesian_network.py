"""The Pyro model of a Bayesian neural network: priors on weights, a likelihood on targets."""

from __future__ import annotations

import warnings
import weakref
from typing import Sequence

import torch
from pyro.nn import PyroModule
from pyro.poutine.messenger import Messenger
from pyro.poutine.runtime import get_plates
from pyro.poutine.util import site_is_subsample
from torch import nn

from pyrobnn._compat import pyro_context
from pyrobnn.handlers.particles import ParticlesUnsupported, align_targets, current_particles
from pyrobnn.model.conversion import (
    NORMALIZATION_LAYERS,
    Selector,
    Site,
    bayesian,
    bayesian_sites,
    link_pyro_modules,
    to_pyro_modules_,
)
from pyrobnn.model.likelihoods import Categorical, Likelihood
from pyrobnn.model.param_store import claim
from pyrobnn.model.priors import Prior

__all__ = ["BayesianNetwork"]


class _ClaimParameters:
    """Forward pre-hook of the network: :meth:`BayesianNetwork._claim` before every pass (training, prediction)."""

    def __init__(self, model):
        self.model = weakref.ref(model)

    def __call__(self, net, args):
        model = self.model()
        if model is not None:
            model._claim()


class _OwnSampleSites(Messenger):
    """Records the sample statements a network's own code makes: every sample site but its ``PyroSample``
    parameters ``known`` (a plate's subsample site and ``pyro.deterministic`` are no sample statement of a latent or
    an observation)."""

    def __init__(self, known: set[str]):
        super().__init__()
        self.known, self.found = known, []

    def _pyro_sample(self, msg):
        if msg["name"] not in self.known and not site_is_subsample(msg) and not msg["infer"].get("_deterministic"):
            self.found.append(msg["name"])


class BayesianNetwork(PyroModule):
    r"""Pyro model :math:`p(w)\,\prod_n p(y_n | x_n, w)` around any ``nn.Module``.

    ``model(x, y)`` samples the Bayesian weights from their priors (``PyroSample``
    sites named after the parameters, e.g. ``net.fc1.weight``), runs the network
    and observes ``y`` under ``pyro.plate("data", size=num_data)``, so a minibatch
    of B examples is scaled by N/B. It returns the network output.

    :param net: the network (converted in place by :func:`pyrobnn.model.conversion.bayesian`).
    :param likelihood: observation model; default :class:`~pyrobnn.model.likelihoods.Categorical`.
    :param prior: weight prior; default ``GaussianPrior(0, 1)``. A :class:`~pyrobnn.model.priors.NodePrior` instead
        makes an implicit BNN: node latents (sites ``<layer>.nodes``) on the selected Linear/Conv layers,
        whose weights stay point estimates (:mod:`pyrobnn.model.nodes`).
    :param num_data: training-set size N (scales the likelihood of a minibatch).
    :param include, exclude: which parameters are Bayesian (see :func:`pyrobnn.model.conversion.bayesian`).
    :param deterministic: keep every parameter a point estimate (the maximum-likelihood
        baseline, trained through the same loop).
    :param input_shape: per-example input shape, checked on every call when given.

    ``net`` is a network: its forward maps ``x`` to an output and samples nothing but its ``PyroSample``
    parameters. A Pyro model that samples its own sites (a noise scale, ``pyro.sample("obs", ..., obs=y)`` under
    ``pyro.plate("data", ...)``, as Pyro's tutorials write a Bayesian network) already is the whole model and is used
    as it is, without ``BayesianNetwork``: pyrobnn's guides, ``fit``, ``predict``, ``evaluate`` and
    ``sample_posterior`` read it by tracing (:class:`~pyrobnn.model.TracedModel`). Wrapped here, its first pass
    raises a ``TypeError`` (one line, also under Pyro's ``poutine.trace``) naming its sample sites and that way: a
    second observation of the same ``y`` would count the data twice, and its other latents would have no posterior.

    Example: every weight and bias gets a prior site; ``y`` is the observed site ``obs``.

    >>> import pyro, torch
    >>> from torch import nn
    >>> from pyrobnn import BayesianNetwork
    >>> pyro.clear_param_store(); pyro.set_rng_seed(0)
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    >>> model = BayesianNetwork(net, num_data=32)
    >>> [site.name for site in model.sites()]
    ['net.0.weight', 'net.0.bias', 'net.2.weight', 'net.2.bias']
    >>> x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
    >>> model(x, y).shape  # the network's output under one draw of the prior
    torch.Size([32, 3])
    >>> trace = pyro.poutine.trace(model).get_trace(x, y)
    >>> [name for name, site in trace.nodes.items() if site.get("is_observed")]
    ['obs']
    """

    def __init__(
        self,
        net: nn.Module,
        likelihood: Likelihood | None = None,
        *,
        prior: Prior | None = None,
        num_data: int | None = None,
        include: Selector | Sequence[Selector] | None = None,
        exclude: Selector | Sequence[Selector] | None = NORMALIZATION_LAYERS,
        deterministic: bool = False,
        input_shape: Sequence[int] | None = None,
    ):
        super().__init__()
        if num_data is not None and (not isinstance(num_data, int) or num_data <= 0):
            raise ValueError(f"num_data must be a positive int (the training-set size), got {num_data!r}")
        if likelihood is not None and not isinstance(likelihood, Likelihood):
            raise TypeError(f"likelihood must be a pyrobnn Likelihood, got {likelihood!r}")
        if deterministic:
            to_pyro_modules_(net)
        else:
            bayesian(net, prior, include=include, exclude=exclude)
        self.net = net
        link_pyro_modules(self)
        self.likelihood = likelihood if likelihood is not None else Categorical()
        self.num_data = num_data
        self.input_shape = tuple(input_shape) if input_shape is not None else None
        self._warned_num_data = False
        self._net_checked = False
        self._claim()
        net.register_forward_pre_hook(_ClaimParameters(self))

    def _claim(self) -> None:
        """Keep the deterministic parameters (weights under a node prior, BatchNorm, a learned noise scale) in
        Pyro's param store under their names, adopting values loaded there (:mod:`pyrobnn.model.param_store`):
        a fit saved with ``pyro.get_param_store().save`` is restored whether it is loaded before or after the
        model is built. Run when the model is built and before every pass of the network."""
        for fullname, parameter in self.named_parameters():
            # PyroParams sync with the store themselves; a frozen parameter is a constant, never in the store
            if parameter.requires_grad and not fullname.endswith("_unconstrained"):
                claim(fullname, parameter, "the model")

    @property
    def task(self) -> str:
        return self.likelihood.task

    def sites(self) -> list[Site]:
        """The Bayesian parameters (prior sample sites) of the network."""
        return list(bayesian_sites(self))

    def check_input(self, x: torch.Tensor) -> None:
        if self.input_shape is not None and tuple(x.shape[1:]) != self.input_shape:
            raise ValueError(
                f"input x has per-example shape {tuple(x.shape[1:])} but the network expects "
                f"{self.input_shape} (x must be (batch, {', '.join(map(str, self.input_shape))}))"
            )

    def run_net(self, x: torch.Tensor, check: bool = True) -> torch.Tensor:
        """The network's output on ``x``; with ``check``, an input whose shape does not fit the network is a
        ``ValueError`` that says so (instead of the error of the first layer it reaches). Under S vectorized
        particles a shape error may instead mean a residual around the first Bayesian layer, which the caller turns
        into a loop (:func:`~pyrobnn.handlers.particles.mismatched_rows_unsupported`), so it passes unchanged."""
        if not check or current_particles() is not None:
            return self._call_net(x)
        try:
            return self._call_net(x)
        except RuntimeError as error:
            if (isinstance(error, (torch.OutOfMemoryError, ParticlesUnsupported))
                    or ("shape" not in str(error) and "size" not in str(error))):
                raise
            raise ValueError(f"input x of shape {tuple(x.shape)} does not fit the network: {error}") from error

    def net_with(self, values: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """The network's output on ``x`` with the sites' ``values`` (``{site name: value}``), set in the
        ``PyroModule`` cache: no sample statement runs (what a potential energy evaluates at every leapfrog
        step)."""
        context = pyro_context(self)
        with context:
            for name, value in values.items():
                context.set(name, value)
            return self._call_net(x)

    def _call_net(self, x: torch.Tensor) -> torch.Tensor:
        """``self.net(x)``; its first pass also checks that the network samples nothing of its own (it is no
        Pyro model with its own observation), a ``TypeError`` naming the way that works if it does."""
        net = self._modules["net"]  # not self.net: Pyro would register a plain network with pyro.module every pass
        # in the model's context, which a plain network does not enter itself: code of its own that reads a site of
        # a converted layer before calling it (peft reads lora_A.weight's dtype) then reads the same sample
        with pyro_context(self):
            if self._net_checked:
                return net(x)
            with _OwnSampleSites({site.name for site in self.sites()}) as own:
                output = net(x)
        if own.found:
            raise TypeError(
                f"BayesianNetwork(net): {type(self.net).__name__}'s forward samples its own sites {own.found}, so it "
                "is a whole Pyro model, not a network: use it as it is, without BayesianNetwork (pyrobnn's guides, "
                "fit, predict, evaluate and sample_posterior read it by tracing: pyrobnn.model.TracedModel), or give "
                "BayesianNetwork a network that returns its output and the likelihood= of y"
            )
        self._net_checked = True
        return output

    def _frozen(self) -> dict[str, torch.Tensor]:
        """The frozen parameters (``requires_grad`` False) by name: constants of the network's source."""
        return {name: p for name, p in self.named_parameters() if not p.requires_grad}

    def state_dict(self, *args, **kwargs):
        """``nn.Module.state_dict`` without the frozen parameters: a pretrained backbone comes from the network's
        source (:mod:`pyrobnn.networks.hf`), so a checkpoint of its adapters holds the adapters (0.6 MB, not the
        backbone's 91 MB)."""
        state = super().state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        for name in self._frozen():
            state.pop(prefix + name, None)
        return state

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """``nn.Module.load_state_dict``; a frozen parameter the state does not hold (:meth:`state_dict` leaves
        them out) keeps its value."""
        state = dict(state_dict)
        for name, value in self._frozen().items():
            state.setdefault(name, value.detach())
        return super().load_state_dict(state, strict=strict, assign=assign)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        self.check_input(x)
        if y is not None and self.num_data is not None and self.num_data < len(y):
            raise ValueError(f"num_data ({self.num_data}) must be at least the batch size ({len(y)})")
        plates = get_plates()
        if plates:
            raise ValueError(
                f"BayesianNetwork was called inside the plate(s) {[p.name for p in plates]}: a network takes one "
                "weight per layer, so Pyro's vectorized particles (Trace_ELBO(vectorize_particles=True), "
                "Predictive(parallel=True)) cannot batch it; use an estimator handler with num_particles=S "
                "(e.g. weight_sampling) or pyrobnn.infer.predict.predict instead"
            )
        output = self.run_net(x)
        if y is not None and self.num_data is None and not self._warned_num_data:
            self._warned_num_data = True
            warnings.warn("BayesianNetwork(num_data=None): the likelihood of a batch is not scaled to the training "
                          "set, so the KL weighs N/B times too much against it; pass num_data=N (fit sets it)",
                          UserWarning, stacklevel=2)
        self.likelihood(output, align_targets(y), self.num_data)
        return output
