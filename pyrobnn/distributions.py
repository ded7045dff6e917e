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
- :class:`EqualMixtureNormal`: the K-component mixture posterior of the node latents of an implicit BNN
  (Trinh, Kaski & Heinonen 2020). Against a Gaussian prior it offers the paper's mixture-mean KL and an
  upper bound from a pairwise-Bhattacharyya entropy bound (Kolchinsky & Tracey 2017), with the entropy
  bonus of the γ-ELBO.

The closed forms and approximations are registered with :func:`torch.distributions.register_kl`,
so :func:`~torch.distributions.kl_divergence`, and with it the annealed ELBO, uses them; any other
pair raises ``NotImplementedError`` and the ELBO falls back on Monte Carlo.
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import pyro.distributions as dist
import torch
from pyro.distributions import TorchDistribution, constraints
from pyro.distributions.util import sum_rightmost
from torch.distributions import Independent, Normal, kl_divergence, register_kl

from pyrobnn.checks import choice

__all__ = [
    "softplus", "ScaleMixtureNormal", "IsotropicNormal", "LogUniform", "DropoutNormal", "kingma_kl", "molchanov_kl",
    "KINGMA_CONSTANTS", "MOLCHANOV_CONSTANTS", "KL_APPROXIMATIONS", "DropoutWeight", "dropout_kl_constant",
    "EqualMixtureNormal", "MIXTURE_KLS", "mixture_mean_kl", "mixture_entropy_lower_bound", "mixture_kl_upper_bound",
    "PushedNormal", "support_transform", "MomentCategorical", "Joint", "JointFactor",
]



@runtime_checkable
class Joint(Protocol):
    """A posterior over several sites at once (:class:`~pyrobnn.guides.normal.JointNormal`): what the estimators and
    :class:`~pyrobnn.MeanFieldELBO` read of it through its per-site factors (:class:`JointFactor`)."""

    def variance(self, index: int) -> torch.Tensor:
        r""":math:`\sigma^2` of site ``index``, computed once for all sites."""

    def prior_key(self, prior) -> tuple | None:
        """A key equal for the priors that put the same law on every weight (those :meth:`kl` covers at once)."""

    def kl(self, prior, values: dict) -> torch.Tensor | None:
        r""":math:`\mathrm{KL}(q\|p)` summed over all sites in one computation (None when it cannot be one)."""


@runtime_checkable
class JointFactor(Protocol):
    """The distribution of one site that is factor ``index`` of a :class:`Joint` posterior."""

    joint: Joint
    index: int

class _Softplus(torch.autograd.Function):
    r""":math:`\mathrm{softplus}(\rho) = \log(1 + e^{\rho})` (``rho`` itself above 20, as ``F.softplus``),
    with gradient :math:`\mathrm{sigmoid}(\rho)`.

    ``torch.log1p`` has no vectorised CPU kernel in some builds (in a BBB step of the 784-400-10 MLP on this
    project's CPU it took 1.56 ms over the 318k weights, where ``torch.log`` over as many values takes 0.13 ms:
    ``benchmarks/profile_step.py``; ``F.softplus`` calls it too), so :math:`\log(1 + x)`, :math:`x = e^\rho`, is
    computed from :math:`u = \mathrm{fl}(1 + x)` with the first-order correction for its rounding error,

    .. math:: \log(1 + x) = \log u + \log\bigl(1 + \tfrac{(1 + x) - u}{u}\bigr)
              \approx \log u - \frac{(u - 1) - x}{u},

    where :math:`(u - 1) - x` is exact in floating point (Sterbenz) and the neglected second-order term is below
    :math:`2^{-48}`. Where :math:`u` rounds to 1 it gives :math:`x` itself. Within 3 ulps of the float64 value.
    The backward is written in differentiable operations, so second derivatives are right too."""

    @staticmethod
    def forward(ctx, rho):
        ctx.save_for_backward(rho)
        x = rho.exp()
        u = x + 1
        rounding = (u - 1).sub_(x).div_(u)
        return torch.where(rho > 20.0, rho, u.log_().sub_(rounding))

    @staticmethod
    def backward(ctx, grad):
        (rho,) = ctx.saved_tensors
        return grad * torch.sigmoid(rho)


