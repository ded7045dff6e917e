"""Out-of-distribution detection, selective prediction (AURC), the reliability bins and the test report that
records them: each against a hand computation, and ``pyrobnn train/evaluate --ood-dataset`` end to end."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from pyrobnn import data as pyrobnn_data
from pyrobnn.analysis.metrics import (
    OOD_SCORES,
    aurc,
    classification_metrics,
    classification_report,
    ood_detection,
    ood_metrics,
    reliability,
    reliability_bins,
    uncertainty_means,
)
from pyrobnn.cli import main
from pyrobnn.model.likelihoods import uncertainty


def random_scores(n: int, seed: int, shift: float = 0.0, decimals: int = 1) -> torch.Tensor:
    """Scores rounded to ``decimals``, so that in- and out-of-distribution scores tie often."""
    g = torch.Generator().manual_seed(seed)
    return ((torch.randn(n, generator=g, dtype=torch.float64) + shift) * 10 ** decimals).round() / 10 ** decimals


def auroc_by_pairs(scores_in: list[float], scores_out: list[float]) -> float:
    """P(out > in) + P(out = in) / 2 over every (in, out) pair (Hanley & McNeil 1982)."""
    wins = sum(1.0 if o > i else 0.5 if o == i else 0.0 for i in scores_in for o in scores_out)
    return wins / (len(scores_in) * len(scores_out))


def fpr95_by_thresholds(scores_in: list[float], scores_out: list[float]) -> float:
    """The smallest fraction of in-distribution scores >= t over every threshold t flagging >= 95 % of the OOD
    scores (every score is a threshold: between two of them nothing changes)."""
    rates = []
    for t in set(scores_in) | set(scores_out):
        if sum(o >= t for o in scores_out) >= 0.95 * len(scores_out):
            rates.append(sum(i >= t for i in scores_in) / len(scores_in))
    return min(rates)


def aupr_by_thresholds(scores_in: list[float], scores_out: list[float]) -> float:
    """Average precision: sum over thresholds (descending) of (recall_k - recall_{k-1}) * precision_k."""
    total, previous = 0.0, 0.0
    for t in sorted(set(scores_in) | set(scores_out), reverse=True):
        tp = sum(o >= t for o in scores_out)
        fp = sum(i >= t for i in scores_in)
        recall = tp / len(scores_out)
        total += (recall - previous) * tp / (tp + fp)
        previous = recall
    return total


# ----------------------------------------------------------------------------- OOD detection


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ood_detection_against_pair_counting_and_thresholds(seed):
    scores_in, scores_out = random_scores(60, seed), random_scores(45, seed + 100, shift=0.8)
    found = ood_detection(scores_in, scores_out)
    si, so = scores_in.tolist(), scores_out.tolist()
    assert found["auroc"] == pytest.approx(auroc_by_pairs(si, so), abs=1e-12)
    assert found["fpr95"] == pytest.approx(fpr95_by_thresholds(si, so), abs=1e-12)
    assert found["aupr"] == pytest.approx(aupr_by_thresholds(si, so), abs=1e-12)
    assert 0.5 < found["auroc"] < 1  # shifted up: better than chance


def test_fpr95_on_a_straight_stretch_of_the_roc_curve():
    """Tied pairs make the ROC curve pass (0, 0.9) -> (0.05, 0.95) -> (0.1, 1) on one line; the middle point,
    where 95 % is reached, is the answer (0.05), not the next corner (0.1)."""
    scores_out = torch.tensor([10.0] * 18 + [5.0, 4.0])
    scores_in = torch.tensor([5.0, 4.0] + [0.0] * 18)
    found = ood_detection(scores_in, scores_out)
    assert found["fpr95"] == pytest.approx(0.05)
    assert found["fpr95"] == fpr95_by_thresholds(scores_in.tolist(), scores_out.tolist())


def test_ood_detection_extremes():
    separated = ood_detection(torch.tensor([0.0, 0.1, 0.2]), torch.tensor([1.0, 2.0]))
    assert separated == {"auroc": 1.0, "aupr": 1.0, "fpr95": 0.0}
    constant = ood_detection(torch.zeros(4), torch.zeros(4))
    assert constant["auroc"] == 0.5 and constant["fpr95"] == 1.0 and constant["aupr"] == 0.5


@pytest.mark.parametrize("bad, message", [(torch.tensor([]), "in_scores must be a non-empty 1-d tensor"),
                                          (torch.zeros(2, 2), "in_scores must be a non-empty 1-d tensor"),
                                          (torch.tensor([0.0, math.nan]), "in_scores must be finite")])
def test_ood_detection_refuses_bad_scores(bad, message):
    with pytest.raises(ValueError, match=message):
        ood_detection(bad, torch.ones(3))


def _sampled(seed: int, n: int = 30, spread: float = 3.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    probs = (spread * torch.randn(8, n, 4, generator=g, dtype=torch.float64)).softmax(-1)
    return {"probs": probs.mean(0), **uncertainty(probs)}


def test_ood_metrics_score_epistemic_and_total_and_report_the_ood_means():
    pred_in, pred_out = _sampled(0, spread=4.0), _sampled(1, spread=1.0)
    found = ood_metrics(pred_in, pred_out)
    for key in OOD_SCORES:
        expected = ood_detection(pred_in[key], pred_out[key])
        assert {name: found[f"{name}_{key}"] for name in expected} == expected
    assert found["epistemic"] == pytest.approx(float(pred_out["epistemic"].mean()))
    assert found["total"] == pytest.approx(found["aleatoric"] + found["epistemic"], rel=1e-9)


def test_a_moment_prediction_is_scored_by_its_total_entropy_only():
    probs_in, probs_out = _sampled(2)["probs"], _sampled(3, spread=0.5)["probs"]
    found = ood_metrics({"probs": probs_in}, {"probs": probs_out})
    entropy = lambda p: -(p * p.log()).sum(-1)  # noqa: E731
    assert found == {**{f"{k}_total": v for k, v in ood_detection(entropy(probs_in), entropy(probs_out)).items()},
                     "total": pytest.approx(float(entropy(probs_out).mean()))}
    assert uncertainty_means({"probs": probs_in}) == {"total": pytest.approx(float(entropy(probs_in).mean()))}


# ----------------------------------------------------------------------------- AURC


def aurc_by_hand(confidence: list[float], correct: list[bool]) -> float:
    """Mean over k of the error rate of the k most confident predictions, averaged over every order of ties."""
    n = len(confidence)
    levels = sorted(set(confidence), reverse=True)
    groups = [[i for i in range(n) if confidence[i] == level] for level in levels]
    orders = list(itertools.product(*(itertools.permutations(group) for group in groups)))
    total = 0.0
    for order in orders:
        ranked = [i for group in order for i in group]
        errors = itertools.accumulate(0 if correct[i] else 1 for i in ranked)
        total += sum(e / k for k, e in enumerate(errors, start=1)) / n
    return total / len(orders)


def _probs_with_confidence(confidence: list[float], predicted: list[int], classes: int = 3) -> torch.Tensor:
    rows = []
    for c, k in zip(confidence, predicted):
        row = [(1 - c) / (classes - 1)] * classes
        row[k] = c
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64)


def test_aurc_hand_computed_without_ties():
    confidence, correct = [0.9, 0.8, 0.7, 0.6], [True, False, True, False]
    probs = _probs_with_confidence(confidence, [0, 0, 0, 0])
    y = torch.tensor([0 if ok else 1 for ok in correct])
    assert aurc(probs, y) == pytest.approx((0 / 1 + 1 / 2 + 1 / 3 + 2 / 4) / 4)
    assert aurc(probs, y) == pytest.approx(aurc_by_hand(confidence, correct))


def test_aurc_with_ties_is_the_mean_over_tie_orders_and_needs_no_order_of_the_input():
    confidence = [0.9, 0.7, 0.7, 0.7, 0.5, 0.9, 0.4, 0.5]
    correct = [True, False, True, True, False, False, True, True]
    probs = _probs_with_confidence(confidence, [1] * len(confidence))
    y = torch.tensor([1 if ok else 2 for ok in correct])
    assert aurc(probs, y) == pytest.approx(aurc_by_hand(confidence, correct), abs=1e-12)
    shuffled = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    assert aurc(probs[shuffled], y[shuffled]) == pytest.approx(aurc(probs, y), abs=1e-15)


def test_aurc_of_a_perfect_ranking_and_of_an_all_correct_classifier():
    confidence, correct = [0.9, 0.8, 0.7, 0.6, 0.5], [True, True, True, False, False]
    probs = _probs_with_confidence(confidence, [0] * 5)
    y = torch.tensor([0 if ok else 2 for ok in correct])
    # risk 0 while the correct ones are kept, then 1/4 and 2/5
    assert aurc(probs, y) == pytest.approx((1 / 4 + 2 / 5) / 5)
    assert aurc(probs, torch.zeros(5, dtype=torch.long)) == 0.0


# ----------------------------------------------------------------------------- the report


def test_classification_report_holds_the_metrics_aurc_uncertainty_and_reliability_bins():
    pred = _sampled(4, n=50)
    y = torch.randint(0, 4, (50,), generator=torch.Generator().manual_seed(5))
    report = classification_report(pred, y)
    assert {k: report[k] for k in ("accuracy", "nll", "ece", "brier")} == classification_metrics(pred["probs"], y)
    assert report["aurc"] == aurc(pred["probs"], y)
    assert report["epistemic"] == pytest.approx(float(pred["epistemic"].mean()))
    bins = reliability(pred["probs"], y)
    assert report["reliability"] == reliability_bins(pred["probs"], y)
    assert report["reliability"]["count"] == bins["count"].tolist() and sum(report["reliability"]["count"]) == 50
    json.dumps(report)  # JSON-ready


def _run(argv) -> int:
    try:
        main([str(a) for a in argv])
    except SystemExit as exit_:
        return exit_.code
    return 0


TINY = ["--dataset", "mnist", "--train-size", 300, "--test-size", 200, "--epochs", 1, "--num-samples", 4,
        "--hidden", 16, "--no-progress"]


def test_train_with_an_ood_dataset_records_its_detection_metrics_and_evaluate_repeats_them(data_root, tmp_path):
    if not (data_root / "FashionMNIST").is_dir():
        pytest.skip(f"no Fashion-MNIST under {data_root}")
    out = tmp_path / "run"
    assert _run(["train", *TINY, "--data-root", data_root, "--ood-dataset", "fashion-mnist", "--out", out]) == 0
    test = json.loads((out / "metrics.json").read_text())["test"]
    ood = test["ood"]
    assert ood["dataset"] == "fashion-mnist"
    for key in OOD_SCORES:
        for name in ("auroc", "aupr", "fpr95"):
            assert 0 <= ood[f"{name}_{key}"] <= 1
    assert set(test) >= {"accuracy", "nll", "ece", "brier", "aurc", "total", "aleatoric", "epistemic", "reliability"}
    assert sum(test["reliability"]["count"]) == 200 and len(test["reliability"]["confidence"]) == 15
    again = tmp_path / "eval.json"
    assert _run(["evaluate", "--checkpoint", out / "checkpoint.pt", "--num-samples", 4, "--ood-dataset",
                 "fashion-mnist", "--json", again, "--no-progress"]) == 0
    assert json.loads(again.read_text())["test"] == test  # same seed, same numbers


@pytest.mark.parametrize("dataset, ood, message", [
    ("mnist", "mnist", "is the dataset the run is tested on"),
    ("mnist", "two-moons", "has inputs of shape"),
    ("mnist", "imagenet", "--ood-dataset imagenet: unknown dataset"),
    ("sinusoid", "fashion-mnist", "--ood-dataset needs a classification dataset"),
    ("mnist", "imdb", "--ood-dataset imdb: a text run's shifted set is rotten-tomatoes for imdb"),
])
def test_a_bad_ood_dataset_is_one_error_line_before_anything_is_written(dataset, ood, message, data_root, tmp_path,
                                                                         capsys, monkeypatch):
    monkeypatch.setattr(pyrobnn_data, "_try_download", lambda *a, **k: ConnectionError("offline (test)"),
                        raising=False)
    out = tmp_path / "run"
    code = _run(["train", *TINY[2:], "--dataset", dataset, "--data-root", data_root, "--ood-dataset", ood,
                 "--out", out])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not out.exists()


def test_a_bad_severity_is_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "run"
    assert _run(["train", "--dataset", "two-moons", "--corruptions", 6, "--out", out]) == 2
    assert "--corruptions takes severities 1 to 5, got 6" in capsys.readouterr().err
    assert not out.exists()
