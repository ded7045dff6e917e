r"""The papers' rules that depend on the run: the β schedule, the learning rate and its units, SWAG's start, and a
regression's noise.

A method fixes what its paper fixes (:mod:`pyrobnn.methods.registry`); what the paper states in proportion to the
run's length, or what follows from the prior and guide a user picks, is a rule here, applied where a setting is left
unset (``beta=None``, ``optimizer=None``, ``start=None``, a regression's noise), for a named method and for any
combination of a prior and a guide alike, from Python (:meth:`~pyrobnn.methods.Method.fit`) and the command line
(``pyrobnn train``) alike.

**A regression's noise.** :math:`y \sim \mathcal N(f(x; w), \sigma^2)`: a run that sets the noise keeps it (a fixed
scale S; learned from S). A run that does not learns :math:`\sigma` as a point estimate with the network, through
:math:`\log\sigma`, from :data:`STARTING_SCALE` = 1: the spread of the standardised target, the noise of a network
that explains nothing. It starts above any noise the data can show, so the run is never overconfident by its noise
while it learns, and it falls to what the residuals show as the network fits them (the point estimate of
:math:`\sigma` that maximises the run's objective, as a deep ensemble's member learns its noise, Lakshminarayanan et
al. 2017). A learned noise is one scale of one network: a posterior that replays the draws of several networks'
weights in one network (:attr:`~pyrobnn.methods.Method.replays_weights`: a deep ensemble, MultiSWAG, SG-MCMC) would
predict every draw with the first network's noise, so a learned noise is refused for it, and left unset its noise
is fixed at :data:`STARTING_SCALE` (:func:`regression_noise`).
"""

from __future__ import annotations

import dataclasses
import functools
import math

from pyrobnn.guides import AdditiveDropoutGuide, DropoutGuide, NormalGuide, PointGuide
from pyrobnn.infer.optim import SCALE_INVARIANT, Optim
from pyrobnn.infer.schedules import Constant, Geometric, LinearWarmup
from pyrobnn.model.likelihoods import Gaussian
from pyrobnn.model.priors import LogUniformPrior, NodePrior, Prior

__all__ = ["paper_schedule", "learning_rate", "swag_start", "guide_class", "guide_options", "warmup_note",
           "SPARSE_VD_LR", "SPARSE_VD_BETA", "noise_variance", "noise_factor", "per_unit_noise", "STARTING_SCALE",
           "regression_noise"]

STARTING_SCALE = 1.0
"""The noise standard deviation of a regression that does not set it, in the units of the standardised target (its
own spread): learned from there, or held there by a posterior that cannot learn it."""

SPARSE_VD_LR = 3e-3
"""The per-example learning rate with the log-uniform prior when no method names one (a prior and a guide picked by
hand): its multiplicative noise slows learning, and in a budget of a few epochs 1e-3 stays short of the dense
network (3 epochs of MNIST: 96.4 % at 1e-3, 97.6 % at 3e-3). The ``vd-additive`` preset trains at its paper's 1e-3."""

SPARSE_VD_BETA = LinearWarmup(warmup=5, anneal=15)
"""Sparse VD's KL weight as Molchanov, Ashukha & Vetrov (2017) train it (``rw_linear`` in their code,
github.com/bayesgroup/variational-dropout-sparsifies-dnn, ``svdo-lasagne/nets/optpolicy.py``): β = 0 for 5 epochs,
then linear to 1 over the next 15, in epochs whatever the run's length. The network learns the data first: with
the KL at full weight from the first steps, the KL of every weight prunes a network that has not learned yet (3
epochs of 5,000 MNIST images, the KL off for one epoch and then at full weight by the third: 73.5 % against MAP's
90.9 %). A run of 5 epochs or fewer therefore trains without the KL (:func:`warmup_note` says so) and prunes
little; 20 epochs reach the full ELBO (5,000 MNIST images: 92.0 % with 99.3 % of the weights pruned)."""


