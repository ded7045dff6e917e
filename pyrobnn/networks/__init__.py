"""Network architectures and a registry that builds them (or any torchvision model) by name.

MNIST-sized: ``mlp``, ``lenet300-100``, ``lenet5``, ``vit``. CIFAR-10 (3x32x32 inputs only): ``lenet5-cifar``
and ``alexnet`` as paper 000 defines them, ``resnet18``, ``resnet50`` (CIFAR stem), ``vgg16`` (BatchNorm),
``wrn28-10`` (any ``wrn<depth>-<k>``). Every one is a plain ``nn.Module`` that
:class:`~pyrobnn.BayesianNetwork` converts, and runs under every estimator handler, ``vdp`` included.
:class:`PyroBNN` is a whole Pyro model instead, the README's "Your own Pyro model". ``hf:<name>`` and ``hf:<path>``
are pretrained ``transformers`` classifiers with LoRA adapters (:mod:`pyrobnn.networks.hf`, the ``hf`` extra).
"""

from __future__ import annotations

import math
import re
from typing import Callable, Sequence

from torch import nn

from pyrobnn.networks.alexnet import AlexNet
from pyrobnn.networks.building import scaled
from pyrobnn.networks.lenet import LeNet5
from pyrobnn.networks.mlp import MLP
from pyrobnn.networks.pyro_bnn import PyroBNN
from pyrobnn.networks.resnet import ResNet, resnet18, resnet50
from pyrobnn.networks.transformer import TransformerClassifier
from pyrobnn.networks.vgg import VGG16
from pyrobnn.networks.vit import ViT
from pyrobnn.networks.wide_resnet import WideResNet

__all__ = ["MLP", "LeNet5", "ViT", "AlexNet", "ResNet", "resnet18", "resnet50", "VGG16", "WideResNet",
           "TransformerClassifier", "PyroBNN", "NETWORKS", "CIFAR_INPUT_SHAPE", "build_net"]

CIFAR_INPUT_SHAPE = (3, 32, 32)
"""The per-example input shape the CIFAR architectures are defined for."""

Builder = Callable[..., nn.Module]
"""``builder(input_shape, num_outputs, *, hidden, dropout, width) -> nn.Module``."""


def _images(name: str, input_shape: tuple, sizes: tuple[int, ...]) -> None:
    if len(input_shape) != 3 or input_shape[-1] not in sizes or input_shape[-2] != input_shape[-1]:
        side = "|".join(map(str, sizes))
        raise ValueError(f"network {name!r} needs (C, {side}, {side}) images, got input shape {input_shape}")


def _cifar(name: str, input_shape: tuple) -> None:
    if input_shape != CIFAR_INPUT_SHAPE:
        raise ValueError(f"network {name!r} needs 3x32x32 (CIFAR) images, got input shape {input_shape}: use a "
                         "32x32 RGB dataset (e.g. --dataset cifar10) or a model for this input (mlp, lenet5, vit)")


def _no_dropout(name: str, dropout: float) -> None:
    if dropout:
        raise ValueError(f"dropout: {name} has no dropout layers, got {dropout!r}; use 0 (for MC dropout "
                         "choose the dropout guide)")


def _mlp(hidden_of: Callable[[Sequence[int]], Sequence[int]]) -> Builder:
    def build(input_shape, num_outputs, *, hidden, dropout, width):
        return MLP(math.prod(input_shape), [scaled(h, width) for h in hidden_of(hidden)], num_outputs,
                   dropout=dropout)

    return build


def _lenet5(input_shape, num_outputs, *, hidden, dropout, width):
    _images("lenet5", input_shape, (28, 32))
    _no_dropout("lenet5", dropout)
    return LeNet5(input_shape[0], num_outputs, image_size=input_shape[-1], width=width)


def _lenet5_cifar(input_shape, num_outputs, *, hidden, dropout, width):
    _cifar("lenet5-cifar", input_shape)
    _no_dropout("lenet5-cifar", dropout)
    return LeNet5(3, num_outputs, image_size=32, activation="sigmoid", pool="avg", width=width)


