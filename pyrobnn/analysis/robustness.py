r"""Noise robustness of a trained classifier: the test of Dera, Rasool & Bouaynaya (2019), as run
for VDP++ ("Efficient Scaling of Bayesian Neural Networks", IEEE Access 2024, Fig. 1c and Fig. 3).

Zero-mean Gaussian noise is added to every test input at a signal-to-noise ratio (dB)

.. math::
    \tilde x_n = x_n + \epsilon_n, \quad \epsilon_n \sim \mathcal N(0, s_n^2 I), \quad
    s_n^2 = \frac{P_n}{10^{\mathrm{SNR}/10}}, \quad P_n = \frac{1}{D}\sum_{d=1}^{D} x_{nd}^2,

and, at each level, the test accuracy and the predictive variance of the predicted class,
:math:`\bar v = \frac1N \sum_n \mathrm{Var}[p_{n,\hat y_n}]`, :math:`\hat y_n = \arg\max_c
\mathbb E[p_{nc}]`, are recorded; the variance is normalised by its value at the lowest SNR
(-6 dB in the VDP++ experiments). A Bayesian network's variance should rise as the SNR falls,
and its accuracy at -6 dB exceed the deterministic network's.

A *predictor* is a callable ``x -> (probs, var)``: ``probs`` (N, C) predictive class
probabilities, ``var`` (N, C) the predictive variance of each class probability, or ``None``
for a deterministic network. :func:`deterministic_predictor`, :func:`sampling_predictor`
(Monte Carlo over the posterior) and :func:`moment_predictor` (VDP++ moment propagation) build one.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence, Tuple

import torch
from torch import nn

from pyrobnn.checks import check_labels, finite, positive_int
from pyrobnn.device import device_of
from pyrobnn.infer.predict import predict_moments, prediction_mode, predictive_outputs

__all__ = ["Predictor", "add_noise", "deterministic_predictor", "sampling_predictor", "moment_predictor",
           "noise_robustness"]

Predictor = Callable[[torch.Tensor], Tuple[torch.Tensor, Optional[torch.Tensor]]]

PAPER_SNR_DB = (-6, -3, 0, 3, 6, 10, 20, 30)


def add_noise(x: torch.Tensor, snr_db: float, generator: torch.Generator | None = None) -> torch.Tensor:
    r"""``x`` plus zero-mean Gaussian noise at ``snr_db`` dB per example (dimension 0).

    :math:`s_n^2 = P_n / 10^{\mathrm{SNR}/10}` with :math:`P_n` the mean of :math:`x_n^2` over the
    example's elements. No clipping. The noise is drawn on ``generator``'s device (CPU by
    default) and moved to ``x``'s, so a seeded CPU generator gives the same noise on any device.
    """
    snr_db = finite("snr_db", snr_db, "dB")
    _check_inputs(x)
    power = x.detach().pow(2).flatten(1).mean(1)
    std = (power / 10 ** (snr_db / 10)).sqrt().view(-1, *(1,) * (x.dim() - 1))
    device = generator.device if generator is not None else torch.device("cpu")
    noise = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=device).to(x.device)
    return x + std * noise


def deterministic_predictor(net: nn.Module, batch_size: int = 1000) -> Predictor:
    """Softmax of a plain network's outputs (eval mode, no gradients); the variance is ``None``."""
    batch_size = positive_int("batch_size", batch_size)

    @torch.no_grad()
    def predictor(x):
        x = x.to(device_of(net))
        with prediction_mode(net):
            logits = torch.cat([net(chunk) for chunk in x.split(batch_size)])
        return logits.softmax(-1), None

    return predictor


def sampling_predictor(model, guide, num_samples: int = 100, batch_size: int = 1000) -> Predictor:
    r"""Monte Carlo over :math:`q(w)` (:func:`~pyrobnn.infer.predict.predictive_outputs`): with
    :math:`p^{(s)} = \mathrm{softmax}(f(x; w^{(s)}))`, ``probs`` is the sample mean and ``var`` the
    (unbiased) sample variance of :math:`p^{(s)}` over the ``num_samples`` draws."""
    _check_classifier(model)

    def predictor(x):
        probs = predictive_outputs(model, guide, x, num_samples, batch_size).softmax(-1)
        return probs.mean(0), probs.var(0)

    return predictor


def moment_predictor(model, guide, batch_size: int = 1000) -> Predictor:
    """VDP++ (:func:`~pyrobnn.infer.predict.predict_moments`): the propagated mean and variance of the
    softmax, one deterministic pass (first order through nonlinearities)."""
    _check_classifier(model)

    def predictor(x):
        out = predict_moments(model, guide, x, batch_size)
        return out["probs"], out["probs_var"]

    return predictor


def _check_inputs(x) -> None:
    if not (torch.is_tensor(x) and x.is_floating_point() and x.dim() >= 2 and x.shape[0] > 0):
        raise ValueError("x must be a non-empty floating-point tensor of shape (batch, ...), got "
                         + (f"{x.dtype} of shape {tuple(x.shape)}" if torch.is_tensor(x) else repr(type(x))))


def _check_classifier(model) -> None:
    if getattr(model, "task", None) != "classification":
        raise ValueError(f"model must be a classification BayesianNetwork, got task {getattr(model, 'task', None)!r}")


def noise_robustness(predictor: Predictor, x: torch.Tensor, y: torch.Tensor,
                     snr_db: Sequence[float] = PAPER_SNR_DB, seed: int = 0,
                     batch_size: int = 1000) -> list[dict[str, float | None]]:
    r"""Accuracy and predictive variance of the predicted class under input noise (VDP++ Fig. 3).

    At each level, :func:`add_noise` perturbs all of ``x`` with a fresh ``torch.Generator`` seeded
    by ``seed`` (so every predictor, and every level, sees the same standard-normal draw, scaled
    to the level), and ``predictor`` is called on chunks of ``batch_size`` examples.

    :returns: one dict per level, in the order of ``snr_db``: ``snr_db``, ``accuracy``,
        ``variance`` (:math:`\frac1N\sum_n \mathrm{var}_{n,\hat y_n}`) and ``normalized_variance``
        (``variance`` divided by its value at the lowest SNR); both ``None`` for a deterministic
        predictor.
    """
    levels = [snr_db] if isinstance(snr_db, (int, float)) else list(snr_db)
    if not levels:
        raise ValueError("snr_db must be a non-empty sequence of finite numbers (dB)")
    levels = [finite("snr_db", level, "dB") for level in levels]
    batch_size = positive_int("batch_size", batch_size)
    _check_inputs(x)
    check_labels(y, None, "y", num_examples=len(x))
    rows = []
    for level in levels:
        noisy = add_noise(x, level, torch.Generator().manual_seed(seed))
        correct, variances = 0.0, []
        for chunk, labels in zip(noisy.split(batch_size), y.split(batch_size)):
            probs, var = predictor(chunk)
            predicted = probs.argmax(-1)
            correct += float((predicted == labels.to(predicted.device)).sum())
            if var is not None:
                variances.append(float(var.gather(-1, predicted[:, None]).sum()))
        rows.append({"snr_db": level, "accuracy": correct / len(x),
                     "variance": sum(variances) / len(x) if variances else None})
    base = rows[min(range(len(levels)), key=levels.__getitem__)]["variance"]
    for row in rows:
        v = row["variance"]
        row["normalized_variance"] = None if v is None else (v / base if base > 0 else math.nan)
    return rows
