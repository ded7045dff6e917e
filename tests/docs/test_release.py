"""A release a user can install: ``python -m build`` makes an sdist and a wheel that pass ``twine check``; the wheel
(built from the sdist, so the sdist holds what the wheel needs) installs into a fresh virtual environment, where
``pyrobnn --version`` and the first tutorial run with no repository checkout, the data read from ``--data-root``.

The fresh environment does not download torch again: it is created without pip and without the system's
packages, the wheel is installed into it with ``--no-deps`` by this environment's pip, and one ``.pth`` line lets it
import the dependencies already installed here (torch, Pyro, ...). Nothing of the checkout is on its path: the
editable install of this environment is a finder that the ``.pth`` line does not run, and the commands run in an
empty folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.slow  # builds an sdist and a wheel, installs it in a fresh venv

TUTORIAL = ROOT / "docs" / "tutorials" / "01_first_bnn.py"

for module in ("build", "twine"):
    try:
        __import__(module)
    except ImportError:  # the docs extra: make venv installs them; CI must have them
        if os.environ.get("CI"):
            raise
        pytest.skip(f"{module} is not installed (pip install -e '.[docs]')", allow_module_level=True)


def run(argv, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kwargs)
    command = " ".join(map(str, argv))
    assert result.returncode == 0, f"{command} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return result


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """``python -m build``: the sdist, then the wheel built from it (no build isolation: setuptools is here)."""
    out = tmp_path_factory.mktemp("dist")
    source = tmp_path_factory.mktemp("checkout") / "pyrobnn"
    # a clean copy of the tracked files, as a fresh clone has them (no egg-info, no build/ of an earlier run)
    files = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT).stdout.split("\0")
    for name in filter(None, files):
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, target)
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, source], cwd=source)
    return out


def test_the_sdist_and_the_wheel_pass_twine_check(dist):
    sdists, wheels = list(dist.glob("pyrobnn-*.tar.gz")), list(dist.glob("pyrobnn-*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, list(dist.iterdir())
    run([sys.executable, "-m", "twine", "check", "--strict", *sdists, *wheels])


def test_the_wheel_holds_the_package_and_no_more(dist):
    import zipfile

    names = zipfile.ZipFile(next(dist.glob("*.whl"))).namelist()
    packages = {name.split("/")[0] for name in names}
    assert "pyrobnn" in packages and not packages & {"tests", "docs", "examples", "benchmarks", "studies"}, packages
    import pkgutil

    import pyrobnn

    for module in pkgutil.walk_packages(pyrobnn.__path__, "pyrobnn."):
        path = module.name.replace(".", "/")
        assert f"{path}.py" in names or f"{path}/__init__.py" in names, f"{module.name} is not in the wheel"


def test_the_wheel_installs_and_runs_without_the_checkout(dist, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, system_site_packages=False, symlinks=True).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # the dependencies installed here, importable there (after its own site-packages, so the wheel's pyrobnn wins)
    (purelib / "_pyrobnn_release_check_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = next(dist.glob("*.whl"))
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel])

    work = tmp_path / "empty"
    work.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYROBNN_DATA")}
    env.update(MPLBACKEND="Agg", PYROBNN_TUTORIAL_SIZE="ci")
    where = run([python, "-c", "import pyrobnn; print(pyrobnn.__file__)"], cwd=work, env=env).stdout.strip()
    assert where.startswith(str(purelib)), f"pyrobnn imported from {where}, not from the wheel"
    version = run([env_dir / "bin" / "pyrobnn", "--version"], cwd=work, env=env).stdout.strip()
    import pyrobnn

    assert version == f"pyrobnn {pyrobnn.__version__}"

    data_root = os.environ.get("PYROBNN_DATA")
    if not data_root or not (Path(data_root) / "MNIST").exists():
        if os.environ.get("CI"):
            pytest.fail("CI has no MNIST under $PYROBNN_DATA for the first tutorial")
        pytest.skip("no MNIST under $PYROBNN_DATA for the first tutorial")
    shutil.copy(TUTORIAL, work / TUTORIAL.name)
    out = run([python, TUTORIAL.name, "--data-root", data_root], cwd=work, env=env, timeout=600).stdout
    assert "test accuracy" in out, out
