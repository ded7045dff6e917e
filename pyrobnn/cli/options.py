"""A run described by plain data: which dataset, network, prior, guide, likelihood and optimisation.

The dataclasses only: :mod:`pyrobnn.cli.build` turns them into objects and checks them.

:class:`RunConfig` is what ``pyrobnn train`` parses and what a checkpoint stores
(:meth:`RunConfig.to_dict`), so ``pyrobnn evaluate`` and ``pyrobnn prune`` rebuild
the same model and guide from the checkpoint alone (:meth:`RunConfig.from_dict`,
:func:`build`). Its option groups are nested dataclasses, shown by tyro as groups of
``--help``: ``data``, ``model``, ``prior``, ``guide``, ``likelihood``, ``optim`` (with
the β schedule ``optim.beta``) and ``output``.

Every closed choice is read from its registry (:data:`pyrobnn.model.priors.PRIORS`,
:data:`pyrobnn.guides.GUIDES`, :data:`pyrobnn.infer.schedules.SCHEDULES`,
:data:`pyrobnn.handlers.ESTIMATORS`, ...), and :func:`build` constructs priors, guides,
likelihoods and schedules through the same registries, passing each the options its
constructor takes. Choices are spelled with hyphens on the command line
(``log-variance``, ``cross-entropy``); :data:`API_SPELLING` maps them to the values of the
Python API.

:class:`MCMCConfig` is what ``pyrobnn mcmc`` parses and what its ``draws.pt`` stores: the same
``data``, ``model``, ``prior`` and ``likelihood`` groups (the network is built by
:func:`build_network`, as for SVI), an ``mcmc`` group of NUTS options
(:func:`pyrobnn.infer.mcmc.sample_posterior`) and an ``output`` group with the seed.
"""

import dataclasses
import functools
import inspect
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from tyro.conf import OmitArgPrefixes, Suppress, arg

from pyrobnn.data import DATASETS, TASKS, TOY_DATASETS, UCI_DATASETS, canonical_name
from pyrobnn.data.corruptions import CIFAR10_C, CORRUPTIONS
from pyrobnn.data.splits import DEFAULT_FOLDS, DEFAULT_TEST_FRACTION
from pyrobnn.data.tables import AUTO_MAX_CLASSES
from pyrobnn.device import DEVICE_METAVAR
from pyrobnn.distributions import KL_APPROXIMATIONS, MIXTURE_KLS
from pyrobnn.guides import GUIDES
from pyrobnn.guides.base import SHARING
from pyrobnn.guides.normal import PARAMETERIZATIONS
from pyrobnn.handlers import ESTIMATORS as _ESTIMATOR_REGISTRY
from pyrobnn.infer.elbo import PRECISIONS, MeanFieldELBO
from pyrobnn.infer.mcmc import SAMPLERS
from pyrobnn.infer.optim import OPTIMIZERS, Optim, StepDecay
from pyrobnn.infer.recording import COMPILE_MODES
from pyrobnn.infer.schedules import SCHEDULES
from pyrobnn.infer.svi import fit
from pyrobnn.methods import IVON, METHOD_NAMES, NUTS, SNGP, Variational
from pyrobnn.methods import SGMCMC as SGMCMCMethod
from pyrobnn.methods import SWAG as SWAGMethod
from pyrobnn.methods.nuts import MAX_WEIGHTS
from pyrobnn.methods.rules import SPARSE_VD_LR
from pyrobnn.model.likelihoods import LIKELIHOODS, Categorical, Gaussian
from pyrobnn.model.priors import PRIORS, NodePrior, ScaleMixturePrior
from pyrobnn.networks import NETWORKS
from pyrobnn.networks.hf import FINETUNING, LoRA

TAU = "tau"
"""The grid's noise precision in the target's original units (sets ``--likelihood.scale``)."""

PROTOCOL = "protocol"
"""The grid entry that stands for the data set's own grid."""


def grid_entry(spec: str) -> Optional[tuple[str, tuple[str, ...]]]:
    """An entry ``NAME=V1,V2,...`` of ``--grid`` (``pyrobnn train`` and ``pyrobnn mcmc``) as ``(NAME without its
    dashes, (V1, V2, ...))``; ``None`` when it is malformed (no ``=``, no name or no value)."""
    name, sep, values = spec.partition("=")
    name = name.strip().lstrip("-")
    texts = tuple(v.strip() for v in values.split(",") if v.strip())
    return (name, texts) if sep and name and texts else None


def noise_precision(text: str) -> float:
    """A value of ``--grid tau=...``: a finite positive number, else a :class:`ValueError` naming ``--grid``."""
    try:
        tau = float(text)
    except ValueError:
        tau = math.nan
    if not (math.isfinite(tau) and tau > 0):
        raise ValueError(f"--grid {TAU}={text}: the noise precision must be a positive number")
    return tau


__all__ = [
    "RunConfig", "MethodOptions", "CalibrationOptions", "DataOptions", "ModelOptions", "PriorOptions",
    "GuideOptions", "LikelihoodOptions",
    "BetaOptions", "OptimOptions", "OutputOptions", "ESTIMATORS", "LIKELIHOODS", "RESUMABLE", "API_SPELLING",
    "MCMCConfig", "MCMCOptions", "MCMCOutputOptions", "ToyDataOptions", "MCMCModelOptions", "MCMCLikelihoodOptions",
    "COMPILE_MODES", "TAU", "PROTOCOL", "grid_entry", "noise_precision", "TOY_DATASETS", "MCMC_MODELS",
    "MCMC_MAX_WEIGHTS", "toy_dataset", "mcmc_dataset",
]

ESTIMATORS: tuple[str, ...] = tuple(_ESTIMATOR_REGISTRY)
"""Names of the gradient estimators (the keys of :data:`pyrobnn.handlers.ESTIMATORS`)."""

"""Observation models selectable by name (``--likelihood``; ``auto`` picks by the dataset's task)."""

API_SPELLING = {"log-variance": "log_variance", "cross-entropy": "cross_entropy", "mixture-mean": "mixture_mean",
                "entropy-bound": "entropy_bound"}
"""Command-line spelling of a choice -> the value the Python API takes, where they differ."""

_CLI_SPELLING = {api: cli for cli, api in API_SPELLING.items()}

RESUMABLE = ("--epochs", "--num-samples", "--device", "--compile", "--data-root", "--progress", "--resume", "--out",
             "--overwrite", "--max-memory", "--ood-dataset", "--corruptions", "--corruption-types")
