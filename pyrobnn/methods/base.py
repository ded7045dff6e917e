r"""A method as an object: the prior and guide it builds, its estimator, optimiser and β schedule, how it trains, and
the posterior it returns, with its paper's defaults in its fields.

:class:`Method` is the contract (an ABC): every method builds a model and a guide the same way
(:meth:`Method.build`) and trains them its own way (:meth:`Method.train`, abstract), returning a
:class:`~pyrobnn.methods.posterior.Posterior`. :meth:`Method.fit` does both from a network and data::

    from pyrobnn.methods import METHODS
    posterior = METHODS["swag"].fit(network, x, y, epochs=20)
    posterior.evaluate(x_test, y_test)        # accuracy, NLL, ECE, Brier

A method is a frozen dataclass: :func:`dataclasses.replace` gives a variant (``replace(METHODS["bbb"],
estimator="flipout")``), and the command line reads its fields as its options' defaults (``pyrobnn train --method
bbb``). :class:`Variational` trains by SVI (:func:`~pyrobnn.infer.svi.fit`); the methods that start from point
estimates or sample are in :mod:`pyrobnn.methods.posthoc`, :mod:`pyrobnn.methods.nuts` and
:mod:`pyrobnn.methods.ivon`.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import inspect
import itertools
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar, Optional, Union

import pyro
import torch
from torch import nn

from pyrobnn.checks import multiples_near, positive_int
from pyrobnn.guides import MixtureNodeGuide, PointGuide
from pyrobnn.handlers import ESTIMATORS
from pyrobnn.handlers.node_draws import check_components
from pyrobnn.infer.elbo import MeanFieldELBO
from pyrobnn.infer.optim import Optim
from pyrobnn.infer.replicas import fit_replicas
from pyrobnn.infer.svi import TrainingDiverged, fit
from pyrobnn.methods.posterior import Posterior, VariationalPosterior
from pyrobnn.methods.rules import (
    guide_class,
    guide_options,
    learning_rate,
    noise_factor,
    paper_schedule,
    per_unit_noise,
    regression_noise,
)
from pyrobnn.model import BayesianNetwork, GaussianPrior, Prior
from pyrobnn.model.protocol import NetworkModel

__all__ = ["Method", "Variational", "Refused", "refusing", "GuideFactory", "NetworkSource", "MemberBuilder",
           "member_builder", "is_model", "needs_point_estimates"]

GuideFactory = Callable[[nn.Module], nn.Module]
"""``model -> guide``: a guide class, or a ``functools.partial`` of one with its options
(``partial(NormalGuide, init_rho=-5.0)``)."""

NetworkSource = Union[nn.Module, Callable[[], nn.Module]]
"""A network (an ``nn.Module``; a model already: a :class:`~pyrobnn.BayesianNetwork` or a Pyro model written by
hand), or a function that builds a fresh one (an ensemble's members each need their own)."""

MemberBuilder = Callable[[int], tuple]
"""``m -> (model, guide)``: run m >= 1 of a method that trains several (an ensemble's members, MultiSWAG's SWAGs,
SG-MCMC's chains), called after ``pyro.set_rng_seed(seed + m)``."""


_FIELD = re.compile(r"\{([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)\}")


class Refused(ValueError):
    """What a method refuses of its settings or of a run: one sentence in which every setting is its field between
    braces (``{swa_lr}``, ``{optimizer.name}``, ``{epochs}``), so that the rule is stated once and read in each
    interface's words: :meth:`spelled` with the field names (the message, for Python) or with another spelling of
    them (the command line's options: :func:`pyrobnn.cli.methods.spelled`).

    :param method: the method that refuses.
    :param template: the sentence.
    """

    def __init__(self, method, template: str):
        self.method, self.template = method, template
        super().__init__(self.spelled())

    def spelled(self, name: Callable[[str], str] = lambda field: field) -> str:
        """The sentence with each ``{field}`` written ``name(field)``."""
        return _FIELD.sub(lambda match: name(match.group(1)), self.template)

    def fields(self) -> list[str]:
        """The fields the sentence names, in order."""
        return list(dict.fromkeys(_FIELD.findall(self.template)))


@contextlib.contextmanager
def refusing(method):
    """Any ``ValueError`` raised inside (a check that names a setting as ``"{field}"``) as a :class:`Refused` of
    ``method``."""
    try:
        yield
    except Refused:
        raise
    except ValueError as error:
        raise Refused(method, str(error)) from None


@dataclass(frozen=True)
class Method(ABC):
    """An inference method with its paper's settings.

    :param prior: the weight prior p(w).
    :param guide: the posterior family, a guide factory (:data:`GuideFactory`).
    :param estimator: the gradient estimator (:data:`pyrobnn.handlers.ESTIMATORS`: ``sample``, ``local``,
        ``flipout``, ``vdp``).
    :param num_particles: posterior samples per training step, drawn in one batched pass.
    :param beta: the KL weight schedule; ``None``: the paper's for the guide and prior
        (:func:`~pyrobnn.methods.rules.paper_schedule`).
    :param optimizer: the optimizer factory (per-example rates, :class:`~pyrobnn.infer.optim.Optim`); ``None``: Adam
        at :func:`~pyrobnn.methods.rules.learning_rate`.
    :param batch_size: the minibatch size B.
    :param num_samples: the posterior predictive's samples.
    :param sites: the parameters the method makes Bayesian when the run selects none (``include=`` patterns; BLoB's
        LoRA ``A`` matrices); ``None``: every trainable parameter.
    :param paper: where the settings come from.
    """

    prior: Prior = GaussianPrior()
    guide: GuideFactory = PointGuide
    estimator: str = "sample"
    num_particles: int = 1
    beta: Optional[Callable[[int, int, int], float]] = None
    optimizer: Optional[Callable[..., torch.optim.Optimizer]] = None
    batch_size: int = 128
    num_samples: int = 100
    sites: Optional[tuple[str, ...]] = None
    paper: str = ""

    command: ClassVar[str] = "train"
    """The command of ``pyrobnn`` that runs the method (``train``; ``mcmc`` for NUTS)."""

    restarts: ClassVar[str] = ""
    """What the method keeps in memory only, not in its checkpoint (``"SWAG keeps its moments"``), so that a resumed
    run trains again from the start; empty: nothing."""

    run_name: ClassVar[str] = "run"
    """What one of several runs is called (``ensemble member``, ``SWAG``, ``chain``)."""

    takes_optimizer: ClassVar[bool] = True
    """Whether :attr:`optimizer` sets how the method trains; False for a method that is its own optimiser, whose
    rates are fields of its own (IVON)."""

    def __post_init__(self):
        with refusing(self):
            self.settings_rules()

    # ------------------------------------------------------------------------------------------------ rules

    def settings_rules(self) -> None:
        """The method's rules on its own settings, checked at construction (a ``dataclasses.replace`` too): a
        ``ValueError`` naming each setting as ``"{field}"`` (:class:`Refused`). Subclasses add theirs."""
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"{{estimator}} {self.estimator!r}: choose one of {', '.join(ESTIMATORS)}")
        for name in ("num_particles", "batch_size", "num_samples"):
            positive_int(f"{{{name}}}", getattr(self, name))
        if self.estimator == "vdp" and self.num_particles != 1:
            raise ValueError(f"{{num_particles}} {self.num_particles} does not apply to {{estimator}} vdp: VDP++ "
                             "propagates moments deterministically, one pass without particles")

    def check(self, model=None, *, epochs: int, rows: Optional[int] = None, **run) -> None:
        """The method's rules on a run of ``epochs`` over ``rows`` training examples of ``model`` (each checked where
        given), ``run`` being :meth:`train`'s run options (``transform``, ``on_epoch_end``, ``checkpoint``): a
        :class:`Refused` naming the settings. :meth:`train` checks its run first; the command line checks before
        it loads the data (``epochs``), then with the data and the model."""
        with refusing(self):
            positive_int("{epochs}", epochs)
            self.run_rules(model, epochs, rows, run)

    def run_rules(self, model, epochs: int, rows: Optional[int], run: dict) -> None:
        """:meth:`check`'s rules (``model`` and ``rows``: None where not known yet). Here the noise's: a noise
        learned by a method whose draws replay several networks' weights in one
        (:func:`~pyrobnn.methods.rules.regression_noise`)."""
        likelihood = getattr(model, "likelihood", None)
        if self.replays_weights and isinstance(getattr(likelihood, "log_scale", None), nn.Parameter):
            regression_noise(self, learn_scale=True)

    # ------------------------------------------------------------------------------------------------ settings

    def schedule(self, epochs: int):
        """The β schedule of a run of ``epochs``: :attr:`beta`, else the paper's."""
        return self.beta if self.beta is not None else paper_schedule(self.guide, self.prior, epochs)

    def optimizer_factory(self, epochs: int):
        """The optimizer factory of a run of ``epochs``: :attr:`optimizer`, else Adam at the prior's rate."""
        return self.optimizer if self.optimizer is not None else Optim(lr=learning_rate(self.prior))

    @property
    def learning_rate(self) -> float:
        """The per-example learning rate the method trains with."""
        optimizer = self.optimizer if self.optimizer is not None else Optim(lr=learning_rate(self.prior))
        return optimizer.lr

    def objective(self, precision: str = "fp32") -> MeanFieldELBO:
        """The objective: the estimator with :attr:`num_particles` particles in one batched pass, at ``precision``."""
        return MeanFieldELBO(self.num_particles, vectorize_particles=True, estimator=self.estimator,
                             precision=precision)

    # ------------------------------------------------------------------------------------------------ building

    def build(self, network: nn.Module, *, likelihood=None, num_data: Optional[int] = None, **selection) -> tuple:
        """``(model, guide)``: ``network`` with the method's prior on its weights
        (:class:`~pyrobnn.BayesianNetwork`, with ``likelihood``, ``num_data`` and the site ``selection``: ``include``,
        ``exclude``, ``deterministic``, ``input_shape``), or ``network`` itself when it is a model already (a
        :class:`~pyrobnn.BayesianNetwork`, a Pyro model written by hand), and the method's guide of it. Weights
        are drawn from torch's global RNG: seed it first for a reproducible initialisation."""
        if is_model(network):
            if selection or likelihood is not None:
                raise ValueError(f"{type(network).__name__} is a model already: its prior, likelihood and sites are "
                                 "its own (pass the plain nn.Module to give it the method's)")
            model = network
        else:
            if self.sites is not None and selection.get("include") is None:
                names = [name for name, _ in network.named_parameters()]
                if not any(fnmatch.fnmatchcase(name, site) for name in names for site in self.sites):
                    raise ValueError(f"the method makes the parameters {list(self.sites)} Bayesian and the network "
                                     f"has none (its parameters: {names[:4]}...): give it a network that has them "
                                     "(LoRA adapters: pyrobnn.networks.hf, --model hf:NAME) or select its sites "
                                     "with include= (--bayesian)")
                selection["include"] = list(self.sites)
            model = BayesianNetwork(network, likelihood, prior=self.prior, num_data=num_data, **selection)
        return model, self.guide(model)

    # ------------------------------------------------------------------------------------------------ training

    @abstractmethod
    def train(self, model, guide, x: torch.Tensor, y: torch.Tensor, *, epochs: int = 10, seed: int = 0,
              precision: str = "fp32", make_member: Optional[MemberBuilder] = None, **run) -> Posterior:
        """Train ``guide`` (and what else the method trains) on ``(x, y)`` and return the posterior.

        :param model, guide: built by :meth:`build` (or by hand: any model and guide the method takes).
        :param epochs: passes over the data.
        :param seed: seeds the training (a method of several runs: run m with ``seed + m``).
        :param precision: the network's arithmetic (``fp32``, ``bf16``).
        :param make_member: builds run m >= 1 of a method that trains several.
        :param run: the options of :func:`~pyrobnn.infer.svi.fit` that are the run's, not the method's
            (``device``, ``compile``, ``transform``, ``checkpoint``, ``progress``, ``on_epoch_end``, ``num_data``).
        """

    def fit(self, network: NetworkSource, x: torch.Tensor, y: torch.Tensor, *, likelihood=None, epochs: int = 10,
            seed: int = 0, include=None, progress: bool = False, **run) -> Posterior:
        """Build and train: :meth:`build` on ``network`` (seeded by ``seed``), then :meth:`train`.

        :param network: an ``nn.Module`` (or a model), or a function that builds a fresh one (:func:`member_builder`):
            with a function, ``seed`` fixes the initial weights too; a module keeps the weights it has (a pre-trained
            network), and runs after the first (an ensemble's members) are copies initialised anew.
        :param likelihood: the observation model (default: :class:`~pyrobnn.model.likelihoods.Categorical` for
            integer targets, for floating ones a Gaussian whose noise follows the method's rule,
            :func:`~pyrobnn.methods.rules.regression_noise`).
        :param include: which parameters are Bayesian (:func:`~pyrobnn.model.conversion.bayesian`).
        :param run: :meth:`train`'s run options.
        :returns: the trained :class:`~pyrobnn.methods.posterior.Posterior`: it predicts, evaluates, draws and saves.

        Example: Bayes by Backprop as Blundell et al. (2015) set it, two epochs on 32 examples.

        >>> import torch
        >>> from torch import nn
        >>> from pyrobnn.methods import METHODS
        >>> x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
        >>> network = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        >>> posterior = METHODS["bbb"].fit(network, x, y, epochs=2, seed=0)
        >>> sorted(posterior.evaluate(x, y, num_samples=10))
        ['accuracy', 'brier', 'ece', 'nll']
        >>> posterior.predict(x, num_samples=10)["probs"].shape
        torch.Size([32, 3])
        """
        source = member_builder(network)
        if likelihood is None and not is_model(network) and torch.is_floating_point(y):
            with refusing(self):
                likelihood = regression_noise(self)  # the noise rule (pyrobnn.methods.rules)
        options = {} if is_model(network) else dict(likelihood=likelihood, num_data=x.shape[0],
                                                      **({} if include is None else {"include": include}))
        pyro.set_rng_seed(seed)
        model, guide = self.build(source(0), **options)
        return self.train(model, guide, x, y, epochs=epochs, seed=seed, progress=progress,
                          make_member=lambda m: self.build(source(m), **options), **run)

    def posterior(self, model, guide, history=None) -> Posterior:
        """The posterior of a trained ``model`` and ``guide`` (a training checkpoint's, read back:
        :func:`~pyrobnn.methods.load_posterior`'s ``posterior``): a
        :class:`~pyrobnn.methods.posterior.VariationalPosterior` of the method's predictive samples (by moments under
        VDP++); a method with a predictive of its own returns its own."""
        return VariationalPosterior(model, guide, self.num_samples, moments=self.estimator == "vdp",
                                    **({} if history is None else {"history": history}))

    # ------------------------------------------------------------------------------------------------ stacked

    @property
    def runs(self) -> int:
        """The networks one fit trains (an ensemble's members, MultiSWAG's SWAGs, SG-MCMC's chains): 1 here."""
        return 1

    @property
    def replays_weights(self) -> str:
        """Why the posterior's draws are weights alone, replayed in one network whose other trained parameters (a
        learned noise) are one run's only; empty where the draws keep the network they were trained in."""
        return ""

    def train_stacked(self, pairs: list, x: torch.Tensor, y: torch.Tensor, *, epochs: int = 10, seed: int = 0,
                      precision: str = "fp32", transform=None, **run) -> list[Posterior]:
        """Train ``pairs`` ``[(model, guide)]``, P groups of :attr:`runs` consecutive pairs, as one stacked network
        (:func:`~pyrobnn.infer.replicas.fit_replicas`: one step for all, each its own draws; the grid's points
        that differ only in tensors of the model) and return the P groups' posteriors. Groups whose rates differ
        (an SGD rate per unit noise on different noises: :func:`~pyrobnn.methods.rules.noise_factor`) are stacked
        apart, consecutive groups of one rate together.

        :param transform: the training transform's deterministic part (normalisation), where a posterior reads the
            training data (SWAG's BatchNorm statistics).
        :param run: the options of :func:`~pyrobnn.infer.replicas.fit_replicas` that are the run's (``device``,
            ``compile``, ``num_data``).
        :raises TrainingDiverged: naming the replica (the pair's index) whose loss became NaN or infinite.
        """
        self.check(pairs[0][0], epochs=epochs, rows=x.shape[0], transform=transform, **run)
        runs, posteriors = self.runs, []
        factors = [self.rate_factor(pairs[k][0], epochs) for k in range(0, len(pairs), runs)]
        for factor, groups in itertools.groupby(range(len(factors)), key=factors.__getitem__):
            groups = list(groups)
            stack = pairs[groups[0] * runs:(groups[-1] + 1) * runs]
            options = self.fit_options(epochs, precision, stack[0][0])
            collected = self.collector(x.shape[0], epochs, options["optimizer"], factor)
            if collected is not None:
                options["optimizer"] = collected
            try:
                fit_replicas(stack, x, y, epochs=epochs, seed=seed, **options, **run)
            except TrainingDiverged as error:
                replica = None if error.replica is None else groups[0] * runs + error.replica
                raise TrainingDiverged(str(error), replica) from None
            posteriors += [self.stacked_posterior(stack, range(k * runs, (k + 1) * runs), collected, x, seed,
                                                  transform) for k in range(len(groups))]
        return posteriors

    def collector(self, rows: int, epochs: int, optimizer, factor: float = 1.0):
        """The optimizer factory that collects what the method keeps of the stacked step (SWAG's moments, SG-MCMC's
        draws) on ``rows`` training rows, recording the optimisers it builds (``optimizer``: the one
        :meth:`fit_options` gives; ``factor``: :func:`~pyrobnn.methods.rules.noise_factor` of the stacked models);
        None: nothing beyond the trained values."""
        return None

    def stacked_posterior(self, pairs: list, rows: range, collected, x: torch.Tensor, seed: int,
                          transform=None) -> Posterior:
        """The posterior of the stacked pairs ``rows`` after :meth:`train_stacked` (``collected``:
        :meth:`collector`'s)."""
        model, guide = pairs[rows[0]]
        return self.posterior(model, guide)

    def rate_factor(self, model, epochs: int) -> float:
        """What the method's per-example rate is multiplied by on ``model`` (its rate per unit noise:
        :func:`~pyrobnn.methods.rules.noise_factor`)."""
        return noise_factor(model, self.optimizer_factory(epochs))

    def fit_options(self, epochs: int, precision: str = "fp32", model=None) -> dict:
        """The options of :func:`~pyrobnn.infer.svi.fit` that are the method's, for a run of ``epochs`` of ``model``:
        ``batch_size``, ``optimizer`` (its rate per unit noise on ``model``:
        :func:`~pyrobnn.methods.rules.per_unit_noise`), ``beta``, ``elbo``."""
        optimizer = self.optimizer_factory(epochs)
        if model is not None:
            optimizer = per_unit_noise(optimizer, model)
        return dict(batch_size=self.batch_size, optimizer=optimizer, beta=self.schedule(epochs),
                    elbo=self.objective(precision))


