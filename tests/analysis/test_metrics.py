from __future__ import annotations

import math

import pytest
import torch

from pyrobnn.analysis.metrics import (
    accuracy,
    brier,
    classification_metrics,
    ece,
    nll,
    regression_metrics,
    reliability,
    reliability_diagram,
)
from pyrobnn.model.likelihoods import Categorical, Likelihood, uncertainty

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def manual_entropy(p: list[float]) -> float:
    return -sum(pi * math.log(pi) for pi in p if pi > 0)


def random_probs(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(*shape, generator=g, dtype=torch.float64)).softmax(-1)


# ----------------------------------------------------------------------------- uncertainty (pyrobnn.model.likelihoods)


def test_uncertainty_identical_samples_have_no_epistemic():
    p = torch.tensor([[0.7, 0.2, 0.1], [0.25, 0.25, 0.5], [1.0, 0.0, 0.0]], dtype=torch.float64)
    out = uncertainty(p.expand(5, -1, -1))
    expected = torch.tensor([manual_entropy(row) for row in p.tolist()], dtype=torch.float64)
    assert set(out) == {"total", "aleatoric", "epistemic"}
    assert all(v.shape == (3,) for v in out.values())
    torch.testing.assert_close(out["total"], expected)
    torch.testing.assert_close(out["aleatoric"], expected)
    torch.testing.assert_close(out["epistemic"], torch.zeros(3, dtype=torch.float64), atol=1e-12, rtol=0)
    assert out["total"][2] == 0  # 0 log 0 = 0, no nan


def test_uncertainty_disagreeing_one_hot_samples_are_purely_epistemic():
    p = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])  # S=2, N=1, C=2
    out = uncertainty(p)
    assert out["aleatoric"].item() == 0
    assert out["total"].item() == pytest.approx(math.log(2))
    assert out["epistemic"].item() == pytest.approx(math.log(2))
    assert not any(torch.isnan(v).any() for v in out.values())


def test_uncertainty_matches_manual_computation_and_decomposes():
    probs = random_probs(7, 11, 4, seed=1)
    out = uncertainty(probs)
    for n in range(11):
        samples = probs[:, n].tolist()
        mean = [sum(s[c] for s in samples) / len(samples) for c in range(4)]
        assert out["total"][n].item() == pytest.approx(manual_entropy(mean), rel=1e-10)
        ale = sum(manual_entropy(s) for s in samples) / len(samples)
        assert out["aleatoric"][n].item() == pytest.approx(ale, rel=1e-10)
    torch.testing.assert_close(out["total"], out["aleatoric"] + out["epistemic"])
    assert (out["epistemic"] >= 0).all()
    assert (out["epistemic"] > 0).all()  # random samples disagree
    assert (out["total"] <= math.log(4) + 1e-12).all()


def test_uncertainty_float32_nonnegative_epistemic():
    probs = random_probs(30, 200, 10, seed=2).float()
    out = uncertainty(probs)
    assert (out["epistemic"] >= 0).all()
    torch.testing.assert_close(out["total"], out["aleatoric"] + out["epistemic"], atol=1e-5, rtol=0)


def test_categorical_predictive_is_the_mean_softmax_with_its_uncertainty_split():
    logits = torch.tensor([[[2.0, 0.0]], [[0.0, 2.0]]], dtype=torch.float64)  # S=2, N=1, C=2
    out = Categorical().predictive(logits)
    p = 1 / (1 + math.exp(-2))  # softmax([2, 0])[0]
    assert set(out) == {"probs", "total", "aleatoric", "epistemic"}
    torch.testing.assert_close(out["probs"], torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    assert out["total"].item() == pytest.approx(math.log(2), rel=1e-12)
    assert out["aleatoric"].item() == pytest.approx(manual_entropy([p, 1 - p]), rel=1e-12)
    assert out["epistemic"].item() == pytest.approx(math.log(2) - manual_entropy([p, 1 - p]), rel=1e-12)


def test_a_likelihood_that_does_not_override_its_methods_says_which():
    class Half(Likelihood):
        def distribution(self, output):
            return torch.distributions.Categorical(logits=output)

    with pytest.raises(NotImplementedError, match=r"^Likelihood must override distribution\(output\)$"):
        Likelihood().distribution(torch.zeros(2, 3))
    with pytest.raises(NotImplementedError, match=r"^Half must override predictive\(outputs\)$"):
        Half().predictive(torch.zeros(4, 2, 3))


# ----------------------------------------------------------------------------- accuracy / nll / brier

P3 = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.2, 0.2, 0.6]], dtype=torch.float64)
Y3 = torch.tensor([0, 2, 2])


