"""Monte-Carlo posterior predictive: S weight samples from the guide, one network pass each."""

from __future__ import annotations

import contextlib

import torch
from pyro import poutine
from torch import nn

from .device import device_of

__all__ = ["predict", "predictive_outputs", "evaluate", "prediction_mode"]


@contextlib.contextmanager
def prediction_mode(model: nn.Module, mc_dropout: bool = False):
    """Eval mode (BatchNorm running statistics, dropout off) for the duration, restored afterwards.

    ``mc_dropout=True`` keeps dropout layers sampling (Gal & Ghahramani 2016).
    """
    was_training = [m.training for m in model.modules()]
    model.eval()
    if mc_dropout:
        for m in model.modules():
            if isinstance(m, nn.modules.dropout._DropoutNd):
                m.train()
    try:
        yield model
    finally:
        for m, mode in zip(model.modules(), was_training):
            m.training = mode


@torch.no_grad()
def predictive_outputs(model, guide, x: torch.Tensor, num_samples: int = 100, batch_size: int = 1000,
                       mc_dropout: bool = False) -> torch.Tensor:
    """Network outputs under ``num_samples`` posterior draws, shape ``(S, N, ...)``.

    Each draw ``w_s ~ q`` is shared by all chunks of ``batch_size`` inputs.
    """
    if not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    x = x.to(device_of(guide, model))
    model.check_input(x)
    outputs = []
    with prediction_mode(model, mc_dropout):
        for _ in range(num_samples):
            guide_trace = poutine.trace(guide).get_trace()
            net = poutine.replay(model.net, trace=guide_trace)
            outputs.append(torch.cat([net(chunk) for chunk in x.split(batch_size)]))
    return torch.stack(outputs)


def predict(model, guide, x: torch.Tensor, num_samples: int = 100, batch_size: int = 1000,
            mc_dropout: bool = False) -> dict[str, torch.Tensor]:
    """Posterior predictive summaries.

    Classification: ``probs`` (predictive mean), ``total`` (predictive entropy),
    ``aleatoric`` (expected entropy), ``epistemic`` (mutual information).
    Regression: ``mean``, ``std`` (total), ``epistemic_std``, ``aleatoric_std``.
    """
    outputs = predictive_outputs(model, guide, x, num_samples, batch_size, mc_dropout)
    return model.likelihood.predictive(outputs)


def evaluate(model, guide, x: torch.Tensor, y: torch.Tensor, num_samples: int = 100,
             batch_size: int = 1000, mc_dropout: bool = False) -> dict[str, float]:
    """Metrics of the posterior predictive: accuracy, NLL, ECE, Brier (classification) or RMSE, NLL."""
    from .metrics import classification_metrics, regression_metrics

    pred = predict(model, guide, x, num_samples, batch_size, mc_dropout)
    y = y.to(next(iter(pred.values())).device)
    if model.task == "classification":
        return classification_metrics(pred["probs"], y)
    return regression_metrics(pred["mean"], pred["std"], y)
