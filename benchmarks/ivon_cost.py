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

import json
import time

import pyro
from baselines_speed import PROBLEMS, arguments, data, median_epochs, model_and_guide

from pyrobnn import fit
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
    args = arguments(__doc__.splitlines()[0])
    names = ("map_adam", "ivon", "ivon_authors")
    result, tick = median_epochs(args, names, epoch_seconds)
    for problem, median in result.pop("medians").items():
        ratios = {f"{name}_over_map_adam": median[name] / median["map_adam"] for name in names[1:]}
        result[problem] = {"median_epoch_s": median, **ratios}
        print(f"{problem}: " + ", ".join(f"{name} {value:.3f}" for name, value in ratios.items()))
    result["seconds"] = time.perf_counter() - tick
    print(json.dumps(result))


if __name__ == "__main__":
    main()
