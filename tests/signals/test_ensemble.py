import math
import re
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopguard import ConfigError, InputError, LoopguardTypeError
from loopguard._validation import MAX_ENSEMBLE_MEMBERS, MAX_TRAJECTORIES
from loopguard.signals import ensemble_disagreement, ensemble_reward

METHODS = ["mean", "median", "min", "uwo", "mean_minus_std"]

# --------------------------------------------------------------------------------------------------
# independent references: plain Python over columns


def _columns(scores):
    rows = [list(map(float, row)) for row in scores]
    return [[row[b] for row in rows] for b in range(len(rows[0]))]


def naive_spread(scores, statistic="variance", unbiased=False):
    out = []
    for column in _columns(scores):
        variance = statistics.variance(column) if unbiased else statistics.pvariance(column)
        out.append(math.sqrt(variance) if statistic == "std" else variance)
    return out


def naive_reward(scores, method, coef=None, unbiased=False):
    out = []
    for column in _columns(scores):
        mean = statistics.fmean(column)
        variance = statistics.variance(column) if unbiased else statistics.pvariance(column)
        if method == "mean":
            out.append(mean)
        elif method == "median":
            out.append(statistics.median(column))
        elif method == "min":
            out.append(min(column))
        elif method == "uwo":
            out.append(mean - (0.5 if coef is None else coef) * variance)
        else:
            out.append(mean - (1.0 if coef is None else coef) * math.sqrt(variance))
    return out


# --------------------------------------------------------------------------------------------------
# reference tests


def test_disagreement_hand_computed():
    scores = [[1.0, 2.0, 0.0], [3.0, 2.0, 0.0]]
    np.testing.assert_allclose(ensemble_disagreement(scores, reduce="none"), [1.0, 0.0, 0.0])
    assert ensemble_disagreement(scores) == pytest.approx(1.0 / 3.0)
    np.testing.assert_allclose(ensemble_disagreement(scores, unbiased=True, reduce="none"), [2.0, 0.0, 0.0])
    # std is averaged per sample: mean(sqrt(2), 0, 0), not sqrt(mean variance)
    assert ensemble_disagreement(scores, statistic="std", unbiased=True) == pytest.approx(math.sqrt(2) / 3)


def test_disagreement_single_member_is_zero():
    assert ensemble_disagreement([[0.3, -2.0, 7.0]]) == 0.0
    np.testing.assert_array_equal(ensemble_disagreement([[0.3, -2.0]], reduce="none"), [0.0, 0.0])


@pytest.mark.parametrize("statistic", ["variance", "std"])
@pytest.mark.parametrize("unbiased", [False, True])
@pytest.mark.parametrize(("members", "samples"), [(2, 1), (3, 4), (5, 7), (32, 3)])
def test_disagreement_matches_naive_loop(statistic, unbiased, members, samples):
    rng = np.random.default_rng(members * 100 + samples)
    scores = rng.normal(0.5, 2.0, size=(members, samples))
    expected = naive_spread(scores.tolist(), statistic, unbiased)
    got = ensemble_disagreement(scores, statistic=statistic, unbiased=unbiased, reduce="none")
    assert got.shape == (samples,)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    mean = ensemble_disagreement(scores, statistic=statistic, unbiased=unbiased)
    assert isinstance(mean, float)
    assert mean == pytest.approx(statistics.fmean(expected), rel=1e-12, abs=1e-12)


def test_uwo_hand_computed():
    # columns: (1, 3, 2): mean 2, pvar 2/3, var 1;  (4, 0, 2): mean 2, pvar 8/3, var 4
    scores = [[1.0, 4.0], [3.0, 0.0], [2.0, 2.0]]
    np.testing.assert_allclose(ensemble_reward(scores, "uwo"), [2.0 - 1.0 / 3.0, 2.0 - 4.0 / 3.0])
    np.testing.assert_allclose(ensemble_reward(scores, "uwo", unbiased=True), [1.5, 0.0])
    np.testing.assert_allclose(ensemble_reward(scores, "uwo", coef=0.1, unbiased=True), [1.9, 1.6])
    np.testing.assert_allclose(ensemble_reward(scores, "uwo", coef=0.0), [2.0, 2.0])
    np.testing.assert_allclose(
        ensemble_reward(scores, "mean_minus_std", unbiased=True), [1.0, 0.0], atol=1e-15
    )
    np.testing.assert_allclose(ensemble_reward(scores, "min"), [1.0, 0.0])
    np.testing.assert_allclose(ensemble_reward(scores, "median"), [2.0, 2.0])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("members", "samples"), [(1, 3), (2, 5), (4, 1), (6, 9)])
