r"""SNGP (Liu et al., NeurIPS 2020, "Simple and Principled Uncertainty Estimation with Deterministic Deep Learning via
Distance Awareness"): a deterministic network made distance aware, its output layer a Gaussian process.

Two changes to the network (:func:`sngp_network`):

- **spectral normalisation of the hidden layers** (their eq. 10): every Linear and convolution but the output layer
  gets :func:`torch.nn.utils.parametrizations.spectral_norm` (one power iteration per training pass), bounded as
  their code bounds it, :math:`W \leftarrow W / \max(1, \hat\sigma(W)/c)`: a weight whose spectral norm
  :math:`\hat\sigma` exceeds the bound c is scaled down to c, a smaller one is kept (:class:`SpectralBound`), so
  that the hidden map stays close to distance preserving;
- **the output layer a Gaussian process** (their eq. 7-8) by D random Fourier features of the penultimate features
  h (Rahimi & Recht 2007), fixed at initialisation,

  .. math:: \Phi(h) = \sqrt{2/D}\,\cos(W h / \ell + b), \qquad W_{ij} \sim \mathcal N(0, 1),\;
            b_i \sim \mathcal U[0, 2\pi],

  an RBF kernel of length scale ℓ, and the logits :math:`g(h) = \beta^\top\Phi(h)` with the GP prior
  :math:`\beta \sim \mathcal N(0, s^2 I)` (the method's Gaussian prior, scale s): :class:`RandomFeatureGP`.

Training is MAP's (:func:`~pyrobnn.infer.svi.fit` on the point estimates under the prior: the likelihood plus
:math:`\|\beta\|^2/2s^2`, the hidden weights under the same prior). At the end of the last epoch the Laplace
precision of β is collected in one pass over the training data (their eq. 9, their code's reset and collection in
the last epoch, here at the trained network rather than during its last steps),

.. math:: \hat\Sigma^{-1} = s^{-2} I + \sum_{i=1}^N \hat p_i (1 - \hat p_i)\, \Phi_i \Phi_i^\top,

with :math:`\hat p_i` the predicted class's probability (for two classes their eq. 9 itself; for K classes one
matrix shared by the classes, as their code shares one), and kept in the network's state (a buffer: a checkpoint
carries it). The predictive is their mean-field approximation (eq. 11, after MacKay 1992),

.. math:: p(y \mid x) \approx \operatorname{softmax}\!\Big(\frac{g(x)}{\sqrt{1 + \lambda\,\sigma^2(x)}}\Big),
          \qquad \sigma^2(x) = \Phi(x)^\top \hat\Sigma\, \Phi(x), \qquad \lambda = \pi/8,

one deterministic pass (:class:`SNGPPosterior`): far from the training data :math:`\Phi(x)` is nearly orthogonal to
the training features, the variance is the prior's and the logits shrink towards uniform probabilities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm

from pyrobnn.analysis.calibration import predicted
from pyrobnn.checks import positive, positive_int
from pyrobnn.guides.point import point_values
from pyrobnn.infer.laplace import last_layer_inputs, last_linear
from pyrobnn.infer.predict import predict
from pyrobnn.infer.svi import fit
from pyrobnn.methods.base import Method, is_model, needs_point_estimates
from pyrobnn.methods.posterior import Posterior, VariationalPosterior
from pyrobnn.model import GaussianPrior
from pyrobnn.model.likelihoods import Categorical

__all__ = ["SNGP", "SNGPPosterior", "RandomFeatureGP", "SpectralBound", "sngp_network", "collect_precision"]


class SpectralBound(nn.Module):
    r"""The parametrization :math:`W \mapsto W / \max(1, \hat\sigma/c)` of a weight: torch's spectral normalisation
    (``unit``, which gives :math:`W/\hat\sigma` with :math:`\hat\sigma` by power iteration) rescaled to the bound c
    where :math:`\hat\sigma > c`, the weight itself elsewhere."""

    def __init__(self, unit: nn.Module, bound: float):
        super().__init__()
        self.unit, self.bound = unit, bound

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        unit = self.unit(weight)
        sigma = weight.norm() / unit.norm()  # unit = weight / sigma exactly
        return unit * torch.clamp(sigma, max=self.bound)


def _bounded(layer: nn.Module, bound: float) -> None:
    spectral_norm(layer)
    parametrization = layer.parametrizations.weight
    parametrization[0] = SpectralBound(parametrization[0], bound)


class RandomFeatureGP(nn.Module):
    r"""The Gaussian-process output layer (the module docstring): ``features`` fixed random Fourier features of its
    input, :math:`\Phi(h) = \sqrt{2/D}\cos(W h/\ell + b)`, and the logits ``output`` :math:`= \beta^\top\Phi(h)` (an
    ``nn.Linear`` without bias, the trained weights). Its buffers hold the features' W and b, the Laplace
    ``precision`` of β (``ridge`` times the identity until :func:`collect_precision` collects it) and the mean-field
    factor λ; under :meth:`mean_field` its output is the mean-field logits."""

    def __init__(self, in_features: int, out_features: int, *, features: int, length_scale: float, ridge: float,
                 mean_field: float):
        super().__init__()
        self.register_buffer("projection", torch.randn(features, in_features) / length_scale)
        self.register_buffer("phase", torch.rand(features) * (2 * math.pi))
        self.register_buffer("precision", ridge * torch.eye(features))
        self.register_buffer("mean_field_factor", torch.tensor(float(mean_field)))
        self.output = nn.Linear(features, out_features, bias=False)

    def features(self, h: torch.Tensor) -> torch.Tensor:
        r""":math:`\Phi(h)`, ``(N, D)``."""
        return math.sqrt(2.0 / self.phase.numel()) * torch.cos(nn.functional.linear(h, self.projection, self.phase))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.output(self.features(h))

    def variance(self, phi: torch.Tensor, covariance: Optional[torch.Tensor] = None) -> torch.Tensor:
        r"""The GP's predictive variance :math:`\Phi^\top\hat\Sigma\Phi` of each row of ``phi`` (``covariance``:
        :math:`\hat\Sigma`, by default the precision's inverse)."""
        if covariance is None:
            covariance = torch.cholesky_inverse(torch.linalg.cholesky(self.precision))
        return ((phi @ covariance) * phi).sum(-1)

    def mean_field(self):
        """A context in which the layer's output is the mean-field logits :math:`g/\\sqrt{1 + \\lambda\\sigma^2}`."""
        covariance = torch.cholesky_inverse(torch.linalg.cholesky(self.precision))
        factor = self.mean_field_factor

        def adjusted(module, inputs, logits):
            scale = torch.rsqrt(1 + factor * self.variance(inputs[0].reshape(-1, inputs[0].shape[-1]), covariance))
            return logits * scale.reshape(*logits.shape[:-1], 1)

        return _Hooked(self.output, adjusted)


