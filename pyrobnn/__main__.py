"""``python -m pyrobnn``: the same as the ``pyrobnn`` console script."""

from pyrobnn.cli import main

main()
