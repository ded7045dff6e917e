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
from pyrobnn.checks import in_range, positive_int
from pyrobnn.infer.ensemble import EnsembleResult, fit_ensemble
from pyrobnn.infer.iterates import Recorded
from pyrobnn.infer.laplace import fit_laplace
from pyrobnn.infer.optim import Optim
from pyrobnn.infer.sgmcmc import SGMCMC as Sampler
from pyrobnn.infer.sgmcmc import SGMCMC_SAMPLERS, SGMCMCResult, fit_sgmcmc, sampler_options
from pyrobnn.infer.svi import fit
from pyrobnn.infer.swag import SWAG as SWAGCollector
from pyrobnn.infer.swag import SWAGResult, fit_swag, replicas, swa_schedule
from pyrobnn.methods.base import Method
from pyrobnn.methods.posterior import EmpiricalPosterior, Posterior, TemperedPosterior
from pyrobnn.methods.rules import swag_start

__all__ = ["Ensemble", "Laplace", "SWAG", "SGMCMC", "TemperatureScaled"]

MIN_HELD_OUT = 10
"""The fewest held-out rows a temperature is fitted on."""


@dataclass(frozen=True)
class Ensemble(Method):
    r"""A deep ensemble (Lakshminarayanan, Pritzel & Blundell 2017): ``members`` MAP fits from the initialisations
    of seeds seed..seed+M-1, each trained with its own seed, predicted as their uniform mixture
    :math:`\frac1M\sum_m p(y \mid x, w_m)` (:func:`~pyrobnn.infer.ensemble.fit_ensemble`)."""

    members: int = 5

    run_name: ClassVar[str] = "ensemble member"

    def __post_init__(self):
        super().__post_init__()
        positive_int("members (M, the ensemble's size)", self.members)

    def train(self, model, guide, x, y, *, epochs=10, seed=0, precision="fp32", make_member=None,
              **run) -> Posterior:
        result = fit_ensemble(model, guide, x, y, members=self.members, make_member=make_member, seed=seed,
                              epochs=epochs, **self.fit_options(epochs, precision), **run)
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

    def train(self, model, guide, x, y, *, epochs=10, seed=0, precision="fp32", make_member=None,
              **run) -> Posterior:
        history = fit(model, guide, x, y, epochs=epochs, seed=seed, **self.fit_options(epochs, precision), **run)
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
        result = fit_swag(model, guide, x, y, start=self.collection_start(epochs), rank=self.rank,
                          num_samples=self.num_samples, members=self.members, make_member=make_member,
                          epochs=epochs, seed=seed, **self.fit_options(epochs, precision), **run)
        return EmpiricalPosterior(result)

    @property
    def runs(self) -> int:
        return self.members

    @property
    def replays_weights(self) -> str:
        return f"its {self.members} SWAGs' draws are replayed in one network" if self.members > 1 else ""

    def collector(self, rows, epochs, optimizer):
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
    temperature: Optional[float] = None
    chains: int = 1

    restarts: ClassVar[str] = "SG-MCMC keeps its draws"

    run_name: ClassVar[str] = "chain"

    def __post_init__(self):
        super().__post_init__()
        if self.sampler not in SGMCMC_SAMPLERS:
            raise ValueError(f"sampler {self.sampler!r}: choose one of {', '.join(SGMCMC_SAMPLERS)}")
        positive_int("chains", self.chains)

    def settings(self) -> dict:
        """The sampler's settings: its defaults with the fields that are set."""
        return sampler_options(self.sampler, friction=self.friction, cycles=self.cycles,
                               exploration=self.exploration, temperature=self.temperature)

    def train(self, model, guide, x, y, *, epochs=10, seed=0, precision="fp32", make_member=None,
              **run) -> Posterior:
        if self.chains > 1:  # one stacked network
            run = {k: v for k, v in run.items() if k not in ("checkpoint", "on_epoch_end", "progress")}
        options = self.fit_options(epochs, precision)
        del options["optimizer"]  # the sampler is the optimiser
        result = fit_sgmcmc(model, guide, x, y, lr=self.learning_rate, **self.settings(), chains=self.chains,
                            make_chain=make_member, epochs=epochs, seed=seed, **options, **run)
        return EmpiricalPosterior(result, report={"sampler": self.sampler, **result.report()})

    @property
    def runs(self) -> int:
        return self.chains

    @property
    def replays_weights(self) -> str:
        return "its draws are the weights along the chain, replayed in one network"

    def collector(self, rows, epochs, optimizer):
        return Recorded(Sampler(self.learning_rate, epochs=epochs, steps_per_epoch=math.ceil(rows / self.batch_size),
                                **self.settings()))

    def stacked_posterior(self, pairs, rows, collected, x, seed, transform=None) -> Posterior:
        """The draws of the stacked chains ``rows``."""
        return EmpiricalPosterior(SGMCMCResult.of(pairs[rows[0]][0], collected).chains_of(rows))



@dataclass(frozen=True)
class TemperatureScaled(Method):
    r"""MAP with temperature scaling (Guo et al. 2017, "On calibration of modern neural networks"), the
    non-Bayesian fix of an over-confident classifier. The split: a fraction ``held_out`` of the training rows,
    drawn with the run's seed, is held out and never trained on; MAP is fitted on the others (its settings are
    MAP's); one temperature :math:`T` minimises the NLL of :math:`\mathrm{softmax}(z / T)` on the held-out rows
    (:func:`~pyrobnn.analysis.calibration.calibrate`: a log grid over [0.01, 100] refined by Brent's method), and
    the posterior predicts at it (:class:`~pyrobnn.methods.posterior.TemperedPosterior`; the arg-max, hence the
    accuracy of the fit, kept). Classifiers only; a regression's analogue is ``--calibrate``."""

    held_out: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        in_range("held_out (the fraction of the training rows the temperature is fitted on)", self.held_out, 0, 1,
                 "()")

    def train(self, model, guide, x, y, *, epochs=10, seed=0, precision="fp32", make_member=None,
              **run) -> Posterior:
        from pyrobnn.infer.predict import PROTOTYPE_ROWS
        from pyrobnn.model.protocol import network_model

        if network_model(model, x[:PROTOTYPE_ROWS]).task != "classification":
            raise ValueError("map-ts scales a classifier's logits: for a regression's predictive use --calibrate")
        n = len(x)
        rows = int(self.held_out * n)
        if rows < MIN_HELD_OUT or rows >= n:
            raise ValueError(f"held_out {self.held_out:g} of {n} training rows holds out {rows}: a temperature needs "
                             f"at least {MIN_HELD_OUT} and some rows left to train on; train on more rows or change "
                             "held_out")
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