def test_accuracy_nll_brier_hand_computed():
    assert accuracy(P3, Y3) == pytest.approx(2 / 3)
    assert nll(P3, Y3) == pytest.approx(-(math.log(0.7) + math.log(0.3) + math.log(0.6)) / 3)
    # (0.3^2 + 0.2^2 + 0.1^2) + (0.1^2 + 0.6^2 + 0.7^2) + (0.2^2 + 0.2^2 + 0.4^2) = 0.14 + 0.86 + 0.24
    assert brier(P3, Y3) == pytest.approx(1.24 / 3)
    for f in (accuracy, nll, brier):
        assert type(f(P3, Y3)) is float


def test_brier_extremes():
    y = torch.tensor([0, 3, 1, 2, 3])
    assert brier(torch.nn.functional.one_hot(y, 4).double(), y) == 0
    for c in (2, 5, 10):
        y = torch.arange(20) % c
        assert brier(torch.full((20, c), 1 / c), y) == pytest.approx(1 - 1 / c, abs=1e-6)


def test_nll_is_finite_at_zero_probability():
    p = torch.tensor([[1.0, 0.0]])
    assert nll(p, torch.tensor([1])) == pytest.approx(-math.log(1e-12))
    assert nll(p, torch.tensor([1]), eps=1e-6) == pytest.approx(-math.log(1e-6))
    assert nll(p, torch.tensor([0])) == 0


def test_classification_metrics_keys_and_values():
    m = classification_metrics(P3, Y3, n_bins=5)
    assert set(m) == {"accuracy", "nll", "ece", "brier"}
    assert all(type(v) is float for v in m.values())
    assert m["accuracy"] == accuracy(P3, Y3)
    assert m["nll"] == nll(P3, Y3)
    assert m["brier"] == brier(P3, Y3)
    assert m["ece"] == ece(P3, Y3, n_bins=5)


# ----------------------------------------------------------------------------- ece / reliability


