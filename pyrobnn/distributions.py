r"""Weight-prior distributions that Pyro lacks, and their KL divergences to the guides' posteriors.

Each prior is one event over a whole parameter tensor (event shape = the parameter's shape):

- :class:`ScaleMixtureNormal`: the two-Gaussian scale mixture of Blundell et al. (2015). It has no
  closed-form KL to a Gaussian posterior; the ELBO estimates ``log q(w) - log p(w)``.
- :class:`IsotropicNormal`: :math:`\mathcal N(\mu_p, \sigma_p^2)` with scalar hyper-parameters,
  whose KL to a diagonal Normal is computed in one fused, reduced pass (:class:`_DiagonalNormalKL`).
- :class:`LogUniform`: the improper prior :math:`p(w) \propto 1/|w|` of variational dropout
  (Kingma, Salimans & Welling 2015; Molchanov, Ashukha & Vetrov 2017). Against a posterior
  :math:`q(w) = \mathcal N(\theta, \alpha\theta^2)` its KL depends on :math:`\alpha` alone,

  .. math:: \mathrm{KL}(q\|p) = -\tfrac12\log\alpha + \mathbb E_{\epsilon\sim\mathcal N(0,1)}
            \log|1 + \sqrt\alpha\,\epsilon| + \text{const},

  which has no closed form; two published approximations stand in for it:
  Kingma et al.'s, for :math:`\alpha \le 1`,
  :math:`-\mathrm{KL} \approx C + \tfrac12\log\alpha + c_1\alpha + c_2\alpha^2 + c_3\alpha^3`
  (:func:`kingma_kl`), and Molchanov et al.'s, for every :math:`\alpha`,
  :math:`-\mathrm{KL} \approx k_1\,\sigma(k_2 + k_3\log\alpha) - \tfrac12\log(1 + 1/\alpha) - k_1`
  (:func:`molchanov_kl`). A posterior selects one by being a :class:`DropoutNormal`, a ``Normal``
  that carries :math:`\log\alpha` and the approximation's name.

- :class:`DropoutWeight`: the MC-dropout posterior of a weight tensor (Gal & Ghahramani 2016), point
  estimates whose inputs are dropped at random. Against a Gaussian prior its KL, up to a constant that
  does not depend on the parameters, is the cross-entropy :math:`-\mathbb E_q\log p(W)`: the weight decay
  of dropout training.

The closed forms and approximations are registered with :func:`torch.distributions.register_kl`,
so :func:`~torch.distributions.kl_divergence`, and with it the annealed ELBO, uses them; any other
pair raises ``NotImplementedError`` and the ELBO falls back on Monte Carlo.
"""

from __future__ import annotations

import math

import pyro.distributions as dist
import torch
from pyro.distributions import TorchDistribution, constraints
from pyro.distributions.util import sum_rightmost
from torch.distributions import Independent, Normal, register_kl

from .checks import choice

__all__ = [
    "ScaleMixtureNormal", "IsotropicNormal", "LogUniform", "DropoutNormal", "kingma_kl", "molchanov_kl",
    "KINGMA_CONSTANTS", "MOLCHANOV_CONSTANTS", "KL_APPROXIMATIONS", "DropoutWeight",
]


