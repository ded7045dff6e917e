r"""The Laplace approximation of a MAP fit's last layer, through ``laplace-torch`` (Daxberger et al. 2021).

The network's last ``nn.Linear`` :math:`f(x) = W\phi(x) + b` gets the Gaussian posterior

.. math:: q(W, b) = \mathcal N\big(\theta_{MAP}, P^{-1}\big), \qquad
          P = \sum_{n=1}^N J_n^\top \Lambda_n J_n + \operatorname{diag}(\lambda),

the generalised Gauss-Newton of the log likelihood at the MAP, :math:`J_n` the Jacobian of the output with respect to
the last layer's weights and :math:`\Lambda_n` the Hessian of :math:`-\log p(y_n|f)` in the output (softmax:
:math:`\operatorname{diag}(p) - pp^\top`; Gaussian: :math:`1/\sigma^2`), Kronecker-factored per parameter group
(K-FAC: :math:`W` and :math:`b` are independent blocks), and :math:`\lambda` the prior precision, tuned by
maximising the Laplace approximation of the marginal likelihood. Everything below the last layer, and every other
site, stays at its MAP value. laplace-torch builds, tunes and samples the posterior (``Laplace(...,
subset_of_weights="last_layer", hessian_structure="kron")``, ``optimize_prior_precision(method="marglik")``,
``sample``); pyrobnn gives it the last layer as an ``nn.Linear`` on the features :math:`\phi(x)` of the MAP network,
which is the same model, since the features do not depend on the last layer.

The result is an empirical posterior (:class:`~pyrobnn.infer.draws.Draws`): S draws of the last layer, the other
sites held at their MAP values, so ``predict``, ``evaluate`` and ``pyrobnn evaluate`` use it as they use NUTS draws.
With a linear last layer the sampled predictive of the outputs is laplace-torch's linearised ("GLM") predictive, up
to Monte-Carlo error.
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional

import pyro
import torch
from pyro import poutine
from torch import nn

from pyrobnn.checks import positive_int
from pyrobnn.device import device_of
from pyrobnn.guides.point import point_values
from pyrobnn.infer.draws import Draws
from pyrobnn.infer.predict import prediction_mode
from pyrobnn.model.likelihoods import Categorical, Gaussian
from pyrobnn.model.protocol import attach_output_hook, output_hooks_removed

__all__ = ["LaplaceResult", "fit_laplace", "last_layer_inputs", "last_linear", "plain_network", "LinearizedLaplace",
           "fit_linearized_laplace"]


@dataclass
class LaplaceResult(Draws):
    """Draws ``{site: (1, S, ...)}`` of the last layer and ``(1, 1, ...)`` (the MAP value) of every other site, the
    network they are replayed in, the tuned prior precision (one value: laplace-torch's scalar prior), the log
    marginal likelihood there, and laplace-torch's fitted ``KronLLLaplace`` (its model is the last layer alone: call
    it on :func:`last_layer_inputs`)."""

    prior_precision: list[float] = field(default_factory=list)
    log_marginal_likelihood: float = math.nan
    laplace: Any = None

    kind: ClassVar[str] = "laplace"
    description: ClassVar[str] = "Laplace draws written by `pyrobnn train --laplace`"

    def report(self) -> dict:
        return {"prior_precision": self.prior_precision, "log_marginal_likelihood": self.log_marginal_likelihood}

    def summary(self) -> str:
        return (f"{len(self)} draws of the last layer, prior precision {self.prior_precision[0]:.4g} (by the "
                f"marginal likelihood, log {self.log_marginal_likelihood:.4g})")



def _laplace_torch():
    """laplace-torch's ``Laplace`` (the ``laplace`` extra), imported without its dependencies' FutureWarning about
    ``torch.jit.script`` (theirs: a user's run would print it on every Laplace fit)."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="`torch.jit.script` is deprecated", category=FutureWarning)
            from laplace import Laplace
    except ImportError:
        raise ImportError("the Laplace approximation needs laplace-torch: pip install 'pyrobnn[laplace]'") from None
    return Laplace

def last_linear(model) -> tuple[nn.Linear, dict[str, str]]:
    """The network's last ``nn.Linear`` and ``{attribute: site name}`` of its Bayesian parameters (``weight`` needed);
    a network without one is a ``ValueError``."""
    linears = [module for module in model.net.modules() if isinstance(module, nn.Linear)]
    if not linears:
        raise ValueError("the last-layer Laplace approximation needs a network whose output layer is an nn.Linear; "
                         f"{type(model.net).__name__} has none")
    head = linears[-1]
    sites = {site.attr: site.name for site in model.sites() if site.module is head}
    if "weight" not in sites:
        raise ValueError("the last nn.Linear of the network has no Bayesian weight: the last-layer Laplace "
                         "approximation samples it (train with its parameters Bayesian, e.g. --bayesian all or "
                         "last-layer, not a node prior)")
    return head, sites


@torch.no_grad()
def last_layer_inputs(model, guide, x: torch.Tensor, batch_size: int = 1000,
                      transform: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> torch.Tensor:
    r"""The features :math:`\phi(x)` that the last ``nn.Linear`` of the network receives under the point-estimate
    ``guide`` (eval mode), shape ``(N, in_features)``, on the guide's device. A network whose output is not that
    layer's output (something follows it) is a ``ValueError``."""
    head, _ = last_linear(model)
    device = device_of(guide, model)
    net = poutine.replay(model.run_net, trace=poutine.trace(guide).get_trace())
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    hook = head.register_forward_hook(lambda module, inputs, output: seen.append((inputs[0], output)))
    features = []
    try:
        with prediction_mode(model):
            for part in x.split(batch_size):
                part = part.to(device)
                output = net(part if transform is None else transform(part))
                inputs, last = seen.pop()
                if last is not output:
                    raise ValueError(f"the network's output is not its last nn.Linear's ({type(head).__name__} "
                                     "feeds another operation): the last-layer Laplace approximation needs the last "
                                     "layer to give the output")
                features.append(inputs.reshape(len(part), -1))
    finally:
        hook.remove()
    return torch.cat(features)


def _likelihood(model) -> tuple[str, float]:
    """laplace-torch's name of the model's likelihood, and its noise standard deviation (1 for classification)."""
    if isinstance(model.likelihood, Categorical):
        return "classification", 1.0
    if isinstance(model.likelihood, Gaussian):
        return "regression", float(model.likelihood.scale)
    raise ValueError(f"the Laplace approximation takes a Categorical or Gaussian likelihood, not "
                     f"{type(model.likelihood).__name__}")


def fit_laplace(model, guide, x: torch.Tensor, y: torch.Tensor, *, num_samples: int = 100, seed: int = 0,
                batch_size: int = 1000, transform: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
                ) -> LaplaceResult:
    """The last-layer, Kronecker-factored Laplace approximation at a MAP fit, as ``num_samples`` posterior draws.

    :param model: a :class:`~pyrobnn.BayesianNetwork` with a Categorical or Gaussian likelihood whose last module is
        an ``nn.Linear`` with a Bayesian weight.
    :param guide: its MAP fit (:class:`~pyrobnn.guides.PointGuide`).
    :param x, y: the training data (the curvature is summed over all of it).
    :param num_samples: S, the draws of the last layer.
    :param seed: seeds the draws.
    :param batch_size: examples per pass when computing features and curvature.
    :param transform: applied to every batch of ``x`` on the device (e.g. ``ImageAugment.normalize`` for uint8
        images), as in training but without random augmentation.
    """
    num_samples = positive_int("num_samples", num_samples)
    Laplace = _laplace_torch()
    values = point_values(guide)
    likelihood, sigma_noise = _likelihood(model)
    head, sites = last_linear(model)
    features = last_layer_inputs(model, guide, x, batch_size, transform)
    linear = nn.Linear(features.shape[1], values[sites["weight"]].shape[0], bias="bias" in sites or
                       getattr(head, "bias", None) is not None).to(features)
    with torch.no_grad():
        linear.weight.copy_(values[sites["weight"]])
        if linear.bias is not None:
            linear.bias.copy_(values[sites["bias"]] if "bias" in sites else head.bias)
    targets = y.to(features.device)
    laplace = Laplace(nn.Sequential(linear), likelihood, subset_of_weights="last_layer", hessian_structure="kron",
                      sigma_noise=sigma_noise, last_layer_name="0")
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features, targets), batch_size=batch_size)
    laplace.fit(loader)
    with warnings.catch_warnings():  # about the link approximation of laplace-torch's own predictive, unused here
        warnings.filterwarnings("ignore", message="By default `link_approx`")
        laplace.optimize_prior_precision(method="marglik", pred_type="glm")
    generator = torch.Generator(device=features.device).manual_seed(seed)
    samples = laplace.sample(num_samples, generator=generator).detach()
    draws = {name: value.reshape(1, 1, *value.shape) for name, value in values.items()}
    weight = linear.weight.numel()
    draws[sites["weight"]] = samples[:, :weight].reshape(1, num_samples, *linear.weight.shape)
    if "bias" in sites:
        draws[sites["bias"]] = samples[:, weight:].reshape(1, num_samples, *linear.bias.shape)
    return LaplaceResult(model, draws, prior_precision=laplace.prior_precision.detach().cpu().flatten().tolist(),
                         log_marginal_likelihood=float(laplace.log_marginal_likelihood().detach()), laplace=laplace)