"""Options that may differ between a run and its ``--resume``: none changes what was trained."""

MAX_MEMORY_HINT = "(default: half the free GPU memory, or 2 on a CPU)"

OODDataset = Annotated[Optional[str], arg(metavar="{" + ",".join(DATASETS) + "}",
                                         help_behavior_hint="(default: none)")]
"""``--ood-dataset`` of ``pyrobnn train`` and ``pyrobnn evaluate``."""
Severities = Annotated[tuple[int, ...], arg(metavar="SEVERITY")]
"""``--corruptions`` of ``pyrobnn train`` and ``pyrobnn evaluate``."""
CorruptionTypes = Annotated[tuple[Literal[tuple(CORRUPTIONS)], ...],
                            arg(help_behavior_hint="(default: the 14 CIFAR-10-C types generated in code)")]
"""``--corruption-types`` of ``pyrobnn train`` and ``pyrobnn evaluate``."""

DATASET_METAVAR = "{" + ",".join(DATASETS) + ",folder:PATH,uci:PATH,csv:PATH,parquet:PATH,npz:PATH,py:MODULE:FUNCTION}"
MODEL_METAVAR = "{" + ",".join(NETWORKS) + ",tv:NAME,hf:NAME,hf:PATH}"


def cli_spelling(value):
    """A value as the command line spells it (``log_variance`` -> ``log-variance``)."""
    return _CLI_SPELLING.get(value, value) if isinstance(value, str) else value


def api_value(value):
    return API_SPELLING.get(value, value) if isinstance(value, str) else value


def _choices(values) -> Any:
    """``Literal`` of a registry's names in command-line spelling (built from the registry, never re-listed)."""
    return Literal[tuple(cli_spelling(v) for v in values)]


def _default(cls, name: str):
    """The default of ``cls``'s constructor argument ``name``: one place for every default."""
    return inspect.signature(cls).parameters[name].default


LR_HINT = f"(default: {SPARSE_VD_LR:g} with the log-uniform prior, else {_default(Optim, 'lr'):g})"


def _flat(**kwargs):
    """A field whose flag carries no group prefix (``--epochs``, not ``--optim.epochs``)."""
    return arg(prefix_name=False, **kwargs)


PriorName = _choices(PRIORS)
GuideName = _choices(GUIDES)
ScheduleName = _choices(("auto", *SCHEDULES))
EstimatorName = _choices(ESTIMATORS)
LikelihoodName = _choices(("auto", *LIKELIHOODS))
Share = _choices(SHARING)


@dataclass
class DataOptions:
    """Which examples to train and test on."""

    dataset: Annotated[str, arg(metavar=DATASET_METAVAR)] = "mnist"
    ("Dataset; folder:PATH is an ImageFolder tree with train/ and test/ class folders, or class folders alone; "
     "csv:PATH, parquet:PATH and npz:PATH (or a path ending in .csv, .parquet, .npz) are your own table or arrays, "
     "py:MODULE:FUNCTION a function returning them (README, 'Your own data').")
    data_root: Annotated[Optional[Path], arg(metavar="PATH",
                                             help_behavior_hint="(default: $PYROBNN_DATA, "
                                                                "else ~/.cache/pyrobnn/data)")] = None
    """Directory holding the datasets."""
    train_size: Annotated[Optional[int], arg(metavar="INT", help_behavior_hint="(default: all)")] = None
    """Train on a seeded random subset of this many examples (toy datasets: generate this many)."""
    test_size: Annotated[Optional[int], arg(metavar="INT", help_behavior_hint="(default: all)")] = None
    """Test on a seeded random subset of this many examples."""
    val_size: int = 0
    """Hold out this many training examples and evaluate them after each epoch (0: none)."""
    max_length: Annotated[Optional[int], arg(name="data.max-length", metavar="TOKENS",
                                             help_behavior_hint="(default: 256)")] = None
    """Text datasets (imdb, rotten-tomatoes): truncate or pad each text to this many tokens."""
    augment: bool = False
    ("Images: keep the training set as uint8 on the device; each batch is normalised per channel and, for cifar10, "
     "randomly cropped (padding 4) and flipped on the device; test images are normalised alike.")
    split: Annotated[Optional[int], arg(metavar="INT", help_behavior_hint="(default: none; UCI: 0)")] = None
    ("Which train/test split: a UCI data set's fixed split, 0 to n_splits - 1; for tables, arrays and "
     "class folders, fold i of --data.folds is the test set (cross-validation: pyrobnn study --splits K); without "
     "it they test on --data.test-fraction.")
    target: Annotated[Optional[str], arg(name="data.target", metavar="COLUMN",
                                         help_behavior_hint="(default: the last column)")] = None
    """Tables: the column to predict."""
    task: Annotated[Literal[TASKS], arg(  # type: ignore[valid-type]
        name="data.task", help=f"Tables and arrays: auto is classification when the target is text or true/false, or "
                               f"whole numbers with at most {AUTO_MAX_CLASSES} distinct values, and regression "
                               "otherwise (inputs and a regression target are standardised on the training rows; "
                               "metrics in the target's units).")] = "auto"
    features: Annotated[tuple[str, ...], arg(name="data.features", metavar="COLUMN [COLUMN ...]",
                                             help_behavior_hint="(default: every column but the target)")] = ()
    """Tables: the input columns; text columns are one-hot encoded."""
    categorical: Annotated[tuple[str, ...], arg(name="data.categorical", metavar="COLUMN [COLUMN ...]",
                                                help_behavior_hint="(default: none)")] = ()
    """Tables: numeric feature columns to one-hot encode as categories too (codes such as 1, 2, 3 for three kinds)."""
    folds: Annotated[Optional[int], arg(name="data.folds", metavar="K",
                                        help_behavior_hint=f"(default: {DEFAULT_FOLDS})")] = None
    """Tables, arrays, class folders: the K of K-fold splits; --split i tests fold i, trains on the others."""
    test_fraction: Annotated[Optional[float], arg(name="data.test-fraction", metavar="FLOAT",
                                                  help_behavior_hint=f"(default: {DEFAULT_TEST_FRACTION})")] = None
    """Tables, arrays, class folders, without --split: the share of the rows tested on."""
    split_seed: Annotated[Optional[int], arg(name="data.seed", metavar="INT",
                                             help_behavior_hint="(default: 0)")] = None
    ("Tables, arrays, class folders: the seed of the random order of the rows that the folds and the test fraction "
     "cut (not --seed: every seed and method of a study sees the same splits).")


