r"""Post-hoc calibration of any method's posterior predictive on held-out data: temperature scaling and split
conformal prediction.

The predictive of every method is a :class:`Mixture` of S equally weighted components per example (S weight draws
of a variational guide, MC dropout masks, the members of an ensemble, Laplace or NUTS draws; one component for a
point estimate or VDP++ moments), read from one set of draws by :func:`predicted`. A :class:`Calibrator` is fitted
on held-out rows (never trained on) and applied at prediction time, sklearn-style::

    calibrator = calibrate(model, guide, x_val, y_val, num_samples=100)     # or Calibrator().fit(mixture, y_val)
    metrics = evaluate(model, guide, x_test, y_test, calibration=calibrator)  # raw and calibrated metrics
    probs = calibrator(predicted(model, guide, x_test)[1]).probs()          # the calibrated predictive

**Temperature scaling** (Guo et al. 2017, "On calibration of modern neural networks"): one temperature
:math:`T > 0` divides every component's logits, :math:`p(y \mid x) = \frac1S \sum_s \mathrm{softmax}(z_s / T)_y`,
with :math:`T` minimising the NLL of this predictive on the held-out rows; the arg-max of each component is kept.
The test log-likelihood after it is the *calibrated log-likelihood* of Ashukha et al. 2020 ("Pitfalls of
in-domain uncertainty estimation and ensembling in deep learning"), the fair way to compare methods' likelihoods
(they find the temperature by cross-validation over halves of the test set; here it is fitted on held-out training
rows, which the test set never informs). **Regression**: the analogue is a
factor :math:`T` on the predictive standard deviation. The predictive is mapped by :math:`y \mapsto \bar\mu +
T (y - \bar\mu)` about its mean :math:`\bar\mu`: each component becomes :math:`\mathcal N(\bar\mu + T(\mu_s -
\bar\mu), T^2\sigma_s^2)`, so the mean is kept and the total standard deviation (epistemic spread and noise alike)
is multiplied by exactly :math:`T`. It is fitted by the NLL of the mixture, as for classification. Chosen over
tempering the noise alone because it also corrects an over- or under-dispersed ensemble, whose spread the noise
cannot shrink; for one Gaussian (MAP, VDP++) it is the σ scaling of Levi et al. 2019 ("Evaluating and calibrating
uncertainty prediction in regression tasks"), with the closed form :math:`T^2 = \overline{(y - \mu)^2 / \sigma^2}`.
The temperature is searched on a log grid over [0.01, 100] that holds :math:`T = 1`, refined by Brent's bounded
method, so its NLL on the rows it is fitted on is never worse than the uncalibrated one.

**Split conformal prediction** (Vovk, Gammerman & Shafer 2005; Papadopoulos et al. 2002; Angelopoulos & Bates 2021,
"A gentle introduction to conformal prediction"): with conformity scores :math:`s_i` of the n held-out rows, the
threshold :math:`\hat q` is their :math:`\lceil (n+1)(1-\alpha) \rceil`-th smallest, and a new example's set or
interval holds the labels whose score is at most :math:`\hat q`; when the held-out and test rows are exchangeable
it covers the true label with probability at least :math:`1 - \alpha` (at most :math:`1 - \alpha + 1/(n+1)` without
ties), whatever the predictor. Scores:

* classification, :math:`s = 1 - \hat p(y \mid x)` (Sadinle, Lei & Wasserman 2019, "Least ambiguous set-valued
  classifiers"): the sets :math:`\{c: \hat p_c \ge 1 - \hat q\}` are the smallest on average among sets of that
  coverage when :math:`\hat p` is the true conditional, and need no randomisation; APS (Romano et al. 2020) spreads
  coverage more evenly over hard and easy inputs but gives larger sets and needs randomisation for exact coverage;
* regression, :math:`s = \max_d |y_d - \mu_d| / \sigma_d` with the predictive mean and standard deviation (the
  normalised residual of Papadopoulos et al. 2008 and Lei et al. 2018): intervals :math:`\mu \pm \hat q \sigma`,
  wide where the predictive is uncertain, rather than of one width everywhere.

The scores are those of the raw predictive, not the tempered one, so that the score function does not depend on
the held-out rows and the guarantee is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from pyrobnn.analysis.metrics import ece, mixture_log_likelihood, nll, regression_metrics
from pyrobnn.checks import check_labels, in_range
from pyrobnn.handlers.moments import Moments
from pyrobnn.infer.predict import PROTOTYPE_ROWS, predict_moments, predictive_outputs
from pyrobnn.model.protocol import network_model

__all__ = ["Mixture", "Calibrator", "predicted", "calibrate", "TEMPERATURE_BOUNDS", "minimum_rows"]

TEMPERATURE_BOUNDS = (1e-2, 1e2)
"""The temperatures searched (a log grid of 16 steps either side of 1, then Brent's method)."""

_GRID_STEPS = 16


@dataclass(frozen=True)
class Mixture:
    """A posterior predictive as S equally weighted components per example: a classifier's log class probabilities
    ``log_probs`` (S, N, C), or a regression's Gaussian ``means`` and ``scales`` (S, N, ...), one per target."""

    log_probs: Optional[torch.Tensor] = None
    means: Optional[torch.Tensor] = None
    scales: Optional[torch.Tensor] = None

    @property
    def task(self) -> str:
        return "classification" if self.log_probs is not None else "regression"

    def __len__(self) -> int:
        """The number of examples N."""
        return (self.log_probs if self.log_probs is not None else self.means).shape[1]

    def to(self, *args) -> "Mixture":
        """The mixture's tensors moved or cast (``.to(torch.float64)``)."""
        return Mixture(*(None if t is None else t.to(*args) for t in (self.log_probs, self.means, self.scales)))

    def tempered(self, temperature: float) -> "Mixture":
        """Each component's logits divided by ``temperature``; a regression's predictive scaled about its mean by it
        (means spread ``temperature`` times as far from their average, scales times ``temperature``)."""
        if self.log_probs is not None:
            return Mixture(log_probs=(self.log_probs / temperature).log_softmax(-1))
        centre = self.means.mean(0)
        return Mixture(means=centre + temperature * (self.means - centre), scales=temperature * self.scales)

    def affine(self, loc: torch.Tensor, scale: torch.Tensor) -> "Mixture":
        """A regression's predictive of ``loc + scale * y`` (standardised targets back in their original units)."""
        return Mixture(means=loc + scale * self.means, scales=scale * self.scales)

    def probs(self) -> torch.Tensor:
        """A classifier's predictive probabilities (N, C): the mean of the components'."""
        return self.log_probs.exp().mean(0)

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A regression's predictive mean and standard deviation (N, ...): the variance of the means plus the mean
        noise variance."""
        return self.means.mean(0), (self.means.var(0, unbiased=False) + self.scales.pow(2).mean(0)).sqrt()

    def targets(self, y: torch.Tensor) -> torch.Tensor:
        """``y`` checked against the mixture and on its device: labels (N,), or targets of the means' shape (a
        network with one output, (N, 1), also takes (N,))."""
        y = y.to(self.log_probs.device if self.log_probs is not None else self.means.device)
        if self.log_probs is not None:
            check_labels(y, self.log_probs.shape[-1], "y", num_examples=len(self))
            return y
        shape = self.means.shape[1:]
        if y.dim() == len(shape) - 1 and shape[-1] == 1:
            y = y.unsqueeze(-1)
        if y.shape != shape:
            raise ValueError(f"y must have shape {tuple(shape)} (the predictive's means), got {tuple(y.shape)}")
        return y.to(self.means.dtype)

    def log_likelihood(self, y: torch.Tensor) -> torch.Tensor:
        """Each example's log density under the mixture, (N,) (a regression's summed over its targets)."""
        num = math.log(self.log_probs.shape[0] if self.log_probs is not None else self.means.shape[0])
        if self.log_probs is not None:
            index = y.long().view(1, -1, 1).expand(self.log_probs.shape[0], -1, 1)
            return self.log_probs.gather(-1, index)[..., 0].logsumexp(0) - num
        density = -0.5 * ((y - self.means) / self.scales).pow(2) - self.scales.log() - 0.5 * math.log(2 * math.pi)
        return density.reshape(*density.shape[:2], -1).sum(-1).logsumexp(0) - num

    def scores(self, y: torch.Tensor) -> torch.Tensor:
        """Conformity scores (N,), larger for a worse fit: :math:`1 - \\hat p(y)`, or :math:`\\max_d |y_d - \\mu_d|
        / \\sigma_d` with the predictive mean and standard deviation."""
        if self.log_probs is not None:
            return 1 - self.probs().gather(-1, y.long()[:, None])[:, 0]
        mean, std = self.moments()
        return ((y - mean).abs() / std).reshape(len(self), -1).amax(-1)


def minimum_rows(coverage: float) -> int:
    """The fewest calibration rows n for which split conformal prediction at ``coverage`` has a finite threshold:
    :math:`\\lceil (n+1)\\, \\mathrm{coverage} \\rceil \\le n`, i.e. :math:`n \\ge \\mathrm{coverage} / (1 -
    \\mathrm{coverage})` (9 at 90 %)."""
    return math.ceil(coverage / (1 - coverage) - 1e-9)


def _check_rows(n: int, coverage: float) -> None:
    needed = minimum_rows(coverage)
    if n < needed:
        raise ValueError(f"calibration needs at least {needed} held-out rows for conformal sets of coverage "
                         f"{coverage:g} (the ceil((n+1) coverage)-th smallest score of n rows), got {n}")


class Calibrator:
    """Temperature scaling and split conformal prediction of a posterior predictive, fitted on held-out rows by
    :meth:`fit` and applied by calling it (the module's docstring gives the choices and their reasons).

    :param coverage: the nominal coverage :math:`1 - \\alpha` of the conformal sets and intervals, in (0, 1).

    After :meth:`fit`: ``temperature`` (a factor on the standard deviation for a regression), ``threshold`` (the
    conformal quantile of the scores), ``num_rows`` (the rows it was fitted on) and ``task``.
    """

    def __init__(self, coverage: float = 0.9):
        self.coverage = in_range("coverage (of the conformal sets)", coverage, 0, 1, "()")
        self.temperature: Optional[float] = None
        self.threshold: Optional[float] = None
        self.num_rows: Optional[int] = None
        self.task: Optional[str] = None

    def fit(self, mixture: Mixture, y: torch.Tensor) -> "Calibrator":
        """Fit the temperature by the NLL of ``mixture`` (the raw predictive of the held-out rows) against ``y``,
        and the conformal threshold on its scores; returns ``self``. Fewer rows than :func:`minimum_rows` give no
        finite threshold: a ``ValueError``."""
        n = len(mixture)
        _check_rows(n, self.coverage)
        y = mixture.targets(y)
        high = mixture.to(torch.float64)
        self.temperature = _fit_temperature(high, y)
        scores = high.scores(y).sort().values
        self.threshold = float(scores[math.ceil((n + 1) * self.coverage - 1e-9) - 1])
        self.num_rows, self.task = n, mixture.task
        return self

    def _check(self, mixture: Mixture) -> None:
        if self.temperature is None:
            raise RuntimeError("the Calibrator is not fitted: call fit(mixture, y) on held-out rows first")
        if mixture.task != self.task:
            raise ValueError(f"the Calibrator was fitted on a {self.task} predictive, got a {mixture.task} one")

    def __call__(self, mixture: Mixture) -> Mixture:
        """The calibrated predictive: ``mixture`` at the fitted temperature."""
        self._check(mixture)
        return mixture.tempered(self.temperature)

    def prediction_sets(self, mixture: Mixture) -> torch.Tensor:
        """A classifier's conformal prediction sets as a mask (N, C): the classes whose score :math:`1 - \\hat p_c`
        is at most the threshold."""
        self._check(mixture)
        if mixture.task != "classification":
            raise ValueError("prediction_sets are a classifier's; a regression has prediction_intervals")
        return 1 - mixture.probs() <= self.threshold

    def prediction_intervals(self, mixture: Mixture) -> tuple[torch.Tensor, torch.Tensor]:
        """A regression's conformal intervals ``(lower, upper)``: the predictive mean ∓ threshold x its standard
        deviation, per target."""
        self._check(mixture)
        if mixture.task != "regression":
            raise ValueError("prediction_intervals are a regression's; a classifier has prediction_sets")
        mean, std = mixture.moments()
        return mean - self.threshold * std, mean + self.threshold * std

    def report(self, mixture: Mixture, y: torch.Tensor) -> dict[str, float]:
        """The calibrated metrics of ``mixture`` (a raw predictive) against ``y``: ``nll_calibrated`` and
        ``ece_calibrated`` (classification) or ``nll_calibrated`` (of the moment-matched Gaussian) and
        ``log_likelihood_calibrated`` (of the mixture; regression), the ``temperature``, and the conformal
        ``conformal_coverage`` with ``conformal_set_size`` (classes per set) or ``conformal_width`` (mean interval
        width, in the units of ``y``)."""
        y = mixture.targets(y)
        calibrated = self(mixture)
        found = {}
        if mixture.task == "classification":
            probs = calibrated.probs()
            sets = self.prediction_sets(mixture)
            found.update(nll_calibrated=nll(probs, y), ece_calibrated=ece(probs, y), temperature=self.temperature,
                         conformal_coverage=float(sets.gather(-1, y.long()[:, None]).float().mean()),
                         conformal_set_size=float(sets.sum(-1).float().mean()))
            return found
        mean, std = calibrated.moments()
        lower, upper = self.prediction_intervals(mixture)
        inside = ((lower <= y) & (y <= upper)).reshape(len(mixture), -1).all(-1)
        flat = calibrated.means.reshape(*calibrated.means.shape[:2], -1)
        return {"nll_calibrated": regression_metrics(mean, std, y)["nll"],
                "log_likelihood_calibrated": mixture_log_likelihood(
                    flat, calibrated.scales.reshape(flat.shape), y.reshape(flat.shape[1:])),
                "temperature": self.temperature, "conformal_coverage": float(inside.float().mean()),
                "conformal_width": float((upper - lower).mean())}


def _fit_temperature(mixture: Mixture, y: torch.Tensor) -> float:
    r"""The temperature of least NLL of ``mixture`` against ``y`` within :data:`TEMPERATURE_BOUNDS`: the best of a
    log grid that holds 1, refined by Brent's bounded method between its neighbours; for one Gaussian, its closed
    form :math:`T^2 = \overline{z^2}`."""
    from scipy.optimize import minimize_scalar

    if mixture.means is not None and mixture.means.shape[0] == 1:
        z = (y - mixture.means[0]) / mixture.scales[0]
        return min(max(float(z.pow(2).mean().sqrt()), TEMPERATURE_BOUNDS[0]), TEMPERATURE_BOUNDS[1])

    def objective(log_t: float) -> float:
        return -float(mixture.tempered(math.exp(log_t)).log_likelihood(y).mean())

    low, high = (math.log(bound) for bound in TEMPERATURE_BOUNDS)
    step = (high - low) / (2 * _GRID_STEPS)
    grid = [i * step for i in range(-_GRID_STEPS, _GRID_STEPS + 1)]  # 0.0 (T = 1) exactly in the middle
    values = [objective(v) for v in grid]
    best = min(range(len(grid)), key=values.__getitem__)
    bracket = (grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)])
    refined = minimize_scalar(objective, bounds=bracket, method="bounded", options={"xatol": 1e-6})
    return math.exp(refined.x if refined.fun < values[best] else grid[best])


@torch.no_grad()
def predicted(model, guide, x: torch.Tensor, num_samples: int = 100, batch_size: int = 1000,
              mc_dropout: bool = False, vectorized: Optional[bool] = None, moments: bool = False,
              max_memory: Optional[int] = None, progress: bool = False) -> tuple[dict, Mixture]:
    """From one set of posterior draws on ``x``: :func:`~pyrobnn.infer.predict.predict`'s summaries (under
    ``moments``, :func:`~pyrobnn.infer.predict.predict_moments`'s; for a regression ``mean`` and ``std`` of its
    observation) and the predictive as a :class:`Mixture` (one component under ``moments``). The other arguments
    are :func:`~pyrobnn.infer.predict.predictive_outputs`'."""
    model = network_model(model, x[:PROTOTYPE_ROWS])
    likelihood = model.likelihood
    if moments:
        pred = predict_moments(model, guide, x, batch_size)
        if model.task == "classification":
            tiny = torch.finfo(pred["probs"].dtype).tiny
            return pred, Mixture(log_probs=pred["probs"].clamp_min(tiny).log()[None])
        observation = likelihood.moment_distribution(Moments(pred["mean"], pred["var"]))
        pred = {"mean": observation.mean, "std": observation.stddev}
        return pred, Mixture(means=pred["mean"][None], scales=pred["std"][None])
    outputs = predictive_outputs(model, guide, x, num_samples, batch_size, mc_dropout, vectorized, max_memory,
                                 progress)
    pred = likelihood.predictive(outputs)
    if model.task == "classification":
        return pred, Mixture(log_probs=outputs.to(torch.promote_types(outputs.dtype, torch.float32)).log_softmax(-1))
    means, scales = likelihood.mean_scale(outputs)
    return pred, Mixture(means=means, scales=scales.expand_as(means))


def calibrate(model, guide, x: torch.Tensor, y: torch.Tensor, coverage: float = 0.9, num_samples: int = 100,
              **options) -> Calibrator:
    """A :class:`Calibrator` at ``coverage`` fitted on the held-out rows ``(x, y)``, which the model must not have
    been trained on; ``num_samples`` and ``options`` are :func:`predicted`'s (predict as the test set is
    predicted)."""
    calibrator = Calibrator(coverage)
    _check_rows(len(x), calibrator.coverage)  # before predicting: fit's error, sooner
    return calibrator.fit(predicted(model, guide, x, num_samples, **options)[1], y)