def test_reward_matches_naive_loop(method, members, samples):
    rng = np.random.default_rng(7 * members + samples)
    scores = rng.normal(0.0, 3.0, size=(members, samples))
    got = ensemble_reward(scores, method)
    assert got.shape == (samples,)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, naive_reward(scores.tolist(), method), rtol=1e-12, atol=1e-12)
    if method in ("uwo", "mean_minus_std") and members >= 2:
        expected = naive_reward(scores.tolist(), method, coef=0.25, unbiased=True)
        got = ensemble_reward(scores, method, coef=0.25, unbiased=True)
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_default_is_mean_and_lists_of_ints_work():
    np.testing.assert_array_equal(ensemble_reward([[1, 2], [3, 6]]), [2.0, 4.0])


def test_torch_inputs():
    torch = pytest.importorskip("torch", reason="torch is part of the `hf` extra")
    scores = torch.tensor([[1.0, 2.0], [3.0, 2.0]], dtype=torch.bfloat16)
    np.testing.assert_allclose(ensemble_disagreement(scores, reduce="none"), [1.0, 0.0])
    np.testing.assert_allclose(ensemble_reward(scores, "min"), [1.0, 2.0])


# --------------------------------------------------------------------------------------------------
# properties

finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)


@st.composite
def score_matrices(draw, min_members=1):
    members = draw(st.integers(min_value=min_members, max_value=6))
    samples = draw(st.integers(min_value=1, max_value=8))
    flat = draw(st.lists(finite, min_size=members * samples, max_size=members * samples))
    return np.asarray(flat, dtype=np.float64).reshape(members, samples)


@settings(max_examples=50, deadline=None)
@given(scores=score_matrices(), statistic=st.sampled_from(["variance", "std"]))
def test_disagreement_is_non_negative_finite_and_std_is_sqrt_of_variance(scores, statistic):
    spread = ensemble_disagreement(scores, statistic=statistic, reduce="none")
    assert np.isfinite(spread).all()
    assert (spread >= 0).all()
    variance = ensemble_disagreement(scores, reduce="none")
    if statistic == "std":
        # std squared is the variance; compared that way round because a variance can underflow to 0 where
        # the (exactly rescaled) std is still a normal number, e.g. scores 0 and 2.5e-223
        np.testing.assert_allclose(np.square(spread), variance, rtol=1e-12, atol=np.finfo(np.float64).tiny)
    assert math.isfinite(ensemble_disagreement(scores, statistic=statistic))


@settings(max_examples=50, deadline=None)
@given(row=st.lists(finite, min_size=1, max_size=8), members=st.integers(1, 6))
def test_identical_members_never_disagree(row, members):
    scores = np.tile(np.asarray(row), (members, 1))
    assert ensemble_disagreement(scores) == 0.0
    assert ensemble_disagreement(scores, statistic="std") == 0.0
    for method in METHODS:
        np.testing.assert_allclose(ensemble_reward(scores, method), row, rtol=1e-12, atol=1e-9)


@settings(max_examples=50, deadline=None)
@given(scores=score_matrices(), data=st.data())
def test_member_permutation_invariance(scores, data):
    order = data.draw(st.permutations(range(scores.shape[0])))
    shuffled = scores[list(order)]
    np.testing.assert_allclose(
        ensemble_disagreement(shuffled, reduce="none"),
        ensemble_disagreement(scores, reduce="none"),
        rtol=1e-9,
        atol=1e-9,
    )
    for method in METHODS:
        np.testing.assert_allclose(
            ensemble_reward(shuffled, method), ensemble_reward(scores, method), rtol=1e-9, atol=1e-9
        )


@settings(max_examples=50, deadline=None)
@given(scores=score_matrices(), data=st.data())
def test_sample_permutation_permutes_outputs(scores, data):
    order = list(data.draw(st.permutations(range(scores.shape[1]))))
    shuffled = scores[:, order]
    np.testing.assert_allclose(
        ensemble_disagreement(shuffled, reduce="none"),
        ensemble_disagreement(scores, reduce="none")[order],
        rtol=1e-12,
        atol=0,
    )
    for method in METHODS:
        np.testing.assert_allclose(
            ensemble_reward(shuffled, method), ensemble_reward(scores, method)[order], rtol=1e-12, atol=0
        )


