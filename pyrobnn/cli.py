"""``pyrobnn`` command line (tyro): ``train`` a Bayesian network, ``evaluate`` or ``prune`` a checkpoint,
sample a small network's exact posterior with NUTS (``mcmc``).

    pyrobnn train --dataset mnist --train-size 5000 --epochs 3 --out runs/demo
    pyrobnn evaluate --checkpoint runs/demo/checkpoint.pt --json runs/demo/eval.json
    pyrobnn prune --checkpoint runs/demo/checkpoint.pt --method snr
    pyrobnn mcmc --dataset two-moons --hidden 16 --num-samples 500 --warmup 500 --num-chains 2 --out runs/nuts
    pyrobnn evaluate --checkpoint runs/nuts/draws.pt
    pyrobnn --version

Every run is validated (options, output directory, a resumed checkpoint) before anything
is trained or written; outputs are written atomically (:func:`pyrobnn.files.atomic_write`).
An error is one line ``error: ...`` on stderr and exit status 2; a diverged training run
exits with status 1 and keeps its last good checkpoint. The same ``--seed`` gives the same
numbers: it seeds the data subsets, the weight initialisation, training, and the
Monte-Carlo test report (for ``mcmc``: the generated data, the initial weights and the chains).

``pyrobnn mcmc`` writes ``draws.pt`` (:data:`MCMC_KIND` under ``"kind"``, the run's
:class:`~pyrobnn.config.MCMCConfig`, the model's ``state_dict`` and the draws
``{site: (chains, samples, ...)}``, loadable with the safe loader), ``diagnostics.json`` (R-hat,
ESS, divergences, step sizes, time, warnings, and the test metrics) and a plot:
``boundary.png`` (classification: mean probability and epistemic uncertainty over the input
plane) or ``predictive.png`` (regression: predictive mean, 95 % bands, training points).
``pyrobnn evaluate`` takes that ``draws.pt`` and evaluates the empirical posterior
(:class:`~pyrobnn.mcmc.PosteriorDraws`, every draw once) with the same metrics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional

import pyro
import torch
import tyro
from rich.console import Console
from rich.table import Table
from tyro.conf import arg

from . import __version__
from .analysis import prune as pruning
from .analysis.metrics import classification_metrics, reliability_diagram
from .analysis.prune import METHODS, apply_masks, principled_masks, record_sparsity, sparsity
from .analysis.shift import evaluate_corruptions, plot_metric_vs_severity
from .checkpoint import load_checkpoint, save_checkpoint
from .checks import positive_int
from .config import MCMC_MAX_WEIGHTS, RESUMABLE, MCMCConfig, RunConfig, beta_schedule, build, build_network
from .data import load_dataset
from .data.augment import NORMALIZATION, ImageAugment
from .data.corruptions import CIFAR10_C, CORRUPTIONS, SEVERITIES
from .device import resolve_device
from .files import atomic_write, check_writable, write_json
from .mcmc import MCMCResult, sample_posterior
from .predict import evaluate as evaluate_posterior
from .predict import predict, predict_moments
from .train import TrainingDiverged, fit

__all__ = ["main", "train", "evaluate", "prune", "mcmc", "Evaluate", "Prune", "epoch_line", "MCMC_KIND"]

MCMC_KIND = "mcmc"
"""The ``"kind"`` entry of a ``draws.pt`` written by ``pyrobnn mcmc``."""

console = Console()


def _say(text: str) -> None:
    """One line on stdout, never wrapped, no markup."""
    console.print(text, soft_wrap=True, markup=False, highlight=False)


def _one_line(text: str) -> str:
    """The message on one line, without colour codes or the shapes table Pyro appends to errors raised at a site."""
    return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(text).split("Trace Shapes:")[0]).split())


def _error(message: str) -> None:
    print(f"error: {_one_line(message)}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- what a person reads


def _num(value) -> str:
    """A readable number: 4 significant digits, no long exponents for tiny values."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return str(value)
    if not math.isfinite(value) or value == 0:
        return f"{value:g}"
    size = abs(value)
    if size < 1e-9:
        return "0"
    if size < 1e-3:
        return f"{value:.1e}"
    if size >= 1e5:
        return f"{value:.0f}"
    return f"{value:.4g}"


def _percent(value: float) -> str:
    return f"{100 * value:.1f} %"


_VAL_NAMES = {"accuracy": "acc"}
_PERCENT_METRICS = ("accuracy", "ece")


