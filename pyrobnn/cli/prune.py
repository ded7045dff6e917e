"""``pyrobnn prune``: prune a trained posterior and compare test metrics before and after."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional

from rich.table import Table
from tyro.conf import arg

from pyrobnn.analysis import prune as pruning
from pyrobnn.analysis.prune import METHODS, apply_masks, sparsity
from pyrobnn.checkpoint import save_checkpoint
from pyrobnn.checks import positive_int
from pyrobnn.cli.options import MAX_MEMORY_HINT
from pyrobnn.cli.report import console, metrics_table, percent
from pyrobnn.cli.runs import gigabytes, load_run, seed_of, test_report
from pyrobnn.device import DEVICE_METAVAR
from pyrobnn.files import check_writable, write_json

__all__ = ["Prune", "prune"]


def _prune_methods():

    return ("principled", *METHODS, "random")


@dataclass
class Prune:
    """Prune the posterior of a checkpoint and compare test metrics before and after."""

    checkpoint: Annotated[Path, arg(metavar="FILE")]
    """The checkpoint.pt to prune."""
    method: Literal[_prune_methods()] = "principled"
    ("principled: the guide's own rule (snr for normal, log-alpha for the dropout guides); snr: |mu|/sigma below "
     "--threshold (Graves 2011); log-alpha: log alpha above --threshold (Molchanov et al. 2017); magnitude: global L1 "
     "on |mu| to --fraction; random: the principled rule's per-layer sparsity at random positions.")
    threshold: Annotated[Optional[float], arg(metavar="FLOAT",
                                              help_behavior_hint="(default: 0.83 for snr, 3 for log-alpha)")] = None
    """Threshold of the snr or log-alpha rule."""
    fraction: float = 0.9
    """magnitude: fraction of all weights to remove, in [0, 1]."""
    num_samples: int = 100
    """Monte-Carlo samples of the posterior predictive."""
    seed: Annotated[Optional[int], arg(metavar="INT", help_behavior_hint="(default: the training seed)")] = None
    """Seed of random pruning and of the Monte-Carlo samples."""
    data_root: Annotated[Optional[Path], arg(metavar="PATH", help_behavior_hint="(default: as trained)")] = None
    """Directory holding the datasets."""
    out: Annotated[Optional[Path], arg(metavar="FILE", help_behavior_hint="(default: none)")] = None
    """Write the pruned checkpoint to this file."""
    json: Annotated[Optional[Path], arg(metavar="FILE", help_behavior_hint="(default: none)")] = None
    """Also write the metrics before and after and the sparsity to this JSON file."""
    device: Annotated[str, arg(metavar=DEVICE_METAVAR)] = "auto"
    """Where to evaluate (auto: cuda when available)."""
    max_memory: Annotated[Optional[float], arg(metavar="GB", help_behavior_hint=MAX_MEMORY_HINT)] = None
    """Memory one prediction pass may hold, in GB: the passes are sized to fit it."""


def _masks(args: Prune, guide, seed: int):

    if args.method == "magnitude":
        return pruning.magnitude_masks(guide, args.fraction)
    if args.method in pruning.METHODS:
        rule = pruning.METHODS[args.method]
        return rule(guide) if args.threshold is None else rule(guide, args.threshold)
    masks = pruning.principled_masks(guide, args.threshold)
    return pruning.random_masks(masks, seed) if args.method == "random" else masks


def prune(args: Prune) -> dict:
    """Prune a trained posterior; print metrics before and after and the per-layer sparsity."""

    positive_int("--num-samples", args.num_samples)
    for flag, path in (("--out", args.out), ("--json", args.json)):
        if path is not None:
            check_writable(path, flag)
    state, run, data, posterior = load_run(args.checkpoint, args.data_root, args.device, draws=False)
    seed = seed_of(run.config) if args.seed is None else args.seed
    guide = posterior.guide
    masks = _masks(args, guide, seed)
    report = dict(num_samples=args.num_samples, max_memory=gigabytes(args.max_memory))
    before = test_report(posterior, data, seed, **report)
    apply_masks(guide, masks)
    after = test_report(posterior, data, seed, **report)
    removed = sparsity(masks)
    console.print(metrics_table(f"{args.checkpoint}: {args.method} pruning, {percent(removed['total'])} "
                                "of weights removed", {"before": before, "after": after}))
    table = Table(title="sparsity per layer")
    table.add_column("site")
    table.add_column("removed %", justify="right")
    for name, value in removed.items():
        table.add_row(name, f"{100 * value:.1f}")
    console.print(table)
    result = {"before": before, "after": after, "sparsity": removed, "method": args.method, "seed": seed}
    if args.out is not None:
        state = {k: v for k, v in state.items() if k != "pyrobnn"}
        save_checkpoint(args.out, {**state, "guide": guide.state_dict()})
    if args.json is not None:
        write_json(args.json, result)
    return result
