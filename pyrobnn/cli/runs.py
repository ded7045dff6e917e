"""Run persistence: a run's data, its test report (through its posterior: :class:`~pyrobnn.methods.Posterior`),
loading a checkpoint's posterior (:func:`load_run`, through :func:`~pyrobnn.methods.load_posterior`), checking a
resume."""

from __future__ import annotations

import dataclasses
import math
import warnings
from pathlib import Path
from typing import Optional

import pyro
import torch

from pyrobnn.analysis.calibration import Calibrator, minimum_rows
from pyrobnn.analysis.evaluate import monte_carlo_error
from pyrobnn.analysis.metrics import classification_report, ood_metrics, reliability_diagram
from pyrobnn.analysis.shift import evaluate_corruptions
from pyrobnn.checkpoint import load_checkpoint
from pyrobnn.checks import one_line, positive
from pyrobnn.cli.build import Run, build_network, dataset_options, method_of, network_spec_of
from pyrobnn.cli.options import RESUMABLE, MCMCConfig, RunConfig
from pyrobnn.cli.report import metrics_table, say, shown
from pyrobnn.data import canonical_name, load_dataset
from pyrobnn.data.augment import NORMALIZATION, ImageAugment
from pyrobnn.data.corruptions import SEVERITIES
from pyrobnn.data.text import TextSplits, shifted_splits
from pyrobnn.device import device_of, resolve_device
from pyrobnn.infer.mcmc import MCMCResult
from pyrobnn.infer.predict import LEAST_DRAWS, sized_draws
from pyrobnn.methods import DRAWS_KINDS, load_posterior

__all__ = [
           "seed_of", "augmentation", "load_data", "CALIBRATION_SEED", "calibration_split", "load_ood", "test_report",
           "check_severities", "check_corruptible", "corrupted_report", "metrics_tables", "load_states", "is_draws",
           "stored_config", "check_resume", "load_run", "restore", "fit_options"]

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


def load_data(cfg, validation: bool = False):
    """The run's dataset (``validation``: its training set's 80/20 split as train and test, see
    :func:`~pyrobnn.data.load_dataset`); with ``--augment`` the training images stay uint8 (turned into
    normalised, augmented batches by :func:`augmentation`) and the validation and test images are normalised."""
    augment = cfg.data.augment
    data = load_dataset(cfg.data.dataset, cfg.data.data_root, train_size=cfg.data.train_size,
                        test_size=cfg.data.test_size, val_size=cfg.data.val_size, seed=seed_of(cfg),
                        dtype=torch.uint8 if augment else torch.float32, validation=validation,
                        **dataset_options(cfg), **text_options(cfg))
    aug = augmentation(cfg, data)
    if aug is None:
        return data
    normal = {k: None if v is None else aug.normalize(v) for k, v in (("x_val", data.x_val), ("x_test", data.x_test))}
    return dataclasses.replace(data, **normal)


def text_options(cfg) -> dict:
    """What a text dataset's loader takes from the run: ``--data.max-length`` and, for a pretrained network
    (``--model hf:...``), its own tokenizer (:meth:`~pyrobnn.networks.NetworkSpec.tokenizer`)."""
    options = {} if getattr(cfg.data, "max_length", None) is None else {"max_length": cfg.data.max_length}
    tokenizer = network_spec_of(cfg).tokenizer()
    if tokenizer is not None:
        options["tokenizer"] = tokenizer
    return options


TEXT_SHIFTS = {"imdb": "rotten-tomatoes", "rotten-tomatoes": "imdb"}
"""A text data set -> its shifted set (``--ood-dataset``; the same labels), tokenised by the run's tokenizer at its
length."""


CALIBRATION_SEED = 0
"""The seed of the rows ``--calibrate`` holds out: the same positions for every ``--seed`` and method, so the
methods of a study are calibrated on the same rows (those of its seed's training subset)."""


