"""What an SNGP training step costs against a MAP step of the same network, side by side in one process.

Both are built by their methods (``METHODS["map"]``, ``METHODS["sngp"]``: the MLP with its hidden layer spectrally
normalised and its output layer a GP of 1,024 random Fourier features) and trained by
:func:`~pyrobnn.infer.svi.fit` with the method's options (Adam at 1e-3) on the MNIST problem of
``benchmarks/baselines_speed.py`` (the MLP 784-400-10 on 5,000 rows of MNIST's shape, batches of 128). Every
configuration runs ``--repeats`` times, interleaved; an epoch's time is what ``fit`` records, the first epoch of
each run left out. Reported: the median epoch of each, ``sngp_over_map``, and the seconds of SNGP's one pass that
collects its Laplace precision over the 5,000 rows after training (:func:`~pyrobnn.methods.sngp.collect_precision`).

    python benchmarks/sngp_cost.py [--device cpu] [--epochs 6] [--repeats 3]

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import json
import statistics
import time

import pyro
from baselines_speed import PROBLEMS, arguments, data, median_epochs

from pyrobnn import fit
from pyrobnn.methods import METHODS
from pyrobnn.methods.sngp import collect_precision
from pyrobnn.networks import MLP

COLLECTIONS: list[float] = []


def epoch_seconds(problem: str, name: str, epochs: int, device) -> list[float]:
    """The seconds of epochs 2.. of one run of method ``name`` on ``problem`` (SNGP's collection timed apart)."""
    x, y = data(problem, device)
    inputs, hidden, outputs, rows, batch, compile = PROBLEMS[problem]
    method = METHODS[name]
    pyro.set_rng_seed(0)
    model, guide = method.build(MLP(inputs, (hidden,), outputs), num_data=rows)
    options = {**method.fit_options(epochs, model=model), "batch_size": batch}
    history = fit(model, guide, x, y, epochs=epochs, compile=compile, device=device, progress=False, **options)
    if name == "sngp":
        tick = time.perf_counter()
        collect_precision(model, guide, x, method.ridge)
        COLLECTIONS.append(time.perf_counter() - tick)
    return [record["seconds"] for record in history.epochs[1:]]


def main() -> None:
    args = arguments(__doc__.splitlines()[0])
    args.problems = ["mnist"]
    result, tick = median_epochs(args, ("map", "sngp"), epoch_seconds)
    median = result.pop("medians")["mnist"]
    result["mnist"] = {"median_epoch_s": median, "sngp_over_map": median["sngp"] / median["map"],
                       "steps_per_epoch": -(-PROBLEMS["mnist"][3] // PROBLEMS["mnist"][4]),
                       "collection_s": statistics.median(COLLECTIONS)}
    print(f"mnist: sngp_over_map {result['mnist']['sngp_over_map']:.3f}")
    result["seconds"] = time.perf_counter() - tick
    print(json.dumps(result))


if __name__ == "__main__":
    main()