def plain_network(model, values: dict[str, torch.Tensor], trainable: Callable[[str], bool]) -> nn.Module:
    """A copy of ``model``'s network as a plain torch module: every ``PyroModule`` its own class again, every
    Bayesian site an ``nn.Parameter`` at ``values[site]``, trained (``requires_grad``) where ``trainable(site)``,
    every other parameter frozen; what a library such as laplace-torch differentiates (the network itself keeps its
    sites). A posterior's predictive hook on the network (a temperature, a Laplace perturbation) is not copied."""
    with output_hooks_removed(model.net):
        net = copy.deepcopy(model.net)
    for module in list(net.modules()):
        if isinstance(module, pyro.nn.PyroModule):
            module._pyro_samples.clear()
            module.__class__ = next(cls for cls in type(module).__mro__[1:]
                                    if issubclass(cls, nn.Module) and not issubclass(cls, pyro.nn.PyroModule))
    for parameter in net.parameters():
        parameter.requires_grad_(False)
    for site in model.sites():
        path, attr = site.name[len("net."):].rpartition(".")[::2]
        module = net.get_submodule(path)
        module._parameters[attr] = nn.Parameter(values[site.name].detach().clone(),
                                                requires_grad=trainable(site.name))
    return net


class LinearizedLaplace:
    r"""The Laplace approximation of a MAP fit's trained weights :math:`\theta` (laplace-torch's, over every weight of
    a plain copy of the network that requires a gradient: :func:`plain_network`) and its linearised ("GLM")
    predictive (Immer et al. 2021; Laplace-LoRA, Yang et al. 2024),

    .. math:: f(x) \sim \mathcal N\big(f_{\theta_{MAP}}(x),\; J(x) P^{-1} J(x)^\top\big),

    :math:`J(x)` the Jacobian of the outputs in :math:`\theta` at the MAP and :math:`P` the posterior precision.
    Registered as a forward hook of the model's network (:meth:`attach`), it adds to the network's output, when
    predicting (evaluation mode), a draw of :math:`J P^{-1} J^\top`'s Gaussian: every pass of pyrobnn's predictive
    is then a draw of the linearised predictive, the MAP network's output its mean. The Cholesky factor of each
    input's output covariance is computed once per input (kept for the inputs of the last passes) in chunks of
    ``chunk`` rows."""

    def __init__(self, laplace, network: nn.Module, chunk: int = 8, keep: int = 256):
        self.laplace, self.network, self.chunk, self.keep = laplace, network, chunk, keep
        self.selected = [f"net.{name}" for name, p in network.named_parameters() if p.requires_grad]
        """The sites the approximation covers, in laplace-torch's order."""
        self._factors: dict = {}
        self._handle = None

    def attach(self, model) -> "LinearizedLaplace":
        """Hook onto ``model``'s network (once), in place of an approximation hooked there before."""
        if self._handle is None:
            self._handle = attach_output_hook(model.net, self, "linearized")
        return self

    def detach(self) -> None:
        """Unhook: the network predicts at the MAP fit again."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def factor(self, x: torch.Tensor) -> torch.Tensor:
        """The Cholesky factors ``(N, C, C)`` of the outputs' covariance :math:`J P^{-1} J^\top` at ``x``."""
        key = (x.data_ptr(), tuple(x.shape), x.stride())
        kept = self._factors.get(key)
        if kept is not None and torch.equal(kept[0], x):
            return kept[1]
        parts, device = [], next(self.network.parameters()).device
        for rows in x.split(self.chunk):
            with warnings.catch_warnings():  # torch.func's loop over a batching rule it lacks (CPU attention)
                warnings.filterwarnings("ignore", message="There is a performance drop")
                jacobians, _ = self.laplace.backend.jacobians(rows.to(device), enable_backprop=False)
            variance = self.laplace.functional_variance(jacobians)
            eye = torch.eye(variance.shape[-1], dtype=variance.dtype, device=variance.device)
            parts.append(torch.linalg.cholesky(variance + 1e-9 * eye).detach())
        factor = torch.cat(parts)
        if len(self._factors) >= self.keep:
            self._factors.pop(next(iter(self._factors)))
        self._factors[key] = (x.detach().clone(), factor)
        return factor

    def __call__(self, module, inputs, output):
        if module.training or not torch.is_tensor(output):
            return None
        factor = self.factor(inputs[0]).to(output)
        noise = torch.randn(output.shape, dtype=output.dtype, device=output.device)
        return output + (factor @ noise.unsqueeze(-1)).squeeze(-1)

    def report(self) -> dict:
        """The tuned prior precision, the log marginal likelihood there and the number of weights."""
        return {"prior_precision": self.laplace.prior_precision.detach().cpu().flatten().tolist(),
                "log_marginal_likelihood": float(self.laplace.log_marginal_likelihood().detach()),
                "weights": int(self.laplace.n_params)}


