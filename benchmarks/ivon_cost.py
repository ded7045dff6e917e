"""What an IVON step costs against an Adam MAP step of the same network, side by side in one process.

The goal (issue 53, as Shen et al. 2024 report IVON "at about Adam's cost"): an IVON epoch at most 1.15x an Adam
MAP epoch. Both train a :class:`~pyrobnn.guides.PointGuide` with :func:`~pyrobnn.infer.svi.fit` by the default
executor (``compile="auto"``) on the problems of ``benchmarks/baselines_speed.py`` (the MLP 784-400-10 on 5,000 rows
of MNIST's shape in batches of 128; the MLP 13-50-1 on 455 rows in batches of 32):

- ``map_adam``: the MAP fit by Adam (the ``map`` method's optimiser);
- ``ivon``: :class:`pyrobnn.methods.IVON`'s optimiser (:class:`~pyrobnn.infer.ivon.IVONOptimizer`), stepped around its
  draw (one draw a step, the KL weight 0, as :meth:`~pyrobnn.methods.IVON.train` trains);
- ``ivon_authors``: the authors' ``ivon.IVON`` (``ivon-opt``) with the same settings in the same loop, the
  implementation pyrobnn's replaces where it is measurably slower.

Every configuration runs ``--repeats`` times, interleaved (the load of a shared machine falls on all alike); an
epoch's time is what ``fit`` records, the first epoch of each run left out (its recordings). Reported: the median
epoch of each, ``ivon_over_map_adam`` and ``ivon_authors_over_map_adam``.

    python benchmarks/ivon_cost.py [--device cpu] [--epochs 6] [--repeats 3]

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import pyro
import torch
from baselines_speed import PROBLEMS, data, model_and_guide

from pyrobnn import fit
from pyrobnn.device import resolve_device
from pyrobnn.infer.optim import Optim
from pyrobnn.infer.schedules import Constant
from pyrobnn.methods import METHODS


def authors_ivon(model, guide):
    """The authors' optimiser with :class:`~pyrobnn.infer.ivon.IVONOptim`'s settings on the summed loss."""
    import ivon

    ours = METHODS["ivon"].optimizer_factory(1)(model, guide)
    group = ours.param_groups[0]
    return ivon.IVON(group["params"], lr=group["lr"], ess=group["ess"], hess_init=group["hess_init"],
                     beta1=group["beta1"], beta2=group["beta2"], weight_decay=group["weight_decay"])


def epoch_seconds(problem: str, name: str, epochs: int, device) -> list[float]:
    """The seconds of epochs 2.. of one run of ``name`` on ``problem``."""
    x, y = data(problem, device)
    pyro.set_rng_seed(0)
    model, guide = model_and_guide(problem)
    _, _, _, _, batch, compile = PROBLEMS[problem]
    if name == "ivon":
        optimizer, beta = METHODS["ivon"].optimizer_factory(epochs), METHODS["ivon"].beta
    elif name == "ivon_authors":
        optimizer, beta = authors_ivon, METHODS["ivon"].beta
    else:
        optimizer, beta = Optim("adam", 1e-3), Constant()
    history = fit(model, guide, x, y, epochs=epochs, batch_size=batch, optimizer=optimizer, beta=beta,
                  compile=compile, device=device, progress=False)
    return [record["seconds"] for record in history.epochs[1:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    names = ("map_adam", "ivon", "ivon_authors")
    tick = time.perf_counter()
    result: dict = {"device": str(device), "threads": torch.get_num_threads(), "epochs": args.epochs,
                    "repeats": args.repeats, "torch": torch.__version__}
    for problem in args.problems:
        times: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(args.repeats):  # interleaved: each configuration once per repeat
            for name in names:
                times[name] += epoch_seconds(problem, name, args.epochs, device)
        median = {name: statistics.median(values) for name, values in times.items()}
        ratios = {f"{name}_over_map_adam": median[name] / median["map_adam"] for name in names[1:]}
        result[problem] = {"median_epoch_s": median, **ratios}
        print(f"{problem}: median epoch " + ", ".join(f"{name} {1e3 * value:.1f} ms" for name, value in median.items())
              + "; " + ", ".join(f"{name} {value:.3f}" for name, value in ratios.items()))
    result["seconds"] = time.perf_counter() - tick
    print(json.dumps(result))


if __name__ == "__main__":
    main()