def softplus(rho: torch.Tensor) -> torch.Tensor:
    r""":math:`\sigma = \log(1 + e^{\rho})`, the positive scale of Bayes by Backprop (Blundell et al. 2015), as
    ``F.softplus`` computes it, without ``torch.log1p``, which is slow on some CPUs (:class:`_Softplus`)."""
    return _Softplus.apply(rho)


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
    r"""Elementwise
    :math:`\mathrm{KL} \approx k_1 - k_1\,\sigma(k_2 + k_3\log\alpha) + \tfrac12\log(1 + e^{-\log\alpha})`
    (zero as :math:`\alpha \to \infty`)."""
    k1, k2, k3 = MOLCHANOV_CONSTANTS
    return k1 - k1 * torch.sigmoid(k2 + k3 * log_alpha) + 0.5 * softplus(-log_alpha)


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
    uses (registered KL)

    .. math:: \mathrm{KL}(q\|p) \doteq \sum_i \frac{(M_i - \mu_p)^2 + \mathrm{Var}\,W_i}{2\sigma_p^2},

    the L2 weight decay that Gal & Ghahramani (2016, appendix) derive for dropout training, and what they
    report: the cross-entropy :math:`-\mathbb E_q \log p(W)` without the entropy of :math:`q` and without the
    constant :math:`\frac D2\log(2\pi\sigma_p^2)` of the D weights (:func:`dropout_kl_constant`; 44k nats for a
    784-400-10 network at :math:`\sigma_p = 1`), neither of which depends on :math:`M`. ``Trace_ELBO``, which
    scores ``log_prob`` = 0, estimates the loss plus that constant.

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
        keep = torch.empty(shape, dtype=self.loc.dtype, device=self.loc.device).bernoulli(1 - self.rate)
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
                             "plates: use pyrobnn.infer.predict for vectorized draws)")
        return self


@register_kl(DropoutWeight, IsotropicNormal)
def _kl_dropout_weight_gaussian(q, p):
    if q.event_shape != p.event_shape:
        raise ValueError(f"posterior of shape {tuple(q.event_shape)} does not match the prior's event shape "
                         f"{tuple(p.event_shape)}")
    centred = q.loc - p.loc if p.loc else q.loc
    second_moment = centred.square().sum() + (q.variance.sum() if q.dropped else 0.0)
    return second_moment * (0.5 / p.scale**2)


@register_kl(DropoutWeight, Independent)
@register_kl(DropoutWeight, Normal)
def _kl_dropout_weight_normal(q, p):
    """The same against a Gaussian prior with a location and scale per weight (a user's ``Normal(loc, scale)``
    expanded to the weight's shape, made one event by ``to_event``)."""
    prior_loc, prior_scale = _gaussian_moments(p, q.event_shape)
    variance = q.variance if q.dropped else torch.zeros_like(q.loc)
    return (((q.loc - prior_loc).square() + variance) / (2 * prior_scale**2)).sum()


def dropout_kl_constant(q: DropoutWeight, p: IsotropicNormal) -> float:
    r""":math:`\frac D2\log(2\pi\sigma_p^2)`: what the cross-entropy :math:`-\mathbb E_q\log p(W)` adds to the
    KL of a :class:`DropoutWeight` posterior against a Gaussian prior (a constant: no gradient)."""
    return q.loc.numel() * (math.log(p.scale) + 0.5 * math.log(2 * math.pi))


# -- the mixture node posterior of implicit BNNs ---------------------------------------------

MIXTURE_KLS = ("mixture_mean", "entropy_bound")
"""The KL terms an :class:`EqualMixtureNormal` posterior offers against a Gaussian prior."""


