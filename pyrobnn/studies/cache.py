"""A study's folder: the cached cells and what the report is built from.

::

    <study>/study.json            the study (base, axes, replicates, baseline) and its cells
    <study>/records.jsonl         one record per cell that has run (the report's input)
    <study>/cells/<key>/          one cell: what `pyrobnn train` writes (checkpoint.pt, metrics.json, ...),
                      cell.json   its outcome (status, one-line error, wall seconds)
                      log.txt     what it printed

A cell is *finished* when its results file (``metrics.json``; ``diagnostics.json`` for mcmc) holds a ``test``
entry: it is never run again. Anything else (no folder, a run killed before its test report, a failed run) is run
again. Every file is written atomically (:mod:`pyrobnn.files`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

from pyrobnn.files import atomic_write, write_json
from pyrobnn.studies.cells import Cell

__all__ = ["STUDY_FILE", "RECORDS_FILE", "OUTCOME_FILE", "RESULTS_FILE", "read_json", "results", "is_finished",
           "write_outcome", "record", "write_study", "read_study", "write_records", "read_records"]

STUDY_FILE = "study.json"
RECORDS_FILE = "records.jsonl"
OUTCOME_FILE = "cell.json"
RUN_METRICS = ("training", "posterior")
"""Entries of a results file, beside its ``test``, that a cell's record takes among its metrics: the training set's
fit (``training.nll``, ``training.accuracy``) and the posterior's numbers (``posterior.sigma.mean``,
``posterior.temperature``)."""

RESULTS_FILE = {"train": "metrics.json", "mcmc": "diagnostics.json"}
"""The file each command writes its test metrics to (under ``"test"``)."""


def read_json(path: Path) -> Optional[dict]:
    """The JSON object in ``path``, or None when there is none (missing, unreadable, not an object)."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def results(cell: Cell, out: Path) -> Optional[dict]:
    """The cell's results file, when it holds a ``test`` entry (the cell is finished); None otherwise."""
    found = read_json(cell.directory(out) / RESULTS_FILE[cell.command])
    return found if found is not None and isinstance(found.get("test"), dict) else None


def is_finished(cell: Cell, out: Path) -> bool:
    return results(cell, out) is not None


def write_outcome(directory: Path, status: str, error: Optional[str], seconds: Optional[float]) -> dict:
    """Write a cell's ``cell.json`` and return it."""
    outcome = {"status": status, "error": error, "seconds": seconds}
    write_json(Path(directory) / OUTCOME_FILE, outcome)
    return outcome


def record(cell: Cell, out: Path) -> Optional[dict]:
    """The report's record of ``cell`` (the format of :mod:`pyrobnn.studies.aggregate`); None when the cell has not
    run yet. A cell with results is ``done``; one whose last run raised is ``failed``, with its error."""
    directory = cell.directory(out)
    outcome = read_json(directory / OUTCOME_FILE) or {}
    found = results(cell, out)
    if found is None and outcome.get("status") != "failed":
        return None
    seconds = outcome.get("seconds")
    return {
        "key": cell.key, "label": cell.label, "axes": dict(cell.axes), "seed": cell.seed, "split": cell.split,
        "status": "done" if found is not None else "failed",
        "error": None if found is not None else outcome.get("error"),
        "command": cell.replay(out),
        "metrics": {**found["test"], **{key: found[key] for key in RUN_METRICS if isinstance(found.get(key), dict)}}
        if found is not None else {},
        "train_seconds": float(seconds) if isinstance(seconds, (int, float)) else None,
        "peak_memory_gb": (found or {}).get("peak_memory_gb"),
    }


def write_study(out: Path, study: dict, baseline: str, cells: Sequence[Cell]) -> None:
    write_json(Path(out) / STUDY_FILE, {**study, "baseline": baseline, "cells": [cell.to_dict() for cell in cells]})


def read_study(out: Path) -> tuple[dict, list[Cell]]:
    """The study of ``out/study.json`` and its cells; a :class:`ValueError` when ``out`` holds no study."""
    found = read_json(Path(out) / STUDY_FILE)
    if found is None or not isinstance(found.get("cells"), list):
        raise ValueError(f"{out} holds no study ({STUDY_FILE} is missing or unreadable): give the --out of a "
                         "`pyrobnn study` run")
    return found, [Cell.from_dict(cell) for cell in found["cells"]]


def write_records(out: Path, records: Sequence[dict]) -> Path:
    return atomic_write(Path(out) / RECORDS_FILE, "".join(json.dumps(r) + "\n" for r in records))


def read_records(out: Path) -> list[dict]:
    path = Path(out) / RECORDS_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
