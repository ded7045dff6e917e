"""Network architectures and one door to them by name: a registry of network sources (:data:`SOURCES`) that
resolves a name once into a :class:`NetworkSpec`, which builds the network, gives its tokenizer and holds its
options.

The zoo (:data:`NETWORKS`): MNIST-sized ``mlp``, ``lenet300-100``, ``lenet5``, ``vit``; CIFAR-10 (3x32x32 inputs
only) ``lenet5-cifar`` and ``alexnet`` as paper 000 defines them, ``resnet18``, ``resnet50`` (CIFAR stem), ``vgg16``
(BatchNorm), ``wrn28-10`` (any ``wrn<depth>-<k>``); ``transformer`` for token ids. Every one is a plain
``nn.Module`` that :class:`~pyrobnn.BayesianNetwork` converts, and runs under every estimator handler, ``vdp``
included. ``tv:<name>``: any torchvision classifier. ``hf:<name>`` and ``hf:<path>``: pretrained ``transformers``
classifiers with LoRA adapters and their own tokenizer (:mod:`pyrobnn.networks.hf`, the ``hf`` extra). A new source
(another hub of pretrained models) is an entry of :data:`SOURCES`. :class:`PyroBNN` is a whole Pyro model instead,
the README's "Your own Pyro model".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Sequence

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
           "TransformerClassifier", "PyroBNN", "NETWORKS", "CIFAR_INPUT_SHAPE", "build_net", "NetworkSpec",
           "NetworkSource", "SOURCES", "network_spec"]

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


def _pretrained(spec: "NetworkSpec", input_shape: tuple, num_outputs: int, *, hidden, dropout: float,
                width: float, vocab_size: int | None) -> nn.Module:
    from pyrobnn.networks import hf

    if len(input_shape) != 1 or vocab_size is None:
        raise ValueError(f"{spec.name} reads token ids (a text dataset such as imdb), got input shape {input_shape}")
    if width != 1 or dropout:
        raise ValueError(f"width and dropout do not apply to {spec.name} (a pretrained network keeps its own): use 1 "
                         f"and 0, got {width!r} and {dropout!r}")
    net = hf.load_classifier(spec.folder(), num_outputs, lora=hf.LoRA() if spec.lora is None else spec.lora)
    hf.check_token_ids(spec.folder(), net, vocab_size)
    return net


def _zoo(spec: "NetworkSpec", input_shape: tuple, num_outputs: int, *, hidden, dropout: float, width: float,
         vocab_size: int | None) -> nn.Module:
    builder = NETWORKS.get(spec.key)
    if builder is None:
        depth, widen = _WIDE_RESNET.fullmatch(spec.key).groups()
        builder = _wide_resnet(spec.key, int(depth), int(widen))
    if (vocab_size is not None) != (builder is _transformer):
        raise ValueError(f"network {spec.name!r} does not read token ids; use --model transformer or hf:NAME for "
                         "text" if vocab_size is not None else
                         f"network {spec.name!r} needs a text dataset (token ids)")
    extra = {"vocab_size": vocab_size} if builder is _transformer else {}
    return builder(input_shape, num_outputs, hidden=hidden, dropout=dropout, width=width, **extra)


def _torchvision_source(spec: "NetworkSpec", input_shape: tuple, num_outputs: int, *, hidden, dropout: float,
                        width: float, vocab_size: int | None) -> nn.Module:
    return _torchvision(spec.key, input_shape, num_outputs, width)


def _zoo_key(name: str) -> str:
    key = name.lower()
    key = _ALIASES.get(key, key)
    if key not in NETWORKS and not _WIDE_RESNET.fullmatch(key):
        raise ValueError(f"unknown network {name!r}; choose one of {list(NETWORKS)}, 'wrn<depth>-<k>', "
                         f"{', '.join(repr(p + '<name>') for p in SOURCES if p)} (hf: a pretrained name or folder)")
    return key


def _hf_folder(spec: "NetworkSpec") -> Path:
    from pyrobnn.networks import hf

    return hf.pretrained_folder(spec.key)


def _hf_tokenizer(spec: "NetworkSpec"):
    from pyrobnn.networks import hf

    return hf.load_tokenizer(spec.folder())


def _hf_check(spec: "NetworkSpec") -> None:
    from pyrobnn.networks import hf

    hf.check_lora(spec.folder(), hf.LoRA() if spec.lora is None else spec.lora)


class NetworkSource(NamedTuple):
    """Where networks come from: how a name there becomes a key (``key``), the network of a spec (``build``), and,
    for a source of pretrained networks, their folder, tokenizer and check (the name, the weights, the options),
    and whether it takes LoRA adapters."""

    name: str
    key: Callable[[str], str]
    build: Callable[..., nn.Module]
    folder: Optional[Callable[["NetworkSpec"], Path]] = None
    tokenizer: Optional[Callable[["NetworkSpec"], object]] = None
    check: Optional[Callable[["NetworkSpec"], None]] = None
    takes_lora: bool = False


SOURCES: dict[str, NetworkSource] = {
    "": NetworkSource("zoo", _zoo_key, _zoo),
    "tv:": NetworkSource("torchvision", lambda name: name, _torchvision_source),
    "hf:": NetworkSource("transformers", lambda name: name, _pretrained, folder=_hf_folder, tokenizer=_hf_tokenizer,
                         check=_hf_check, takes_lora=True),
}
"""The sources of networks by the prefix of their names: the zoo (no prefix, :data:`NETWORKS`), torchvision
(``tv:``) and pretrained ``transformers`` classifiers (``hf:``, :mod:`pyrobnn.networks.hf`)."""


@dataclass(frozen=True)
class NetworkSpec:
    """A network named once (:func:`network_spec`): the name as written, its source (:data:`SOURCES`), the key there
    (an alias resolved; a torchvision name; a pretrained name or folder) and its options (a pretrained network's LoRA
    adapters, :class:`~pyrobnn.networks.hf.LoRA`; None: the defaults)."""

    name: str
    prefix: str
    key: str
    lora: object = None

    @property
    def source(self) -> NetworkSource:
        return SOURCES[self.prefix]

    @property
    def pretrained(self) -> bool:
        """Whether the network comes pretrained, with a folder and a tokenizer of its own."""
        return self.source.folder is not None

    def folder(self) -> Path:
        """A pretrained network's folder (its weights checked), resolved once."""
        if not self.pretrained:
            raise ValueError(f"{self.name} is built, not pretrained: it has no folder")
        return _folder(self)

    def tokenizer(self):
        """A pretrained network's own tokenizer (its texts' ids); None for a network built here."""
        return None if self.source.tokenizer is None else self.source.tokenizer(self)

    def check(self) -> None:
        """Before anything is loaded: a pretrained network's name or folder, its weights, and its options against
        its configuration (``ValueError``, ``ImportError`` naming the extra)."""
        if self.source.check is not None:
            self.source.check(self)

    def build(self, input_shape: Sequence[int], num_outputs: int, *, hidden: Sequence[int] = (400,),
              dropout: float = 0.0, width: float = 1.0, vocab_size: int | None = None) -> nn.Module:
        """The network for inputs of ``input_shape`` and ``num_outputs`` outputs (:func:`build_net`)."""
        return self.source.build(self, tuple(int(n) for n in input_shape), num_outputs, hidden=hidden,
                                 dropout=dropout, width=width, vocab_size=vocab_size)