def fit_linearized_laplace(model, guide, x: torch.Tensor, y: torch.Tensor, *, select: Callable[[str], bool],
                           batch_size: int = 16, prior_steps: int = 1000, state: Optional[dict] = None
                           ) -> LinearizedLaplace:
    """The Kronecker-factored Laplace approximation of the sites ``select`` names (laplace-torch's ``Laplace(...,
    "classification", subset_of_weights="all", hessian_structure="kron")`` over a :func:`plain_network` at the MAP
    fit ``guide``, the others held at their MAP values), its scalar prior precision from 1 tuned by the marginal
    likelihood (``prior_steps`` steps of Adam at 0.1), as Laplace-LoRA's code runs it; or, with ``state``
    (``laplace.state_dict()``), the one saved, without fitting. Attached to the model (:class:`LinearizedLaplace`)."""
    Laplace = _laplace_torch()
    if _likelihood(model)[0] != "classification":
        raise ValueError("the linearised Laplace of the adapters takes a Categorical likelihood (classification)")
    network = plain_network(model, point_values(guide), select).to(device_of(guide, model)).eval()
    if not any(p.requires_grad for p in network.parameters()):
        raise ValueError("the linearised Laplace approximation selects no weight of the network's sites")
    laplace = Laplace(network, "classification", subset_of_weights="all", hessian_structure="kron",
                      prior_precision=1.0)
    if state is not None:
        laplace.load_state_dict(state)
        return LinearizedLaplace(laplace, network).attach(model)
    device = next(p for p in network.parameters() if p.requires_grad).device
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x.to(device), y.to(device)),
                                         batch_size=batch_size)
    laplace.fit(loader)
    with warnings.catch_warnings():  # about the link approximation of laplace-torch's own predictive, unused here
        warnings.filterwarnings("ignore", message="By default `link_approx`")
        laplace.optimize_prior_precision(method="marglik", pred_type="glm", n_steps=prior_steps, lr=1e-1)
    return LinearizedLaplace(laplace, network).attach(model)
