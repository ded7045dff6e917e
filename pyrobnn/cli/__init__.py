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
import warnings
from typing import Any, Callable, NamedTuple, Optional, TypeVar

import tyro

from pyrobnn._version import __version__
from pyrobnn.checks import one_line
from pyrobnn.cli.evaluate import Evaluate, evaluate
from pyrobnn.cli.mcmc import SamplingFailed, mcmc
from pyrobnn.cli.methods import expand_method, spelled
from pyrobnn.cli.options import MCMCConfig, RunConfig
from pyrobnn.cli.prune import Prune, prune
from pyrobnn.cli.report import error_line, one_line_warnings, warn
from pyrobnn.cli.train import train
from pyrobnn.infer.recording import ExecutorFailed
from pyrobnn.infer.svi import TrainingDiverged
from pyrobnn.methods import Refused
from pyrobnn.networks.hf import PretrainedLoadWarning

__all__ = ["main", "train", "evaluate", "prune", "mcmc", "Evaluate", "Prune", "Command", "COMMANDS", "parse_config",
           "tyro_parse"]

T = TypeVar("T")


class Command(NamedTuple):
    """A subcommand: the dataclass tyro parses (and ``pyrobnn --help`` lists), the function that runs it, and,
    for a command that reads its own arguments (``pyrobnn study`` passes unknown ones on to its cells), its parser
    ``argv -> options``."""

    options: type
    run: Callable[[Any], Any]
    parse: Optional[Callable[[list[str]], Any]] = None


COMMANDS: dict[str, Command] = {"train": Command(RunConfig, train), "evaluate": Command(Evaluate, evaluate),
                                "prune": Command(Prune, prune), "mcmc": Command(MCMCConfig, mcmc)}
"""The commands of this package; ``pyrobnn/__main__.py`` adds those of the layers above (``study``)."""


_DESCRIPTION = ("Bayesian neural networks on Pyro: train with SVI, evaluate and prune with calibrated uncertainty, "
                "sample small networks exactly with NUTS. "
                "`pyrobnn --version` prints the version.")


def _flatten_tyro_message(text: str) -> str:
    """tyro's boxed parse error as one line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("╭")]  # the title: repeated below
    return one_line(re.sub(r"[╭╮╰╯│─]+", " ", "\n".join(lines)))


def _parse(argv: list[str], commands: Optional[dict[str, Command]] = None):
    """tyro's parse of a subcommand; when stderr is not a terminal, a parse error becomes one ``error:`` line."""
    commands = COMMANDS if commands is None else commands
    return tyro_parse(lambda: tyro.extras.subcommand_cli_from_dict(
        {name: command.options for name, command in commands.items()}, args=argv, prog="pyrobnn",
        description=_DESCRIPTION))


def parse_config(cls: type[T], argv: list[str], prog: str) -> T:
    """``cls`` parsed by tyro from ``argv``, as ``prog`` would parse it; a parse error is a :class:`ValueError`
    holding tyro's message on one line (a study checks every cell's command line this way before it runs any)."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return tyro.cli(cls, args=argv, prog=prog)
    except SystemExit:
        raise ValueError(_flatten_tyro_message(captured.getvalue()) or f"{prog}: cannot parse {argv}") from None


def tyro_parse(parse: Callable[[], T]) -> T:
    """``parse()``, a tyro parse; when stderr is not a terminal, a parse error becomes one ``error:`` line."""
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


def _expanded(argv: list[str]) -> list[str]:
    """:func:`~pyrobnn.cli.methods.expand_method` of ``argv``, a deprecated option it meets (a former selector flag)
    said as one ``warning:`` line (a ``DeprecationWarning`` too, for Python callers that turn them into errors)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        argv = expand_method(argv)
    for warning in caught:
        if issubclass(warning.category, DeprecationWarning):
            warn(str(warning.message))
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return argv


def main(argv: Optional[list[str]] = None, commands: Optional[dict[str, Command]] = None) -> None:
    """Run one of ``commands`` on ``argv``: :data:`COMMANDS` by default; the ``pyrobnn`` console script and
    ``python -m pyrobnn`` (:func:`pyrobnn.__main__.main`) pass them all, ``study`` included."""

    argv = list(sys.argv[1:] if argv is None else argv)
    commands = COMMANDS if commands is None else commands
    if argv[:1] in (["--version"], ["-V"]):
        print(f"pyrobnn {__version__}")
        return
    own = commands.get(argv[0]) if argv else None
    try:
        if own is not None and own.parse is not None:  # a command that reads its own arguments
            args, run = own.parse(argv[1:]), own.run
        else:
            args = _parse(_expanded(argv), commands)  # --method NAME: its preset's options before the user's
            run = next(command.run for command in commands.values() if isinstance(args, command.options))
        with one_line_warnings((PretrainedLoadWarning,)):
            run(args)
    except TrainingDiverged as error:
        error_line(f"training diverged: {error}")
        raise SystemExit(1) from None
    except SamplingFailed as error:
        error_line(f"NUTS failed: {error}")
        raise SystemExit(1) from None
    except Refused as refusal:  # what a method refuses, in the command's options
        error_line(spelled(refusal, argv[0] if argv[0] in ("train", "mcmc") else "train"))
        raise SystemExit(2) from None
    except ExecutorFailed as error:  # an explicit --compile that cannot run this model: before anything is written
        error_line(re.sub(r"compile='(\w+)'", r"--compile \1", one_line(error)))
        raise SystemExit(2) from None
    except (ValueError, TypeError, OSError) as error:
        error_line(str(error))
        raise SystemExit(2) from None
