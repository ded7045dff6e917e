"""Every option of the command line, set to a value other than its default, reaches what it configures.

One parametrized case per flag of ``pyrobnn train`` and ``pyrobnn mcmc`` (the option tables themselves, so a new
option without a case fails here): the flag is parsed by tyro, the run's checks pass, and the model, guide,
schedule and optimiser are built from it. ``_construct`` refuses any option its constructor does not take, so an
option that reaches its object under another name (``--guide.components`` did) fails here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pyrobnn.checkpoint import save_checkpoint
from pyrobnn.cli import _parse
from pyrobnn.cli.build import beta_schedule, build, build_network, check_mcmc, check_run, method_of
from pyrobnn.cli.methods import expand_method
from pyrobnn.cli.options import MCMCConfig, RunConfig
from pyrobnn.cli.runs import load_data

TOY = ["--dataset", "two-moons", "--train-size", "40", "--test-size", "20", "--hidden", "8"]
MIXTURE = ["--prior", "node", "--guide", "mixture-node"]
SWAG = ["--method", "swag", "--epochs", "4"]
SGMCMC = ["--method", "sghmc"]
IVON = ["--method", "ivon"]
SNGP = ["--method", "sngp"]
HF = ["--dataset", "imdb", "--model", "hf:minilm-l6", "--data.max-length", "16"]

TRAIN_CASES: dict[str, tuple[list[str], list[str]]] = {
    # flag: (its non-default value on the command line, the other options it needs)
    "--dataset": (["sinusoid"], []),
    "--data-root": (["{data_root}"], ["--dataset", "mnist"]),
    "--train-size": (["30"], []),
    "--test-size": (["10"], []),
    "--val-size": (["5"], []),
    "--augment": ([], ["--dataset", "mnist", "--data-root", "{data_root}"]),
    "--split": (["3"], ["--dataset", "uci-yacht", "--data-root", "{data_root}"]),
    "--data.target": (["y"], ["--dataset", "csv:{table}"]),
    "--data.task": (["regression"], ["--dataset", "csv:{table}", "--data.target", "y"]),
    "--data.features": (["x1", "kind"], ["--dataset", "csv:{table}"]),
    "--data.categorical": (["code"], ["--dataset", "csv:{table}"]),
    "--data.folds": (["3"], ["--dataset", "csv:{table}", "--split", "2"]),
    "--data.test-fraction": (["0.3"], ["--dataset", "csv:{table}"]),
    "--data.seed": (["2"], ["--dataset", "csv:{table}"]),
    "--model": (["lenet300-100"], []),
    "--hidden": (["8", "4"], []),
    "--dropout": (["0.2"], []),
    "--width": (["0.5"], []),
    "--bayesian": (["last-layer"], []),
    "--init-from": (["{pretrained}"], []),
    "--data.max-length": (["16"], ["--dataset", "imdb", "--model", "transformer"]),
    "--lora-rank": (["4"], HF),
    "--lora-alpha": (["8"], HF),
    "--lora-targets": (["query", "key"], HF),
    "--prior": (["scale-mixture"], []),
    "--prior.scale": (["0.5"], []),
    "--prior.fan-in": ([], []),
    "--prior.bias-scale": (["0.5"], []),
    "--prior.mode": (["out"], ["--prior", "node", "--guide", "mixture-node"]),
    "--prior.bias": ([], ["--prior", "node", "--guide", "mixture-node"]),
    "--prior.pi": (["0.5"], ["--prior", "scale-mixture"]),
    "--prior.sigma1": (["2.0"], ["--prior", "scale-mixture"]),
    "--prior.sigma2": (["0.01"], ["--prior", "scale-mixture"]),
    "--guide": (["point"], []),
    "--guide.parameterization": (["log-variance"], []),
    "--guide.share": (["row"], []),
    "--guide.init-rho": (["-4.0"], []),
    "--guide.init-log-sigma2": (["-8.0"], ["--guide", "additive", "--prior", "log-uniform"]),
    "--guide.mask-pruned": ([], ["--guide", "additive", "--prior", "log-uniform"]),
    "--guide.init-log-alpha": (["-3.0"], ["--guide", "multiplicative", "--prior", "log-uniform"]),
    "--guide.max-log-alpha": (["8.0"], ["--guide", "multiplicative", "--prior", "log-uniform",
                                        "--guide.approximation", "molchanov"]),
    "--guide.approximation": (["molchanov"], ["--guide", "multiplicative", "--prior", "log-uniform"]),
    "--guide.rate": (["0.1"], ["--guide", "dropout"]),
    "--guide.rates": (["net.1.*=0"], ["--guide", "dropout"]),
    "--guide.components": (["8"], MIXTURE + ["--batch-size", "8", "--num-samples", "8"]),
    "--guide.init-scale": (["0.3"], MIXTURE),
    "--guide.kl": (["entropy-bound"], MIXTURE),
    "--guide.entropy-weight": (["0.5"], MIXTURE),
    "--likelihood": (["gaussian"], ["--dataset", "sinusoid"]),
    "--likelihood.scale": (["0.3"], ["--dataset", "sinusoid"]),
    "--likelihood.learn-scale": ([], ["--dataset", "sinusoid"]),
    "--likelihood.vdp-objective": (["cross-entropy"], []),
    "--epochs": (["2"], []),
    "--batch-size": (["16"], []),
    "--lr": (["0.01"], []),
    "--optimizer": (["sgd"], []),
    "--weight-decay": (["0.001"], []),
    "--kl-lr": (["0.01"], []),
    "--lr-step": (["2"], []),
    "--lr-gamma": (["0.1"], ["--lr-step", "1"]),
    "--lr-linear-from": (["0.5"], []),
    "--variational-lr-factor": (["10"], MIXTURE),
    "--num-particles": (["3"], []),
    "--precision": (["bf16"], []),
    "--estimator": (["local"], []),
    "--compile": (["trace"], []),
    "--beta": (["linear"], []),
    "--beta.value": (["0.5"], ["--beta", "constant"]),
    "--beta.warmup": (["2"], ["--beta", "linear"]),
    "--beta.anneal": (["3"], ["--beta", "linear"]),
    "--seed": (["7"], []),
    "--device": (["cpu"], []),
    "--grid": (["lr=0.01,0.001"], []),
    "--out": (["{tmp}/elsewhere"], []),
    "--resume": ([], []),
    "--overwrite": ([], []),
    "--max-memory": (["0.5"], []),
    "--method": (["map"], []),
    "--swag.start": (["1"], SWAG),
    "--swag.rank": (["5"], SWAG),
    "--swag.lr": (["0.0005"], SWAG),
    "--sgmcmc.temperature": (["0.5"], SGMCMC),
    "--sgmcmc.friction": (["0.5"], SGMCMC),
    "--sgmcmc.cycles": (["2"], SGMCMC),
    "--sgmcmc.exploration": (["0.3"], SGMCMC),
    "--sgmcmc.chains": (["2"], SGMCMC),
    "--ivon.ess": (["100"], IVON),
    "--ivon.hess-init": (["0.5"], IVON),
    "--ivon.beta1": (["0.8"], IVON),
    "--ivon.beta2": (["0.999"], IVON),
    "--sngp.features": (["64"], SNGP),
    "--sngp.bound": (["3"], SNGP),
    "--sngp.length-scale": (["2"], SNGP),
    "--sngp.mean-field": (["1"], SNGP),
    "--progress": ([], []),  # the flag of a bool defaulting to True is --no-progress
    "--num-samples": (["7"], []),
    "--ood-dataset": (["fashion-mnist"], ["--dataset", "mnist", "--data-root", "{data_root}"]),
    "--corruptions": (["3"], []),
    "--corruption-types": (["fog"], []),
    "--calibrate": ([], []),
    "--calibrate.fraction": (["0.25"], ["--calibrate"]),
    "--calibrate.coverage": (["0.8"], ["--calibrate"]),
}

MCMC_CASES: dict[str, tuple[list[str], list[str]]] = {
    "--dataset": (["cubic"], []),
    "--data-root": (["{data_root}"], ["--dataset", "uci-yacht"]),
    "--train-size": (["30"], []),
    "--test-size": (["10"], []),
    "--val-size": None,
    "--augment": None,
    "--split": (["3"], ["--dataset", "uci-yacht", "--data-root", "{data_root}"]),
    **dict.fromkeys(["--data.target", "--data.task", "--data.features", "--data.categorical", "--data.folds",
                     "--data.test-fraction", "--data.seed"]),  # tables are for pyrobnn train
    "--model": None,  # mlp is the only choice
    "--hidden": (["4", "4"], []),
    "--dropout": None,
    "--width": (["0.5"], []),
    "--bayesian": (["last-layer"], []),
    "--init-from": None,  # NUTS starts from the seeded initial weights
    **dict.fromkeys(["--data.max-length", "--lora-rank", "--lora-alpha", "--lora-targets"]),  # pyrobnn train's
    "--prior": (["scale-mixture"], []),
    "--prior.scale": (["0.5"], []),
    "--prior.fan-in": ([], []),
    "--prior.bias-scale": (["0.5"], []),
    "--prior.mode": None,  # node priors are refused by mcmc (test_cli)
    "--prior.bias": None,
    "--prior.pi": (["0.5"], ["--prior", "scale-mixture"]),
    "--prior.sigma1": (["2.0"], ["--prior", "scale-mixture"]),
    "--prior.sigma2": (["0.01"], ["--prior", "scale-mixture"]),
    "--likelihood": (["gaussian"], ["--dataset", "cubic"]),
    "--likelihood.scale": (["0.3"], ["--dataset", "cubic"]),
    "--likelihood.learn-scale": None,
    "--likelihood.vdp-objective": None,
    "--num-samples": (["7"], []),
    "--warmup": (["3"], []),
    "--num-chains": (["3"], []),
    "--target-accept": (["0.9"], []),
    "--max-tree-depth": (["4"], []),
    "--init-jitter": (["0.1"], []),
    "--map-steps": (["5"], []),
    "--sampler": (["pyro"], []),
    "--compile": (["trace"], []),
    "--grid": (["tau=0.5,1"], ["--dataset", "cubic"]),
    "--grid-samples": (["50"], []),
    "--out": (["{tmp}/elsewhere"], []),
    "--seed": (["7"], []),
    "--progress": ([], []),
    "--calibrate": ([], []),
    "--calibrate.fraction": (["0.25"], ["--calibrate"]),
    "--calibrate.coverage": (["0.8"], ["--calibrate"]),
}


def _argv(flag: str, value: list[str], context: list[str], default_flags: dict) -> list[str]:
    if not value and default_flags[flag] is True:
        flag = "--no-" + flag[2:]
    return [flag, *value, *context]


def _pretrained(tmp_path) -> str:
    """A deterministic run's checkpoint of the TOY network, what --init-from reads."""
    cfg = _parse(["train", *TOY, "--bayesian", "none"])
    path = tmp_path / "pretrained.pt"
    save_checkpoint(path, {"model": build_network(cfg, load_data(cfg)).state_dict(), "guide": {}, "epoch": 0})
    return str(path)


