"""The deterministic CIFAR-10 network trained in plain PyTorch (no Pyro, no pyrobnn training code): what the network,
the data copy and the recipe reach by themselves, the reference for ``examples/cifar10.py --methods det``.

The same network (:func:`pyrobnn.networks.build_net`), data (``load_dataset("cifar10", dtype=torch.uint8)``, the
JPEG copy offline) and augmentation (:class:`pyrobnn.data.augment.ImageAugment`: pad-4 crop and flip on the
device) as the example; the recipe is the example's by default: SGD with Nesterov momentum 0.9 on the mean
cross-entropy, a linear warm-up over the first epoch, a cosine rate, weight decay on the convolution and linear
weights (the example's Gaussian prior also covers their biases; ResNet-18's only one is the classifier's 10), none on
BatchNorm, bf16 autocast and channels-last on CUDA. If this script
reaches accuracy A in E epochs and the example's ``det`` does not, the gap is pyrobnn's; if neither does, it is the
recipe, the epochs or the data.

    python benchmarks/cifar10_floor.py --model resnet18 --epochs 25

Prints one line per epoch and, last, one JSON object (accuracy, NLL, ECE of the test set, s/epoch).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

from pyrobnn.analysis.metrics import ece
from pyrobnn.data import load_dataset
from pyrobnn.data.augment import ImageAugment
from pyrobnn.device import resolve_device
from pyrobnn.networks import build_net


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--width", type=float, default=1.0, help="multiplier of the network's hidden widths")
    p.add_argument("--epochs", type=int, default=25)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate on the mean loss")
    p.add_argument("--wd", type=float, default=5e-4, help="weight decay of the convolution and linear weights")
    p.add_argument("--label-smoothing", type=float, default=0.0)
    p.add_argument("--train-size", type=int, default=None, help="a seeded subset of the training images")
    p.add_argument("--test-size", type=int, default=None, help="a seeded subset of the test images")
    p.add_argument("--device", default="auto")
    p.add_argument("--data-root", default=None)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    device = resolve_device(args.device)
    cuda = device.type == "cuda"
    data = load_dataset("cifar10", root=args.data_root, train_size=args.train_size, test_size=args.test_size,
                        seed=args.seed, dtype=torch.uint8)
    aug = ImageAugment.for_dataset("cifar10", channels_last=cuda)
    net = build_net(args.model, (3, 32, 32), 10, width=args.width).to(device)
    if cuda:
        net = net.to(memory_format=torch.channels_last)
    decayed = [m.weight for m in net.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    ids = {id(w) for w in decayed}
    rest = [q for q in net.parameters() if id(q) not in ids]
    opt = torch.optim.SGD([{"params": decayed, "weight_decay": args.wd}, {"params": rest, "weight_decay": 0.0}],
                          lr=args.lr, momentum=0.9, nesterov=True)
    x_train, y_train = data.x_train.to(device), data.y_train.to(device)
    n = len(x_train)
    steps = math.ceil(n / args.batch_size)
    total = args.epochs * steps

    def rate(step: int) -> float:  # linear warm-up over one epoch, then cosine over the epochs
        if step < steps:
            return (step + 1) / steps
        return 0.5 * (1 + math.cos(math.pi * (step // steps) / args.epochs))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, rate)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)
    seconds, losses = [], []
    for epoch in range(args.epochs):
        net.train()
        start = time.perf_counter()
        order = torch.randperm(n, device=device)
        for i in range(steps):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            with autocast:
                loss = F.cross_entropy(net(aug(x_train[idx])).float(), y_train[idx],
                                       label_smoothing=args.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        if cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
        losses.append(loss.item())
        print(f"epoch {epoch + 1}/{args.epochs} loss {losses[-1]:.4f} {seconds[-1]:.1f} s", flush=True)
    assert sched.last_epoch == total
    net.eval()
    with torch.no_grad(), autocast:
        x_test = aug.normalize(data.x_test.to(device))
        logits = torch.cat([net(x_test[i:i + 1000]).float() for i in range(0, len(x_test), 1000)])
    y_test = data.y_test.to(device)
    probs = logits.softmax(-1)
    result = {"model": args.model, "epochs": args.epochs, "device": device.type,
              "accuracy": (probs.argmax(-1) == y_test).float().mean().item(),
              "nll": F.cross_entropy(logits, y_test).item(), "ece": ece(probs.cpu(), y_test.cpu()),
              "last_batch_loss": losses, "s_per_epoch": sum(seconds) / len(seconds), "s_last_epoch": seconds[-1]}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
