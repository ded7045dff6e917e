r"""``Moments``: an activation carried as its elementwise mean and variance (VDP++).

VDP++: “Efficient Scaling of Bayesian Neural Networks” (2024), after VDP (Dera, Rasool & Bouaynaya 2019).

Under :func:`~pyrobnn.handlers.vdp` every Normal-family weight reaches its
layer as a :class:`~pyrobnn.handlers.gaussian_weight.GaussianWeight`, and the first Linear/Conv layer returns a
``Moments`` tensor instead of a sample. ``Moments`` is a ``torch.Tensor`` subclass whose ``__torch_function__``
propagates :math:`(\mu, \sigma^2)` through the operations the network calls,
with no covariances (variance-only density propagation):

- Linear/conv, deterministic input :math:`x`: :math:`\mu_z = F(x, \mu_W) + \mu_b`,
  :math:`\sigma_z^2 = F(x^2, \sigma_W^2) + \sigma_b^2`; random input :math:`(\mu_a, \sigma_a^2)`:
  :math:`\sigma_z^2 = F(\sigma_a^2, \sigma_W^2 + \mu_W^2) + F(\mu_a^2, \sigma_W^2) + \sigma_b^2`
  (exact for independent inputs and weights);
- elementwise activations, first-order Taylor: :math:`\mu = f(\mu_z)`, :math:`\sigma^2 = \sigma_z^2 f'(\mu_z)^2`;
- max-pool, adaptive max-pool: co-pooling (the max of the means, the variance at its argmax); average pool:
  :math:`\sigma^2 = \mathrm{avg}(\sigma_z^2)/k` over :math:`k` window elements; adaptive average pool (global
  pooling of ResNets): the same with :math:`k` the size of each output's region;
- mean and sum over dimensions: :math:`\sigma^2 = \sum_i \sigma_i^2 / n^2` and :math:`\sum_i \sigma_i^2`;
- flatten/reshape/view: both moments alike; concatenation: means and variances alike (a deterministic
  tensor has variance 0); dropout: identity;
- addition (residual): means add, variances add (independence);
- in-place forms (``x += y``, ``x.relu_()``, ``F.relu(x, inplace=True)``): the rule's moments written into
  ``x``, which must be a ``Moments`` (a deterministic tensor cannot hold a variance: ``x.add_(y)`` raises,
  and ``x += y`` falls back to ``x = x + y`` as Python does when ``+=`` is not implemented);
- softmax (Jacobian rule): :math:`\sigma_i^2 = \sum_j J_{ij}^2\sigma_j^2`, :math:`J = \mathrm{diag}(p) - pp^\top`;
- BatchNorm / LayerNorm: the normalisation computed on the means is an affine map per unit,
  applied to the mean; the variance is scaled by its squared slope;
- multi-head self-attention (:func:`_multi_head_attention`), with a key-padding mask: masked keys get
  attention probability 0 (mean score :math:`-\infty`, variance 0);
- what a model does to build its observation from the output (``Normal(mu, sigma)``, ``Categorical(logits=...)``):
  broadcasting and stacking (both moments alike), subtraction (variances add), log-sum-exp (mean
  :math:`\log\sum e^{\mu_i}`, variance :math:`\sum p_i^2\sigma_i^2`), and the argument checks' comparisons, made on
  the means.

Any other operation raises ``TypeError`` naming it: the variance is never dropped silently.
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F

from pyrobnn.handlers.distribution_tensor import DistributionTensor

__all__ = ["Moments", "affine_moments", "per_unit", "variance_op"]


class Moments(DistributionTensor):
    """A tensor of independent Gaussians, known by its mean ``loc`` and its ``variance`` (both attached to
    autograd; named as in ``torch.distributions``, so that the tensor methods ``mean()`` and ``var()``
    the network may call stay the moment rules)."""

    loc: torch.Tensor
    variance: torch.Tensor

    @staticmethod
    def __new__(cls, mean: torch.Tensor, var: torch.Tensor):
        self = cls.wrap(mean)
        self.loc, self.variance = mean, var
        return self

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.loc, self.variance

    def __repr__(self):
        return f"Moments(shape={tuple(self.loc.shape)})"

    @classmethod
    def dispatch(cls, func, args, kwargs):
        rule = _RULES.get(func)
        if rule is None:
            name = getattr(func, "__qualname__", getattr(func, "__name__", repr(func)))
            raise TypeError(
                f"vdp: no moment-propagation rule for {name}; the network uses an operation VDP++ does not "
                f"cover (supported: {supported_operations()})"
            )
        if kwargs.get("inplace"):  # F.relu(x, inplace=True) and the like write their result into x
            return _assign(args[0], rule(*args, **dict(kwargs, inplace=False)), name=func)
        return rule(*args, **kwargs)


def _mv(x):
    """Mean and elementwise variance of a :class:`DistributionTensor` (``Moments``, ``GaussianWeight``), or
    of a plain tensor (variance None)."""
    if isinstance(x, DistributionTensor):
        mean, var = x.moments()
        return mean, var.expand_as(mean)
    return x, None


def per_unit(values: torch.Tensor, op, ndim: int) -> torch.Tensor:
    """``values`` (one per output unit, or one shared) shaped to broadcast against an ``ndim``-dimensional output
    of ``op``: units are the last dimension of ``F.linear``'s output and dimension 1 of ``F.convNd``'s."""
    return values.reshape(-1) if op is F.linear else values.reshape((1, -1) + (1,) * (ndim - 2))


def variance_op(op, a: torch.Tensor, var: torch.Tensor, shape: torch.Size, *rest, bias_var=None,
                **kwargs) -> torch.Tensor:
    r"""``op(a, var.expand(shape), None, *rest)`` for ``op`` = ``F.linear``/``F.convNd``, where ``var`` is a weight
    variance of ``shape`` or one shared per output unit or per layer (``(out, 1, ...)``, ``(1, ...)``), plus
    ``bias_var`` (one per output unit) when given.

    A shared variance factors out of the sum: :math:`\sum_i a_i \sigma_n^2 = \sigma_n^2 \sum_i a_i`, one
    window sum of ``a`` (a single-output-channel op) scaled per unit, instead of a full layer's op. A variance of
    every weight takes ``bias_var`` as the op's bias (added by the op itself).
    """
    groups = kwargs.get("groups", rest[3] if len(rest) > 3 else 1)
    if var.shape == shape and (bias_var is None or bias_var.shape == shape[:1]):
        return op(a, var, bias_var, *rest, **kwargs)
    if var.shape == shape or var.shape[1:].numel() != 1 or groups != 1:
        out = op(a, var.expand(shape), None, *rest, **kwargs)
    else:
        summed = op(a, a.new_ones((1,) + tuple(shape[1:])), None, *rest, **kwargs)
        out = summed * per_unit(var, op, summed.dim())
    return out if bias_var is None else out + per_unit(bias_var, op, out.dim())


def _wrap(mean, var):
    return mean if var is None else Moments(mean, var)


def affine_moments(op, x, weight, bias=None, *rest, **kwargs):
    r"""Moments of ``op(x, W, b, *rest)`` for ``F.linear``/``F.convNd`` with any of x, W, b random:
    :math:`\sigma_z^2 = F(\sigma_x^2, \mu_W^2) + F(\sigma_x^2 + \mu_x^2, \sigma_W^2) + \sigma_b^2`, which is
    the textbook :math:`F(\sigma_x^2, \sigma_W^2 + \mu_W^2) + F(\mu_x^2, \sigma_W^2) + \sigma_b^2` regrouped so that a
    weight variance shared per output unit (eq. 12) costs one window sum (:func:`variance_op`)."""
    mean_x, var_x = _mv(x)
    mean_w, var_w = weight.moments() if isinstance(weight, DistributionTensor) else (weight, None)  # may be shared
    mean_b, var_b = _mv(bias) if bias is not None else (None, None)
    mean = op(mean_x, mean_w, mean_b, *rest, **kwargs)
    terms = []
    if var_x is not None:
        terms.append(op(var_x, mean_w.square(), None, *rest, **kwargs))
    if var_w is not None:  # the bias variance goes with the weights' (one op when every weight has its own)
        second = mean_x.square() if var_x is None else var_x + mean_x.square()
        terms.append(variance_op(op, second, var_w, mean_w.shape, *rest, bias_var=var_b, **kwargs))
    elif var_b is not None:
        terms.append(per_unit(var_b, op, mean.dim()))
    var = None if not terms else sum(terms[1:], terms[0])
    return _wrap(mean, var if var is None or var.shape == mean.shape else var.expand_as(mean))


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


def _assign(target, result, name=None):
    """The in-place form of a rule: ``result``'s moments written into ``target``, which is returned."""
    if not isinstance(target, Moments):
        name = getattr(name, "__name__", name) or "an in-place operation"
        raise TypeError(f"vdp: {name} would write moments into a deterministic tensor, which cannot hold a "
                        "variance; use the out-of-place form (x = x + y instead of x += y)")
    target.loc, target.variance = _mv(result)
    return target


