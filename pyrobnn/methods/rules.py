"""The papers' rules that depend on the run: the β schedule, the learning rate, SWAG's start.

A method fixes what its paper fixes (:mod:`pyrobnn.methods.registry`); what the paper states in proportion to the
run's length, or what follows from the prior and guide a user picks, is a rule here, applied where a setting is left
unset (``beta=None``, ``optimizer=None``, ``start=None``), for a named method and for any combination of a prior and
a guide alike.
"""

from __future__ import annotations

import functools
import math

from pyrobnn.guides import AdditiveDropoutGuide, DropoutGuide, NormalGuide, PointGuide
from pyrobnn.infer.optim import Optim
from pyrobnn.infer.schedules import Constant, Geometric, LinearWarmup
from pyrobnn.model.priors import LogUniformPrior, NodePrior, Prior

__all__ = ["paper_schedule", "learning_rate", "swag_start", "guide_class", "guide_options", "warmup_note",
           "SPARSE_VD_LR", "SPARSE_VD_BETA"]

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