def test_ece_hand_computed_with_boundary():
    # C=3 so that confidences <= 0.5 are possible; 2 bins: (0, 0.5] and (0.5, 1].
    probs = torch.tensor([
        [0.9, 0.05, 0.05],  # conf .9, correct   -> bin 1
        [0.8, 0.1, 0.1],    # conf .8, wrong     -> bin 1
        [0.4, 0.3, 0.3],    # conf .4, correct   -> bin 0
        [0.5, 0.25, 0.25],  # conf .5, wrong     -> bin 0 (right edge belongs to the bin)
    ])
    y = torch.tensor([0, 1, 0, 1])
    bins = reliability(probs, y, n_bins=2)
    assert bins["count"].tolist() == [2, 2]
    torch.testing.assert_close(bins["confidence"], torch.tensor([0.45, 0.85]))
    torch.testing.assert_close(bins["accuracy"], torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(bins["edges"], torch.tensor([0.0, 0.5, 1.0]))
    # 0.5 * |0.5 - 0.45| + 0.5 * |0.5 - 0.85| = 0.025 + 0.175
    assert ece(probs, y, n_bins=2) == pytest.approx(0.2, abs=1e-6)


def test_reliability_empty_bins_and_counts():
    probs = torch.tensor([[0.95, 0.05], [0.95, 0.05], [0.6, 0.4]], dtype=torch.float64)
    y = torch.tensor([0, 1, 0])
    bins = reliability(probs, y, n_bins=10)
    assert bins["count"].tolist() == [0, 0, 0, 0, 0, 1, 0, 0, 0, 2]
    assert bins["count"].sum() == 3
    assert not torch.isnan(bins["confidence"]).any() and not torch.isnan(bins["accuracy"]).any()
    assert bins["accuracy"][9] == 0.5 and bins["confidence"][9] == pytest.approx(0.95)
    # ece is the count-weighted gap over the same bins
    assert ece(probs, y, n_bins=10) == pytest.approx((1 * 0.4 + 2 * 0.45) / 3)


def test_ece_single_bin_is_global_gap():
    probs = random_probs(500, 3, seed=3)
    y = torch.randint(0, 3, (500,), generator=torch.Generator().manual_seed(3))
    conf, pred = probs.max(-1)
    gap = abs((pred == y).double().mean().item() - conf.mean().item())
    assert ece(probs, y, n_bins=1) == pytest.approx(gap)


def _synthetic(n: int, conf_fn, seed: int):
    """C=3 predictions with max prob `conf`; label correct with probability `conf_fn(conf)`."""
    g = torch.Generator().manual_seed(seed)
    conf = 0.5 + 0.5 * torch.rand(n, generator=g, dtype=torch.float64)
    pred = torch.randint(0, 3, (n,), generator=g)
    probs = ((1 - conf) / 2).unsqueeze(-1).repeat(1, 3)
    probs[torch.arange(n), pred] = conf
    correct = torch.rand(n, generator=g, dtype=torch.float64) < conf_fn(conf)
    wrong = (pred + torch.randint(1, 3, (n,), generator=g)) % 3
    return probs, torch.where(correct, pred, wrong)


def test_ece_perfectly_calibrated_is_small():
    probs, y = _synthetic(100_000, lambda c: c, seed=4)
    assert ece(probs, y) < 0.02
    assert ece(probs, y, n_bins=5) < 0.02


def test_ece_overconfident_known_gap():
    # Deterministic: all confidences 0.9, 6/10 correct -> ECE = 0.3 exactly.
    probs = torch.tensor([[0.9, 0.1]] * 10, dtype=torch.float64)
    y = torch.tensor([0] * 6 + [1] * 4)
    assert ece(probs, y) == pytest.approx(0.3)
    # Stochastic: accuracy is confidence - 0.2 everywhere -> ECE ~ 0.2.
    probs, y = _synthetic(100_000, lambda c: c - 0.2, seed=5)
    assert ece(probs, y) == pytest.approx(0.2, abs=0.02)


# ----------------------------------------------------------------------------- regression


def test_regression_metrics_against_torch_normal():
    g = torch.Generator().manual_seed(6)
    mean = torch.randn(50, 2, generator=g, dtype=torch.float64)
    std = 0.1 + torch.rand(50, 2, generator=g, dtype=torch.float64)
    y = mean + std * torch.randn(50, 2, generator=g, dtype=torch.float64)
    m = regression_metrics(mean, std, y)
    assert set(m) == {"rmse", "nll", "mae"}
    assert all(type(v) is float for v in m.values())
    expected_nll = -torch.distributions.Normal(mean, std).log_prob(y).mean().item()
    assert m["nll"] == pytest.approx(expected_nll, rel=1e-12)
    err = (y - mean).flatten().tolist()
    assert m["rmse"] == pytest.approx(math.sqrt(sum(e * e for e in err) / len(err)))
    assert m["mae"] == pytest.approx(sum(abs(e) for e in err) / len(err))


def test_regression_metrics_hand_computed_and_broadcast_std():
    m = regression_metrics(torch.tensor([0.0, 1.0]), torch.tensor(2.0), torch.tensor([3.0, -3.0]))
    assert m["rmse"] == pytest.approx(math.sqrt(12.5))
    assert m["mae"] == pytest.approx(3.5)
    assert m["nll"] == pytest.approx(0.5 * math.log(2 * math.pi) + math.log(2) + (9 + 16) / 2 / 2 / 4)


# ----------------------------------------------------------------------------- plot


def test_reliability_diagram_writes_png(tmp_path):
    probs, y = _synthetic(2_000, lambda c: c - 0.1, seed=7)
    out = reliability_diagram(probs, y, tmp_path / "sub" / "dir" / "rel.png", n_bins=10, title="test")
    assert out == tmp_path / "sub" / "dir" / "rel.png"
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000
    assert [p.name for p in out.parent.iterdir()] == ["rel.png"]  # no temp file left
    # overwriting an existing file works too, and str paths are accepted
    assert reliability_diagram(P3, Y3, str(out)).read_bytes()[:8] == PNG_MAGIC


def test_reliability_diagram_invalid_argument_leaves_no_file(tmp_path):
    path = tmp_path / "new" / "rel.png"
    with pytest.raises(ValueError, match="n_bins"):
        reliability_diagram(P3, Y3, path, n_bins=0)
    with pytest.raises(ValueError, match="y"):
        reliability_diagram(P3, torch.tensor([0, 1, 3]), path)
    assert not path.exists() and not path.parent.exists()
    assert list(tmp_path.iterdir()) == []


def test_reliability_diagram_render_error_leaves_no_file(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    path = tmp_path / "rel.png"
    path.write_bytes(b"old")

    def boom(self, fh, **kwargs):
        fh.write(b"partial")
        raise RuntimeError("disk full")

    monkeypatch.setattr(Figure, "savefig", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        reliability_diagram(P3, Y3, path)
    assert [p.name for p in tmp_path.iterdir()] == ["rel.png"]  # temp file removed
    assert path.read_bytes() == b"old"  # previous file untouched


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("f", [accuracy, nll, brier, ece, reliability, classification_metrics])
def test_classification_input_errors(f):
    with pytest.raises(ValueError, match=r"probs must have shape \(N, C\)"):
        f(P3.unsqueeze(0), Y3)
    with pytest.raises(ValueError, match="out of range"):
        f(P3, torch.tensor([0, 3, 1]))
    with pytest.raises(ValueError, match="out of range"):
        f(P3, torch.tensor([0, -1, 1]))
    with pytest.raises(ValueError, match=r"y must have shape \(3,\)"):
        f(P3, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"y must have shape \(3,\)"):
        f(P3, Y3.unsqueeze(-1))
    with pytest.raises(ValueError, match="integer"):
        f(P3, Y3.double())
    with pytest.raises(ValueError, match="logits"):
        f(torch.randn(3, 3), Y3)
    with pytest.raises(TypeError, match="probs"):
        f(P3.tolist(), Y3)


@pytest.mark.parametrize("n_bins", [0, -3, 2.5, True, None])
def test_bad_n_bins(n_bins):
    with pytest.raises(ValueError, match="n_bins"):
        ece(P3, Y3, n_bins=n_bins)


def test_uncertainty_input_errors():
    with pytest.raises(ValueError, match=r"probs must have shape \(S, N, C\)"):
        uncertainty(P3)
    with pytest.raises(ValueError, match="logits"):
        uncertainty(torch.randn(2, 3, 4))


def test_regression_input_errors():
    mean, y = torch.zeros(4), torch.ones(4)
    with pytest.raises(ValueError, match="std"):
        regression_metrics(mean, torch.tensor([1.0, 0.0, 1.0, 1.0]), y)
    with pytest.raises(ValueError, match="std"):
        regression_metrics(mean, -torch.ones(4), y)
    with pytest.raises(ValueError, match="std"):
        regression_metrics(mean, torch.ones(3), y)
    with pytest.raises(ValueError, match="y must have the shape of mean"):
        regression_metrics(mean, torch.ones(4), torch.ones(4, 1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_metrics_on_cuda():
    probs, y = _synthetic(1_000, lambda c: c, seed=8)
    cpu = classification_metrics(probs, y)
    gpu = classification_metrics(probs.cuda(), y.cuda())
    assert gpu == pytest.approx(cpu)
    u = uncertainty(random_probs(4, 10, 3).cuda())
    assert all(v.is_cuda for v in u.values())