@dataclass
class ModelOptions:
    """The network and which of its parameters are Bayesian."""

    name: Annotated[str, arg(name="model", metavar=MODEL_METAVAR)] = "mlp"
    ("Network: mlp, LeNet-300-100, LeNet-5, a small ViT, the CIFAR nets (lenet5-cifar, alexnet, resnet18, resnet50, "
     "vgg16, wrn28-10, wrn<d>-<k>), a one-block transformer (text datasets: imdb), a torchvision classifier "
     "(tv:NAME), or a pretrained transformers classifier with LoRA adapters, its backbone frozen (hf:minilm-l6, "
     "hf:PATH; the hf extra; texts are read with its own tokenizer).")
    hidden: tuple[int, ...] = (400,)
    """Hidden widths of the mlp, e.g. 1200 1200."""
    dropout: float = 0.0
    ("Dropout rate in the mlp, vit, alexnet and vgg16 classifiers and wide-ResNet blocks (0: none; refused by the "
     "others).")
    width: float = 1.0
    ("Multiplier of the hidden widths of the built-in models (e.g. 0.25 for a quick run; wrn28-10 at 0.1 is WRN-28-1).")
    bayesian: Annotated[str, arg(metavar="{all,last-layer,none,PATTERNS}")] = "all"
    ("Parameters with priors: all (normalisation layers stay deterministic), last-layer, none (maximum likelihood), or"
     " comma-separated globs over parameter names.")
    init_from: Annotated[Optional[Path], arg(metavar="CHECKPOINT", help_behavior_hint="(default: none)")] = None
    ("Start the network from the weights of a deterministic run's checkpoint.pt (pyrobnn train --bayesian none, the "
     "same --model): the posterior means start at the pre-trained weights.")
    lora_rank: int = _default(LoRA, "r")
    """hf: models: the rank r of the LoRA adapters."""
    lora_alpha: float = _default(LoRA, "alpha")
    """hf: models: LoRA's alpha (the update is scaled by alpha / r)."""
    lora_targets: Annotated[tuple[str, ...], arg(metavar="MODULE [MODULE ...]")] = _default(LoRA, "targets")
    """hf: models: the linear modules that get adapters (names as in the model, e.g. query key value dense)."""


@dataclass
class PriorOptions:
    """The weight prior p(w) (pyrobnn.model.priors)."""

    name: Annotated[PriorName, arg(name="prior", prefix_name=False)] = "gaussian"
    ("gaussian N(0, scale^2), the scale mixture of Blundell et al. (2015), the log-uniform prior of variational "
     "dropout (Kingma et al. 2015), or node: N(1, scale^2) latents on the units of every layer, whose weights stay "
     "point estimates (implicit BNN, Trinh et al. 2020).")
    scale: Annotated[Optional[float], arg(help_behavior_hint="(default: 1 for gaussian, 0.3 for node)")] = None
    """gaussian: standard deviation; node: s of the node-wise N(1, s^2)."""
    fan_in: bool = _default(PRIORS["gaussian"], "fan_in")
    """gaussian: scale / sqrt(fan-in) on weight matrices (scale 1.41 keeps the function scale through ReLUs)."""
    bias_scale: Annotated[Optional[float], arg(help_behavior_hint="(default: --prior.scale)")] = None
    """gaussian: standard deviation of the biases' prior."""
    mode: _choices(NodePrior.MODES) = _default(NodePrior, "mode")
    """node: the latents multiply each layer's inputs (Trinh et al. 2020) or its outputs (Trinh et al. 2022)."""
    bias: bool = _default(NodePrior, "bias")
    """node: also a latent on each layer's bias (mode in)."""
    pi: float = _default(ScaleMixturePrior, "pi")
    """scale-mixture: weight of the wide component, in (0, 1)."""
    sigma1: float = _default(ScaleMixturePrior, "sigma1")
    """scale-mixture: standard deviation of the wide component."""
    sigma2: Annotated[float, arg(help_behavior_hint="(default: e^-8)")] = _default(ScaleMixturePrior, "sigma2")
    """scale-mixture: standard deviation of the narrow component."""


@dataclass
class GuideOptions:
    """The posterior family q(w) (pyrobnn.guides)."""

    name: Annotated[GuideName, arg(name="guide", prefix_name=False)] = "normal"
    ("normal: diagonal Normal (Bayes by Backprop, Blundell et al. 2015); additive: sparse variational dropout "
     "(Molchanov et al. 2017); multiplicative: variational dropout (Kingma et al. 2015); dropout: MC dropout (Gal & "
     "Ghahramani 2016); point: MAP point estimates; mixture-node: a K-component mixture over the node latents of "
     "--prior node (implicit BNN, Trinh et al. 2020).")
    parameterization: _choices(PARAMETERIZATIONS) = cli_spelling(_default(GUIDES["normal"], "parameterization"))
    ("normal: sigma = softplus(rho) (Blundell et al. 2015), or sigma^2 = exp(v) of a learned log variance v, the "
     "variational dense of Graves (2011).")
    share: Share = _default(GUIDES["normal"], "share")
    """normal (sigma) and multiplicative (log alpha): one per weight, per output unit (row) or per layer."""
    init_rho: float = _default(GUIDES["normal"], "init_rho")
    """normal: initial rho, sigma0 = softplus(rho) (-5 gives 6.7e-3)."""
    init_log_sigma2: float = _default(GUIDES["additive"], "init_log_sigma2")
    """additive: initial log sigma^2 of every weight."""
    mask_pruned: bool = _default(GUIDES["additive"], "mask_pruned")
    ("additive: a weight with log alpha > 3 (one that pruning removes) has posterior mean 0 in training and "
     "prediction (train_clip of Molchanov et al.'s code).")
    init_log_alpha: float = _default(GUIDES["multiplicative"], "init_log_alpha")
    """multiplicative: initial log alpha."""
    max_log_alpha: float = _default(GUIDES["multiplicative"], "max_log_alpha")
    ("multiplicative: upper bound of log alpha (0: alpha <= 1, Kingma et al. 2015; a positive bound needs "
     "--guide.approximation molchanov).")
    approximation: _choices(KL_APPROXIMATIONS) = _default(GUIDES["multiplicative"], "approximation")
    """multiplicative: the KL approximation, Kingma et al. (2015, alpha <= 1) or Molchanov et al. (2017, any alpha)."""
    rate: float = _default(GUIDES["dropout"], "rate")
    ("dropout: probability of dropping each input unit (channel) of every Bayesian layer (train with --estimator "
     "local: one mask per example).")
    rates: tuple[str, ...] = ()
    ("dropout: per-layer rates, GLOB=RATE over the model's site names (first match wins; other sites take "
     "--guide.rate), e.g. 'net.0.*=0' keeps a LeNet's image undropped; a pattern that matches no site is refused, "
     "naming the sites.")
    components: int = _default(GUIDES["mixture-node"], "num_components")
    ("mixture-node: K, the mixture components (train with --estimator local, batches a multiple of K; --num-samples a "
     "multiple of K).")
    init_scale: float = _default(GUIDES["mixture-node"], "init_scale")
    """mixture-node: spread of the initial component means around 1."""
    kl: _choices(MIXTURE_KLS) = cli_spelling(_default(GUIDES["mixture-node"], "kl"))
    """mixture-node: KL of the mixture-mean Gaussian (Trinh et al. 2020) or the pairwise-Bhattacharyya upper bound."""
    entropy_weight: float = _default(GUIDES["mixture-node"], "entropy_weight")
    """mixture-node: gamma, the entropy bonus of the gamma-ELBO (Trinh et al. 2022)."""


