"""Bayes by Backprop on MNIST, data-parallel over P processes (pyrobnn.infer.distributed), the unchanged fit.

    torchrun --nproc-per-node=2 examples/ddp_mnist.py --train-size 10000 --epochs 1
    python examples/ddp_mnist.py --train-size 10000 --epochs 1          # the same run in one process

Each process (gloo on CPU, nccl on GPU LOCAL_RANK) trains the 784-h-10 BBB MLP (scale-mixture prior,
diagonal Normal posterior, Blundell et al. 2015) on its shard, every P-th training image, with
``--batch-size / P`` examples per step, so one step sees the global batch and the run makes as many
steps as the single-process one. The likelihood is scaled by the global N (``fit(num_data=...)``) and
the gradients are averaged before every step, so the averaged loss is the single-process ELBO of the
global batch with the KL counted once; each process draws its own weight noise (``rank_seed``). Rank 0
evaluates on the test set and prints, as its last line, one JSON object
``{"processes": P, "test_acc": ..., "nll": ..., "ece": ..., "brier": ..., "s_per_epoch": ..., ...}``.
"""

from __future__ import annotations

import argparse
import json
import time

import pyro
import torch

from pyrobnn import BayesianNetwork, NormalGuide, ScaleMixturePrior
from pyrobnn.analysis.evaluate import evaluate
from pyrobnn.data import load_dataset
from pyrobnn.infer import distributed
from pyrobnn.infer.elbo import MeanFieldELBO
from pyrobnn.infer.optim import Optim
from pyrobnn.infer.svi import fit
from pyrobnn.networks import MLP


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=400, help="hidden width h of the 784-h-10 MLP")
    parser.add_argument("--batch-size", type=int, default=128, help="global batch, split evenly over the processes")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--particles", type=int, default=1, help="posterior samples per step in each process")
    parser.add_argument("--init-rho", type=float, default=-5.0, help="initial rho: sigma0 = softplus(rho)")
    parser.add_argument("--samples", type=int, default=20, help="posterior samples for test predictions")
    parser.add_argument("--train-size", type=int, default=None, help="subset of the 60k training images")
    parser.add_argument("--test-size", type=int, default=None, help="subset of the 10k test images")
    parser.add_argument("--data-root", default=None, help="data directory (else $PYROBNN_DATA)")
    parser.add_argument("--backend", default=None, choices=["gloo", "nccl"], help="default: nccl on GPU, else gloo")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()

    tick = time.perf_counter()
    with distributed.process_group(args.backend) as device:
        processes, main_process = distributed.world_size(), distributed.rank() == 0
        if args.batch_size % processes:
            raise ValueError(f"--batch-size {args.batch_size} must be a multiple of the {processes} processes")
        data = load_dataset("mnist", args.data_root, train_size=args.train_size, test_size=args.test_size,
                            seed=args.seed)
        x, y = distributed.shard(data.x_train, data.y_train)

        pyro.set_rng_seed(args.seed)  # the initial network; data_parallel makes every process take rank 0's
        model = BayesianNetwork(MLP(784, (args.hidden,), 10), prior=ScaleMixturePrior(0.25, 1.0, torch.e**-8))
        guide = NormalGuide(model, init_rho=args.init_rho)
        model.to(device), guide.to(device)
        with distributed.data_parallel(model, guide):
            history = fit(model, guide, x, y, epochs=args.epochs, batch_size=args.batch_size // processes,
                          optimizer=Optim(lr=args.lr),
                          elbo=MeanFieldELBO(args.particles, vectorize_particles=True, estimator="sample"),
                          num_data=processes * len(x),
                          seed=distributed.rank_seed(args.seed), device=device,
                          progress=main_process and not args.no_progress)
            difference = distributed.max_parameter_difference(model, guide)
        train_seconds = sum(history["seconds"])

    if main_process:
        metrics = evaluate(model, guide, data.x_test.to(device), data.y_test.to(device), num_samples=args.samples)
        for record in history.epochs:
            print(f"epoch {record['epoch']}: loss {record['loss']:.4g} nll {record['nll']:.4g} (per example, "
                  f"rank 0's shard) kl {record['kl']:.4g} nats, {record['seconds']:.1f} s", flush=True)
        print(f"{processes} process(es), {processes} x {len(x)} training images, global batch {args.batch_size}: "
              + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
              + f"; max parameter difference between processes {difference:g}")
        result = {"processes": processes, "train_size": processes * len(x), "global_batch": args.batch_size,
                  "test_acc": metrics["accuracy"], **{k: v for k, v in metrics.items() if k != "accuracy"},
                  "s_per_epoch": train_seconds / args.epochs, "wall_seconds": time.perf_counter() - tick,
                  "max_parameter_difference": difference}
        print(json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
