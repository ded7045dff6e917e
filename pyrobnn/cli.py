"""``pyrobnn`` command line (tyro): ``train`` a Bayesian network, ``evaluate`` a checkpoint.

    pyrobnn train --dataset mnist --train-size 5000 --epochs 3 --out runs/demo
    pyrobnn evaluate --checkpoint runs/demo/checkpoint.pt --json runs/demo/eval.json

Every run is validated (data, model, prior, guide) before anything is written
to its output directory; a checkpoint is written atomically after each epoch.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

from rich.console import Console
from rich.table import Table

from .checkpoint import load_checkpoint
from .config import RunConfig, beta_schedule, build
from .device import resolve_device
from .train import TrainingDiverged, fit

__all__ = ["main", "train", "evaluate", "prune", "Evaluate", "Prune"]

console = Console()


def write_json(path: Path, payload: dict) -> None:
    """Write JSON atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=2)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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


def _load_data(cfg: RunConfig):
    from .data import load_dataset

    return load_dataset(cfg.dataset, cfg.data_root, train_size=cfg.train_size, test_size=cfg.test_size,
                        val_size=cfg.val_size, seed=cfg.seed)


def _test_report(model, guide, data, samples: int, out: Optional[Path], moments: bool = False) -> dict[str, float]:
    from .analysis.metrics import classification_metrics, reliability_diagram
    from .predict import evaluate as evaluate_posterior, predict, predict_moments

    if data.task != "classification":
        return evaluate_posterior(model, guide, data.x_test, data.y_test, num_samples=samples, moments=moments)
    probs = (predict_moments(model, guide, data.x_test) if moments
             else predict(model, guide, data.x_test, num_samples=samples))["probs"]
    if out is not None:  # the diagram of the same predictions the metrics score
        reliability_diagram(probs.cpu(), data.y_test, out / "reliability.png",
                            title=f"{data.name}: {len(data.y_test)} test examples, {samples} samples")
    return classification_metrics(probs, data.y_test.to(probs.device))