@dataclass
class LikelihoodOptions:
    """The observation model p(y | x, w) (pyrobnn.model.likelihoods)."""

    name: Annotated[LikelihoodName, arg(name="likelihood", prefix_name=False)] = "auto"
    """auto: categorical for classification, gaussian for regression; heteroscedastic learns the noise per input."""
    scale: Annotated[Optional[float], arg(metavar="FLOAT", help_behavior_hint="(default: learned from 1)")] = None
    ("gaussian: noise standard deviation, fixed (its initial value with --likelihood.learn-scale), in the standardised "
     "target's units; unset: learned from 1, the target's spread (fixed at 1 for a deep ensemble, MultiSWAG and "
     "SG-MCMC, which replay several networks' weights in one: pyrobnn.methods.rules).")
    learn_scale: bool = _default(Gaussian, "learn_scale")
    ("gaussian: learn the noise standard deviation as a point estimate (refused for a deep ensemble, MultiSWAG and "
     "SG-MCMC).")
    vdp_objective: _choices(Categorical.VDP_OBJECTIVES) = cli_spelling(_default(Categorical, "vdp_objective"))
    ("categorical under --estimator vdp: Gaussian NLL of one-hot targets with the propagated variance, or cross-"
     "entropy.")


@dataclass
class BetaOptions:
    """The KL weight beta of each minibatch (pyrobnn.infer.schedules)."""

    name: Annotated[ScheduleName, arg(name="beta", prefix_name=False)] = "auto"
    ("auto: the schedule the guide's and prior's paper uses (geometric for a normal guide with a gaussian or "
     "scale-mixture prior; for the log-uniform prior 0 over the first third of the epochs, then linear to 1; for the "
     "node prior linear over the first 2/3; constant 1 for dropout and point); constant; linear: 0 for --beta.warmup "
     "epochs, then a ramp to --beta.value over --beta.anneal epochs; geometric: minibatch i of M weighs "
     "2^(M-i)/(2^M-1) (Blundell et al. 2015).")
    value: float = _default(SCHEDULES["constant"], "beta")
    """constant: beta; linear: the final beta."""
    warmup: int = _default(SCHEDULES["linear"], "warmup")
    """linear: epochs with beta = 0."""
    anneal: int = _default(SCHEDULES["linear"], "anneal")
    """linear: epochs of the ramp after the warm-up (0: jump)."""


_SCHEDULE_ARGUMENTS = {"beta": "value", "final": "value"}
"""Schedule constructor argument -> BetaOptions field, where the names differ (Constant(beta), LinearWarmup(final))."""


@dataclass
class OptimOptions:
    """Stochastic variational inference: steps, estimator, particles, seed, device."""

    epochs: Annotated[int, _flat()] = _default(Variational.fit, "epochs")
    """Passes over the training data."""
    batch_size: Annotated[int, _flat()] = _default(Variational, "batch_size")
    """Minibatch size B (the likelihood is scaled by N/B)."""
    lr: Annotated[Optional[float], _flat(metavar="FLOAT", help_behavior_hint=LR_HINT)] = None
    """Learning rate per example, as papers state it (for the mean loss; sgd's is divided by N on the summed ELBO)."""
    optimizer: Annotated[_choices(OPTIMIZERS), _flat()] = _default(Optim, "name")
    """Optimiser (sgd: with Nesterov momentum 0.9)."""
    weight_decay: Annotated[float, _flat()] = _default(Optim, "weight_decay")
    """L2 penalty of the optimiser on every parameter, per example as papers state it (0: none)."""
    kl_lr: Annotated[Optional[float], _flat(metavar="FLOAT", help_behavior_hint=f"(hf: {FINETUNING.kl_lr:g})")] = None
    """The KL by plain SGD at this per-example rate, the optimiser on the likelihood only (unset: KL in the loss)."""
    lr_step: Annotated[int, _flat()] = 0
    """Multiply the learning rate by --lr-gamma every this many epochs (0: constant)."""
    lr_gamma: Annotated[float, _flat()] = _default(StepDecay, "gamma")
    """Learning-rate decay factor."""
    lr_linear_from: Annotated[float, _flat()] = 0.0
    ("From this fraction of the epochs on, the learning rate falls linearly to 0 at the last epoch (Molchanov et al. "
     "2017: 0.5; 0: off).")
    variational_lr_factor: Annotated[float, _flat()] = 1.0
    ("Learning rate of the guide's parameters, times --lr (the network's point weights keep --lr): the large "
     "variational rate of implicit BNNs (Trinh et al. 2020); 1: one rate.")
    num_particles: Annotated[int, _flat()] = _default(Variational, "num_particles")
    """Posterior samples per training step, drawn in one batched pass."""
    precision: Annotated[_choices(PRECISIONS), _flat()] = _default(MeanFieldELBO, "precision")
    """Arithmetic of the network: fp32, or bf16 autocast (the KL and log-likelihood stay in fp32)."""
    estimator: Annotated[EstimatorName, _flat()] = _default(Variational, "estimator")
    ("sample: weights; local: local reparameterization (Kingma et al. 2015); flipout (Wen et al. 2018); vdp: moment "
     "propagation, deterministic (Dera et al. 2019).")
    compile: Annotated[_choices(COMPILE_MODES), _flat()] = _default(fit, "compile")
    ("How each step's loss and gradient run: none (eagerly, from Python), or recorded once per batch shape as one "
     "graph and replayed: trace (as recorded: the eager numbers without the per-step Python and autograd), inductor "
     "(compiled by TorchInductor, which fuses the elementwise work; seconds to compile); auto: on a GPU inductor; on "
     "a CPU inductor for a run of 3,000 steps or more, eager for fewer than 100 steps or a convolutional network, "
     "trace otherwise (the header line says which, and why). Under auto a model "
     "that cannot be recorded trains eagerly after one line saying why; an explicit mode that cannot run is an "
     "error.")
    beta: Annotated[BetaOptions, _flat()] = field(default_factory=BetaOptions)
    seed: Annotated[int, _flat()] = _default(fit, "seed")
    """Random seed: subsets, weight initialisation, noise, data order, test predictions."""
    device: Annotated[str, _flat(metavar=DEVICE_METAVAR)] = _default(fit, "device")
    """Where to train (auto: cuda when available)."""
    grid: Annotated[tuple[str, ...], _flat(metavar="{NAME=V1,V2,...,protocol}")] = ()
    ("Choose hyper-parameters on an 80/20 split of the training set (the test set unseen): train each combination "
     "on 80 %, keep the one of highest held-out log-likelihood, retrain it on the whole training set. NAME is an "
     "option without its dashes (guide.rate, likelihood.scale, prior.scale, lr, ...) or tau, the noise precision in "
     "the target's original units (likelihood.scale = 1 / (sqrt(tau) y_std)); protocol: the data set's own grid "
     "(UCI: tau_values.txt, and dropout_rates.txt for --guide dropout); likelihood=gaussian,heteroscedastic: a "
     "heteroscedastic point takes no tau. A point of a deep ensemble is scored as its ensemble. "
     "metrics.json's selection has every point.")