def needs_point_estimates(method, what: str) -> None:
    """A ``ValueError`` naming ``{guide}`` unless ``method`` trains point estimates (a
    :class:`~pyrobnn.guides.PointGuide`): ``what`` (its name) starts from MAP fits."""
    if not issubclass(guide_class(method.guide), PointGuide):
        raise ValueError(f"{what} starts from MAP fits: {{guide}} must be point estimates (PointGuide), got "
                         f"{guide_class(method.guide).__name__}")


def is_model(network) -> bool:
    """Whether ``network`` is a model already (a Pyro module: a :class:`~pyrobnn.BayesianNetwork`, a Pyro model
    written by hand), whose prior and sites are its own, rather than a plain network to put the method's prior on."""
    return isinstance(network, (pyro.nn.PyroModule, NetworkModel))


def member_builder(network: NetworkSource) -> Callable[[int], nn.Module]:
    """``m -> network``: a function builds every run's network (after the caller seeds torch's RNG, so the seed
    fixes each initialisation); a module is run 0's as it is (its weights as they are: a pre-trained network keeps
    them) and, for run m >= 1, a copy of it with every trainable layer that has ``reset_parameters`` initialised
    anew. A layer with a frozen parameter (a pretrained backbone) keeps its weights, and LoRA adapters
    (``peft``'s ``reset_lora_parameters``) are drawn as ``peft`` draws them: ``A`` at random, ``B = 0``."""
    if not isinstance(network, nn.Module):
        if not callable(network):
            raise TypeError(f"network must be an nn.Module or a function that builds one, got {network!r}")
        return lambda m: network()

    template = copy.deepcopy(network)  # before run 0's model converts the network in place

    def copied(m: int) -> nn.Module:
        if m == 0:
            return network
        fresh = copy.deepcopy(template)
        adapted = set()
        for module in fresh.modules():
            if hasattr(module, "reset_lora_parameters"):
                for adapter in getattr(module, "active_adapters", ()):
                    module.reset_lora_parameters(adapter, True)
                adapted.update(id(m) for m in module.modules())
        for module in fresh.modules():
            if (hasattr(module, "reset_parameters") and id(module) not in adapted
                    and all(p.requires_grad for p in module.parameters())):
                module.reset_parameters()
        return fresh

    return copied


