"""Time one training step of Bayes by Backprop against the same network trained deterministically.

784-400-10 ReLU MLP, batch 128, Adam. Measured side by side in one run: the
methods are timed in interleaved rounds (each round times every method for
``--steps`` steps) and each figure is the median over rounds, so machine load
affects all of them alike. Methods:

- ``det``: plain PyTorch, cross-entropy, the same Adam as the training loop
  (:func:`pyrobnn.train.make_optimizer`: fused where supported);
- ``bbb``: pyrobnn ``NormalGuide`` with a Gaussian N(0, 1) prior (analytic KL), one
  sample per step, through :func:`pyrobnn.train.svi_step` (the training loop's step);
- ``bbb_mixture``: the same with Blundell's scale-mixture prior (Monte-Carlo KL);
- ``autonormal``: Pyro's stock ``AutoNormal`` + ``TraceMeanField_ELBO`` + ``pyro.optim.Adam``
  on the same model, for reference.

The last line is one JSON object; its top level holds the CPU figures
``{"det_ms", "bbb_ms", "ratio", ...}`` (ratio = bbb_ms / det_ms), and ``"cuda"``
holds the same figures when a GPU is present.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import pyro
import torch
import torch.nn.functional as F

from pyrobnn import BayesianNetwork, GaussianPrior, NormalGuide, ScaleMixturePrior
from pyrobnn.models import MLP
from pyrobnn.train import make_optimizer, svi_step


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def steppers(device, hidden=400, batch=128, num_data=60000):
    """One closure per method, each performing a single optimisation step on a fixed batch."""
    torch.manual_seed(0)
    x = torch.rand(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    net = MLP(784, (hidden,), 10).to(device)

    det = copy.deepcopy(net)
    det_opt = make_optimizer(det.parameters())

    def det_step():
        loss = F.cross_entropy(det(x), y)
        det_opt.zero_grad(set_to_none=True)
        loss.backward()
        det_opt.step()

    def bbb(prior):
        model = BayesianNetwork(copy.deepcopy(net), prior=prior, num_data=num_data).to(device)
        guide = NormalGuide(model).to(device)
        opt = make_optimizer(guide.parameters())
        return lambda: svi_step(model, guide, opt, x, y)

    pyro.clear_param_store()
    auto_model = BayesianNetwork(copy.deepcopy(net), prior=GaussianPrior(), num_data=num_data).to(device)
    auto_guide = pyro.infer.autoguide.AutoNormal(auto_model)
    svi = pyro.infer.SVI(auto_model, auto_guide, pyro.optim.Adam({"lr": 1e-3}), pyro.infer.TraceMeanField_ELBO())

    return {
        "det": det_step,
        "bbb": bbb(GaussianPrior()),
        "bbb_mixture": bbb(ScaleMixturePrior()),
        "autonormal": lambda: svi.step(x, y),
    }


def measure(device, rounds: int, steps: int) -> dict[str, float]:
    """Median ms/step of each method over interleaved rounds."""
    methods = steppers(device)
    times = {name: [] for name in methods}
    with pyro.validation_enabled(False):
        for step in methods.values():  # warm-up
            for _ in range(5):
                step()
        for _ in range(rounds):
            for name, step in methods.items():
                _sync(device)
                tick = time.perf_counter()
                for _ in range(steps):
                    step()
                _sync(device)
                times[name].append((time.perf_counter() - tick) / steps * 1e3)
    ms = {f"{name}_ms": round(statistics.median(t), 3) for name, t in times.items()}
    ms["ratio"] = round(ms["bbb_ms"] / ms["det_ms"], 2)
    ms["mixture_ratio"] = round(ms["bbb_mixture_ms"] / ms["det_ms"], 2)
    ms["autonormal_ratio"] = round(ms["autonormal_ms"] / ms["det_ms"], 2)
    return ms


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds")
    parser.add_argument("--steps", type=int, default=20, help="steps per method per round")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (torch.set_num_threads)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = measure(torch.device("cpu"), args.rounds, args.steps)
    result["threads"] = args.threads
    if torch.cuda.is_available():
        result["cuda"] = measure(torch.device("cuda"), args.rounds, args.steps)
    from rich.console import Console
    from rich.table import Table

    table = Table(title="ms per training step, 784-400-10 MLP, batch 128 (median of interleaved rounds)")
    table.add_column("device")
    for name in ("det", "bbb", "bbb_mixture", "autonormal"):
        table.add_column(name, justify="right")
    table.add_column("bbb / det", justify="right")
    for device, figures in (("cpu", result), ("cuda", result.get("cuda"))):
        if figures:
            table.add_row(device, *(f"{figures[f'{n}_ms']:.2f}" for n in ("det", "bbb", "bbb_mixture", "autonormal")),
                          f"{figures['ratio']:.2f}x")
    Console().print(table)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
