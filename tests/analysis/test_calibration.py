"""Post-hoc calibration (pyrobnn.analysis.calibration): temperature scaling against a grid search by hand, the NLL
and ECE on the rows it is fitted on, split conformal sets and intervals (their threshold by hand, and their coverage
on MNIST and UCI wine over 5 splits), evaluate(calibration=...), ``pyrobnn train --calibrate`` (its bad
options are among test_cli's bad inputs)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from pyrobnn import BayesianNetwork, Gaussian, NormalGuide, PointGuide, evaluate, fit
from pyrobnn.analysis.calibration import Calibrator, Mixture, calibrate, minimum_rows, predicted
from pyrobnn.analysis.metrics import ece
from pyrobnn.cli.options import RunConfig
from pyrobnn.cli.runs import calibration_split
from pyrobnn.data import load_dataset, two_moons
from pyrobnn.infer.ensemble import EnsembleResult
from pyrobnn.infer.optim import Optim
from pyrobnn.infer.predict import predictive_outputs
from pyrobnn.studies.cells import cache_key
from pyrobnn.studies.report import main_metrics
from tests.support import run_cli

FIT = dict(optimizer=Optim(lr=1e-2), seed=0, device="cpu", progress=False)


def overconfident(n: int = 600, classes: int = 4, components: int = 5, sharpness: float = 3.0, seed: int = 0):
    """Labels drawn from softmax(z), and a predictive of ``components`` draws of logits ``sharpness * z`` plus a
    little noise: over-confident by about a factor ``sharpness`` (temperature scaling should find T near it)."""
    g = torch.Generator().manual_seed(seed)
    z = 1.5 * torch.randn(n, classes, generator=g, dtype=torch.float64)
    y = torch.multinomial(z.softmax(-1), 1, generator=g)[:, 0]
    logits = sharpness * z + 0.3 * torch.randn(components, n, classes, generator=g, dtype=torch.float64)
    return logits, y


def hand_nll(logits: torch.Tensor, y: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """-1/N sum_i log (1/S sum_s softmax(logits_s / T)[y_i]) for each temperature in ``t`` (G,), written out
    without the module."""
    probs = torch.softmax(logits / t[:, None, None, None], -1).mean(1)  # (G, N, C)
    return -probs[:, torch.arange(len(y)), y].log().mean(-1)


def hand_regression_nll(means, scales, y, t: torch.Tensor) -> torch.Tensor:
    """-1/N sum_i log (1/S sum_s N(y_i; m + T (mu_s - m), T^2 sigma_s^2)), m the mean of the mu_s, for each T."""
    t = t[:, None, None, None]
    centre = means.mean(0)
    density = torch.exp(-0.5 * ((y - centre - t * (means - centre)) / (t * scales)) ** 2) / (
        math.sqrt(2 * math.pi) * t * scales)
    return -density.prod(-1).mean(1).log().mean(-1)


def grid_search(nll_of, low: float, high: float, step: float = 1e-3) -> tuple[float, float]:
    """The temperature of least NLL on the grid low, low + step, ..., high (in chunks) and its NLL."""
    grid = torch.arange(round(low / step), round(high / step) + 1, dtype=torch.float64) * step
    nlls = torch.cat([nll_of(part) for part in grid.split(250)])
    return float(grid[nlls.argmin()]), float(nlls.min())


# ----------------------------------------------------------------------------- temperature scaling


@pytest.mark.parametrize("sharpness, low, high", [(3.0, 1.0, 6.0), (0.5, 0.1, 1.2)],
                         ids=["over-confident", "under-confident"])
def test_temperature_is_the_minimum_of_a_fine_grid_search_by_hand(sharpness, low, high):
    logits, y = overconfident(n=400, sharpness=sharpness)
    calibrator = Calibrator().fit(Mixture(log_probs=logits.log_softmax(-1)), y)
    best, least = grid_search(lambda t: hand_nll(logits, y, t), low, high, step=2e-3)
    assert low < best < high and abs(calibrator.temperature - best) <= 2e-3, (calibrator.temperature, best)
    assert float(hand_nll(logits, y, torch.tensor([calibrator.temperature]))) <= least + 1e-12
    assert (calibrator.temperature > 1) == (sharpness > 1)  # sharper than the truth is cooled, flatter warmed


def test_regression_temperature_scales_the_predictive_std_and_matches_the_closed_form_and_a_grid():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(500, 2, generator=g, dtype=torch.float64)
    y = x + 0.7 * torch.randn(500, 2, generator=g, dtype=torch.float64)
    one = Mixture(means=x[None], scales=torch.full((1, 500, 2), 0.25, dtype=torch.float64))  # too narrow
    t = Calibrator().fit(one, y).temperature
    assert t == pytest.approx(float(((y - x) / 0.25).pow(2).mean().sqrt()), rel=1e-6)  # T^2 = mean z^2 (one Gaussian)
    mean, std = one.tempered(t).moments()
    torch.testing.assert_close(mean, x)
    torch.testing.assert_close(std, torch.full_like(x, 0.25 * t))

    means = x + 0.3 * torch.randn(6, 500, 2, generator=g, dtype=torch.float64)  # a mixture of 6 draws
    scales = 0.1 + 0.2 * torch.rand(6, 500, 2, generator=g, dtype=torch.float64)
    mixture = Mixture(means=means, scales=scales)
    t = Calibrator().fit(mixture, y).temperature
    best, least = grid_search(lambda v: hand_regression_nll(means, scales, y, v), 0.5, 6.0, step=2e-3)
    assert 0.5 < best < 6.0 and abs(t - best) <= 2e-3, (t, best)
    assert float(hand_regression_nll(means, scales, y, torch.tensor([t]))) <= least + 1e-12
    raw_mean, raw_std = mixture.moments()
    mean, std = mixture.tempered(t).moments()
    torch.testing.assert_close(mean, raw_mean)
    torch.testing.assert_close(std, t * raw_std)  # the whole predictive std, spread of the means included


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("sharpness", [0.3, 1.0, 4.0])
def test_the_nll_on_the_rows_it_is_fitted_on_is_never_worse(sharpness, seed):
    """Guaranteed: the search holds T = 1 (a calibrated fixture, sharpness 1, keeps T near 1)."""
    logits, y = overconfident(n=200, sharpness=sharpness, seed=seed)
    mixture = Mixture(log_probs=logits.log_softmax(-1))
    calibrator = Calibrator().fit(mixture, y)
    assert -calibrator(mixture).log_likelihood(y).mean() <= -mixture.log_likelihood(y).mean() + 1e-12
    if sharpness == 1.0:
        assert 0.7 < calibrator.temperature < 1.4


def test_ece_on_the_calibration_rows_falls_for_a_clearly_over_confident_predictive():
    """ECE is not monotone in the NLL, so it is not guaranteed to fall in general; on a predictive 4x too sharp
    (every confidence far above its accuracy) the fitted temperature removes most of the gap, on several seeds."""
    for seed in range(5):
        logits, y = overconfident(n=2000, sharpness=4.0, seed=seed)
        mixture = Mixture(log_probs=logits.log_softmax(-1))
        calibrator = Calibrator().fit(mixture, y)
        raw, calibrated = ece(mixture.probs(), y), ece(calibrator(mixture).probs(), y)
        assert calibrated < raw and calibrated < 0.5 * raw, (seed, raw, calibrated)


def test_temperature_keeps_each_components_arg_max_and_a_point_estimates_accuracy():
    logits, y = overconfident()
    mixture = Mixture(log_probs=logits[:1].log_softmax(-1))
    tempered = Calibrator().fit(mixture, y)(mixture)
    assert torch.equal(tempered.probs().argmax(-1), mixture.probs().argmax(-1))


# ----------------------------------------------------------------------------- split conformal prediction


def test_conformal_threshold_sets_and_intervals_by_hand():
    logits, y = overconfident(n=99, sharpness=1.0)
    mixture = Mixture(log_probs=logits.log_softmax(-1))
    calibrator = Calibrator(coverage=0.8).fit(mixture, y)
    scores = 1 - mixture.probs()[torch.arange(99), y]
    assert calibrator.threshold == float(scores.sort().values[80 - 1])  # ceil(100 * 0.8) = 80th smallest
    sets = calibrator.prediction_sets(mixture)
    torch.testing.assert_close(sets, mixture.probs() >= 1 - calibrator.threshold)
    assert int(sets[torch.arange(99), y].sum()) >= 80  # on its own rows: at least the 80 scores up to it

    g = torch.Generator().manual_seed(0)
    means, scales = torch.randn(3, 50, 1, generator=g), torch.rand(3, 50, 1, generator=g) + 0.5
    targets = torch.randn(50, generator=g)  # (N,) for one output (N, 1)
    regression = Mixture(means=means, scales=scales)
    calibrator = Calibrator(coverage=0.9).fit(regression, targets)
    mean, std = regression.moments()
    assert calibrator.threshold == pytest.approx(float(((targets[:, None] - mean).abs() / std).sort(0).values[46 - 1]))
    lower, upper = calibrator.prediction_intervals(regression)
    torch.testing.assert_close(upper - lower, 2 * calibrator.threshold * std)


def test_minimum_rows_is_the_least_n_with_a_finite_threshold():
    for coverage in (0.5, 0.8, 0.9, 0.95, 0.99):
        n = minimum_rows(coverage)
        assert math.ceil((n + 1) * coverage - 1e-9) <= n and math.ceil(n * coverage - 1e-9) > n - 1
    assert minimum_rows(0.9) == 9


def _map_network(x, y, classes: int, hidden: int = 32, epochs: int = 1, likelihood=None):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(x[0].numel(), hidden), nn.ReLU(), nn.Linear(hidden, classes))
    model = BayesianNetwork(net, likelihood, num_data=len(x))
    guide = PointGuide(model)
    fit(model, guide, x, y, epochs=epochs, batch_size=64, **FIT)
    return model, guide


def test_conformal_coverage_on_mnist_is_within_1_5_points_of_90_over_5_splits(data_root):
    """A MAP network trained for one epoch on 2,000 training images; each of 5 splits cuts the 10,000 test images at
    random into 5,000 calibration and 5,000 test rows. The coverage holds for any predictor; its Monte-Carlo spread
    is about 0.6 points per split and 0.27 for the mean of the 5, so 1.5 points is over 5 standard deviations.
    (Calibrated on held-out *training* images instead, as ``--calibrate`` does, the coverage comes out near 91 %: the
    MNIST test set is a little easier than the training set, so they are not quite exchangeable.)"""
    if not (data_root / "MNIST" / "raw").is_dir():
        pytest.skip(f"no MNIST under {data_root}")
    data = load_dataset("mnist", data_root, train_size=2000)
    model, guide = _map_network(data.x_train, data.y_train, 10)
    _, mixture = predicted(model, guide, data.x_test, num_samples=1)
    coverages, sizes = [], []
    for split in range(5):
        order = torch.randperm(len(data.x_test), generator=torch.Generator().manual_seed(split))
        cal, test = order[:5000], order[5000:]
        calibrator = Calibrator().fit(Mixture(log_probs=mixture.log_probs[:, cal]), data.y_test[cal])
        report = calibrator.report(Mixture(log_probs=mixture.log_probs[:, test]), data.y_test[test])
        coverages.append(report["conformal_coverage"])
        sizes.append(report["conformal_set_size"])
        assert abs(report["conformal_coverage"] - 0.9) < 0.03, (split, report)
    assert abs(sum(coverages) / 5 - 0.9) <= 0.015, coverages
    assert 0.5 < sum(sizes) / 5 < 3  # informative sets of a network at ~90 % accuracy


def test_conformal_coverage_on_uci_wine_is_within_1_5_points_of_90_over_5_splits(data_root):
    """UCI wine (red) has 160 test rows per split, too few for 1.5 points. Each of its first 5 splits trains a MAP
    network briefly on half its training rows and pools the other half (never trained on) with its test rows; over
    200 random partitions of that pool into calibration and test rows (as many as there were of each), the mean
    coverage is the conformal guarantee's expectation, spread about 0.2 points by the partitions."""
    if not (data_root / "uci" / "wine-quality-red").is_dir():
        pytest.skip(f"no UCI wine under {data_root}")
    means = []
    for split in range(5):
        data = load_dataset("uci-wine", data_root, split=split)
        half = len(data.x_train) // 2
        model, guide = _map_network(data.x_train[:half], data.y_train[:half], 1, hidden=16, epochs=5,
                                    likelihood=Gaussian(0.8))
        pool_x = torch.cat([data.x_train[half:], data.x_test])
        pool_y = torch.cat([data.y_train[half:], data.y_test])
        _, pool = predicted(model, guide, pool_x, num_samples=1)
        n_cal, g = len(data.x_train) - half, torch.Generator().manual_seed(split)
        coverages = []
        for _ in range(200):
            order = torch.randperm(len(pool_x), generator=g)
            cal, test = order[:n_cal], order[n_cal:]
            part = [Mixture(means=pool.means[:, rows], scales=pool.scales[:, rows]) for rows in (cal, test)]
            calibrator = Calibrator().fit(part[0], pool_y[cal])
            coverages.append(calibrator.report(part[1], pool_y[test])["conformal_coverage"])
        means.append(sum(coverages) / len(coverages))
        assert abs(means[-1] - 0.9) <= 0.015, (split, means[-1])
    assert abs(sum(means) / 5 - 0.9) <= 0.015, means


