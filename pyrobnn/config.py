"""A run described by plain data: which dataset, network, prior, guide and schedule.

:class:`RunConfig` is what ``pyrobnn train`` parses (every field documented in
``--help``) and what a checkpoint stores, so ``pyrobnn evaluate`` rebuilds the
same model and guide from the checkpoint alone. :func:`build` turns a config
and a dataset into ``(model, guide)``; :func:`beta_schedule` gives its β.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

from .guides import GUIDES
from .priors import LogUniformPrior
from .likelihoods import Categorical, Gaussian, HeteroscedasticGaussian
from .model import BayesianNetwork
from .models import build_model
from .priors import GaussianPrior, ScaleMixturePrior
from .schedules import Constant, Geometric, LinearWarmup

__all__ = ["RunConfig", "build", "beta_schedule", "PRIORS"]

PRIORS = ("gaussian", "scale-mixture", "log-uniform")


@dataclass
class RunConfig:
    """Train a Bayesian neural network with SVI on the annealed ELBO."""

    dataset: str = "mnist"
    """mnist | fashion-mnist | cifar10 | two-moons | cubic | sinusoid | folder:<path> (ImageFolder train/ and test/)."""
    data_root: Optional[Path] = None
    """Data directory (else $PYROBNN_DATA, else ~/.cache/pyrobnn/data)."""
    train_size: Optional[int] = None
    """Use a random subset of this many training examples (default: all)."""
    test_size: Optional[int] = None
    """Use a random subset of this many test examples (default: all)."""
    val_size: int = 0
    """Hold out this many training examples for validation after each epoch (0: none)."""
    model: str = "mlp"
    """mlp | lenet300-100 | lenet5 | tv:<torchvision model name> (e.g. tv:resnet18)."""
    hidden: tuple[int, ...] = (400,)
    """Hidden widths of the mlp (e.g. 400, or 1200 1200)."""
    dropout: float = 0.0
    """Dropout rate after each hidden mlp layer (0: none)."""
    bayesian: str = "all"
    """Which parameters are Bayesian: all (BatchNorm/LayerNorm stay deterministic), last-layer,
    none (maximum-likelihood baseline), or comma-separated glob patterns over parameter names."""
    prior: Literal["gaussian", "scale-mixture", "log-uniform"] = "gaussian"
    """Weight prior: gaussian N(0, prior-scale^2), Blundell's scale-mixture, or the log-uniform prior of
    variational dropout (use it with the additive or multiplicative guide)."""
    prior_scale: float = 1.0
    """Standard deviation of the gaussian prior."""
    pi: float = 0.25
    """Scale-mixture weight of the wide component, in (0, 1)."""
    sigma1: float = 1.0
    """Scale-mixture standard deviation of the wide component."""
    sigma2: float = 0.00033546262790251185
    """Scale-mixture standard deviation of the narrow component (default e^-8)."""
    guide: Literal["normal", "additive", "multiplicative"] = "normal"
    """Posterior family: normal (diagonal Normal: Bayes by Backprop, or variational dense with
    --parameterization log_variance), additive (sparse variational dropout, Molchanov 2017),
    multiplicative (variational dropout, Kingma 2015)."""
    parameterization: Literal["softplus", "log_variance"] = "softplus"
    """normal guide: sigma = softplus(rho) (Blundell) or exp(log_variance / 2) (Graves)."""
    init_rho: float = -5.0
    """Initial rho of the normal guide: sigma0 = softplus(rho) (-5 gives 6.7e-3)."""
    init_log_sigma2: float = -10.0
    """additive guide: initial log sigma^2 of every weight."""
    init_log_alpha: float = -4.0
    """multiplicative guide: initial log alpha."""
    share: Literal["weight", "row", "layer"] = "weight"
    """normal guide: one sigma, multiplicative guide: one log alpha, per weight, per output unit (row; the
    per-unit variance of VDP++, paper 002 eq. 12) or per layer."""
    likelihood: Literal["auto", "categorical", "gaussian", "heteroscedastic"] = "auto"
    """Observation model; auto: categorical for classification, gaussian for regression."""
    noise_scale: float = 0.1
    """Noise standard deviation of the gaussian likelihood (its initial value if learned)."""
    learn_noise: bool = False
    """Learn the gaussian noise standard deviation as a point estimate."""
    beta: Literal["constant", "linear", "geometric"] = "geometric"
    """KL-weight schedule: constant, linear (warm-up then ramp, by epoch), geometric (Blundell 2015)."""
    beta_value: float = 1.0
    """beta for constant; final beta for linear."""
    warmup: int = 0
    """linear: epochs with beta = 0."""
    anneal: int = 0
    """linear: epochs of the ramp from 0 to beta-value after the warm-up."""
    epochs: int = 10
    """Passes over the training data."""
    batch_size: int = 128
    """Minibatch size B (the likelihood is scaled by N/B)."""
    lr: float = 1e-3
    """Learning rate."""
    optimizer: Literal["adam", "sgd"] = "adam"
    """Optimizer (sgd uses momentum 0.9)."""
    lr_step: int = 0
    """Multiply lr by lr-gamma every lr-step epochs (0: constant)."""
    lr_gamma: float = 0.5
    """Learning-rate decay factor."""
    particles: int = 1
    """Posterior samples per training step (num_particles), drawn in one batched pass."""
    estimator: Literal["sample", "local", "flipout", "vdp"] = "sample"
    """Gradient estimator: sample (weights), local (local reparameterization), flipout,
    vdp (VDP++ moment propagation: deterministic training and prediction)."""
    samples: int = 100
    """Monte-Carlo samples for test predictions."""
    seed: int = 0
    """Random seed (weights, noise, data order, subsets)."""
    device: str = "auto"
    """auto | cpu | cuda."""
    out: Path = Path("runs/latest")
    """Output directory: checkpoint.pt, metrics.json, reliability.png."""
    resume: bool = False
    """Continue from <out>/checkpoint.pt if it exists."""
    progress: bool = True
    """Show the rich progress bar."""

    def to_dict(self) -> dict:
        return {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, values: dict) -> "RunConfig":
        known = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in values.items() if k in known}
        for key in ("data_root", "out"):
            if kwargs.get(key) is not None:
                kwargs[key] = Path(kwargs[key])
        if "hidden" in kwargs:
            kwargs["hidden"] = tuple(kwargs["hidden"])
        return cls(**kwargs)


def _prior(cfg: RunConfig):
    if cfg.prior == "gaussian":
        return GaussianPrior(0.0, cfg.prior_scale)
    if cfg.prior == "scale-mixture":
        return ScaleMixturePrior(cfg.pi, cfg.sigma1, cfg.sigma2)
    if cfg.prior == "log-uniform":
        return LogUniformPrior()
    raise ValueError(f"prior must be one of {PRIORS}, got {cfg.prior!r}")


def _likelihood(cfg: RunConfig, task: str):
    kind = cfg.likelihood
    if kind == "auto":
        kind = "categorical" if task == "classification" else "gaussian"
    if kind == "categorical":
        if task != "classification":
            raise ValueError(f"likelihood 'categorical' needs a classification dataset, {cfg.dataset!r} is {task}")
        return Categorical()
    if task != "regression":
        raise ValueError(f"likelihood {kind!r} needs a regression dataset, {cfg.dataset!r} is {task}")
    if kind == "gaussian":
        return Gaussian(cfg.noise_scale, learn_scale=cfg.learn_noise)
    if kind == "heteroscedastic":
        return HeteroscedasticGaussian()
    raise ValueError(f"likelihood must be auto, categorical, gaussian or heteroscedastic, got {kind!r}")


def _selection(cfg: RunConfig, net):
    from .conversion import last_layer

    if cfg.bayesian == "all":
        return None
    if cfg.bayesian == "last-layer":
        return last_layer(net)
    return [pattern.strip() for pattern in cfg.bayesian.split(",") if pattern.strip()]


def build(cfg: RunConfig, data) -> tuple[BayesianNetwork, object]:
    """The model and guide of a run, for a dataset (:class:`~pyrobnn.data.DataSplits`)."""
    if cfg.guide not in GUIDES:
        raise ValueError(f"guide: unknown guide {cfg.guide!r}; choose one of {sorted(GUIDES)}")
    likelihood = _likelihood(cfg, data.task)
    outputs = data.num_outputs * (2 if isinstance(likelihood, HeteroscedasticGaussian) else 1)
    net = build_model(cfg.model, data.input_shape, outputs, hidden=cfg.hidden, dropout=cfg.dropout)
    deterministic = cfg.bayesian == "none"
    model = BayesianNetwork(
        net, likelihood, prior=_prior(cfg), num_data=len(data.x_train), include=_selection(cfg, net),
        deterministic=deterministic, input_shape=data.input_shape,
    )
    return model, _guide(cfg, model)


def _guide(cfg: RunConfig, model):
    if cfg.guide == "normal":
        return GUIDES["normal"](model, init_rho=cfg.init_rho, parameterization=cfg.parameterization,
                                 share=cfg.share)
    if cfg.guide == "additive":
        return GUIDES["additive"](model, init_log_sigma2=cfg.init_log_sigma2)
    return GUIDES["multiplicative"](model, init_log_alpha=cfg.init_log_alpha, share=cfg.share)


def beta_schedule(cfg: RunConfig):
    """The β schedule named by ``cfg.beta``."""
    if cfg.beta == "constant":
        return Constant(cfg.beta_value)
    if cfg.beta == "linear":
        return LinearWarmup(cfg.warmup, cfg.anneal, cfg.beta_value)
    if cfg.beta == "geometric":
        return Geometric()
    raise ValueError(f"beta must be constant, linear or geometric, got {cfg.beta!r}")
