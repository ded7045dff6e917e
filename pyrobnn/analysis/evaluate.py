"""Metrics of a posterior predictive on held-out data, and validation during training as a callback."""

from __future__ import annotations

import math

import torch

from pyrobnn.analysis.calibration import Calibrator, Mixture, predicted
from pyrobnn.analysis.metrics import classification_metrics, mixture_log_likelihood, regression_metrics
from pyrobnn.checks import positive_int
from pyrobnn.infer.predict import PROTOTYPE_ROWS
from pyrobnn.model.protocol import network_model

__all__ = ["evaluate", "scores", "monte_carlo_error", "Validation"]


@torch.no_grad()  # metrics only: a learned noise scale would otherwise build a graph through them
def evaluate(model, guide, x: torch.Tensor, y: torch.Tensor, num_samples: int = 100,
             batch_size: int = 1000, mc_dropout: bool = False, vectorized: bool | None = None,
             moments: bool = False, max_memory: int | None = None, progress: bool = False,
             target_scale: tuple[torch.Tensor, torch.Tensor] | None = None,
             calibration: Calibrator | None = None, mc_error: bool = False) -> dict[str, float]:
    """Metrics of the posterior predictive on ``(x, y)``: accuracy, NLL, ECE and Brier score, or RMSE, NLL and MAE.

    Classification: ``accuracy``, ``nll``, ``ece`` and ``brier`` of the predictive mean. Regression: ``rmse``,
    ``nll`` and ``mae`` of its mean and standard deviation and ``log_likelihood``, the mean log density of the
    predictive mixture (:func:`~pyrobnn.analysis.metrics.mixture_log_likelihood`; under VDP++ of its one Gaussian).

    :param model: a model of a network (:class:`~pyrobnn.BayesianNetwork`, or a Pyro model written by hand).
    :param guide: its guide.
    :param x: the inputs.
    :param y: their targets (class indices, or values shaped as the model observes them).
    :param num_samples: S, the posterior draws averaged (:func:`~pyrobnn.infer.predict.predict`).
    :param batch_size: the most inputs in one pass of the network.
    :param mc_dropout: keep the network's own dropout layers sampling.
    :param vectorized: as :func:`~pyrobnn.infer.predict.predict`'s.
    :param moments: predict by VDP++ moment propagation (:func:`~pyrobnn.infer.predict.predict_moments`) instead of
        sampling.
    :param max_memory: the most bytes one pass may hold, as :func:`~pyrobnn.infer.predict.predict`'s.
    :param progress: show a progress bar over the passes.
    :param target_scale: ``(mean, std)``: the model predicts targets standardised as ``(y - mean) / std``;
        predictions and ``y`` are mapped back, so regression metrics are in the target's original units (an RMSE
        times ``std``, a log density minus ``log std``).
    :param calibration: a :class:`~pyrobnn.analysis.calibration.Calibrator` fitted on held-out rows
        (:func:`~pyrobnn.analysis.calibration.calibrate`): adds the calibrated metrics of the same predictions
        (:meth:`~pyrobnn.analysis.calibration.Calibrator.report`: ``nll_calibrated``, ``ece_calibrated``,
        ``temperature``, ``conformal_coverage``, ...).
    :param mc_error: also ``"mc_error"``: the metrics' Monte-Carlo standard errors (:func:`monte_carlo_error`).
    :returns: ``{metric: float}``.

    Example: the accuracy is that of the predictive mean of the same draws.

    >>> import pyro, torch
    >>> from torch import nn
    >>> from pyrobnn import BayesianNetwork, NormalGuide, evaluate, predict
    >>> pyro.clear_param_store(); pyro.set_rng_seed(0)
    >>> model = BayesianNetwork(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)), num_data=32)
    >>> guide = NormalGuide(model, init_rho=-2.0)
    >>> x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
    >>> pyro.set_rng_seed(1); metrics = evaluate(model, guide, x, y, num_samples=10)
    >>> sorted(metrics)
    ['accuracy', 'brier', 'ece', 'nll']
    >>> pyro.set_rng_seed(1); probs = predict(model, guide, x, num_samples=10)["probs"]
    >>> metrics["accuracy"] == (probs.argmax(-1) == y).float().mean().item()
    True
    >>> abs(metrics["nll"] + probs[torch.arange(32), y].log().mean().item()) < 1e-5
    True
    """
    model = network_model(model, x[:PROTOTYPE_ROWS])
    pred, mixture = predicted(model, guide, x, num_samples, batch_size, mc_dropout, vectorized, moments, max_memory,
                              progress)
    return scores(model.task, pred, mixture, y, target_scale, calibration, mc_error)