def _table(tmp_path) -> str:
    """A CSV table of 100 rows: numbers x1, x2, text kind, codes 1-3, a 0/1 label y and, last, a number z."""
    rng = np.random.default_rng(0)
    path = tmp_path / "table.csv"
    rows = [f"{rng.normal():.3f},{rng.normal():.3f},{'abc'[i % 3]},{1 + i % 3},{i % 2},{rng.normal():.3f}"
            for i in range(100)]
    path.write_text("\n".join(["x1,x2,kind,code,y,z", *rows]) + "\n")
    return str(path)


def _fill(args: list[str], data_root, tmp_path) -> list[str]:
    pretrained = _pretrained(tmp_path) if any("{pretrained}" in a for a in args) else None
    table = _table(tmp_path) if any("{table}" in a for a in args) else None
    return [a.format(data_root=data_root, tmp=tmp_path, pretrained=pretrained, table=table) for a in args]


def test_every_option_has_a_case():
    assert set(TRAIN_CASES) == set(RunConfig().flags())
    assert set(MCMC_CASES) == set(MCMCConfig().flags())


@pytest.mark.parametrize("flag", sorted(TRAIN_CASES))
def test_each_train_option_with_a_non_default_value_builds_the_run(flag, data_root, tmp_path):
    value, context = TRAIN_CASES[flag]
    argv = ["train", *TOY, "--out", str(tmp_path / "run"), *context, *_argv(flag, value, [], RunConfig().flags())]
    cfg = _parse(expand_method(_fill(argv, data_root, tmp_path)))
    assert cfg.flags()[flag] != RunConfig().flags()[flag], "the value did not reach the run configuration"
    check_run(cfg)
    cfg.data.train_size = min(cfg.data.train_size or 40, 40)
    data = load_data(cfg)
    model, guide = build(cfg, data)
    beta_schedule(cfg)
    method_of(cfg).optimizer_factory(cfg.optim.epochs)(model, guide)
    assert model.sites() or cfg.guide.name == "point"