_FOLDERS: dict = {}


def _folder(spec: NetworkSpec) -> Path:
    if spec.key not in _FOLDERS:
        _FOLDERS[spec.key] = spec.source.folder(spec)
    return _FOLDERS[spec.key]


def network_spec(name: str, lora=None) -> NetworkSpec:
    """The network ``name`` names, resolved once: its source by its prefix (:data:`SOURCES`), the key there, and
    ``lora`` (LoRA adapters, for a source that takes them); an unknown zoo name, or ``lora`` for a network that takes
    none, is a ``ValueError``."""
    prefix = next((p for p in SOURCES if p and name.lower().startswith(p)), "")
    source = SOURCES[prefix]
    if lora is not None and not source.takes_lora:
        raise ValueError(f"lora applies to pretrained networks (hf:NAME), not to {name!r}")
    return NetworkSpec(name, prefix, source.key(name[len(prefix):]), lora)


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
    """Build a network by name for inputs of ``input_shape`` (per example) and ``num_outputs`` outputs
    (:func:`network_spec`, then :meth:`NetworkSpec.build`).

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
    its token ids must come from its own tokenizer (:meth:`NetworkSpec.tokenizer`).
    """
    return network_spec(name, lora).build(input_shape, num_outputs, hidden=hidden, dropout=dropout, width=width,
                                          vocab_size=vocab_size)
