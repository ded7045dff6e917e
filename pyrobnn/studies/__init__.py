"""Studies: a base ``pyrobnn train`` run crossed with axes (guide, prior, estimator, width, method, ...) and seeds
or splits, each cell a cached ``pyrobnn train`` run, spread over local processes or a Dask cluster, and reported
with mean ± standard error and paired differences to a baseline.

:mod:`~pyrobnn.studies.spec` (:class:`Study`: Python, TOML, command line), :mod:`~pyrobnn.studies.cells` (a cell's
command line, configuration and cache key), :mod:`~pyrobnn.studies.cache` (the study's folder),
:mod:`~pyrobnn.studies.executors` (serial, process pool, Dask), :mod:`~pyrobnn.studies.progress`,
:mod:`~pyrobnn.studies.runner` (:func:`run_study`, :func:`rebuild_report`), :mod:`~pyrobnn.studies.baseline`
(a label, or some axes' values matched within the others), :mod:`~pyrobnn.studies.aggregate` and
:mod:`~pyrobnn.studies.report` (the summary), :mod:`~pyrobnn.studies.command` (``pyrobnn study``).
"""

from pyrobnn.studies.cells import Cell
from pyrobnn.studies.report import write_report
from pyrobnn.studies.runner import rebuild_report, run_study
from pyrobnn.studies.spec import Study, load_study

__all__ = ["Study", "Cell", "load_study", "run_study", "rebuild_report", "write_report"]