@settings(max_examples=50, deadline=None)
@given(scores=score_matrices(), small=st.floats(0.0, 2.0), extra=st.floats(0.0, 2.0))
def test_aggregates_are_ordered_and_penalties_monotone(scores, small, extra):
    lowest, highest = scores.min(axis=0), scores.max(axis=0)
    mean = ensemble_reward(scores, "mean")
    tol = 1e-9
    for method in ("mean", "median", "min"):
        value = ensemble_reward(scores, method)
        assert (value >= lowest - tol).all()
        assert (value <= highest + tol).all()
    assert (ensemble_reward(scores, "min") <= ensemble_reward(scores, "median") + tol).all()
    for method in ("uwo", "mean_minus_std"):
        weak = ensemble_reward(scores, method, coef=small)
        strong = ensemble_reward(scores, method, coef=small + extra)
        assert (weak <= mean + tol).all()
        assert (strong <= weak + tol).all()


@settings(max_examples=50, deadline=None)
@given(scores=score_matrices(), shift=st.floats(-100.0, 100.0))
def test_shift_equivariance(scores, shift):
    np.testing.assert_allclose(
        ensemble_disagreement(scores + shift, reduce="none"),
        ensemble_disagreement(scores, reduce="none"),
        rtol=1e-6,
        atol=1e-6,
    )
    for method in METHODS:
        np.testing.assert_allclose(
            ensemble_reward(scores + shift, method), ensemble_reward(scores, method) + shift, atol=1e-6
        )


# --------------------------------------------------------------------------------------------------
# bad input


def test_rejects_boolean_scores():
    with pytest.raises(LoopguardTypeError, match=re.escape("`scores` must hold numbers, got booleans")):
        ensemble_reward([[True, False]])


def test_rejects_non_finite_scores():
    with pytest.raises(InputError, match=re.escape("`scores` must be finite, got nan at index (1, 0).")):
        ensemble_disagreement([[1.0], [float("nan")]])
    with pytest.raises(InputError, match=re.escape("`scores` must be finite, got inf at index (0, 1).")):
        ensemble_reward([[1.0, float("inf")]])


def test_rejects_wrong_ndim_with_hint():
    message = (
        "`scores` must be a 2-D array shaped [members, samples] (wrap a single model's scores as [scores])"
    )
    with pytest.raises(InputError, match=re.escape(message + ", got shape (3,).")):
        ensemble_reward([1.0, 2.0, 3.0])
    with pytest.raises(InputError, match=re.escape(message + ", got shape (1, 1, 2).")):
        ensemble_disagreement([[[1.0, 2.0]]])


def test_rejects_empty_and_ragged_and_strings():
    with pytest.raises(InputError, match=re.escape("`scores` must not be empty, got shape (1, 0).")):
        ensemble_reward([[]])
    with pytest.raises(InputError, match=re.escape("`scores` must be a rectangular array of numbers")):
        ensemble_reward([[1.0, 2.0], [3.0]])
    with pytest.raises(LoopguardTypeError, match=re.escape("`scores` must be an array of numbers, got 'ab'")):
        ensemble_disagreement("ab")


def test_member_and_sample_caps():
    too_many_members = np.zeros((MAX_ENSEMBLE_MEMBERS + 1, 2))
    message = "`scores` must have at most 32 members (rows; DoS cap), got 33."
    with pytest.raises(InputError, match=re.escape(message)):
        ensemble_disagreement(too_many_members)
    ensemble_disagreement(np.zeros((MAX_ENSEMBLE_MEMBERS, 2)))  # the cap itself is allowed
    too_many_samples = np.zeros((1, MAX_TRAJECTORIES + 1))
    message = "`scores` must have at most 100,000 samples (columns; DoS cap), got 100,001."
    with pytest.raises(InputError, match=re.escape(message)):
        ensemble_reward(too_many_samples)


