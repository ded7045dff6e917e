r"""What every method returns: a posterior :math:`q(w)` that predicts, evaluates, draws, saves and loads.

One protocol, :class:`Posterior`, and two kinds behind it:

- :class:`VariationalPosterior`: a trained guide (Bayes by Backprop, variational dropout, MC dropout, MAP, the
  mixture node guide, IVON's Gaussian), whose predictive averages ``num_samples`` samples of it (or, under VDP++,
  propagates its moments);
- :class:`EmpiricalPosterior`: draws :math:`q(w) = \frac1{RS}\sum_{r,s}\delta(w - w_{r,s})` of a deep ensemble,
  the Laplace approximation, SWAG, SG-MCMC or NUTS (:class:`~pyrobnn.infer.draws.Draws`), whose predictive replays
  every draw once.

Either way :meth:`Posterior.predicted` is the predictive on some inputs (its summaries and its mixture,
:func:`~pyrobnn.analysis.calibration.predicted`), :meth:`Posterior.predict` its summaries and
:meth:`Posterior.evaluate` its metrics (:func:`~pyrobnn.analysis.evaluate.scores`), so a study compares methods on
the same predictive, and :meth:`Posterior.draw` gives weight samples ``{site: (S, ...)}`` of any of them. A method
with a predictive of its own (SNGP's mean field) overrides :meth:`Posterior.predicted`, and every user of posteriors
(the command line's test report, evaluation and calibration) reads it there.
:meth:`Posterior.save` writes one file; :func:`load_posterior` reads any of them back into a model built as the
one that was trained (a variational posterior also needs its guide built alike).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Optional

import pyro
import torch
from pyro import poutine
from torch import nn

from pyrobnn.analysis.calibration import Mixture, predicted
from pyrobnn.analysis.evaluate import scores
from pyrobnn.checkpoint import load_checkpoint, save_checkpoint
from pyrobnn.checks import one_line, positive_int
from pyrobnn.infer.draws import Draws
from pyrobnn.infer.laplace import LinearizedLaplace, fit_linearized_laplace
from pyrobnn.infer.predict import PROTOTYPE_ROWS, predict, predict_moments
from pyrobnn.infer.svi import History
from pyrobnn.model.protocol import attach_output_hook, network_model

__all__ = ["Posterior", "VariationalPosterior", "EmpiricalPosterior", "LinearizedPosterior", "TemperedPosterior",
           "Temperature", "load_posterior", "VARIATIONAL_KIND"]

VARIATIONAL_KIND = "variational"
"""The ``"kind"`` entry of a file :meth:`VariationalPosterior.save` writes (a draws file names its draws' kind)."""


class Posterior(ABC):
    """The posterior a method returns: the model it belongs to, the guide that replays or samples it, how many
    samples its predictive averages by default, the method's report (plain numbers for ``metrics.json``) and the
    training history (:class:`~pyrobnn.infer.svi.History`, or each run's for several)."""

    model: nn.Module
    guide: nn.Module
    num_samples: int
    report: dict
    history: object

    kind: str = ""
    """The kind of posterior (``variational``, a method's own, or the kind of its draws: ``ensemble``, ``laplace``,
    ``swag``, ``sgmcmc``, ``mcmc``)."""

    KINDS: ClassVar[dict[str, type]] = {}
    """The kinds of posterior files that a class of its own reads back (:func:`load_posterior`): each subclass that
    names its :attr:`kind` (``variational``; a method's own predictive, SNGP's); the draws kinds are
    :class:`~pyrobnn.infer.draws.Draws`'."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if isinstance(cls.__dict__.get("kind"), str) and cls.__dict__["kind"]:
            Posterior.KINDS[cls.kind] = cls

    moments: bool = False
    """Whether the predictive propagates moments (VDP++) rather than averaging samples."""

    def predict(self, x: torch.Tensor, num_samples: Optional[int] = None, **options) -> dict[str, torch.Tensor]:
        """The posterior predictive at ``x`` (:func:`~pyrobnn.infer.predict.predict`'s summaries, or
        :func:`~pyrobnn.infer.predict.predict_moments`'s under VDP++) with ``num_samples`` samples (default
        :attr:`num_samples`); ``options`` are ``predict``'s (``batch_size``, ``max_memory``, ``progress``, ...)."""
        if self.moments:
            return predict_moments(self.model, self.guide, x, **options)
        return predict(self.model, self.guide, x, self._samples(num_samples), **options)

    def predicted(self, x: torch.Tensor, num_samples: Optional[int] = None, **options) -> tuple[dict, Mixture]:
        """The predictive at ``x`` from one set of draws: its summaries and its mixture
        (:func:`~pyrobnn.analysis.calibration.predicted`: what :meth:`evaluate` scores and a calibrator fits);
        ``options`` are ``predicted``'s (``batch_size``, ``max_memory``, ``progress``, ...)."""
        return predicted(self.model, self.guide, x, self._samples(num_samples), moments=self.moments, **options)

    def task(self, x: torch.Tensor) -> str:
        """``classification`` or ``regression``: the model's (a Pyro model written by hand: traced on ``x``)."""
        return network_model(self.model, x[:PROTOTYPE_ROWS]).task

    def evaluate(self, x: torch.Tensor, y: torch.Tensor, num_samples: Optional[int] = None, target_scale=None,
                 calibration=None, mc_error: bool = False, **options) -> dict:
        """Accuracy, NLL, ECE and Brier (classification) or RMSE, NLL and the log-likelihood (regression) of the
        predictive on ``(x, y)`` (:meth:`predicted`), as :func:`~pyrobnn.analysis.evaluate.evaluate` computes them:
        ``target_scale``, ``calibration`` and ``mc_error`` are its, ``options`` :meth:`predicted`'s."""
        pred, mixture = self.predicted(x, num_samples, **options)
        return scores(self.task(x), pred, mixture, y, target_scale, calibration, mc_error)

    @abstractmethod
    def draw(self, num_samples: Optional[int] = None, seed: int = 0) -> dict[str, torch.Tensor]:
        """``num_samples`` weight samples ``{site: (S, ...)}`` (default :attr:`num_samples`), seeded."""

    @abstractmethod
    def save(self, path: str | Path, **metadata) -> None:
        """Write the posterior to ``path`` (atomically), with ``metadata`` entries (the command line stores its
        configuration as ``config``); :func:`load_posterior` reads it back."""

    def _samples(self, num_samples: Optional[int]) -> int:
        return positive_int("num_samples", self.num_samples if num_samples is None else num_samples)


@dataclass
class VariationalPosterior(Posterior):
    """A trained guide of ``model``: its predictive averages ``num_samples`` samples (``moments``: VDP++'s one
    deterministic pass instead).

    :param model: the model, e.g. a :class:`~pyrobnn.BayesianNetwork` or a Pyro model written by hand.
    :param guide: its trained guide (a pyrobnn guide or a Pyro autoguide).
    :param num_samples: the predictive's samples by default.
    :param moments: predict by moment propagation (:func:`~pyrobnn.infer.predict.predict_moments`).
    :param report: what the method records of it.
    :param history: the training history.
    """

    model: nn.Module
    guide: nn.Module
    num_samples: int = 100
    moments: bool = False
    report: dict = field(default_factory=dict)
    history: object = field(default_factory=History)

    kind = VARIATIONAL_KIND

    @torch.no_grad()
    def draw(self, num_samples: Optional[int] = None, seed: int = 0) -> dict[str, torch.Tensor]:
        """Samples of the guide's latent sites: the guide run ``num_samples`` times under a trace, seeded (Pyro's
        global RNG is restored afterwards)."""
        count = self._samples(num_samples)
        state = pyro.util.get_rng_state()
        try:
            pyro.set_rng_seed(seed)
            traces = [poutine.trace(self.guide).get_trace() for _ in range(count)]
        finally:
            pyro.util.set_rng_state(state)
        names = [name for name, site in traces[0].nodes.items() if site["type"] == "sample"
                 and not site["is_observed"]]
        return {name: torch.stack([trace.nodes[name]["value"].detach() for trace in traces]) for name in names}

    @classmethod
    def loaded(cls, model: nn.Module, guide: nn.Module, state: dict, **options) -> "VariationalPosterior":
        """The posterior of ``model`` and ``guide`` (their states loaded from ``state``, the file :meth:`save` wrote)
        with ``options`` (the predictive's samples, the report): what :func:`load_posterior` returns for its kind."""
        return cls(model, guide, moments=bool(state.get("moments", False)), **options)

    def save(self, path: str | Path, **metadata) -> None:
        """The model's and the guide's state (``model``, ``guide``), whether it predicts by moments, its predictive's
        samples, the method's report and ``metadata``, under its :attr:`kind`."""
        save_checkpoint(path, {"kind": self.kind, "model": self.model.state_dict(), "epoch": None,
                               "guide": self.guide.state_dict(), "report": self.report, "moments": self.moments,
                               "num_samples": self.num_samples, **metadata})


@dataclass
class EmpiricalPosterior(Posterior):
    """The draws of a sampling or post-hoc method (:class:`~pyrobnn.infer.draws.Draws`: a deep ensemble, Laplace,
    SWAG, SG-MCMC, NUTS); its predictive replays ``num_samples`` of them (by default all, each once; fewer: an evenly
    thinned subset, :meth:`~pyrobnn.guides.PosteriorDraws.thinned`).

    :param result: the draws.
    :param num_samples: the predictive's draws by default (``None``: all of them).
    :param report: what the method records of them (default: :meth:`~pyrobnn.infer.draws.Draws.report`).
    """

    result: Draws
    num_samples: Optional[int] = None
    report: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.num_samples is None:
            self.num_samples = len(self.result)
        self.report = self.report or self.result.report()
        self.model, self.guide, self.history = self.result.model, self.result.guide(), self.result
        self.kind = self.result.kind

    def __len__(self) -> int:
        return len(self.result)

    def draw(self, num_samples: Optional[int] = None, seed: int = 0) -> dict[str, torch.Tensor]:
        """``num_samples`` of the draws ``{site: (S, ...)}``, evenly spaced over all of them (all of them, in order,
        by default; a site held at one value, as Laplace holds all but the last layer, repeats it; ``seed`` is
        unused: the draws are fixed)."""
        count = self._samples(num_samples)
        return {name: value.expand(count, *value.shape[1:]) if len(value) == 1 else value
                for name, value in self.guide.thinned(count).draws().items()}

    def save(self, path: str | Path, **metadata) -> None:
        """The ``draws.pt`` of :meth:`~pyrobnn.infer.draws.Draws.save`, with the method's report under its kind and
        the predictive's draws."""
        self.result.save(path, **{self.result.kind: self.report, "num_samples": self.num_samples, **metadata})


@dataclass
class LinearizedPosterior(VariationalPosterior):
    """A MAP fit (``guide``, a :class:`~pyrobnn.guides.PointGuide`) with the linearised Laplace approximation of some
    of its weights (:class:`~pyrobnn.infer.laplace.LinearizedLaplace`, attached to the model): its predictive averages
    ``num_samples`` draws of the linearised ("GLM") predictive, each a pass of the network whose output the
    approximation perturbs; :meth:`draw` gives weight samples of the Laplace posterior (the other sites at their MAP
    values). Laplace-LoRA (:class:`~pyrobnn.methods.lora.LaplaceLoRA`)."""

    laplace: Optional[LinearizedLaplace] = None

    kind = "laplace-lora"

    @torch.no_grad()
    def draw(self, num_samples: Optional[int] = None, seed: int = 0) -> dict[str, torch.Tensor]:
        count = self._samples(num_samples)
        values = super().draw(1, seed)
        generator = torch.Generator(device=self.laplace.laplace.mean.device).manual_seed(seed)
        flat = self.laplace.laplace.sample(count, generator=generator)
        draws = {name: value.expand(count, *value.shape[1:]) for name, value in values.items()}
        offset, trained = 0, dict(self.laplace.network.named_parameters())
        for name in self.laplace.selected:  # laplace-torch's order: the network's parameters that require a gradient
            shape = trained[name[len("net."):]].shape
            draws[name] = flat[:, offset:offset + shape.numel()].reshape(count, *shape)
            offset += shape.numel()
        return draws

    @classmethod
    def loaded(cls, model: nn.Module, guide: nn.Module, state: dict, **options) -> "LinearizedPosterior":
        """The approximation rebuilt from the file :meth:`save` wrote (its selected weights, laplace-torch's state),
        attached to ``model`` at the MAP fit ``guide`` (states loaded)."""
        selected = set(state["selected"])
        laplace = fit_linearized_laplace(model, guide, None, None, select=selected.__contains__, state=state["laplace"])
        return cls(model, guide, laplace=laplace, **options)

    def save(self, path: str | Path, **metadata) -> None:
        """The MAP fit's states, the approximation's (``laplace``: laplace-torch's ``state_dict``), the predictive's
        samples, the report and ``metadata``; :func:`load_posterior` reads it back given the model and guide built as
        the trained ones."""
        save_checkpoint(path, {"kind": self.kind, "model": self.model.state_dict(), "epoch": None,
                               "guide": self.guide.state_dict(), "laplace": self.laplace.laplace.state_dict(),
                               "selected": self.laplace.selected, "report": self.report,
                               "num_samples": self.num_samples, **metadata})


class Temperature:
    r"""Temperature scaling as a forward hook of a classifier's network: when it predicts (evaluation mode), its
    logits :math:`z` become :math:`z / T`; in training mode they pass unchanged (Guo et al. 2017)."""

    def __init__(self, temperature: float):
        self.temperature = float(temperature)
        self._handle = None

    def attach(self, model) -> "Temperature":
        """Hook onto ``model``'s network (once), in place of a temperature hooked there before (a posterior loaded
        again into the same model predicts at its own temperature, not at their product)."""
        if self._handle is None:
            self._handle = attach_output_hook(model.net, self, "temperature")
        return self

    def detach(self) -> None:
        """Unhook: the network predicts its own logits again."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def __call__(self, module, inputs, output):
        if module.training or not torch.is_tensor(output):
            return None
        return output / self.temperature


@dataclass
class TemperedPosterior(VariationalPosterior):
    """A MAP fit (``guide``) whose classifier predicts at ``temperature`` (:class:`Temperature`, attached to the
    model's network): :math:`p(y \mid x) = \mathrm{softmax}(z(x) / T)_y`, the arg-max kept. MAP with temperature
    scaling (:class:`~pyrobnn.methods.posthoc.TemperatureScaled`, ``map-ts``). ``temperature_hook``: the hook."""

    temperature: float = 1.0

    kind = "tempered"

    def __post_init__(self):
        self.temperature_hook = Temperature(self.temperature).attach(self.model)

    @classmethod
    def loaded(cls, model: nn.Module, guide: nn.Module, state: dict, **options) -> "TemperedPosterior":
        """The MAP fit at the saved temperature."""
        return cls(model, guide, temperature=float(state["temperature"]), **options)

    def save(self, path: str | Path, **metadata) -> None:
        """The MAP fit's states, the temperature, the predictive's samples, the report and ``metadata``."""
        save_checkpoint(path, {"kind": self.kind, "model": self.model.state_dict(), "epoch": None,
                               "guide": self.guide.state_dict(), "temperature": self.temperature,
                               "report": self.report, "num_samples": self.num_samples, **metadata})


def load_posterior(path: str | Path, model: nn.Module, guide: Optional[nn.Module] = None,
                   num_samples: Optional[int] = None, posterior=None) -> Posterior:
    """The posterior saved at ``path`` (by :meth:`Posterior.save`, ``pyrobnn train`` or ``pyrobnn mcmc``), in
    ``model`` (built as the one that was trained): an :class:`EmpiricalPosterior` for a draws file, else the posterior
    of its kind (:attr:`Posterior.KINDS`: a :class:`VariationalPosterior`, a :class:`LinearizedPosterior`, a method's
    own) of ``guide`` (built alike), whose states it loads; a training checkpoint (no kind) is
    ``posterior(model, guide)``'s (the method's: :meth:`~pyrobnn.methods.Method.posterior`; default a
    :class:`VariationalPosterior`). Its predictive takes ``num_samples`` samples by default, else as many as the saved
    posterior's did. A file that does not fit is one ``ValueError`` naming it."""
    state = load_checkpoint(path)
    kind = state.get("kind")
    if num_samples is None:
        num_samples = state.get("num_samples")
    if kind in Draws.KINDS:
        return EmpiricalPosterior(Draws.load(path, model, state), num_samples, report=dict(state.get(kind) or {}))
    cls = Posterior.KINDS.get(kind or VARIATIONAL_KIND)
    if cls is None:
        raise ValueError(f"{path} holds a posterior of kind {kind!r}, which no posterior of this pyrobnn reads "
                         f"(known: {', '.join([*Posterior.KINDS, *Draws.KINDS])})")
    if guide is None:
        raise ValueError(f"{path} holds a {cls.__name__}: pass the guide, built as the trained one "
                         "(load_posterior(path, model, guide))")
    try:
        model.load_state_dict(state["model"])
        guide.load_state_dict(state["guide"])
    except (RuntimeError, KeyError, TypeError) as error:  # a ValueError of a module's own check is its message
        raise ValueError(f"{path} does not fit the model and guide (another network or sizes?): "
                         f"{one_line(error)[:300]}") from None
    if kind is None and posterior is not None:  # a training checkpoint: the method's posterior of its states
        loaded = posterior(model, guide)
        if num_samples is not None:
            loaded.num_samples = num_samples
        return loaded
    return cls.loaded(model, guide, state, **({} if num_samples is None else {"num_samples": num_samples}),
                      report=dict(state.get("report") or {}))
