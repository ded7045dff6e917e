"""``pyrobnn study``: a study from the command line or a TOML file; ``pyrobnn study report DIR`` rebuilds its report.

::

    pyrobnn study --dataset mnist --model mlp --epochs 3 --vary guide=normal,additive,dropout \\
        --vary estimator=sample,local --seeds 5 --out runs/ablation
    pyrobnn study --file studies/mnist_ablation.toml --workers 2
    pyrobnn study report runs/ablation

Every argument that is not one of the study's own (:class:`StudyOptions`) is a ``pyrobnn train`` argument of the
base run; with ``--file`` they are added after the file's base, and ``--vary`` axes are added to (or replace) the
file's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Literal, Optional, Union

import tyro
from tyro.conf import Positional, Suppress, UseAppendAction, arg

from pyrobnn.cli import Command, tyro_parse
from pyrobnn.studies.executors import EXECUTORS
from pyrobnn.studies.runner import rebuild_report
from pyrobnn.studies.spec import Study, parse_axis

__all__ = ["StudyOptions", "StudyReport", "parse_study", "study", "STUDY"]


@dataclass
class StudyOptions:
    """Run a study: a base `pyrobnn train` run (every option not listed here, e.g. --dataset mnist --epochs 3)
    crossed with --vary axes and --seeds; each cell is cached in --out/cells/<key> and reruns only when its
    configuration changes; then the report (summary.md, .csv, .json, plots). `pyrobnn study report DIR` rebuilds
    the report without training."""

    vary: Annotated[UseAppendAction[list[str]], arg(metavar="NAME=V1,V2,...")] = field(default_factory=list)
    ("An axis: a train option and its values, e.g. guide=normal,dropout or method=bbb,mcdropout (presets of "
     "pyrobnn.cli.methods); repeat for a grid.")
    seeds: Annotated[Optional[int], arg(metavar="N", help_behavior_hint="(default: the base's --seed)")] = None
    """Run every combination with --seed 0 .. N-1."""
    splits: Annotated[Optional[int], arg(metavar="N", help_behavior_hint="(default: none)")] = None
    ("Run every combination on --split 0 .. N-1: a UCI data set's fixed splits, or the N folds of a table, arrays or "
     "class folders (cross-validation; --data.folds N beside it when N is not 5).")
    file: Annotated[Optional[Path], arg(metavar="TOML")] = None
    """A study file: [study] name, base, seeds, splits, baseline, out; [vary] option = [values]; [published],
    [configurations.NAME]."""
    configuration: Annotated[Optional[str], arg(metavar="NAME", help_behavior_hint=(
        "(default: the file's default_configuration, else cpu)"))] = None
    """With --file: the file's [configurations.NAME] to run (e.g. cpu, gpu), its base arguments added to the
    study's."""
    baseline: Annotated[Optional[str], arg(metavar="LABEL", help_behavior_hint=(
        "(default: the first label, within each value of a data axis such as dataset)"))] = None
    """The label the others are compared with, paired over seeds or splits; or NAME=VALUE of some axes (e.g.
    method=mcdropout): each label against the one with these values and its own on the other axes."""
    out: Annotated[Optional[Path], arg(metavar="DIR", help_behavior_hint="(default: runs/<name>)")] = None
    """The study's folder: study.json, cells/<key>/, records.jsonl, the report."""
    workers: int = 1
    """Cells run at once: local processes (1: this process), or a local Dask cluster's processes."""
    executor: Literal[EXECUTORS] = "local"  # type: ignore[valid-type]
    """local processes, or dask (distributed: the scheduler at --address, else a local cluster)."""
    address: Annotated[Optional[str], arg(metavar="URL", help_behavior_hint="(default: a local cluster)")] = None
    """The Dask scheduler, e.g. tcp://10.0.0.1:8786 (with --executor dask)."""
    force: bool = False
    """Run every cell again, cached or not."""
    progress: bool = True
    """Show a progress bar (at a terminal)."""
    base: Suppress[tuple[str, ...]] = ()  # the arguments that are not the study's: the base run


@dataclass
class StudyReport:
    """Rebuild a study's report (summary.md, .csv, .json, plots, records.jsonl) from its cached cells, training
    nothing."""

    directory: Annotated[Positional[Path], arg(metavar="DIR")]
    """The study's folder (its --out)."""
    baseline: Annotated[Optional[str], arg(metavar="LABEL", help_behavior_hint="(default: the study's)")] = None
    """The label the others are compared with, or NAME=VALUE of some axes (each label against the one with these
    values and its own on the other axes)."""


def parse_study(argv: list[str]) -> Union[StudyOptions, StudyReport]:
    """``pyrobnn study``'s arguments: ``report DIR [--baseline L]``, or the study's options with the unknown ones
    kept as the base run's."""
    if argv[:1] == ["report"]:
        return tyro_parse(lambda: tyro.cli(StudyReport, args=argv[1:], prog="pyrobnn study report"))
    options, base = tyro_parse(lambda: tyro.cli(StudyOptions, args=argv, prog="pyrobnn study",
                                                return_unknown_args=True))
    return replace(options, base=tuple(base))


def study(args: Union[StudyOptions, StudyReport]) -> list[dict]:
    """Run ``pyrobnn study`` (or ``pyrobnn study report``); returns the records."""
    if isinstance(args, StudyReport):
        return rebuild_report(args.directory, args.baseline)
    if args.file is None and not args.base and not args.vary:
        raise ValueError("pyrobnn study needs a study: the base run's train options (e.g. --dataset mnist --epochs "
                         "3) and --vary axes, or --file STUDY.toml; see pyrobnn study --help")
    if args.configuration is not None and args.file is None:
        raise ValueError(f"--configuration {args.configuration}: configurations belong to a study file; give "
                         "--file STUDY.toml too")
    spec = Study.from_file(args.file, args.configuration) if args.file is not None else Study()
    axes = dict(parse_axis(text) for text in args.vary)
    if len(axes) < len(args.vary):
        raise ValueError("--vary: an option is given twice; give all its values in one --vary NAME=V1,V2,...")
    changes = {"base": (*spec.base, *args.base), "vary": {**spec.vary, **axes}}
    changes.update({name: getattr(args, name) for name in ("seeds", "splits", "baseline")
                    if getattr(args, name) is not None})
    spec = spec.replace(**changes)
    return spec.run(args.out, workers=args.workers, executor=args.executor, address=args.address, force=args.force,
                    progress=args.progress)


STUDY = Command(StudyOptions, study, parse_study)
"""The ``study`` entry of the command table (:data:`pyrobnn.cli.COMMANDS`, extended by ``pyrobnn/__main__.py``)."""
