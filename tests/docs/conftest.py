"""The documentation site at its CI size, built once per test session for every test that reads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT


def sphinx_build(out: Path, *extra: str) -> subprocess.CompletedProcess:
    """``make docs-ci`` into ``out``: warnings are errors, the tutorials run at their CI size."""
    env = {**os.environ, "PYROBNN_TUTORIAL_SIZE": "ci", "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-n", "-W", "--keep-going", "-E", "-q",
                           *extra, str(ROOT / "docs"), str(out)], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=1500)


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The site at its CI size: ``PYROBNN_DOCS_BUILT=DIR`` reuses one built by ``make docs-ci``."""
    built = os.environ.get("PYROBNN_DOCS_BUILT")
    if built:
        return Path(built)
    out = tmp_path_factory.mktemp("site")
    result = sphinx_build(out)
    assert result.returncode == 0, f"sphinx-build failed:\n{result.stderr[-6000:]}"
    (out / "build-stderr.txt").write_text(result.stderr)
    return out