def _vit(input_shape, num_outputs, *, hidden, dropout, width):
    _images("vit", input_shape, (28, 32))
    dim = 4 * scaled(16, width)  # 4 heads
    return ViT(input_shape[0], num_outputs, image_size=input_shape[-1], patch_size=input_shape[-1] // 4,
               dim=dim, mlp_dim=2 * dim, dropout=dropout)


def _alexnet(input_shape, num_outputs, *, hidden, dropout, width):
    _cifar("alexnet", input_shape)
    return AlexNet(3, num_outputs, width=width, dropout=dropout)


def _resnet(name: str, factory: Callable[..., ResNet]) -> Builder:
    def build(input_shape, num_outputs, *, hidden, dropout, width):
        _cifar(name, input_shape)
        _no_dropout(name, dropout)
        return factory(num_outputs, width=width)

    return build


def _vgg16(input_shape, num_outputs, *, hidden, dropout, width):
    _cifar("vgg16", input_shape)
    return VGG16(num_outputs, width=width, dropout=dropout)


def _wide_resnet(name: str, depth: int, widen: int) -> Builder:
    def build(input_shape, num_outputs, *, hidden, dropout, width):
        _cifar(name, input_shape)
        return WideResNet(depth, widen * width, num_outputs, dropout=dropout)

    return build


def _transformer(input_shape, num_outputs, *, hidden, dropout, width, vocab_size=None):
    if len(input_shape) != 1 or vocab_size is None:
        raise ValueError(f"--model transformer reads token ids (a text dataset such as imdb), got input shape "
                         f"{input_shape}" + ("" if vocab_size else " and no vocabulary"))
    return TransformerClassifier(vocab_size, num_outputs, max_length=input_shape[0], dim=scaled(32, width),
                                 ffn_dim=scaled(64, width), dropout=dropout)


NETWORKS: dict[str, Builder] = {
    "mlp": _mlp(lambda hidden: hidden),
    "lenet300-100": _mlp(lambda hidden: (300, 100)),
    "lenet5": _lenet5,
    "vit": _vit,
    "lenet5-cifar": _lenet5_cifar,
    "alexnet": _alexnet,
    "resnet18": _resnet("resnet18", resnet18),
    "resnet50": _resnet("resnet50", resnet50),
    "vgg16": _vgg16,
    "wrn28-10": _wide_resnet("wrn28-10", 28, 10),
    "transformer": _transformer,
}
"""Built-in names (the CLI's ``--model`` choices); ``tv:<name>`` (e.g. ``tv:resnet18``) builds any torchvision
classification model, and ``wrn<depth>-<k>`` (e.g. ``wrn16-4``) any wide ResNet."""

_ALIASES = {"lenet-300-100": "lenet300-100", "lenet-5": "lenet5", "lenet": "lenet5", "resnet-18": "resnet18",
            "resnet-50": "resnet50", "vgg-16": "vgg16", "wrn-28-10": "wrn28-10", "wide-resnet-28-10": "wrn28-10"}

_WIDE_RESNET = re.compile(r"wrn-?(\d+)-(\d+)")


class _GreyToRGB(nn.Module):
    """Repeat a single channel three times so grey images fit ImageNet-style models."""

    def forward(self, x):
        return x.expand(-1, 3, *x.shape[2:]) if x.shape[1] == 1 else x


def _torchvision(name: str, input_shape: tuple, num_outputs: int, width: float) -> nn.Module:
    import torchvision

    available = torchvision.models.list_models(module=torchvision.models)
    if name not in available:
        raise ValueError(f"model: unknown torchvision model {name!r}; choose one of {available}")
    if width != 1:
        raise ValueError(f"width: torchvision models have no width multiplier (tv:{name}); use 1, got {width!r}")
    net = torchvision.models.get_model(name, weights=None, num_classes=num_outputs)
    return nn.Sequential(_GreyToRGB(), net) if input_shape[0] == 1 else net


