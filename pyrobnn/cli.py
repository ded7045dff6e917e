"""``pyrobnn`` command line (tyro): ``train`` a Bayesian network, ``evaluate`` or ``prune`` a checkpoint.

    pyrobnn train --dataset mnist --train-size 5000 --epochs 3 --out runs/demo
    pyrobnn evaluate --checkpoint runs/demo/checkpoint.pt --json runs/demo/eval.json
    pyrobnn prune --checkpoint runs/demo/checkpoint.pt --method snr
    pyrobnn --version

Every run is validated (options, output directory, a resumed checkpoint) before anything
is trained or written; outputs are written atomically (:func:`pyrobnn.files.atomic_write`).
An error is one line ``error: ...`` on stderr and exit status 2; a diverged training run
exits with status 1 and keeps its last good checkpoint. The same ``--seed`` gives the same
numbers: it seeds the data subsets, the weight initialisation, training, and the
Monte-Carlo test report.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional

from rich.console import Console
from rich.table import Table
from tyro.conf import arg

from .checkpoint import load_checkpoint
from .config import RESUMABLE, RunConfig, beta_schedule, build
from .device import resolve_device
from .files import check_writable, write_json
from .train import TrainingDiverged, fit

__all__ = ["main", "train", "evaluate", "prune", "Evaluate", "Prune", "epoch_line"]

console = Console()


def _say(text: str) -> None:
    """One line on stdout, never wrapped, no markup."""
    console.print(text, soft_wrap=True, markup=False, highlight=False)


def _one_line(text: str) -> str:
    return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(text)).split())


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


def _load_data(cfg: RunConfig):
    from .data import load_dataset

    return load_dataset(cfg.data.dataset, cfg.data.data_root, train_size=cfg.data.train_size,
                        test_size=cfg.data.test_size, val_size=cfg.data.val_size, seed=cfg.optim.seed)


def _test_report(model, guide, data, num_samples: int, seed: int, reliability: Optional[Path] = None,
                 moments: bool = False) -> dict[str, float]:
    """Test metrics of the posterior predictive, drawn after ``pyro.set_rng_seed(seed)``; the
    reliability diagram of the same predictions goes to ``reliability`` (a PNG file) when given."""
    import pyro

    from .analysis.metrics import classification_metrics, reliability_diagram
    from .predict import evaluate as evaluate_posterior
    from .predict import predict, predict_moments

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


def _stored_config(path: Path, state: dict) -> RunConfig:
    if not state.get("config"):
        raise ValueError(f"checkpoint {path} stores no run configuration (it was not written by `pyrobnn train`)")
    try:
        return RunConfig.from_dict(state["config"])
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
    from .analysis.prune import principled_masks

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
    import pyro

    from .analysis.prune import record_sparsity

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
        progress=cfg.output.progress, on_epoch_end=callbacks,
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
    """Evaluate a checkpoint written by `pyrobnn train` on its dataset's test split."""

    checkpoint: Annotated[Path, arg(metavar="FILE")]
    """The checkpoint.pt to evaluate."""
    num_samples: int = 100
    """Monte-Carlo samples of the posterior predictive."""
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


def _restore(checkpoint: Path, data_root: Optional[Path], device: str, test_size: Optional[int] = None):
    """The checkpoint's state and config, its dataset, and its model and guide with the trained values,
    on ``device`` (``data_root`` and ``test_size`` override the trained run's when given)."""
    state = load_checkpoint(checkpoint)
    cfg = _stored_config(checkpoint, state)
    if data_root is not None:
        cfg.data.data_root = data_root
    if test_size is not None:
        cfg.data.test_size = test_size
    device = resolve_device(device)
    data = _load_data(cfg)
    model, guide = build(cfg, data)
    _load_states(checkpoint, state, model, guide)
    return state, cfg, data, model.to(device), guide.to(device)


def evaluate(args: Evaluate) -> dict[str, float]:
    """Rebuild model and guide from the checkpoint, print the test metrics table."""
    from .checks import positive_int

    positive_int("--num-samples", args.num_samples)
    if args.test_size is not None:
        positive_int("--test-size", args.test_size)
    for flag, path in (("--json", args.json), ("--reliability", args.reliability)):
        if path is not None:
            check_writable(path, flag)
    state, cfg, data, model, guide = _restore(args.checkpoint, args.data_root, args.device, args.test_size)
    if args.reliability is not None and data.task != "classification":
        raise ValueError(f"--reliability needs a classification dataset; {cfg.data.dataset} is {data.task}")
    metrics = _test_report(model, guide, data, args.num_samples, args.seed, args.reliability,
                           moments=cfg.optim.estimator == "vdp")
    console.print(metrics_table(f"{args.checkpoint} (epoch {state['epoch'] + 1}, {args.num_samples} samples)",
                                {cfg.guide.name: metrics}))
    if args.json is not None:
        write_json(args.json, {"test": metrics, "checkpoint": str(args.checkpoint), "num_samples": args.num_samples,
                               "seed": args.seed})
    return metrics


# ---------------------------------------------------------------------- prune


def _prune_methods():
    from .analysis.prune import METHODS

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
    from .analysis import prune as pruning

    if args.method == "magnitude":
        return pruning.magnitude_masks(guide, args.fraction)
    if args.method in pruning.METHODS:
        rule = pruning.METHODS[args.method]
        return rule(guide) if args.threshold is None else rule(guide, args.threshold)
    masks = pruning.principled_masks(guide, args.threshold)
    return pruning.random_masks(masks, args.seed) if args.method == "random" else masks


def prune(args: Prune) -> dict:
    """Prune a trained posterior; print metrics before and after and the per-layer sparsity."""
    from .analysis.prune import apply_masks, sparsity
    from .checkpoint import save_checkpoint
    from .checks import positive_int

    positive_int("--num-samples", args.num_samples)
    for flag, path in (("--out", args.out), ("--json", args.json)):
        if path is not None:
            check_writable(path, flag)
    state, cfg, data, model, guide = _restore(args.checkpoint, args.data_root, args.device)
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


# ---------------------------------------------------------------------- entry point

_COMMANDS = {"train": (RunConfig, train), "evaluate": (Evaluate, evaluate), "prune": (Prune, prune)}
_DESCRIPTION = ("Bayesian neural networks on Pyro: train with SVI, evaluate and prune with calibrated uncertainty. "
                "`pyrobnn --version` prints the version.")


def _flatten_tyro_message(text: str) -> str:
    """tyro's boxed parse error as one line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("╭")]  # the title: repeated below
    return _one_line(re.sub(r"[╭╮╰╯│─]+", " ", "\n".join(lines)))


def _parse(argv: list[str]):
    """tyro's parse; when stderr is not a terminal, a parse error becomes one ``error:`` line."""
    import tyro

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
    from . import __version__

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
    except (ValueError, TypeError, OSError) as error:
        _error(str(error))
        raise SystemExit(2) from None
