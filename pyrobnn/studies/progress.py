"""A study's progress: cells done, running and failed, and the time left (a rich progress bar at a terminal), and
one line per finished cell."""

from __future__ import annotations

from typing import Optional, Sequence

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from pyrobnn.studies.cells import Cell

__all__ = ["StudyProgress", "cell_name"]


def cell_name(cell: Cell) -> str:
    """``"guide=normal estimator=local seed 1"``: the label and the replicate."""
    replicate = [f"{name} {value}" for name, value in (("seed", cell.seed), ("split", cell.split))
                 if value is not None]
    return " ".join([cell.label, *replicate])


class StudyProgress:
    """Counts the cells a study runs as they finish; a live bar (done / total, running, failed, time left) when
    ``live``, a line per finished cell in any case.

    :param executor: what runs the cells; its ``workers`` is how many run at once.
    """

    def __init__(self, total: int, executor, console: Console, live: bool):
        self.total, self.executor, self.console = total, executor, console
        self.done = self.failed = 0
        self._bar: Optional[Progress] = None
        if live and total:
            self._bar = Progress(TextColumn("cells"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[state]}"), TimeElapsedColumn(),
                                 TextColumn("left"), TimeRemainingColumn(), console=console,
                                 redirect_stdout=False, redirect_stderr=False)
            self._task = self._bar.add_task("cells", total=total, state=self._state())

    def _state(self) -> str:
        running = min(getattr(self.executor, "workers", 1), self.total - self.done)
        return f"running {running}  failed {self.failed}"

    def __enter__(self) -> "StudyProgress":
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def finished(self, cells: Sequence[Cell], outcome: dict) -> None:
        """One run has finished (several cells when they share a configuration): count it and print its line."""
        self.done += 1
        failed = outcome.get("status") != "done"
        self.failed += failed
        seconds = outcome.get("seconds")
        line = (f"[{self.done}/{self.total}] {'failed' if failed else 'done'} "
                + ", ".join(cell_name(cell) for cell in cells)
                + (f" ({seconds:.1f} s)" if isinstance(seconds, (int, float)) else "")
                + (f": {outcome.get('error')}" if failed else ""))
        self.console.print(escape(line), soft_wrap=True, highlight=False)
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, state=self._state())
