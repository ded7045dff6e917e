"""The ``pyrobnn train`` options the examples' studies need.

``--init-from``: a run starts its network from a deterministic run's checkpoint (frequentist pre-training), so the
posterior means start at the pre-trained weights; a checkpoint of another network is one error naming the option.
``--guide.max-log-alpha`` and ``--guide.approximation`` reach the multiplicative guide; ``--variational-lr-factor``
gives the guide's parameters their own learning rate."""

from __future__ import annotations

import pytest
import torch

from pyrobnn.__main__ import main
from pyrobnn.checkpoint import load_checkpoint
from pyrobnn.cli import parse_config
from pyrobnn.cli.build import build, check_run, method_of
from pyrobnn.cli.options import RunConfig
from pyrobnn.cli.runs import load_data

TOY = ["--dataset", "two-moons", "--train-size", "40", "--test-size", "20", "--hidden", "8", "--epochs", "2",
       "--batch-size", "20", "--num-samples", "2", "--no-progress"]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    out = tmp_path_factory.mktemp("pretrain")
    main(["train", *TOY, "--bayesian", "none", "--out", str(out)])
    return out / "checkpoint.pt"


def configured(*argv: str) -> RunConfig:
    cfg = parse_config(RunConfig, [*TOY, *argv], "pyrobnn train")
    check_run(cfg)
    return cfg


@pytest.mark.parametrize("guide", [["--guide", "normal"], ["--guide", "additive", "--prior", "log-uniform"]])
def test_the_posterior_means_start_at_the_pretrained_weights(pretrained, guide):
    trained = {name[len("net."):]: value for name, value in load_checkpoint(pretrained)["model"].items()}
    cfg = configured("--init-from", str(pretrained), *guide)
    model, posterior = build(cfg, load_data(cfg))
    for site in model.sites():
        loc, _ = posterior.loc_scale(site.name)
        torch.testing.assert_close(loc, trained[site.name[len("net."):]], rtol=0, atol=0)
    fresh, _ = build(configured(*guide), load_data(cfg))  # without it: the seeded initialisation, elsewhere
    assert not torch.equal(fresh.sites()[0].init, model.sites()[0].init)


def test_a_checkpoint_of_another_network_is_one_error_naming_the_option(pretrained):
    cfg = configured("--init-from", str(pretrained), "--hidden", "16")
    with pytest.raises(ValueError, match=r"^--init-from .*does not fit this one \(pre-train with --bayesian none"):
        build(cfg, load_data(cfg))


def test_a_missing_checkpoint_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="--init-from .*no such file"):
        configured("--init-from", str(tmp_path / "nothing.pt"))
    with pytest.raises(SystemExit):
        main(["train", *TOY, "--init-from", str(tmp_path / "nothing.pt"), "--out", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


def test_the_multiplicative_guide_takes_its_bound_and_kl_approximation():
    cfg = configured("--guide", "multiplicative", "--prior", "log-uniform", "--guide.max-log-alpha", "8",
                     "--guide.approximation", "molchanov")
    _, guide = build(cfg, load_data(cfg))
    assert (guide.max_log_alpha, guide.approximation) == (8.0, "molchanov")


def test_the_guide_parameters_train_at_their_own_rate():
    cfg = configured("--prior", "node", "--guide", "mixture-node", "--lr", "0.002", "--variational-lr-factor", "10",
                     "--num-samples", "4")
    model, guide = build(cfg, load_data(cfg))
    network, variational = method_of(cfg).optimizer_factory(cfg.optim.epochs)(model, guide).param_groups
    assert (network["lr"], variational["lr"]) == (0.002, 0.02)
    assert {id(p) for p in variational["params"]} == {id(p) for p in guide.parameters()}
    assert {id(p) for p in network["params"]} == {id(p) for p in model.parameters()} and network["params"]
    with pytest.raises(ValueError, match="--variational-lr-factor"):
        configured("--variational-lr-factor", "0")