def _pretrained(source: str, input_shape: tuple, num_outputs: int, width: float, dropout: float,
                vocab_size: int | None, lora) -> nn.Module:
    from pyrobnn.networks import hf

    if len(input_shape) != 1 or vocab_size is None:
        raise ValueError(f"hf:{source} reads token ids (a text dataset such as imdb), got input shape {input_shape}")
    if width != 1 or dropout:
        raise ValueError(f"width and dropout do not apply to hf:{source} (a pretrained network keeps its own): use 1 "
                         f"and 0, got {width!r} and {dropout!r}")
    net = hf.load_classifier(source, num_outputs, lora=hf.LoRA() if lora is None else lora)
    hf.check_token_ids(source, net, vocab_size)
    return net


def build_net(
    name: str,
    input_shape: Sequence[int],
    num_outputs: int,
    *,
    hidden: Sequence[int] = (400,),
    dropout: float = 0.0,
    width: float = 1.0,
    vocab_size: int | None = None,
    lora=None,
) -> nn.Module:
    """Build a network by name for inputs of ``input_shape`` (per example) and ``num_outputs`` outputs.

    ``mlp`` uses ``hidden``; ``lenet300-100`` is ``MLP(784, (300, 100), 10)``; ``lenet5`` needs
    ``(C, 28|32, 28|32)`` images (ReLU, max-pool); ``vit`` is the small :class:`ViT` (7x7 patches of 28x28, 8x8 of
    32x32 images, ``dropout`` in its blocks). The CIFAR architectures need 3x32x32 images: ``lenet5-cifar``
    (paper 000's sigmoid, average-pool LeNet), ``alexnet``, ``resnet18``, ``resnet50``, ``vgg16``, ``wrn28-10``
    (and ``wrn<depth>-<k>``); ``dropout`` goes where the architecture has dropout (AlexNet's and VGG's
    classifiers, between the convolutions of a wide block, the ViT's blocks, after the MLP's hidden layers) and
    is refused by the others. ``width`` multiplies the hidden widths of every built-in model (``wrn28-10`` at
    ``width=0.1`` is WRN-28-1). ``tv:<name>`` is ``torchvision.models.get_model(name, num_classes=num_outputs)``
    (random init; grey inputs are repeated to 3 channels). ``transformer`` is the one-block
    :class:`TransformerClassifier` of token ids ``(L,)`` over ``vocab_size`` words (text datasets, e.g. imdb), the
    only one of the built-in models that takes them. ``hf:<name>`` (:data:`~pyrobnn.networks.hf.PRETRAINED`) and
    ``hf:<path>`` are a pretrained ``transformers`` classifier with ``lora`` adapters
    (:class:`~pyrobnn.networks.hf.LoRA`, default r 8 on query and value) and a new head, its backbone frozen;
    its token ids must come from its own tokenizer (:func:`~pyrobnn.networks.hf.load_tokenizer`).
    """
    key = name.lower()
    key = _ALIASES.get(key, key)
    input_shape = tuple(int(n) for n in input_shape)
    if key.startswith("hf:"):
        return _pretrained(name[3:], input_shape, num_outputs, width, dropout, vocab_size, lora)
    if lora is not None:
        raise ValueError(f"lora applies to pretrained networks (hf:NAME), not to {name!r}")
    if key.startswith("tv:"):
        return _torchvision(name[3:], input_shape, num_outputs, width)
    builder = NETWORKS.get(key)
    wide = _WIDE_RESNET.fullmatch(key)
    if builder is None and wide:
        builder = _wide_resnet(key, int(wide[1]), int(wide[2]))
    if builder is None:
        raise ValueError(f"unknown network {name!r}; choose one of {list(NETWORKS)}, 'wrn<depth>-<k>', "
                         "'tv:<torchvision name>' or 'hf:<pretrained name or folder>'")
    if (vocab_size is not None) != (builder is _transformer):
        raise ValueError(f"network {name!r} does not read token ids; use --model transformer or hf:NAME for "
                         "text" if vocab_size is not None else f"network {name!r} needs a text dataset (token ids)")
    extra = {"vocab_size": vocab_size} if builder is _transformer else {}
    return builder(input_shape, num_outputs, hidden=hidden, dropout=dropout, width=width, **extra)