class EqualMixtureNormal(TorchDistribution):
    r"""Equal-weight mixture of K diagonal Normals over one tensor (event shape = ``locs.shape[1:]``):

    .. math:: q(z) = \frac1K \sum_{k=1}^K \mathcal N(z; \mu_k, \operatorname{diag}\sigma_k^2),

    the variational posterior of the node latents of an implicit BNN (Trinh, Kaski & Heinonen 2020,
    eq. 19). ``rsample`` picks a component uniformly and returns :math:`\mu_k + \sigma_k\epsilon`: the
    mixture weights are fixed, so this pathwise sample is a valid reparameterization (the discrete
    choice does not depend on any parameter). ``log_prob`` is
    :math:`\operatorname{logsumexp}_k \log\mathcal N(z; \mu_k, \sigma_k^2) - \log K`.

    It has no closed-form KL to a Gaussian prior; ``kl`` chooses what
    ``kl_divergence(q, p)`` returns for :math:`p = \mathcal N(m, s^2)` (:func:`mixture_mean_kl`, the
    paper's, or :func:`mixture_kl_upper_bound`), minus ``entropy_weight`` :math:`\gamma` times the
    entropy lower bound :func:`mixture_entropy_lower_bound`: the entropy bonus of the γ-ELBO
    :math:`\mathbb E_q\log p(y|z) - \mathrm{KL}(q\|p) + \gamma H(q)` (Trinh, Heinonen, Acerbi & Kaski
    2022, "Tackling covariate shift with node-based Bayesian neural networks"). So the term the ELBO
    subtracts is the chosen KL minus :math:`\gamma \hat H(q)`.

    :param locs: component means :math:`\mu`, shape ``(K,) + event_shape``.
    :param scales: component standard deviations :math:`\sigma > 0`, same shape.
    :param kl: ``"mixture_mean"`` or ``"entropy_bound"`` (see :data:`MIXTURE_KLS`).
    :param entropy_weight: :math:`\gamma \ge 0`.
    """

    arg_constraints = {}
    has_rsample = True

    def __init__(self, locs: torch.Tensor, scales: torch.Tensor, kl: str = "mixture_mean",
                 entropy_weight: float = 0.0, validate_args=None):
        if locs.dim() < 1 or locs.shape != scales.shape:
            raise ValueError(f"locs and scales must have the same shape (K, ...), got {tuple(locs.shape)} and "
                             f"{tuple(scales.shape)}")
        choice("kl (the KL term of the mixture posterior)", kl, MIXTURE_KLS)
        if not entropy_weight >= 0:
            raise ValueError(f"entropy_weight (gamma of the entropy bonus) must be >= 0, got {entropy_weight!r}")
        self.locs, self.scales, self.kl, self.entropy_weight = locs, scales, kl, float(entropy_weight)
        super().__init__(torch.Size(), locs.shape[1:], validate_args=validate_args)

    @property
    def num_components(self) -> int:
        return self.locs.shape[0]

    @property
    def support(self):
        return constraints.independent(constraints.real, len(self.event_shape))

    @property
    def mean(self):
        return self.locs.mean(0)

    @property
    def variance(self):
        r""":math:`\frac1K\sum_k \sigma_k^2 + \frac1K\sum_k(\mu_k - \bar\mu)^2` (law of total variance)."""
        return self.scales.square().mean(0) + (self.locs - self.locs.mean(0)).square().mean(0)

    def expand(self, batch_shape, _instance=None):
        if torch.Size(batch_shape) != self.batch_shape:
            raise ValueError("EqualMixtureNormal is one event per tensor and cannot be batched (no vectorized "
                             "plates: use pyrobnn.infer.predict or an estimator handler's num_particles for draws in "
                             "one pass)")
        return self

    def component_draws(self, components: torch.Tensor) -> torch.Tensor:
        r"""One draw :math:`\mu_k + \sigma_k\epsilon` per entry of the index tensor ``components``, shape
        ``components.shape + event_shape`` (differentiable in the means and scales)."""
        noise = torch.randn(components.shape + self.event_shape, dtype=self.locs.dtype, device=self.locs.device)
        return torch.addcmul(self.locs[components], self.scales[components], noise)

    def rsample(self, sample_shape=torch.Size()):
        components = torch.randint(self.num_components, torch.Size(sample_shape), device=self.locs.device)
        return self.component_draws(components)

    def sample(self, sample_shape=torch.Size()):
        with torch.no_grad():
            return self.rsample(sample_shape)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        event_dims = len(self.event_shape)
        value = value.unsqueeze(-event_dims - 1)  # (..., 1, *event) against (K, *event)
        log_components = sum_rightmost(Normal(self.locs, self.scales).log_prob(value), event_dims)
        return log_components.logsumexp(-1) - math.log(self.num_components)