def _in_place(rule):
    """``x.op_(...)`` (``add_``, which ``x += y`` calls, ``relu_``, ...): the out-of-place ``rule`` written into
    ``x``."""

    def in_place(target, *args, **kwargs):
        return _assign(target, rule(target, *args, **kwargs))

    return in_place


def _co_pool(pool, nd):
    r"""Co-pooling for ``pool`` = ``F.max_poolNd_with_indices`` or ``F.adaptive_max_poolNd_with_indices`` (which
    return the maxima and their indices whatever ``return_indices`` says): over each window :math:`R`,
    :math:`\mu = \max_{i \in R} \mu_i` and :math:`\sigma^2 = \sigma^2_{i^*}`, :math:`i^* = \arg\max_{i\in R}\mu_i`."""
    signature = inspect.signature(pool)

    def rule(x, *args, **kwargs):
        mean, var = _mv(x)
        out, indices = pool(mean, *args, **kwargs)
        result = Moments(out, var.flatten(-nd).gather(-1, indices.flatten(-nd)).view_as(out))
        wanted = signature.bind(mean, *args, **kwargs).arguments.get("return_indices", False)
        return (result, indices) if wanted else result

    return rule


def _region_sizes(in_sizes, out_sizes, like: torch.Tensor) -> torch.Tensor:
    r"""The number of inputs pooled into each output of adaptive pooling, shaped ``out_sizes``: along a
    dimension of length :math:`L` pooled to :math:`O` outputs, output :math:`i` averages
    :math:`[\lfloor iL/O \rfloor, \lceil (i+1)L/O \rceil)` (PyTorch's regions; they overlap when :math:`O \nmid L`)."""
    count = torch.ones((), dtype=like.dtype, device=like.device)
    for length, size in zip(in_sizes, out_sizes):
        i = torch.arange(size, device=like.device)
        extent = -((-(i + 1) * length) // size) - (i * length) // size
        count = count.unsqueeze(-1) * extent.to(like.dtype)
    return count


def _adaptive_avg_pool(nd):
    pool = getattr(F, f"adaptive_avg_pool{nd}d")

    def rule(x, output_size):
        r"""Adaptive average pooling of independent units: each output averages its region of :math:`k`
        inputs, :math:`\mu = \mathrm{avg}(\mu_i)`, :math:`\sigma^2 = \mathrm{avg}(\sigma_i^2) / k`."""
        mean, var = _mv(x)
        out = pool(mean, output_size)
        return Moments(out, pool(var, output_size) / _region_sizes(mean.shape[-nd:], out.shape[-nd:], var))

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


def _product(mean_a, var_a, mean_b, var_b, op):
    r"""Moments of ``op(a, b)`` for a bilinear ``op`` (elementwise product, matmul) of independent a, b:
    :math:`\mu = op(\mu_a, \mu_b)`,
    :math:`\sigma^2 = op(\sigma_a^2, \sigma_b^2 + \mu_b^2) + op(\mu_a^2, \sigma_b^2)`."""
    mean = op(mean_a, mean_b)
    terms = []
    if var_a is not None:
        terms.append(op(var_a, mean_b * mean_b if var_b is None else var_b + mean_b * mean_b))
    if var_b is not None:
        terms.append(op(mean_a * mean_a, var_b))
    return _wrap(mean, sum(terms[1:], terms[0]) if terms else None)


def _bilinear(op):
    def rule(a, b, *args, **kwargs):
        (mean_a, var_a), (mean_b, var_b) = _mv(a), _mv(b)
        return _product(mean_a, var_a, mean_b, var_b, lambda u, v: op(u, v, *args, **kwargs))

    return rule


def _divide(a, b, *, rounding_mode=None):
    mean_b, var_b = _mv(b)
    if var_b is not None or rounding_mode is not None:
        raise TypeError("vdp: no moment-propagation rule for a division by a random tensor (or with rounding)")
    return _bilinear(torch.mul)(a, 1 / mean_b)


def _reduced_mean(x, dim=None, keepdim=False, *, dtype=None):
    r"""Mean over ``dim`` of independent units: :math:`\sigma^2 = \mathrm{mean}(\sigma_i^2) / n`."""
    mean, var = _mv(x)
    out = mean.mean(dim, keepdim, dtype=dtype) if dim is not None else mean.mean(dtype=dtype)
    if var is None:
        return out
    n = mean.numel() // max(out.numel(), 1)
    return Moments(out, (var.mean(dim, keepdim, dtype=dtype) if dim is not None else var.mean(dtype=dtype)) / n)


def _concatenate(tensors, dim=0):
    r"""``torch.cat``: means and variances concatenated alike (a deterministic tensor has :math:`\sigma^2 = 0`)."""
    pairs = [_mv(t) for t in tensors]
    variances = [torch.zeros_like(mean) if var is None else var for mean, var in pairs]
    return Moments(torch.cat([mean for mean, _ in pairs], dim), torch.cat(variances, dim))


def _stack(tensors, dim=0):
    r"""``torch.stack``: means and variances stacked alike (a deterministic tensor has :math:`\sigma^2 = 0`)."""
    pairs = [_mv(t) for t in tensors]
    variances = [torch.zeros_like(mean) if var is None else var for mean, var in pairs]
    return Moments(torch.stack([mean for mean, _ in pairs], dim), torch.stack(variances, dim))


def _broadcast(*tensors):
    """``torch.broadcast_tensors`` (which a distribution's constructor calls on its parameters): every tensor
    expanded to the common shape, a ``Moments`` its mean and variance alike."""
    shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    out = []
    for t in tensors:
        mean, var = _mv(t)
        out.append(mean.expand(shape) if var is None else Moments(mean.expand(shape), var.expand(shape)))
    return out


def _subtract(a, b, *, alpha=1):
    return _add(a, b, alpha=-alpha)


def _logsumexp(x, dim, keepdim=False):
    r""":math:`\mu = \log\sum_i e^{\mu_i}`, :math:`\sigma^2 = \sum_i p_i^2\sigma_i^2`, :math:`p` the softmax
    of the means (first-order Taylor: the gradient of log-sum-exp is the softmax)."""
    mean, var = _mv(x)
    value = torch.logsumexp(mean, dim, keepdim=keepdim)
    if var is None:
        return value
    return Moments(value, (torch.softmax(mean, dim).square() * var).sum(dim, keepdim=keepdim))


def _on_means(op):
    """A comparison (a distribution's argument check, ``value == value``): of the means, deterministic."""

    def rule(*args, **kwargs):
        return op(*(_mv(a)[0] for a in args), **kwargs)

    return rule


def _multi_head_attention(query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias,
                          bias_k, bias_v, add_zero_attn, dropout_p, out_proj_weight, out_proj_bias, training=True,
                          key_padding_mask=None, need_weights=True, attn_mask=None, use_separate_proj_weight=False,
                          q_proj_weight=None, k_proj_weight=None, v_proj_weight=None, static_k=None, static_v=None,
                          average_attn_weights=True, is_causal=False):
    r"""Multi-head self-attention (``nn.MultiheadAttention``) on moments, inputs ``(L, N, E)``.

    Approximation: the queries, keys and values of a head are treated as independent Gaussians
    (they are computed from the same input, so they are in fact correlated), and attention
    dropout is the identity. Then every step is a rule above: the in/out projections are
    :func:`affine_moments`; the scores :math:`QK^\top/\sqrt{d}` and the output :math:`PV` are
    products of independent factors (:func:`_product`: exact first and second moments given
    independence); the attention weights :math:`P` use the softmax Jacobian rule.

    A ``key_padding_mask`` ``(N, L)`` (True, or :math:`-\infty` in a float mask, at padded keys; a finite
    float is an additive bias) is added to the mean scores before the softmax and the score variance of a
    masked key is set to 0: masked keys get attention probability 0 and no variance, exactly as if the
    padded keys were absent.
    """
    options = {"bias_k/bias_v": bias_k is not None or bias_v is not None, "add_zero_attn": add_zero_attn,
               "attn_mask": attn_mask is not None,
               "is_causal": is_causal, "separate projection weights": use_separate_proj_weight,
               "static_k/static_v": static_k is not None or static_v is not None,
               "cross-attention (query, key, value differ)": not (query is key is value)}
    unsupported = [name for name, used in options.items() if used]
    if unsupported:
        raise TypeError(f"vdp: multi-head attention moments support plain self-attention only, not {unsupported}")
    length, batch, embed = query.shape
    heads = lambda t: t.reshape(length, batch * num_heads, embed // num_heads).transpose(0, 1)
    mean, var = _mv(affine_moments(F.linear, query, in_proj_weight, in_proj_bias))
    (mean_q, mean_k, mean_v), (var_q, var_k, var_v) = (map(heads, t.chunk(3, -1)) for t in (mean, var))
    scale = (embed // num_heads) ** -0.5
    scores = _product(mean_q * scale, var_q * scale**2, mean_k.transpose(1, 2), var_k.transpose(1, 2), torch.bmm)
    if key_padding_mask is not None:  # (N, L) -> one row of key biases per (batch, head): (N * heads, 1, L)
        bias = key_padding_mask
        if bias.dtype == torch.bool:
            bias = torch.zeros(bias.shape, dtype=scores.loc.dtype, device=bias.device).masked_fill(bias, -math.inf)
        bias = bias.to(scores.loc.dtype).repeat_interleave(num_heads, 0).unsqueeze(1)
        scores = Moments(scores.loc + bias, scores.variance.masked_fill(bias == -math.inf, 0.0))
    weights = _softmax(scores, -1)
    out = _product(weights.loc, weights.variance, mean_v, var_v, torch.bmm)
    merge = lambda t: t.transpose(0, 1).reshape(length, batch, embed)
    out = affine_moments(F.linear, Moments(merge(out.loc), merge(out.variance)), out_proj_weight, out_proj_bias)
    if not need_weights:
        return out, None
    weights = weights.loc.view(batch, num_heads, length, length)
    return out, weights.mean(1) if average_attn_weights else weights


def _rules() -> dict:
    rules = {op: (lambda op: lambda *a, **k: affine_moments(op, *a, **k))(op)
             for op in (F.linear, F.conv1d, F.conv2d, F.conv3d)}
    for op in (F.relu, torch.relu, torch.Tensor.relu):
        rules[op] = _relu
    for op in (torch.sigmoid, torch.Tensor.sigmoid, F.sigmoid, torch.tanh, torch.Tensor.tanh, F.tanh, F.gelu,
               F.silu, F.elu, F.leaky_relu, F.softplus, torch.exp, torch.Tensor.exp):
        rules[op] = _elementwise(op)
    for op in (torch.flatten, torch.Tensor.flatten, torch.reshape, torch.Tensor.reshape, torch.Tensor.view,
               torch.transpose, torch.Tensor.transpose, torch.permute, torch.Tensor.permute, torch.Tensor.contiguous,
               torch.unflatten, torch.Tensor.unflatten, torch.squeeze, torch.Tensor.squeeze, torch.unsqueeze,
               torch.Tensor.unsqueeze, torch.Tensor.__getitem__, torch.Tensor.expand):
        rules[op] = _both(op)
    for op in (torch.mul, torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__):
        rules[op] = _bilinear(torch.mul)
    for op in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.Tensor.bmm):
        rules[op] = _bilinear(torch.matmul)
    for op in (torch.div, torch.Tensor.div, torch.Tensor.__truediv__):
        rules[op] = _divide
    for op in (torch.mean, torch.Tensor.mean):
        rules[op] = _reduced_mean
    for op in (F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout):
        rules[op] = _identity
    for op in (torch.add, torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__):
        rules[op] = _add
    for op in (torch.cat, torch.concat, torch.concatenate):
        rules[op] = _concatenate
    for nd in (1, 2, 3):
        max_pool = _co_pool(getattr(F, f"max_pool{nd}d_with_indices"), nd)
        adaptive_max_pool = _co_pool(getattr(F, f"adaptive_max_pool{nd}d_with_indices"), nd)
        rules.update({getattr(F, f"max_pool{nd}d"): max_pool, getattr(F, f"max_pool{nd}d_with_indices"): max_pool,
                      getattr(F, f"adaptive_max_pool{nd}d"): adaptive_max_pool,
                      getattr(F, f"adaptive_max_pool{nd}d_with_indices"): adaptive_max_pool,
                      getattr(F, f"adaptive_avg_pool{nd}d"): _adaptive_avg_pool(nd)})
    in_place = {torch.Tensor.add_: torch.Tensor.add, torch.Tensor.mul_: torch.Tensor.mul,  # also x += y, x *= y
                torch.relu_: torch.relu, torch.Tensor.relu_: torch.relu}
    rules.update({op: _in_place(rules[out_of_place]) for op, out_of_place in in_place.items()})
    rules.update({F.avg_pool1d: _avg_pool(1), F.avg_pool2d: _avg_pool(2), F.avg_pool3d: _avg_pool(3),
                  F.softmax: _softmax, torch.softmax: _softmax, torch.Tensor.softmax: _softmax,
                  F.batch_norm: _batch_norm, F.layer_norm: _layer_norm,
                  F.multi_head_attention_forward: _multi_head_attention})
    for op in (torch.sum, torch.Tensor.sum):  # a sum of independent units: means add, variances add
        rules[op] = _both(op)
    # what a distribution over the output does with it (a model that builds its own Normal or Categorical)
    for op in (torch.sub, torch.Tensor.sub, torch.Tensor.__sub__):
        rules[op] = _subtract
    rules[torch.Tensor.__rsub__] = lambda a, b: _add(b, a, alpha=-1)
    rules[torch.Tensor.__neg__] = rules[torch.neg] = lambda a: _bilinear(torch.mul)(a, -1.0)
    rules.update({torch.stack: _stack, torch.broadcast_tensors: _broadcast, torch.logsumexp: _logsumexp,
                  torch.Tensor.logsumexp: _logsumexp})
    for op in (torch.eq, torch.Tensor.eq, torch.Tensor.__eq__, torch.ne, torch.Tensor.ne, torch.Tensor.__ne__):
        rules[op] = _on_means(op)
    return rules


_RULES = _rules()


def supported_operations() -> str:
    """The operations :class:`Moments` propagates, by name (read from the rule table)."""
    names = {getattr(f, "__name__", None) or getattr(f, "__qualname__", repr(f)) for f in _RULES}
    return ", ".join(sorted(n.split(".")[-1] for n in names))