def epoch_line(record: dict, epochs: int) -> str:
    """The line printed after each epoch, from a :func:`~pyrobnn.train.fit` record, e.g.
    ``epoch 3/10  loss 0.2312/example  nll 0.1/example  kl 1234 nats  beta 1 (mean)  lr 0.001
    sparsity 45.1 % (net.0 40.2 %, net.2 60.3 %)  val acc 97.1 %  12.3 s``."""
    parts = [f"epoch {record.get('epoch', '?')}/{epochs}"]
    for key, template in (("loss", "loss {}/example"), ("nll", "nll {}/example"), ("kl", "kl {} nats"),
                          ("beta", "beta {} (mean)"), ("lr", "lr {}")):
        if key in record:
            parts.append(template.format(_num(record[key])))
    if "sparsity" in record:
        layers = record.get("layer_sparsity")
        detail = ""
        if isinstance(layers, dict) and layers:
            detail = " (" + ", ".join(f"{name.removesuffix('.weight')} {_percent(v)}"
                                      for name, v in layers.items()) + ")"
        parts.append(f"sparsity {_percent(record['sparsity'])}{detail}")
    for key, value in record.items():
        if key.startswith("val_"):
            metric = key[len("val_"):]
            shown = _percent(value) if metric in _PERCENT_METRICS else _num(value)
            parts.append(f"val {_VAL_NAMES.get(metric, metric)} {shown}")
    if "seconds" in record:
        parts.append(f"{record['seconds']:.1f} s")
    return "  ".join(parts)


def metrics_table(title: str, rows: dict[str, dict[str, float]]) -> Table:
    """A rich table with one row per run and one column per metric."""
    table = Table(title=title)
    columns = list(dict.fromkeys(k for metrics in rows.values() for k in metrics))
    table.add_column("run")
    for column in columns:
        table.add_column(column, justify="right")
    for name, metrics in rows.items():
        table.add_row(name, *(f"{metrics[c]:.4f}" if c in metrics else "" for c in columns))
    return table


# ---------------------------------------------------------------------- shared steps


def _seed(cfg) -> int:
    return cfg.output.seed if isinstance(cfg, MCMCConfig) else cfg.optim.seed


def _augmentation(cfg, data) -> Optional[ImageAugment]:
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


def _load_data(cfg):
    """The run's dataset; with ``--augment`` the training images stay uint8 (turned into normalised, augmented
    batches by :func:`_augmentation`) and the validation and test images are normalised."""
    augment = cfg.data.augment
    data = load_dataset(cfg.data.dataset, cfg.data.data_root, train_size=cfg.data.train_size,
                        test_size=cfg.data.test_size, val_size=cfg.data.val_size, seed=_seed(cfg),
                        dtype=torch.uint8 if augment else torch.float32)
    aug = _augmentation(cfg, data)
    if aug is None:
        return data
    normal = {k: None if v is None else aug.normalize(v) for k, v in (("x_val", data.x_val), ("x_test", data.x_test))}
    return dataclasses.replace(data, **normal)


def _test_report(model, guide, data, num_samples: int, seed: int, reliability: Optional[Path] = None,
                 moments: bool = False) -> dict[str, float]:
    """Test metrics of the posterior predictive, drawn after ``pyro.set_rng_seed(seed)``; the
    reliability diagram of the same predictions goes to ``reliability`` (a PNG file) when given."""


    pyro.set_rng_seed(seed)
    if data.task != "classification":
        return evaluate_posterior(model, guide, data.x_test, data.y_test, num_samples=num_samples, moments=moments)
    probs = (predict_moments(model, guide, data.x_test) if moments
             else predict(model, guide, data.x_test, num_samples=num_samples))["probs"]
    if reliability is not None:
        reliability_diagram(probs.cpu(), data.y_test, reliability,
                            title=f"{data.name}: {len(data.y_test)} test examples, {num_samples} samples")
    return classification_metrics(probs, data.y_test.to(probs.device))


def _load_states(path: Path, state: dict, model, guide) -> None:
    """Load the checkpoint's parameters; a checkpoint of another network is one ``ValueError``."""
    try:
        model.load_state_dict(state["model"])
        guide.load_state_dict(state["guide"])
    except (RuntimeError, KeyError, ValueError, TypeError) as error:
        detail = _one_line(error)
        raise ValueError(f"checkpoint {path} does not fit the model and guide built from its configuration "
                         f"(another network or sizes?): {detail[:300]}") from None


