"""Cost of VDP++ training against deterministic and Bayes-by-Backprop training (VDP++, IEEE Access 2024, Fig. 1).

VDP++ is the variance-only density propagation of "Efficient Scaling of Bayesian Neural Networks"
(IEEE Access 2024); Bayes by Backprop is weight sampling (Blundell et al. 2015).
LeNet-5 on 28x28 inputs, batch 512 (the paper's setting), one Adam step of each method
measured side by side (:func:`pyrobnn.analysis.cost.compare_training_cost`): milliseconds per step and
per 60k-image epoch, and the peak memory a step allocates beyond the set-up (CPU: peak size of
live tensors; CUDA: ``max_memory_allocated``). VDP++ runs with one variance per weight and with
one per output unit (eq. 12). CPU always, CUDA when present.

    python benchmarks/vdp_cost.py

The last line is one JSON object; its top level holds ``vdp_time_ratio`` and ``vdp_memory_ratio``
(per-weight variances, CPU) and ``vdp_row_time_ratio`` / ``vdp_row_memory_ratio``.
"""

from __future__ import annotations

import argparse
import json

import pyro
import torch
from rich.console import Console

from pyrobnn.analysis.cost import compare_training_cost, cost_table
from pyrobnn.networks import LeNet5

METHODS = {"det": ("det", "weight"), "bbb": ("sample", "weight"), "vdp": ("vdp", "weight"), "vdp_row": ("vdp", "row")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pyro.enable_validation(False)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    result = {"threads": args.threads, "batch_size": args.batch_size}
    for device in devices:
        cost = compare_training_cost(LeNet5(1, 10), (1, 28, 28), 10, METHODS, args.batch_size, device=device,
                                     rounds=args.rounds, repeats=args.repeats)
        Console().print(cost_table(f"{device}: LeNet-5, batch {args.batch_size}", cost))
        result[device] = {label: {k: round(v, 3) for k, v in c.items()} for label, c in cost.items()}
    for label in ("vdp", "vdp_row"):
        result[f"{label}_time_ratio"] = result["cpu"][label]["time_ratio"]
        result[f"{label}_memory_ratio"] = result["cpu"][label]["memory_ratio"]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