# ----------------------------------------------------------------------------- evaluate(calibration=...)


@pytest.fixture(scope="module")
def moons_fit():
    data = two_moons(n=700, n_train=500, seed=3)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))
    model = BayesianNetwork(net, num_data=400)
    guide = NormalGuide(model, init_rho=-4.0)
    fit(model, guide, data.x_train[:400], data.y_train[:400], epochs=20, batch_size=50, **FIT)
    return data, model, guide


def test_evaluate_adds_the_calibrated_metrics_and_keeps_the_raw_ones(moons_fit):
    data, model, guide = moons_fit
    x_val, y_val = data.x_train[400:], data.y_train[400:]
    torch.manual_seed(0)
    calibrator = calibrate(model, guide, x_val, y_val, num_samples=20)
    torch.manual_seed(1)
    raw = evaluate(model, guide, data.x_test, data.y_test, num_samples=20)
    torch.manual_seed(1)
    both = evaluate(model, guide, data.x_test, data.y_test, num_samples=20, calibration=calibrator)
    assert {k: both[k] for k in raw} == raw
    assert set(both) - set(raw) == {"nll_calibrated", "ece_calibrated", "temperature", "conformal_coverage",
                                    "conformal_set_size"}
    assert both["temperature"] == calibrator.temperature and calibrator.num_rows == 100
    calibrator.temperature = 1.0
    torch.manual_seed(1)
    untempered = evaluate(model, guide, data.x_test, data.y_test, num_samples=20, calibration=calibrator)
    assert untempered["nll_calibrated"] == pytest.approx(raw["nll"], rel=1e-5)
    assert untempered["ece_calibrated"] == pytest.approx(raw["ece"], abs=1e-5)


