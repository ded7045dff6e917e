"""Metrics of a posterior predictive on held-out data, and validation during training as a callback."""

from __future__ import annotations

import torch

from pyrobnn.analysis.metrics import classification_metrics, mixture_log_likelihood, regression_metrics
from pyrobnn.checks import positive_int
from pyrobnn.handlers.moments import Moments
from pyrobnn.infer.predict import PROTOTYPE_ROWS, predict, predict_moments, predictive_outputs
from pyrobnn.model.protocol import network_model

__all__ = ["evaluate", "Validation"]


@torch.no_grad()  # metrics only: a learned noise scale would otherwise build a graph through them
def evaluate(model, guide, x: torch.Tensor, y: torch.Tensor, num_samples: int = 100,
             batch_size: int = 1000, mc_dropout: bool = False, vectorized: bool | None = None,
             moments: bool = False, max_memory: int | None = None, progress: bool = False,
             target_scale: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, float]:
    """Metrics of the posterior predictive: accuracy, NLL, ECE, Brier (classification) or RMSE, NLL, MAE of its
    mean and standard deviation and ``log_likelihood``, the mean log density of the predictive mixture
    (:func:`~pyrobnn.analysis.metrics.mixture_log_likelihood`; under VDP++ of its one Gaussian).

    ``moments=True`` predicts by VDP++ moment propagation (:func:`predict_moments`) instead of sampling;
    ``max_memory`` and ``progress`` are :func:`~pyrobnn.infer.predict.predict`'s. ``target_scale=(mean, std)``:
    the model predicts targets standardised as ``(y - mean) / std``; predictions and ``y`` are mapped back, so
    regression metrics are in the target's original units (an RMSE times ``std``, a log density minus
    ``log std``).
    """
    model = network_model(model, x[:PROTOTYPE_ROWS])
    regression = model.task != "classification"
    if moments:
        pred = predict_moments(model, guide, x, batch_size)
        if regression:  # the likelihood adds its noise to the propagated variance
            observation = model.likelihood.moment_distribution(Moments(pred["mean"], pred["var"]))
            pred = {"mean": observation.mean, "std": observation.stddev}
            means, scales = pred["mean"][None], pred["std"][None]
    elif regression:
        outputs = predictive_outputs(model, guide, x, num_samples, batch_size, mc_dropout, vectorized, max_memory,
                                     progress)
        pred, (means, scales) = model.likelihood.predictive(outputs), model.likelihood.mean_scale(outputs)
    else:
        pred = predict(model, guide, x, num_samples, batch_size, mc_dropout, vectorized, max_memory, progress)
    y = y.to(next(iter(pred.values())).device)
    if regression and y.dim() == pred["mean"].dim() - 1 and pred["mean"].shape[-1] == 1:
        y = y.unsqueeze(-1)  # one target per example, (N,), of a network with one output (N, 1)
    if not regression:
        return classification_metrics(pred["probs"], y)
    if target_scale is not None:
        loc, scale = (t.to(y.device) for t in target_scale)
        y, means, scales = loc + scale * y, loc + scale * means, scale * scales
        pred = {"mean": loc + scale * pred["mean"], "std": scale * pred["std"]}
    metrics = regression_metrics(pred["mean"], pred["std"], y)
    if y.dim() == 1:  # one target per example, (N,): the mixture's single output dimension
        y, means, scales = y[:, None], means[..., None], scales.expand_as(means)[..., None]
    return {**metrics, "log_likelihood": mixture_log_likelihood(means, scales, y)}


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