@dataclass(frozen=True)
class Variational(Method):
    """Variational inference by SVI on the annealed ELBO (:func:`~pyrobnn.infer.svi.fit`): Bayes by Backprop,
    variational dropout, MC dropout, MAP, the implicit BNN's mixture, VDP++ (``estimator="vdp"``: its posterior
    predicts by moment propagation). Returns a :class:`~pyrobnn.methods.posterior.VariationalPosterior`."""

    def settings_rules(self) -> None:
        """A mixture over node latents (the implicit BNN) predicts with as many samples from each of its K
        components: :attr:`num_samples` a multiple of K."""
        super().settings_rules()
        k = self.components
        if k and self.num_samples % k:
            raise ValueError(f"{{num_samples}} {self.num_samples} must be a multiple of {{guide.num_components}} {k} "
                             f"(the mixture guide's predictions draw as many samples from each component): pass "
                             f"{multiples_near(self.num_samples, k)}")

    def run_rules(self, model, epochs, rows, run) -> None:
        """Every batch of a mixture over node latents splits evenly among its K components (each row uses one:
        :func:`~pyrobnn.handlers.node_draws.check_components`) under a stochastic estimator."""
        super().run_rules(model, epochs, rows, run)
        if self.components and rows is not None and ESTIMATORS[self.estimator].stochastic:
            try:
                check_components(self.components, self.batch_size, self.num_particles, rows)
            except ValueError as error:
                raise ValueError(f"{{guide.num_components}} {self.components}, {{batch_size}} {self.batch_size}, "
                                 f"{{num_particles}} {self.num_particles} on {rows} training examples: {error}"
                                 ) from None

    @property
    def components(self) -> int:
        """K of a mixture guide over node latents; 0 for any other guide."""
        if not issubclass(guide_class(self.guide), MixtureNodeGuide):
            return 0
        return guide_options(self.guide).get("num_components", inspect.signature(MixtureNodeGuide).parameters[
            "num_components"].default)

    def train(self, model, guide, x, y, *, epochs=10, seed=0, precision="fp32", make_member=None,
              **run) -> Posterior:
        self.check(model, epochs=epochs, rows=x.shape[0], **run)
        history = fit(model, guide, x, y, epochs=epochs, seed=seed, **self.fit_options(epochs, precision, model),
                      **run)
        return self.posterior(model, guide, history)