def _gaussian_moments(p, event_shape: torch.Size):
    """``(loc, scale)`` of a Gaussian prior over a tensor of ``event_shape`` (``IsotropicNormal``, or a
    ``Normal`` made one event by ``to_event``); NotImplementedError for any other prior."""
    if p.event_shape != event_shape or p.batch_shape:
        raise NotImplementedError
    if isinstance(p, IsotropicNormal):
        return p.loc, p.scale
    base = p.base_dist if isinstance(p, Independent) else p
    if not isinstance(base, Normal):
        raise NotImplementedError
    return base.loc, base.scale


def _normal_kl(loc, scale, prior_loc, prior_scale) -> torch.Tensor:
    r"""Elementwise :math:`\log(s/\sigma) + (\sigma^2 + (\mu - m)^2)/(2 s^2) - 1/2` (``loc``, ``scale`` of one shape):
    torch's closed form for two Normals, the prior's moments broadcast."""
    like = dict(dtype=loc.dtype, device=loc.device)
    prior = Normal(torch.as_tensor(prior_loc, **like), torch.as_tensor(prior_scale, **like), validate_args=False)
    return kl_divergence(Normal(loc, scale, validate_args=False), prior)


def mixture_mean_kl(q: EqualMixtureNormal, prior_loc, prior_scale) -> torch.Tensor:
    r"""The KL of Trinh, Kaski & Heinonen (2020, eq. 22-24): of the mixture-mean Gaussian
    :math:`\hat q = \mathcal N(\hat\mu, \hat\sigma^2)`, :math:`\hat\mu = \frac1K\sum_k\mu_k`,
    :math:`\hat\sigma^2 = \frac1{K^2}\sum_k\sigma_k^2`, to the prior :math:`\mathcal N(m, s^2)`.

    :math:`\hat q` is the distribution of :math:`\frac1K\sum_k z_k` with one independent draw
    :math:`z_k` per component, not of a draw of :math:`q`: this is not the KL of the mixture and bounds
    it in neither direction (identical components give :math:`\hat\sigma^2 = \sigma^2/K` and so a larger
    value than the mixture's true KL; components spread around the prior mean a smaller one). It pulls
    the components' average towards the prior mean and lets the components themselves spread.
    """
    loc = q.locs.mean(0)
    scale = q.scales.square().sum(0).sqrt() / q.num_components
    return _normal_kl(loc, scale, prior_loc, prior_scale).sum()


def _log_mean_affinity(q: EqualMixtureNormal) -> torch.Tensor:
    r""":math:`\frac1K\sum_i \log\frac1K\sum_j e^{-D_B(q_i, q_j)}` over the components' pairwise Bhattacharyya
    distances; for diagonal Gaussians, with :math:`\bar\sigma^2 = (\sigma_i^2 + \sigma_j^2)/2`,

    .. math:: D_B(q_i, q_j) = \sum_d \frac{(\mu_{id} - \mu_{jd})^2}{8\bar\sigma_d^2}
              + \frac12\log\frac{\bar\sigma_d^2}{\sigma_{id}\sigma_{jd}}.

    It lies in :math:`[-\log K, 0]` (:math:`D_B(q_i, q_i) = 0`). Cost: :math:`K^2` distances.
    """
    locs, variances = q.locs.flatten(1), q.scales.flatten(1).square()  # (K, D)
    pair_variances = 0.5 * (variances.unsqueeze(1) + variances.unsqueeze(0))  # (K, K, D)
    log_variances = variances.log()
    distance = ((locs.unsqueeze(1) - locs.unsqueeze(0)).square() / (8 * pair_variances)
                + 0.5 * pair_variances.log() - 0.25 * (log_variances.unsqueeze(1) + log_variances.unsqueeze(0))).sum(-1)
    return ((-distance).logsumexp(1) - math.log(q.num_components)).mean()


