"""Methods by name: presets that bundle a prior, a guide, an estimator, a β schedule and their paper's settings.

One registry, :data:`METHODS`, read by ``pyrobnn train --method``, the studies (``--vary method=bbb,mcdropout``)
and the examples. A preset is the command-line arguments it stands for (``--prior scale-mixture --guide normal``),
placed before the user's own (:func:`expand_method`), so an option the user names wins; ``command`` says which
command runs it (``train``, or ``mcmc`` for NUTS on small full-batch data).

Three families take a number: ``ibnn-K`` (the implicit BNN with K mixture components), ``ensemble-M`` (a deep
ensemble of M MAP fits) and ``multiswag-M`` (M SWAGs); :data:`METHODS` lists ``ibnn-4``, ``ensemble-5`` and
``multiswag-5``, :func:`resolve_method` accepts any ``ibnn-<K>``, ``ensemble-<M>`` and ``multiswag-<M>``.

Settings a preset leaves out keep the command's defaults, among them ``--beta auto``: the β schedule of the
guide's and prior's paper, in proportion to ``--epochs`` (:func:`pyrobnn.cli.build.paper_schedule`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

__all__ = ["Method", "METHODS", "METHOD_NAMES", "FAMILIES", "RECORDING_COMMANDS", "method_args", "resolve_method",
           "expand_method"]


@dataclass(frozen=True)
class Method:
    """A named method: the arguments it stands for, the command that runs it, and the paper it follows."""

    args: tuple[str, ...]
    paper: str = ""
    command: str = "train"


BBB = ("--prior", "scale-mixture", "--prior.pi", "0.25", "--prior.sigma1", "1.0",
       "--prior.sigma2", "0.00033546262790251185", "--guide", "normal", "--guide.init-rho", "-5.0",
       "--estimator", "sample", "--num-particles", "5",
       "--beta", "geometric", "--lr", "0.001", "--batch-size", "128", "--lr-step", "100", "--lr-gamma", "0.5")
"""Bayes by Backprop as Rahmanto reproduces Blundell et al. (2015) (paper 003): the scale-mixture prior at the
optimum of their grid (π = 1/4, σ1 = 1, σ2 = e^-8), σ = softplus(ρ) from ρ0 = -5, 5 weight samples per minibatch,
the geometric per-minibatch KL weights, Adam at 1e-3 halved every 100 epochs, batches of 128."""

MAP = ("--prior", "gaussian", "--prior.scale", "1.0", "--guide", "point", "--num-samples", "1")
"""Point estimates under a N(0, 1) prior (the MAP objective: the likelihood plus ||w||²/2), one predictive pass."""

MIXTURE_NODES = ("--prior", "node", "--prior.scale", "0.3", "--guide", "mixture-node", "--guide.init-scale", "0.75",
                 "--estimator", "local", "--num-particles", "2")
"""The implicit BNN of Trinh, Kaski & Heinonen (2020) (paper 004, Table 2, VGG-16 on CIFAR-10): node prior
N(1, 0.3²) on every layer's inputs, component means initialised from N(1, 0.75²), S = 2 samples per example;
β from 0 to 1 over the first 2/3 of the epochs (``--beta auto``). Their two learning rates (SGD on the weights, a
large constant one on the mixture) are not a command-line option: Adam at ``--lr`` trains both."""


SWAG = (*MAP, "--optimizer", "sgd", "--lr", "0.05", "--swag", "--swag.lr", "0.01", "--swag.rank", "20",
        "--num-samples", "30")
"""SWAG as Maddox et al. (2019) run it: SGD with Nesterov momentum from --lr 0.05 down to the SWA rate 0.01 between
0.5 T and 0.9 T, the iterates of the epochs after T (half the epochs) collected, rank 20, 30 draws."""


def _members(m: int) -> tuple[str, ...]:
    return (*MAP, "--ensemble", str(m))


def _swags(m: int) -> tuple[str, ...]:
    return (*SWAG, "--ensemble", str(m), "--num-samples", "20")


def _components(k: int) -> tuple[str, ...]:
    return (*MIXTURE_NODES, "--guide.components", str(k), "--num-samples", str(5 * k))


MULTISWAG_PAPER = ("Wilson & Izmailov 2020, MultiSWAG: M SWAGs from the seeds seed..seed+M-1 (Maddox et al. 2019), "
                   "20 draws each, predicted as their equal mixture")
ENSEMBLE_PAPER = ("Lakshminarayanan, Pritzel & Blundell 2017, deep ensembles: M MAP fits from the initialisations "
                  "of seeds seed..seed+M-1, predicted as their uniform mixture")
IBNN_PAPER = ("Trinh, Kaski & Heinonen 2020, implicit BNN (paper 004): K-component mixture over node latents, "
              "5 predictive samples per component")

METHODS: dict[str, Method] = {
    "bbb": Method(BBB, "Blundell et al. 2015, Weight Uncertainty in Neural Networks (as reproduced by Rahmanto)"),
    "bbb-local": Method((*BBB, "--estimator", "local"),
                        "Kingma, Salimans & Welling 2015: Bayes by Backprop's posterior by local reparameterization"),
    "flipout": Method((*BBB, "--estimator", "flipout"),
                      "Wen et al. 2018, Flipout: Bayes by Backprop's posterior with pseudo-independent perturbations"),
    "vd-additive": Method(("--prior", "log-uniform", "--guide", "additive", "--guide.init-log-sigma2", "-10.0",
                           "--estimator", "local"),
                          "Molchanov, Ashukha & Vetrov 2017, sparse variational dropout: additive "
                          "parameterisation, log alpha clipped to [-8, 8], KL off for the first third of the epochs "
                          "then linear to 1"),
    "vd-multiplicative": Method(("--prior", "log-uniform", "--guide", "multiplicative", "--guide.init-log-alpha",
                                 "-4.0", "--estimator", "local"),
                                "Kingma, Salimans & Welling 2015, variational dropout: w = θ(1 + √α ε), α <= 1, "
                                "their KL approximation"),
    "variational-dense": Method(("--prior", "gaussian", "--prior.scale", "1.0", "--guide", "normal",
                                 "--guide.parameterization", "log-variance", "--guide.init-rho", "-6.0",
                                 "--estimator", "local"),
                                "Graves 2011 as the VariationalMLP.jl thesis trains it (paper 001): learned log "
                                "variance from a tiny σ, N(0, 1) prior, KL warm-up then linear annealing"),
    "mcdropout": Method(("--prior", "gaussian", "--prior.scale", "1.0", "--guide", "dropout", "--guide.rate", "0.5",
                         "--estimator", "local"),
                        "Gal & Ghahramani 2016, Dropout as a Bayesian Approximation: p = 0.5 before every weight "
                        "layer, one mask per example, N(0, 1) prior as weight decay"),
    "map": Method(MAP, "maximum a posteriori: point estimates under a N(0, 1) prior"),
    "ibnn-4": Method(_components(4), IBNN_PAPER),
    "vdp": Method(("--prior", "gaussian", "--prior.scale", "0.1", "--guide", "normal", "--guide.share", "row",
                   "--guide.init-rho", "-3.0", "--estimator", "vdp", "--likelihood.vdp-objective", "gaussian",
                   "--beta", "constant", "--lr", "0.003"),
                  "VDP++, Efficient Scaling of Bayesian Neural Networks (paper 002): moments propagated through the "
                  "network, one σ per output unit (eq. 12), Gaussian NLL with the propagated variance (eq. 11)"),
    "nuts": Method(("--prior", "gaussian", "--prior.scale", "1.0", "--num-samples", "500", "--warmup", "500",
                    "--num-chains", "2", "--target-accept", "0.8"),
                   "Hoffman & Gelman 2014, NUTS: the exact posterior of a small network on full-batch data (the toys, "
                   "UCI regression)",
                   command="mcmc"),
    "ensemble-5": Method(_members(5), ENSEMBLE_PAPER),
    "laplace": Method((*MAP, "--laplace", "--num-samples", "100"),
                      "Daxberger et al. 2021, Laplace Redux (laplace-torch): last-layer, Kronecker-factored GGN at the "
                      "MAP fit, prior precision by the marginal likelihood; 100 draws of the last layer"),
    "swag": Method(SWAG, "Maddox et al. 2019, A simple baseline for Bayesian uncertainty in deep learning: a Gaussian "
                         "with diagonal plus rank-20 covariance fitted to SGD's iterates after half the epochs, 30 "
                         "draws, BatchNorm statistics recomputed for each"),
    "multiswag-5": Method(_swags(5), MULTISWAG_PAPER),
    "sgld": Method((*MAP, "--sgmcmc", "sgld", "--lr", "0.05"),
                   "Welling & Teh 2011, stochastic gradient Langevin dynamics on the minibatch log joint: constant "
                   "step, the first half of the epochs burnt in, a draw at the end of every later epoch"),
    "sghmc": Method((*MAP, "--sgmcmc", "sghmc", "--lr", "0.01"),
                    "Chen, Fox & Guestrin 2014, stochastic gradient HMC (friction 0.1: momentum 0.9): constant step, "
                    "the first half of the epochs burnt in, a draw at the end of every later epoch"),
    "csghmc": Method((*MAP, "--sgmcmc", "csghmc", "--lr", "0.5"),
                     "Zhang et al. 2020, cyclical SG-MCMC (cSGHMC) as their CIFAR-10 code runs it: 4 cosine cycles "
                     "from a step of 0.5 per example, friction 0.9, noise in the last 10 % of each cycle and a draw "
                     "at the end of each of its epochs"),
}
"""Every preset by name (the registry the CLI, the studies and the examples read)."""

FAMILIES: dict[str, tuple[Callable[[int], tuple[str, ...]], str]] = {
    "ibnn": (_components, IBNN_PAPER),
    "ensemble": (_members, ENSEMBLE_PAPER),
    "multiswag": (_swags, MULTISWAG_PAPER),
}
"""Presets with a number: ``<family>-<n>`` -> (its arguments for n, its paper)."""

METHOD_NAMES: tuple[str, ...] = tuple({"ibnn-4": "ibnn-K", "ensemble-5": "ensemble-M", "multiswag-5": "multiswag-M"
                                       }.get(name, name) for name in METHODS)
"""The names as ``--help`` and errors show them (``ibnn-K``, ``ensemble-M``, ``multiswag-M`` for the families)."""

RECORDING_COMMANDS = ("train",)
"""Commands whose configuration records the method it was expanded from (``RunConfig.method``); for the others
(``mcmc``) :func:`expand_method` drops ``--method NAME`` after inserting its arguments."""


def resolve_method(name: str) -> Method:
    """The preset called ``name``: a key of :data:`METHODS`, or ``ibnn-<K>`` / ``ensemble-<M>`` / ``multiswag-<M>``
    with a positive number; anything else is a ``ValueError`` naming the known methods."""
    if name in METHODS:
        return METHODS[name]
    match = re.fullmatch(r"([a-z]+)-([0-9]+)", name) if isinstance(name, str) else None
    if match and match.group(1) in FAMILIES and int(match.group(2)) >= 1:
        make, paper = FAMILIES[match.group(1)]
        return Method(make(int(match.group(2))), paper)
    raise ValueError(f"--method {name}: unknown method; choose one of {', '.join(METHOD_NAMES)} "
                     "(K, M: positive integers)")


def method_args(name: str) -> tuple[str, ...]:
    """The arguments method ``name`` stands for; an unknown name is a ``ValueError`` listing the known ones."""
    return resolve_method(name).args


def _named(argv: list[str]) -> str | None:
    """The value of the last ``--method NAME`` / ``--method=NAME`` in ``argv`` (None: none)."""
    name = None
    for i, arg in enumerate(argv):
        if arg == "--method" and i + 1 < len(argv):
            name = argv[i + 1]
        elif arg.startswith("--method="):
            name = arg.split("=", 1)[1]
    return name


def expand_method(argv: list[str]) -> list[str]:
    """``[command, *args]`` with the arguments of the ``--method`` it names inserted right after the command, before
    the user's own, which therefore win: ``["train", "--method", "bbb", "--epochs", "3"]`` ->
    ``["train", *METHODS["bbb"].args, "--method", "bbb", "--epochs", "3"]``.

    ``argv`` is returned unchanged without ``--method``, for an unknown method, or for one that another command
    runs: the run's checks (:func:`pyrobnn.cli.build.check_run`) then report it as one error line. A command outside
    :data:`RECORDING_COMMANDS` gets the arguments without ``--method NAME`` itself.
    """
    name = _named(argv[1:]) if argv else None
    try:
        method = resolve_method(name) if name is not None else None
    except ValueError:
        return list(argv)
    if method is None or method.command != argv[0]:
        return list(argv)
    rest = argv[1:]
    if argv[0] not in RECORDING_COMMANDS:
        rest = [arg for i, arg in enumerate(rest) if not (arg == "--method" or arg.startswith("--method=")
                                                          or (i > 0 and rest[i - 1] == "--method"))]
    return [argv[0], *method.args, *rest]
