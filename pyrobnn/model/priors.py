"""Weight priors: how a Bayesian parameter's prior distribution is built.

A :class:`Prior` turns a reference tensor (the deterministic parameter it
replaces, which carries shape, dtype and device) into a Pyro distribution whose
event shape is the parameter's shape. :func:`pyrobnn.bayesian` attaches a prior
to every selected parameter as a :class:`~pyro.nn.PyroSample` site, so the prior
follows the module across ``.to(device)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pyro.distributions as dist
import torch

from pyrobnn.checks import choice, finite, in_range, positive
from pyrobnn.distributions import IsotropicNormal, LogUniform, ScaleMixtureNormal

__all__ = ["Prior", "GaussianPrior", "ScaleMixturePrior", "LogUniformPrior", "NodePrior", "PRIORS"]


class Prior:
    """Base class: ``prior(reference)`` returns the prior of a parameter shaped like ``reference``.

    A new prior subclasses it and overrides :meth:`__call__` (a frozen dataclass that validates its
    hyper-parameters in ``__post_init__``, like the priors below, keeps it hashable and printable).
    """

    def __call__(self, reference: torch.Tensor) -> dist.TorchDistribution:
        """The prior of a parameter shaped like ``reference``: event shape ``reference.shape``."""
        raise NotImplementedError(f"{type(self).__name__} must override __call__(reference)")


@dataclass(frozen=True)
class GaussianPrior(Prior):
    r"""Factorised Gaussian prior :math:`p(w) = \mathcal N(w; \mu_p, \sigma_p^2)`.

    The prior of Graves (2011) "variational dense" layers; :math:`\mathcal N(0, 1)` is the usual
    choice for classification, a wider one (e.g. :math:`\sigma_p = 2`) for regression. The KL to
    a diagonal-Normal posterior is analytic:
    :math:`\sum \log(\sigma_p/\sigma) + (\sigma^2 + (\mu-\mu_p)^2)/(2\sigma_p^2) - 1/2`.

    With ``fan_in=True`` a weight tensor of two or more dimensions gets :math:`\sigma_p = c / \sqrt{n_\text{in}}`
    (``scale`` :math:`= c`, :math:`n_\text{in}` = the elements of one output unit's weights, ``reference[0]``):
    the prior function then keeps its scale with the width and through ReLU layers at :math:`c = \sqrt 2` (He et
    al. 2015), where :math:`\mathcal N(0, 1)` grows as :math:`\sqrt{n_\text{in}}` per layer; the Gaussian process
    limit of Neal (1996) scales the same way. Biases (one dimension) take ``bias_scale`` (default ``scale``).
    """

    loc: float = 0.0
    scale: float = 1.0
    fan_in: bool = False
    bias_scale: float | None = None

    def __post_init__(self):
        finite("loc (mean of the Gaussian prior)", self.loc)
        positive("scale (sigma of the Gaussian prior)", self.scale)
        if self.bias_scale is not None:
            positive("bias_scale (sigma of the Gaussian prior of biases)", self.bias_scale)

    def __call__(self, reference):
        if reference.dim() < 2:
            scale = self.scale if self.bias_scale is None else self.bias_scale
        else:
            scale = self.scale / math.sqrt(reference[0].numel()) if self.fan_in else self.scale
        return IsotropicNormal(self.loc, scale, reference.shape, device=reference.device, dtype=reference.dtype)


@dataclass(frozen=True)
class ScaleMixturePrior(Prior):
    r"""Scale-mixture prior of Blundell et al. (2015)
    :math:`p(w) = \pi \mathcal N(0, \sigma_1^2) + (1-\pi) \mathcal N(0, \sigma_2^2)`.

    The defaults are the optimum of Blundell et al.'s grid
    (:math:`\pi \in \{1/4, 1/2, 3/4\}`, :math:`-\log\sigma_1 \in \{0, 1, 2\}`,
    :math:`-\log\sigma_2 \in \{6, 7, 8\}`), as Rahmanto's reproduction of their MNIST results
    identifies it: :math:`\pi = 1/4`, :math:`\sigma_1 = 1`, :math:`\sigma_2 = e^{-8}`. No
    closed-form KL exists; the ELBO uses ``log q(w) - log p(w)``.
    """

    pi: float = 0.25
    sigma1: float = 1.0
    sigma2: float = math.exp(-8)

    def __post_init__(self):
        in_range("pi (mixture weight of the wide component)", self.pi, 0, 1, "()")
        positive("sigma1 (wide mixture component)", self.sigma1)
        positive("sigma2 (narrow mixture component)", self.sigma2)

    def __call__(self, reference):
        return ScaleMixtureNormal(
            self.pi, self.sigma1, self.sigma2, reference.shape, device=reference.device, dtype=reference.dtype
        ).to_event(reference.dim())


@dataclass(frozen=True)
class LogUniformPrior(Prior):
    r"""The improper log-uniform prior :math:`p(w) \propto 1/|w|` of variational dropout
    (Kingma, Salimans & Welling 2015; Molchanov, Ashukha & Vetrov 2017).

    Use it with :class:`~pyrobnn.guides.MultiplicativeDropoutGuide` or
    :class:`~pyrobnn.guides.AdditiveDropoutGuide`, whose posteriors carry
    :math:`\log\alpha` and so get the approximate KL.
    """

    def __call__(self, reference):
        return LogUniform(reference.shape)


@dataclass(frozen=True)
class NodePrior(Prior):
    r"""Node-wise multiplicative prior :math:`z_l \sim \mathcal N(1, \operatorname{diag} s^2)` of implicit BNNs
    (Trinh, Kaski & Heinonen 2020, eq. 1 and 21): given to :class:`~pyrobnn.BayesianNetwork`, it puts a latent
    vector :math:`z` on every selected ``nn.Linear`` / ``nn.ConvNd`` layer instead of priors on its weights,
    which stay point estimates (see :mod:`pyrobnn.model.nodes`):

    - ``mode="in"``: :math:`f(x) = U(z \circ x) + b`, one :math:`z` per input feature / input channel (the paper);
    - ``mode="out"``: :math:`f(x) = z \circ (Ux + b)`, one per output unit / channel (Trinh, Heinonen, Acerbi
      & Kaski 2022, the node-BNN of "Tackling covariate shift");
    - ``bias=True`` (mode ``"in"`` only) adds a latent on the bias, :math:`U(z \circ x) + b \circ z_b`, as the
      authors' code.

    One scale :math:`s` for all layers (0.3 for VGG-16, 0.1 for WideResNet-28-10 in the paper).
    """

    scale: float = 0.3
    mode: str = "in"
    bias: bool = False

    MODES = ("in", "out")

    def __post_init__(self):
        positive("scale (sigma of the node prior N(1, scale^2))", self.scale)
        choice("mode (which units of a layer the node latents multiply)", self.mode, self.MODES)
        if not isinstance(self.bias, bool):
            raise TypeError(f"bias must be a bool (a latent on each layer's bias), got {self.bias!r}")
        if self.bias and self.mode == "out":
            raise ValueError("bias=True adds a latent to the bias in mode 'in'; in mode 'out' the node latents "
                             "already multiply the bias: use bias=False")

    def __call__(self, reference):
        return IsotropicNormal(1.0, self.scale, reference.shape, device=reference.device, dtype=reference.dtype)


PRIORS = {"gaussian": GaussianPrior, "scale-mixture": ScaleMixturePrior, "log-uniform": LogUniformPrior,
          "node": NodePrior}
"""The registry of weight priors: name -> :class:`Prior` subclass (``pyrobnn train --prior``)."""
