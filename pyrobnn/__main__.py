"""``python -m pyrobnn`` and the ``pyrobnn`` console script: the command line's commands (:data:`pyrobnn.cli.COMMANDS`)
and the studies' (``pyrobnn study``), which sit a layer above it."""

from __future__ import annotations

from typing import Optional

from pyrobnn.cli import COMMANDS
from pyrobnn.cli import main as run_command
from pyrobnn.studies.command import STUDY

__all__ = ["main", "ALL_COMMANDS"]

ALL_COMMANDS = {**COMMANDS, "study": STUDY}
"""Every ``pyrobnn`` subcommand."""


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point of the ``pyrobnn`` console script and ``python -m pyrobnn``."""
    run_command(argv, ALL_COMMANDS)


if __name__ == "__main__":
    main()
