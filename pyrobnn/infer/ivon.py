r"""The IVON optimiser (Shen et al., ICML 2024), its update written as few in-place, multi-tensor operations.

IVON learns :math:`q(w) = \mathcal N(m, \operatorname{diag}(\sigma^2))`, :math:`\sigma^2 = 1/(\lambda(h + \delta))`;
each step draws :math:`w = m + \sigma\odot\epsilon`, takes the loss's gradient there, :math:`\hat g`, and with
:math:`\hat h = \hat g\odot(w - m)(h + \delta)\lambda` (Price's estimate of the Hessian, in the units of
:math:`h`) updates

.. math:: g \leftarrow \beta_1 g + (1-\beta_1)\hat g, \qquad
          h \leftarrow \beta_2 h + (1-\beta_2)\hat h + \tfrac12(1-\beta_2)^2\,\frac{(h - \hat h)^2}{h + \delta},
          \qquad m \leftarrow m - \alpha (h_0 + \delta)\,
          \operatorname{clip}\Big(\frac{g/(1-\beta_1^t) + \delta m}{h + \delta}, \pm r\Big)

(their Algorithm 1, with the authors' learning-rate rescaling by :math:`h_0 + \delta` and clipping radius r). The
authors' optimiser (``ivon-opt``'s ``ivon.IVON``) computes exactly this; :class:`IVONOptimizer` computes it too, with
the same operations in the same order (``tests/methods/test_ivon.py`` checks the two step for step), but:

- in place and per tensor (``torch._foreach_*``) in buffers of its own, where the authors' concatenate every parameter
  and gradient into new flat vectors (new memory every step) and reassign each parameter's ``.data`` several times a
  step (``benchmarks/ivon_cost.py`` measures both against Adam);
- a parameter's storage alternates between two fixed buffers (its mean, and its draw during the step), so a
  recorded training step (:mod:`pyrobnn.infer.step`) sees one parameter storage and replays, where a new storage
  every step made it record again every step;
- its state (momentum, Hessian, step count) is in the optimiser's ``state_dict``, so a checkpoint resumes exactly;
- one draw per step (the authors' default ``mc_samples=1``, their recommendation).

:meth:`IVONOptimizer.sampled_params` is the authors' context manager: inside it the parameters hold the draw; on
leaving, the mean (the gradient, computed inside, stays), and the training loop then calls ``step()``
(:class:`~pyrobnn.infer.optim.PerturbingOptimizer`). :class:`IVONOptim` is its optimizer factory in the per-example
units of the papers, translated to pyrobnn's summed loss.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import ClassVar, Optional

import torch

from pyrobnn.checks import in_range, nonnegative, positive, positive_int
from pyrobnn.infer.draws import Draws
from pyrobnn.infer.iterates import site_parameters
from pyrobnn.infer.optim import trained_parameters

__all__ = ["IVONOptimizer", "IVONOptim", "IVONResult"]


class IVONOptimizer(torch.optim.Optimizer):
    """IVON (the module docstring) over ``params``, in the units of the loss it is stepped on.

    :param lr: α.
    :param ess: λ, the effective sample size.
    :param hess_init: :math:`h_0`, the initial Hessian.
    :param beta1, beta2: the momentum's and the Hessian's averaging.
    :param weight_decay: δ (the prior's precision over λ).
    :param clip_radius: r (inf: no clipping).
    """

    def __init__(self, params, lr: float, ess: float, hess_init: float, beta1: float, beta2: float,
                 weight_decay: float, clip_radius: float = math.inf):
        positive("lr", lr)
        positive("ess (the effective sample size)", ess)
        positive("hess_init (the initial Hessian)", hess_init)
        in_range("beta1", beta1, 0, 1, "[)")
        in_range("beta2", beta2, 0, 1, "[]")
        nonnegative("weight_decay", weight_decay)
        if not clip_radius > 0:
            raise ValueError(f"clip_radius must be > 0 (inf: no clipping), got {clip_radius!r}")
        super().__init__(params, dict(lr=lr, ess=ess, hess_init=hess_init, beta1=beta1, beta2=beta2,
                                      weight_decay=weight_decay, clip_radius=clip_radius, step=0))
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p].update(momentum=torch.zeros_like(p), hess=torch.full_like(p, hess_init),
                                     noise=torch.empty_like(p), draw=torch.empty_like(p), work=torch.empty_like(p))
        self._flat: dict[int, torch.Tensor] = {}
        self._drawn = False

    def _views(self, group, name: str) -> list[torch.Tensor]:
        return [self.state[p][name] for p in group["params"]]

    def _denominators(self, group, out: list[torch.Tensor]) -> list[torch.Tensor]:
        r""":math:`\sqrt{\lambda(h + \delta)}` of each parameter of ``group``, written into ``out``."""
        torch._foreach_copy_(out, self._views(group, "hess"))
        torch._foreach_add_(out, group["weight_decay"])
        torch._foreach_mul_(out, group["ess"])
        torch._foreach_sqrt_(out)
        return out

    def scales(self, group) -> list[torch.Tensor]:
        r""":math:`\sigma = 1/\sqrt{\lambda(h + \delta)}`, the posterior's standard deviation, of each parameter of
        ``group`` (new tensors)."""
        return torch._foreach_reciprocal(self._denominators(group, [torch.empty_like(p) for p in group["params"]]))

    @contextlib.contextmanager
    def sampled_params(self, train: bool = False):
        r"""Inside, every parameter holds a draw :math:`m + \sigma\odot\epsilon` (one standard normal vector per
        group, as the authors draw it); on leaving, its mean again. ``train``: the draw is the one the next
        :meth:`step` learns from (its gradient is computed inside). Every buffer is the optimiser's own: a step
        allocates nothing."""
        means = []
        for index, group in enumerate(self.param_groups):
            params = group["params"]
            if not params:
                continue
            sizes = [p.numel() for p in params]
            flat = self._flat.get(index)
            if flat is None:
                flat = self._flat[index] = params[0].new_empty(sum(sizes))
            torch.randn(flat.shape, out=flat)
            noises = self._views(group, "noise") if train else [torch.empty_like(p) for p in params]
            torch._foreach_copy_(noises, [piece.view_as(p) for piece, p in zip(flat.split(sizes), params)])
            torch._foreach_div_(noises, self._denominators(group, self._views(group, "work")))
            draws = self._views(group, "draw")
            torch._foreach_copy_(draws, params)
            torch._foreach_add_(draws, noises)
            for p, draw in zip(params, draws):
                means.append((p, p.data))
                p.data = draw
        try:
            yield
        finally:
            for p, mean in means:
                p.data = mean
        self._drawn = self._drawn or train

    @torch.no_grad()
    def step(self, closure=None):
        """The update of the module docstring, from the gradient at the last training draw."""
        if not self._drawn:
            raise RuntimeError("IVONOptimizer.step() needs a gradient at a draw: compute the loss and its gradient "
                               "inside `with optimizer.sampled_params(train=True):` first")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            group["step"] += 1
            beta1, beta2, decay, ess = group["beta1"], group["beta2"], group["weight_decay"], group["ess"]
            grads = [p.grad for p in params]
            momentum, hess, noise, work, spare = ([self.state[p][name] for p in params]
                                                  for name in ("momentum", "hess", "noise", "work", "draw"))
            # g <- beta1 g + (1 - beta1) g_hat
            torch._foreach_mul_(momentum, beta1)
            torch._foreach_add_(momentum, grads, alpha=1.0 - beta1)
            # h_hat = noise g_hat (h + d) ess; h <- b2 h + (1 - b2) h_hat + (1 - b2)^2 / 2 (h - h_hat)^2 / (h + d)
            torch._foreach_mul_(noise, grads)  # the noise is spent: noise g_hat
            torch._foreach_copy_(work, hess)
            torch._foreach_add_(work, decay)  # h + d
            torch._foreach_mul_(noise, work)
            torch._foreach_mul_(noise, ess)  # h_hat
            torch._foreach_copy_(spare, hess)
            torch._foreach_sub_(spare, noise)
            torch._foreach_mul_(spare, spare)
            torch._foreach_mul_(spare, 0.5 * (1 - beta2) ** 2)
            torch._foreach_div_(spare, work)
            torch._foreach_mul_(hess, beta2)
            torch._foreach_add_(hess, noise, alpha=1.0 - beta2)
            torch._foreach_add_(hess, spare)
            # m <- m - lr (h0 + d) clip((g / (1 - beta1^t) + d m) / (h + d), -r, r)
            torch._foreach_copy_(spare, momentum)
            torch._foreach_div_(spare, 1.0 - beta1 ** group["step"])
            torch._foreach_add_(spare, params, alpha=decay)
            torch._foreach_copy_(work, hess)
            torch._foreach_add_(work, decay)
            torch._foreach_div_(spare, work)
            if math.isfinite(group["clip_radius"]):
                torch._foreach_clamp_min_(spare, -group["clip_radius"])
                torch._foreach_clamp_max_(spare, group["clip_radius"])
            torch._foreach_add_(params, spare, alpha=-group["lr"] * (group["hess_init"] + decay))
        self._drawn = False
        return loss


@dataclass(frozen=True)
class IVONOptim:
    r"""Optimizer factory ``(model, guide) -> IVONOptimizer`` over every parameter training changes, in the authors'
    units, for the mean loss :math:`\bar\ell` over the N = ``model.num_data`` training examples, translated to
    pyrobnn's summed loss :math:`L = N\bar\ell`: the gradient, the Hessian estimate and h scale with N, so ess
    :math:`\lambda/N`, :math:`N h_0`, :math:`N\delta` and :math:`\alpha/N` make the noise
    :math:`1/\sqrt{\lambda(h+\delta)}` and every step of :math:`m` exactly the authors' on :math:`\bar\ell` (the
    logged learning rate is the per-example α). ``ess`` None: N."""

    lr: float
    ess: Optional[float]
    hess_init: float
    beta1: float
    beta2: float
    weight_decay: float
    clip_radius: float = math.inf

    def __post_init__(self):
        positive("lr (IVON's learning rate)", self.lr)
        if self.ess is not None:
            positive("ess (IVON's effective sample size)", self.ess)
        positive("hess_init (IVON's initial Hessian)", self.hess_init)
        in_range("beta1", self.beta1, 0, 1, "[)")
        in_range("beta2", self.beta2, 0, 1, "[]")
        nonnegative("weight_decay", self.weight_decay)
        if not self.clip_radius > 0:
            raise ValueError(f"clip_radius must be > 0 (inf: no clipping), got {self.clip_radius!r}")

    def __call__(self, model, guide) -> IVONOptimizer:
        n = positive_int("the model's num_data (N: fit sets it)", getattr(model, "num_data", None))
        ess = float(n) if self.ess is None else self.ess
        optimizer = IVONOptimizer(trained_parameters(model, guide), lr=self.lr / n, ess=ess / n,
                                  hess_init=self.hess_init * n, beta1=self.beta1, beta2=self.beta2,
                                  weight_decay=self.weight_decay * n, clip_radius=self.clip_radius)
        for group in optimizer.param_groups:
            group["rate_scale"] = float(n)  # the per-example rate it stands for (per_example_rate: the logs)
        return optimizer


@dataclass
class IVONResult(Draws):
    """``num_samples`` draws ``{site: (1, S, ...)}`` of IVON's Gaussian over the model's Bayesian sites, the network
    they are replayed in, the training history, and the Gaussian's mean and standard deviation per site."""

    mean: dict[str, torch.Tensor] = field(default_factory=dict)
    std: dict[str, torch.Tensor] = field(default_factory=dict)
    settings: dict = field(default_factory=dict)

    kind: ClassVar[str] = "ivon"
    description: ClassVar[str] = "IVON draws written by `pyrobnn train --method ivon`"

    @classmethod
    def of(cls, model, guide, optimizer: IVONOptimizer, num_samples: int, seed: int, histories=(),
           settings=None) -> "IVONResult":
        r"""``num_samples`` draws of the Gaussian ``optimizer`` holds over ``guide``'s point values,
        :math:`\sigma = 1/\sqrt{\lambda(h + \delta)}` (:meth:`~pyrobnn.infer.ivon.IVONOptimizer.scales`), drawn
        with a generator seeded by ``seed``."""
        sites = site_parameters(guide, "IVON")
        scales = {id(p): scale for group in optimizer.param_groups
                  for p, scale in zip(group["params"], optimizer.scales(group))}
        mean, std, draws = {}, {}, {}
        for name, parameter in sites.items():
            mean[name], std[name] = parameter.detach().clone(), scales[id(parameter)]
            generator = torch.Generator(parameter.device).manual_seed(seed + len(draws))
            noise = torch.randn((num_samples, *parameter.shape), generator=generator, device=parameter.device)
            draws[name] = (mean[name] + std[name] * noise.to(mean[name])).unsqueeze(0)
        return cls(model, draws, list(histories), mean=mean, std=std, settings=dict(settings or {}))

    def report(self) -> dict:
        """The settings, the draws, and the Gaussian's standard deviation: its mean and largest over the weights."""
        stds = torch.cat([value.flatten() for value in self.std.values()])
        return {**self.settings, "draws": len(self), "std_mean": float(stds.mean()), "std_max": float(stds.max())}

    def summary(self) -> str:
        report = self.report()
        return (f"{len(self)} draws of the Gaussian IVON learned (standard deviation {report['std_mean']:.3g} on "
                f"average, at most {report['std_max']:.3g})")