@dataclass
class OutputOptions:
    """Where the run is written and how it is reported."""

    out: Annotated[Path, arg(metavar="DIR")] = Path("runs/latest")
    """Output directory: checkpoint.pt (the last epoch, written at most once a minute), metrics.json, reliability."""
    resume: Annotated[bool, arg(help="Continue from <out>/checkpoint.pt if it exists; only "
                                     + ", ".join(o for o in RESUMABLE if o not in ("--resume", "--out"))
                                     + " may differ from the run that wrote it.")] = False
    overwrite: bool = False
    """Train into an --out that already holds a run (its checkpoint.pt and metrics.json are replaced)."""
    progress: bool = True
    """Show progress bars (training, and the passes of the test report)."""
    num_samples: Annotated[Optional[int], arg(metavar="INT", help_behavior_hint="(default: sized to the run)")] = None
    """Monte-Carlo samples of the predictive for the test report; unset: the method's, fewer if they outlast the run."""
    max_memory: Annotated[Optional[float], arg(metavar="GB", help_behavior_hint=MAX_MEMORY_HINT)] = None
    """Memory one prediction pass may hold, in GB: the passes of the test report are sized to fit it."""
    ood_dataset: OODDataset = None
    ("Also score how well the epistemic and the total uncertainty tell this dataset's test inputs from the test set"
     " (AUROC, AUPR, FPR at 95 % TPR; e.g. fashion-mnist for mnist, rotten-tomatoes for imdb): metrics.json's "
     "test.ood; a shifted set with the same labels (rotten-tomatoes for imdb, imdb for rotten-tomatoes) also "
     "gets its accuracy, NLL, ECE and Brier (test.ood.shifted).")
    corruptions: Severities = ()
    ("Also evaluate the test images corrupted at these severities (1-5), e.g. 3 or 1 2 3 4 5 (image datasets): "
     "metrics.json's test.corrupted.")
    corruption_types: CorruptionTypes = CIFAR10_C
    """Corruptions to apply with --corruptions."""


@dataclass
class MethodOptions:
    """A method's own settings (pyrobnn.methods), for the methods of their kind (--method picks the method; unset: the
    method's, the preset of --method NAME): SWAG's collection, SG-MCMC's sampler, IVON's optimiser, SNGP's GP."""

    swag_start: Annotated[Optional[int], arg(name="swag.start", metavar="T",
                                             help_behavior_hint="(default: half the epochs, at most all but 2)")] = (
        _default(SWAGMethod, "start"))
    """SWAG: collect the iterate after each epoch from epoch T+1 on (at least two epochs)."""
    swag_rank: Annotated[int, arg(name="swag.rank", metavar="K")] = _default(SWAGMethod, "rank")
    """SWAG: the deviations kept, the rank of the low-rank covariance (at least 2)."""
    swag_lr: Annotated[Optional[float], arg(name="swag.lr", metavar="FLOAT", help_behavior_hint=(
        f"(default: --lr throughout; --method swag: {_default(SWAGMethod, 'swa_lr')})"))] = None
    ("SWAG: the learning rate of the collection (per example), at most --lr; --lr falls to it linearly from 0.5 T to "
     "0.9 T, as Maddox et al. schedule it.")
    sgmcmc_temperature: Annotated[float, arg(name="sgmcmc.temperature")] = _default(SGMCMCMethod, "temperature")
    """SG-MCMC: the posterior's temperature T, p(w | D)^(1/T) (1: the posterior; < 1: a cold posterior)."""
    sgmcmc_friction: Annotated[Optional[float], arg(name="sgmcmc.friction", metavar="FLOAT",
                                                    help_behavior_hint="(default: the sampler's)")] = None
    """SG-MCMC: the friction alpha in (0, 1], 1 - the momentum (sgld: 1, sghmc: 0.1, csghmc: 0.9)."""
    sgmcmc_cycles: Annotated[Optional[int], arg(name="sgmcmc.cycles", metavar="M",
                                                help_behavior_hint="(default: the sampler's)")] = None
    """SG-MCMC: cosine cycles of the step size over the run's steps (0: constant; csghmc: 4)."""
    sgmcmc_exploration: Annotated[Optional[float], arg(name="sgmcmc.exploration", metavar="FLOAT",
                                                       help_behavior_hint="(default: the sampler's)")] = None
    ("SG-MCMC: the fraction of each cycle (without cycles: of the run, the burn-in) before draws are kept; in a "
     "cycle it runs without noise (sgld, sghmc: 0.5; csghmc: 0.9).")
    sgmcmc_chains: Annotated[int, arg(name="sgmcmc.chains", metavar="C")] = _default(SGMCMCMethod, "chains")
    ("SG-MCMC: chains from the initialisations of seeds seed..seed+C-1, run as one stacked network (the same batches, "
     "each its own noise; not with --augment or --val-size).")
    ivon_ess: Annotated[Optional[float], arg(name="ivon.ess", metavar="FLOAT",
                                             help_behavior_hint="(default: the training set's size N)")] = (
        _default(IVON, "ess"))
    """IVON: the effective sample size lambda (larger than N: a colder posterior)."""
    ivon_hess_init: Annotated[float, arg(name="ivon.hess-init")] = _default(IVON, "hess_init")
    """IVON: h0, the initial Hessian (the initial standard deviation is 1 / sqrt(lambda (h0 + weight decay)))."""
    ivon_beta1: Annotated[float, arg(name="ivon.beta1")] = _default(IVON, "beta1")
    """IVON: the gradient's momentum."""
    ivon_beta2: Annotated[float, arg(name="ivon.beta2")] = _default(IVON, "beta2")
    """IVON: the Hessian's momentum (close to 1: h moves little in a short run)."""
    sngp_features: Annotated[int, arg(name="sngp.features", metavar="D")] = _default(SNGP, "features")
    """SNGP: the random Fourier features of its Gaussian-process output layer."""
    sngp_bound: Annotated[float, arg(name="sngp.bound", metavar="C")] = _default(SNGP, "bound")
    """SNGP: the bound c on the spectral norm of each hidden layer's weight."""
    sngp_length_scale: Annotated[float, arg(name="sngp.length-scale")] = _default(SNGP, "length_scale")
    """SNGP: the length scale of the GP's RBF kernel."""
    sngp_mean_field: Annotated[float, arg(name="sngp.mean-field", metavar="LAMBDA")] = _default(SNGP, "mean_field")
    """SNGP: lambda of the mean-field predictive softmax(g / sqrt(1 + lambda var)) (pi/8; 0: the MAP logits)."""


