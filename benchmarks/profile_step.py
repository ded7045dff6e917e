"""Where one training step's time goes: the ATen operations (and autograd functions) of a method's step on a
network of the suite, by self CPU time per step (``torch.profiler``), heaviest first.

The suite (``suite.py``) says how long a step takes; this says which operations take it, in the step itself (a
kernel timed alone can cost differently there: the CPU allocator returns and re-faults the pages of short-lived
tensors of a megabyte or more, which a step keeps warm). For example, σ = softplus(ρ) as ``F.softplus`` calls
``aten::log1p``, which has no vectorised kernel on some CPUs, and flipout's random signs drawn one random number per
sign show up as ``aten::uniform_``.

``python benchmarks/profile_step.py --network mlp400 --method bbb [--batch 128] [--steps 20] [--top 15]``; the
methods and networks of ``ops.py``. The last line is JSON: ms per step by operation.
"""

from __future__ import annotations

import argparse
import json

import pyro
import torch
from ops import METHODS, NETWORKS, training_steps


def profile(network: str, method: str, batch: int, steps: int, device: torch.device) -> dict[str, float]:
    """Self CPU ms per step of every operation of ``steps`` steps (after 5 warm-up steps), heaviest first."""
    x = torch.rand((batch,) + NETWORKS[network][1], device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    pyro.clear_param_store()
    with pyro.validation_enabled(False):
        step = training_steps(network, x, y, (method,))[method]
        for _ in range(5):
            step()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
            for _ in range(steps):
                step()
    per_step = {event.key: event.self_cpu_time_total / 1e3 / steps for event in profiler.key_averages()}
    return dict(sorted(per_step.items(), key=lambda item: -item[1]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", choices=tuple(NETWORKS), default="mlp400")
    parser.add_argument("--method", choices=METHODS, default="bbb")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    per_step = profile(args.network, args.method, args.batch, args.steps, torch.device("cpu"))
    total = sum(per_step.values())
    print(f"{args.method} on {args.network}, batch {args.batch}: {total:.2f} ms self CPU per step (profiled)")
    for name, ms in list(per_step.items())[: args.top]:
        print(f"  {ms:8.3f} ms  {100 * ms / total:5.1f} %  {name}")
    print(json.dumps({"network": args.network, "method": args.method, "batch": args.batch, "total_ms": round(total, 3),
                      "ms": {k: round(v, 4) for k, v in per_step.items()}}))


if __name__ == "__main__":
    main()
