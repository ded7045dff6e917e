r"""Methods made of point estimates: a deep ensemble, the Laplace approximation of a MAP fit, SWAG (and MultiSWAG),
SG-MCMC, and MAP with temperature scaling. Each trains a MAP objective (a :class:`~pyrobnn.guides.PointGuide` under
its prior) its own way and returns the draws of its posterior as an
:class:`~pyrobnn.methods.posterior.EmpiricalPosterior` (temperature scaling: a
:class:`~pyrobnn.methods.posterior.TemperedPosterior`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar, Optional

import torch

from pyrobnn.analysis.calibration import calibrate
from pyrobnn.checks import in_range, nonnegative_int, positive, positive_int
from pyrobnn.infer.ensemble import EnsembleResult, fit_ensemble
from pyrobnn.infer.iterates import Recorded
from pyrobnn.infer.laplace import fit_laplace
from pyrobnn.infer.optim import Optim
from pyrobnn.infer.schedules import Constant
from pyrobnn.infer.sgmcmc import SGMCMC_SAMPLERS, SGMCMCOptimizer, SGMCMCResult, fit_sgmcmc, sampler_options
from pyrobnn.infer.svi import ModelCallback, fit
from pyrobnn.infer.swag import SWAGCollector, SWAGResult, check_collection, check_rank, fit_swag, replicas, swa_schedule
from pyrobnn.methods.base import Method, needs_point_estimates
from pyrobnn.methods.posterior import EmpiricalPosterior, Posterior, TemperedPosterior
from pyrobnn.methods.rules import noise_factor, swag_start
from pyrobnn.model.likelihoods import Categorical

__all__ = ["Ensemble", "Laplace", "SWAG", "SGMCMC", "TemperatureScaled", "LONG_EPOCH"]

LONG_EPOCH = 10**6
"""Steps of an epoch with which SG-MCMC's sampler is checked where the data's size is not known (the draws that a
run's own epochs keep are checked with its rows)."""

MIN_HELD_OUT = 10
"""The fewest held-out rows a temperature is fitted on."""


def _shown(value) -> str:
    return type(value).__name__ if callable(value) and not isinstance(value, (int, float)) else f"{value:g}"


@dataclass(frozen=True)
class Ensemble(Method):
    r"""A deep ensemble (Lakshminarayanan, Pritzel & Blundell 2017): ``members`` MAP fits from the initialisations
    of seeds seed..seed+M-1, each trained with its own seed, predicted as their uniform mixture
    :math:`\frac1M\sum_m p(y \mid x, w_m)` (:func:`~pyrobnn.infer.ensemble.fit_ensemble`)."""

    members: int = 5

    run_name: ClassVar[str] = "ensemble member"

    def settings_rules(self) -> None:
        super().settings_rules()
        positive_int("{members} (M, the ensemble's size)", self.members)
        needs_point_estimates(self, f"a deep ensemble of {self.members}")

    def train(self, model, guide, x, y, *, epochs=10, seed=0, precision="fp32", make_member=None,
              **run) -> Posterior:
        self.check(model, epochs=epochs, rows=x.shape[0], **run)
        result = fit_ensemble(model, guide, x, y, members=self.members, make_member=make_member, seed=seed,
                              epochs=epochs, **self.fit_options(epochs, precision, model), **run)
        return EmpiricalPosterior(result)

    @property
    def runs(self) -> int:
        return self.members

    @property
    def replays_weights(self) -> str:
        return f"its {self.members} members' weights are replayed in one network" if self.members > 1 else ""

    def stacked_posterior(self, pairs, rows, collected, x, seed, transform=None) -> Posterior:
        """The uniform mixture of the stacked members ``rows`` (they share the batches, where :meth:`train`'s members
        each draw their own)."""
        return EmpiricalPosterior(EnsembleResult.of(pairs[rows[0]][0], [pairs[r][1] for r in rows]))


@dataclass(frozen=True)
class Laplace(Method):
    """The last-layer, Kronecker-factored Laplace approximation of a MAP fit (Daxberger et al. 2021, laplace-torch;
    :func:`~pyrobnn.infer.laplace.fit_laplace`): ``num_samples`` draws of the last layer, the prior precision chosen
    by the marginal likelihood."""

    def settings_rules(self) -> None:
        super().settings_rules()
        needs_point_estimates(self, "the Laplace approximation")

    def train(self, model, guide, x, y, *, epochs=10, seed=0, precision="fp32", make_member=None,
              **run) -> Posterior:
        self.check(model, epochs=epochs, rows=x.shape[0], **run)
        history = fit(model, guide, x, y, epochs=epochs, seed=seed, **self.fit_options(epochs, precision, model),
                      **run)
        transform = run.get("transform")
        # the curvature is summed over the training data as predictions see them: a transform's deterministic part
        # (ImageAugment.normalize), without the random augmentation
        result = fit_laplace(model, guide, x, y, num_samples=self.num_samples, seed=seed,
                             transform=getattr(transform, "normalize", transform))
        result.histories = [history]
        return EmpiricalPosterior(result)


@dataclass(frozen=True)
class SWAG(Method):
    """SWAG (Maddox et al. 2019) and MultiSWAG (Wilson & Izmailov 2020): SGD's iterates after epoch ``start``
    (``None``: :func:`~pyrobnn.methods.rules.swag_start`, half the epochs) fitted by a Gaussian with diagonal plus
    rank-``rank`` covariance, ``num_samples`` draws of each of ``members`` SWAGs; with ``swa_lr`` the learning rate
    falls from the optimiser's to it between 0.5 T and 0.9 T (:func:`~pyrobnn.infer.swag.swa_schedule`)
    (:func:`~pyrobnn.infer.swag.fit_swag`)."""

    optimizer: Optional[Optim] = Optim("sgd", 0.05)
    start: Optional[int] = None
    rank: int = 20
    swa_lr: Optional[float] = 0.01
    members: int = 1
    num_samples: int = 30

    restarts: ClassVar[str] = "SWAG keeps its moments"

    run_name: ClassVar[str] = "SWAG"

    def settings_rules(self) -> None:
        """SGD's iterates (Maddox et al. 2019), a rank of at least 2, and an SWA rate that is the only schedule of
        the rate and at most the rate it falls from."""
        super().settings_rules()
        positive_int("{members} (M, MultiSWAG's SWAGs)", self.members)
        needs_point_estimates(self, "SWAG")
        check_rank(self.rank, "{rank}")
        if self.start is not None:
            nonnegative_int("{start} (T, the epoch the collection starts from)", self.start)
        optimizer = super().optimizer_factory(1)  # without the SWA schedule
        if not isinstance(optimizer, Optim) or optimizer.name != "sgd":
            raise ValueError(f"SWAG fits its Gaussian to SGD's iterates: {{optimizer.name}} must be sgd (got "
                             f"{getattr(optimizer, 'name', optimizer)})")
        if self.swa_lr is None:
            return
        positive("{swa_lr}", self.swa_lr)
        if optimizer.schedule is not None:
            raise ValueError("{swa_lr} sets SWAG's learning-rate schedule: drop {optimizer.schedule}")
        if self.swa_lr > optimizer.lr:
            raise ValueError(f"{{optimizer.lr}} {optimizer.lr:g} is below SWAG's SWA rate {{swa_lr}} {self.swa_lr:g}, "
                             f"and SWAG's rate falls from {{optimizer.lr}} to it (Maddox et al. 2019): set {{swa_lr}} "
                             f"to {optimizer.lr:g} or lower, or {{optimizer.lr}} higher")

    def run_rules(self, model, epochs, rows, run) -> None:
        """A collection that keeps two iterates at least: :attr:`start` at most ``epochs - 2``."""
        super().run_rules(model, epochs, rows, run)
        check_collection(self.collection_start(epochs), epochs, self.rank,
                         {"start": "{start}", "rank": "{rank}", "epochs": "{epochs}"})

    def collection_start(self, epochs: int) -> int:
        """T of a run of ``epochs``."""
        return swag_start(epochs) if self.start is None else self.start

    def optimizer_factory(self, epochs: int):
        optimizer = super().optimizer_factory(epochs)
        if self.swa_lr is None:
            return optimizer
        return dataclasses.replace(optimizer, schedule=swa_schedule(self.collection_start(epochs),
                                                                    self.swa_lr / optimizer.lr))

    def train(self, model, guide, x, y, *, epochs=10, seed=0, precision="fp32", make_member=None,
              **run) -> Posterior:
        self.check(model, epochs=epochs, rows=x.shape[0], **run)
        result = fit_swag(model, guide, x, y, start=self.collection_start(epochs), rank=self.rank,
                          num_samples=self.num_samples, members=self.members, make_member=make_member,
                          epochs=epochs, seed=seed, **self.fit_options(epochs, precision, model), **run)
        return EmpiricalPosterior(result)

    @property
    def runs(self) -> int:
        return self.members

    @property
    def replays_weights(self) -> str:
        return f"its {self.members} SWAGs' draws are replayed in one network" if self.members > 1 else ""

    def collector(self, rows, epochs, optimizer, factor=1.0):
        return Recorded(SWAGCollector(self.collection_start(epochs), self.rank, math.ceil(rows / self.batch_size),
                                      optimizer))

    def stacked_posterior(self, pairs, rows, collected, x, seed, transform=None) -> Posterior:
        """:attr:`num_samples` draws of each SWAG of the stacked networks ``rows``, BatchNorm statistics on ``x``."""
        trained = replicas(collected)
        return EmpiricalPosterior(SWAGResult.of(pairs[rows[0]][0], [trained[r] for r in rows], self.num_samples, seed,
                                                x, transform))


@dataclass(frozen=True)
class SGMCMC(Method):
    """Stochastic-gradient MCMC: ``sampler`` of :data:`~pyrobnn.infer.sgmcmc.SGMCMC_SAMPLERS` (SGLD, SGHMC, cyclical
    SGHMC) at the per-example step size of :attr:`optimizer` (only its ``lr``), its settings where they are not
    None, ``chains`` chains run as one stacked network (:func:`~pyrobnn.infer.sgmcmc.fit_sgmcmc`; several chains take
    no checkpoint, callbacks or progress bar, which are dropped)."""

    sampler: str = "sgld"
    friction: Optional[float] = None
    cycles: Optional[int] = None
    exploration: Optional[float] = None
    temperature: float = 1.0
    chains: int = 1

    restarts: ClassVar[str] = "SG-MCMC keeps its draws"

    run_name: ClassVar[str] = "chain"

    def settings_rules(self) -> None:
        """Point estimates, the posterior's β = 1 (a tempered posterior is :attr:`temperature`), a step size that
        follows the sampler's schedule alone (no other schedule, weight decay, guide rate or particles), and the
        sampler's own settings."""
        super().settings_rules()
        if self.sampler not in SGMCMC_SAMPLERS:
            raise ValueError(f"{{sampler}} {self.sampler!r}: choose one of {', '.join(SGMCMC_SAMPLERS)}")
        positive_int("{chains}", self.chains)
        needs_point_estimates(self, f"SG-MCMC ({self.sampler})")
        optimizer = self.optimizer_factory(1)
        for field, value, default in (("optimizer.weight_decay", getattr(optimizer, "weight_decay", 0.0), 0.0),
                                      ("optimizer.schedule", getattr(optimizer, "schedule", None), None),
                                      ("optimizer.factor", getattr(optimizer, "factor", 1.0), 1.0),
                                      ("num_particles", self.num_particles, 1)):
            if value != default:
                raise ValueError(f"{{{field}}} {_shown(value)} does not apply to SG-MCMC: the sampler's step follows "
                                 "the posterior (the prior is the weight decay; the step-size schedule is "
                                 "{cycles})")
        if self.beta is not None and self.beta != Constant(1.0):
            raise ValueError(f"SG-MCMC samples the posterior, whose KL weight is 1: drop {{beta}} {self.beta!r} (a "
                             "tempered posterior is {temperature})")
        self.sampler_of(epochs=1, steps_per_epoch=LONG_EPOCH)

    def run_rules(self, model, epochs, rows, run) -> None:
        """A run that keeps a draw (the sampler's draws in ``epochs`` of ``rows`` examples), and several chains only
        without a transform or a callback that reads the model (``validation``: the run will have one; they run as
        one stacked network)."""
        super().run_rules(model, epochs, rows, run)
        self.sampler_of(epochs, LONG_EPOCH if rows is None else math.ceil(rows / self.batch_size))
        if self.chains > 1:
            if run.get("transform") is not None:
                raise ValueError(f"{{chains}} {self.chains} run as one stacked network, which takes no {{transform}}: "
                                 "run one chain")
            callbacks = run.get("on_epoch_end") or []
            callbacks = callbacks if isinstance(callbacks, (list, tuple)) else [callbacks]
            if run.get("validation") or any(isinstance(c, ModelCallback) for c in callbacks):
                raise ValueError(f"{{chains}} {self.chains} run as one stacked network, which takes no {{validation}}: "
                                 "run one chain")

    def sampler_of(self, epochs: int, steps_per_epoch: int, lr: Optional[float] = None) -> SGMCMCOptimizer:
        """The sampler (an optimizer factory) of a run of ``epochs`` of ``steps_per_epoch`` steps, at ``lr`` (default
        the method's); a ``ValueError`` naming the sampler's settings when it would keep no draw."""
        try:
            return SGMCMCOptimizer(self.learning_rate if lr is None else lr, epochs=epochs,
                                   steps_per_epoch=steps_per_epoch, **self.settings())
        except ValueError as error:
            raise ValueError(f"{{sampler}} {self.sampler}: {error}") from None

    def settings(self) -> dict:
        """The sampler's settings: its defaults with the fields that are set."""
        return sampler_options(self.sampler, friction=self.friction, cycles=self.cycles,
                               exploration=self.exploration, temperature=self.temperature)

    def train(self, model, guide, x, y, *, epochs=10, seed=0, precision="fp32", make_member=None,
              **run) -> Posterior:
        self.check(model, epochs=epochs, rows=x.shape[0], **run)
        if self.chains > 1:  # one stacked network
            run = {k: v for k, v in run.items() if k not in ("checkpoint", "on_epoch_end", "progress")}
        options = self.fit_options(epochs, precision)
        del options["optimizer"]  # the sampler is the optimiser, at its step size per unit noise
        result = fit_sgmcmc(model, guide, x, y, lr=self.learning_rate * self.rate_factor(model, epochs),
                            **self.settings(), chains=self.chains, make_chain=make_member, epochs=epochs, seed=seed,
                            **options, **run)
        return EmpiricalPosterior(result, report={"sampler": self.sampler, **result.report()})

    @property
    def runs(self) -> int:
        return self.chains

    def rate_factor(self, model, epochs: int) -> float:
        """The sampler's step is SGD's: per unit noise whatever :attr:`optimizer` names (only its ``lr`` is read)."""
        return noise_factor(model)

    @property
    def replays_weights(self) -> str:
        return "its draws are the weights along the chain, replayed in one network"

    def collector(self, rows, epochs, optimizer, factor=1.0):
        return Recorded(self.sampler_of(epochs, math.ceil(rows / self.batch_size), self.learning_rate * factor))

    def stacked_posterior(self, pairs, rows, collected, x, seed, transform=None) -> Posterior:
        """The draws of the stacked chains ``rows``."""
        return EmpiricalPosterior(SGMCMCResult.of(pairs[rows[0]][0], collected).chains_of(rows))



@dataclass(frozen=True)
class TemperatureScaled(Method):
    r"""MAP with temperature scaling (Guo et al. 2017, "On calibration of modern neural networks"), the
    non-Bayesian fix of an over-confident classifier. The split: a fraction ``held_out`` of the training rows (at
    least :data:`MIN_HELD_OUT`), drawn with the run's seed, is held out and never trained on; MAP is fitted on the
    others (its settings are
    MAP's); one temperature :math:`T` minimises the NLL of :math:`\mathrm{softmax}(z / T)` on the held-out rows
    (:func:`~pyrobnn.analysis.calibration.calibrate`: a log grid over [0.01, 100] refined by Brent's method), and
    the posterior predicts at it (:class:`~pyrobnn.methods.posterior.TemperedPosterior`; the arg-max, hence the
    accuracy of the fit, kept). Classifiers only; a regression's analogue is ``--calibrate``."""

    held_out: float = 0.1

    def settings_rules(self) -> None:
        """The held-out fraction lies in (0, 1)."""
        super().settings_rules()
        in_range("{held_out} (the fraction of the training rows the temperature is fitted on)", self.held_out, 0, 1,
                 "()")

    def run_rules(self, model, epochs, rows, run) -> None:
        """A classifier's method (it scales logits), holding out at least :data:`MIN_HELD_OUT` rows and training on
        at least as many."""
        super().run_rules(model, epochs, rows, run)
        if model is not None and not isinstance(getattr(model, "likelihood", None), Categorical):
            raise ValueError("map-ts is a classifier's method (it scales a classifier's logits): train it on a "
                             "classification set; for a regression's predictive use --calibrate")
        if rows is not None and rows < 2 * MIN_HELD_OUT:
            raise ValueError(f"map-ts holds out at least {MIN_HELD_OUT} training rows to fit its temperature and "
                             f"trains on the others: give at least {2 * MIN_HELD_OUT} training rows, got {rows}")

    def held_out_rows(self, rows: int) -> int:
        """The rows the temperature is fitted on: the fraction :attr:`held_out` of ``rows``, at least
        :data:`MIN_HELD_OUT`."""
        return max(MIN_HELD_OUT, int(self.held_out * rows))

    def train(self, model, guide, x, y, *, epochs=10, seed=0, precision="fp32", make_member=None,
              **run) -> Posterior:
        self.check(model, epochs=epochs, rows=x.shape[0], **run)
        n = len(x)
        rows = self.held_out_rows(n)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        held, kept = order[:rows].sort().values, order[rows:].sort().values
        history = fit(model, guide, x[kept], y[kept], epochs=epochs, seed=seed,
                      **self.fit_options(epochs, precision), **run)
        transform = run.get("transform")
        x_held = x[held] if transform is None else getattr(transform, "normalize", transform)(x[held])
        temperature = calibrate(model, guide, x_held, y[held], num_samples=1).temperature
        return TemperedPosterior(model, guide, self.num_samples, temperature=temperature, history=history,
                                 report={"temperature": temperature, "held_out_rows": rows})

    def train_stacked(self, pairs, x, y, *, epochs=10, seed=0, precision="fp32", transform=None,
                      **run) -> list[Posterior]:
        """Each pair trained alone (each holds out its rows and fits its own temperature)."""
        return [self.train(model, guide, x, y, epochs=epochs, seed=seed, precision=precision, progress=False,
                           transform=transform, **run) for model, guide in pairs]