@dataclass
class CalibrationOptions:
    """Post-hoc calibration on held-out training rows: temperature scaling (Guo et al. 2017) and split conformal
    prediction (pyrobnn.analysis.calibration)."""

    calibrate: Annotated[bool, arg(name="calibrate")] = False
    ("Hold out --calibrate.fraction of the training rows before training (they are never trained on, nor searched "
     "by --grid; the same positions for every --seed and method), fit a temperature on them (regression: a factor on "
     "the predictive standard deviation) and a conformal threshold; metrics.json's test gets nll_calibrated, "
     "ece_calibrated (regression: log_likelihood_calibrated), temperature, conformal_coverage and "
     "conformal_set_size (regression: conformal_width).")
    fraction: Annotated[float, arg(name="calibrate.fraction")] = 0.1
    """With --calibrate: the share of the training rows held out, in (0, 1)."""
    coverage: Annotated[float, arg(name="calibrate.coverage")] = 0.9
    """With --calibrate: the nominal coverage 1 - alpha of the conformal prediction sets and intervals, in (0, 1)."""


class _Config:
    """What :class:`RunConfig` and :class:`MCMCConfig` share: plain data for a checkpoint, and flags."""

    def to_dict(self) -> dict:
        """Nested dict of plain values (paths as strings, tuples as lists): what a checkpoint stores."""
        def plain(value):
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            if isinstance(value, (tuple, list)):
                return [plain(v) for v in value]
            return str(value) if isinstance(value, Path) else value

        return plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, values: dict):
        """The config of :meth:`to_dict`; raises :class:`ValueError` naming any option it does not know."""
        if not isinstance(values, dict):
            raise ValueError(f"a run configuration must be a dict of option groups, got {type(values).__name__}")
        return _from_dict(cls, values, "")

    def flags(self) -> dict[str, Any]:
        """``{command-line flag: value}`` of every option (``--lr``, ``--prior.scale``, ...)."""
        return {name: getattr(group, field_name) for name, group, field_name in _fields(self)}

    def fields(self) -> dict[str, tuple[Any, str]]:
        """``{command-line flag: (the option group holding it, its field name)}``: where each option is set."""
        return {name: (group, field_name) for name, group, field_name in _fields(self)}


@dataclass
class RunConfig(_Config):
    """Train a Bayesian neural network by SVI on the annealed ELBO; write checkpoint.pt, metrics.json and
    reliability.png to --out."""

    method: Annotated[Optional[str], arg(metavar="{" + ",".join(METHOD_NAMES) + "}",
                                         help_behavior_hint="(default: none)")] = None
    ("A method by name (pyrobnn.methods.METHODS): its prior, guide, estimator, beta schedule and its paper's "
     "settings, as options placed before yours, which win.")
    data: OmitArgPrefixes[DataOptions] = field(default_factory=DataOptions)
    model: OmitArgPrefixes[ModelOptions] = field(default_factory=ModelOptions)
    prior: PriorOptions = field(default_factory=PriorOptions)
    guide: GuideOptions = field(default_factory=GuideOptions)
    likelihood: LikelihoodOptions = field(default_factory=LikelihoodOptions)
    optim: Annotated[OptimOptions, arg(name="optimisation")] = field(default_factory=OptimOptions)
    method_options: OmitArgPrefixes[MethodOptions] = field(default_factory=MethodOptions)
    calibration: OmitArgPrefixes[CalibrationOptions] = field(default_factory=CalibrationOptions)
    output: OmitArgPrefixes[OutputOptions] = field(default_factory=OutputOptions)



# ---------------------------------------------------------------------- pyrobnn mcmc


MCMC_MODELS = ("mlp",)
"""The networks ``pyrobnn mcmc`` samples (``--model``)."""

MCMC_MAX_WEIGHTS = MAX_WEIGHTS
"""The most Bayesian weights ``pyrobnn mcmc`` samples: NUTS's (:data:`pyrobnn.methods.nuts.MAX_WEIGHTS`)."""


