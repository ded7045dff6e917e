"""A user's own small pretrained model, built in seconds: a 2-layer BERT sequence classifier (its [CLS] pooler and
head, ``BertForSequenceClassification``) saved with safetensors, its own WordPiece vocabulary, and short labelled
sentences whose label follows a rule (a positive or negative word), with the plain peft + Adam loop a user already
has beside it. No download: the folder is written to a temporary directory."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

SUBJECTS = ("the film", "this movie", "the plot", "the cast", "the ending", "the music", "the script", "the story")
GOOD = ("good", "great")
BAD = ("bad", "awful")
FILLERS = ("was", "is", "felt", "seemed")
ADVERBS = ("really", "quite", "very", "truly", "rather", "so")
SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def vocabulary() -> list[str]:
    """The folder's vocabulary: the special tokens, then every word the sentences use."""
    words = sorted({w for phrase in (*SUBJECTS, *GOOD, *BAD, *FILLERS, *ADVERBS) for w in phrase.split()})
    return [*SPECIAL, *words, "."]


def sentences(count: int, seed: int) -> tuple[list[str], torch.Tensor]:
    """``count`` short sentences, half positive (label 1: a word of ``GOOD``), half negative, in a seeded order."""
    rng = random.Random(seed)
    texts, labels = [], []
    for i in range(count):
        label = i % 2
        words = [rng.choice(SUBJECTS), rng.choice(FILLERS), rng.choice(ADVERBS), rng.choice(GOOD if label else BAD)]
        texts.append(" ".join(words) + " .")
        labels.append(label)
    order = list(range(count))
    rng.shuffle(order)
    return [texts[i] for i in order], torch.tensor([labels[i] for i in order])


def bert_config(**changes):
    """The small BERT's configuration (2 layers, hidden 32, 64 positions, weights drawn with a standard deviation of
    0.1); ``changes`` override it."""
    import transformers

    options = dict(vocab_size=len(vocabulary()), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=64, max_position_embeddings=64, num_labels=2, pad_token_id=0,
                   initializer_range=0.1)
    return transformers.BertConfig(**{**options, **changes})


def save_small_bert(folder: Path, seed: int = 0, **changes) -> Path:
    """Write the small BERT (weights drawn from ``seed`` with a standard deviation of 0.1, where a user's folder
    holds trained ones) and its tokenizer to ``folder``: config.json, model.safetensors and the tokenizer's files."""
    import transformers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification(bert_config(**changes))
    model.save_pretrained(folder, safe_serialization=True)
    vocab = {word: i for i, word in enumerate(vocabulary())}
    transformers.BertTokenizerFast(vocab=vocab, do_lower_case=True).save_pretrained(folder)
    return folder


def config_of(folder: Path) -> dict:
    return json.loads((Path(folder) / "config.json").read_text())


def plain_peft_loop(folder: Path, x: torch.Tensor, y: torch.Tensor, *, lr: float = 5e-3, batch_size: int = 16,
                    epochs: int = 8, seed: int = 0, r: int = 8, alpha: float = 16.0):
    """What a user writes without pyrobnn: the folder's classifier, peft's LoRA on query and value (the head
    trained too), Adam at ``lr`` on the batch-mean cross-entropy, shuffled batches; returns the trained peft
    model (evaluation mode)."""
    import peft
    import transformers

    torch.manual_seed(seed)
    base = transformers.BertForSequenceClassification.from_pretrained(folder, num_labels=2, use_safetensors=True,
                                                                      local_files_only=True)
    model = peft.get_peft_model(base, peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=["query", "value"],
                                                      task_type="SEQ_CLS"))
    optim = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for rows in torch.randperm(len(x), generator=generator).split(batch_size):
            logits = model(input_ids=x[rows], attention_mask=(x[rows] != 0).long()).logits
            loss = torch.nn.functional.cross_entropy(logits, y[rows])
            optim.zero_grad()
            loss.backward()
            optim.step()
    return model.eval()


def accuracy(model, x: torch.Tensor, y: torch.Tensor) -> float:
    """Held-out accuracy of a peft or transformers classifier."""
    with torch.no_grad():
        logits = model(input_ids=x, attention_mask=(x != 0).long()).logits
    return float((logits.argmax(-1) == y).float().mean())