def test_an_ensembles_draws_are_calibrated_as_one_mixture(moons_fit):
    """PosteriorDraws (an ensemble, Laplace, NUTS): each draw's logits are divided by the one temperature."""
    data = moons_fit[0]
    guides = []
    for seed in range(3):
        torch.manual_seed(seed)
        member = BayesianNetwork(nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2)), num_data=400)
        guides.append(PointGuide(member))
        fit(member, guides[-1], data.x_train[:400], data.y_train[:400], epochs=3, batch_size=50, **FIT)
    draws = EnsembleResult.of(member, guides).guide()
    calibrator = calibrate(member, draws, data.x_train[400:], data.y_train[400:], num_samples=3)
    _, mixture = predicted(member, draws, data.x_test, num_samples=3)
    logits = predictive_outputs(member, draws, data.x_test, num_samples=3)  # (3, N, 2): one pass per member
    assert mixture.log_probs.shape == logits.shape == (3, len(data.x_test), 2)
    expected = torch.softmax(logits / calibrator.temperature, -1).mean(0)
    torch.testing.assert_close(calibrator(mixture).probs(), expected)
    assert calibrator.temperature != 1.0


def test_regression_report_is_in_the_targets_units(moons_fit):
    g = torch.Generator().manual_seed(0)
    means, scales = torch.randn(4, 80, 1, generator=g), 0.5 + torch.rand(4, 80, 1, generator=g)
    y = torch.randn(80, generator=g)
    standard = Mixture(means=means, scales=scales)
    calibrator = Calibrator().fit(standard, y)
    loc, scale = torch.tensor([3.0]), torch.tensor([10.0])
    here, there = calibrator.report(standard, y), calibrator.report(standard.affine(loc, scale), loc + scale * y)
    assert there["conformal_width"] == pytest.approx(10 * here["conformal_width"], rel=1e-5)
    assert there["log_likelihood_calibrated"] == pytest.approx(here["log_likelihood_calibrated"] - math.log(10),
                                                               rel=1e-5)
    assert there["conformal_coverage"] == here["conformal_coverage"]


