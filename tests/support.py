"""What many test modules share: the repository's root, the command line run in-process, its one-line errors, and a
toy problem's options."""

from __future__ import annotations

from pathlib import Path

from pyrobnn.cli import main

ROOT = Path(__file__).resolve().parents[1]
"""The repository's root (``pyrobnn/``, ``benchmarks/``, ``docs/``, ``examples/``, ``studies/``)."""


def run_cli(argv):
    """main(argv), returning the SystemExit code (0 when it returns normally)."""
    try:
        main([str(a) for a in argv])
    except SystemExit as exit_:
        return exit_.code
    return 0


def error_line(capsys) -> str:
    """The captured stderr, which must be exactly one line ``error: ...``; returns it."""
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


MOONS = ["--dataset", "two-moons", "--train-size", 100, "--test-size", 100, "--hidden", 8, "--batch-size", 50,
         "--num-samples", 5, "--no-progress"]


def nuts(**options) -> dict:
    """The keyword arguments of :func:`~pyrobnn.infer.mcmc.sample_posterior`: the sampler's settings of
    ``METHODS["nuts"]`` (the one statement of them), with ``options`` (any of its arguments) over them."""
    from pyrobnn.methods import METHODS

    method = METHODS["nuts"]
    settings = ("num_samples", "warmup", "num_chains", "init_jitter", "target_accept", "max_tree_depth", "sampler",
                "map_steps")
    return {**{name: getattr(method, name) for name in settings}, **options}


def _adapter_methods() -> frozenset[str]:
    from pyrobnn.methods import METHODS
    from pyrobnn.methods.lora import LaplaceLoRA

    return frozenset(name for name, method in METHODS.items()
                     if method.sites is not None or isinstance(method, LaplaceLoRA))


ADAPTER_METHODS = _adapter_methods()
"""The registry's methods of a pretrained network's LoRA adapters (BLoB's Gaussian on the A matrices, Laplace-LoRA's
approximation of the adapters), which a small network built here does not have: tests/networks/ and
tests/methods/test_lora.py run them."""
