"""The version of pyrobnn (one place: the package face and the command line read it)."""

__version__ = "0.1.0"