@torch.no_grad()
def scores(task: str, pred: dict, mixture, y: torch.Tensor, target_scale=None, calibration=None,
           mc_error: bool = False) -> dict[str, float]:
    """:func:`evaluate`'s metrics of a predictive already computed on the inputs of ``y``: its summaries ``pred`` and
    its :class:`~pyrobnn.analysis.calibration.Mixture` (:func:`~pyrobnn.analysis.calibration.predicted`, or a
    posterior's own: :meth:`pyrobnn.methods.Posterior.predicted`), for a model of ``task``."""
    y = mixture.targets(y)
    if task == "classification":
        metrics = classification_metrics(pred["probs"], y)
    else:
        if target_scale is not None:
            loc, scale = (t.to(y.device) for t in target_scale)
            y, mixture = loc + scale * y, mixture.affine(loc, scale)
            pred = {"mean": loc + scale * pred["mean"], "std": scale * pred["std"]}
        means = mixture.means.reshape(*mixture.means.shape[:2], -1)  # (S, N, D): one target per example is D = 1
        metrics = {**regression_metrics(pred["mean"], pred["std"], y),
                   "log_likelihood": mixture_log_likelihood(means, mixture.scales.reshape(means.shape),
                                                            y.reshape(means.shape[1:]))}
    if calibration is not None:
        metrics.update(calibration.report(mixture, y))
    if mc_error:
        metrics["mc_error"] = monte_carlo_error(mixture, y)
    return metrics


def _metrics(mixture: Mixture, y: torch.Tensor) -> dict[str, float]:
    if mixture.task == "classification":
        return classification_metrics(mixture.probs(), y)
    means = mixture.means.reshape(*mixture.means.shape[:2], -1)
    return {**regression_metrics(*mixture.moments(), y),
            "log_likelihood": mixture_log_likelihood(means, mixture.scales.reshape(means.shape),
                                                     y.reshape(means.shape[1:]))}


@torch.no_grad()
def monte_carlo_error(mixture: Mixture, y: torch.Tensor) -> dict[str, float]:
    r"""The Monte-Carlo standard error of each metric of the S-draw predictive ``mixture``
    (:class:`~pyrobnn.analysis.calibration.Mixture`) against ``y``, from its two halves.

    The estimates :math:`m_1, m_2` of a metric from draws :math:`1..S/2` and :math:`S/2+1..S` each have twice the
    variance :math:`\sigma^2` of the S-draw estimate, so :math:`m_1 - m_2 \sim \mathcal N(0, 4\sigma^2)` and
    :math:`\sqrt{\pi/8}\,|m_1 - m_2|` estimates :math:`\sigma` (one degree of freedom: its order of magnitude, not a
    figure to two digits). The metrics are :func:`~pyrobnn.analysis.metrics.classification_metrics`' (accuracy, NLL,
    ECE, Brier) or a regression's RMSE, NLL, MAE and log-likelihood; ``{}`` below two draws (a point estimate, VDP++'s
    moments), whose metrics have no Monte-Carlo error.

    Example: a predictive whose draws agree has none; one whose draws disagree has some.

    >>> import torch
    >>> from pyrobnn.analysis.calibration import Mixture
    >>> from pyrobnn.analysis.evaluate import monte_carlo_error
    >>> y = torch.tensor([0, 1, 1, 0])
    >>> same = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.3, 0.7], [0.6, 0.4]]).log().expand(4, 4, 2)
    >>> monte_carlo_error(Mixture(log_probs=same), y)["nll"]
    0.0
    >>> spread = torch.stack([same[0], same[0], same[0].flip(-1), same[0].flip(-1)])
    >>> monte_carlo_error(Mixture(log_probs=spread), y)["accuracy"] > 0
    True
    """
    draws = (mixture.log_probs if mixture.log_probs is not None else mixture.means).shape[0]
    if draws < 2:
        return {}
    half = draws // 2
    parts = [Mixture(*(None if t is None else t[rows] for t in (mixture.log_probs, mixture.means, mixture.scales)))
             for rows in (slice(0, half), slice(draws - half, draws))]
    y = mixture.targets(y)
    first, second = (_metrics(part, y) for part in parts)
    return {name: math.sqrt(math.pi / 8) * abs(first[name] - second[name]) for name in first}


class Validation:
    """An ``on_epoch_end`` callback of :func:`~pyrobnn.infer.svi.fit`: :func:`evaluate` on ``(x, y)`` after each
    epoch with ``num_samples`` Monte-Carlo samples, recorded as ``val_<metric>`` (``val_accuracy``, ``val_nll``,
    ...). ``fit`` hands it the model and guide it trains (:meth:`setup`), which checks the inputs once."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, num_samples: int = 10):
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"validation data: x has {x.shape[0]} examples but y has {y.shape[0]}")
        self.x, self.y = x, y
        self.num_samples = positive_int("num_samples (validation)", num_samples)
        self.model = self.guide = None

    def setup(self, model, guide) -> None:
        """Bind the model and guide being trained, and check the validation inputs against the model."""
        try:
            model.check_input(self.x[:1])
        except ValueError as error:
            raise ValueError(f"validation data: {error}") from None
        self.model, self.guide = model, guide

    def __call__(self, epoch: int, record: dict) -> None:
        if self.model is None:
            raise RuntimeError("Validation.setup(model, guide) was not called: pass the callback to fit(on_epoch_end=)")
        metrics = evaluate(self.model, self.guide, self.x, self.y, num_samples=self.num_samples)
        record.update({f"val_{k}": v for k, v in metrics.items()})
