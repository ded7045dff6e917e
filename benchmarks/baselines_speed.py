"""What SG-MCMC and SWAG cost per epoch against the MAP fit of the same network, side by side in one process.

The issue's goals: an SG-MCMC epoch (one gradient step per batch plus the sampler's noise, :mod:`pyrobnn.infer.sgmcmc`)
costs at most 1.2x a MAP epoch of the same network, and SWAG's collecting epochs (SGD plus one moment update per
epoch, :mod:`pyrobnn.infer.swag`) at most 1.1x SGD's epoch. Each run trains a :class:`~pyrobnn.guides.PointGuide`
with :func:`~pyrobnn.infer.svi.fit` for ``--epochs`` epochs on

- ``mnist``: the MLP 784-400-10 on 5,000 rows of MNIST's shape (random images: the cost does not depend on them),
  batches of 128 (40 steps an epoch);
- ``uci``: the MLP 13-50-1 on 455 rows (Boston's split), batches of 32 (15 steps an epoch);

each by the default executor (``compile="auto"``, what a user gets);

with these optimisers:

- ``map_sgd``: the MAP fit by SGD with Nesterov momentum (:class:`~pyrobnn.infer.optim.Optim`), the step SG-MCMC's is;
- ``map_adam``: the MAP fit by Adam (the ``map`` preset's optimiser);
- ``sgld``, ``sghmc``: the samplers with their noise at every step (no burn-in: every epoch keeps a draw);
- ``swag``: SWAG over ``map_sgd``'s optimiser, collecting after every epoch (``start=0``).

Every configuration runs ``--repeats`` times, interleaved (the load of a shared machine falls on all alike); an
epoch's time is what ``fit`` records (``seconds``: its steps, the collection included), the first epoch of each run
left out (its recordings). Reported: the median epoch per configuration and the ratios ``sgld``, ``sghmc`` over
``map_sgd`` and over ``map_adam``, and ``swag`` over ``map_sgd``.

    python benchmarks/baselines_speed.py [--device cpu] [--epochs 6] [--repeats 3] [--threads 2]

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import pyro
import torch

from pyrobnn import BayesianNetwork, PointGuide, fit
from pyrobnn.device import resolve_device
from pyrobnn.infer.optim import Optim
from pyrobnn.infer.sgmcmc import SGMCMCOptimizer
from pyrobnn.infer.swag import SWAGCollector
from pyrobnn.methods import METHODS
from pyrobnn.model.likelihoods import Gaussian
from pyrobnn.networks import MLP

PROBLEMS = {
    # name: (inputs, hidden, outputs, rows, batch, compile)
    "mnist": (784, 400, 10, 5000, 128, "auto"),
    "uci": (13, 50, 1, 455, 32, "auto"),
}

LR = {"map_sgd": 0.05, "map_adam": 1e-3, "sgld": 0.05, "sghmc": 0.01, "swag": 0.05}
"""Per-example rates (the presets' for MNIST)."""


def data(problem: str, device):
    inputs, _, outputs, rows, _, _ = PROBLEMS[problem]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, inputs, generator=generator)
    y = torch.randint(outputs, (rows,), generator=generator) if outputs > 1 else torch.randn(rows, 1,
                                                                                           generator=generator)
    return x.to(device), y.to(device)


def model_and_guide(problem: str):
    inputs, hidden, outputs, rows, _, _ = PROBLEMS[problem]
    likelihood = Gaussian(0.5) if outputs == 1 else None
    model = BayesianNetwork(MLP(inputs, (hidden,), outputs), likelihood, num_data=rows)
    return model, PointGuide(model)


def optimizer(name: str, problem: str, epochs: int):
    _, _, _, rows, batch, _ = PROBLEMS[problem]
    steps = math.ceil(rows / batch)
    if name == "map_sgd":
        return Optim("sgd", LR[name])
    if name == "map_adam":
        return Optim("adam", LR[name])
    if name == "swag":
        return SWAGCollector(start=0, rank=METHODS["swag"].rank, steps_per_epoch=steps,
                             optimizer=Optim("sgd", LR[name]))
    friction = 1.0 if name == "sgld" else 0.1
    return SGMCMCOptimizer(LR[name], friction=friction, temperature=1.0, cycles=0, exploration=0.0, epochs=epochs,
                           steps_per_epoch=steps)


def epoch_seconds(problem: str, name: str, epochs: int, device) -> list[float]:
    """The seconds of epochs 2.. of one run of ``name`` on ``problem``."""
    x, y = data(problem, device)
    pyro.set_rng_seed(0)
    model, guide = model_and_guide(problem)
    _, _, _, _, batch, compile = PROBLEMS[problem]
    history = fit(model, guide, x, y, epochs=epochs, batch_size=batch, optimizer=optimizer(name, problem, epochs),
                  compile=compile, device=device, progress=False)
    return [record["seconds"] for record in history.epochs[1:]]


def arguments(description: str) -> argparse.Namespace:
    """The options every benchmark of epochs side by side takes (``--device``, ``--epochs``, ``--repeats``,
    ``--threads``, ``--problems``), with the threads set."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def median_epochs(args, names, epoch_seconds) -> tuple[dict, float]:
    """``{problem: {name: median epoch seconds}}`` of ``epoch_seconds(problem, name, epochs, device)`` over
    ``--repeats`` interleaved runs (each configuration once per repeat: the load of a shared machine falls on all
    alike), and the run's header for the JSON; returns it and the start time."""
    device = resolve_device(args.device)
    tick = time.perf_counter()
    medians = {}
    for problem in args.problems:
        times: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(args.repeats):
            for name in names:
                times[name] += epoch_seconds(problem, name, args.epochs, device)
        medians[problem] = {name: statistics.median(values) for name, values in times.items()}
        print(f"{problem}: median epoch " + ", ".join(f"{name} {1e3 * value:.1f} ms"
                                                     for name, value in medians[problem].items()))
    header = {"device": str(device), "threads": torch.get_num_threads(), "epochs": args.epochs,
              "repeats": args.repeats, "torch": torch.__version__}
    return {**header, "medians": medians}, tick


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    result, tick = median_epochs(args, list(LR), epoch_seconds)
    for problem, median in result.pop("medians").items():
        ratios = {"sgld_over_map_sgd": median["sgld"] / median["map_sgd"],
                  "sghmc_over_map_sgd": median["sghmc"] / median["map_sgd"],
                  "sgld_over_map_adam": median["sgld"] / median["map_adam"],
                  "sghmc_over_map_adam": median["sghmc"] / median["map_adam"],
                  "swag_over_sgd": median["swag"] / median["map_sgd"]}
        result[problem] = {"median_epoch_s": median, "ratios": ratios}
        print(f"{problem}: " + ", ".join(f"{name} {value:.3f}" for name, value in ratios.items()))
    result["seconds"] = time.perf_counter() - tick
    print(json.dumps(result))


if __name__ == "__main__":
    main()