def _is_draws(state: dict) -> bool:
    """Whether a loaded checkpoint is the ``draws.pt`` of ``pyrobnn mcmc``."""
    return state.get("kind") == MCMC_KIND


def _stored_config(path: Path, state: dict):
    """The checkpoint's :class:`RunConfig` (:class:`MCMCConfig` for a ``draws.pt``)."""
    if not state.get("config"):
        raise ValueError(f"checkpoint {path} stores no run configuration (it was not written by `pyrobnn train`)")
    try:
        return (MCMCConfig if _is_draws(state) else RunConfig).from_dict(state["config"])
    except (ValueError, TypeError) as error:
        raise ValueError(f"checkpoint {path}: {error}") from None


def _shown(value) -> str:
    """An option's value as it is typed on the command line."""
    if isinstance(value, (tuple, list)):
        return " ".join(map(str, value))
    return "(none)" if value is None else str(value)


def _check_resume(cfg: RunConfig, path: Path, state: dict) -> None:
    """Refuse to continue a checkpoint with options other than :data:`~pyrobnn.config.RESUMABLE`."""
    trained = _stored_config(path, state).flags()
    given = cfg.flags()
    differ = [f"{flag} {_shown(given[flag])} (checkpoint: {_shown(trained.get(flag))})" for flag in given
              if flag not in RESUMABLE and given[flag] != trained.get(flag)]
    if differ:
        raise ValueError(f"--resume: {path} was trained with other options: {'; '.join(differ)}. Resume with the "
                         f"checkpoint's values, or train into another --out")


def _principled_rule_applies(guide) -> bool:

    if not getattr(guide, "pruning_rule", None):
        return False
    try:
        principled_masks(guide)
    except (TypeError, ValueError, NotImplementedError):  # no weights, or no rule for this posterior
        return False
    return True


# ---------------------------------------------------------------------- train


def train(cfg: RunConfig) -> dict[str, float]:
    """Train, evaluate on the test split, write ``checkpoint.pt``, ``metrics.json``, ``reliability.png``.

    Everything that can be checked without training is checked before anything is written:
    the options, ``--out``, the device and, with ``--resume``, the checkpoint and its options.
    """


    cfg.check()
    out = Path(cfg.output.out)
    check_writable(out, "--out", directory=True)
    device = resolve_device(cfg.optim.device)
    checkpoint = out / "checkpoint.pt"
    resumed = None
    if cfg.output.resume and checkpoint.exists():
        resumed = load_checkpoint(checkpoint)
        _check_resume(cfg, checkpoint, resumed)
    schedule = beta_schedule(cfg)
    data = _load_data(cfg)
    pyro.set_rng_seed(cfg.optim.seed)  # weight initialisation
    model, guide = build(cfg, data)
    if resumed is not None:
        _load_states(checkpoint, resumed, model, guide)
    val = (data.x_val, data.y_val) if data.x_val is not None else None
    _say(f"pyrobnn {cfg.data.dataset}: {len(data.x_train)} train / {len(data.x_test)} test, model {cfg.model.name}, "
         f"{len(model.sites())} Bayesian tensors, guide {cfg.guide.name}, prior {cfg.prior.name}, "
         f"beta {cfg.optim.beta.name}, estimator {cfg.optim.estimator}, device {device}")
    callbacks = [record_sparsity(guide)] if _principled_rule_applies(guide) else []
    callbacks.append(lambda epoch, record: _say(epoch_line(record, cfg.optim.epochs)))
    opt = cfg.optim
    history = fit(
        model, guide, data.x_train, data.y_train, epochs=opt.epochs, batch_size=opt.batch_size, lr=opt.lr,
        optimizer=opt.optimizer, weight_decay=opt.weight_decay, lr_step=opt.lr_step, lr_gamma=opt.lr_gamma,
        beta=schedule, num_particles=opt.num_particles, estimator=opt.estimator, val=val, seed=opt.seed,
        device=device, checkpoint=checkpoint, resume=cfg.output.resume, config=cfg.to_dict(),
        progress=cfg.output.progress, on_epoch_end=callbacks, transform=_augmentation(cfg, data),
        precision=opt.precision,
    )
    classification = data.task == "classification"
    metrics = _test_report(model, guide, data, cfg.output.num_samples, opt.seed,
                           out / "reliability.png" if classification else None, moments=opt.estimator == "vdp")
    write_json(out / "metrics.json", {"test": metrics, "history": history.epochs, "config": cfg.to_dict()})
    console.print(metrics_table(f"test metrics ({cfg.output.num_samples} samples)", {cfg.guide.name: metrics}))
    _say(f"wrote {out}/checkpoint.pt, metrics.json" + (", reliability.png" if classification else ""))
    return metrics