def guide_class(guide) -> type:
    """The guide class a guide factory builds (a class, or a ``functools.partial`` of one)."""
    while isinstance(guide, functools.partial):
        guide = guide.func
    return guide


def guide_options(guide) -> dict:
    """The keyword options a guide factory passes (``{}`` for a bare class)."""
    options: dict = {}
    while isinstance(guide, functools.partial):
        options = {**guide.keywords, **options}
        guide = guide.func
    return options


def paper_schedule(guide, prior: Prior, epochs: int):
    """The β schedule the paper of ``guide`` (a guide factory) and ``prior`` trains with, for a run of ``epochs``:

    - MC dropout and MAP (:class:`~pyrobnn.guides.DropoutGuide`, :class:`~pyrobnn.guides.PointGuide`): constant 1,
      the KL being weight decay (Gal & Ghahramani 2016);
    - the node prior (implicit BNN): β from 0 to 1 over the first 2/3 of the epochs (Trinh et al. 2020);
    - sparse VD (the log-uniform prior with an :class:`~pyrobnn.guides.AdditiveDropoutGuide`): Molchanov et al.'s
      (2017) :data:`SPARSE_VD_BETA`, β = 0 for 5 epochs, then linear to 1 over 15;
    - the log-uniform prior with another guide (Kingma et al.'s multiplicative variational dropout): β = 0 for the
      first third of the epochs, then linear to 1 at the end; from the first step at β = 1, the KL of every weight
      prunes an untrained network to chance;
    - Graves' variational dense (a :class:`~pyrobnn.guides.NormalGuide` with ``parameterization="log_variance"``):
      the same warm-up, then linear annealing, as the VariationalMLP.jl thesis (paper 001) trains it;
    - otherwise (Bayes by Backprop with a Gaussian or scale-mixture prior): Blundell et al.'s geometric weights.
    """
    cls = guide_class(guide)
    if issubclass(cls, (DropoutGuide, PointGuide)):
        return Constant()
    if isinstance(prior, NodePrior):
        return LinearWarmup(anneal=max(1, 2 * epochs // 3))
    if isinstance(prior, LogUniformPrior) and issubclass(cls, AdditiveDropoutGuide):
        return SPARSE_VD_BETA
    log_variance = issubclass(cls, NormalGuide) and guide_options(guide).get("parameterization") == "log_variance"
    if isinstance(prior, LogUniformPrior) or log_variance:
        warmup = math.ceil(epochs / 3) if epochs > 1 else 0
        return LinearWarmup(warmup=warmup, anneal=max(1, epochs - warmup))
    return Geometric()


def warmup_note(beta, epochs: int) -> str | None:
    """A sentence for a run of ``epochs`` that ends before its KL warm-up (a
    :class:`~pyrobnn.infer.schedules.LinearWarmup`) reaches its final β; None when it does (or for another
    schedule): where the run ends, and how many epochs reach the full ELBO."""
    if not isinstance(beta, LinearWarmup) or beta.warmup + beta.anneal <= epochs:
        return None
    last = beta(epochs - 1, 0, 1)  # the end of the last epoch
    what = "trains without the KL (beta = 0 throughout)" if last == 0 else f"ends at beta = {last:.3g}"
    return (f"the KL warm-up ({beta}) reaches beta = {beta.final:g} at epoch {beta.warmup + beta.anneal}: this "
            f"{epochs}-epoch run {what}, so its posterior is not yet the full ELBO's; --epochs "
            f"{beta.warmup + beta.anneal} or more reaches it")


def learning_rate(prior: Prior) -> float:
    """The per-example learning rate a method that names none trains with: :data:`SPARSE_VD_LR` with the
    log-uniform prior, else :class:`~pyrobnn.infer.optim.Optim`'s."""
    return SPARSE_VD_LR if isinstance(prior, LogUniformPrior) else Optim.lr


def swag_start(epochs: int) -> int:
    """SWAG's T, the epoch its collection starts after: half the epochs (Maddox et al. 2019 collect over the second
    half of training), at most all but two (two iterates at least), at least 0."""
    return max(0, min(epochs // 2, epochs - 2))


def noise_variance(model) -> float:
    """σ² of ``model``'s Gaussian likelihood of fixed noise σ (in the units of the standardised target); 1 for any
    other likelihood (a classifier, a learned noise, a noise per input) and a model without one."""
    likelihood = getattr(model, "likelihood", None)
    if type(likelihood) is not Gaussian or likelihood.log_scale.requires_grad:
        return 1.0
    return float(likelihood.scale.detach()) ** 2


def noise_factor(model, optimizer=None) -> float:
    r"""What a per-example rate is multiplied by on ``model``: the rates of SGD (SWAG's, an ensemble's with
    ``Optim("sgd")``), SG-MCMC's step size and IVON's α are stated per unit noise, so on a Gaussian likelihood of
    fixed noise σ the step is :math:`\mathrm{lr}\,\sigma^2` (:func:`noise_variance`); Adam's (``optimizer`` an
    :class:`~pyrobnn.infer.optim.Optim` of a :data:`~pyrobnn.infer.optim.SCALE_INVARIANT` optimiser) is 1.

    The per-example loss of that likelihood, :math:`(y - f)^2/(2\sigma^2)`, has σ^-2 times the curvature of the
    unit-noise loss, so a step of the same size is :math:`\sigma^2` times the rate: SGD's iterates (and SWAG's
    Gaussian of them) are those of the unit-noise loss, SG-MCMC samples the same posterior with the constant
    preconditioner σ² (its noise follows the step), and IVON's steps :math:`\alpha\, g / (h_0 + \delta)` keep
    the size they have at :math:`h_0` on a loss of unit curvature. The papers' rates are for losses of about unit
    curvature (the cross-entropy); at the noise of a UCI data set's grid (σ = 0.13 of the standardised target for
    Yacht's ``tau`` 0.25), SGD at 0.01 per example diverges in two epochs, at 0.01 σ² it does not (``studies/
    uci_quick.toml``, tests/studies/test_method_rates.py). A learned noise starts at its initial value and is not
    fixed, so its rate is as given."""
    if isinstance(optimizer, Optim) and optimizer.name in SCALE_INVARIANT:
        return 1.0
    return noise_variance(model)


def per_unit_noise(optimizer, model):
    """``optimizer`` (an optimizer factory with an ``lr``: :class:`~pyrobnn.infer.optim.Optim`,
    :class:`~pyrobnn.infer.ivon.IVONOptim`) at its rate on ``model`` (:func:`noise_factor`); a factory without a
    dataclass ``lr`` (written by hand) is returned as it is."""
    factor = noise_factor(model, optimizer)
    if factor == 1.0 or not dataclasses.is_dataclass(optimizer) or not hasattr(optimizer, "lr"):
        return optimizer
    return dataclasses.replace(optimizer, lr=optimizer.lr * factor)


def regression_noise(method, scale=None, learn_scale: bool = False) -> Gaussian:
    """The Gaussian likelihood of a regression ``method`` trains (the module docstring): noise ``scale`` (fixed, or
    learned from it with ``learn_scale``); ``scale`` None: :data:`STARTING_SCALE`, learned unless the method's draws
    replay several networks' weights in one. ``learn_scale`` for such a method is a ``ValueError`` naming the
    settings ``{likelihood.learn_scale}`` and ``{likelihood.scale}``."""
    why = method.replays_weights
    if learn_scale and why:
        raise ValueError(f"{{likelihood.learn_scale}}: {why}, so a noise each one learned would be lost (every draw "
                         "would be predicted with the first one's); fix the noise with {likelihood.scale} S, or choose "
                         "it on held-out training rows (pyrobnn train --grid likelihood.scale=0.4,0.7,1.0)")
    if scale is not None:
        return Gaussian(scale, learn_scale)
    return Gaussian(STARTING_SCALE, learn_scale=learn_scale or not why)
