"""Methods by name on the command line (``pyrobnn.cli.methods``): every preset parses as the options it stands for,
the user's options win over the preset's, the parametrized families resolve, a bad name is one error line, each
preset trains, and the former selector flags are aliases of ``--method`` that train as they did."""

from __future__ import annotations

import json
import re

import pytest

from pyrobnn.cli import _parse
from pyrobnn.cli.build import build, check_mcmc, check_run, method_of
from pyrobnn.cli.methods import METHOD_NAMES, expand_method, method_args, resolve_method
from pyrobnn.cli.options import MCMCConfig, RunConfig
from pyrobnn.cli.runs import load_data
from pyrobnn.methods import METHODS
from tests.support import ADAPTER_METHODS, error_line, run_cli

TOY = ["--dataset", "two-moons", "--train-size", "64", "--test-size", "32", "--hidden", "8", "--batch-size", "32",
       "--epochs", "1", "--no-progress"]


@pytest.mark.parametrize("name", sorted(METHODS))
def test_each_preset_parses_into_its_commands_configuration_and_passes_its_checks(name):
    method = METHODS[name]
    assert method.paper
    if method.command == "mcmc":
        cfg = _parse(["mcmc", *method_args(name)])
        assert isinstance(cfg, MCMCConfig)
        check_mcmc(cfg)
        return
    cfg = _parse(["train", *method_args(name), "--method", name])
    assert isinstance(cfg, RunConfig) and cfg.method == name
    check_run(cfg)


def test_presets_carry_their_papers_settings():
    """Spot checks against the papers (SPEC.md): Blundell's prior and 5 samples, Molchanov's initial log sigma^2,
    Kingma's initial log alpha, Gal's p = 0.5, paper 004's node prior and initialisation, VDP++'s eq. 11 and 12."""
    configs = {name: _parse(["train", *method_args(name), "--method", name]) for name, method in METHODS.items()
               if method.command == "train"}
    flags = {name: cfg.flags() for name, cfg in configs.items()}
    for name in configs:  # the report's draws reach the run as the method's (its name kept), not as an option
        cfg = _parse(expand_method(["train", "--method", name]))
        assert cfg.output.num_samples is None and method_of(cfg).num_samples == METHODS[name].num_samples, name
        flags[name]["--num-samples"] = method_of(cfg).num_samples
    assert (flags["bbb"]["--prior"], flags["bbb"]["--prior.pi"], flags["bbb"]["--num-particles"],
            flags["bbb"]["--beta"]) == ("scale-mixture", 0.25, 5, "geometric")
    assert flags["bbb"]["--prior.sigma2"] == pytest.approx(2.718281828459045 ** -8)
    assert (flags["bbb-local"]["--estimator"], flags["flipout"]["--estimator"]) == ("local", "flipout")
    assert flags["bbb-local"]["--prior"] == flags["flipout"]["--prior"] == "scale-mixture"  # only the estimator differs
    assert (flags["vd-additive"]["--guide"], flags["vd-additive"]["--guide.init-log-sigma2"]) == ("additive", -10.0)
    assert (flags["vd-multiplicative"]["--guide"], flags["vd-multiplicative"]["--guide.init-log-alpha"]) == (
        "multiplicative", -4.0)
    assert flags["variational-dense"]["--guide.parameterization"] == "log-variance"
    assert (flags["mcdropout"]["--guide"], flags["mcdropout"]["--guide.rate"]) == ("dropout", 0.5)
    assert (flags["map"]["--guide"], flags["map"]["--num-samples"]) == ("point", 1)
    assert (flags["ibnn-4"]["--prior.scale"], flags["ibnn-4"]["--guide.init-scale"],
            flags["ibnn-4"]["--guide.components"], flags["ibnn-4"]["--num-samples"]) == (0.3, 0.75, 4, 20)
    assert (flags["vdp"]["--estimator"], flags["vdp"]["--guide.share"],
            flags["vdp"]["--likelihood.vdp-objective"]) == ("vdp", "row", "gaussian")
    assert flags["ensemble-5"]["--guide"] == "point" and METHODS["ensemble-5"].members == 5
    assert flags["laplace"]["--num-samples"] == 100
    assert (flags["swag"]["--optimizer"], flags["swag"]["--lr"], flags["swag"]["--swag.lr"],
            flags["swag"]["--swag.rank"], flags["swag"]["--num-samples"]) == ("sgd", 0.05, 0.01, 20, 30)
    assert flags["multiswag-5"]["--num-samples"] == 20 and METHODS["multiswag-5"].members == 5
    assert [METHODS[name].sampler for name in ("sgld", "sghmc", "csghmc")] == ["sgld", "sghmc", "csghmc"]
    assert flags["csghmc"]["--lr"] == 0.5  # Zhang et al.'s lr_0
    assert (flags["ivon"]["--lr"], flags["ivon"]["--weight-decay"], flags["ivon"]["--ivon.hess-init"],
            flags["ivon"]["--ivon.beta2"]) == (0.1, 1e-4, 1.0, 0.99999)
    assert all(flags[name]["--guide"] == "point" for name in ("swag", "multiswag-5", "sgld", "sghmc", "csghmc"))


