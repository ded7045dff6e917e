"""``python -m pyrobnn``: the same as the ``pyrobnn`` console script."""

from .cli import main

main()