# ----------------------------------------------------------------------------- bad inputs


def test_bad_inputs_are_clear_errors():
    logits, y = overconfident(n=20)
    mixture = Mixture(log_probs=logits.log_softmax(-1))
    for coverage in (0.0, 1.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="coverage"):
            Calibrator(coverage)
    with pytest.raises(ValueError, match="at least 9 held-out rows .* got 8"):
        Calibrator().fit(Mixture(log_probs=mixture.log_probs[:, :8]), y[:8])
    with pytest.raises(ValueError, match="at least 9 held-out rows .* got 0"):
        calibrate(None, None, torch.zeros(0, 2), torch.zeros(0, dtype=torch.long))
    with pytest.raises(RuntimeError, match="not fitted"):
        Calibrator()(mixture)
    with pytest.raises(ValueError, match="labels|y"):
        Calibrator().fit(mixture, y[:10])
    regression = Mixture(means=torch.zeros(1, 20, 1), scales=torch.ones(1, 20, 1))
    with pytest.raises(ValueError, match="fitted on a classification predictive"):
        Calibrator().fit(mixture, y)(regression)
    with pytest.raises(ValueError, match="shape"):
        Calibrator().fit(regression, torch.zeros(20, 2))


# ----------------------------------------------------------------------------- pyrobnn train --calibrate