def toy_dataset(name: str) -> str:
    """The canonical name of a toy dataset (aliases as :func:`~pyrobnn.data.load_dataset` takes them);
    any other dataset is a :class:`ValueError` naming ``--dataset``: NUTS evaluates the full-batch likelihood
    hundreds of times per draw, which only a toy problem (:data:`pyrobnn.data.TOY_DATASETS`) affords."""
    key = canonical_name(name) if isinstance(name, str) else name
    if key in TOY_DATASETS:
        return key
    raise _not_sampled(name, key, f"the toy problems {', '.join(TOY_DATASETS)}")


def _not_sampled(name, key, sampled: str) -> ValueError:
    """The error for a ``--dataset`` that ``pyrobnn mcmc`` does not sample (``sampled``: what it does)."""
    known = key in DATASETS or (isinstance(name, str) and name.startswith("folder:"))
    advice = (f"for {name} train a variational posterior with `pyrobnn train`" if known
              else f"unknown dataset {name!r}")
    return ValueError(f"--dataset {name}: pyrobnn mcmc samples only {sampled} (NUTS runs full batch, hundreds of "
                      f"network passes per draw); {advice}")


def mcmc_dataset(name: str) -> str:
    """The canonical name of a dataset ``pyrobnn mcmc`` samples on: a toy problem (:func:`toy_dataset`) or a UCI
    regression data set (``uci-NAME``, ``uci:PATH``; :mod:`pyrobnn.data.uci`, a few hundred to a few thousand rows,
    full batch); anything else is a :class:`ValueError` naming ``--dataset``."""
    if isinstance(name, str) and name.startswith("uci:"):
        return name
    key = canonical_name(name) if isinstance(name, str) else name
    if key in UCI_DATASETS or key in TOY_DATASETS:
        return key
    raise _not_sampled(name, key, f"the toy problems {', '.join(TOY_DATASETS)} and the UCI regression data sets "
                                  "(uci-NAME, uci:PATH)")


@dataclass
class ToyDataOptions(DataOptions):
    """Which toy problem or UCI regression data set to sample on, and how many points to generate."""

    dataset: Annotated[str, arg(metavar="{" + ",".join(TOY_DATASETS) + "}|uci-NAME|uci:PATH")] = "two-moons"
    ("Toy problem: two-moons (classification), cubic or sinusoid (regression); or a UCI regression data set "
     "(uci-boston, uci-yacht, ... or uci:PATH), standardised on its training split, metrics in the target's units.")
    data_root: Annotated[Optional[Path], arg(metavar="PATH",
                                             help_behavior_hint="(default: $PYROBNN_DATA, "
                                                                "else ~/.cache/pyrobnn/data)")] = None
    """UCI data sets: the directory holding uci/<folder>/ (toy problems are generated)."""
    train_size: Annotated[Optional[int], arg(metavar="INT", help_behavior_hint="(default: the dataset's own)")] = None
    ("Generate this many training points (UCI: a seeded subset of the training split; NUTS runs full batch: at most "
     "pyrobnn.infer.mcmc.MAX_FULL_BATCH).")
    test_size: Annotated[Optional[int], arg(metavar="INT", help_behavior_hint="(default: the dataset's own)")] = None
    """Generate this many test points (UCI: a seeded subset of the test split)."""
    val_size: Suppress[int] = 0  # NUTS samples on every training point
    max_length: Suppress[Annotated[Optional[int], arg(name="data.max-length")]] = None  # no text
    augment: Suppress[bool] = False  # toy problems are not images
    split: Annotated[Optional[int], arg(metavar="INT", help_behavior_hint="(default: 0)")] = None
    """UCI data sets (uci-NAME, uci:PATH): which of the fixed train/test splits, 0 to n_splits - 1."""
    # tables are trained with `pyrobnn train` (the same flags, hidden)
    target: Suppress[Annotated[Optional[str], arg(name="data.target")]] = None
    task: Suppress[Annotated[Literal[TASKS], arg(name="data.task")]] = "auto"  # type: ignore[valid-type]
    features: Suppress[Annotated[tuple[str, ...], arg(name="data.features")]] = ()
    categorical: Suppress[Annotated[tuple[str, ...], arg(name="data.categorical")]] = ()
    folds: Suppress[Annotated[Optional[int], arg(name="data.folds")]] = None
    test_fraction: Suppress[Annotated[Optional[float], arg(name="data.test-fraction")]] = None
    split_seed: Suppress[Annotated[Optional[int], arg(name="data.seed")]] = None


@dataclass
class MCMCModelOptions(ModelOptions):
    """The network and which of its parameters are Bayesian (sampled by NUTS; the others stay at their seeded initial
    values)."""

    name: Annotated[str, arg(name="model", metavar="{" + ",".join(MCMC_MODELS) + "}")] = "mlp"
    """Network: a multilayer perceptron, small enough for NUTS."""
    hidden: tuple[int, ...] = (16,)
    """Hidden widths of the mlp, e.g. 16 16."""
    dropout: Suppress[float] = 0.0  # the potential energy must be deterministic in the weights
    init_from: Suppress[Optional[Path]] = None  # NUTS samples the weights; it starts from the seeded initial values
    lora_rank: Suppress[int] = _default(LoRA, "r")  # pretrained networks are fine-tuned with `pyrobnn train`
    lora_alpha: Suppress[float] = _default(LoRA, "alpha")
    lora_targets: Suppress[tuple[str, ...]] = _default(LoRA, "targets")


@dataclass
class MCMCLikelihoodOptions(LikelihoodOptions):
    """The observation model p(y | x, w) (pyrobnn.model.likelihoods), held fixed while NUTS samples the weights."""

    scale: float = 0.1
    """gaussian: noise standard deviation."""
    learn_scale: Suppress[bool] = _default(Gaussian, "learn_scale")  # NUTS samples the weights only
    vdp_objective: Suppress[_choices(Categorical.VDP_OBJECTIVES)] = cli_spelling(_default(Categorical, "vdp_objective"))


@dataclass
class MCMCPriorOptions(PriorOptions):
    """The weight prior p(w) whose posterior NUTS samples (a proper density on every weight)."""

    mode: Suppress[_choices(NodePrior.MODES)] = _default(NodePrior, "mode")  # node priors are refused by mcmc
    bias: Suppress[bool] = _default(NodePrior, "bias")