def mixture_entropy_lower_bound(q: EqualMixtureNormal) -> torch.Tensor:
    r"""Lower bound on the entropy of the mixture from pairwise Bhattacharyya distances :math:`D_B`
    (Kolchinsky & Tracey 2017, "Estimating mixture entropy with pairwise distances", Entropy 19(7):361,
    Thm. 3 with the Chernoff α-divergence at α = 1/2; :func:`_log_mean_affinity`):

    .. math:: H(q) \ge \hat H(q) = \frac1K\sum_k H(q_k) - \frac1K\sum_i \log\frac1K\sum_j e^{-D_B(q_i, q_j)}.

    :math:`\hat H` lies between :math:`\frac1K\sum_k H(q_k)` (all components equal) and that plus
    :math:`\log K` (components far apart), as :math:`H(q)` does.
    """
    component_entropy = (q.scales.log().flatten(1).sum(-1)
                         + 0.5 * q.event_shape.numel() * (1 + math.log(2 * math.pi))).mean()
    return component_entropy - _log_mean_affinity(q)


def mixture_kl_upper_bound(q: EqualMixtureNormal, prior_loc, prior_scale) -> torch.Tensor:
    r"""Upper bound on :math:`\mathrm{KL}(q\|p)` of the mixture to the Gaussian prior :math:`p`, from
    :func:`mixture_entropy_lower_bound` (the bound the ICML 2022 node-BNN code offers as ``upper_bound``).
    The cross-entropy of the mixture is exact, :math:`-\mathbb E_q\log p = \frac1K\sum_k(\mathrm{KL}(q_k\|p)
    + H(q_k))` (one Gaussian cross-entropy per component), so

    .. math:: \mathrm{KL}(q\|p) = -\mathbb E_q\log p - H(q) \le -\mathbb E_q\log p - \hat H(q)
              = \frac1K\sum_k \mathrm{KL}(q_k\|p) + \frac1K\sum_i\log\frac1K\sum_j e^{-D_B(q_i, q_j)}.

    The second term lies in :math:`[-\log K, 0]`: the bound is the components' mean KL, less up to
    :math:`\log K` as they separate.
    """
    component_kl = _normal_kl(q.locs, q.scales, prior_loc, prior_scale).flatten(1).sum(-1).mean()
    return component_kl + _log_mean_affinity(q)


_MIXTURE_KL_FUNCTIONS = {"mixture_mean": mixture_mean_kl, "entropy_bound": mixture_kl_upper_bound}


@register_kl(EqualMixtureNormal, IsotropicNormal)
@register_kl(EqualMixtureNormal, Independent)
@register_kl(EqualMixtureNormal, Normal)
def _kl_equal_mixture_gaussian(q, p):
    prior_loc, prior_scale = _gaussian_moments(p, q.event_shape)
    kl = _MIXTURE_KL_FUNCTIONS[q.kl](q, prior_loc, prior_scale)
    if q.entropy_weight:
        kl = kl - q.entropy_weight * mixture_entropy_lower_bound(q)
    return kl


# -- a latent off the weights: a Normal of the unconstrained space, pushed to the support ----------------------

def support_transform(prior):
    """The bijection :math:`T` from the reals onto ``prior``'s support that a latent off the weights is sampled
    through: the prior's own transforms when it is a push-forward of a Normal (``LogNormal``: :math:`\\exp`), so
    posterior and prior share their unconstrained space (and the KL its closed form), else
    ``biject_to(prior.support)``."""
    if isinstance(prior, torch.distributions.TransformedDistribution):
        base = prior.base_dist.base_dist if isinstance(prior.base_dist, Independent) else prior.base_dist
        if type(base) in (Normal, dist.Normal) and prior.transforms:
            transforms = prior.transforms
            return transforms[0] if len(transforms) == 1 else torch.distributions.ComposeTransform(transforms)
    return torch.distributions.biject_to(prior.support)


