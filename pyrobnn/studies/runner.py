"""Running a study: check every cell, run those not cached, record them, report.

Everything that can be checked is checked before anything is written: every cell's command line (parsed and
checked as ``pyrobnn train`` would), the baseline, the folder and the executor. Then ``study.json`` is written, the
cells without results run (each configuration once, however many labels share it; every cell with ``force``),
``records.jsonl`` collects one record per cell, and :func:`pyrobnn.studies.report.write_report` writes the report.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

from rich.console import Console

from pyrobnn.files import check_writable
from pyrobnn.studies.baseline import resolve_baseline
from pyrobnn.studies.cache import is_finished, read_study, record, write_records, write_study
from pyrobnn.studies.cells import Cell
from pyrobnn.studies.executors import CellTask, make_executor
from pyrobnn.studies.progress import StudyProgress
from pyrobnn.studies.report import write_report

__all__ = ["run_study", "rebuild_report", "collect"]


def _console() -> Console:
    """Output to this moment's stdout (not to a cell's log, where a running cell's output goes), 200 columns when
    it is no terminal."""
    return Console(file=sys.stdout, width=None if sys.stdout.isatty() else 200)


def collect(cells: Sequence[Cell], out: Path) -> list[dict]:
    """The record of every cell that has run, in the study's order."""
    return [found for found in (record(cell, out) for cell in cells) if found is not None]


def _labels(cells: Sequence[Cell]) -> dict[str, dict[str, str]]:
    """``{label: its axes}`` of the study's cells, in order."""
    return {cell.label: dict(cell.axes) for cell in cells}


def _report(records: list[dict], out: Path, baseline: str, cells: Sequence[Cell], console: Console) -> list[dict]:
    """Write the records and the report; differences only when a baseline label has run."""
    write_records(out, records)
    if records:
        baselines = set(resolve_baseline(baseline, _labels(cells)).of.values())
        write_report(records, out, baseline if any(r["label"] in baselines for r in records) else None, console)
    return records


def run_study(study, out: Optional[Path] = None, *, workers: int = 1, executor: str = "local",
              address: Optional[str] = None, force: bool = False, progress: bool = True,
              console: Optional[Console] = None) -> list[dict]:
    """Run ``study`` (a :class:`~pyrobnn.studies.spec.Study`) into ``out`` and report it; returns the records.

    :param workers: local worker processes (1: this process), or the processes of a local Dask cluster.
    :param executor: ``"local"`` or ``"dask"`` (:mod:`pyrobnn.studies.executors`).
    :param address: the Dask scheduler (``tcp://host:8786``); None: a local cluster.
    :param force: run every cell again, cached or not.
    :param progress: a live progress bar when the output is a terminal.
    """
    cells = study.cells()
    baseline = study.resolved_baseline()
    out = Path(out if out is not None else study.out if study.out is not None else Path("runs") / study.name)
    check_writable(out, "--out", directory=True)
    engine = make_executor(executor, workers, address)
    console = console or _console()
    write_study(out, study.to_dict(), baseline, cells)
    sharing: dict[str, list[Cell]] = {}
    for cell in cells:
        sharing.setdefault(cell.key, []).append(cell)
    pending = [group[0] for group in sharing.values() if force or not is_finished(group[0], out)]
    cached = len(sharing) - len(pending)
    console.print(f"study {study.name}: {len(cells)} cells ({len(sharing)} configurations: {cached} cached, "
                  f"{len(pending)} to run) in {out}", soft_wrap=True, highlight=False, markup=False)
    tasks = {str(cell.directory(out)): cell for cell in pending}
    with StudyProgress(len(pending), engine, console, progress and console.is_terminal) as bar:
        for task, outcome in engine.run([CellTask(cell.command, tuple(cell.run_argv(out, force)), directory)
                                         for directory, cell in tasks.items()]):
            bar.finished(sharing[tasks[task.directory].key], outcome)
    return _report(collect(cells, out), out, baseline, cells, console)


def rebuild_report(out: Path, baseline: Optional[str] = None, console: Optional[Console] = None) -> list[dict]:
    """The report of the study in ``out`` rebuilt from its cached cells, training nothing; returns the records."""
    out = Path(out)
    study, cells = read_study(out)
    baseline = study.get("baseline") if baseline is None else baseline
    try:
        resolve_baseline(baseline, _labels(cells))
    except ValueError as error:
        raise ValueError(f"{error} (the study in {out})") from None
    console = console or _console()
    records = collect(cells, out)
    missing = len(cells) - len(records)
    if missing:
        console.print(f"{missing} of {len(cells)} cells have not run yet: run the study again to finish them",
                      soft_wrap=True, highlight=False, markup=False)
    return _report(records, out, baseline, cells, console)
