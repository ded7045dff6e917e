"""What Bayesian fine-tuning costs: a pyrobnn MAP-LoRA step against the hand-written peft loop's, a BLoB step against
a MAP-LoRA step of the same pretrained transformer, side by side in one run, Laplace-LoRA's fit, and the predictive
pass of S draws.

The goals (issues 50 and 59, as Wang et al. 2024 report BLoB's cost): a pyrobnn MAP-LoRA step at most 1.15x the
hand-written loop's, a BLoB step at most 1.3x a MAP-LoRA step and its peak memory at most 1.15x. The network is
all-MiniLM-L6-v2 (``hf:minilm-l6``, frozen) with LoRA r 8 on query and value, trained on IMDB reviews of
``--tokens`` tokens in batches of ``--batch-size`` by :func:`~pyrobnn.infer.svi.fit` with each method's
fine-tuning settings (:func:`~pyrobnn.methods.finetuned`: Adam on the likelihood, the KL apart):

- ``plain``: the same peft model in a hand-written loop (training mode, cross-entropy, ``torch.optim.AdamW``): what
  a step costs without pyrobnn, the reference for pyrobnn's own overhead;
- ``plain-eval``: the same loop with the model left in evaluation mode (its dropout off), as this benchmark ran it
  before: a different computation, cheaper by the dropout of every attention and hidden layer;
- ``map``: the ``map`` preset (a point guide on the adapters and the head);
- ``blob``: the ``blob`` preset (a Gaussian on the A matrices, flipout: one extra matrix product per adapter);
- ``laplace-lora``: MAP-LoRA's steps, then the Kronecker-factored Laplace of the adapters (``fit_s``: the curvature
  over the training rows and the marginal likelihood's tuning) and 10 draws of its linearised predictive.

Each configuration runs ``--repeats`` times, interleaved (the load of a shared machine falls on all alike), each
time in a fresh process so that its peak memory is its own (``ru_maxrss`` on CPU, ``max_memory_allocated`` on CUDA,
minus what the process held after building the model: the step's own memory). A step's time is the median of the
epochs after the first (one epoch = ``--steps`` steps). The predictive pass is ``predict`` of 10 draws of the BLoB
posterior on ``--batch-size`` x 4 reviews against 10 passes of MAP's one: the draws run in one batched pass
(vectorised particles) where the network allows it.

    python benchmarks/lora_cost.py [--device cpu] [--steps 6] [--epochs 3] [--repeats 3]

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import subprocess
import sys
import time

import pyro
import torch

NAMES = ("plain", "plain-eval", "map", "blob", "laplace-lora")


def _data(tokens: int, rows: int, seed: int = 0):
    from pyrobnn.data.text import load_imdb
    from pyrobnn.networks.hf import load_tokenizer

    return load_imdb(size=25000, train_size=rows, test_size=rows, max_length=tokens,
                     tokenizer=load_tokenizer("minilm-l6"), seed=seed)


def _peak(device) -> float:
    """Peak memory of this process so far, in GB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KB on Linux


def one(name: str, args) -> dict:
    """Train ``name`` in this process: ``{"step_s", "step_memory_gb", "predict_s"}``."""
    from pyrobnn.infer.laplace import fit_linearized_laplace
    from pyrobnn.infer.predict import predict
    from pyrobnn.infer.svi import fit
    from pyrobnn.methods import METHODS, finetuned
    from pyrobnn.methods.lora import is_adapter
    from pyrobnn.networks.hf import load_classifier

    device = torch.device(args.device)
    rows = args.steps * args.batch_size
    data = _data(args.tokens, rows)
    pyro.set_rng_seed(0)
    net = load_classifier("minilm-l6", 2).to(device)
    x, y = data.x_train.to(device), data.y_train.to(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    if name.startswith("plain"):
        net.train(name == "plain")
        optim = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=5e-3)
        before, epochs = _peak(device), []
        for _ in range(args.epochs):
            tick = time.perf_counter()
            for i in range(0, rows, args.batch_size):
                loss = torch.nn.functional.cross_entropy(net(x[i:i + args.batch_size]), y[i:i + args.batch_size])
                optim.zero_grad()
                loss.backward()
                optim.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            epochs.append(time.perf_counter() - tick)
        return {"step_s": statistics.median(epochs[1:]) / args.steps, "step_memory_gb": _peak(device) - before}
    method = dataclasses.replace(finetuned(METHODS[name]), batch_size=args.batch_size)
    model, guide = method.build(net, num_data=rows)
    model.to(device), guide.to(device)
    before = _peak(device)
    history = fit(model, guide, x, y, epochs=args.epochs, seed=0, progress=False, device=device,
                  **method.fit_options(args.epochs))
    result = {"step_s": statistics.median(history["seconds"][1:]) / args.steps,
              "step_memory_gb": _peak(device) - before}
    if name == "laplace-lora":
        tick = time.perf_counter()
        fit_linearized_laplace(model, guide, x, y, select=is_adapter, batch_size=args.batch_size,
                               prior_steps=method.prior_steps)
        result["fit_s"] = time.perf_counter() - tick
    test = data.x_test[: 4 * args.batch_size].to(device)
    tick = time.perf_counter()
    draws = 1 if name == "map" else 10
    predict(model, guide, test, num_samples=draws)
    result["predict_s"] = (time.perf_counter() - tick) * 10 / draws
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=6, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run (the first is left out)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", choices=NAMES, help=argparse.SUPPRESS)  # a child process's configuration
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args)))
        return
    tick = time.perf_counter()
    runs: dict[str, list[dict]] = {name: [] for name in NAMES}
    child = [a for a in sys.argv[1:]]
    for _ in range(args.repeats):
        for name in NAMES:
            out = subprocess.run([sys.executable, __file__, *child, "--one", name], check=True, capture_output=True,
                                 text=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    median = {name: {key: statistics.median(run[key] for run in results) for key in results[0]}
              for name, results in runs.items()}
    result = {"device": args.device, "tokens": args.tokens, "batch_size": args.batch_size, "steps": args.steps,
              "epochs": args.epochs, "repeats": args.repeats, "median": median, "runs": runs,
              "blob_over_map_step": median["blob"]["step_s"] / median["map"]["step_s"],
              "blob_over_map_memory": median["blob"]["step_memory_gb"] / median["map"]["step_memory_gb"],
              "map_over_plain_step": median["map"]["step_s"] / median["plain"]["step_s"],
              "map_over_plain_eval_step": median["map"]["step_s"] / median["plain-eval"]["step_s"],
              "laplace_fit_s": median["laplace-lora"]["fit_s"],
              "blob_10_draws_over_10_map_passes": median["blob"]["predict_s"] / median["map"]["predict_s"],
              "torch": torch.__version__, "threads": torch.get_num_threads()}
    result["seconds"] = time.perf_counter() - tick
    for key in ("blob_over_map_step", "blob_over_map_memory", "map_over_plain_step", "map_over_plain_eval_step",
                "laplace_fit_s", "blob_10_draws_over_10_map_passes"):
        print(f"{key}: {result[key]:.3f}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
