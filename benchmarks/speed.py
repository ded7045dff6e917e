"""Time one Bayes-by-Backprop (Blundell et al. 2015) training step against the same network trained deterministically.

784-400-10 ReLU MLP, batch 128, Adam. Measured side by side in one run: the
methods are timed in interleaved rounds (each round times every method for
``--steps`` steps) and each figure is the median over rounds, so machine load
affects all of them alike. Methods:

- ``det``: plain PyTorch, cross-entropy, the same Adam as the training loop
  (:func:`pyrobnn.analysis.cost.training_step`; :func:`pyrobnn.infer.optim.make_optimizer`: fused where supported);
- ``bbb``: pyrobnn ``NormalGuide`` with a Gaussian N(0, 1) prior (analytic KL), one
  sample per step, through :func:`pyrobnn.infer.svi.svi_step` (the training loop's step) under the
  ``"sample"`` estimator of :data:`pyrobnn.handlers.ESTIMATORS`;
- ``bbb_mixture``: the same with Blundell's scale-mixture prior (Monte-Carlo KL);
- ``autonormal``: Pyro's stock ``AutoNormal`` + ``TraceMeanField_ELBO`` + ``pyro.optim.Adam``
  on the same model, for reference;
- ``torch_bbb``: the floor of the method, no Pyro: the same Bayes-by-Backprop step written by hand
  in plain PyTorch (softplus scales, one weight sample, closed-form Gaussian KL, fused Adam);
- ``weight_noise``: drawing the N(0, 1) noise of one weight sample alone (``torch.randn`` for every
  weight), the part of a weight-sampling step no implementation avoids.

The last line is one JSON object; its top level holds the CPU figures
``{"det_ms", "bbb_ms", "ratio", ...}`` (ratio = bbb_ms / det_ms), and ``"cuda"``
holds the same figures when a GPU is present.
"""

from __future__ import annotations

import argparse
import copy
import json

import pyro
import torch

from pyrobnn import BayesianNetwork, GaussianPrior, ScaleMixturePrior
from pyrobnn.analysis.cost import time_steps, training_step
from pyrobnn.infer.optim import make_optimizer
from pyrobnn.networks import MLP


def steppers(device, hidden=400, batch=128, num_data=60000):
    """One closure per method, each performing a single optimisation step on a fixed batch."""
    torch.manual_seed(0)
    x = torch.rand(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    net = MLP(784, (hidden,), 10)

    pyro.clear_param_store()
    auto_model = BayesianNetwork(copy.deepcopy(net), prior=GaussianPrior(), num_data=num_data).to(device)
    auto_guide = pyro.infer.autoguide.AutoNormal(auto_model)
    svi = pyro.infer.SVI(auto_model, auto_guide, pyro.optim.Adam({"lr": 1e-3}), pyro.infer.TraceMeanField_ELBO())

    return {
        "det": training_step(net, x, y, "det"),
        "torch_bbb": _torch_bbb_step(net, x, y, num_data),
        "weight_noise": lambda: [torch.randn(p.shape, device=device) for p in net.parameters()],
        "bbb": training_step(net, x, y, "sample", num_data=num_data, prior=GaussianPrior(), name="bbb"),
        "bbb_mixture": training_step(net, x, y, "sample", num_data=num_data, prior=ScaleMixturePrior(),
                                     name="bbb_mixture"),
        "autonormal": lambda: svi.step(x, y),
    }


def _torch_bbb_step(net, x, y, num_data, softplus=torch.nn.functional.softplus):
    """Bayes by Backprop by hand, without Pyro: w = mu + softplus(rho) * eps, loss = N * mean NLL + KL(q || N(0, 1)).
    ``softplus``: ``F.softplus`` as a user writes it, or :func:`pyrobnn.distributions.softplus`, the kernel pyrobnn's
    guide uses (the same arithmetic in both steps: what remains between them is the Python of Pyro and pyrobnn)."""
    net = copy.deepcopy(net).to(x.device)
    mus = [p.detach().clone().requires_grad_() for p in net.parameters()]
    rhos = [torch.full_like(p, -5.0).requires_grad_() for p in mus]
    optim = make_optimizer(mus + rhos)
    names = [name for name, _ in net.named_parameters()]

    def step():
        weights, kl = {}, 0.0
        for name, mu, rho in zip(names, mus, rhos):
            sigma = softplus(rho)
            weights[name] = mu + sigma * torch.randn_like(mu)
            kl = kl + 0.5 * (sigma.square().sum() + mu.square().sum()) - sigma.log().sum()
        logits = torch.func.functional_call(net, weights, (x,))
        loss = torch.nn.functional.cross_entropy(logits, y) * num_data + kl
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()

    step.parameters = mus + rhos  # the variational parameters, as the step updates them
    return step


def measure(device, rounds: int, steps: int) -> dict[str, float]:
    """Median ms/step of each method over interleaved rounds."""
    with pyro.validation_enabled(False):
        times = time_steps(steppers(device), rounds=rounds, repeats=steps, warmup=5, device=device)
    ms = {f"{name}_ms": round(t, 3) for name, t in times.items()}
    ms["ratio"] = round(ms["bbb_ms"] / ms["det_ms"], 2)
    ms["mixture_ratio"] = round(ms["bbb_mixture_ms"] / ms["det_ms"], 2)
    ms["autonormal_ratio"] = round(ms["autonormal_ms"] / ms["det_ms"], 2)
    ms["torch_bbb_ratio"] = round(ms["torch_bbb_ms"] / ms["det_ms"], 2)
    ms["weight_noise_ratio"] = round(ms["weight_noise_ms"] / ms["det_ms"], 2)
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
    columns = ("det", "bbb", "bbb_mixture", "autonormal", "torch_bbb", "weight_noise")
    for name in columns:
        table.add_column(name, justify="right")
    table.add_column("bbb / det", justify="right")
    table.add_column("torch_bbb / det", justify="right")
    for device, figures in (("cpu", result), ("cuda", result.get("cuda"))):
        if figures:
            table.add_row(device, *(f"{figures[f'{n}_ms']:.2f}" for n in columns),
                          f"{figures['ratio']:.2f}x", f"{figures['torch_bbb_ratio']:.2f}x")
    Console().print(table)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
