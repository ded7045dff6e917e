"""The examples in the docstrings of the main entries run as written and print what they show (doctest).

Each entry a reader starts from has an example (tiny data, an epoch or a few, fixed seeds) whose printed values
are checked: shapes, site names, identities between the entries (an accuracy is that of the predictive mean of
the same draws), not timings.
"""

from __future__ import annotations

import doctest
import io
from contextlib import redirect_stdout

import pytest

import pyrobnn
from pyrobnn.handlers import flipout, local_reparameterization, vdp
from pyrobnn.methods import Method
from pyrobnn.studies import Study

ENTRIES = {
    "pyrobnn.BayesianNetwork": pyrobnn.BayesianNetwork,
    "pyrobnn.NormalGuide": pyrobnn.NormalGuide,
    "pyrobnn.fit": pyrobnn.fit,
    "pyrobnn.predict": pyrobnn.predict,
    "pyrobnn.evaluate": pyrobnn.evaluate,
    "pyrobnn.sample_posterior": pyrobnn.sample_posterior,
    "pyrobnn.MeanFieldELBO": pyrobnn.MeanFieldELBO,
    "pyrobnn.studies.Study": Study,
    "pyrobnn.flipout": flipout,
    "pyrobnn.local_reparameterization": local_reparameterization,
    "pyrobnn.vdp": vdp,
    "pyrobnn.methods.Method.fit": Method.fit,
}
"""The main entries of the API, each with an example in its own docstring."""


def examples(name: str) -> list[doctest.DocTest]:
    """The doctests of the docstring of ``ENTRIES[name]`` itself (not of its members)."""
    finder = doctest.DocTestFinder(recurse=False, exclude_empty=True)
    return [test for test in finder.find(ENTRIES[name], name, globs={}) if test.examples]


@pytest.mark.parametrize("name", ENTRIES)
def test_the_example_of_each_main_entry_runs(name):
    tests = examples(name)
    assert tests, f"{name} has no example in its docstring"
    assert sum(example.want.strip() != "" for test in tests for example in test.examples) >= 1, \
        f"{name}: the example prints nothing to check"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = io.StringIO()
    with redirect_stdout(report):
        for test in tests:
            runner.run(test, out=report.write)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0 and result.failed == 0, report.getvalue()[-4000:]