# ---------------------------------------------------------------------- evaluate


@dataclass
class Evaluate:
    """Evaluate a checkpoint written by `pyrobnn train` (or the draws.pt of `pyrobnn mcmc`) on its dataset's test split."""

    checkpoint: Annotated[Path, arg(metavar="FILE")]
    """The checkpoint.pt (or draws.pt) to evaluate."""
    num_samples: int = 100
    """Monte-Carlo samples of the posterior predictive (the draws.pt of pyrobnn mcmc: each of its draws once)."""
    seed: int = 0
    """Seed of the Monte-Carlo samples."""
    data_root: Annotated[Optional[Path], arg(metavar="PATH", help_behavior_hint="(default: as trained)")] = None
    """Directory holding the datasets."""
    test_size: Annotated[Optional[int], arg(metavar="INT", help_behavior_hint="(default: as trained)")] = None
    """Evaluate on a seeded random subset of this many test examples."""
    json: Annotated[Optional[Path], arg(metavar="FILE", help_behavior_hint="(default: none)")] = None
    """Also write the metrics to this JSON file."""
    reliability: Annotated[Optional[Path], arg(metavar="FILE.png", help_behavior_hint="(default: none)")] = None
    """Also draw the reliability diagram into this PNG file."""
    device: Annotated[str, arg(metavar="{auto,cpu,cuda,cuda:N}")] = "auto"
    """Where to evaluate (auto: cuda when available)."""
    corruptions: Annotated[tuple[int, ...], arg(metavar="SEVERITY")] = ()
    """Also evaluate the test images corrupted at these severities (1-5), e.g. 3 or 1 2 3 4 5 (image datasets)."""
    corruption_types: Annotated[tuple[Literal[tuple(CORRUPTIONS)], ...],
                                arg(help_behavior_hint="(default: the 14 CIFAR-10-C types generated in code)")] = CIFAR10_C
    """Corruptions to apply."""
    corruption_plot: Annotated[Optional[Path], arg(metavar="FILE.png", help_behavior_hint="(default: none)")] = None
    """With --corruptions: also plot accuracy against severity into this PNG file."""


