r"""Likelihoods: the observation site of a Bayesian network, and the predictive it implies.

Each likelihood maps the network output to a distribution over targets and
observes the minibatch inside ``pyro.plate("data", size=N, subsample=...)``,
so Pyro scales the log-likelihood by :math:`N/B` and the minibatch ELBO is
:math:`\mathcal L = \frac{N}{B}\sum_{b} \mathbb E_q \log p(y_b | x_b, w) - \beta\,\mathrm{KL}(q\|p)`.
From ``S`` sampled network outputs, :meth:`Likelihood.predictive` summarises the posterior
predictive; for classification it splits its uncertainty with :func:`uncertainty`.

VDP++ below is the variance-only variational density propagation of "Efficient Scaling of
Bayesian Neural Networks" (IEEE Access 2024), which simplifies the VDP of Dera, Rasool &
Bouaynaya (2019); equation numbers refer to the former.
"""

from __future__ import annotations

import pyro
import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.nn import PyroModule
from pyro.poutine.util import is_validation_enabled
from torch import nn

from pyrobnn.checks import check_labels, check_probs, choice, positive
from pyrobnn.distributions import MomentCategorical
from pyrobnn.handlers.moments import Moments

__all__ = [
    "Likelihood",
    "Categorical",
    "Gaussian",
    "HeteroscedasticGaussian",
    "NormalObservation",
    "LIKELIHOODS",
    "likelihood_of",
    "uncertainty",
]


def _entropy(p: torch.Tensor) -> torch.Tensor:
    """H[p] = -sum_c p_c log p_c over the last dimension, with 0 log 0 = 0."""
    return -torch.special.xlogy(p, p).sum(-1)


def uncertainty(probs: torch.Tensor) -> dict[str, torch.Tensor]:
    """Split predictive uncertainty per example from Monte-Carlo class probabilities.

    ``probs`` has shape (S, N, C): softmax probabilities of S posterior samples.
    Returns tensors of shape (N,), in nats:

    * ``total``     = H[E_s p_s]           (entropy of the predictive mean)
    * ``aleatoric`` = E_s H[p_s]           (expected entropy)
    * ``epistemic`` = total - aleatoric    (mutual information I[y; w], clamped at 0)

    Depeweg et al. 2018, "Decomposition of uncertainty in Bayesian deep learning";
    Smith & Gal 2018, "Understanding measures of uncertainty for adversarial example detection".
    """
    check_probs(probs, ("S", "N", "C"))
    total = _entropy(probs.mean(0))
    aleatoric = _entropy(probs).mean(0)
    epistemic = (total - aleatoric).clamp_min(0)
    return {"total": total, "aleatoric": aleatoric, "epistemic": epistemic}


def _full_precision(output: torch.Tensor) -> torch.Tensor:
    """A half-precision network output (``torch.autocast``) in float32, so log-densities are computed in fp32."""
    if output.dtype not in (torch.float16, torch.bfloat16):
        return output
    if isinstance(output, Moments):
        return Moments(output.loc.float(), output.variance.float())
    return output.float()


