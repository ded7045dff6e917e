"""Implicit BNNs on CIFAR-10 (paper 004, Table 3): VGG-16 with det (SGD), MC dropout, BBB, iBNN-4 and iBNN-16.

Trinh, Kaski & Heinonen (2020), "Scalable Bayesian neural networks by layer-wise input augmentation", train
VGG-16 for 300 epochs: SGD 6.72 % error / NLL 0.326 / ECE 0.048, BNN-VI 9.63 / 0.660 / 0.066, iBNN-16
6.19 / 0.198 / 0.015. This is :mod:`examples.cifar10` with the paper's network, methods and corruption
benchmark as defaults (every option of ``cifar10.py`` applies), so the iBNN runs through the same data
pipeline, ``fit`` and ``evaluate`` as every baseline::

    python examples/ibnn_cifar10.py --epochs 30                                # on a GPU
    python examples/ibnn_cifar10.py --epochs 1 --train-size 1000 --test-size 200 --methods det ibnn4

Our CIFAR-10 copy is JPEG-compressed: say so beside every number. Prints the table and, last, one JSON line
(as ``cifar10.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cifar10  # noqa: E402  (the shared CIFAR-10 protocol)

DEFAULTS = ["--model", "vgg16", "--methods", "det", "mcdropout", "bbb", "ibnn4", "ibnn16",
            "--corruptions", "1", "2", "3", "4", "5", "--out", "runs/ibnn_cifar10"]


if __name__ == "__main__":
    cifar10.main(DEFAULTS + sys.argv[1:])