def _posterior_draws(path: Path, state: dict, model):
    """The empirical posterior (:class:`~pyrobnn.mcmc.PosteriorDraws`) of a ``draws.pt``, checked against
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
                         f"{_one_line(error)[:300]}") from None
    return MCMCResult(draws).posterior()


def _restore(checkpoint: Path, data_root: Optional[Path], device: str, test_size: Optional[int] = None,
             draws: bool = True):
    """The checkpoint's state and config, its dataset, and its model and guide with the trained values,
    on ``device`` (``data_root`` and ``test_size`` override the trained run's when given). The guide of a
    ``draws.pt`` of ``pyrobnn mcmc`` is its empirical posterior; ``draws=False`` refuses such a file."""
    state = load_checkpoint(checkpoint)
    if _is_draws(state) and not draws:
        raise ValueError(f"checkpoint {checkpoint} holds NUTS draws written by `pyrobnn mcmc`, not a variational "
                         "posterior from `pyrobnn train` (evaluate it with `pyrobnn evaluate`)")
    cfg = _stored_config(checkpoint, state)
    if data_root is not None:
        cfg.data.data_root = data_root
    if test_size is not None:
        cfg.data.test_size = test_size
    device = resolve_device(device)
    data = _load_data(cfg)
    if _is_draws(state):
        model = build_network(cfg, data)
        guide = _posterior_draws(checkpoint, state, model)
    else:
        model, guide = build(cfg, data)
        _load_states(checkpoint, state, model, guide)
    return state, cfg, data, model.to(device), guide.to(device)


def evaluate(args: Evaluate) -> dict[str, float]:
    """Rebuild model and guide from the checkpoint, print the test metrics table."""

    positive_int("--num-samples", args.num_samples)
    if args.test_size is not None:
        positive_int("--test-size", args.test_size)
    for severity in args.corruptions:
        if severity not in SEVERITIES:
            raise ValueError(f"--corruptions takes severities 1 to 5, got {severity}")
    if args.corruption_plot is not None and not args.corruptions:
        raise ValueError("--corruption-plot needs --corruptions SEVERITY ...")
    for flag, path in (("--json", args.json), ("--reliability", args.reliability),
                       ("--corruption-plot", args.corruption_plot)):
        if path is not None:
            check_writable(path, flag)
    state, cfg, data, model, guide = _restore(args.checkpoint, args.data_root, args.device, args.test_size)
    if args.reliability is not None and data.task != "classification":
        raise ValueError(f"--reliability needs a classification dataset; {cfg.data.dataset} is {data.task}")
    if args.corruptions and (data.task != "classification" or len(data.input_shape) != 3):
        raise ValueError(f"--corruptions needs an image classification dataset; {cfg.data.dataset} is not one")
    if _is_draws(state):  # the empirical posterior: every draw once, as `pyrobnn mcmc` reported it
        num_samples, moments, row = len(guide), False, "nuts"
        title = f"{args.checkpoint} (NUTS, {_draws_shape(state['draws'])})"
    else:
        num_samples, moments, row = args.num_samples, cfg.optim.estimator == "vdp", cfg.guide.name
        title = f"{args.checkpoint} (epoch {state['epoch'] + 1}, {num_samples} samples)"
    metrics = _test_report(model, guide, data, num_samples, args.seed, args.reliability, moments=moments)
    rows, shifted = {row: metrics}, None
    if args.corruptions:
        aug = _augmentation(cfg, data)
        images = data.x_test if aug is None else aug.denormalize(data.x_test)
        pyro.set_rng_seed(args.seed)
        shifted = evaluate_corruptions(model, guide, images, data.y_test, corruptions=args.corruption_types,
                                       severities=args.corruptions, num_samples=num_samples,
                                       transform=None if aug is None else aug.normalize, seed=args.seed)
        rows[f"{row}, corrupted"] = shifted["mean"]
        if args.corruption_plot is not None:
            plot_metric_vs_severity({row: shifted}, args.corruption_plot, title=f"{args.checkpoint}")
    console.print(metrics_table(title, rows))
    if args.json is not None:
        write_json(args.json, {"test": metrics, "checkpoint": str(args.checkpoint), "num_samples": num_samples,
                               "seed": args.seed, **({"corrupted": shifted} if shifted is not None else {})})
    return metrics


# ---------------------------------------------------------------------- prune


def _prune_methods():

    return ("principled", *METHODS, "random")


@dataclass
class Prune:
    """Prune the posterior of a checkpoint and compare test metrics before and after."""

    checkpoint: Annotated[Path, arg(metavar="FILE")]
    """The checkpoint.pt to prune."""
    method: Literal[_prune_methods()] = "principled"
    """principled: the guide's own rule (snr for normal, log-alpha for the dropout guides); snr: |mu|/sigma below --threshold (Graves 2011); log-alpha: log alpha above --threshold (Molchanov et al. 2017); magnitude: global L1 on |mu| to --fraction; random: the principled rule's per-layer sparsity at random positions."""
    threshold: Annotated[Optional[float], arg(metavar="FLOAT", help_behavior_hint="(default: 0.83 for snr, 3 for log-alpha)")] = None
    """Threshold of the snr or log-alpha rule."""
    fraction: float = 0.9
    """magnitude: fraction of all weights to remove, in [0, 1]."""
    num_samples: int = 100
    """Monte-Carlo samples of the posterior predictive."""
    seed: int = 0
    """Seed of random pruning and of the Monte-Carlo samples."""
    data_root: Annotated[Optional[Path], arg(metavar="PATH", help_behavior_hint="(default: as trained)")] = None
    """Directory holding the datasets."""
    out: Annotated[Optional[Path], arg(metavar="FILE", help_behavior_hint="(default: none)")] = None
    """Write the pruned checkpoint to this file."""
    json: Annotated[Optional[Path], arg(metavar="FILE", help_behavior_hint="(default: none)")] = None
    """Also write the metrics before and after and the sparsity to this JSON file."""
    device: Annotated[str, arg(metavar="{auto,cpu,cuda,cuda:N}")] = "auto"
    """Where to evaluate (auto: cuda when available)."""


def _masks(args: Prune, guide):

    if args.method == "magnitude":
        return pruning.magnitude_masks(guide, args.fraction)
    if args.method in pruning.METHODS:
        rule = pruning.METHODS[args.method]
        return rule(guide) if args.threshold is None else rule(guide, args.threshold)
    masks = pruning.principled_masks(guide, args.threshold)
    return pruning.random_masks(masks, args.seed) if args.method == "random" else masks


def prune(args: Prune) -> dict:
    """Prune a trained posterior; print metrics before and after and the per-layer sparsity."""

    positive_int("--num-samples", args.num_samples)
    for flag, path in (("--out", args.out), ("--json", args.json)):
        if path is not None:
            check_writable(path, flag)
    state, cfg, data, model, guide = _restore(args.checkpoint, args.data_root, args.device, draws=False)
    masks = _masks(args, guide)
    moments = cfg.optim.estimator == "vdp"
    before = _test_report(model, guide, data, args.num_samples, args.seed, moments=moments)
    apply_masks(guide, masks)
    after = _test_report(model, guide, data, args.num_samples, args.seed, moments=moments)
    removed = sparsity(masks)
    console.print(metrics_table(f"{args.checkpoint}: {args.method} pruning, {_percent(removed['total'])} "
                                "of weights removed", {"before": before, "after": after}))
    table = Table(title="sparsity per layer")
    table.add_column("site")
    table.add_column("removed %", justify="right")
    for name, value in removed.items():
        table.add_row(name, f"{100 * value:.1f}")
    console.print(table)
    result = {"before": before, "after": after, "sparsity": removed, "method": args.method, "seed": args.seed}
    if args.out is not None:
        state = {k: v for k, v in state.items() if k != "pyrobnn"}
        save_checkpoint(args.out, {**state, "guide": guide.state_dict()})
    if args.json is not None:
        write_json(args.json, result)
    return result


# ---------------------------------------------------------------------- mcmc


class SamplingFailed(RuntimeError):
    """NUTS stopped with an error (e.g. no finite potential energy at the initial weights)."""


def _draws_shape(draws: dict) -> str:
    chains, samples = next(iter(draws.values())).shape[:2]
    return f"{chains} chain{'s' if chains != 1 else ''} x {samples} draws"


def _json_safe(value):
    """``value`` with every non-finite float (an undefined R-hat) as ``None``: strict JSON has no inf or nan."""
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def diagnostics_table(title: str, diagnostics: dict) -> Table:
    """A rich table of the NUTS diagnostics of :func:`~pyrobnn.mcmc.sample_posterior`, one per row: the worst
    split R-hat and bulk ESS over all weights, divergences, each chain's adapted step size and acceptance rate,
    leapfrog steps per draw and seconds."""
    chains = diagnostics.get("chains", [])
    table = Table(title=title)
    table.add_column("diagnostic")
    table.add_column("value", justify="right")
    rows = (
        ("split R-hat, max (<= 1.05)", _num(diagnostics["r_hat_max"])),
        ("bulk ESS, min", _num(diagnostics["ess_min"])),
        ("divergences", f"{diagnostics['divergences']} ({_percent(diagnostics['divergence_rate'])})"),
        ("step size per chain", ", ".join(_num(c["step_size"]) for c in chains)),
        ("acceptance per chain", ", ".join(f"{c['accept_prob']:.2f}" for c in chains)),
        ("leapfrog steps per draw", _num(diagnostics["leapfrog_steps"])),
        ("seconds", f"{diagnostics['seconds']:.1f}"),
    )
    for name, value in rows:
        table.add_row(name, value)
    return table


def _figure(size):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _boundary_plot(model, posterior, data, path: Path, title: str) -> Path:
    """Mean predicted probability and epistemic uncertainty (mutual information) over a grid of the input
    plane, with the training points."""

    points = torch.cat([data.x_train, data.x_test])
    low, high = points.min(0).values - 0.5, points.max(0).values + 0.5
    n = 120
    xx, yy = torch.meshgrid(torch.linspace(low[0], high[0], n), torch.linspace(low[1], high[1], n), indexing="xy")
    pred = predict(model, posterior, torch.stack([xx.reshape(-1), yy.reshape(-1)], 1), num_samples=len(posterior))
    probs = pred["probs"].cpu()
    binary = probs.shape[-1] == 2
    shown = (probs[:, 1] if binary else probs.max(-1).values).reshape(n, n).numpy()
    epistemic = pred["epistemic"].cpu().reshape(n, n).numpy()
    xx, yy = xx.numpy(), yy.numpy()
    fig = _figure((11, 4.6))
    left, right = fig.subplots(1, 2, sharey=True)
    filled = left.contourf(xx, yy, shown, levels=[i / 20 for i in range(21)], cmap="RdBu_r")
    fig.colorbar(filled, ax=left, label="mean p(y = 1 | x)" if binary else "mean probability of the predicted class")
    if binary:
        left.contour(xx, yy, shown, levels=[0.5], colors="black", linewidths=1)
    filled = right.contourf(xx, yy, epistemic, levels=20, cmap="viridis")
    fig.colorbar(filled, ax=right, label="mutual information (nats)")
    x, y = data.x_train.cpu().numpy(), data.y_train.cpu().numpy()
    for ax, name in ((left, "posterior predictive probability"), (right, "epistemic uncertainty")):
        ax.scatter(x[:, 0], x[:, 1], c=y, cmap="RdBu_r", vmin=0, vmax=max(int(y.max()), 1), edgecolors="black",
                   linewidths=0.6, s=22)
        ax.set_title(name)
        ax.set_xlabel("x1")
    left.set_ylabel("x2")
    fig.suptitle(title)
    fig.tight_layout()
    return atomic_write(path, lambda f: fig.savefig(f, format="png"))


def _predictive_plot(model, posterior, data, path: Path, title: str) -> Path:
    """Predictive mean with 95 % bands (total, and epistemic only) over the inputs' range, with the
    training points (and the test points, faint)."""

    x_all = torch.cat([data.x_train, data.x_test])[:, 0]
    y_all = torch.cat([data.y_train, data.y_test])[:, 0]
    low, high = float(x_all.min()), float(x_all.max())
    pad = 0.05 * (high - low)
    grid = torch.linspace(low - pad, high + pad, 400)[:, None]
    pred = predict(model, posterior, grid, num_samples=len(posterior))
    mean, std, epistemic = (pred[key][:, 0].cpu().numpy() for key in ("mean", "std", "epistemic_std"))
    g = grid[:, 0].numpy()
    fig = _figure((8, 5))
    ax = fig.subplots()
    ax.fill_between(g, mean - 1.96 * std, mean + 1.96 * std, color="tab:blue", alpha=0.2,
                    label="95 % predictive (epistemic + noise)")
    ax.fill_between(g, mean - 1.96 * epistemic, mean + 1.96 * epistemic, color="tab:blue", alpha=0.35,
                    label="95 % epistemic")
    ax.plot(g, mean, color="tab:blue", linewidth=1.5, label="predictive mean")
    ax.scatter(data.x_test[:, 0].numpy(), data.y_test[:, 0].numpy(), s=4, color="gray", alpha=0.3, label="test points")
    ax.scatter(data.x_train[:, 0].numpy(), data.y_train[:, 0].numpy(), s=16, color="black", zorder=3,
               label="training points")
    y_low, y_high = float(y_all.min()), float(y_all.max())
    margin = 0.25 * (y_high - y_low)
    ax.set_ylim(y_low - margin, y_high + margin)
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.set_title(title)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    return atomic_write(path, lambda f: fig.savefig(f, format="png"))


def mcmc(cfg: MCMCConfig) -> dict:
    """Sample the posterior of a small network on a toy problem with NUTS; write ``draws.pt``,
    ``diagnostics.json`` and ``boundary.png`` (classification) or ``predictive.png`` (regression).

    The options, ``--out``, and the size of the network are checked before anything is written.
    """


    cfg.check()
    out = Path(cfg.output.out)
    check_writable(out, "--out", directory=True)
    seed, mc = cfg.output.seed, cfg.mcmc
    data = _load_data(cfg)
    pyro.set_rng_seed(seed)  # weight initialisation: the chains start there (plus --init-jitter)
    model = build_network(cfg, data)
    sites = model.sites()
    size = sum(math.prod(site.shape) for site in sites)
    if size > MCMC_MAX_WEIGHTS:
        raise ValueError(f"--hidden {_shown(cfg.model.hidden)}: the network has {size} Bayesian weights; pyrobnn mcmc "
                         f"samples at most {MCMC_MAX_WEIGHTS} (NUTS explores one dimension per weight): use narrower "
                         "--hidden layers, --bayesian last-layer, or `pyrobnn train`")
    classification = data.task == "classification"
    plot = out / ("boundary.png" if classification else "predictive.png")
    _say(f"pyrobnn mcmc {cfg.data.dataset}: {len(data.x_train)} train / {len(data.x_test)} test, model "
         f"{cfg.model.name} {_shown(cfg.model.hidden)}, {size} Bayesian weights in {len(sites)} tensors, prior "
         f"{cfg.prior.name}, NUTS {mc.num_chains} chain{'s' if mc.num_chains != 1 else ''} x ({mc.warmup} warm-up "
         f"+ {mc.num_samples} draws), seed {seed}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a small network's products gain nothing from intra-op threads, which only contend
    try:
        result = sample_posterior(model, data.x_train, data.y_train, num_samples=mc.num_samples, warmup=mc.warmup,
                                  num_chains=mc.num_chains, seed=seed, init_jitter=mc.init_jitter,
                                  target_accept=mc.target_accept, max_tree_depth=mc.max_tree_depth, jit=mc.jit,
                                  progress=cfg.output.progress)
    except RuntimeError as error:
        raise SamplingFailed(str(error)) from error
    finally:
        torch.set_num_threads(threads)
    posterior = result.posterior()
    diagnostics = result.diagnostics
    metrics = _test_report(model, posterior, data, len(posterior), seed)
    save_checkpoint(out / "draws.pt", {
        "kind": MCMC_KIND, "config": cfg.to_dict(), "model": model.state_dict(),
        "guide": {}, "epoch": None,  # keys every pyrobnn checkpoint has; NUTS has neither guide nor epochs
        "draws": {name: value.detach().cpu().contiguous() for name, value in result.draws.items()},
        "diagnostics": diagnostics, "test": metrics,
    })
    write_json(out / "diagnostics.json", _json_safe({"diagnostics": diagnostics, "test": metrics,
                                                     "config": cfg.to_dict()}))
    title = f"{cfg.data.dataset}: NUTS, {_draws_shape(result.draws)}, mlp {_shown(cfg.model.hidden)}"
    (_boundary_plot if classification else _predictive_plot)(model, posterior, data, plot, title)
    console.print(diagnostics_table(f"NUTS: {_draws_shape(result.draws)}, {size} weights",
                                    diagnostics))
    console.print(metrics_table(f"test metrics ({len(posterior)} draws)", {"nuts": metrics}))
    for warning in diagnostics.get("warnings", []):
        print(f"warning: {_one_line(warning)}", file=sys.stderr, flush=True)
    _say(f"wrote {out}/draws.pt, diagnostics.json, {plot.name}")
    return {"diagnostics": diagnostics, "test": metrics}


# ---------------------------------------------------------------------- entry point

_COMMANDS = {"train": (RunConfig, train), "evaluate": (Evaluate, evaluate), "prune": (Prune, prune),
             "mcmc": (MCMCConfig, mcmc)}
_DESCRIPTION = ("Bayesian neural networks on Pyro: train with SVI, evaluate and prune with calibrated uncertainty, "
                "sample small networks exactly with NUTS. "
                "`pyrobnn --version` prints the version.")


def _flatten_tyro_message(text: str) -> str:
    """tyro's boxed parse error as one line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("╭")]  # the title: repeated below
    return _one_line(re.sub(r"[╭╮╰╯│─]+", " ", "\n".join(lines)))


def _parse(argv: list[str]):
    """tyro's parse; when stderr is not a terminal, a parse error becomes one ``error:`` line."""

    def parse():
        return tyro.extras.subcommand_cli_from_dict({name: cls for name, (cls, _) in _COMMANDS.items()},
                                                    args=argv, prog="pyrobnn", description=_DESCRIPTION)

    if sys.stderr.isatty():
        return parse()
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            args = parse()
    except SystemExit as exit_:
        if exit_.code not in (0, None) and captured.getvalue().strip():
            _error(_flatten_tyro_message(captured.getvalue()))
            raise SystemExit(exit_.code) from None
        sys.stderr.write(captured.getvalue())
        raise
    except BaseException:
        sys.stderr.write(captured.getvalue())
        raise
    sys.stderr.write(captured.getvalue())  # warnings, if any
    return args


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point of the ``pyrobnn`` console script and ``python -m pyrobnn``."""

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--version"], ["-V"]):
        print(f"pyrobnn {__version__}")
        return
    args = _parse(argv)
    run = next(command for cls, command in _COMMANDS.values() if isinstance(args, cls))
    try:
        run(args)
    except TrainingDiverged as error:
        _error(f"training diverged: {error}")
        raise SystemExit(1) from None
    except SamplingFailed as error:
        _error(f"NUTS failed: {error}")
        raise SystemExit(1) from None
    except (ValueError, TypeError, OSError) as error:
        _error(str(error))
        raise SystemExit(2) from None
