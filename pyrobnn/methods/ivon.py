r"""IVON (Shen et al., ICML 2024, "Variational Learning is Effective for Large Deep Networks"): variational learning
of a diagonal Gaussian :math:`q(w) = \mathcal N(m, \operatorname{diag}(\sigma^2))` by an optimiser at about Adam's
cost, the Improved Variational Online Newton.

Each step draws :math:`w = m + \sigma \odot \epsilon`, :math:`\sigma^2 = 1/(\lambda (h + \delta))`, takes the mean
loss's gradient there, :math:`\hat g = \nabla \bar\ell(w)`, and its reparameterisation-trick Hessian estimate
:math:`\hat h = \hat g \odot (w - m) / \sigma^2`, and updates (their Algorithm 1)

.. math:: g \leftarrow \beta_1 g + (1 - \beta_1)\hat g, \qquad
          h \leftarrow \beta_2 h + (1 - \beta_2)\hat h + \tfrac12 (1 - \beta_2)^2 \frac{(h - \hat h)^2}{h + \delta},
          \qquad m \leftarrow m - \alpha\, \frac{g / (1 - \beta_1^t) + \delta m}{h + \delta},

with λ the effective sample size (the training-set size N: the posterior of the data; larger: a colder one), δ the
weight decay (the prior :math:`\mathcal N(0, 1/(\lambda\delta))`), :math:`h_0` the initial Hessian and α the learning
rate (scaled by :math:`h_0 + \delta`, the authors' ``rescale_lr``). The paper's advice (their Appendix A), which the
defaults follow: λ = N, a small :math:`h_0` (the initial σ is :math:`1/\sqrt{\lambda(h_0 + \delta)}`: 1, their
optimiser's default, gives 0.014 on 5,000 rows, where 0.1 gave 0.045, about the size of the MLP's weights, and
underfit), β₂ very close to 1 (0.99999: h moves little in a short run, so IVON steps much as SGD with momentum
at α, with the noise of the posterior), β₁ = 0.9, a learning rate larger than Adam's (0.1 in their README's
example), one draw per step, and the weight decay of SGD (1e-4).

The update is :class:`~pyrobnn.infer.ivon.IVONOptimizer`: the authors' (``ivon-opt``'s ``ivon.IVON``, checked step for
step against it) written in place in buffers of its own, so that the recorded training step replays (the authors'
moves every parameter to new memory every step, which a recorded step must record again). On this 2-core CPU an IVON
epoch of the 784-400-10 MLP (5,000 rows, batches of 128) is 1.99-2.14x an Adam MAP epoch with it and 2.76-3.23x with
the authors' (``python benchmarks/ivon_cost.py``, three runs): the floor is the standard normal noise of every weight,
about 2 ms a step for its 318,010 weights with torch's CPU generator, against Adam's whole step of 5 ms (on a GPU, the
paper's setting, the noise costs next to nothing). It is stepped by :func:`~pyrobnn.infer.svi.fit` around its draw
(:class:`~pyrobnn.infer.optim.PerturbingOptimizer`) on the MAP model's point values
(:class:`~pyrobnn.guides.PointGuide`) with the KL weight 0: the loss is the likelihood alone, the prior being the
weight decay. That loss is pyrobnn's summed one, :math:`L = N\bar\ell`; :class:`~pyrobnn.infer.ivon.IVONOptim`
gives the optimiser the settings on :math:`L` that make every update the authors' on :math:`\bar\ell` (ess λ/N,
:math:`N h_0`, :math:`N\delta`, α/N). The posterior is returned as ``num_samples`` draws of :math:`q`
(:class:`~pyrobnn.infer.ivon.IVONResult`, the model's Bayesian sites; its other trained parameters, such as
BatchNorm's, at their mean), predicted as the draws' average, as the authors predict.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, Optional

from pyrobnn.guides.point import point_values
from pyrobnn.infer.iterates import Recorded
from pyrobnn.infer.ivon import IVONOptim, IVONResult
from pyrobnn.infer.schedules import Constant
from pyrobnn.infer.svi import fit
from pyrobnn.methods.base import Method
from pyrobnn.methods.posterior import EmpiricalPosterior, Posterior

__all__ = ["IVON", "IVONResult"]


@dataclass(frozen=True)
class IVON(Method):
    """IVON as a method (the module docstring): the authors' optimiser on the MAP model's point values with the KL
    weight 0, its posterior ``num_samples`` draws of the Gaussian it learned. ``lr``, ``weight_decay`` (δ, the prior
    N(0, 1/(λδ))), ``ess`` (λ, None: the training-set size), ``hess_init`` (h0), ``beta1`` and ``beta2`` are the
    paper's; IVON is its own optimiser (no ``optimizer``)."""

    beta: Optional[Constant] = Constant(0.0)
    num_samples: int = 64
    lr: float = 0.1
    weight_decay: float = 1e-4
    ess: Optional[float] = None
    hess_init: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.99999

    takes_optimizer: ClassVar[bool] = False

    def settings_rules(self) -> None:
        """IVON is its own optimiser, on the likelihood alone (β = 0, its prior being the weight decay), at
        settings :class:`~pyrobnn.infer.ivon.IVONOptim` takes."""
        super().settings_rules()
        if self.optimizer is not None:
            raise ValueError("IVON is its own optimiser: set its {lr} and {weight_decay}, not {optimizer}")
        if self.beta != Constant(0.0):
            raise ValueError(f"IVON trains on the likelihood alone, its prior being the weight decay: {{beta}} must be "
                             f"Constant(0.0), got {self.beta!r}")
        try:
            self.optimizer_factory(1)  # its settings, checked
        except ValueError as error:  # the settings named as the method's fields
            raise ValueError(re.sub(r"^(lr|ess|hess_init|beta1|beta2|weight_decay)\b", r"{\1}", str(error))) from None

    @property
    def learning_rate(self) -> float:
        return self.lr

    def optimizer_factory(self, epochs: int) -> IVONOptim:
        return IVONOptim(self.lr, self.ess, self.hess_init, self.beta1, self.beta2, self.weight_decay)

    def train(self, model, guide, x, y, *, epochs=10, seed=0, precision="fp32", make_member=None,
              **run) -> Posterior:
        self.check(model, epochs=epochs, rows=x.shape[0], **run)
        point_values(guide)  # a point-estimate guide: its values are IVON's mean, before anything is trained
        options = self.fit_options(epochs, precision, model)
        options["optimizer"] = made = Recorded(options["optimizer"])
        history = fit(model, guide, x, y, epochs=epochs, seed=seed, **options, **run)
        settings = {"lr": self.lr, "ess": float(model.num_data) if self.ess is None else self.ess,
                    "hess_init": self.hess_init, "weight_decay": self.weight_decay, "beta2": self.beta2}
        return EmpiricalPosterior(IVONResult.of(model, guide, made.made[-1], self.num_samples, seed, [history],
                                                settings))

    def train_stacked(self, pairs, x, y, *, epochs=10, seed=0, precision="fp32", transform=None,
                      **run) -> list[Posterior]:
        """Each pair trained alone (the authors' optimiser holds one network's parameters, not a stack)."""
        return [self.train(model, guide, x, y, epochs=epochs, seed=seed, precision=precision, progress=False, **run)
                for model, guide in pairs]