def test_unknown_names_list_the_allowed_ones():
    message = "`method` must be one of 'mean', 'mean_minus_std', 'median', 'min', 'uwo', got 'max'."
    with pytest.raises(ConfigError, match=re.escape(message)):
        ensemble_reward([[1.0]], "max")
    message = "`statistic` must be one of 'std', 'variance', got 'var'."
    with pytest.raises(ConfigError, match=re.escape(message)):
        ensemble_disagreement([[1.0]], statistic="var")
    with pytest.raises(ConfigError, match=re.escape("`reduce` must be one of 'mean', 'none', got 'sum'.")):
        ensemble_disagreement([[1.0]], reduce="sum")


def test_unbiased_rules():
    with pytest.raises(LoopguardTypeError, match=re.escape("`unbiased` must be a bool, got 1 of type int.")):
        ensemble_disagreement([[1.0], [2.0]], unbiased=1)
    message = "`unbiased` must be False when `scores` has one member (K - 1 = 0), got True with K = 1."
    with pytest.raises(ConfigError, match=re.escape(message)):
        ensemble_disagreement([[1.0, 2.0]], unbiased=True)
    with pytest.raises(ConfigError, match=re.escape(message)):
        ensemble_reward([[1.0, 2.0]], "uwo", unbiased=True)
    message = (
        "`unbiased` must be False with method='min' (only 'uwo' and 'mean_minus_std' use a spread), got True."
    )
    with pytest.raises(ConfigError, match=re.escape(message)):
        ensemble_reward([[1.0], [2.0]], "min", unbiased=True)


@pytest.mark.parametrize("method", ["mean", "median", "min"])
def test_coef_with_a_method_that_ignores_it_is_rejected(method):
    message = f"`coef` must be None with method='{method}' (only 'uwo' and 'mean_minus_std' use it), got 0.5."
    with pytest.raises(ConfigError, match=re.escape(message)):
        ensemble_reward([[1.0], [2.0]], method, coef=0.5)


def test_coef_validation():
    with pytest.raises(ConfigError, match=re.escape("`coef` must be >= 0, got -0.1.")):
        ensemble_reward([[1.0], [2.0]], "uwo", coef=-0.1)
    with pytest.raises(ConfigError, match=re.escape("`coef` must be finite, got nan.")):
        ensemble_reward([[1.0], [2.0]], "mean_minus_std", coef=float("nan"))
    message = "`coef` must be a real number (not bool), got True."
    with pytest.raises(LoopguardTypeError, match=re.escape(message)):
        ensemble_reward([[1.0], [2.0]], "uwo", coef=True)
    with pytest.raises(LoopguardTypeError, match=re.escape("`coef` must be a real number, got '1'")):
        ensemble_reward([[1.0], [2.0]], "uwo", coef="1")


def test_overflow_is_an_error_not_a_silent_inf_or_nan():
    message = "`scores` must give a variance representable in float64, got one beyond ~1.8e308 at sample 0"
    with pytest.raises(InputError, match=re.escape(message)):
        ensemble_disagreement([[1e308], [-1e308]])
    message = "`scores` must give a result representable in float64, got one beyond ~1.8e308 at sample 1"
    with pytest.raises(InputError, match=re.escape(message)):
        ensemble_reward([[0.0, 1e308], [0.0, -1e308]], "uwo")


def test_representable_results_of_huge_scores_are_returned():
    # the sum overflows, the mean does not: it used to be refused as an overflow
    np.testing.assert_array_equal(ensemble_reward([[1e308], [1e308]], "mean"), [1e308])
    np.testing.assert_array_equal(ensemble_reward([[1.7e308], [1.7e308]], "median"), [1.7e308])
    # the variance (1e616) is beyond float64, its square root is not
    np.testing.assert_allclose(ensemble_disagreement([[1e308], [-1e308]], statistic="std"), 1e308, rtol=1e-15)
    np.testing.assert_allclose(ensemble_reward([[1e308], [-1e308]], "mean_minus_std"), [-1e308], rtol=1e-15)
    # tiny scores: the squares underflow to 0 in the plain formula, not after rescaling
    np.testing.assert_allclose(
        ensemble_disagreement([[1e-200], [-1e-200]], statistic="std"), 1e-200, rtol=1e-15
    )
    np.testing.assert_allclose(
        ensemble_disagreement([[3e-310], [-3e-310]], statistic="std"), 3e-310, rtol=1e-9
    )
    # a zero coefficient never looks at the spread, even one beyond float64
    np.testing.assert_array_equal(ensemble_reward([[1e308], [-1e308]], "uwo", coef=0.0), [0.0])
