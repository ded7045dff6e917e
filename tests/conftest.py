"""Shared fixtures: the data root of the real benchmarks and a deterministic Pyro state per test."""

from __future__ import annotations

import os
from pathlib import Path

import pyro
import pytest
import torch

# The test machine is small and shared: intra-op threads only contend there (a 2-thread
# matmul of a tiny network is ~100x slower than a 1-thread one under load), so one thread unless
# PYROBNN_TEST_THREADS says otherwise: CI runs the tests marked ``recorded`` a second time at another
# thread count (a cheap stand-in for another machine's floats), `make test-threads`.
_THREADS = os.environ.get("PYROBNN_TEST_THREADS", "1")
if not _THREADS.isdigit() or int(_THREADS) < 1:
    raise ValueError(f"PYROBNN_TEST_THREADS={_THREADS!r}: give a positive number of torch threads (default 1)")
torch.set_num_threads(int(_THREADS))


def _data_root() -> Path:
    env = os.environ.get("PYROBNN_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def data_root() -> Path:
    """Directory holding MNIST/raw etc.: $PYROBNN_DATA, else ../shared/data next to the checkout."""
    root = _data_root()
    if not root.is_dir():
        pytest.skip(f"data root {root} not found (set PYROBNN_DATA to a directory with MNIST/raw)")
    return root


@pytest.fixture(autouse=True)
def _fresh_pyro_state():
    """Every test starts from an empty parameter store and the same seed."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    yield
    pyro.clear_param_store()


@pytest.fixture
def forbid_test_split(monkeypatch):
    """Make reading any UCI test split raise; returns the list of ``(part, split)`` reads seen, so a test can
    check that a hyper-parameter search read only its training split. ``monkeypatch.undo()`` lifts it."""
    from pyrobnn.data import uci

    read, original_rows = [], uci._rows

    def watched(where, part, split, n):
        read.append((part, split))
        if part == "test":
            raise AssertionError("a hyper-parameter search read the test split")
        return original_rows(where, part, split, n)

    monkeypatch.setattr(uci, "_rows", watched)
    return read