def test_variational_dense_and_sparse_vd_warm_up_the_kl():
    from pyrobnn.cli.build import beta_schedule
    from pyrobnn.infer.schedules import LinearWarmup

    cfg = _parse(["train", *method_args("variational-dense"), "--epochs", "9"])
    assert beta_schedule(cfg) == LinearWarmup(warmup=3, anneal=6)  # beta auto: the thesis' warm-up, by proportion
    for argv in (method_args("vd-additive"), ["--prior", "log-uniform", "--guide", "additive"]):
        cfg = _parse(["train", *argv, "--epochs", "9"])  # Molchanov et al.'s, in epochs: 0 for 5, then over 15
        assert beta_schedule(cfg) == LinearWarmup(warmup=5, anneal=15), argv


def test_families_resolve_any_positive_number_and_unknown_names_list_the_methods():
    assert resolve_method("ibnn-4") == METHODS["ibnn-4"]
    cfg = _parse(expand_method(["train", "--method", "ibnn-8"]))
    assert (cfg.guide.components, method_of(cfg).num_samples) == (8, 40)
    assert method_of(_parse(expand_method(["train", "--method", "ensemble-3"]))).members == 3
    multiswag = method_of(_parse(expand_method(["train", "--method", "multiswag-3"])))
    assert (type(multiswag).__name__, multiswag.members) == ("SWAG", 3)
    assert "ibnn-K" in METHOD_NAMES and "ensemble-M" in METHOD_NAMES and "ibnn-4" not in METHOD_NAMES
    assert "multiswag-M" in METHOD_NAMES and "multiswag-5" not in METHOD_NAMES
    for bad in ("bbbb", "ibnn-0", "ensemble-", "ensemble-x", "ibnn-2-3", "multiswag-0"):
        with pytest.raises(ValueError, match="unknown method.*bbb, bbb-local.*ensemble-M, laplace, swag, multiswag-M"):
            resolve_method(bad)


def test_expansion_puts_the_preset_first_so_the_users_options_win():
    argv = expand_method(["train", "--method", "mcdropout", "--guide.rate", "0.1", "--estimator", "sample"])
    assert argv[:3] == ["train", "--prior", "gaussian"] and argv[-6:] == ["--method", "mcdropout", "--guide.rate",
                                                                         "0.1", "--estimator", "sample"]
    cfg = _parse(argv)
    assert (cfg.method, cfg.guide.name, cfg.guide.rate, cfg.optim.estimator) == ("mcdropout", "dropout", 0.1, "sample")
    assert _parse(expand_method(["train", "--method=bbb"])).prior.name == "scale-mixture"
    # the estimator the user names equals the command's default: it still wins over the preset's "local"
    cfg = _parse(expand_method(["train", "--method", "bbb-local", "--estimator", "sample"]))
    assert cfg.optim.estimator == "sample"
    for unchanged in (["train", "--epochs", "2"], ["train", "--method", "nope"], ["train", "--method", "nuts"],
                      ["evaluate", "--method", "bbb"], []):
        assert expand_method(unchanged) == unchanged
    mcmc = expand_method(["mcmc", "--method", "nuts", "--seed", "2"])  # MCMCConfig records no method
    assert mcmc == ["mcmc", *method_args("nuts"), "--seed", "2"]