def test_lr_linear_from_is_molchanovs_schedule_and_excludes_lr_step(tmp_path):
    """--lr-linear-from 0.5: the rate is constant for the first half of the epochs, then falls linearly towards 0
    (Molchanov et al.'s lr_linear); with --lr-step as well, one clear error before training."""
    cfg = _parse(["train", *TOY, "--epochs", "10", "--lr-linear-from", "0.5", "--out", str(tmp_path)])
    check_run(cfg)
    schedule = method_of(cfg).optimizer_factory(cfg.optim.epochs).schedule
    assert [round(schedule(epoch), 6) for epoch in range(10)] == [1, 1, 1, 1, 1, 1, 0.8, 0.6, 0.4, 0.2]
    for extra, message in ((["--lr-step", "2"], "--lr-step and --lr-linear-from"),
                           (["--lr-linear-from", "1.5"], "--lr-linear-from")):
        with pytest.raises(ValueError, match=message):
            check_run(_parse(["train", *TOY, "--lr-linear-from", "0.5", *extra, "--out", str(tmp_path)]))


def test_guide_components_reaches_the_mixture_guide(tmp_path):
    """f307a6a: ``--guide.components 8`` failed with "does not apply": the option reached the guide under
    another name (``num_components``)."""
    cfg = _parse(["train", *TOY, *MIXTURE, "--guide.components", "8", "--batch-size", "8", "--num-samples", "8",
                  "--out", str(tmp_path)])
    check_run(cfg)
    _, guide = build(cfg, load_data(cfg))
    assert guide.num_components == 8