@dataclass
class MCMCOptions:
    """No-U-Turn sampling of the exact posterior (pyrobnn.infer.mcmc, Hoffman & Gelman 2014)."""

    num_samples: Annotated[int, _flat()] = _default(NUTS, "num_samples")
    """Draws kept per chain, after the warm-up."""
    warmup: Annotated[int, _flat()] = _default(NUTS, "warmup")
    """Warm-up steps per chain, which adapt the step size and a diagonal mass matrix and are discarded."""
    num_chains: Annotated[int, _flat()] = _default(NUTS, "num_chains")
    ("Chains, from the seeded initial weights plus --init-jitter noise (the batched sampler runs them all in one "
     "pass, so more cost little); split R-hat compares 2 or more.")
    target_accept: Annotated[float, _flat()] = _default(NUTS, "target_accept")
    """Acceptance probability the step-size adaptation aims for, in (0, 1); raise it when transitions diverge."""
    max_tree_depth: Annotated[int, _flat()] = _default(NUTS, "max_tree_depth")
    """Largest NUTS tree depth: at most 2^depth - 1 leapfrog steps per draw."""
    init_jitter: Annotated[float, _flat()] = _default(NUTS, "init_jitter")
    """Standard deviation of the Gaussian noise added to the initial weights of each chain."""
    map_steps: Annotated[int, _flat()] = _default(NUTS, "map_steps")
    ("Full-batch Adam steps (lr 0.01) on the log posterior before sampling: the chains start at its MAP estimate, "
     "inside one basin; 0 starts them at the seeded initial weights.")
    sampler: Annotated[_choices(SAMPLERS), _flat()] = _default(NUTS, "sampler")
    ("batched: every chain in one pass of the network per leapfrog step; pyro: Pyro's NUTS, one chain after the "
     "other; auto: batched when the network can run it.")
    compile: Annotated[_choices(COMPILE_MODES), _flat()] = _default(NUTS.train, "compile")
    ("How a leapfrog step runs (the network's forward and backward pass and the sampler's bookkeeping): none "
     "(eagerly), trace (one graph, recorded at once), inductor (fused kernels, seconds to build, several times "
     "faster), auto (trace, then inductor once the run is long enough). With --sampler pyro: trace records the "
     "potential energy (the PyTorch JIT), auto and none run it eagerly.")
    grid: Annotated[tuple[str, ...], _flat(metavar="{tau=V1,V2,...,protocol}")] = ()
    ("Choose the Gaussian noise precision tau (in the target's original units: likelihood.scale = 1 / (sqrt(tau) "
     "y_std)) on an 80/20 split of the training set, the test set unseen: a short NUTS run (--grid-samples) on 80 "
     "% per value, scored by the held-out log-likelihood of its predictive mixture; protocol: the UCI data set's "
     "tau_values.txt. diagnostics.json's selection has every point.")
    grid_samples: Annotated[int, _flat()] = 200
    """--grid: warm-up steps and draws per chain of each short run on the 80 % split."""


@dataclass
class MCMCOutputOptions:
    """Where the draws are written, the seed, and how the run is reported."""

    out: Annotated[Path, arg(metavar="DIR")] = Path("runs/mcmc")
    ("Output directory: draws.pt, diagnostics.json, and boundary.png (classification) or predictive.png (regression).")
    seed: int = 0
    """Random seed: the generated data, the initial weights and the chains."""
    progress: bool = True
    """Show a progress bar per chain."""


@dataclass
class MCMCConfig(_Config):
    """Sample the posterior of a small Bayesian network on a toy problem or a UCI regression data set with NUTS
    (full batch); write draws.pt, diagnostics.json and (toy problems) a plot to --out."""

    data: OmitArgPrefixes[ToyDataOptions] = field(default_factory=ToyDataOptions)
    model: OmitArgPrefixes[MCMCModelOptions] = field(default_factory=MCMCModelOptions)
    prior: MCMCPriorOptions = field(default_factory=MCMCPriorOptions)
    likelihood: MCMCLikelihoodOptions = field(default_factory=MCMCLikelihoodOptions)
    mcmc: MCMCOptions = field(default_factory=MCMCOptions)
    calibration: OmitArgPrefixes[CalibrationOptions] = field(default_factory=CalibrationOptions)
    output: OmitArgPrefixes[MCMCOutputOptions] = field(default_factory=MCMCOutputOptions)


def _is_path(annotation) -> bool:
    return annotation is Path or Path in typing.get_args(annotation)


def _from_dict(cls, values: dict, prefix: str):
    fields = {f.name: f for f in dataclasses.fields(cls)}
    types = typing.get_type_hints(cls)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(prefix + k for k in unknown)} in the run configuration "
                         "(written by another pyrobnn version?)")
    kwargs = {}
    for name, value in values.items():
        default = getattr(cls(), name)
        if dataclasses.is_dataclass(default):
            if not isinstance(value, dict):
                raise ValueError(f"option group {prefix}{name} of the run configuration must be a dict")
            kwargs[name] = _from_dict(type(default), value, f"{prefix}{name}.")
        elif _is_path(types[name]):
            kwargs[name] = None if value is None else Path(value)
        elif isinstance(default, tuple):
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = cli_spelling(value)
    return cls(**kwargs)


def flag(group: str, field_name: str, prefixed: bool) -> str:
    if field_name == "name":
        return "--" + group.replace("_", "-")
    name = field_name.replace("_", "-")
    return f"--{group}.{name}" if prefixed else f"--{name}"


@functools.lru_cache(maxsize=None)
def _named_flags(cls: type) -> dict[str, str]:
    """``{field name: flag}`` of the fields of ``cls`` whose flag tyro takes from their ``arg(name=...)`` (the data
    group's ``--data.target``, ...), other than a group's ``name`` field."""
    hints = typing.get_type_hints(cls, include_extras=True)
    found = {}
    for f in dataclasses.fields(cls):
        names = [getattr(meta, "name", None) for meta in getattr(hints[f.name], "__metadata__", ())]
        named = [name for name in names if isinstance(name, str)]
        if named and f.name != "name":
            found[f.name] = "--" + named[-1]
    return found


def _fields(options, group: str = ""):
    """``(flag, option group, field name)`` triples; groups with a ``name`` field other than the model (a choice
    with its own options: prior, guide, likelihood, beta) prefix their options' flags with the group; a field named
    by its ``arg(name=...)`` has that flag."""
    names = [f.name for f in dataclasses.fields(options)]
    prefixed = "name" in names and not isinstance(options, ModelOptions)
    named = _named_flags(type(options))
    for name in names:
        value = getattr(options, name)
        if dataclasses.is_dataclass(value):
            yield from _fields(value, name)
        else:
            yield named.get(name) or flag(group, name, prefixed), options, name
