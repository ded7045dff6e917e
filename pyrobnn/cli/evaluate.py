"""``pyrobnn evaluate``: the test metrics of a checkpoint (or NUTS draws), clean and corrupted."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

from tyro.conf import arg

from pyrobnn.analysis.shift import plot_metric_vs_severity
from pyrobnn.checks import positive_int
from pyrobnn.cli.options import MAX_MEMORY_HINT, CorruptionTypes, OODDataset, Severities
from pyrobnn.cli.report import console, draws_shape
from pyrobnn.cli.runs import (
    calibration_split,
    check_corruptible,
    check_severities,
    corrupted_report,
    gigabytes,
    is_draws,
    load_ood,
    load_run,
    metrics_tables,
    seed_of,
    test_report,
)
from pyrobnn.data.corruptions import CIFAR10_C
from pyrobnn.device import DEVICE_METAVAR
from pyrobnn.files import check_writable, write_json
from pyrobnn.infer.mcmc import MCMCResult

__all__ = ["Evaluate", "evaluate"]


@dataclass
class Evaluate:
    """Evaluate a checkpoint written by `pyrobnn train` (or the draws.pt of `pyrobnn mcmc`) on its dataset's test
    split (a run trained with --calibrate: also calibrated on the training rows it held out)."""

    checkpoint: Annotated[Path, arg(metavar="FILE")]
    """The checkpoint.pt (or draws.pt) to evaluate."""
    num_samples: Annotated[Optional[int], arg(help_behavior_hint="(default: 100; a draws.pt: every draw once)")] = None
    """Monte-Carlo samples of the posterior predictive; of a draws.pt (NUTS, an ensemble, Laplace), that many draws
    spread evenly over all chains and the whole run."""
    seed: Annotated[Optional[int], arg(metavar="INT", help_behavior_hint="(default: the training seed)")] = None
    """Seed of the Monte-Carlo samples (the training seed gives the numbers the training report printed)."""
    data_root: Annotated[Optional[Path], arg(metavar="PATH", help_behavior_hint="(default: as trained)")] = None
    """Directory holding the datasets."""
    test_size: Annotated[Optional[int], arg(metavar="INT", help_behavior_hint="(default: as trained)")] = None
    """Evaluate on a seeded random subset of this many test examples."""
    json: Annotated[Optional[Path], arg(metavar="FILE", help_behavior_hint="(default: none)")] = None
    """Also write the metrics to this JSON file."""
    reliability: Annotated[Optional[Path], arg(metavar="FILE.png", help_behavior_hint="(default: none)")] = None
    """Also draw the reliability diagram into this PNG file."""
    device: Annotated[str, arg(metavar=DEVICE_METAVAR)] = "auto"
    """Where to evaluate (auto: cuda when available)."""
    corruptions: Severities = ()
    """Also evaluate the test images corrupted at these severities (1-5), e.g. 3 or 1 2 3 4 5 (image datasets)."""
    corruption_types: CorruptionTypes = CIFAR10_C
    """Corruptions to apply."""
    ood_dataset: OODDataset = None
    ("Also score how well the epistemic and the total uncertainty tell this dataset's test inputs from the test set"
     " (AUROC, AUPR, FPR at 95 % TPR; e.g. fashion-mnist for mnist).")
    corruption_plot: Annotated[Optional[Path], arg(metavar="FILE.png", help_behavior_hint="(default: none)")] = None
    """With --corruptions: also plot accuracy against severity into this PNG file."""
    max_memory: Annotated[Optional[float], arg(metavar="GB", help_behavior_hint=MAX_MEMORY_HINT)] = None
    """Memory one prediction pass may hold, in GB: the passes are sized to fit it."""
    progress: bool = True
    """Show progress bars over the prediction passes and the corruptions."""


def _shown(args: Evaluate, state: dict, posterior, cfg) -> tuple[int, str, str]:
    """``(num_samples, row, title)`` of the report: a draws file's every draw once, as `pyrobnn mcmc` (or train)
    reported it, or an evenly thinned subset (PosteriorDraws.thinned: every chain, the whole run); a variational
    posterior's 100 samples unless ``--num-samples``."""
    if is_draws(state):
        total = len(posterior)
        num_samples = total if args.num_samples is None else args.num_samples
        row = "nuts" if posterior.kind == MCMCResult.kind else posterior.kind
        subset = "" if num_samples == total else f", {num_samples} spread over them"
        return num_samples, row, (f"{args.checkpoint} (NUTS, {draws_shape(state['draws'])}{subset})" if row == "nuts"
                                  else f"{args.checkpoint} ({row}, {total} draws{subset})")
    num_samples = 100 if args.num_samples is None else args.num_samples
    return num_samples, cfg.guide.name, f"{args.checkpoint} (epoch {state['epoch'] + 1}, {num_samples} samples)"


def evaluate(args: Evaluate) -> dict[str, float]:
    """Rebuild model and guide from the checkpoint, print the test metrics table."""

    if args.num_samples is not None:
        positive_int("--num-samples", args.num_samples)
    if args.test_size is not None:
        positive_int("--test-size", args.test_size)
    check_severities(args.corruptions)
    if args.corruption_plot is not None and not args.corruptions:
        raise ValueError("--corruption-plot needs --corruptions SEVERITY ...")
    for flag, path in (("--json", args.json), ("--reliability", args.reliability),
                       ("--corruption-plot", args.corruption_plot)):
        if path is not None:
            check_writable(path, flag)
    state, run, data, posterior = load_run(args.checkpoint, args.data_root, args.device, args.test_size)
    cfg = getattr(run, "config", run)
    if args.reliability is not None and data.task != "classification":
        raise ValueError(f"--reliability needs a classification dataset; {cfg.data.dataset} is {data.task}")
    if args.corruptions:
        check_corruptible(cfg, data)
    ood = load_ood(args.ood_dataset, cfg, data) if args.ood_dataset is not None else None
    num_samples, row, title = _shown(args, state, posterior, cfg)
    seed = seed_of(cfg) if args.seed is None else args.seed
    max_memory = gigabytes(args.max_memory)
    data, held_out = calibration_split(cfg, data)  # a run trained with --calibrate: the rows it held out
    metrics = test_report(posterior, data, seed, args.reliability, max_memory=max_memory, progress=args.progress,
                          ood=ood, held_out=held_out, num_samples=num_samples,
                          coverage=cfg.calibration.coverage if held_out is not None else 0.9)
    shifted = None
    if args.corruptions:
        shifted = corrupted_report(posterior, cfg, data, args.corruptions, args.corruption_types, num_samples,
                                   seed, max_memory, args.progress)
        if args.corruption_plot is not None:
            plot_metric_vs_severity({row: shifted}, args.corruption_plot, title=f"{args.checkpoint}")
    for table in metrics_tables(title, row, metrics, None if shifted is None else shifted["mean"]):
        console.print(table)
    if args.json is not None:
        write_json(args.json, {"test": metrics, "checkpoint": str(args.checkpoint), "num_samples": num_samples,
                               "seed": seed, **({"corrupted": shifted} if shifted is not None else {})})
    return metrics
