"""What the examples that compare methods share: their study file, run with the example's options, and each method's
cell.

An example's study file, ``studies/<example>.toml``, states the base ``pyrobnn train`` run and a first axis whose
values are the example's methods in the order the example names them, each the options that set it apart
(``bayesian = ["all", "none --dropout 0.5"]``), crossed with its other axes (``width = [1, 2, 4]``).
:func:`run_methods` runs it through :func:`pyrobnn.studies.run_study` (cached in ``--out``: a second run trains
nothing, an interrupted one resumes) and writes the report under the methods' names; what the example measures
beyond the test report reads each method's folder (:class:`MethodCell`).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

from rich.console import Console
from rich.table import Table

from pyrobnn.cli.runs import load_run
from pyrobnn.studies import load_study, run_study, write_report
from pyrobnn.studies.cache import read_json

STUDIES = Path(__file__).resolve().parents[1] / "studies"
"""The study files, ``<example>.toml``."""


@dataclass
class MethodCell:
    """One cell of a study: its method, the values of the study's other axes, its record
    (:mod:`pyrobnn.studies.aggregate`) and folder."""

    method: str
    axes: dict
    record: dict
    directory: Path

    @property
    def report(self) -> dict:
        """The cell's ``metrics.json``: ``test`` (the test report), ``history`` (one record per epoch), ..."""
        return read_json(self.directory / "metrics.json")

    @property
    def train_seconds(self) -> float:
        """Seconds of training, summed over the epochs."""
        return sum(epoch["seconds"] for epoch in self.report["history"])

    def restore(self, device: str = "auto"):
        """``(config, data, model, guide)`` of the cell, the model and guide with their trained values."""
        _, run, data, posterior = load_run(self.directory / "checkpoint.pt", None, device)
        return run.config, data, posterior.model, posterior.guide


class _WithoutTables(Console):
    """The terminal, without the tables of the report that :func:`run_study` writes under the cells' arguments (the
    report under the methods' names follows)."""

    def print(self, *objects, **options) -> None:
        if not any(isinstance(item, Table) for item in objects):
            super().print(*objects, **options)


def add_study_options(parser: argparse.ArgumentParser, example: str) -> None:
    """The options of the study an example runs: its folder, the worker processes, rerunning cached cells."""
    parser.add_argument("--out", type=Path, default=Path("runs") / example,
                        help="the study's folder: cells/<key>/ per method (cached), summary.md, .csv, .json, plots")
    parser.add_argument("--workers", type=int, default=1, help="cells run at once in local processes")
    parser.add_argument("--force", action="store_true", help="train every method again, cached or not")


def given(args: argparse.Namespace, *names: str) -> list:
    """``--name value`` of each of the example's options ``names`` that is set (not None): a base run's options."""
    return [token for name in names if getattr(args, name) is not None
            for token in (f"--{name.replace('_', '-')}", getattr(args, name))]


def run_methods(example: str, methods: Sequence[str], args: argparse.Namespace, chosen: Optional[Sequence[str]] = None,
                base: Sequence = (), extra: Optional[Mapping[str, Sequence]] = None,
                vary: Optional[Mapping[str, Sequence]] = None, progress: bool = True) -> list[MethodCell]:
    """Run ``studies/<example>.toml``, whose first axis lists the example's ``methods`` in order, for the ``chosen``
    ones (default: all), with ``base`` added to its base run, ``extra[method]`` to a method's options and ``vary``
    replacing its other axes, in ``args.out`` (with ``args.workers`` and ``args.force``,
    :func:`add_study_options`); returns the cells, or exits naming a method that failed, its error and the command
    that replays it."""
    study = load_study(STUDIES / f"{example}.toml")
    (axis, values), *others = study.vary.items()
    if len(values) != len(methods):
        raise ValueError(f"studies/{example}.toml: [vary] {axis} has {len(values)} values, not one per method of "
                         f"{example} ({', '.join(methods)}, in that order)")
    options = {method: " ".join([value, *(str(a) for a in (extra or {}).get(method, ()))])
               for method, value in zip(methods, values)}
    chosen = list(chosen or methods)
    combinations = math.prod(len(other) for _, other in others)  # of the other axes, for each method
    baseline = methods[study.labels().index(study.resolved_baseline()) // combinations]
    study = study.replace(base=(*study.base, *(str(a) for a in base)), baseline=None,
                          vary={axis: [options[m] for m in chosen], **dict(others), **(vary or {})})
    width = None if sys.stdout.isatty() else 200  # a log keeps the table's columns
    records = run_study(study, args.out, workers=args.workers, force=args.force, progress=progress,
                        console=_WithoutTables(width=width))
    method_of = {options[method]: method for method in chosen}
    cells = [MethodCell(method_of[record["axes"][axis]], {k: v for k, v in record["axes"].items() if k != axis},
                        record, args.out / "cells" / record["key"]) for record in records]
    named = [{**cell.record, "label": " ".join([cell.method, *(f"{k}={v}" for k, v in cell.axes.items())])}
             for cell in cells]
    reference = next((r["label"] for r, cell in zip(named, cells) if cell.method == baseline), named[0]["label"])
    write_report(named, args.out, reference, console=Console(width=width))
    if len(records) < len(study.cells()):
        raise SystemExit(f"{example}: {len(study.cells()) - len(records)} cells did not run; run it again to finish")
    for record in named:
        if record["status"] != "done":
            raise SystemExit(f"{example}: {record['label']} failed: {record['error']}\n  its log: {args.out}/cells/"
                             f"{record['key']}/log.txt\n  rerun it alone: {record['command']}")
    return cells
