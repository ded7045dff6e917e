r"""``Moments``: an activation carried as its elementwise mean and variance (VDP++, paper 002).

Under :func:`~pyrobnn.handlers.vdp` every Normal-family weight reaches its
layer as a :class:`~pyrobnn.gaussian_weight.GaussianWeight` in ``"moments"``
mode, and the first Linear/Conv layer returns a ``Moments`` tensor instead of
a sample. ``Moments`` is a ``torch.Tensor`` subclass whose ``__torch_function__``
propagates :math:`(\mu, \sigma^2)` through the operations the network calls,
with no covariances (variance-only density propagation, SPEC section 5):

- Linear/conv, deterministic input :math:`x`: :math:`\mu_z = F(x, \mu_W) + \mu_b`,
  :math:`\sigma_z^2 = F(x^2, \sigma_W^2) + \sigma_b^2`; random input :math:`(\mu_a, \sigma_a^2)`:
  :math:`\sigma_z^2 = F(\sigma_a^2, \sigma_W^2 + \mu_W^2) + F(\mu_a^2, \sigma_W^2) + \sigma_b^2`
  (exact for independent inputs and weights);
- elementwise activations, first-order Taylor: :math:`\mu = f(\mu_z)`, :math:`\sigma^2 = \sigma_z^2 f'(\mu_z)^2`;
- max-pool: co-pooling (the max of the means, the variance at its argmax); average pool:
  :math:`\sigma^2 = \mathrm{avg}(\sigma_z^2)/k` over :math:`k` window elements;
- flatten/reshape/view: both moments alike; dropout: identity;
- addition (residual): means add, variances add (independence);
- softmax (Jacobian rule): :math:`\sigma_i^2 = \sum_j J_{ij}^2\sigma_j^2`, :math:`J = \mathrm{diag}(p) - pp^\top`;
- BatchNorm / LayerNorm: the normalisation computed on the means is an affine map per unit,
  applied to the mean; the variance is scaled by its squared slope.

Any other operation raises ``TypeError`` naming it: the variance is never dropped silently.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .distribution_tensor import DistributionTensor
from .gaussian_weight import GaussianWeight

__all__ = ["Moments", "affine_moments"]

class Moments(DistributionTensor):
    """A tensor of independent Gaussians, known by ``mean`` and ``var`` (both attached to autograd)."""

    mean: torch.Tensor
    var: torch.Tensor

    @staticmethod
    def __new__(cls, mean: torch.Tensor, var: torch.Tensor):
        self = cls.wrap(mean)
        self.mean, self.var = mean, var
        return self

    def __repr__(self):
        return f"Moments(shape={tuple(self.mean.shape)})"

    @classmethod
    def dispatch(cls, func, args, kwargs):
        rule = _RULES.get(func)
        if rule is None:
            name = getattr(func, "__qualname__", getattr(func, "__name__", repr(func)))
            raise TypeError(
                f"vdp: no moment-propagation rule for {name}; the network uses an operation VDP++ does not "
                f"cover (supported: linear, conv1d/2d/3d, elementwise activations, max/avg pooling, flatten/"
                f"reshape, dropout, addition, softmax, batch/layer norm)"
            )
        return rule(*args, **kwargs)


def _mv(x):
    """Mean and variance of a ``Moments``, a ``GaussianWeight`` or a plain tensor (variance None)."""
    if isinstance(x, Moments):
        return x.mean, x.var
    if isinstance(x, GaussianWeight):
        return x.moments()
    return x, None


def _wrap(mean, var):
    return mean if var is None else Moments(mean, var)


def affine_moments(op, x, weight, bias=None, *rest, **kwargs):
    """Moments of ``op(x, W, b, *rest)`` for ``F.linear``/``F.convNd`` with any of x, W, b random."""
    mean_x, var_x = _mv(x)
    mean_w, var_w = _mv(weight)
    mean_b, var_b = _mv(bias) if bias is not None else (None, None)
    mean = op(mean_x, mean_w, mean_b, *rest, **kwargs)
    var = None
    if var_w is not None:
        var = op(mean_x.square(), var_w, None, *rest, **kwargs)
    if var_x is not None:
        second = mean_w.square() if var_w is None else mean_w.square() + var_w
        term = op(var_x, second, None, *rest, **kwargs)
        var = term if var is None else var + term
    if var_b is not None:
        term = var_b.view((1, -1) + (1,) * (mean.dim() - 2)) if mean.dim() > 2 else var_b
        var = term.expand_as(mean) if var is None else var + term
    return _wrap(mean, var)


def _elementwise(f):
    """First-order Taylor rule for an elementwise function ``f(x, *args)``."""

    def rule(x, *args, **kwargs):
        mean, var = _mv(x)
        value, slope = torch.func.jvp(lambda m: f(m, *args, **kwargs), (mean,), (torch.ones_like(mean),))
        return _wrap(value, None if var is None else var * slope.square())

    return rule


def _relu(x, *args, **kwargs):
    mean, var = _mv(x)
    return _wrap(F.relu(mean), None if var is None else var * (mean > 0))


def _both(f):
    """Shape operations (flatten, reshape, view): applied to mean and variance alike."""

    def rule(x, *args, **kwargs):
        mean, var = _mv(x)
        return _wrap(f(mean, *args, **kwargs), None if var is None else f(var, *args, **kwargs))

    return rule


def _identity(x, *args, **kwargs):
    return x


def _add(a, b, *, alpha=1):
    (mean_a, var_a), (mean_b, var_b) = _mv(a), _mv(b)
    mean = mean_a + alpha * mean_b
    variances = [v for v in (var_a, None if var_b is None else alpha**2 * var_b) if v is not None]
    return _wrap(mean, sum(variances).expand_as(mean) if variances else None)


def _max_pool(nd):
    pool = getattr(F, f"max_pool{nd}d_with_indices")

    def rule(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
        mean, var = _mv(x)
        out, indices = pool(mean, kernel_size, stride, padding, dilation, ceil_mode, return_indices=True)
        # co-pooling: the variance of the unit whose mean is the maximum
        pooled = var.flatten(-nd).gather(-1, indices.flatten(-nd)).view_as(out)
        result = Moments(out, pooled)
        return (result, indices) if return_indices else result

    return rule


def _avg_pool(nd):
    pool = getattr(F, f"avg_pool{nd}d")

    def rule(x, kernel_size, stride=None, padding=0, *args, **kwargs):
        mean, var = _mv(x)
        window = math.prod(kernel_size if isinstance(kernel_size, (tuple, list)) else (kernel_size,) * nd)
        return Moments(pool(mean, kernel_size, stride, padding, *args, **kwargs),
                       pool(var, kernel_size, stride, padding, *args, **kwargs) / window)

    return rule


def _softmax(x, dim=None, *args, **kwargs):
    mean, var = _mv(x)
    p = F.softmax(mean, dim, *args, **kwargs)
    # sigma_i^2 = p_i^2 [(1 - 2 p_i) sigma_i^2 + sum_j p_j^2 sigma_j^2]
    spread = (p.square() * var).sum(dim, keepdim=True)
    return Moments(p, p.square() * ((1 - 2 * p) * var + spread))


def _batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    mean, var = _mv(x)
    out = F.batch_norm(mean, running_mean, running_var, weight, bias, training, momentum, eps)
    reduce = [0] + list(range(2, mean.dim()))
    stat_var = mean.var(reduce, unbiased=False) if training else running_var
    slope = (stat_var + eps).rsqrt() * (weight if weight is not None else 1)
    return Moments(out, var * slope.view((1, -1) + (1,) * (mean.dim() - 2)).square())


def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    mean, var = _mv(x)
    out = F.layer_norm(mean, normalized_shape, weight, bias, eps)
    dims = tuple(range(-len(normalized_shape), 0))
    slope = (mean.var(dims, unbiased=False, keepdim=True) + eps).rsqrt()
    if weight is not None:
        slope = slope * weight
    return Moments(out, var * slope.square())


def _rules() -> dict:
    rules = {op: (lambda op: lambda *a, **k: affine_moments(op, *a, **k))(op)
             for op in (F.linear, F.conv1d, F.conv2d, F.conv3d)}
    for op in (F.relu, torch.relu, torch.Tensor.relu):
        rules[op] = _relu
    for op in (torch.sigmoid, torch.Tensor.sigmoid, F.sigmoid, torch.tanh, torch.Tensor.tanh, F.tanh, F.gelu,
               F.silu, F.elu, F.leaky_relu, F.softplus, torch.exp, torch.Tensor.exp):
        rules[op] = _elementwise(op)
    for op in (torch.flatten, torch.Tensor.flatten, torch.reshape, torch.Tensor.reshape, torch.Tensor.view):
        rules[op] = _both(op)
    for op in (F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout):
        rules[op] = _identity
    for op in (torch.add, torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__):
        rules[op] = _add
    rules.update({F.max_pool1d: _max_pool(1), F.max_pool2d: _max_pool(2), F.max_pool3d: _max_pool(3),
                  F.avg_pool1d: _avg_pool(1), F.avg_pool2d: _avg_pool(2), F.avg_pool3d: _avg_pool(3),
                  F.softmax: _softmax, torch.softmax: _softmax, torch.Tensor.softmax: _softmax,
                  F.batch_norm: _batch_norm, F.layer_norm: _layer_norm})
    return rules


_RULES = _rules()
