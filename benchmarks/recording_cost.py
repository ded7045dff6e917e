"""What a recorded step costs and saves on this CPU: ``fit`` of BBB (NormalGuide, weight sampling, one particle) on
the 784-400-10 MLP at batch 128 for 1 and for 40 steps, eagerly (``compile="none"``) and by the recorded step
(``compile="trace"``), each twice, side by side in one process. The difference of the two lengths gives the time of
a step, the rest the set-up (the recording): the figures behind :data:`pyrobnn.infer.recording.RECORD_STEPS_CPU`.

    python benchmarks/recording_cost.py --threads 2

The last line is a JSON object: seconds per run, ms per step and the recording's seconds, per mode (medians)."""

from __future__ import annotations

import argparse
import json
import statistics
import time

import pyro
import torch

from pyrobnn import BayesianNetwork, Categorical, GaussianPrior, NormalGuide, fit
from pyrobnn.infer import MeanFieldELBO
from pyrobnn.networks import MLP


def run(mode: str, steps: int, x, y) -> float:
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = BayesianNetwork(MLP(784, (400,), 10), Categorical(), prior=GaussianPrior(), num_data=len(x))
    guide = NormalGuide(model)
    start = time.perf_counter()
    fit(model, guide, x[:128 * steps], y[:128 * steps], epochs=1, batch_size=128, compile=mode, progress=False,
        elbo=MeanFieldELBO(1, vectorize_particles=True))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x, y = torch.rand(128 * args.steps, 784), torch.randint(0, 10, (128 * args.steps,))
    times = {(mode, steps): [] for mode in ("none", "trace") for steps in (1, args.steps)}
    for _ in range(args.rounds):  # interleaved: machine load hits every cell alike
        for mode, steps in times:
            times[mode, steps].append(run(mode, steps, x, y))
    figures = {}
    for mode in ("none", "trace"):
        short, long = (statistics.median(times[mode, s]) for s in (1, args.steps))
        per_step = (long - short) / (args.steps - 1)
        figures[mode] = {"s_1_step": round(short, 3), f"s_{args.steps}_steps": round(long, 3),
                         "ms_per_step": round(1e3 * per_step, 2), "setup_s": round(short - per_step, 3)}
    saved = figures["none"]["ms_per_step"] - figures["trace"]["ms_per_step"]
    cost = figures["trace"]["setup_s"] - figures["none"]["setup_s"]
    figures["break_even_steps"] = round(1e3 * cost / saved) if saved > 0 else None
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