class Likelihood(PyroModule):
    """Base class. Subclasses override :meth:`distribution` and :meth:`predictive` (both raise
    ``NotImplementedError`` here), and may override :meth:`check` and :meth:`moment_distribution`."""

    task: str = "classification"

    def distribution(self, output: torch.Tensor) -> dist.TorchDistribution:
        """Per-example distribution of the target given the network output (batch shape ``(B,)``)."""
        raise NotImplementedError(f"{type(self).__name__} must override distribution(output)")

    def predictive(self, outputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """Summaries of the posterior predictive from ``S`` sampled outputs ``(S, N, ...)``."""
        raise NotImplementedError(f"{type(self).__name__} must override predictive(outputs)")

    def check(self, output: torch.Tensor, y: torch.Tensor | None) -> None:
        """Raise a clear ``ValueError`` when output or targets cannot be scored."""

    def moment_distribution(self, output: Moments) -> dist.TorchDistribution:
        """The observation model when the network output is propagated moments (VDP++)."""
        raise TypeError(f"{type(self).__name__} does not support VDP++ moment propagation")

    def targets_for(self, output: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor | None:
        """``y`` shaped as :meth:`distribution` scores it against ``output``: as it is (a regression with one target
        per example also takes ``(N,)`` for ``(N, 1)``)."""
        return y

    def output_of(self, fn: dist.TorchDistribution) -> torch.Tensor:
        """The output from which :meth:`distribution` rebuilds ``fn``: how a model that builds its observation
        itself (:class:`~pyrobnn.model.protocol.TracedModel`) hands it on as a tensor."""
        raise TypeError(f"{type(self).__name__} cannot read an observed distribution back into an output")

    def forward(self, output: torch.Tensor, y: torch.Tensor | None = None, num_data: int | None = None):
        """Observe ``y`` (or sample it, when ``None``) at the site ``"obs"`` given the network
        ``output`` of a minibatch, inside a data plate of size ``num_data`` (default: the batch),
        so the log-likelihood is scaled by ``num_data / batch``. ``output`` may be propagated
        :class:`~pyrobnn.handlers.moments.Moments` (VDP++), scored by :meth:`moment_distribution`.
        With Pyro's validation on, :meth:`check` runs first."""
        output = _full_precision(output)
        batch = output.shape[0]
        y = self.targets_for(output, y)
        if is_validation_enabled():
            self.check(output, y)
        subsample = torch.arange(batch, device=output.device)
        fn = self.moment_distribution(output) if isinstance(output, Moments) else self.distribution(output)
        with pyro.plate("data", size=num_data or batch, subsample=subsample):
            return pyro.sample("obs", fn, obs=y)


class Categorical(Likelihood):
    """Classification: :math:`y \\sim \\mathrm{Categorical}(\\mathrm{softmax}(f(x; w)))`.

    :param vdp_objective: under :func:`~pyrobnn.handlers.vdp`, ``"gaussian"`` scores the targets by
        :class:`MomentCategorical` (VDP++ eq. 11), ``"cross_entropy"`` by the cross-entropy of the
        mean logits (VDP++'s choice for large problems).
    """

    task = "classification"
    VDP_OBJECTIVES = ("gaussian", "cross_entropy")

    def __init__(self, vdp_objective: str = "gaussian"):
        super().__init__()
        self.vdp_objective = choice("vdp_objective", vdp_objective, self.VDP_OBJECTIVES)

    def distribution(self, output):
        return dist.Categorical(logits=output)

    def output_of(self, fn):
        return fn.logits

    def moment_distribution(self, output):
        if self.vdp_objective == "cross_entropy":
            return dist.Categorical(logits=output.loc)
        probs = F.softmax(output, -1)
        return MomentCategorical(probs.loc, probs.variance)

    def check(self, output, y):
        if output.dim() != 2:
            raise ValueError(
                f"a classifier must output logits of shape (batch, classes), got {tuple(output.shape)}"
            )
        if y is not None:
            check_labels(y, output.shape[-1], "labels y", num_examples=output.shape[0])

    def predictive(self, outputs):
        probs = outputs.softmax(-1)
        return {"probs": probs.mean(0), **uncertainty(probs)}


class _GaussianBase(Likelihood):
    task = "regression"

    outputs_per_target: int = 1
    """Network outputs per target (a heteroscedastic network has a mean and a scale)."""

    def targets_for(self, output, y):
        """Targets ``(N,)`` of a network with one mean output, ``(N, 1)``, as ``(N, 1)``: without this a Gaussian of
        shape ``(N, 1)`` would broadcast them against itself to ``(N, N)``."""
        if y is not None and y.dim() == output.dim() - 1 and output.shape[-1] == self.outputs_per_target:
            return y.unsqueeze(-1)
        return y

    def mean_scale(self, output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and noise standard deviation from the network output."""
        raise NotImplementedError(f"{type(self).__name__} must override mean_scale(output)")

    def distribution(self, output):
        mean, scale = self.mean_scale(output)
        return dist.Normal(mean, scale).to_event(1)

    def moment_distribution(self, output):
        """The noise variance added to the propagated variance of the mean outputs (the first D
        columns; a heteroscedastic network's scale columns are used at their mean)."""
        mean, scale = self.mean_scale(output.loc)
        return dist.Normal(mean, (output.variance[..., : mean.shape[-1]] + scale**2).sqrt()).to_event(1)

    def check(self, output, y):
        if y is not None and y.shape != self.mean_scale(output)[0].shape:
            raise ValueError(
                f"targets y must have shape {tuple(self.mean_scale(output)[0].shape)} "
                f"(batch, outputs), got {tuple(y.shape)}"
            )

    def predictive(self, outputs):
        """Mixture moments: total variance = variance of the means (epistemic) + mean noise variance."""
        means, scales = self.mean_scale(outputs)
        epistemic = means.var(0, unbiased=False)
        aleatoric = (scales**2).expand_as(means).mean(0)
        return {
            "mean": means.mean(0),
            "std": (epistemic + aleatoric).sqrt(),
            "epistemic_std": epistemic.sqrt(),
            "aleatoric_std": aleatoric.sqrt(),
        }


class Gaussian(_GaussianBase):
    r"""Homoscedastic regression :math:`y \sim \mathcal N(f(x; w), \sigma^2)`, σ fixed or learned.

    :param scale: the noise standard deviation (its initial value when learned).
    :param learn_scale: learn σ as a point estimate, through the parameter :math:`\log\sigma`
        (an ``nn.Parameter`` of this module, so each model keeps its own).
    """

    def __init__(self, scale: float = 1.0, learn_scale: bool = False):
        super().__init__()
        value = torch.tensor(positive("scale (noise standard deviation)", scale)).log()
        if learn_scale:
            self.log_scale = nn.Parameter(value)
        else:
            self.register_buffer("log_scale", value)

    @property
    def scale(self) -> torch.Tensor:
        return self.log_scale.exp()

    def mean_scale(self, output):
        return output, self.scale


class HeteroscedasticGaussian(_GaussianBase):
    """Heteroscedastic regression: the network outputs ``2 D`` values, mean and a raw scale;
    :math:`\\sigma(x) = \\mathrm{softplus}(\\cdot) + \\sigma_{\\min}`."""

    outputs_per_target = 2

    def __init__(self, min_scale: float = 1e-3):
        super().__init__()
        self.min_scale = positive("min_scale (the smallest noise standard deviation)", min_scale)

    def mean_scale(self, output):
        if output.shape[-1] % 2:
            raise ValueError(
                "a heteroscedastic network must output 2*D values (mean and scale per target), "
                f"got {output.shape[-1]}"
            )
        mean, raw = output.chunk(2, dim=-1)
        return mean, F.softplus(raw) + self.min_scale


class NormalObservation(_GaussianBase):
    r"""Regression observed by a model's own ``pyro.sample(name, Normal(loc, scale), obs=y)`` (a Pyro model of a
    network, :class:`~pyrobnn.model.protocol.TracedModel`): the output is the observation's location and scale
    stacked in a last dimension, ``(..., 2)``, so the noise may be a latent of the model (sampled with the
    weights) or depend on the input.

    :param event_dim: the observation's event dimensions (``Normal(...).to_event(1)``: 1).
    """

    def __init__(self, event_dim: int = 0):
        super().__init__()
        self.event_dim = event_dim

    def targets_for(self, output, y):
        return y

    def mean_scale(self, output):
        return output[..., 0], output[..., 1]

    def distribution(self, output):
        return dist.Normal(output[..., 0], output[..., 1]).to_event(self.event_dim)

    def output_of(self, fn):
        base = fn.base_dist if isinstance(fn, dist.Independent) else fn
        return torch.stack(torch.broadcast_tensors(base.loc, base.scale), -1)

    def moment_distribution(self, output):
        """Under VDP++: the noise variance added to the propagated variance of the location."""
        return dist.Normal(output.loc[..., 0], (output.variance[..., 0] + output.loc[..., 1] ** 2).sqrt()).to_event(
            self.event_dim)

    def check(self, output, y):
        if y is not None and y.shape != output.shape[:-1]:
            raise ValueError(f"targets y must have shape {tuple(output.shape[:-1])}, got {tuple(y.shape)}")


def likelihood_of(fn: dist.TorchDistribution, name: str = "obs") -> Likelihood:
    """The :class:`Likelihood` of a model's observed distribution ``fn`` (its site ``name``): a ``Categorical``
    is :class:`Categorical` (its logits are the output), a ``Normal`` (or an ``Independent`` of one)
    :class:`NormalObservation`; any other is refused, naming the site."""
    base = fn.base_dist if isinstance(fn, dist.Independent) else fn
    if isinstance(base, dist.Categorical) and not isinstance(fn, dist.Independent):
        return Categorical()
    if isinstance(base, dist.Normal):
        return NormalObservation(fn.event_dim)
    raise ValueError(f"the observed site {name!r} is a {type(fn).__name__}: pyrobnn predicts and scores Categorical "
                     "(classification) and Normal (regression) observations; observe y with one of them")


LIKELIHOODS = {"categorical": Categorical, "gaussian": Gaussian, "heteroscedastic": HeteroscedasticGaussian}
"""Observation models selectable by name (``pyrobnn train --likelihood``)."""