@pytest.mark.parametrize("argv, message", [
    (["--method", "bbbb"], "--method bbbb: unknown method; choose one of bbb, bbb-local"),
    (["--method", "nuts"], "--method nuts runs with `pyrobnn mcmc`"),
    (["--method", "ensemble-2", "--guide", "normal"], "a deep ensemble of 2 starts from MAP fits: --guide must be "
                                                      "point estimates (PointGuide), got NormalGuide"),
    (["--method", "laplace", "--guide", "normal"], "the Laplace approximation starts from MAP fits: --guide must be"),
    (["--method", "ivon", "--optimizer", "sgd"], "--optimizer does not apply to --method ivon: IVON is its own "
                                                 "optimiser"),
])
def test_bad_methods_and_posteriors_are_one_error_line_and_write_nothing(argv, message, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(["train", *TOY, *argv, "--out", out]) == 2
    assert message in error_line(capsys)
    assert not out.exists()


def test_help_lists_the_methods_and_their_own_options(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    assert run_cli(["train", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--method {bbb,bbb-local," in text
    assert all(name in text for name in METHOD_NAMES)
    for flag in ("--swag.start", "--swag.rank", "--swag.lr", "--sgmcmc.temperature", "--sgmcmc.chains", "--ivon.ess",
                 "--ivon.hess-init"):
        assert flag in text
    assert not re.search(r"--(laplace|ensemble|swag|sgmcmc)\b(?![.-])", text)  # aliases of --method, not options


TRAINED = [name for name, method in METHODS.items() if method.command == "train" and name not in ADAPTER_METHODS]
"""The presets ``pyrobnn train`` runs on a toy network (BLoB's and Laplace-LoRA's adapters: tests/networks/ and
tests/methods/test_laplace_lora.py)."""


def test_laplace_lora_refuses_a_network_without_adapters_before_training(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(["train", *TOY, "--method", "laplace-lora", "--out", out]) == 2
    assert "laplace-lora approximates the posterior of LoRA adapters, and the network has none" in error_line(capsys)
    assert not out.exists()

LONGER = {"swag": ["--epochs", "2"], "multiswag-5": ["--epochs", "2"]}
"""What a preset needs beyond one epoch of TOY: SWAG collects two iterates (one per epoch)."""

DRAWS = ("ensemble-5", "laplace", "swag", "multiswag-5", "sgld", "sghmc", "csghmc", "ivon")
"""The presets whose posterior is draws (written to draws.pt)."""


@pytest.mark.parametrize("name", TRAINED)
def test_each_train_preset_trains_one_epoch_and_records_its_name(name, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(["train", *TOY, "--method", name, *LONGER.get(name, []), "--out", out]) == 0, \
        capsys.readouterr().err
    report = json.loads((out / "metrics.json").read_text())
    assert report["config"]["method"] == name
    assert 0 <= report["test"]["accuracy"] <= 1 and report["test"]["nll"] > 0
    assert (out / "draws.pt").exists() == (name in DRAWS)
    assert name in capsys.readouterr().out  # the row of the test table


def test_nuts_preset_samples_through_pyrobnn_mcmc(tmp_path, capsys):
    out = tmp_path / "nuts"
    assert run_cli(["mcmc", "--method", "nuts", "--train-size", 30, "--test-size", 20, "--hidden", 4,
                    "--num-samples", 10, "--warmup", 10, "--num-chains", 1, "--no-progress", "--out", out]) == 0
    assert (out / "draws.pt").exists()


def test_presets_build_the_guides_they_name():
    from pyrobnn.guides import GUIDES

    for name in TRAINED:
        cfg = _parse(["train", *method_args(name), *TOY, "--method", name])
        model, guide = build(cfg, load_data(cfg))
        assert isinstance(guide, GUIDES[cfg.guide.name]) and model.sites(), name


OLD = ["--dataset", "two-moons", "--train-size", "96", "--test-size", "64", "--hidden", "8", "--batch-size", "32",
       "--epochs", "4", "--num-samples", "8", "--no-progress", "--seed", "3"]

FORMER = {  # the former selector flags: the figures of pyrobnn train at a6ca7fd (this 2-core CPU, one thread)
    "ensemble-2": (["--ensemble", "2", "--guide", "point"],
                   {"loss": 1.1011816395653617, "nll": 0.6939291954040527, "accuracy": 0.515625}),
    "laplace": (["--laplace", "--guide", "point"],
                {"loss": 1.175924645529853, "nll": 0.7294176816940308, "accuracy": 0.515625}),
    "swag": (["--swag", "--guide", "point", "--optimizer", "sgd", "--lr", "0.05"],
             {"loss": 1.0495538976457384, "nll": 0.6294383406639099, "accuracy": 0.734375}),
    "multiswag-2": (["--swag", "--ensemble", "2", "--guide", "point", "--optimizer", "sgd", "--lr", "0.05",
                     "--swag.rank", "3"], {"loss": 0.9114338292015923, "nll": 0.5706137418746948, "accuracy": 0.75}),
    "sgld": (["--sgmcmc", "sgld", "--guide", "point", "--lr", "0.05", "--beta", "constant"],
             {"loss": 1.1145775583055284, "nll": 0.6723835468292236, "accuracy": 0.5625}),
    "sghmc": (["--sgmcmc", "sghmc", "--sgmcmc.chains", "2", "--guide", "point", "--lr", "0.01", "--beta", "constant"],
              {"loss": 1.0436083475748699, "nll": 0.6523736715316772, "accuracy": 0.734375}),
}
"""A former command line -> the figures it gave before the selector flags became aliases of ``--method``."""


@pytest.mark.parametrize("name", sorted(FORMER))
def test_a_former_selector_flag_names_its_method_warns_and_trains_as_it_did(name, tmp_path, capsys):
    argv, recorded = FORMER[name]
    with pytest.warns(DeprecationWarning, match=f"write --method {name}"):
        assert run_cli(["train", *OLD, *argv, "--out", tmp_path / "run"]) == 0
    assert f"warning: {argv[0]}" in capsys.readouterr().err
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["config"]["method"] == name
    got = {"loss": metrics["history"][-1]["loss"], "nll": metrics["test"]["nll"],
           "accuracy": metrics["test"]["accuracy"]}
    assert got == pytest.approx(recorded, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("argv, message", [
    (["--laplace", "--ensemble", "2"], "--laplace and --ensemble 2 are two posteriors: choose one --method"),
    (["--method", "swag", "--laplace"], "--laplace stands for --method laplace, and --method swag names another"),
    (["--ensemble", "-1"], "--ensemble must be a non-negative integer"),
])
def test_former_selector_flags_that_name_two_methods_are_one_error_line(argv, message, tmp_path, capsys):
    assert run_cli(["train", *TOY, "--guide", "point", *argv, "--out", tmp_path / "run"]) == 2
    assert message in capsys.readouterr().err.splitlines()[-1]
    assert not (tmp_path / "run").exists()


def test_a_stored_configuration_with_the_former_selectors_reads_as_its_method():
    from pyrobnn.cli.methods import legacy_config

    values = RunConfig().to_dict()
    del values["method_options"]
    values["posterior"] = {"ensemble": 3, "laplace": False, "swag": True, "swag_start": None, "swag_rank": 5,
                           "swag_lr": None, "sgmcmc": "none", "sgmcmc_temperature": 1.0, "sgmcmc_friction": None,
                           "sgmcmc_cycles": None, "sgmcmc_exploration": None, "sgmcmc_chains": 1}
    cfg = RunConfig.from_dict(legacy_config(values))
    assert cfg.method == "multiswag-3" and cfg.method_options.swag_rank == 5
