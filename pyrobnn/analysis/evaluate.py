"""Metrics of a posterior predictive on held-out data, and validation during training as a callback."""

from __future__ import annotations

import torch

from pyrobnn.analysis.metrics import classification_metrics, regression_metrics
from pyrobnn.checks import positive_int
from pyrobnn.handlers.moments import Moments
from pyrobnn.infer.predict import predict, predict_moments

__all__ = ["evaluate", "Validation"]


def evaluate(model, guide, x: torch.Tensor, y: torch.Tensor, num_samples: int = 100,
             batch_size: int = 1000, mc_dropout: bool = False, vectorized: bool | None = None,
             moments: bool = False, max_memory: int | None = None, progress: bool = False) -> dict[str, float]:
    """Metrics of the posterior predictive: accuracy, NLL, ECE, Brier (classification) or RMSE, NLL.

    ``moments=True`` predicts by VDP++ moment propagation (:func:`predict_moments`) instead of sampling;
    ``max_memory`` and ``progress`` are :func:`~pyrobnn.infer.predict.predict`'s.
    """
    if moments:
        pred = predict_moments(model, guide, x, batch_size)
        if model.task != "classification":  # the likelihood adds its noise to the propagated variance
            observation = model.likelihood.moment_distribution(Moments(pred["mean"], pred["var"]))
            pred = {"mean": observation.mean, "std": observation.stddev}
    else:
        pred = predict(model, guide, x, num_samples, batch_size, mc_dropout, vectorized, max_memory, progress)
    y = y.to(next(iter(pred.values())).device)
    if model.task == "classification":
        return classification_metrics(pred["probs"], y)
    return regression_metrics(pred["mean"], pred["std"], y)


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