def calibration_split(cfg, data):
    """``(data, held_out)``: with ``--calibrate``, the run's data without the ``--calibrate.fraction`` of its
    training rows (``int(fraction N)``, at positions drawn with :data:`CALIBRATION_SEED`; the others keep their
    order) and those rows as ``(x, y)`` (images normalised as the test images under ``--augment``); without it,
    ``(data, None)``. Too few rows for a conformal threshold, or none left to train on, is a ``ValueError`` naming
    the options. The rows are held out of the loaded training set, after its standardisation: its statistics
    include them (they carry no label beyond a regression target's mean and scale)."""
    options = getattr(cfg, "calibration", None)
    if options is None or not options.calibrate:
        return data, None
    n = len(data.x_train)
    rows = int(options.fraction * n)
    needed = minimum_rows(options.coverage)
    if rows < needed or rows >= n:
        problem = (f"{rows} rows to calibrate on; conformal sets of coverage {options.coverage:g} need at least "
                   f"{needed}" if rows < needed else "no rows left to train on")
        raise ValueError(f"--calibrate.fraction {options.fraction:g} of {n} training rows leaves {problem}: pass a "
                         "larger --calibrate.fraction or --train-size, or drop --calibrate")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(CALIBRATION_SEED))
    held, kept = order[:rows].sort().values, order[rows:].sort().values
    x_held, y_held = data.x_train[held], data.y_train[held]
    aug = augmentation(cfg, data)
    if aug is not None:
        x_held = aug.normalize(x_held)
    return dataclasses.replace(data, x_train=data.x_train[kept], y_train=data.y_train[kept]), (x_held, y_held)


def fit_options(cfg: RunConfig) -> dict:
    """The arguments of :func:`~pyrobnn.infer.svi.fit` that the run's options set: the method's (batch size,
    optimiser, β schedule, objective: :meth:`~pyrobnn.methods.Method.fit_options`), and the run's epochs, seed and
    compilation (``--compile``)."""
    opt = cfg.optim
    return dict(epochs=opt.epochs, seed=opt.seed, compile=opt.compile,
                **method_of(cfg).fit_options(opt.epochs, opt.precision))


def load_ood(name: str, cfg, data):
    """The dataset ``name`` (``--ood-dataset``) as out-of-distribution inputs of the run ``cfg`` on ``data``: its
    test split (a seeded subset of ``--test-size`` examples when the run has one), normalised as the run's test
    images. Raises a ``ValueError`` naming ``--ood-dataset`` unless it is another dataset of the same input shape
    as the run's classification dataset (fashion-mnist for mnist)."""
    if data.task != "classification":
        raise ValueError(f"--ood-dataset needs a classification dataset; {cfg.data.dataset} is {data.task}")
    if isinstance(data, TextSplits) or name in TEXT_SHIFTS.values():
        if not isinstance(data, TextSplits) or TEXT_SHIFTS.get(data.name) != name:
            shifts = ", ".join(f"{shift} for {text}" for text, shift in TEXT_SHIFTS.items())
            raise ValueError(f"--ood-dataset {name}: a text run's shifted set is {shifts}, and it is no shift of "
                             f"{cfg.data.dataset}")
        return shifted_splits(name, data.tokenizer, data.input_shape[0], cfg.data.test_size, seed_of(cfg))
    if isinstance(name, str) and canonical_name(name) == data.name:
        raise ValueError(f"--ood-dataset {name} is the dataset the run is tested on: name another dataset of the "
                         "same input shape (e.g. fashion-mnist for mnist)")
    try:
        ood = load_dataset(name, cfg.data.data_root, train_size=1, test_size=cfg.data.test_size, seed=seed_of(cfg))
    except ValueError as error:
        raise ValueError(f"--ood-dataset {name}: {one_line(error)}") from None
    if ood.input_shape != data.input_shape:
        raise ValueError(f"--ood-dataset {name} has inputs of shape {ood.input_shape}, the network of "
                         f"{cfg.data.dataset} takes {data.input_shape}: name a dataset of the same shape (e.g. "
                         "fashion-mnist for mnist)")
    aug = augmentation(cfg, data)
    return ood if aug is None else dataclasses.replace(ood, x_test=aug.normalize(ood.x_test))


