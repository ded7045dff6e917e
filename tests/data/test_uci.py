"""The UCI regression benchmark: the loader (the shared folder, any folder in the layout, downloads, the "looked in"
error), standardisation on the training rows only, the test log-likelihood in the target's original units, and
hyper-parameters chosen by ``--grid`` on the training split alone."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pyro
import pytest
import torch
from scipy import stats
from scipy.special import logsumexp

from pyrobnn import BayesianNetwork, DropoutGuide, PointGuide
from pyrobnn.__main__ import main
from pyrobnn.analysis.evaluate import evaluate
from pyrobnn.analysis.metrics import mixture_log_likelihood
from pyrobnn.cli import _parse
from pyrobnn.cli.build import Run
from pyrobnn.cli.grid import grid_axes, grid_points, select_hyperparameters
from pyrobnn.cli.runs import load_data
from pyrobnn.data import load_dataset, uci_protocol
from pyrobnn.data import uci as uci_module
from pyrobnn.infer.predict import predictive_outputs
from pyrobnn.model.likelihoods import Gaussian
from pyrobnn.networks import MLP
from tests.support import ROOT

COLUMNS = (0, 2, 3)  # the synthetic data set's features; column 1 is the target, column 3 is constant
TARGET = 1


def write_folder(folder, n: int = 30, n_splits: int = 2, seed: int = 0, subfolder: str = ""):
    """A tiny data set in the UCI layout: ``n`` rows, the target in column 1, a constant feature, ``n_splits``
    random 80/20 splits and the protocol files. Returns the data table."""
    rng = np.random.default_rng(seed)
    table = np.column_stack([rng.normal(3, 2, n), rng.normal(50, 10, n), rng.uniform(-1, 1, n), np.full(n, 7.0)])
    where = folder / subfolder if subfolder else folder
    where.mkdir(parents=True)
    np.savetxt(where / "data.txt", table)
    np.savetxt(where / "index_features.txt", COLUMNS, fmt="%d")
    np.savetxt(where / "index_target.txt", [TARGET], fmt="%d")
    np.savetxt(where / "n_splits.txt", [n_splits], fmt="%d")
    for i in range(n_splits):
        perm = rng.permutation(n)
        np.savetxt(where / f"index_train_{i}.txt", perm[: int(0.8 * n)], fmt="%d")
        np.savetxt(where / f"index_test_{i}.txt", perm[int(0.8 * n):], fmt="%d")
    for name, values, fmt in (("n_hidden", [4], "%d"), ("n_epochs", [2], "%d"), ("dropout_rates", [0.01, 0.1], "%g"),
                              ("tau_values", [0.5, 2.0], "%g")):
        np.savetxt(where / f"{name}.txt", values, fmt=fmt)
    return table


def rows(folder, part: str, split: int) -> np.ndarray:
    return np.loadtxt(folder / f"index_{part}_{split}.txt", dtype=np.int64)


@pytest.fixture
def folder(tmp_path):
    path = tmp_path / "tiny"
    write_folder(path)
    return path


# ----------------------------------------------------------------------------- the loader


def test_shared_boston_is_the_published_split(data_root):
    """Split 3 of Boston Housing: 455 train / 51 test rows of data.txt as the index files name them, 13 inputs."""
    data = load_dataset("uci-boston", data_root, split=3, download=False)
    folder = data_root / "uci" / "bostonHousing"
    table = np.loadtxt(folder / "data.txt")
    train, test = rows(folder, "train", 3), rows(folder, "test", 3)
    assert data.x_train.shape == (455, 13) and data.x_test.shape == (51, 13) and data.y_train.shape == (455, 1)
    assert data.name == "uci-boston" and data.task == "regression" and data.num_outputs == 1
    assert sorted(np.concatenate([train, test]).tolist()) == list(range(506))
    y_test = data.y_test.double() * data.y_std.double() + data.y_mean.double()
    np.testing.assert_allclose(y_test.numpy()[:, 0], table[test, 13], rtol=1e-5)
    assert float(data.y_mean) == pytest.approx(table[train, 13].mean(), rel=1e-6)


def test_names_aliases_and_paths_load_the_same_data(data_root):
    reference = load_dataset("uci-yacht", data_root, split=5, download=False)
    for name in ("uci_yacht", "UCI-Yacht", "uci:yacht", f"uci:{data_root / 'uci' / 'yacht'}"):
        other = load_dataset(name, data_root, split=5, download=False)
        assert torch.equal(other.x_train, reference.x_train) and torch.equal(other.y_test, reference.y_test)
    assert torch.equal(load_dataset("uci-bostonHousing", data_root, download=False).x_train,
                       load_dataset("uci-boston", data_root, split=0, download=False).x_train)


def test_any_folder_in_the_layout_is_standardised_on_its_training_rows(folder):
    """Hand computation with numpy: the population mean and deviation of the training rows; a constant input keeps
    its values (deviation taken as 1, as Gal's net.py)."""
    table = np.loadtxt(folder / "data.txt")
    data = load_dataset(f"uci:{folder}", split=1)
    train, test = rows(folder, "train", 1), rows(folder, "test", 1)
    x_tr, x_te = table[np.ix_(train, COLUMNS)], table[np.ix_(test, COLUMNS)]
    mean, std = x_tr.mean(0), x_tr.std(0)
    std[std == 0] = 1
    np.testing.assert_allclose(data.x_train.numpy(), (x_tr - mean) / std, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(data.x_test.numpy(), (x_te - mean) / std, rtol=1e-5, atol=1e-6)
    y_mean, y_std = table[train, TARGET].mean(), table[train, TARGET].std()
    np.testing.assert_allclose(data.y_test.numpy()[:, 0], (table[test, TARGET] - y_mean) / y_std, rtol=1e-5)
    assert (float(data.y_mean), float(data.y_std)) == pytest.approx((y_mean, y_std), rel=1e-6)
    assert data.x_train.dtype == torch.float32 and data.input_shape == (3,)


def test_standardisation_never_reads_the_test_rows(folder):
    """Changing every test row (inputs and target) changes nothing the model trains on."""
    before = load_dataset(f"uci:{folder}", split=0)
    table = np.loadtxt(folder / "data.txt")
    table[rows(folder, "test", 0)] *= 1000.0
    np.savetxt(folder / "data.txt", table)
    after = load_dataset(f"uci:{folder}", split=0)
    assert torch.equal(before.x_train, after.x_train) and torch.equal(before.y_train, after.y_train)
    assert torch.equal(before.y_std, after.y_std) and torch.equal(before.y_mean, after.y_mean)
    assert not torch.equal(before.x_test, after.x_test)


def test_validation_split_is_the_last_fifth_of_the_training_rows(folder):
    """Gal's experiment.py: the first int(0.8 n) training rows are fitted, the rest held out, standardised on the
    fitted rows; the test split's file is not needed."""
    (folder / "index_test_1.txt").unlink()
    table = np.loadtxt(folder / "data.txt")
    held = load_dataset(f"uci:{folder}", split=1, validation=True)
    train = rows(folder, "train", 1)
    keep = int(0.8 * len(train))
    assert len(held.x_train) == keep and len(held.x_test) == len(train) - keep
    y_fit = table[train[:keep], TARGET]
    np.testing.assert_allclose(held.y_test.numpy()[:, 0], (table[train[keep:], TARGET] - y_fit.mean()) / y_fit.std(),
                               rtol=1e-5)


def test_the_data_subfolder_of_gals_layout_is_found(tmp_path):
    write_folder(tmp_path / "uci" / "yacht", subfolder="data")
    data = load_dataset("uci-yacht", tmp_path, split=1, download=False)
    assert data.x_train.shape == (24, 3)
    assert uci_protocol("uci-yacht", tmp_path, download=False).tau_values == (0.5, 2.0)


def test_protocol_files_of_the_shared_folder(data_root):
    protocol = uci_protocol("uci-boston", data_root, download=False)
    assert (protocol.n_splits, protocol.n_hidden, protocol.n_epochs) == (20, 50, 40)
    assert protocol.dropout_rates == (0.005, 0.01, 0.05, 0.1) and protocol.tau_values == (0.1, 0.15, 0.2)
    with pytest.raises(ValueError, match="no protocol files"):
        uci_protocol("two-moons")


def test_a_missing_data_set_names_the_folder_it_looked_in(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        load_dataset("uci-kin8nm", tmp_path, download=False)
    assert str(tmp_path / "uci" / "kin8nm") in str(info.value) and "Downloading was disabled" in str(info.value)
    with pytest.raises(FileNotFoundError, match="looked for data.txt"):
        load_dataset(f"uci:{tmp_path / 'nowhere'}")


def test_an_offline_download_fails_fast_and_leaves_no_trace(tmp_path, monkeypatch):
    def offline(url, timeout):
        raise OSError("network unreachable")

    monkeypatch.setattr(uci_module.urllib.request, "urlopen", offline)
    with pytest.raises(FileNotFoundError, match="Downloading them failed .*network unreachable") as info:
        load_dataset("uci-energy", tmp_path)
    assert str(tmp_path / "uci" / "energy") in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_a_download_writes_the_layout_from_gals_repository(tmp_path, monkeypatch, folder):
    """The files are fetched from UCI_URL (served here from a local folder) and the data set then loads."""
    asked = []

    def serve(url, timeout):
        asked.append(url)
        return io.BytesIO((folder / url.rsplit("/", 1)[1]).read_bytes())

    monkeypatch.setattr(uci_module.urllib.request, "urlopen", serve)
    data = load_dataset("uci-wine", tmp_path, split=1)
    assert all(url.startswith(uci_module.UCI_URL.format(folder="wine-quality-red", file="")) for url in asked)
    assert (tmp_path / "uci" / "wine-quality-red" / "index_test_1.txt").is_file()
    assert torch.equal(data.x_train, load_dataset(f"uci:{folder}", split=1).x_train)


def test_bad_splits_are_one_clear_error(folder, data_root):
    with pytest.raises(ValueError, match=r"split must be an integer in \[0, 1\]"):
        load_dataset(f"uci:{folder}", split=2)
    with pytest.raises(ValueError, match="split applies to the UCI data sets"):
        load_dataset("two-moons", split=1)
    with pytest.raises(ValueError, match="dtype applies to image datasets"):
        load_dataset("uci-boston", data_root, dtype=torch.uint8)


# ----------------------------------------------------------------------------- the test log-likelihood


def test_mixture_log_likelihood_against_scipy():
    g = torch.Generator().manual_seed(0)
    means = torch.randn(7, 5, 1, generator=g, dtype=torch.float64)
    scales = torch.rand(7, 5, 1, generator=g, dtype=torch.float64) + 0.2
    y = torch.randn(5, 1, generator=g, dtype=torch.float64)
    expected = np.mean(logsumexp(stats.norm.logpdf(y.numpy()[None], means.numpy(), scales.numpy())[..., 0], axis=0)
                       - math.log(7))
    assert mixture_log_likelihood(means, scales, y) == pytest.approx(expected, rel=1e-10)


def _regression_model(guide_class, scale: float, **guide_options):
    torch.manual_seed(1)
    model = BayesianNetwork(MLP(3, (8,), 1), Gaussian(scale), num_data=20)
    return model, guide_class(model, **guide_options)


@pytest.mark.parametrize("guide_class, options", [(PointGuide, {}), (DropoutGuide, {"rate": 0.3})])
def test_test_metrics_in_the_targets_original_units(guide_class, options):
    """RMSE of the predictive mean and the mixture log-likelihood of targets standardised with (mu, s), against the
    same computed by hand in original units: log N(y; mu + s f_t(x), (s sigma)^2), i.e. the standardised figure
    minus log s."""
    model, guide = _regression_model(guide_class, scale=0.4, **options)
    x, y = torch.randn(12, 3), torch.randn(12, 1)
    mu, s = torch.tensor([30.0]), torch.tensor([9.0])
    pyro.set_rng_seed(3)
    outputs = predictive_outputs(model, guide, x, num_samples=50).double().numpy()
    pyro.set_rng_seed(3)
    standardised = evaluate(model, guide, x, y, num_samples=50)
    pyro.set_rng_seed(3)
    original = evaluate(model, guide, x, y, num_samples=50, target_scale=(mu, s))
    y_orig = 30.0 + 9.0 * y.double().numpy()
    f = 30.0 + 9.0 * outputs
    log_density = stats.norm.logpdf(y_orig[None], f, 9.0 * 0.4)[..., 0]
    assert original["log_likelihood"] == pytest.approx(np.mean(logsumexp(log_density, 0) - math.log(50)), rel=1e-5)
    assert original["rmse"] == pytest.approx(np.sqrt(np.mean((y_orig - f.mean(0)) ** 2)), rel=1e-5)
    assert original["log_likelihood"] == pytest.approx(standardised["log_likelihood"] - math.log(9.0), rel=1e-5)
    assert original["rmse"] == pytest.approx(9.0 * standardised["rmse"], rel=1e-5)


# ----------------------------------------------------------------------------- hyper-parameters on the training split


def _cfg(folder, tmp_path, *extra):
    return _parse(["train", "--dataset", f"uci:{folder}", "--split", "1", "--hidden", "4", "--epochs", "2",
                   "--guide", "dropout", "--estimator", "local", "--num-samples", "5", "--no-progress",
                   "--out", str(tmp_path / "run"), *extra])


def test_the_grid_never_reads_the_test_split(folder, tmp_path, request):
    cfg = _cfg(folder, tmp_path, "--grid", "guide.rate=0.01,0.2", "tau=0.5,2")
    data = load_data(cfg)  # the run's own data: its test split is read here, before the search
    read = request.getfixturevalue("forbid_test_split")
    chosen, selection = select_hyperparameters(Run.of(cfg), data)
    chosen = chosen.config
    assert read and set(read) == {("train", 1)}
    assert len(selection["points"]) == 4 and (selection["fit_size"], selection["held_out_size"]) == (19, 5)
    tau = float(selection["chosen"]["tau"])
    assert chosen.likelihood.scale == pytest.approx(1 / (math.sqrt(tau) * float(data.y_std)))
    assert chosen.guide.rate == float(selection["chosen"]["guide.rate"])
    best = max(selection["points"], key=lambda p: p["log_likelihood"])
    assert best["values"] == selection["chosen"]


def test_grid_protocol_is_the_data_sets_grid(folder, data_root, tmp_path):
    assert grid_axes(_cfg(folder, tmp_path, "--grid", "protocol")) == [("guide.rate", ("0.01", "0.1")),
                                                                       ("tau", ("0.5", "2.0"))]
    cfg = _parse(["train", "--dataset", "uci-boston", "--data-root", str(data_root), "--grid", "protocol", "lr=0.01"])
    assert grid_axes(cfg) == [("tau", ("0.1", "0.15", "0.2")), ("lr", ("0.01",))]


@pytest.mark.parametrize("grid, message", [
    (["foo=1,2"], "--grid foo: not an option"),
    (["split=1,2"], "not the data and output options"),
    (["lr"], "write NAME=V1,V2"),
    (["tau=1", "likelihood.scale=2"], "name one of them"),
    (["lr=0.1", "lr=0.2"], "names lr more than once"),
    (["guide.rate=half"], "not a valid float"),
    (["tau=0.5,-1"], "--grid tau=-1: the noise precision must be a positive number"),
])
def test_bad_grids_are_one_clear_error(folder, tmp_path, grid, message):
    cfg = _cfg(folder, tmp_path, "--grid", *grid)
    with pytest.raises(ValueError, match=message):
        select_hyperparameters(Run.of(cfg), load_data(cfg))


def test_a_likelihood_that_learns_its_noise_takes_no_noise_precision_from_the_grid(folder, tmp_path):
    heteroscedastic = _cfg(folder, tmp_path, "--likelihood", "heteroscedastic", "--grid", "protocol")
    assert grid_axes(heteroscedastic) == [("guide.rate", ("0.01", "0.1"))]
    learned = _cfg(folder, tmp_path, "--likelihood.learn-scale", "--grid", "protocol")
    assert grid_axes(learned) == [("guide.rate", ("0.01", "0.1"))]
    with pytest.raises(ValueError, match="--grid tau: --likelihood heteroscedastic learns the noise"):
        grid_axes(_cfg(folder, tmp_path, "--likelihood", "heteroscedastic", "--grid", "tau=0.5,2"))
    # nothing left to choose: the run trains as given, no search
    plain = _parse(["train", "--dataset", f"uci:{folder}", "--split", "1", "--hidden", "4", "--epochs", "2",
                    "--likelihood", "heteroscedastic", "--grid", "protocol", "--no-progress",
                    "--out", str(tmp_path / "plain")])
    run = Run.of(plain)
    assert grid_axes(plain) == [] and select_hyperparameters(run, load_data(plain)) == (run, None)


def test_the_likelihood_is_chosen_on_held_out_data_and_a_heteroscedastic_point_takes_no_tau(folder, tmp_path):
    cfg = _cfg(folder, tmp_path, "--grid", "protocol", "likelihood=gaussian,heteroscedastic")
    axes = grid_axes(cfg)
    assert axes == [("guide.rate", ("0.01", "0.1")), ("tau", ("0.5", "2.0")),
                    ("likelihood", ("gaussian", "heteroscedastic"))]
    assert grid_points(cfg, axes) == [
        {"guide.rate": "0.01", "tau": "0.5", "likelihood": "gaussian"},
        {"guide.rate": "0.01", "likelihood": "heteroscedastic"},
        {"guide.rate": "0.01", "tau": "2.0", "likelihood": "gaussian"},
        {"guide.rate": "0.1", "tau": "0.5", "likelihood": "gaussian"},
        {"guide.rate": "0.1", "likelihood": "heteroscedastic"},
        {"guide.rate": "0.1", "tau": "2.0", "likelihood": "gaussian"}]
    data = load_data(cfg)
    chosen, selection = select_hyperparameters(Run.of(cfg), data)
    chosen = chosen.config
    assert len(selection["points"]) == 6
    best = max(selection["points"], key=lambda p: p["log_likelihood"])
    assert best["values"] == selection["chosen"] and chosen.likelihood.name == best["values"]["likelihood"]
    scores = {p["values"]["likelihood"] for p in selection["points"] if math.isfinite(p["log_likelihood"])}
    assert scores == {"gaussian", "heteroscedastic"}  # both kinds of point were trained and scored


def test_with_an_ensemble_each_grid_point_is_scored_as_its_ensemble(folder, tmp_path, monkeypatch):
    import pyrobnn.cli.grid as grid_module
    import pyrobnn.methods.base as method_module
    from pyrobnn.guides.empirical import PosteriorDraws

    stacked, scored = [], []
    fit_replicas, test_report = method_module.fit_replicas, grid_module.test_report
    monkeypatch.setattr(method_module, "fit_replicas", lambda pairs, *a, **k: (stacked.append(pairs),
                                                                                fit_replicas(pairs, *a, **k))[1])
    monkeypatch.setattr(grid_module, "test_report", lambda posterior, held, *a, **k: (
        scored.append((posterior.guide, posterior.num_samples)), test_report(posterior, held, *a, **k))[1])
    cfg = _cfg(folder, tmp_path, "--guide", "point", "--estimator", "sample", "--num-samples", "1", "--method",
               "ensemble-3", "--grid", "tau=0.5,2")
    _, selection = select_hyperparameters(Run.of(cfg), load_data(cfg))
    assert [len(pairs) for pairs in stacked] == [6]  # 2 points x 3 members, one stack
    assert len(scored) == 2 and all(isinstance(g, PosteriorDraws) and n == 3 for g, n in scored)
    for guide, _ in scored:  # three distinct members: their own initialisations
        first = next(iter(guide.draws().values()))
        assert len(guide) == 3 and not torch.allclose(first[0], first[1])
    assert all(math.isfinite(p["log_likelihood"]) for p in selection["points"])


def test_grid_protocol_needs_a_data_set_with_one(tmp_path):
    cfg = _parse(["train", "--dataset", "cubic", "--grid", "protocol", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="no protocol files"):
        grid_axes(cfg)


def test_train_with_a_grid_records_the_choice_and_evaluate_reproduces_it(folder, tmp_path):
    out = tmp_path / "run"
    main(["train", "--dataset", f"uci:{folder}", "--split", "1", "--hidden", "4", "--epochs", "2", "--guide",
          "dropout", "--estimator", "local", "--num-samples", "20", "--grid", "protocol", "--no-progress",
          "--out", str(out)])
    report = json.loads((out / "metrics.json").read_text())
    selection = report["selection"]
    assert selection["grid"] == {"guide.rate": ["0.01", "0.1"], "tau": ["0.5", "2.0"]}
    assert len(selection["points"]) == 4 and set(report["test"]) >= {"rmse", "log_likelihood", "nll"}
    assert report["config"]["guide"]["rate"] == float(selection["chosen"]["guide.rate"])
    main(["evaluate", "--checkpoint", str(out / "checkpoint.pt"), "--num-samples", "20", "--no-progress",
          "--json", str(tmp_path / "eval.json")])
    evaluated = json.loads((tmp_path / "eval.json").read_text())["test"]
    assert evaluated.pop("mc_error") == pytest.approx(report["test"].pop("mc_error"))
    assert evaluated == pytest.approx(report["test"])


def test_resume_is_refused_with_a_grid(folder, tmp_path):
    cfg = _cfg(folder, tmp_path, "--grid", "lr=0.01", "--resume")
    with pytest.raises(ValueError, match="--resume does not apply to a run with --grid"):
        select_hyperparameters(Run.of(cfg), load_data(cfg))


# ----------------------------------------------------------------------------- the study files


@pytest.mark.slow
@pytest.mark.parametrize("file, cells", [("uci_quick.toml", 5 * 2 * 5), ("uci.toml", 5 * 7 * 20)])
def test_the_uci_study_files_run_at_ci_size(file, cells, data_root, tmp_path, monkeypatch):
    """Every method of the file on one split of Yacht for one epoch, through the study engine (the file's grid,
    protocol and predictive, in miniature)."""
    from pyrobnn.studies.spec import Study

    study = Study.from_file(ROOT / "studies" / file)
    assert len(study.labels()) * study.splits == cells  # (cells() would parse all 700 command lines)
    assert study.resolved_baseline() == "method=mcdropout"  # each data set's methods against its MC dropout
    monkeypatch.setenv("PYROBNN_DATA", str(data_root))
    small = study.replace(splits=1, baseline=None, vary={"method": list(study.vary["method"])},
                          base=[*study.base, "--dataset", "uci-yacht", "--epochs", "1", "--num-samples", "12"])
    records = small.run(tmp_path, progress=False)
    assert [r["status"] for r in records] == ["done"] * len(study.vary["method"]), [r["error"] for r in records]
    assert all(math.isfinite(r["metrics"]["log_likelihood"]) and r["metrics"]["rmse"] > 0 for r in records)


def test_the_gal_configuration_decays_the_weights_as_gal(data_root):
    """``studies/uci.toml --configuration gal``: each data set's MC dropout cell trains under the Gaussian prior of
    scale sqrt(2) / (l s_y) that makes our loss proportional to Gal's (net.py: reg = l^2 (1 - p) / (2 N tau),
    l = 1e-2, on the mean squared error of the standardised target), s_y the target's standard deviation averaged
    over the 20 training splits, computed here from the data files with numpy (ddof 0, as Gal's)."""
    from pyrobnn.studies.cells import parse_cell
    from pyrobnn.studies.spec import Study

    study = Study.from_file(ROOT / "studies" / "uci.toml", "gal")
    cells = study.replace(splits=1).cells()
    assert {cell.axes["method"] for cell in cells} == {"mcdropout"}
    folders = {"uci-boston": "bostonHousing", "uci-concrete": "concrete", "uci-energy": "energy",
               "uci-wine": "wine-quality-red", "uci-yacht": "yacht"}
    assert sorted(cell.axes["dataset"] for cell in cells) == sorted(folders)
    for cell in cells:
        folder = data_root / "uci" / folders[cell.axes["dataset"]]
        folder = folder / "data" if (folder / "data").is_dir() else folder
        rows = np.loadtxt(folder / "data.txt")
        target = rows[:, int(np.loadtxt(folder / "index_target.txt"))]
        s_y = np.mean([target[np.loadtxt(folder / f"index_train_{i}.txt").astype(int)].std() for i in range(20)])
        cfg = parse_cell(cell.command, cell.argv)
        assert cfg.prior.scale == pytest.approx(math.sqrt(2) / (1e-2 * s_y), rel=5e-3), cell.label
        assert (cfg.optim.epochs, cfg.optim.lr, cfg.guide.name) == (4000, 1e-3, "dropout")
