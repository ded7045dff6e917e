"""``pyrobnn evaluate``: the test metrics of a checkpoint (or NUTS draws), clean and corrupted."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional

import pyro
from tyro.conf import arg

from pyrobnn.analysis.shift import evaluate_corruptions, plot_metric_vs_severity
from pyrobnn.checks import positive_int
from pyrobnn.cli.options import MAX_MEMORY_HINT
from pyrobnn.cli.report import console, draws_shape, metrics_table
from pyrobnn.cli.runs import augmentation, gigabytes, is_draws, restore, seed_of, test_report
from pyrobnn.data.corruptions import CIFAR10_C, CORRUPTIONS, SEVERITIES
from pyrobnn.device import DEVICE_METAVAR
from pyrobnn.files import check_writable, write_json

__all__ = ["Evaluate", "evaluate"]


@dataclass
class Evaluate:
    """Evaluate a checkpoint written by `pyrobnn train` (or the draws.pt of `pyrobnn mcmc`) on its dataset's test
    split."""

    checkpoint: Annotated[Path, arg(metavar="FILE")]
    """The checkpoint.pt (or draws.pt) to evaluate."""
    num_samples: int = 100
    """Monte-Carlo samples of the posterior predictive (the draws.pt of pyrobnn mcmc: each of its draws once)."""
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
    corruptions: Annotated[tuple[int, ...], arg(metavar="SEVERITY")] = ()
    """Also evaluate the test images corrupted at these severities (1-5), e.g. 3 or 1 2 3 4 5 (image datasets)."""
    corruption_types: Annotated[tuple[Literal[tuple(CORRUPTIONS)], ...],
                                arg(help_behavior_hint="(default: the 14 CIFAR-10-C types "
                                                       "generated in code)")] = CIFAR10_C
    """Corruptions to apply."""
    corruption_plot: Annotated[Optional[Path], arg(metavar="FILE.png", help_behavior_hint="(default: none)")] = None
    """With --corruptions: also plot accuracy against severity into this PNG file."""
    max_memory: Annotated[Optional[float], arg(metavar="GB", help_behavior_hint=MAX_MEMORY_HINT)] = None
    """Memory one prediction pass may hold, in GB: the passes are sized to fit it."""
    progress: bool = True
    """Show progress bars over the prediction passes and the corruptions."""


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
    state, cfg, data, model, guide = restore(args.checkpoint, args.data_root, args.device, args.test_size)
    if args.reliability is not None and data.task != "classification":
        raise ValueError(f"--reliability needs a classification dataset; {cfg.data.dataset} is {data.task}")
    if args.corruptions and (data.task != "classification" or len(data.input_shape) != 3):
        raise ValueError(f"--corruptions needs an image classification dataset; {cfg.data.dataset} is not one")
    if is_draws(state):  # the empirical posterior: every draw once, as `pyrobnn mcmc` reported it
        num_samples, moments, row = len(guide), False, "nuts"
        title = f"{args.checkpoint} (NUTS, {draws_shape(state['draws'])})"
    else:
        num_samples, moments, row = args.num_samples, cfg.optim.estimator == "vdp", cfg.guide.name
        title = f"{args.checkpoint} (epoch {state['epoch'] + 1}, {num_samples} samples)"
    seed = seed_of(cfg) if args.seed is None else args.seed
    max_memory = gigabytes(args.max_memory)
    metrics = test_report(model, guide, data, num_samples, seed, args.reliability, moments=moments,
                          max_memory=max_memory, progress=args.progress)
    rows, shifted = {row: metrics}, None
    if args.corruptions:
        aug = augmentation(cfg, data)
        images = data.x_test if aug is None else aug.denormalize(data.x_test)
        pyro.set_rng_seed(seed)
        shifted = evaluate_corruptions(model, guide, images, data.y_test, corruptions=args.corruption_types,
                                       severities=args.corruptions, num_samples=num_samples,
                                       transform=None if aug is None else aug.normalize, seed=seed,
                                       progress=args.progress, max_memory=max_memory)
        rows[f"{row}, corrupted"] = shifted["mean"]
        if args.corruption_plot is not None:
            plot_metric_vs_severity({row: shifted}, args.corruption_plot, title=f"{args.checkpoint}")
    console.print(metrics_table(title, rows))
    if args.json is not None:
        write_json(args.json, {"test": metrics, "checkpoint": str(args.checkpoint), "num_samples": num_samples,
                               "seed": seed, **({"corrupted": shifted} if shifted is not None else {})})
    return metrics