MOONS = ["--dataset", "two-moons", "--train-size", 200, "--test-size", 200, "--hidden", 8, "--batch-size", 50,
         "--num-samples", 5, "--epochs", 2, "--no-progress"]  # test_cli's MOONS, with 200 training rows


def test_the_calibration_rows_are_held_out_of_the_training_set_at_fixed_positions():
    cfg = RunConfig()
    cfg.calibration.calibrate, cfg.calibration.fraction = True, 0.25
    data = two_moons(n=300, n_train=200, seed=0)
    kept, (x_held, y_held) = calibration_split(cfg, data)
    assert len(x_held) == 50 and len(kept.x_train) == 150 and len(kept.y_train) == 150
    rows = {tuple(row.tolist()) for row in data.x_train}
    held, trained = {tuple(r.tolist()) for r in x_held}, {tuple(r.tolist()) for r in kept.x_train}
    assert not held & trained and held | trained == rows
    again, (x_again, _) = calibration_split(cfg, data)
    assert torch.equal(x_again, x_held) and torch.equal(kept.x_test, data.x_test)
    cfg.calibration.calibrate = False
    assert calibration_split(cfg, data) == (data, None)


def test_train_calibrate_trains_without_the_held_out_rows_and_reports_the_calibrated_columns(tmp_path, capsys,
                                                                                            monkeypatch):
    from pyrobnn.methods import Variational

    seen = []
    original = Variational.train

    def recording(self, model, guide, x, y, **options):
        seen.append(len(x))
        return original(self, model, guide, x, y, **options)

    monkeypatch.setattr(Variational, "train", recording)
    out = tmp_path / "run"
    assert run_cli(["train", *MOONS, "--calibrate", "--calibrate.fraction", 0.2, "--out", out]) == 0
    assert seen == [160]
    printed = capsys.readouterr().out
    assert "160 train / 40 held out to calibrate" in printed and "calibrated on 40 held-out rows" in printed
    report = json.loads((out / "metrics.json").read_text())
    assert report["calibration"] == {"rows": 40, "fraction": 0.2, "coverage": 0.9, "seed": 0}
    for key in ("nll_calibrated", "ece_calibrated", "temperature", "conformal_coverage", "conformal_set_size"):
        assert isinstance(report["test"][key], float), key
    capsys.readouterr()
    assert run_cli(["evaluate", "--checkpoint", out / "checkpoint.pt", "--json", tmp_path / "e.json",
                    "--num-samples", 5, "--no-progress"]) == 0
    again = json.loads((tmp_path / "e.json").read_text())["test"]
    assert again["temperature"] == report["test"]["temperature"]


def test_help_shows_calibrate_and_studies_key_and_show_its_columns(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert run_cli(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.replace("│", "").split())
    for flag in ("--calibrate,", "--calibrate.fraction", "--calibrate.coverage", "never trained on"):
        assert flag in text, flag
    calibrated = RunConfig()
    calibrated.calibration.calibrate = True
    assert cache_key("train", RunConfig()) != cache_key("train", calibrated)
    columns = main_metrics(["accuracy", "nll", "ece", "nll_calibrated", "ece_calibrated", "temperature",
                            "conformal_coverage", "conformal_set_size"])
    assert columns[-5:] == ["nll_calibrated", "ece_calibrated", "temperature", "conformal_coverage",
                            "conformal_set_size"]
    assert {"log_likelihood_calibrated", "conformal_width"} <= set(main_metrics(
        ["rmse", "log_likelihood", "log_likelihood_calibrated", "temperature", "conformal_width"]))