def test_prior_fan_in_scales_each_weight_matrix_and_bias_scale_the_biases(tmp_path):
    """--prior.fan-in --prior.scale 2 --prior.bias-scale 0.5: N(0, 4 / fan_in) on every weight matrix, N(0, 0.25) on
    every bias; with another prior the options are refused."""
    cfg = _parse(["train", *TOY, "--prior.fan-in", "--prior.scale", "2", "--prior.bias-scale", "0.5", "--out",
                  str(tmp_path)])
    check_run(cfg)
    model, _ = build(cfg, load_data(cfg))
    scales = {site.name: (site.shape, site.prior_distribution().scale) for site in model.sites()}
    assert len(scales) >= 4
    for name, (shape, scale) in scales.items():
        expected = 0.5 if len(shape) == 1 else 2 / math.sqrt(math.prod(shape[1:]))
        assert scale == pytest.approx(expected), name
    with pytest.raises(ValueError, match="--prior.fan-in does not apply to --prior scale-mixture"):
        build(_parse(["train", *TOY, "--prior", "scale-mixture", "--prior.fan-in", "--out", str(tmp_path)]),
              load_data(cfg))


def test_guide_rates_set_the_rate_of_each_layer_and_bad_entries_are_refused_before_training(tmp_path):
    dropout = ["train", *TOY, "--guide", "dropout", "--guide.rate", "0.2", "--out", str(tmp_path)]
    cfg = _parse([*dropout, "--guide.rates", "net.1.*=0", "net.3.weight=0.1"])
    check_run(cfg)
    _, guide = build(cfg, load_data(cfg))
    assert {name: guide.rate(name) for name in guide.site_names} == {
        "net.1.weight": 0.0, "net.1.bias": 0.0, "net.3.weight": 0.1, "net.3.bias": 0.2}
    for extra, message in ((["--guide.rates", "net.1.*"], r"--guide.rates 'net.1.\*': write GLOB=RATE"),
                           (["--guide.rates", "net.1.*=half"], "write GLOB=RATE"),
                           (["--guide.rates", "net.1.*=1.5"], r"must be a number in \[0, 1\)"),
                           (["--guide.rates", "*=0", "--guide", "normal"], "--guide.rates does not apply to --guide "
                                                                            "normal")):
        with pytest.raises(ValueError, match=message):
            run = _parse([*dropout, *extra])
            check_run(run)
            build(run, load_data(run))
    with pytest.raises(ValueError, match="'conv1.' matches no site of the model; its sites are net.1.weight"):
        run = _parse([*dropout, "--guide.rates", "conv1.=0"])
        build(run, load_data(run))


@pytest.mark.parametrize("flag", sorted(f for f, case in MCMC_CASES.items() if case is not None))
def test_each_mcmc_option_with_a_non_default_value_builds_the_run(flag, tmp_path, request):
    value, context = MCMC_CASES[flag]
    defaults = MCMCConfig().flags()
    argv = ["mcmc", "--train-size", "40", "--test-size", "20", "--out", str(tmp_path / "run"), *context,
            *_argv(flag, value, [], defaults)]
    data_root = request.getfixturevalue("data_root") if any("{data_root}" in a for a in argv) else None
    cfg = _parse(_fill(argv, data_root, tmp_path))
    assert cfg.flags()[flag] != defaults[flag]
    check_mcmc(cfg)
    assert build_network(cfg, load_data(cfg)).sites()