def gigabytes(value: Optional[float]) -> Optional[int]:
    """``--max-memory`` in GB as bytes (None: the default budget of :func:`pyrobnn.device.memory_budget`)."""
    return None if value is None else int(positive("--max-memory (GB)", value) * 1e9)


def test_report(posterior, data, seed: int, reliability: Optional[Path] = None, max_memory: Optional[int] = None,
                progress: bool = False, ood=None, held_out=None, coverage: float = 0.9,
                num_samples: Optional[int] = None) -> dict:
    """Test metrics of ``posterior``'s predictive (:meth:`~pyrobnn.methods.Posterior.predicted`, ``num_samples``
    draws: its own by default), drawn after ``pyro.set_rng_seed(seed)``; the reliability diagram of the same
    predictions goes to ``reliability`` (a PNG file) when given. Each pass holds at most ``max_memory`` bytes
    (:func:`~pyrobnn.infer.predict.predictive_outputs`). A classifier's report is
    :func:`~pyrobnn.analysis.metrics.classification_report` (with the reliability bins and the uncertainty split);
    with ``ood`` (:func:`load_ood`), whose test inputs are predicted after the test set, also ``"ood"``: the
    dataset's name and :func:`~pyrobnn.analysis.metrics.ood_metrics`. ``held_out`` (:func:`calibration_split`'s
    rows, predicted as the test set after the same seed) adds the calibrated metrics of a
    :class:`~pyrobnn.analysis.calibration.Calibrator` at ``coverage`` fitted on them. A regression's metrics are in
    the target's original units where the loader standardised it."""
    options = dict(num_samples=num_samples, max_memory=max_memory, progress=progress)
    calibrator = None
    if held_out is not None:
        pyro.set_rng_seed(seed)
        calibrator = Calibrator(coverage).fit(posterior.predicted(held_out[0], **options)[1], held_out[1])
    pyro.set_rng_seed(seed)
    if data.task != "classification":
        target_scale = None if data.y_std is None else (data.y_mean, data.y_std)
        return posterior.evaluate(data.x_test, data.y_test, target_scale=target_scale, calibration=calibrator,
                                  mc_error=True, **options)
    pred, mixture = posterior.predicted(data.x_test, **options)
    if reliability is not None:
        reliability_diagram(pred["probs"].cpu(), data.y_test, reliability,
                            title=f"{data.name}: {len(data.y_test)} test examples, "
                                  f"{num_samples or posterior.num_samples} samples")
    report = {**classification_report(pred, data.y_test), "mc_error": monte_carlo_error(mixture, data.y_test)}
    if calibrator is not None:
        report.update(calibrator.report(mixture, data.y_test))
    if ood is not None:
        shifted = posterior.predicted(ood.x_test, **options)[0]
        report["ood"] = {"dataset": ood.name, **ood_metrics(pred, shifted)}
        if ood.classes is not None and ood.classes == data.classes:  # the same labels: a shift, scored as the test
            report["ood"]["shifted"] = classification_report(shifted, ood.y_test)
    return report


def check_severities(severities) -> None:
    """Refuse a ``--corruptions`` severity outside 1..5."""
    for severity in severities:
        if severity not in SEVERITIES:
            raise ValueError(f"--corruptions takes severities 1 to 5, got {severity}")


def check_corruptible(cfg, data) -> None:
    """Refuse ``--corruptions`` on anything but an image classification dataset."""
    if data.task != "classification" or len(data.input_shape) != 3:
        raise ValueError(f"--corruptions needs an image classification dataset; {cfg.data.dataset} is not one")


def corrupted_report(posterior, cfg, data, severities, corruptions, num_samples: int, seed: int,
                     max_memory: Optional[int] = None, progress: bool = False) -> dict:
    """:func:`~pyrobnn.analysis.shift.evaluate_corruptions` of ``posterior`` on the test images (the images in
    [0, 1]: the normalisation of ``--augment`` is undone before corrupting and applied to every corrupted batch), drawn
    after ``pyro.set_rng_seed(seed)``."""
    check_corruptible(cfg, data)
    aug = augmentation(cfg, data)
    images = data.x_test if aug is None else aug.denormalize(data.x_test)
    pyro.set_rng_seed(seed)
    return evaluate_corruptions(posterior.model, posterior.guide, images, data.y_test, corruptions=corruptions,
                                severities=severities,
                                num_samples=num_samples, transform=None if aug is None else aug.normalize,
                                seed=seed, progress=progress, max_memory=max_memory)


