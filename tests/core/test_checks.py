"""pyrobnn.checks: one implementation of each argument check, and the modules that use it."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from pyrobnn import checks
from pyrobnn.distributions import DropoutNormal
from pyrobnn.infer.schedules import Constant, LinearWarmup, geometric_weights
from pyrobnn.model.likelihoods import Categorical, Gaussian, HeteroscedasticGaussian
from pyrobnn.model.priors import GaussianPrior, ScaleMixturePrior

NOT_NUMBERS = [True, False, None, "1", float("nan"), float("inf"), -float("inf"), torch.tensor(1.0), [1.0]]


# ----------------------------------------------------------------------------- scalar checks


def test_number_checks_return_floats_and_accept_ints_and_numpy_scalars():
    assert checks.finite("x", -3) == -3.0 and type(checks.finite("x", -3)) is float
    assert checks.positive("x", np.float32(0.5)) == 0.5
    assert checks.nonnegative("x", 0) == 0.0
    assert checks.in_range("p", 1, 0, 1) == 1.0


@pytest.mark.parametrize("value", NOT_NUMBERS)
@pytest.mark.parametrize("check", [checks.finite, checks.positive, checks.nonnegative])
def test_number_checks_refuse_non_numbers_booleans_and_non_finite_values(check, value):
    with pytest.raises(ValueError, match=r"^my_arg must be a finite number"):
        check("my_arg", value)


@pytest.mark.parametrize(
    "check, value, message",
    [
        (checks.positive, 0.0, "scale must be a finite number > 0, got 0.0"),
        (checks.positive, -2, "scale must be a finite number > 0, got -2"),
        (checks.nonnegative, -1e-9, "scale must be a finite number >= 0, got -1e-09"),
    ],
)
def test_sign_checks_say_the_requirement_and_the_value(check, value, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        check("scale", value)


def test_finite_names_the_unit():
    with pytest.raises(ValueError, match=r"^snr_db must be a finite number \(dB\), got nan$"):
        checks.finite("snr_db", float("nan"), "dB")


@pytest.mark.parametrize(
    "ends, inside, outside",
    [("[]", [0.0, 0.5, 1.0], [-0.1, 1.1]), ("()", [1e-9, 0.5, 1 - 1e-9], [0.0, 1.0]),
     ("[)", [0.0, 0.999], [1.0]), ("(]", [1.0, 1e-9], [0.0])],
)
def test_in_range_includes_exactly_the_ends_it_is_told(ends, inside, outside):
    for value in inside:
        assert checks.in_range("p", value, 0, 1, ends) == value
    for value in outside:
        with pytest.raises(ValueError, match=rf"^p must be a number in \{ends[0]}0, 1\{ends[1]}, got "):
            checks.in_range("p", value, 0, 1, ends)
    with pytest.raises(ValueError, match="p must be a number in"):
        checks.in_range("p", float("nan"), 0, 1, ends)


def test_in_range_refuses_an_unknown_interval_kind():
    with pytest.raises(ValueError, match="ends must be"):
        checks.in_range("p", 0.5, 0, 1, "[[")


@pytest.mark.parametrize(
    "check, good, bad, requirement",
    [
        (checks.positive_int, [1, 7, np.int64(3)], [0, -1, 2.0, 1.5, True, None, "2"], "a positive integer"),
        (checks.nonnegative_int, [0, 5, np.int32(0)], [-1, 0.0, False, None], "an integer >= 0"),
    ],
)
def test_integer_checks(check, good, bad, requirement):
    for value in good:
        out = check("n", value)
        assert out == value and type(out) is int
    for value in bad:
        with pytest.raises(ValueError, match=f"^n must be {requirement}, got {re.escape(repr(value))}$"):
            check("n", value)


def test_choice_returns_the_value_and_lists_the_options_in_order():
    assert checks.choice("kind", "b", ("a", "b")) == "b"
    assert checks.choice("kind", "x", {"x": 1, "y": 2}) == "x"  # a registry's keys
    with pytest.raises(ValueError, match=r"^kind must be one of 'y', 'x'; got 'z'$"):
        checks.choice("kind", "z", {"y": 1, "x": 2})


# ----------------------------------------------------------------------------- tensor checks


def test_check_probs_accepts_probabilities_of_the_named_shape():
    checks.check_probs(torch.tensor([[0.2, 0.8], [1.0, 0.0]]))
    checks.check_probs(torch.full((3, 2, 4), 0.25, dtype=torch.float64), ("S", "N", "C"))


@pytest.mark.parametrize(
    "probs, error, message",
    [
        ([[0.5, 0.5]], TypeError, r"p must be a torch.Tensor of shape \(N, C\), got list"),
        (torch.full((2,), 0.5), ValueError, r"p must have shape \(N, C\), got \(2,\)"),
        (torch.ones(2, 1, dtype=torch.long), ValueError, "p must be floating-point probabilities"),
        (torch.ones(0, 3), ValueError, "p must not be empty"),
        (torch.tensor([[2.0, -1.0]]), ValueError, "did you pass logits"),
        (torch.tensor([[0.5, 0.6]]), ValueError, "did you pass logits"),
        (torch.tensor([[float("nan"), 1.0]]), ValueError, "did you pass logits"),
    ],
)
def test_check_probs_refuses(probs, error, message):
    with pytest.raises(error, match=message):
        checks.check_probs(probs, what="p")


def test_check_labels_accepts_labels_in_range_of_any_integer_dtype():
    for dtype in (torch.long, torch.int32, torch.uint8):
        checks.check_labels(torch.tensor([0, 2, 1], dtype=dtype), 3, num_examples=3)
    checks.check_labels(torch.tensor([], dtype=torch.long), 3)  # nothing to range-check
    checks.check_labels(torch.tensor([7, 9]), None)  # no class count: no range check


@pytest.mark.parametrize(
    "y, error, message",
    [
        ([0, 1], TypeError, "y must be a torch.Tensor of integer class indices, got list"),
        (torch.tensor([0, 1]), ValueError, r"y must have shape \(3,\), one label per example, got \(2,\)"),
        (torch.tensor([0.0, 1.0, 2.0]), ValueError,
         "y must hold integer class indices .* got dtype torch.float32"),
        (torch.tensor([True, False, True]), ValueError, "y must hold integer class indices"),
        (torch.tensor([0, 3, 1]), ValueError,
         r"y: label 3 is out of range for 3 classes \(labels must lie in \[0, 2\]\)"),
        (torch.tensor([0, -1, 5]), ValueError, "y: label -1 is out of range for 3 classes"),
    ],
)
def test_check_labels_refuses(y, error, message):
    with pytest.raises(error, match=message):
        checks.check_labels(y, 3, "y", num_examples=3)


def test_check_labels_without_a_count_still_wants_one_dimension_and_a_valid_class_count():
    with pytest.raises(ValueError, match=r"^labels must be a 1-d tensor, one label per example, got shape \(2, 1\)"):
        checks.check_labels(torch.zeros(2, 1, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="num_classes must be a positive integer, got 0"):
        checks.check_labels(torch.zeros(2, dtype=torch.long), 0)


# ----------------------------------------------------------------------------- the modules that use them


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: GaussianPrior(scale=0.0),
         r"scale \(sigma of the Gaussian prior\) must be a finite number > 0, got 0.0"),
        (lambda: GaussianPrior(loc=True),
         r"loc \(mean of the Gaussian prior\) must be a finite number, got True"),
        (lambda: ScaleMixturePrior(pi=1.0),
         r"pi \(mixture weight of the wide component\) must be a number in \(0, 1\), got 1.0"),
        (lambda: Gaussian(scale=True),
         r"scale \(noise standard deviation\) must be a finite number > 0, got True"),
        (lambda: HeteroscedasticGaussian(min_scale=math.inf),
         r"min_scale \(the smallest noise standard deviation\) must be a finite number > 0, got inf"),
        (lambda: Categorical(vdp_objective="mse"),
         r"vdp_objective must be one of 'gaussian', 'cross_entropy'; got 'mse'"),
        (lambda: DropoutNormal(torch.zeros(1), torch.ones(1), torch.zeros(1), "gal"),
         r"approximation \(the KL approximation\) must be one of 'kingma', 'molchanov'; got 'gal'"),
        (lambda: Constant(beta=-0.1), r"beta \(the KL weight\) must be a finite number >= 0, got -0.1"),
        (lambda: LinearWarmup(warmup=2.0), r"warmup \(epochs with beta = 0\) must be an integer >= 0, got 2.0"),
        (lambda: LinearWarmup(final=math.nan), r"final \(beta after the ramp\) must be a finite number >= 0"),
        (lambda: geometric_weights(0),
         r"num_batches \(minibatches per epoch\) must be a positive integer, got 0"),
    ],
)
def test_modules_report_bad_arguments_through_the_shared_checks(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_the_categorical_likelihood_checks_labels_as_the_metrics_do():
    likelihood = Categorical()
    logits = torch.zeros(3, 4)
    likelihood.check(logits, torch.tensor([0, 3, 1]))  # in range: no error
    out_of_range = r"labels y: label 4 is out of range for 4 classes \(labels must lie in \[0, 3\]\)"
    with pytest.raises(ValueError, match=out_of_range):
        likelihood.check(logits, torch.tensor([0, 4, 1]))
    with pytest.raises(ValueError, match=r"labels y must have shape \(3,\)"):
        likelihood.check(logits, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="labels y must hold integer class indices"):
        likelihood.check(logits, torch.tensor([0.0, 1.0, 2.0]))


def test_multiples_near_names_the_multiples_either_side():
    assert checks.multiples_near(10, 4) == "8 or 12"
    assert checks.multiples_near(100, 8) == "96 or 104"
    assert checks.multiples_near(2, 4) == "4"  # no positive multiple below