def train(cfg: RunConfig) -> dict[str, float]:
    """Train, evaluate on the test split, write ``checkpoint.pt``, ``metrics.json``, ``reliability.png``."""
    device = resolve_device(cfg.device)
    schedule = beta_schedule(cfg)
    data = _load_data(cfg)
    model, guide = build(cfg, data)
    val = (data.x_val, data.y_val) if data.x_val is not None else None
    console.print(f"[bold]pyrobnn[/] {cfg.dataset}: {len(data.x_train)} train / {len(data.x_test)} test, "
                  f"model {cfg.model}, {len(model.sites())} Bayesian tensors, guide {cfg.guide}, "
                  f"prior {cfg.prior}, beta {cfg.beta}, device {device}")
    history = fit(
        model, guide, data.x_train, data.y_train, epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
        optimizer=cfg.optimizer, lr_step=cfg.lr_step, lr_gamma=cfg.lr_gamma, beta=schedule,
        num_particles=cfg.particles, estimator=cfg.estimator, val=val, seed=cfg.seed, device=device,
        checkpoint=cfg.out / "checkpoint.pt", resume=cfg.resume, config=cfg.to_dict(), progress=cfg.progress,
        on_epoch_end=lambda epoch, record: console.print(
            "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items())),
    )
    metrics = _test_report(model, guide, data, cfg.samples, cfg.out, moments=cfg.estimator == "vdp")
    write_json(cfg.out / "metrics.json", {"test": metrics, "history": history.epochs, "config": cfg.to_dict()})
    console.print(metrics_table(f"test metrics ({cfg.samples} samples)", {cfg.guide: metrics}))
    console.print(f"wrote {cfg.out}/checkpoint.pt, metrics.json" +
                  (", reliability.png" if data.task == "classification" else ""))
    return metrics


@dataclass
class Evaluate:
    """Evaluate a checkpoint written by `pyrobnn train` on its dataset's test split."""

    checkpoint: Path
    """Path of the checkpoint.pt to evaluate."""
    samples: int = 100
    """Monte-Carlo samples of the posterior predictive."""
    data_root: Optional[Path] = None
    """Data directory (default: the one the run was trained with, else $PYROBNN_DATA)."""
    test_size: Optional[int] = None
    """Evaluate on a random subset of this many test examples (default: as trained)."""
    json: Optional[Path] = None
    """Also write the metrics to this JSON file."""
    reliability: Optional[Path] = None
    """Also write a reliability diagram (PNG) to this directory."""
    device: str = "auto"
    """auto | cpu | cuda."""


def _restore(checkpoint: Path, data_root: Optional[Path], device: str, test_size: Optional[int] = None):
    """The checkpoint's state and config, its dataset, and its model and guide with the trained values,
    on ``device`` (``data_root`` and ``test_size`` override the trained run's when given)."""
    state = load_checkpoint(checkpoint)
    if "config" not in state or "guide" not in state:
        raise ValueError(f"{checkpoint} is not a pyrobnn checkpoint (no config/guide state)")
    cfg = RunConfig.from_dict(state["config"])
    if data_root is not None:
        cfg.data_root = data_root
    if test_size is not None:
        cfg.test_size = test_size
    device = resolve_device(device)
    data = _load_data(cfg)
    model, guide = build(cfg, data)
    model.load_state_dict(state["model"])
    guide.load_state_dict(state["guide"])
    return state, cfg, data, model.to(device), guide.to(device)


def evaluate(args: Evaluate) -> dict[str, float]:
    """Rebuild model and guide from the checkpoint, print the test metrics table."""
    if not isinstance(args.samples, int) or args.samples < 1:
        raise ValueError(f"samples must be a positive integer, got {args.samples!r}")
    state, cfg, data, model, guide = _restore(args.checkpoint, args.data_root, args.device, args.test_size)
    metrics = _test_report(model, guide, data, args.samples, args.reliability, moments=cfg.estimator == "vdp")
    console.print(metrics_table(f"{args.checkpoint} (epoch {state['epoch'] + 1}, {args.samples} samples)",
                                {cfg.guide: metrics}))
    if args.json is not None:
        write_json(args.json, {"test": metrics, "checkpoint": str(args.checkpoint), "samples": args.samples})
    return metrics


@dataclass
class Prune:
    """Prune the posterior of a checkpoint and compare test metrics before and after."""

    checkpoint: Path
    """Path of the checkpoint.pt to prune."""
    method: Literal["principled", "snr", "log-alpha", "magnitude", "random"] = "principled"
    """principled: the guide's own rule (snr for normal, log-alpha for dropout guides); snr: |mu|/sigma <
    threshold; log-alpha: log alpha > threshold; magnitude: global L1 on |mu| to --fraction; random: the
    per-layer sparsity of the principled rule at random positions."""
    threshold: Optional[float] = None
    """Threshold of snr (default 0.83) or log-alpha (default 3) pruning."""
    fraction: float = 0.9
    """magnitude: fraction of all weights to remove, in [0, 1]."""
    samples: int = 100
    """Monte-Carlo samples of the posterior predictive."""
    seed: int = 0
    """Seed of random pruning and of the predictive samples."""
    data_root: Optional[Path] = None
    """Data directory (default: as trained)."""
    out: Optional[Path] = None
    """Write the pruned checkpoint here (default: nothing written)."""
    json: Optional[Path] = None
    """Also write before/after metrics and sparsity to this JSON file."""
    device: str = "auto"
    """auto | cpu | cuda."""


def _masks(args: Prune, guide):
    from .analysis import prune as pruning

    if args.method == "magnitude":
        return pruning.magnitude_masks(guide, args.fraction)
    if args.method in ("snr", "log-alpha"):
        rule = pruning.METHODS[args.method]
        return rule(guide) if args.threshold is None else rule(guide, args.threshold)
    masks = pruning.principled_masks(guide, args.threshold)
    return pruning.random_masks(masks, args.seed) if args.method == "random" else masks


def prune(args: Prune) -> dict:
    """Prune a trained posterior; print metrics before and after and the per-layer sparsity."""
    import pyro

    from .checkpoint import save_checkpoint
    from .analysis.prune import apply_masks, sparsity

    if not (isinstance(args.samples, int) and args.samples > 0):
        raise ValueError(f"samples must be a positive integer, got {args.samples!r}")
    state, cfg, data, model, guide = _restore(args.checkpoint, args.data_root, args.device)
    masks = _masks(args, guide)
    pyro.set_rng_seed(args.seed)
    before = _test_report(model, guide, data, args.samples, None, moments=cfg.estimator == "vdp")
    apply_masks(guide, masks)
    pyro.set_rng_seed(args.seed)
    after = _test_report(model, guide, data, args.samples, None, moments=cfg.estimator == "vdp")
    removed = sparsity(masks)
    console.print(metrics_table(f"{args.checkpoint}: {args.method} pruning, {100 * removed['total']:.1f} % "
                                "of weights removed", {"before": before, "after": after}))
    table = Table(title="sparsity per layer")
    table.add_column("site")
    table.add_column("removed %", justify="right")
    for name, value in removed.items():
        table.add_row(name, f"{100 * value:.1f}")
    console.print(table)
    result = {"before": before, "after": after, "sparsity": removed, "method": args.method}
    if args.out is not None:
        save_checkpoint(args.out, {**state, "guide": guide.state_dict()})
    if args.json is not None:
        write_json(args.json, result)
    return result


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point of the ``pyrobnn`` console script and ``python -m pyrobnn``."""
    import tyro

    args = tyro.extras.subcommand_cli_from_dict(
        {"train": RunConfig, "evaluate": Evaluate, "prune": Prune}, args=argv, prog="pyrobnn",
        description="Bayesian neural networks on Pyro: train with SVI, evaluate with calibrated uncertainty.",
    )
    try:
        {RunConfig: train, Evaluate: evaluate, Prune: prune}[type(args)](args)
    except (ValueError, FileNotFoundError, TypeError) as error:
        console.print(f"[bold red]error:[/] {error}")
        raise SystemExit(2) from None
    except TrainingDiverged as error:
        console.print(f"[bold red]error: training diverged:[/] {error}")
        raise SystemExit(1) from None
