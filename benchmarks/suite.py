"""Speed, memory and dispatched operations of Bayesian training steps against the deterministic step, side by side.

For each network of :data:`ops.NETWORKS` (784-400-10 and 784-1200-1200-10 MLPs, LeNet-5 on 28x28 inputs, a CIFAR
ResNet-18 at width 0.25; batch 128) and each method of :data:`ops.METHODS`, one Adam step is timed in interleaved
rounds (every round times every method, the figure is the median over rounds, so machine load hits all methods
alike):

- ``det``: plain PyTorch, cross-entropy;
- ``bbb``, ``local_reparam``, ``flipout``, ``vdp``: pyrobnn's ``NormalGuide`` + Gaussian prior under each estimator
  of :data:`pyrobnn.handlers.ESTIMATORS` (weight sampling, Blundell et al. 2015; local reparameterization, Kingma,
  Salimans & Welling 2015; flipout, Wen et al. 2018; VDP++ moments), stepped eagerly (``compile="none"``) by
  :func:`pyrobnn.infer.svi.svi_step`; ``<method>_<mode>``: the same run by each executor of ``--modes`` (default
  ``auto``, the default path, ``trace`` and ``inductor``: :data:`pyrobnn.infer.recording.COMPILE_MODES`), whose
  figures ``<method>_auto_vs_fastest`` (the default against the fastest explicit mode, the eager one included) and
  ``<method>_auto_vs_eager`` are in the JSON;
- ``bt_reparam`` / ``bt_flipout``: bayesian-torch's ``dnn_to_bnn`` layers (skipped when not installed);
- ``torch_bbb``: the hand-written Bayes-by-Backprop floor (``benchmarks/speed.py``, no Pyro, ``F.softplus``), and
  ``torch_bbb_same_softplus``, the same with pyrobnn's σ kernel: ``bbb`` against it is the cost of Pyro's Python;
- ``det_compiled``: the plain step of the network under ``torch.compile`` (``--compiled``: the networks to compile
  it on).

Also per method: peak memory of one step beyond the set-up (:func:`pyrobnn.analysis.cost.peak_memory`) and ATen
operations per step (``benchmarks/ops.py``; device-independent and exact, unlike the timings on a shared
machine). The overhead-bound regime that stands for a GPU's launch-bound step is the 784-400-10 MLP at batch 16
(``--small-batch``). The last line is one JSON object with every figure and every ratio to ``det``.
"""

from __future__ import annotations

import argparse
import json

import pyro
import torch
from ops import ESTIMATOR_OF, METHODS, NETWORKS, compiled_step, count, training_steps

from pyrobnn.analysis.cost import peak_memory, time_steps
from pyrobnn.infer.step import ExecutorFailed


def measure(name: str, device, args, batch: int = 128, compiled: bool = False) -> dict[str, float]:
    """ms/step (median over interleaved rounds), ratio to det, peak MiB and ops/step of every method."""
    x = torch.rand((batch,) + NETWORKS[name][1], device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    pyro.clear_param_store()
    with pyro.validation_enabled(False):
        methods = training_steps(name, x, y)
        if compiled:
            methods["det_compiled"] = compiled_step(name, x, y, "det")
        cannot = {}
        for method in args.mode_methods:
            for mode in args.modes:
                step = compiled_step(name, x, y, ESTIMATOR_OF[method], compile=mode)
                try:  # an explicit executor that cannot take the network says so at its first step
                    step()
                except ExecutorFailed as error:
                    cannot[f"{method}_{mode}_cannot"] = str(error).split("; ")[0]
                    continue
                methods[f"{method}_{mode}"] = step
        ms = time_steps(methods, rounds=args.rounds, repeats=args.steps, warmup=3, device=device)
        entry = {f"{k}_ms": round(v, 3) for k, v in ms.items()}
        entry.update(cannot)
        entry.update({f"{k}_ratio": round(v / ms["det"], 2) for k, v in ms.items() if k != "det"})
        for method in args.mode_methods:
            if f"{method}_auto" in ms:
                explicit = [ms[method]] + [ms[f"{method}_{m}"] for m in args.modes if f"{method}_{m}" in ms
                                           and m != "auto"]
                entry[f"{method}_auto_vs_fastest"] = round(ms[f"{method}_auto"] / min(explicit), 3)
                entry[f"{method}_auto_vs_eager"] = round(ms[f"{method}_auto"] / ms[method], 3)
        for method, step in methods.items():
            if not args.no_memory:
                entry[f"{method}_mib"] = round(peak_memory(step, device), 1)
            if method in METHODS:  # recorded and compiled steps bypass the dispatcher the counter sees
                entry[f"{method}_ops"] = count(step, warmup=0).total
    return entry


def print_table(title: str, figures: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("network")
    modes = [f"{m}_{mode}" for m in ESTIMATOR_OF for mode in ("auto", "trace", "inductor")]
    methods = [m for m in (*METHODS, "det_compiled", *modes) if any(f"{m}_ms" in f for f in figures.values())]
    for method in methods:
        table.add_column(method, justify="right")
    for name, f in figures.items():
        cells = []
        for m in methods:
            if f"{m}_ms" not in f:
                cells.append("-")
                continue
            ratio = "" if m == "det" else f" ({f[f'{m}_ratio']:.2f}x)"
            memory = f" [{f[f'{m}_mib']:.0f} MiB]" if f"{m}_mib" in f else ""
            ops = f" {f[f'{m}_ops']} ops" if f"{m}_ops" in f else ""
            cells.append(f"{f[f'{m}_ms']:.2f}{ratio}{memory}{ops}")
        table.add_row(name, *cells)
    Console(width=260).print(table)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--networks", nargs="+", choices=tuple(NETWORKS), default=tuple(NETWORKS))
    parser.add_argument("--compiled", nargs="*", choices=tuple(NETWORKS), default=["mlp400"],
                        help="networks on which det is also timed under torch.compile")
    parser.add_argument("--modes", nargs="*", choices=("auto", "trace", "inductor"),
                        default=["auto", "trace", "inductor"],
                        help="executors each of --mode-methods is also timed with (beside eager)")
    parser.add_argument("--mode-methods", nargs="*", choices=tuple(ESTIMATOR_OF), default=tuple(ESTIMATOR_OF),
                        help="pyrobnn's methods timed under every --modes")
    parser.add_argument("--small-batch", type=int, default=16, help="batch of the overhead-bound regime (0: skip)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    parser.add_argument("--devices", nargs="+", choices=("cpu", "cuda"), default=None,
                        help="devices to measure (default: cpu, and cuda when present)")
    args = parser.parse_args()
    devices = args.devices or (["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    if "cuda" in devices and not torch.cuda.is_available():
        parser.error("--devices cuda: no CUDA device is available here")
    torch.set_num_threads(args.threads)
    result = {"threads": args.threads}
    for device in devices:
        figures = {name: measure(name, torch.device(device), args, compiled=name in args.compiled)
                   for name in args.networks}
        if args.small_batch:
            figures[f"mlp400_b{args.small_batch}"] = measure("mlp400", torch.device(device), args, args.small_batch,
                                                             compiled="mlp400" in args.compiled)
        result[device] = figures
        small = f" (mlp400_b{args.small_batch}: batch {args.small_batch})" if args.small_batch else ""
        print_table(f"{device}: ms per step (x det) [peak MiB] ATen ops per step; batch 128{small}", figures)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