def metrics_tables(title: str, row: str, metrics: dict, corrupted: Optional[dict] = None) -> list:
    """The rich tables of a test report: its scalar metrics in row ``row`` (and ``corrupted``, the mean over the
    corrupted test sets, in a second row), then its out-of-distribution metrics when it has them."""
    rows = {row: metrics}
    if metrics.get("mc_error"):  # from the spread over two halves of the draws
        rows["± Monte-Carlo error"] = metrics["mc_error"]
    if corrupted is not None:
        rows[f"{row}, corrupted"] = corrupted
    tables = [metrics_table(title, rows)]
    if "ood" in metrics:
        tables.append(metrics_table(f"out of distribution: {metrics['ood']['dataset']} (the positive class)",
                                    {row: metrics["ood"]}))
    return tables


def posterior_record(posterior) -> dict:
    """What a run records of its posterior beside its test metrics (metrics.json's ``posterior``): the numbers of
    the method's report (a temperature, a tuned prior precision, ...) and, for a Gaussian guide, its learned
    :math:`\sigma` (``sigma``: :meth:`~pyrobnn.guides.NormalGuide.scale_summary`); empty when there is neither."""
    found = {}
    for key, value in (posterior.report or {}).items():
        if isinstance(value, (list, tuple)) and len(value) == 1:  # one tuned scalar (a prior precision)
            value = value[0]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            found[key] = value
    summary = getattr(posterior.guide, "scale_summary", None)
    if summary is not None and getattr(posterior.guide, "site_names", None):
        found["sigma"] = summary()
    return found


def training_record(report: dict) -> dict:
    """The training set's fit as a run records it (metrics.json's ``training``): the last epoch's NLL per example
    (``nll``) and the predictive accuracy on training rows (``accuracy``, :func:`training_accuracy`), where the run
    has them."""
    history = report.get("history") or []
    found = {"nll": history[-1].get("nll")} if history and isinstance(history[-1], dict) else {}
    found["accuracy"] = report.get("train_accuracy")
    return {key: value for key, value in found.items() if isinstance(value, (int, float))}


TRAINING_ROWS = 1000
"""The training rows whose accuracy :func:`training_accuracy` checks against chance."""


def training_accuracy(posterior, data, transform=None, max_memory: Optional[int] = None, size: int = TRAINING_ROWS,
                      draws: int = 10) -> tuple[float, float]:
    """``posterior``'s predictive accuracy on ``size`` training examples drawn at random (seed 0, whatever the order
    of the rows: a data set stored class by class would put one class first) with ``draws`` posterior samples,
    rounded up to a multiple of a mixture guide's components, and the chance level there, the frequency of the
    majority class:
    a run at chance learned nothing."""
    rows = torch.randperm(len(data.x_train), generator=torch.Generator().manual_seed(0))[:size]
    x, y = data.x_train[rows], data.y_train[rows]
    if transform is not None:
        x = transform.normalize(x.to(device_of(posterior.guide, posterior.model)))
    components = getattr(posterior.guide, "num_components", 1)
    metrics = posterior.evaluate(x, y, num_samples=components * math.ceil(draws / components), max_memory=max_memory)
    return metrics["accuracy"], float(torch.bincount(y).max()) / len(y)


