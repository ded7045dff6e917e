"""Your own Pyro model against the same network as a ``BayesianNetwork``: the training step's time, side by side.

The model is the README's ("Your own Pyro model", :class:`pyrobnn.networks.PyroBNN`): ``PyroModule[nn.Linear]``
layers 1-H-1 (ReLU) whose weights and biases are ``PyroSample(Normal(0, 1))`` priors, a noise scale ``sigma ~
LogNormal(-1, 0.5)`` and ``obs`` under ``pyro.plate("data", ...)``, read by tracing
(:class:`~pyrobnn.model.TracedModel`). The reference is the same 1-H-1 ReLU network as ``BayesianNetwork(net,
Gaussian(0.3), prior=GaussianPrior(0, 1))`` (its noise a fixed number: a ``BayesianNetwork`` has no latent noise
scale, so the hand-written model does one site's work more). Both train with :func:`~pyrobnn.infer.svi.fit` under
``NormalGuide`` and ``estimator="local"`` (local reparameterization), batch 64, on y = sin(2x) + noise, 2,048
points.

The two run in one process, alternately, ``--rounds`` times after one warm-up epoch each; each round times
``--epochs`` epochs of each (process CPU time, which another process on the machine disturbs less than wall time).
The figure is the median ms per step of each and their ratio (the issue's goal: at most 1.2).

    python benchmarks/pyro_model.py [--hidden 32] [--rounds 9] [--epochs 2] [--threads 2]

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import pyro
import torch
from torch import nn

from pyrobnn import BayesianNetwork, Gaussian, GaussianPrior, NormalGuide, fit
from pyrobnn.infer.elbo import MeanFieldELBO
from pyrobnn.networks import PyroBNN

ROWS, BATCH = 2048, 64


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pyro.set_rng_seed(0)
    x = torch.linspace(-2, 2, ROWS)[:, None]
    y = torch.sin(2 * x[:, 0]) + 0.2 * torch.randn(ROWS)
    net = nn.Sequential(nn.Linear(1, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 1))
    runs = {"bayesian_network": (BayesianNetwork(net, Gaussian(0.3), prior=GaussianPrior(0.0, 1.0)), y[:, None]),
            "pyro_model": (PyroBNN(args.hidden), y)}
    runs = {name: (model, NormalGuide(model, name=name), target) for name, (model, target) in runs.items()}
    steps = args.epochs * (ROWS // BATCH)
    ms = {name: [] for name in runs}
    tick = time.perf_counter()
    for name, (model, guide, target) in runs.items():  # warm-up: traces the model, makes the guide's parameters
        fit(model, guide, x, target, epochs=1, batch_size=BATCH, elbo=MeanFieldELBO(estimator="local"), progress=False)
    for _ in range(args.rounds):
        for name, (model, guide, target) in runs.items():
            start = time.process_time()
            fit(model, guide, x, target, epochs=args.epochs, batch_size=BATCH, elbo=MeanFieldELBO(estimator="local"),
                progress=False)
            ms[name].append((time.process_time() - start) / steps * 1e3)
    median = {name: statistics.median(values) for name, values in ms.items()}
    result = {"hidden": args.hidden, "threads": args.threads, "rounds": args.rounds, "steps_per_round": steps,
              "ms_per_step": median, "ratio": median["pyro_model"] / median["bayesian_network"],
              "all_ms_per_step": {name: [round(v, 3) for v in values] for name, values in ms.items()},
              "wall_s": time.perf_counter() - tick}
    print(f"BayesianNetwork {median['bayesian_network']:.2f} ms/step, your Pyro model "
          f"{median['pyro_model']:.2f} ms/step: {result['ratio']:.2f}x")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