class _Hooked:
    """``module``'s forward hook ``hook`` for the duration of a ``with``."""

    def __init__(self, module: nn.Module, hook):
        self.module, self.hook = module, hook

    def __enter__(self):
        self.handle = self.module.register_forward_hook(self.hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def sngp_network(network: nn.Module, method: SNGP) -> nn.Module:
    """``network`` (changed in place, and returned) made SNGP's with ``method``'s settings: its last ``nn.Linear``,
    the output layer, replaced by a :class:`RandomFeatureGP` of as many inputs and outputs, and every other Linear and
    convolution bounded by :class:`SpectralBound`. A network without a Linear is a ``ValueError``."""
    named = [(name, module) for name, module in network.named_modules() if isinstance(module, nn.Linear)]
    if not named:
        raise ValueError(f"SNGP makes a network's last nn.Linear (its output layer) a Gaussian process: "
                         f"{type(network).__name__} has none")
    name, head = named[-1]
    if not name:
        raise ValueError("SNGP needs a network around its output layer, not a single nn.Linear")
    for module in list(network.modules()):
        if module is not head and isinstance(module, (nn.Linear, nn.modules.conv._ConvNd)) \
                and isinstance(getattr(module, "weight", None), nn.Parameter):
            _bounded(module, method.bound)
    gp = RandomFeatureGP(head.in_features, head.out_features, features=method.features,
                         length_scale=method.length_scale, ridge=method.ridge, mean_field=method.mean_field)
    parent, _, attr = name.rpartition(".")
    setattr(network.get_submodule(parent) if parent else network, attr, gp)
    return network


def _gp_layer(model) -> RandomFeatureGP:
    layers = [module for module in model.modules() if isinstance(module, RandomFeatureGP)]
    if len(layers) != 1:
        raise ValueError(f"an SNGP model has one RandomFeatureGP output layer, this one has {len(layers)} (build it "
                         "with SNGP.build)")
    return layers[0]


@torch.no_grad()
def collect_precision(model, guide, x: torch.Tensor, ridge: float, batch_size: int = 1000, transform=None) -> None:
    r"""Set the GP layer's ``precision`` to :math:`r I + \sum_i \hat p_i(1 - \hat p_i)\Phi_i\Phi_i^\top` over the
    training inputs ``x`` at the trained point estimates of ``guide`` (eval mode; ``transform``: the training
    transform's deterministic part), with ``ridge`` r and :math:`\hat p_i` the predicted class's probability."""
    layer = _gp_layer(model)
    _, sites = last_linear(model)
    beta = point_values(guide)[sites["weight"]]
    precision = ridge * torch.eye(layer.precision.shape[0], dtype=layer.precision.dtype,
                                  device=layer.precision.device)
    for part in x.split(batch_size * 10):
        phi = last_layer_inputs(model, guide, part, batch_size, transform).to(precision)
        p = (phi @ beta.to(phi).T).softmax(-1).amax(-1)
        precision += (phi * (p * (1 - p))[:, None]).T @ phi
    layer.precision.copy_(precision)


@dataclass
class SNGPPosterior(VariationalPosterior):
    """SNGP's posterior: the trained network and its point-estimate guide, whose predictive is the GP layer's
    mean-field approximation (the module docstring), one deterministic pass (``num_samples`` is unused); its
    :meth:`draw` samples the output weights β from their Laplace posterior :math:`\\mathcal N(\\hat\\beta,
    \\hat\\Sigma)` (the other weights at their point estimates). It saves as a variational posterior of kind ``sngp``
    and loads back as itself (:func:`~pyrobnn.methods.load_posterior`)."""

    num_samples: int = 1
    report: dict = field(default_factory=dict)

    kind = "sngp"

    def predict(self, x: torch.Tensor, num_samples: Optional[int] = None, **options) -> dict[str, torch.Tensor]:
        with _gp_layer(self.model).mean_field():
            return predict(self.model, self.guide, x, 1, **options)

    def predicted(self, x: torch.Tensor, num_samples: Optional[int] = None, **options) -> tuple:
        with _gp_layer(self.model).mean_field():
            return predicted(self.model, self.guide, x, 1, **options)

    @torch.no_grad()
    def draw(self, num_samples: Optional[int] = None, seed: int = 0) -> dict[str, torch.Tensor]:
        values = super().draw(num_samples, seed)
        layer, (_, sites) = _gp_layer(self.model), last_linear(self.model)
        name = sites["weight"]
        cholesky = torch.linalg.cholesky(layer.precision)
        noise = torch.randn(values[name].shape, generator=torch.Generator().manual_seed(seed)).to(cholesky)
        # beta_k ~ N(beta_hat_k, P^-1) for each class k: beta_hat + L^-T eps with P = L L^T
        deviation = torch.linalg.solve_triangular(cholesky.T, noise.transpose(-1, -2), upper=True)
        values[name] = values[name] + deviation.transpose(-1, -2).to(values[name])
        return values


@dataclass(frozen=True)
class SNGP(Method):
    """SNGP as a method (the module docstring): MAP training of :func:`sngp_network` under a Gaussian prior (scale s:
    the GP prior of the output weights, ridge :math:`1/s^2`), the Laplace precision collected at the end of the last
    epoch, the mean-field predictive (:class:`SNGPPosterior`).

    :param features: D, the random Fourier features (their 1024).
    :param bound: c, the spectral norms' bound (their CIFAR code's 6).
    :param length_scale: ℓ, the RBF kernel's length scale (their 1).
    :param mean_field: λ, the mean-field factor (π/8, their eq. 11).
    """

    num_samples: int = 1
    features: int = 1024
    bound: float = 6.0
    length_scale: float = 1.0
    mean_field: float = math.pi / 8

    def settings_rules(self) -> None:
        """Point estimates under a Gaussian prior (its scale the GP prior's), a positive feature count, bound and
        length scale, a mean-field factor >= 0."""
        super().settings_rules()
        needs_point_estimates(self, "SNGP")
        if not isinstance(self.prior, GaussianPrior):
            raise ValueError(f"SNGP's output weights have the GP prior N(0, s^2): {{prior}} must be Gaussian, got "
                             f"{type(self.prior).__name__}")
        positive_int("{features}", self.features)
        positive("{bound}", self.bound)
        positive("{length_scale}", self.length_scale)
        if not self.mean_field >= 0:
            raise ValueError(f"{{mean_field}} must be >= 0 (pi/8: the mean-field approximation), got {self.mean_field}")

    def run_rules(self, model, epochs, rows, run) -> None:
        """A classifier: the mean-field predictive and the Laplace precision are the softmax's."""
        super().run_rules(model, epochs, rows, run)
        if model is not None and not isinstance(getattr(model, "likelihood", None), Categorical):
            raise ValueError("SNGP is a classifier's method (the mean-field softmax): train it on a classification "
                             "set, or choose another method for a regression")

    @property
    def ridge(self) -> float:
        """The precision of the output weights' prior, :math:`1/s^2`."""
        return 1.0 / float(self.prior.scale) ** 2

    def build(self, network: nn.Module, **options) -> tuple:
        """``network`` made SNGP's (:func:`sngp_network`, changed in place), then :meth:`Method.build`; a model
        already (a Pyro model) is a ``ValueError``: SNGP changes the network's layers."""
        if is_model(network):
            raise ValueError(f"SNGP changes a network's layers: pass the plain nn.Module, not the model "
                             f"{type(network).__name__}")
        return super().build(sngp_network(network, self), **options)

    def train(self, model, guide, x, y, *, epochs=10, seed=0, precision="fp32", make_member=None,
              **run) -> Posterior:
        self.check(model, epochs=epochs, rows=x.shape[0], **run)
        transform = run.get("transform")
        callbacks = run.pop("on_epoch_end", None) or []
        callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]

        def collect(epoch: int, record: dict) -> None:  # before the last checkpoint: it carries the precision
            if epoch == epochs - 1:
                collect_precision(model, guide, x, self.ridge, transform=getattr(transform, "normalize", transform))

        history = fit(model, guide, x, y, epochs=epochs, seed=seed, **self.fit_options(epochs, precision, model),
                      on_epoch_end=[collect, *callbacks], **run)
        return self.posterior(model, guide, history)

    def posterior(self, model, guide, history=None) -> Posterior:
        return SNGPPosterior(model, guide, **({} if history is None else {"history": history}))

    def stacked_posterior(self, pairs, rows, collected, x, seed, transform=None) -> Posterior:
        model, guide = pairs[rows[0]]
        collect_precision(model, guide, x, self.ridge, transform=transform)
        return self.posterior(model, guide)