class ScaleMixtureNormal(TorchDistribution):
    r"""Zero-mean two-component scale mixture of Gaussians (Blundell et al. 2015, eq. 7):

    .. math:: p(w) = \pi\,\mathcal N(w; 0, \sigma_1^2) + (1 - \pi)\,\mathcal N(w; 0, \sigma_2^2)

    A wide slab (:math:`\sigma_1`) and a narrow spike (:math:`\sigma_2 \ll 1`).
    The three hyper-parameters are scalars shared by every weight of the batch
    shape, so the log-density costs two squares and one ``logaddexp`` per
    weight. There is no closed-form KL divergence to a Gaussian posterior: the
    ELBO falls back on the Monte-Carlo estimate ``log q(w) - log p(w)``.
    """

    arg_constraints = {}
    support = constraints.real
    has_rsample = False

    def __init__(self, pi: float, sigma1: float, sigma2: float, batch_shape=torch.Size(), *,
                 device=None, dtype=None, validate_args=None):
        self.pi, self.sigma1, self.sigma2 = float(pi), float(sigma1), float(sigma2)
        self._device, self._dtype = device, dtype
        half_log_2pi = 0.5 * math.log(2 * math.pi)
        self._log_w1 = math.log(self.pi) - math.log(self.sigma1) - half_log_2pi
        self._log_w2 = math.log1p(-self.pi) - math.log(self.sigma2) - half_log_2pi
        super().__init__(torch.Size(batch_shape), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return ScaleMixtureNormal(self.pi, self.sigma1, self.sigma2, batch_shape,
                                  device=self._device, dtype=self._dtype)

    def _full(self, value: float) -> torch.Tensor:
        return torch.full(self.batch_shape, value, device=self._device, dtype=self._dtype)

    @property
    def mean(self):
        return self._full(0.0)

    @property
    def variance(self):
        return self._full(self.pi * self.sigma1**2 + (1 - self.pi) * self.sigma2**2)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return torch.logaddexp(
            self._log_w1 - 0.5 / self.sigma1**2 * value * value,
            self._log_w2 - 0.5 / self.sigma2**2 * value * value,
        )

    def sample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        with torch.no_grad():
            wide = torch.rand(shape, device=self._device) < self.pi
            noise = torch.randn(shape, device=self._device, dtype=self._dtype)
            return noise * torch.where(wide, self.sigma1, self.sigma2).to(noise.dtype)


class IsotropicNormal(TorchDistribution):
    r"""The prior :math:`\mathcal N(\mu_p, \sigma_p^2)` of every weight of one tensor, as one event.

    Location and scale are two Python scalars shared by all weights; the event
    shape is the parameter's shape. Keeping them scalar lets the KL to a
    diagonal Normal posterior ``Normal(mu, sigma).to_event(d)`` be reduced
    while it is computed (three sums, no per-weight prior tensors):

    .. math:: \mathrm{KL}(q\|p) = \sum_i \log\frac{\sigma_p}{\sigma_i}
        + \frac{\sigma_i^2 + (\mu_i - \mu_p)^2}{2\sigma_p^2} - \frac12
    """

    arg_constraints = {}
    support = constraints.real
    has_rsample = True

    def __init__(self, loc: float, scale: float, event_shape, *, device=None, dtype=None, validate_args=None):
        self.loc, self.scale = float(loc), float(scale)
        self._device, self._dtype = device, dtype
        super().__init__(torch.Size(), torch.Size(event_shape), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        """Batched copies are ordinary ``Normal(...).to_event(d)`` (the scalar shortcut is per event)."""
        shape = torch.Size(batch_shape) + self.event_shape
        full = torch.empty((), device=self._device, dtype=self._dtype)
        return dist.Normal(full.new_tensor(self.loc).expand(shape), full.new_tensor(self.scale).expand(shape)
                           ).to_event(len(self.event_shape))

    @property
    def mean(self):
        return torch.full(self.event_shape, self.loc, device=self._device, dtype=self._dtype)

    @property
    def variance(self):
        return torch.full(self.event_shape, self.scale**2, device=self._device, dtype=self._dtype)

    def sample(self, sample_shape=torch.Size()):
        with torch.no_grad():
            return self.rsample(sample_shape)

    def rsample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        return self.loc + self.scale * torch.randn(shape, device=self._device, dtype=self._dtype)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        centred = value - self.loc if self.loc else value
        constant = self.event_shape.numel() * (math.log(self.scale) + 0.5 * math.log(2 * math.pi))
        return sum_rightmost(centred.square(), len(self.event_shape)) * (-0.5 / self.scale**2) - constant


class _DiagonalNormalKL(torch.autograd.Function):
    r""":math:`\sum_i \mathrm{KL}(\mathcal N(\mu_i, \sigma_i^2) \| \mathcal N(\mu_p, \sigma_p^2))` for
    scalar prior hyper-parameters, reduced in the forward pass, with the closed-form gradients
    :math:`\partial/\partial\mu_i = (\mu_i - \mu_p)/\sigma_p^2` and
    :math:`\partial/\partial\sigma_i = \sigma_i/\sigma_p^2 - 1/\sigma_i`
    (a few passes over the weights each way instead of autograd's dozen, and no saved
    intermediates). The backward is written in differentiable operations on the saved inputs, so
    second derivatives are right too."""

    @staticmethod
    def forward(ctx, loc, scale, prior_loc: float, prior_scale: float):
        ctx.save_for_backward(loc, scale)
        ctx.prior_loc, ctx.precision = prior_loc, 1.0 / prior_scale**2
        centred = (loc - prior_loc if prior_loc else loc).reshape(-1)
        flat_scale = scale.reshape(-1)
        return ((torch.dot(flat_scale, flat_scale) + torch.dot(centred, centred)) * (0.5 * ctx.precision)
                - flat_scale.log().sum() + flat_scale.numel() * (math.log(prior_scale) - 0.5))

    @staticmethod
    def backward(ctx, grad):
        loc, scale = ctx.saved_tensors
        grad_loc = grad_scale = None
        if ctx.needs_input_grad[0]:
            grad_loc = (loc - ctx.prior_loc if ctx.prior_loc else loc) * (grad * ctx.precision)
        if ctx.needs_input_grad[1]:
            grad_scale = (scale * ctx.precision - scale.reciprocal()) * grad
        return grad_loc, grad_scale, None, None


@register_kl(Independent, IsotropicNormal)
@register_kl(Normal, IsotropicNormal)
def _kl_diagonal_normal_isotropic(q, p):
    base = q.base_dist if isinstance(q, Independent) else q
    if not isinstance(base, Normal) or q.event_shape != p.event_shape:
        raise NotImplementedError  # torch's "no closed form for this pair": the ELBO falls back to Monte Carlo
    if q.batch_shape == () and base.loc.shape == base.scale.shape == p.event_shape:
        return _DiagonalNormalKL.apply(base.loc, base.scale, p.loc, p.scale)
    event_dims = len(p.event_shape)
    centred = base.loc - p.loc if p.loc else base.loc
    return (
        sum_rightmost(base.scale.square() + centred.square(), event_dims) * (0.5 / p.scale**2)
        - sum_rightmost(base.scale.log(), event_dims)
        + p.event_shape.numel() * (math.log(p.scale) - 0.5)
    )


# -- the log-uniform prior of variational dropout ----------------------------------------

KINGMA_CONSTANTS = (1.16145124, -1.50204118, 0.58629921)
"""c1, c2, c3 of Kingma et al. (2015), eq. (10)."""
MOLCHANOV_CONSTANTS = (0.63576, 1.87320, 1.48695)
"""k1, k2, k3 of Molchanov et al. (2017), eq. (14)."""


def kingma_kl(log_alpha: torch.Tensor) -> torch.Tensor:
    r"""Elementwise :math:`\mathrm{KL} \approx -(\tfrac12\log\alpha + c_1\alpha + c_2\alpha^2 + c_3\alpha^3)`
    (the constant C dropped; accurate for :math:`\alpha \le 1`)."""
    c1, c2, c3 = KINGMA_CONSTANTS
    alpha = log_alpha.exp()
    return -(0.5 * log_alpha + alpha * (c1 + alpha * (c2 + alpha * c3)))


def molchanov_kl(log_alpha: torch.Tensor) -> torch.Tensor:
    r"""Elementwise :math:`\mathrm{KL} \approx k_1 - k_1\,\sigma(k_2 + k_3\log\alpha) + \tfrac12\log(1 + e^{-\log\alpha})`
    (zero as :math:`\alpha \to \infty`)."""
    k1, k2, k3 = MOLCHANOV_CONSTANTS
    return k1 - k1 * torch.sigmoid(k2 + k3 * log_alpha) + 0.5 * torch.nn.functional.softplus(-log_alpha)


KL_APPROXIMATIONS = {"kingma": kingma_kl, "molchanov": molchanov_kl}


class LogUniform(TorchDistribution):
    r"""Improper :math:`p(w) \propto 1/|w|` over a tensor (event shape = the parameter's shape).

    ``log_prob`` is :math:`-\sum\log|w|` (normalising constant omitted); it cannot be sampled.
    """

    arg_constraints = {}
    support = constraints.real

    def __init__(self, event_shape, batch_shape=torch.Size(), *, validate_args=None):
        super().__init__(torch.Size(batch_shape), torch.Size(event_shape), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        return LogUniform(self.event_shape, batch_shape)

    def log_prob(self, value):
        return -sum_rightmost(value.abs().log(), len(self.event_shape))

    def sample(self, sample_shape=torch.Size()):
        raise ValueError("the log-uniform prior is improper and cannot be sampled: initialise the guide "
                         "from the network's weights (init_loc='module'), not from the prior")


class DropoutNormal(dist.Normal):
    r""":math:`\mathcal N(\theta, \sigma^2)` with :math:`\alpha = \sigma^2/\theta^2`: the posterior of
    variational dropout, carrying ``log_alpha`` and the name of its KL approximation."""

    def __init__(self, loc, scale, log_alpha, approximation: str = "molchanov", validate_args=None):
        choice("approximation (the KL approximation)", approximation, KL_APPROXIMATIONS)
        super().__init__(loc, scale, validate_args=validate_args)
        self.log_alpha, self.approximation = log_alpha, approximation

    def expand(self, batch_shape, _instance=None):
        shape = torch.Size(batch_shape)
        return DropoutNormal(self.loc.expand(shape), self.scale.expand(shape), self.log_alpha.expand(shape),
                             self.approximation)


@register_kl(Independent, LogUniform)
@register_kl(DropoutNormal, LogUniform)
def _kl_dropout_normal_log_uniform(q, p):
    base = q.base_dist if isinstance(q, Independent) else q
    if not isinstance(base, DropoutNormal):
        raise NotImplementedError  # torch's "no closed form for this pair": the ELBO falls back to Monte Carlo
    kl = KL_APPROXIMATIONS[base.approximation](base.log_alpha)
    kl = kl.expand(base.loc.shape) if kl.shape != base.loc.shape else kl
    if kl.dim() < len(p.event_shape):
        raise ValueError(f"posterior of shape {tuple(kl.shape)} does not match the prior's event shape "
                         f"{tuple(p.event_shape)}")
    return sum_rightmost(kl, len(p.event_shape))


# -- MC dropout ---------------------------------------------------------------------------


class DropoutWeight(TorchDistribution):
    r"""The MC-dropout posterior of one weight tensor (Gal & Ghahramani 2016, sec. 3):

    .. math:: W = M \operatorname{diag}(m) / (1 - p), \qquad m_j \sim \mathrm{Bernoulli}(1 - p),

    one mask value per input unit ``j`` (dimension 1 of a Linear ``(out, in)`` or Conv ``(out, in, ...)``
    weight), so that ``op(x, W)`` equals ``op(dropout(x), M)`` with the input dropped unit by unit
    (a whole channel for a convolution) and rescaled as ``F.dropout`` does. A tensor of fewer than two
    dimensions (a bias) has no inputs: it is a point mass at :math:`M`.

    Moments: :math:`\mathbb E W = M`, :math:`\mathrm{Var}\,W = M^2 p/(1-p)`. ``log_prob`` is 0: the
    posterior has no density, and against a Gaussian prior :math:`\mathcal N(\mu_p, \sigma_p^2)` the ELBO
    uses (registered KL, exact in expectation of what ``Trace_ELBO`` computes with this ``log_prob``)

    .. math:: \mathrm{KL}(q\|p) \doteq -\mathbb E_q \log p(W) = \sum_i \tfrac12\log(2\pi\sigma_p^2)
              + \frac{(M_i - \mu_p)^2 + \mathrm{Var}\,W_i}{2\sigma_p^2},

    dropping the entropy of :math:`q`, which does not depend on :math:`M`: the L2 weight decay that
    Gal & Ghahramani (2016, appendix) derive for dropout training.

    :param loc: the point estimates :math:`M` (event shape = their shape).
    :param rate: the dropout rate :math:`p \in [0, 1)`.
    """

    arg_constraints = {}
    support = constraints.real
    has_rsample = True

    def __init__(self, loc: torch.Tensor, rate: float, validate_args=None):
        if not 0 <= rate < 1:
            raise ValueError(f"rate (the dropout probability) must be in [0, 1), got {rate!r}")
        self.loc, self.rate = loc, float(rate)
        super().__init__(torch.Size(), loc.shape, validate_args=validate_args)

    @property
    def dropped(self) -> bool:
        """Whether any input is dropped (a weight of two or more dimensions, rate > 0)."""
        return self.rate > 0 and self.loc.dim() >= 2

    def keep_mask(self, shape) -> torch.Tensor:
        """A mask of ``shape``: 0 with probability ``rate``, else :math:`1/(1-p)`."""
        keep = torch.empty(shape, dtype=self.loc.dtype, device=self.loc.device).bernoulli_(1 - self.rate)
        return keep.div_(1 - self.rate)

    @property
    def mean(self):
        return self.loc

    @property
    def variance(self):
        if not self.dropped:
            return torch.zeros_like(self.loc)
        return self.loc.square() * (self.rate / (1 - self.rate))

    def rsample(self, sample_shape=torch.Size()):
        sample_shape = torch.Size(sample_shape)
        if not self.dropped:
            return self.loc.expand(sample_shape + self.loc.shape)
        mask_shape = sample_shape + (1, self.loc.shape[1]) + (1,) * (self.loc.dim() - 2)
        return self.loc * self.keep_mask(mask_shape)

    def sample(self, sample_shape=torch.Size()):
        with torch.no_grad():
            return self.rsample(sample_shape)

    def log_prob(self, value):
        return value.new_zeros(value.shape[: value.dim() - len(self.event_shape)])

    def expand(self, batch_shape, _instance=None):
        if torch.Size(batch_shape) != self.batch_shape:
            raise ValueError("DropoutWeight is one event per weight tensor and cannot be batched (no vectorized "
                             "plates: use pyrobnn.predict for vectorized draws)")
        return self


@register_kl(DropoutWeight, IsotropicNormal)
def _kl_dropout_weight_gaussian(q, p):
    if q.event_shape != p.event_shape:
        raise ValueError(f"posterior of shape {tuple(q.event_shape)} does not match the prior's event shape "
                         f"{tuple(p.event_shape)}")
    centred = q.loc - p.loc if p.loc else q.loc
    second_moment = centred.square().sum() + (q.variance.sum() if q.dropped else 0.0)
    return second_moment * (0.5 / p.scale**2) + q.loc.numel() * (math.log(p.scale) + 0.5 * math.log(2 * math.pi))