def report_draws(cfg: RunConfig, posterior, data, ood, held_out, seconds: float, max_memory=None) -> int:
    """The test report's draws: the posterior's own when ``--num-samples`` is given (the method was built with it),
    under VDP++'s moments or at most :data:`~pyrobnn.infer.predict.LEAST_DRAWS`; otherwise
    :func:`~pyrobnn.infer.predict.sized_draws` for a report of about ``seconds`` (the run so far) over every input it
    predicts (the test set, its corruptions, the out-of-distribution and held-out sets, the training rows of
    :func:`training_accuracy`), said on one line."""
    if cfg.output.num_samples is not None or posterior.moments or posterior.num_samples <= LEAST_DRAWS:
        return posterior.num_samples
    corrupted = len(cfg.output.corruptions) * len(cfg.output.corruption_types)
    rows = (len(data.x_test) * (1 + corrupted) + (0 if ood is None else len(ood.x_test))
            + (0 if held_out is None else len(held_out[0]))
            + (min(TRAINING_ROWS, len(data.x_train)) if data.task == "classification" else 0))
    chosen = sized_draws(posterior.model, posterior.guide, data.x_test, budget=seconds, most=posterior.num_samples,
                         rows=rows, max_memory=max_memory)
    say(f"test report: {chosen}")
    return chosen.num_samples


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
    """Whether a loaded checkpoint is a ``draws.pt`` (:data:`~pyrobnn.methods.DRAWS_KINDS`: NUTS, a deep ensemble,
    Laplace, SWAG, SG-MCMC, ...)."""
    return state.get("kind") in DRAWS_KINDS


def stored_config(path: Path, state: dict):
    """The checkpoint's :class:`RunConfig` (:class:`MCMCConfig` for a ``draws.pt``)."""
    if not state.get("config"):
        raise ValueError(f"checkpoint {path} stores no run configuration (it was not written by `pyrobnn train`)")
    try:
        return (MCMCConfig if state.get("kind") == MCMCResult.kind else RunConfig).from_dict(state["config"])
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


def load_run(checkpoint: Path, data_root: Optional[Path], device: str, test_size: Optional[int] = None,
             draws: bool = True):
    """``(state, run, data, posterior)`` of a checkpoint written by ``pyrobnn train`` (its ``checkpoint.pt`` or
    ``draws.pt``) or ``pyrobnn mcmc`` (its ``draws.pt``): the stored state, the run of its configuration (a
    :class:`~pyrobnn.cli.build.Run`; an :class:`~pyrobnn.cli.options.MCMCConfig` for NUTS draws), its dataset, and
    the posterior loaded by :func:`~pyrobnn.methods.load_posterior` on ``device`` into the model (and guide) built as
    the trained ones (``data_root`` and ``test_size`` override the trained run's when given); ``draws=False`` refuses
    a draws file."""
    state = load_checkpoint(checkpoint)
    if is_draws(state) and not draws:
        raise ValueError(f"checkpoint {checkpoint} holds {DRAWS_KINDS[state['kind']]}, not a variational "
                         "posterior's checkpoint.pt (evaluate it with `pyrobnn evaluate`)")
    cfg = stored_config(checkpoint, state)
    if data_root is not None:
        cfg.data.data_root = data_root
    if test_size is not None:
        cfg.data.test_size = test_size
    data = load_data(cfg)
    run = cfg if isinstance(cfg, MCMCConfig) else Run.of(cfg)
    if is_draws(state):
        model, guide = build_network(cfg, data), None
    else:
        model, guide = run.build(data)
    posterior = load_posterior(checkpoint, model, guide,  # a file that does not fit: one ValueError naming it
                               posterior=None if isinstance(run, MCMCConfig) else run.method.posterior)
    device = resolve_device(device)
    posterior.model.to(device)
    posterior.guide = posterior.guide.to(device)
    return state, run, data, posterior


def restore(checkpoint: Path, data_root: Optional[Path], device: str, test_size: Optional[int] = None,
            draws: bool = True):
    """Deprecated: :func:`load_run`, whose posterior holds the model and guide. ``(state, config, data, model,
    guide)``."""
    warnings.warn("pyrobnn.cli.runs.restore is deprecated: use load_run (state, run, data, posterior)",
                  DeprecationWarning, stacklevel=2)
    state, run, data, posterior = load_run(checkpoint, data_root, device, test_size, draws)
    return state, getattr(run, "config", run), data, posterior.model, posterior.guide
