"""Where a study's cells run: one after the other in this process (:class:`Serial`), in a pool of local worker
processes (:class:`ProcessPool`, ``--workers N``), or on a Dask ``distributed`` cluster (:class:`DaskCluster`,
``--executor dask``: the scheduler at ``--address``, or a :class:`~distributed.LocalCluster` of ``--workers``
processes; SLURM and Kubernetes clusters come from ``dask-jobqueue`` and ``dask-kubernetes``, their workers
started with ``--nthreads 1``).

Each cell is :func:`run_cell`: the command's configuration parsed from the cell's arguments, run in the worker,
its output kept in the cell's ``log.txt``, its outcome in ``cell.json``. A cell that raises is recorded as failed
(one line: the error's type and message) and the others go on. Local workers use ``max(1, cores // N)`` torch
threads each, so N of them do not oversubscribe the cores. The study folder must be one every worker can write
(a shared file system on a cluster).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import multiprocessing
import os
import threading
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Optional, Sequence

import pyro
import torch

from pyrobnn.checks import one_line, positive_int
from pyrobnn.studies.cache import write_outcome
from pyrobnn.studies.cells import RUNS, parse_cell

__all__ = ["EXECUTORS", "CellTask", "run_cell", "threads_per_worker", "Serial", "ProcessPool", "DaskCluster",
           "make_executor"]

EXECUTORS = ("local", "dask")
"""``--executor``: local processes (or this one with ``--workers 1``), or Dask ``distributed``."""

_ONE_CELL_AT_A_TIME = threading.Lock()
"""Pyro's parameter store and the redirected output are the process's: a worker process running tasks on several
threads (a Dask worker with ``--nthreads 2``) runs its cells one at a time."""


@dataclass(frozen=True)
class CellTask:
    """What a worker needs to run one cell: the command, its full arguments, its folder, and the torch threads to
    use (None: leave them)."""

    command: str
    argv: tuple[str, ...]
    directory: str
    threads: Optional[int] = None


def run_cell(task: CellTask) -> dict:
    """Run one cell in this process: parse its configuration, run the command with its output in ``log.txt``,
    write ``cell.json``; returns ``{"status": "done" | "failed", "error", "seconds"}``. Never raises for an error
    of the run."""
    with _ONE_CELL_AT_A_TIME:
        directory = Path(task.directory)
        directory.mkdir(parents=True, exist_ok=True)
        if task.threads is not None:
            torch.set_num_threads(task.threads)
        pyro.clear_param_store()  # each cell starts as a fresh `pyrobnn train` would
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        error = None
        start = time.perf_counter()
        with open(directory / "log.txt", "w") as log, contextlib.redirect_stdout(log), \
                contextlib.redirect_stderr(log):
            try:
                RUNS[task.command](parse_cell(task.command, task.argv))
            except Exception as exc:  # recorded; the study goes on
                error = one_line(f"{type(exc).__name__}: {exc}")
                traceback.print_exc(file=log)
        return write_outcome(directory, "failed" if error else "done", error, time.perf_counter() - start)


def _outcome(future, task: CellTask) -> dict:
    """A finished future's outcome; a worker that died (killed, out of memory) fails its cell."""
    try:
        return future.result()
    except Exception as exc:
        return write_outcome(Path(task.directory), "failed", one_line(f"worker failed: {type(exc).__name__}: {exc}"),
                             None)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads_per_worker(workers: int) -> int:
    """Torch threads for each of ``workers`` local worker processes: ``max(1, cores // workers)``."""
    return max(1, _cores() // workers)


class Serial:
    """The cells one after the other, in this process."""

    workers = 1

    def run(self, tasks: Sequence[CellTask]) -> Iterator[tuple[CellTask, dict]]:
        for task in tasks:
            yield task, run_cell(task)


class ProcessPool:
    """The cells on ``workers`` local processes (started with ``spawn``), each with
    :func:`threads_per_worker` torch threads."""

    def __init__(self, workers: int):
        self.workers = workers

    def run(self, tasks: Sequence[CellTask]) -> Iterator[tuple[CellTask, dict]]:
        threads = threads_per_worker(self.workers)
        with ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(run_cell, replace(task, threads=threads)): task for task in tasks}
            try:
                for future in as_completed(futures):
                    yield futures[future], _outcome(future, futures[future])
            finally:
                for future in futures:
                    future.cancel()


class DaskCluster:
    """The cells as tasks of a Dask ``distributed`` cluster: the scheduler at ``address``, or a local cluster of
    ``workers`` single-threaded processes."""

    def __init__(self, address: Optional[str], workers: int):
        self.address, self.workers = address, workers

    def run(self, tasks: Sequence[CellTask]) -> Iterator[tuple[CellTask, dict]]:
        from distributed import Client, LocalCluster
        from distributed import as_completed as completed

        with contextlib.ExitStack() as stack:
            if self.address is None:
                cluster = stack.enter_context(LocalCluster(
                    n_workers=self.workers, threads_per_worker=1, processes=True, dashboard_address=None,
                    silence_logs=logging.ERROR))
                client = stack.enter_context(Client(cluster))
                threads = threads_per_worker(self.workers)
            else:
                client = stack.enter_context(Client(self.address))
                self.workers = max(1, len(client.scheduler_info().get("workers", {})))
                threads = None  # the workers' machines are not this one
            futures = {client.submit(run_cell, replace(task, threads=threads), pure=False): task for task in tasks}
            for future in completed(futures):
                yield futures[future], _outcome(future, futures[future])


def make_executor(executor: str = "local", workers: int = 1, address: Optional[str] = None):
    """The executor of ``--executor``, ``--workers`` and ``--address``, checked before anything runs."""
    workers = positive_int("--workers", workers)
    if executor not in EXECUTORS:
        raise ValueError(f"--executor {executor}: choose one of {', '.join(EXECUTORS)}")
    if executor == "local":
        if address is not None:
            raise ValueError("--address names a Dask scheduler: pass --executor dask with it")
        return Serial() if workers == 1 else ProcessPool(workers)
    if importlib.util.find_spec("distributed") is None:
        raise ValueError("--executor dask needs Dask's distributed: pip install 'pyrobnn[cluster]'")
    return DaskCluster(address, workers)
