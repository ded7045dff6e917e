"""Every method by name, with its paper's settings: the registry that Python users, the command line
(``pyrobnn train --method NAME``) and the studies (``--vary method=bbb,mcdropout``) read.

Three families take a number: ``ibnn-K`` (the implicit BNN with K mixture components), ``ensemble-M`` (a deep
ensemble of M MAP fits) and ``multiswag-M`` (M SWAGs). :data:`METHODS` lists ``ibnn-4``, ``ensemble-5`` and
``multiswag-5`` among its names and answers any ``ibnn-<K>``, ``ensemble-<M>`` and ``multiswag-<M>``
(``METHODS["ensemble-3"]``); :func:`resolve_method` is the same lookup with the command line's error.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator, Mapping
from functools import partial
from typing import Callable

from pyrobnn.guides import (
    AdditiveDropoutGuide,
    DropoutGuide,
    MixtureNodeGuide,
    MultiplicativeDropoutGuide,
    NormalGuide,
    PointGuide,
)
from pyrobnn.infer.optim import Optim, StepDecay
from pyrobnn.infer.schedules import Constant, Geometric, KLCycles
from pyrobnn.methods.base import Method, Variational
from pyrobnn.methods.ivon import IVON
from pyrobnn.methods.lora import LaplaceLoRA
from pyrobnn.methods.nuts import NUTS
from pyrobnn.methods.posthoc import SGMCMC, SWAG, Ensemble, Laplace, TemperatureScaled
from pyrobnn.methods.rules import SPARSE_VD_BETA
from pyrobnn.methods.sngp import SNGP
from pyrobnn.model.priors import GaussianPrior, LogUniformPrior, NodePrior, ScaleMixturePrior
from pyrobnn.networks.hf import LORA_A_SITES

__all__ = ["METHODS", "FAMILIES", "METHOD_NAMES", "MethodRegistry", "resolve_method"]

BBB = Variational(
    prior=ScaleMixturePrior(pi=0.25, sigma1=1.0, sigma2=math.exp(-8)), guide=partial(NormalGuide, init_rho=-5.0),
    estimator="sample", num_particles=5, beta=Geometric(), optimizer=Optim("adam", 1e-3, schedule=StepDecay(100, 0.5)),
    batch_size=128,
    paper="Blundell et al. 2015, Weight Uncertainty in Neural Networks (as reproduced by Rahmanto, paper 003): the "
          "scale-mixture prior at the optimum of their grid (pi = 1/4, sigma1 = 1, sigma2 = e^-8), sigma = "
          "softplus(rho) from rho0 = -5, 5 weight samples per minibatch, the geometric per-minibatch KL weights, Adam "
          "at 1e-3 halved every 100 epochs, batches of 128")

BLOB_KL_LR = 0.002 * 32
"""BLoB's KL rate per example (their RoBERTa scripts: SGD at 0.002 on the KL of batches of 32; Llama's 0.01 of
batches of 4 on 2 devices is 0.08)."""

BLOB_RHO = math.log(math.expm1(0.05 ** 2))
"""BLoB's initial scale (Wang et al. 2024, their code's eps = 0.05): the largest initial sigma eps^2 = 0.0025 is
softplus(BLOB_RHO)."""

MAP = Variational(prior=GaussianPrior(scale=1.0), guide=PointGuide, num_samples=1,
                  paper="maximum a posteriori: point estimates under a N(0, 1) prior (the likelihood plus ||w||^2/2), "
                        "one predictive pass")

MAP_SETTINGS = {field.name: getattr(MAP, field.name) for field in dataclasses.fields(Method) if field.name != "paper"}
"""The settings every method made of MAP fits starts from (a N(0, 1) prior, point estimates, one predictive pass)."""


def mixture_nodes(k: int) -> Variational:
    """The implicit BNN of Trinh, Kaski & Heinonen (2020) with K components (paper 004, Table 2, VGG-16 on CIFAR-10):
    node prior N(1, 0.3^2) on every layer's inputs, component means from N(1, 0.75^2), S = 2 samples per example,
    5 predictive samples per component; beta from 0 to 1 over the first 2/3 of the epochs (the paper's rule). Their
    two learning rates (SGD on the weights, a large constant one on the mixture) are Adam at one rate here."""
    return Variational(prior=NodePrior(scale=0.3), guide=partial(MixtureNodeGuide, init_scale=0.75, num_components=k),
                       estimator="local", num_particles=2, num_samples=5 * k, paper=IBNN_PAPER)


def ensemble(m: int) -> Ensemble:
    """A deep ensemble of M MAP fits."""
    return Ensemble(**MAP_SETTINGS, members=m, paper=ENSEMBLE_PAPER)


def multiswag(m: int) -> SWAG:
    """M SWAGs of 20 draws each."""
    return dataclasses.replace(SWAG_METHOD, members=m, num_samples=20, paper=MULTISWAG_PAPER)


IBNN_PAPER = ("Trinh, Kaski & Heinonen 2020, implicit BNN (paper 004): K-component mixture over node latents, "
              "5 predictive samples per component")
ENSEMBLE_PAPER = ("Lakshminarayanan, Pritzel & Blundell 2017, deep ensembles: M MAP fits from the initialisations of "
                  "seeds seed..seed+M-1, predicted as their uniform mixture")
MULTISWAG_PAPER = ("Wilson & Izmailov 2020, MultiSWAG: M SWAGs from the seeds seed..seed+M-1 (Maddox et al. 2019), 20 "
                   "draws each, predicted as their equal mixture")

SWAG_METHOD = SWAG(prior=MAP.prior,  # and its own settings: pyrobnn.methods.SWAG's fields hold the paper's
                   paper="Maddox et al. 2019, A simple baseline for Bayesian uncertainty in deep learning: SGD with "
                         "Nesterov momentum from lr 0.05 down to the SWA rate 0.01 between 0.5 T and 0.9 T, a Gaussian "
                         "with diagonal plus rank-20 covariance fitted to the iterates of the epochs after T (half the "
                         "epochs), 30 draws, BatchNorm statistics recomputed for each")


def _sgmcmc(sampler: str, lr: float, paper: str) -> SGMCMC:
    return SGMCMC(**{**MAP_SETTINGS, "optimizer": Optim(lr=lr)}, sampler=sampler, paper=paper)


_REGISTERED: dict[str, Method] = {
    "bbb": BBB,
    "bbb-local": dataclasses.replace(BBB, estimator="local",
                                     paper="Kingma, Salimans & Welling 2015: Bayes by Backprop's posterior by local "
                                           "reparameterization"),
    "flipout": dataclasses.replace(BBB, estimator="flipout",
                                   paper="Wen et al. 2018, Flipout: Bayes by Backprop's posterior with "
                                         "pseudo-independent perturbations"),
    "vd-additive": Variational(
        prior=LogUniformPrior(), guide=partial(AdditiveDropoutGuide, init_log_sigma2=-10.0, mask_pruned=True),
        estimator="local", beta=SPARSE_VD_BETA, optimizer=Optim("adam", 1e-3), batch_size=100,
        paper="Molchanov, Ashukha & Vetrov 2017, sparse variational dropout, as their code trains LeNet-300-100: "
              "additive parameterisation from log sigma^2 = -10, log alpha clipped to [-8, 8], local "
              "reparameterisation, weights with log alpha > 3 left out of the mean (train_clip), the KL weight 0 for "
              "5 epochs then linear to 1 over 15 (a run of 5 epochs or fewer trains without the KL and prunes "
              "little), Adam at 1e-3, batches of 100; their rate also falls linearly to 0 over epochs 100-200 of "
              "200 (--lr-linear-from 0.5)"),
    "vd-multiplicative": Variational(prior=LogUniformPrior(),
                                     guide=partial(MultiplicativeDropoutGuide, init_log_alpha=-4.0), estimator="local",
                                     paper="Kingma, Salimans & Welling 2015, variational dropout: w = theta(1 + "
                                           "sqrt(alpha) eps), alpha <= 1, their KL approximation"),
    "variational-dense": Variational(prior=GaussianPrior(scale=1.0),
                                     guide=partial(NormalGuide, parameterization="log_variance", init_rho=-6.0),
                                     estimator="local",
                                     paper="Graves 2011 as the VariationalMLP.jl thesis trains it (paper 001): learned "
                                           "log variance from a tiny sigma, N(0, 1) prior, KL warm-up then linear "
                                           "annealing"),
    "blob": Variational(
        prior=GaussianPrior(scale=0.2), guide=partial(NormalGuide, parameterization="square", init_rho=BLOB_RHO),
        estimator="flipout", beta=KLCycles(), num_samples=10, sites=LORA_A_SITES,
        optimizer=Optim("adam", 5e-4, kl_lr=BLOB_KL_LR),
        paper="Wang et al. 2024, BLoB: Bayesian Low-Rank Adaptation by Backpropagation, as their code runs it: a "
              "mean-field Gaussian on the LoRA A matrices (B and the head point estimates), N(0, 0.2^2) prior, sigma "
              "= G^2 with G from U(eps/sqrt 2, eps), eps = 0.05, flipout, one draw a step and 10 at test; the "
              "likelihood by Adam at 5e-4 (RoBERTa), the KL by SGD at their 0.002 a batch of 32 (0.064 per "
              "example), weighted by their cycles of 100 N^(pi/8) / B steps"),
    "mcdropout": Variational(prior=GaussianPrior(scale=1.0), guide=partial(DropoutGuide, rate=0.5), estimator="local",
                             paper="Gal & Ghahramani 2016, Dropout as a Bayesian Approximation: p = 0.5 before every "
                                   "weight layer, one mask per example, N(0, 1) prior as weight decay"),
    "mcdropout-lora": Variational(prior=GaussianPrior(scale=1.0), guide=partial(DropoutGuide, rate=0.1),
                                  estimator="local", num_samples=10,
                                  paper="MC dropout on LoRA adapters, BLoB's baseline (Wang et al. 2024; Gal & "
                                        "Ghahramani 2016): p = 0.1 (LoRA dropout) on the input of every adapter and "
                                        "of the head, one mask per example, N(0, 1) prior as weight decay, 10 test "
                                        "samples"),
    "laplace-lora": LaplaceLoRA(**{**MAP_SETTINGS, "num_samples": 10},
                                paper="Yang et al. 2024, Bayesian low-rank adaptation for large language models "
                                      "(Laplace-LoRA), as their code runs it: a MAP-LoRA fit, then the Kronecker-"
                                      "factored Laplace of the adapters' weights (laplace-torch, subset all, kron), "
                                      "the prior precision by the marginal likelihood, the linearised predictive, "
                                      "10 draws"),
    "map": MAP,
    "map-ts": TemperatureScaled(**MAP_SETTINGS, held_out=0.1,
                                paper="Guo et al. 2017, On calibration of modern neural networks: MAP fitted on 90 % "
                                      "of the training rows, one temperature on the logits fitted by the NLL of the "
                                      "other 10 % (drawn with the run's seed), one predictive pass"),
    "ibnn-4": mixture_nodes(4),
    "vdp": Variational(prior=GaussianPrior(scale=0.1), guide=partial(NormalGuide, share="row", init_rho=-3.0),
                       estimator="vdp", beta=Constant(), optimizer=Optim(lr=0.003),
                       paper="VDP++, Efficient Scaling of Bayesian Neural Networks (paper 002): moments propagated "
                             "through the network, one sigma per output unit (eq. 12), Gaussian NLL with the "
                             "propagated variance (eq. 11)"),
    "nuts": NUTS(prior=GaussianPrior(scale=1.0),
                 paper="Hoffman & Gelman 2014, NUTS: the exact posterior of a small network on full-batch data (the "
                       "toys, UCI regression)"),
    "ensemble-5": ensemble(5),
    "laplace": Laplace(**{**MAP_SETTINGS, "num_samples": 100},
                       paper="Daxberger et al. 2021, Laplace Redux (laplace-torch): last-layer, Kronecker-factored GGN "
                             "at the MAP fit, prior precision by the marginal likelihood; 100 draws of the last layer"),
    "swag": SWAG_METHOD,
    "multiswag-5": multiswag(5),
    "sgld": _sgmcmc("sgld", 0.05, "Welling & Teh 2011, stochastic gradient Langevin dynamics on the minibatch log "
                                  "joint: constant step, the first half of the epochs burnt in, a draw at the end of "
                                  "every later epoch"),
    "sghmc": _sgmcmc("sghmc", 0.01, "Chen, Fox & Guestrin 2014, stochastic gradient HMC (friction 0.1: momentum 0.9): "
                                    "constant step, the first half of the epochs burnt in, a draw at the end of every "
                                    "later epoch"),
    "csghmc": _sgmcmc("csghmc", 0.5, "Zhang et al. 2020, cyclical SG-MCMC (cSGHMC) as their CIFAR-10 code runs it: 4 "
                                     "cosine cycles from a step of 0.5 per example, friction 0.9, noise in the last "
                                     "10 % of each cycle and a draw at the end of each of its epochs"),
    "ivon": IVON(prior=MAP.prior,  # and its own settings: pyrobnn.methods.IVON's fields hold the authors'
                 paper="Shen et al. 2024, Variational Learning is Effective for Large Deep Networks: IVON, the "
                       "authors' settings (lr 0.1, ess = N, h0 1, beta2 0.99999, "
                       "weight decay 1e-4), its Gaussian posterior as 64 draws"),
    "sngp": SNGP(**{**MAP_SETTINGS, "num_samples": 1},  # and its own settings: pyrobnn.methods.SNGP's fields
                 paper="Liu et al. 2020, Simple and Principled Uncertainty Estimation with Deterministic Deep "
                       "Learning via Distance Awareness (SNGP): spectrally normalised hidden layers, the output layer "
                       "a GP by random Fourier features, its Laplace precision collected in the last epoch, the "
                       "mean-field predictive"),
}

FAMILIES: dict[str, Callable[[int], Method]] = {"ibnn": mixture_nodes, "ensemble": ensemble, "multiswag": multiswag}
"""Methods with a number: ``<family>-<n>`` -> the method for n."""

METHOD_NAMES: tuple[str, ...] = tuple({"ibnn-4": "ibnn-K", "ensemble-5": "ensemble-M", "multiswag-5": "multiswag-M"
                                       }.get(name, name) for name in _REGISTERED)
"""The names as ``--help`` and errors show them (``ibnn-K``, ``ensemble-M``, ``multiswag-M`` for the families)."""


class MethodRegistry(Mapping):
    """Every method by name: a read-only mapping whose iteration and ``len`` give the registered names, and whose
    lookup (``[]``, ``in``, ``get``) also answers any member of a family, ``ibnn-<K>``, ``ensemble-<M>`` or
    ``multiswag-<M>`` with a positive number (:data:`FAMILIES`), as a user expects of a mapping of names. A family
    member is built on its first lookup and kept (the same object on the next).

    >>> from pyrobnn.methods import METHODS
    >>> METHODS["ensemble-3"].members, "ibnn-2" in METHODS, "ensemble-0" in METHODS
    (3, True, False)
    """

    def __init__(self, registered: dict[str, Method], families: dict[str, Callable[[int], Method]]):
        self._registered, self._families = dict(registered), families
        self._members: dict[str, Method] = {}

    def __getitem__(self, name: str) -> Method:
        if isinstance(name, str):
            if name in self._registered:
                return self._registered[name]
            match = re.fullmatch(r"([a-z]+)-([0-9]+)", name)
            if match and match.group(1) in self._families and int(match.group(2)) >= 1:
                if name not in self._members:
                    self._members[name] = self._families[match.group(1)](int(match.group(2)))
                return self._members[name]
        raise KeyError(f"{name!r} is not a method; the methods are {', '.join(METHOD_NAMES)} (K, M: positive "
                       "integers)")

    def __contains__(self, name) -> bool:
        try:
            self[name]
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self._registered)

    def __len__(self) -> int:
        return len(self._registered)

    def __repr__(self) -> str:
        return f"MethodRegistry({', '.join(METHOD_NAMES)})"


METHODS: Mapping[str, Method] = MethodRegistry(_REGISTERED, FAMILIES)
"""Every method by name, with its paper's settings (:class:`MethodRegistry`): the registered names, and any
``ibnn-<K>``, ``ensemble-<M>`` and ``multiswag-<M>``."""


def resolve_method(name: str) -> Method:
    """The method called ``name``, as ``METHODS[name]`` (a registered name, or ``ibnn-<K>`` / ``ensemble-<M>`` /
    ``multiswag-<M>`` with a positive number); anything else is a ``ValueError`` naming the known methods."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"--method {name}: unknown method; choose one of {', '.join(METHOD_NAMES)} "
                         "(K, M: positive integers)") from None
