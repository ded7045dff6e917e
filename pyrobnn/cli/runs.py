"""Run persistence: a run's data, its test report, restoring a checkpoint, checking a resume, NUTS draws files."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Optional

import pyro
import torch

from pyrobnn.analysis.evaluate import evaluate as evaluate_posterior
from pyrobnn.analysis.metrics import classification_metrics, reliability_diagram
from pyrobnn.checkpoint import load_checkpoint
from pyrobnn.checks import one_line, positive
from pyrobnn.cli.build import build, build_network
from pyrobnn.cli.options import RESUMABLE, MCMCConfig, RunConfig
from pyrobnn.cli.report import shown
from pyrobnn.data import load_dataset
from pyrobnn.data.augment import NORMALIZATION, ImageAugment
from pyrobnn.device import device_of, resolve_device
from pyrobnn.infer.mcmc import MCMCResult
from pyrobnn.infer.predict import predict, predict_moments

__all__ = ["MCMC_KIND", "seed_of", "augmentation", "load_data", "test_report", "load_states", "is_draws",
           "stored_config", "check_resume", "posterior_draws", "restore"]

MCMC_KIND = "mcmc"
"""The ``"kind"`` entry of a ``draws.pt`` written by ``pyrobnn mcmc``."""


def seed_of(cfg) -> int:
    return cfg.output.seed if isinstance(cfg, MCMCConfig) else cfg.optim.seed


def augmentation(cfg, data) -> Optional[ImageAugment]:
    """The per-batch transform of ``--augment`` (None without it): crop and flip for CIFAR-10, normalisation."""
    if not cfg.data.augment:
        return None
    if len(data.input_shape) != 3:
        raise ValueError(f"--augment applies to image datasets; {cfg.data.dataset} has inputs of shape "
                         f"{data.input_shape}")
    if data.name not in NORMALIZATION:
        raise ValueError(f"--augment knows the channel statistics of {list(NORMALIZATION)}, not of {data.name!r}")
    cifar = data.name == "cifar10"
    return ImageAugment.for_dataset(data.name, crop_padding=4 if cifar else 0, flip=cifar)


def load_data(cfg):
    """The run's dataset; with ``--augment`` the training images stay uint8 (turned into normalised, augmented
    batches by :func:`augmentation`) and the validation and test images are normalised."""
    augment = cfg.data.augment
    data = load_dataset(cfg.data.dataset, cfg.data.data_root, train_size=cfg.data.train_size,
                        test_size=cfg.data.test_size, val_size=cfg.data.val_size, seed=seed_of(cfg),
                        dtype=torch.uint8 if augment else torch.float32)
    aug = augmentation(cfg, data)
    if aug is None:
        return data
    normal = {k: None if v is None else aug.normalize(v) for k, v in (("x_val", data.x_val), ("x_test", data.x_test))}
    return dataclasses.replace(data, **normal)


def gigabytes(value: Optional[float]) -> Optional[int]:
    """``--max-memory`` in GB as bytes (None: the default budget of :func:`pyrobnn.device.memory_budget`)."""
    return None if value is None else int(positive("--max-memory (GB)", value) * 1e9)


def test_report(model, guide, data, num_samples: int, seed: int, reliability: Optional[Path] = None,
                moments: bool = False, max_memory: Optional[int] = None, progress: bool = False) -> dict[str, float]:
    """Test metrics of the posterior predictive, drawn after ``pyro.set_rng_seed(seed)``; the
    reliability diagram of the same predictions goes to ``reliability`` (a PNG file) when given. Each pass holds
    at most ``max_memory`` bytes (:func:`~pyrobnn.infer.predict.predictive_outputs`)."""
    pyro.set_rng_seed(seed)
    options = dict(num_samples=num_samples, max_memory=max_memory, progress=progress)
    if data.task != "classification":
        return evaluate_posterior(model, guide, data.x_test, data.y_test, moments=moments, **options)
    probs = (predict_moments(model, guide, data.x_test) if moments
             else predict(model, guide, data.x_test, **options))["probs"]
    if reliability is not None:
        reliability_diagram(probs.cpu(), data.y_test, reliability,
                            title=f"{data.name}: {len(data.y_test)} test examples, {num_samples} samples")
    return classification_metrics(probs, data.y_test.to(probs.device))


def training_accuracy(model, guide, data, transform=None, moments: bool = False,
                      max_memory: Optional[int] = None, size: int = 1000) -> tuple[float, float]:
    """The predictive accuracy on the first ``size`` training examples (10 posterior samples, rounded up to a
    multiple of a mixture guide's components) and the chance level there, the frequency of the majority class:
    a run at chance learned nothing."""
    x, y = data.x_train[:size], data.y_train[:size]
    if transform is not None:
        x = transform.normalize(x.to(device_of(guide, model)))
    samples = guide.num_components * math.ceil(10 / guide.num_components)
    metrics = evaluate_posterior(model, guide, x, y, num_samples=samples, moments=moments, max_memory=max_memory)
    return metrics["accuracy"], float(torch.bincount(y).max()) / len(y)


def load_states(path: Path, state: dict, model, guide) -> None:
    """Load the checkpoint's parameters; a checkpoint of another network is one ``ValueError``."""
    try:
        model.load_state_dict(state["model"])
        guide.load_state_dict(state["guide"])
    except (RuntimeError, KeyError, ValueError, TypeError) as error:
        detail = one_line(error)
        raise ValueError(f"checkpoint {path} does not fit the model and guide built from its configuration "
                         f"(another network or sizes?): {detail[:300]}") from None


def is_draws(state: dict) -> bool:
    """Whether a loaded checkpoint is the ``draws.pt`` of ``pyrobnn mcmc``."""
    return state.get("kind") == MCMC_KIND


def stored_config(path: Path, state: dict):
    """The checkpoint's :class:`RunConfig` (:class:`MCMCConfig` for a ``draws.pt``)."""
    if not state.get("config"):
        raise ValueError(f"checkpoint {path} stores no run configuration (it was not written by `pyrobnn train`)")
    try:
        return (MCMCConfig if is_draws(state) else RunConfig).from_dict(state["config"])
    except (ValueError, TypeError) as error:
        raise ValueError(f"checkpoint {path}: {error}") from None


def check_resume(cfg: RunConfig, path: Path, state: dict) -> None:
    """Refuse to continue a checkpoint with options other than :data:`~pyrobnn.cli.options.RESUMABLE`."""
    trained = stored_config(path, state).flags()
    given = cfg.flags()
    differ = [f"{flag} {shown(given[flag])} (checkpoint: {shown(trained.get(flag))})" for flag in given
              if flag not in RESUMABLE and given[flag] != trained.get(flag)]
    if differ:
        raise ValueError(f"--resume: {path} was trained with other options: {'; '.join(differ)}. Resume with the "
                         f"checkpoint's values, or train into another --out")


def posterior_draws(path: Path, state: dict, model):
    """The empirical posterior (:class:`~pyrobnn.infer.mcmc.PosteriorDraws`) of a ``draws.pt``, checked against
    the model built from its configuration, whose deterministic parameters it loads."""

    draws = state.get("draws")
    if (not isinstance(draws, dict) or not draws
            or not all(isinstance(v, torch.Tensor) and v.dim() >= 2 for v in draws.values())):
        raise ValueError(f"checkpoint {path} holds no draws {{site: tensor (chains, samples, ...)}} (it was not "
                         "written by `pyrobnn mcmc`)")
    sites = {site.name: tuple(site.shape) for site in model.sites()}
    stored = {name: tuple(value.shape[2:]) for name, value in draws.items()}
    if stored != sites or len({tuple(value.shape[:2]) for value in draws.values()}) != 1:
        raise ValueError(f"checkpoint {path}: its draws {stored} do not fit the model built from its configuration "
                         f"{sites} (another network or sizes?)")
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError, ValueError, TypeError) as error:
        raise ValueError(f"checkpoint {path} does not fit the model built from its configuration: "
                         f"{one_line(error)[:300]}") from None
    return MCMCResult(draws).posterior()


def restore(checkpoint: Path, data_root: Optional[Path], device: str, test_size: Optional[int] = None,
             draws: bool = True):
    """The checkpoint's state and config, its dataset, and its model and guide with the trained values,
    on ``device`` (``data_root`` and ``test_size`` override the trained run's when given). The guide of a
    ``draws.pt`` of ``pyrobnn mcmc`` is its empirical posterior; ``draws=False`` refuses such a file."""
    state = load_checkpoint(checkpoint)
    if is_draws(state) and not draws:
        raise ValueError(f"checkpoint {checkpoint} holds NUTS draws written by `pyrobnn mcmc`, not a variational "
                         "posterior from `pyrobnn train` (evaluate it with `pyrobnn evaluate`)")
    cfg = stored_config(checkpoint, state)
    if data_root is not None:
        cfg.data.data_root = data_root
    if test_size is not None:
        cfg.data.test_size = test_size
    device = resolve_device(device)
    data = load_data(cfg)
    if is_draws(state):
        model = build_network(cfg, data)
        guide = posterior_draws(checkpoint, state, model)
    else:
        model, guide = build(cfg, data)
        load_states(checkpoint, state, model, guide)
    return state, cfg, data, model.to(device), guide.to(device)