class PushedNormal(TorchDistribution):
    r""":math:`q(\theta) = T_\#\,\mathcal N(\mu, \operatorname{diag}\sigma^2)`: :math:`\theta = T(u)`,
    :math:`u \sim \mathcal N(\mu, \sigma^2)`, for a bijection :math:`T` from the reals onto a latent's support
    (``biject_to(support)``; e.g. :math:`\exp` for a noise scale), with density

    .. math:: \log q(\theta) = \log\mathcal N(T^{-1}(\theta); \mu, \sigma^2)
              - \log\left|\det \frac{\partial T}{\partial u}\right|,

    one event over the whole value (a global latent). What ``TransformedDistribution(Normal(...).to_event(d), T)``
    gives, the mean-field family Pyro's ``AutoNormal`` uses for every site, built without its per-call checks (a
    training step builds one per site); a value it sampled last is scored from its :math:`u` (no inverse).
    """

    arg_constraints: dict = {}
    has_rsample = True

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor, transform, validate_args=None):
        self.loc, self.scale, self.transform = loc, scale, transform
        self._last = None
        elementwise = transform.domain.event_dim == 0 and transform.codomain.event_dim == 0
        super().__init__(torch.Size(), loc.shape if elementwise else transform.forward_shape(loc.shape),
                         validate_args=False)

    @property
    def support(self):
        return self.transform.codomain

    def rsample(self, sample_shape=torch.Size()):
        u = torch.addcmul(self.loc, self.scale,
                          torch.randn(torch.Size(sample_shape) + self.loc.shape, dtype=self.loc.dtype,
                                      device=self.loc.device))
        value = self.transform(u)
        self._last = (value, u)
        return value

    def log_prob(self, value):
        u = self._last[1] if self._last is not None and self._last[0] is value else self.transform.inv(value)
        dims = self.loc.dim()
        log_density = sum_rightmost(Normal(self.loc, self.scale, validate_args=False).log_prob(u), dims)
        jacobian = self.transform.log_abs_det_jacobian(u, value)
        return log_density - sum_rightmost(jacobian, jacobian.dim() - (u.dim() - dims))


@register_kl(PushedNormal, torch.distributions.TransformedDistribution)
def _kl_pushed_normal_transformed(q, p):
    r"""A prior that is the push-forward of a Normal by the same bijection (``LogNormal`` =
    :math:`\exp_\#\mathcal N(m, s^2)` against :math:`\exp_\#\mathcal N(\mu, \sigma^2)`): the KL is invariant under
    the bijection, so it is the closed form of the two Normals; any other pair has none here
    (``NotImplementedError``: the ELBO estimates it by Monte Carlo)."""
    base = p.base_dist.base_dist if isinstance(p.base_dist, Independent) else p.base_dist
    if support_transform(p) != q.transform or type(base) not in (Normal, dist.Normal) \
            or p.event_shape != q.event_shape:
        raise NotImplementedError
    kl = kl_divergence(Normal(q.loc, q.scale, validate_args=False),
                       Normal(base.loc, base.scale, validate_args=False))
    return sum_rightmost(kl, q.loc.dim())


# -- VDP++'s observation model of a classifier ----------------------------------------------------------------

class MomentCategorical(dist.TorchDistribution):
    r"""VDP++'s observation model (eq. 11): the one-hot target :math:`y` under independent
    Gaussians on the softmax outputs, :math:`\log p(y) = -\tfrac12\sum_k \big[\log\sigma_k^2 +
    (y_k - \mu_k)^2/\sigma_k^2\big]` (constant dropped), with :math:`(\mu, \sigma^2)` the propagated
    moments of the softmax and ``min_variance`` added to :math:`\sigma^2` for stability."""

    arg_constraints = {}
    support = constraints.nonnegative_integer

    def __init__(self, mean: torch.Tensor, var: torch.Tensor, min_variance: float = 1e-3, validate_args=None):
        self.probs_mean, self.probs_var = mean, var + min_variance
        super().__init__(mean.shape[:-1], validate_args=validate_args)

    def log_prob(self, value):
        # one-hot by comparison: F.one_hot reads the labels' range (a host read a recorded step cannot make)
        classes = torch.arange(self.probs_mean.shape[-1], device=value.device)
        onehot = (value.long().unsqueeze(-1) == classes).to(self.probs_mean.dtype)
        return -0.5 * (self.probs_var.log() + (onehot - self.probs_mean).square() / self.probs_var).sum(-1)
