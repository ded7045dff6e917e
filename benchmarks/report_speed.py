"""The test report's cost: the posterior predictive of a convolutional network drawn vectorized (local
reparameterization, S particles a pass) against looped (one sampled weight a pass), side by side in one process.

ResNet-18 at width 0.25 (CIFAR stem) under a ``NormalGuide``, ``--samples`` draws of ``--inputs`` CIFAR-shaped
inputs, ``--repeats`` interleaved repeats (the fastest of each is reported):

    python benchmarks/report_speed.py [--samples 10] [--inputs 500] [--repeats 2] [--threads 2]

The last line is a JSON object: seconds per predictive of each path and their ratio."""

from __future__ import annotations

import argparse
import json
import time

import pyro
import torch

from pyrobnn import BayesianNetwork, NormalGuide
from pyrobnn.infer.predict import predictive_outputs
from pyrobnn.networks import build_net


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--inputs", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = BayesianNetwork(build_net("resnet18", (3, 32, 32), 10, width=0.25), num_data=1000).eval()
    guide = NormalGuide(model)
    x = torch.rand(args.inputs, 3, 32, 32)
    guide(x[:2])
    seconds: dict[str, list[float]] = {"vectorized": [], "loop": []}
    for _ in range(args.repeats):
        for path in seconds:
            pyro.set_rng_seed(0)
            start = time.perf_counter()
            predictive_outputs(model, guide, x, num_samples=args.samples, vectorized=path == "vectorized")
            seconds[path].append(time.perf_counter() - start)
    best = {path: round(min(values), 2) for path, values in seconds.items()}
    print(json.dumps({"samples": args.samples, "inputs": args.inputs, "seconds": best,
                      "vectorized_over_loop": round(best["vectorized"] / best["loop"], 2)}))


if __name__ == "__main__":
    main()
