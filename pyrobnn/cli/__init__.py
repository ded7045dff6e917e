"""``pyrobnn`` command line (tyro): one module per command, ``train`` a Bayesian network, ``evaluate`` or
``prune`` a checkpoint, sample a small network's exact posterior with NUTS (``mcmc``).

    pyrobnn train --dataset mnist --train-size 5000 --epochs 3 --out runs/demo
    pyrobnn evaluate --checkpoint runs/demo/checkpoint.pt --json runs/demo/eval.json
    pyrobnn prune --checkpoint runs/demo/checkpoint.pt --method snr
    pyrobnn mcmc --dataset two-moons --hidden 16 --num-samples 500 --warmup 500 --num-chains 2 --out runs/nuts
    pyrobnn evaluate --checkpoint runs/nuts/draws.pt
    pyrobnn --version

The package: :mod:`~pyrobnn.cli.options` (the options as dataclasses), :mod:`~pyrobnn.cli.build` (names to
objects, and the checks that need them), :mod:`~pyrobnn.cli.runs` (data, restore, resume),
:mod:`~pyrobnn.cli.report` (what a person reads), and one module per command.

Every run is validated (options, output directory, a resumed checkpoint) before anything
is trained or written; outputs are written atomically (:func:`pyrobnn.files.atomic_write`).
An error is one line ``error: ...`` on stderr and exit status 2; a diverged training run
exits with status 1 and keeps its last good checkpoint. The same ``--seed`` gives the same
numbers: it seeds the data subsets, the weight initialisation, training, and the
Monte-Carlo test report (for ``mcmc``: the generated data, the initial weights and the chains).
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from typing import Optional

import tyro

from pyrobnn._version import __version__
from pyrobnn.checks import one_line
from pyrobnn.cli.evaluate import Evaluate, evaluate
from pyrobnn.cli.mcmc import SamplingFailed, mcmc
from pyrobnn.cli.options import MCMCConfig, RunConfig
from pyrobnn.cli.prune import Prune, prune
from pyrobnn.cli.report import error_line
from pyrobnn.cli.train import train
from pyrobnn.infer.svi import TrainingDiverged

__all__ = ["main", "train", "evaluate", "prune", "mcmc", "Evaluate", "Prune"]

_COMMANDS = {"train": (RunConfig, train), "evaluate": (Evaluate, evaluate), "prune": (Prune, prune),
             "mcmc": (MCMCConfig, mcmc)}


_DESCRIPTION = ("Bayesian neural networks on Pyro: train with SVI, evaluate and prune with calibrated uncertainty, "
                "sample small networks exactly with NUTS. "
                "`pyrobnn --version` prints the version.")


def _flatten_tyro_message(text: str) -> str:
    """tyro's boxed parse error as one line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("╭")]  # the title: repeated below
    return one_line(re.sub(r"[╭╮╰╯│─]+", " ", "\n".join(lines)))


def _parse(argv: list[str]):
    """tyro's parse; when stderr is not a terminal, a parse error becomes one ``error:`` line."""

    def parse():
        return tyro.extras.subcommand_cli_from_dict({name: cls for name, (cls, _) in _COMMANDS.items()},
                                                    args=argv, prog="pyrobnn", description=_DESCRIPTION)

    if sys.stderr.isatty():
        return parse()
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            args = parse()
    except SystemExit as exit_:
        if exit_.code not in (0, None) and captured.getvalue().strip():
            error_line(_flatten_tyro_message(captured.getvalue()))
            raise SystemExit(exit_.code) from None
        sys.stderr.write(captured.getvalue())
        raise
    except BaseException:
        sys.stderr.write(captured.getvalue())
        raise
    sys.stderr.write(captured.getvalue())  # warnings, if any
    return args


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point of the ``pyrobnn`` console script and ``python -m pyrobnn``."""

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--version"], ["-V"]):
        print(f"pyrobnn {__version__}")
        return
    args = _parse(argv)
    run = next(command for cls, command in _COMMANDS.values() if isinstance(args, cls))
    try:
        run(args)
    except TrainingDiverged as error:
        error_line(f"training diverged: {error}")
        raise SystemExit(1) from None
    except SamplingFailed as error:
        error_line(f"NUTS failed: {error}")
        raise SystemExit(1) from None
    except (ValueError, TypeError, OSError) as error:
        error_line(str(error))
        raise SystemExit(2) from None
