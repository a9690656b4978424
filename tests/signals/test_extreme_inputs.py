"""Every public kernel on inputs from the whole finite float64 range: a finite result or a loopguard error.

A kernel given finite numbers must never return inf/NaN, never raise a raw numpy / scipy / scikit-learn
error, and never emit a RuntimeWarning (with ``-W error`` that would be a raw error too). Statistics that do
not depend on the scale of their input (correlations, fractions, standardised distances) must work on any
finite input; where the result itself cannot be represented, an :class:`InputError` says so.

The one documented non-finite value is kept: ``reward_drift(..., standardize=True)`` against a constant
reference returns ``inf`` for a non-zero distance (the Guard's drift detector relies on it).
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from threadpoolctl import threadpool_limits

from loopguard import signals
from loopguard.exceptions import ConfigError, InputError

# Every finite float64, subnormals and +-max included; hypothesis also favours the boundaries.
FINITE = st.floats(allow_nan=False, allow_infinity=False, width=64)
EXTREMES = st.sampled_from(
    [0.0, 5e-324, -5e-324, 1e-308, -1e-308, 1e-300, -1e-300, 1.0, -1.0, 1e300, -1e300, 1e308, -1e308,
     1.7976931348623157e308, -1.7976931348623157e308, 2.2250738585072014e-308]
)  # fmt: skip
VALUES = st.one_of(FINITE, EXTREMES)
POSITIVE = st.floats(min_value=5e-324, max_value=1.7976931348623157e308)
NONNEGATIVE = st.floats(min_value=0.0, max_value=1.7976931348623157e308)
UNIT = st.floats(min_value=0.0, max_value=1.0)

ACCEPTED_ERRORS = (InputError, ConfigError)


@pytest.fixture(autouse=True, scope="module")
def _single_openmp_thread():
    with threadpool_limits(limits=1):
        yield


def vectors(min_size: int = 1, max_size: int = 8, elements: st.SearchStrategy[float] = VALUES):
    return st.lists(elements, min_size=min_size, max_size=max_size).map(lambda v: np.array(v, dtype=float))


@st.composite
def matrices(draw: st.DrawFn, rows: tuple[int, int] = (1, 6), cols: tuple[int, int] = (1, 4)):
    n_rows = draw(st.integers(*rows))
    n_cols = draw(st.integers(*cols))
    flat = draw(st.lists(VALUES, min_size=n_rows * n_cols, max_size=n_rows * n_cols))
    return np.array(flat, dtype=float).reshape(n_rows, n_cols)


def all_finite(result: Any) -> bool:
    if isinstance(result, (float, int, np.floating)):
        return math.isfinite(float(result))
    if isinstance(result, np.ndarray):
        return result.dtype.kind != "f" or bool(np.isfinite(result).all())
    if isinstance(result, tuple):
        return all(all_finite(item) for item in result)
    if isinstance(result, signals.CusumResult):
        return all_finite((result.upper, result.lower, result.state.upper, result.state.lower))
    if isinstance(result, signals.RobustBaseline):
        return all_finite((result.median, result.mad, result.scale))
    if isinstance(result, signals.CusumState):
        return all_finite((result.upper, result.lower))
    return True  # verdict strings, bools


def check(call: Callable[[], Any]) -> Any:
    """Run ``call``; a finite result or a loopguard InputError/ConfigError passes, anything else fails."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning from numpy is a raw error under -W error
        try:
            result = call()
        except ACCEPTED_ERRORS as error:
            message = str(error)
            assert message.startswith("`"), message  # names the argument
            return None
    assert all_finite(result), result
    return result


COMMON = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)


# --------------------------------------------------------------------------------------------------
# one property per kernel family


@COMMON
@given(values=vectors(), group=st.integers(1, 4), ddof=st.integers(0, 1), atol=NONNEGATIVE)
def test_collapse_kernels_finite_or_input_error(values, group, ddof, atol):
    rewards = np.repeat(values, 2) if group == 1 else np.resize(values, len(values) * group)
    size = 2 if group == 1 else group
    check(lambda: signals.group_reward_std(rewards, size, ddof=ddof))
    check(lambda: signals.zero_std_group_fraction(rewards, size, atol=atol))
    ragged = [1, len(values) - 1] if len(values) > 1 else [1]  # ragged groups share the arithmetic
    check(lambda: signals.group_reward_std(values, ragged, ddof=ddof))
    check(lambda: signals.zero_std_group_fraction(values, ragged, atol=atol))


@COMMON
@given(series=vectors(max_size=10, elements=st.one_of(NONNEGATIVE, EXTREMES.map(abs))))
def test_trend_kernels_finite_or_input_error(series):
    for method in ("ols", "theil_sen"):
        check(lambda method=method: signals.entropy_trend(series, method=method))
        check(lambda method=method: signals.length_trend(series, method=method))
        check(lambda method=method: signals.series_slope(series, method=method))


@COMMON
@given(series=vectors(max_size=12, elements=st.one_of(VALUES, EXTREMES)))
def test_mann_kendall_z_is_bounded_and_order_equivariant(series):
    z = check(lambda: signals.mann_kendall_z(series))
    if z is None:
        return
    n = len(series)
    bound = math.sqrt(n * (n - 1) * (2 * n + 5) / 18) if n >= 3 else 0.0  # |S| <= n(n-1)/2, no ties
    assert abs(z) <= max(bound, 1e-12) + 1e-9
    assert check(lambda: signals.mann_kendall_z(series[::-1])) == pytest.approx(-z, abs=1e-12)


@COMMON
@given(
    rewards=vectors(min_size=2, max_size=10),
    lengths=st.lists(st.integers(0, 2**40), min_size=10, max_size=10),
    bin_width=st.integers(1, 2**41),
)
def test_length_kernels_finite_or_input_error(rewards, lengths, bin_width):
    lengths = np.array(lengths[: len(rewards)], dtype=np.int64)
    for method in ("pearson", "spearman"):
        result = check(
            lambda method=method: signals.reward_length_correlation(rewards, lengths, method=method)
        )
        assert result is not None  # scale-invariant: never refused
        assert -1.0 <= result <= 1.0
    check(lambda: signals.reward_length_slope(rewards, lengths))
    check(
        lambda: signals.length_stratified_gain(
            rewards, lengths, rewards[::-1], lengths, bin_width=bin_width, min_count=1
        )
    )


@COMMON
@given(values=vectors(), baselines=vectors(), drop=FINITE, scalar=VALUES)
def test_drift_kernels_finite_or_input_error(values, baselines, drop, scalar):
    n = min(len(values), len(baselines))
    check(lambda: signals.relative_drop(values[:n], baselines[:n]))
    check(lambda: signals.relative_drop(scalar, float(baselines[0])))
    check(lambda: signals.classify_drop(drop))
    baseline = check(lambda: signals.robust_baseline(values, min_count=1))
    if baseline is None:  # refused only when the MAD or its Gaussian scale (1.4826 MAD) is beyond float64
        assert np.ptp(values / 4.0) * 1.4826 > 1.7976931348623157e308 / 4.0
    for method in ("wasserstein", "ks"):
        check(lambda method=method: signals.reward_drift(values, baselines, method))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            standardized = signals.reward_drift(values, baselines, standardize=True)
        except InputError:
            standardized = 0.0
    # documented: a constant reference gives inf for any non-zero distance; otherwise finite
    assert math.isfinite(standardized) or np.ptp(baselines) == 0.0


@COMMON
@given(scores=matrices(rows=(1, 5), cols=(1, 5)), coef=NONNEGATIVE)
def test_ensemble_kernels_finite_or_input_error(scores, coef):
    for statistic in ("variance", "std"):
        check(lambda statistic=statistic: signals.ensemble_disagreement(scores, statistic=statistic))
    for method in ("mean", "median", "min"):
        result = check(lambda method=method: signals.ensemble_reward(scores, method))
        assert result is not None  # each lies within the members' range: always representable
    for method in ("uwo", "mean_minus_std"):
        check(lambda method=method: signals.ensemble_reward(scores, method, coef=coef))


@COMMON
@given(
    policy=matrices(rows=(1, 6), cols=(1, 3)),
    reference=matrices(rows=(2, 6), cols=(1, 3)),
    eps=POSITIVE,
    min_samples=st.integers(1, 3),
    ridge=NONNEGATIVE,
)
def test_latent_kernels_finite_or_input_error(policy, reference, eps, min_samples, ridge):
    dim = min(policy.shape[1], reference.shape[1])
    policy, reference = policy[:, :dim], reference[:, :dim]
    for metric in ("euclidean", "manhattan", "cosine"):
        check(
            lambda metric=metric: signals.cluster_separation_index(
                policy, reference, eps=eps, min_samples=min_samples, metric=metric
            )
        )
    for shrinkage in ("ledoit_wolf", "oas", "none"):
        check(
            lambda shrinkage=shrinkage: signals.squared_mahalanobis_distances(
                policy, reference, shrinkage=shrinkage, ridge=ridge
            )
        )
        fraction = check(
            lambda shrinkage=shrinkage: signals.mahalanobis_outlier_fraction(
                policy, reference, shrinkage=shrinkage, ridge=ridge
            )
        )
        assert fraction is None or 0.0 <= fraction <= 1.0
    check(lambda: signals.squared_mahalanobis_distances(policy, reference, n_components=1, ridge=ridge))


@COMMON
@given(
    values=vectors(max_size=12),
    alpha=st.floats(min_value=5e-324, max_value=1.0),
    window=st.integers(1, 5),
    target=VALUES,
    scale=POSITIVE,
    k=NONNEGATIVE,
    h=POSITIVE,
)
def test_smoothing_kernels_finite_or_input_error(values, alpha, window, target, scale, k, h):
    smoothed = check(lambda: signals.ema(values, alpha=alpha))
    assert smoothed is not None  # a convex combination of finite values is representable
    assert check(lambda: signals.ema_update(float(values[0]), float(values[-1]), alpha=alpha)) is not None
    medians = check(lambda: signals.rolling_median(values, window=window))
    assert medians is not None
    check(lambda: signals.cusum(values, target=target, scale=scale, k=k, h=h))
    detector = signals.Cusum(target, scale, k=k, h=h)
    state = detector.init()
    for value in values.tolist():
        outcome = check(lambda value=value, state=state: detector.update(state, value))
        if outcome is None:
            break
        _, state = outcome


@COMMON
@given(rate=UNIT, drop=NONNEGATIVE)
def test_classifiers_accept_the_whole_range(rate, drop):
    assert check(lambda: signals.classify_echo(rate)) in ("OK", "WARN", "TRAP")
    assert check(lambda: signals.classify_drop(drop)) in ("OK", "WARN", "HACK")


def test_every_public_kernel_is_covered():
    """A new public kernel must be added to the properties above."""
    covered = {
        "as_token_batch", "classify_drop", "classify_echo", "cluster_separation_index", "cusum", "distinct_n",
        "ema", "ema_update", "ensemble_disagreement", "ensemble_reward", "entropy_trend", "group_reward_std",
        "length_stratified_gain", "length_trend", "mahalanobis_outlier_fraction", "mann_kendall_z",
        "ngram_repetition_rate", "relative_drop", "reward_drift", "reward_length_correlation",
        "reward_length_slope", "robust_baseline", "rolling_median", "series_slope",
        "squared_mahalanobis_distances", "zero_std_group_fraction",
    }  # fmt: skip
    # token kernels take integer ids: their whole int64 range is covered in test_input_kinds.py
    public = {name for name in signals.__all__ if name[0].islower()}
    assert public == covered


# --------------------------------------------------------------------------------------------------
# exact scale equivariance at the ends of the range
#
# Scaling data by 2**k is exact in float64, so a kernel that rescales internally must give *exactly* the
# scaled (or the same, for scale-free statistics) result at k = +-1000 as at k = 0, where the plain formulas
# overflow (squares of 1e301) or underflow (squares of 1e-301).

POWERS = [-1000, -600, -300, 300, 600, 1000]
RNG = np.random.default_rng(7)
SMALL = RNG.normal(size=24).round(3)  # a few decimals: no subnormal after scaling down by 2**1000
EMB_P = np.vstack([RNG.normal(size=(12, 3)), RNG.normal(size=(6, 3)) + 4.0]).round(3)
EMB_R = RNG.normal(size=(30, 3)).round(3)


def scaled(value: Any, power: int) -> Any:
    return np.ldexp(np.asarray(value, dtype=float), power)


@pytest.mark.parametrize("power", POWERS)
def test_scale_free_statistics_ignore_the_scale(power):
    lengths = np.arange(24) * 3 % 17
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for method in ("pearson", "spearman"):
            assert signals.reward_length_correlation(scaled(SMALL, power), lengths, method=method) == (
                signals.reward_length_correlation(SMALL, lengths, method=method)
            )
        assert signals.reward_drift(scaled(SMALL, power), scaled(SMALL[::2] + 1, power), "ks") == (
            signals.reward_drift(SMALL, SMALL[::2] + 1, "ks")
        )
        assert signals.reward_drift(
            scaled(SMALL, power), scaled(SMALL[::2] + 1, power), standardize=True
        ) == (signals.reward_drift(SMALL, SMALL[::2] + 1, standardize=True))
        np.testing.assert_array_equal(
            signals.relative_drop(scaled(SMALL, power), scaled(SMALL[::-1], power)),
            signals.relative_drop(SMALL, SMALL[::-1]),
        )
        assert signals.zero_std_group_fraction(scaled(SMALL, power), 3, atol=0.0) == (
            signals.zero_std_group_fraction(SMALL, 3, atol=0.0)
        )
        for shrinkage in ("ledoit_wolf", "oas", "none"):
            for components in (None, 2):
                np.testing.assert_allclose(
                    signals.squared_mahalanobis_distances(
                        scaled(EMB_P, power),
                        scaled(EMB_R, power),
                        shrinkage=shrinkage,
                        ridge=0.0,
                        n_components=components,
                    ),
                    signals.squared_mahalanobis_distances(
                        EMB_P, EMB_R, shrinkage=shrinkage, ridge=0.0, n_components=components
                    ),
                    rtol=1e-9,
                )
        csi_cos = signals.cluster_separation_index(EMB_P, EMB_R, eps=0.05, min_samples=2, metric="cosine")
        scaled_cos = signals.cluster_separation_index(
            scaled(EMB_P, power), scaled(EMB_R, power), eps=0.05, min_samples=2, metric="cosine"
        )
        assert scaled_cos == pytest.approx(csi_cos, rel=1e-12)


@pytest.mark.parametrize("power", POWERS)
def test_statistics_with_units_scale_with_the_data(power):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(
            signals.group_reward_std(scaled(SMALL, power), 4),
            scaled(signals.group_reward_std(SMALL, 4), power),
            rtol=1e-15,
        )
        np.testing.assert_allclose(
            signals.ensemble_disagreement(scaled(SMALL.reshape(3, 8), power), statistic="std", reduce="none"),
            scaled(signals.ensemble_disagreement(SMALL.reshape(3, 8), statistic="std", reduce="none"), power),
            rtol=1e-15,
        )
        assert signals.reward_drift(scaled(SMALL, power), scaled(SMALL[::2] + 1, power)) == float(
            scaled(signals.reward_drift(SMALL, SMALL[::2] + 1), power)
        )
        baseline = signals.robust_baseline(scaled(SMALL, power))
        reference = signals.robust_baseline(SMALL)
        assert (baseline.median, baseline.mad) == (
            float(scaled(reference.median, power)),
            float(scaled(reference.mad, power)),
        )
        for metric in ("euclidean", "manhattan"):
            csi = signals.cluster_separation_index(EMB_P, EMB_R, eps=0.8, min_samples=3, metric=metric)
            assert csi > 0.0
            big = signals.cluster_separation_index(
                scaled(EMB_P, power),
                scaled(EMB_R, power),
                eps=float(scaled(0.8, power)),
                min_samples=3,
                metric=metric,
            )
            assert big == pytest.approx(float(scaled(csi, power)), rel=1e-12)


def test_extreme_values_that_used_to_fail():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # a huge common offset (the plain covariance estimate overflows): the distances are those of the
        # data without it, up to the rounding of the data itself (1e290 spread on a 1e300 offset)
        offset = np.array([1e300, -1e300, 0.0])
        np.testing.assert_allclose(
            signals.squared_mahalanobis_distances(EMB_P * 1e290 + offset, EMB_R * 1e290 + offset, ridge=0.0),
            signals.squared_mahalanobis_distances(EMB_P, EMB_R, ridge=0.0),
            rtol=1e-4,
        )
        # a policy astronomically far from a tiny reference: every row is an outlier, not an error
        assert signals.mahalanobis_outlier_fraction(EMB_P * 1e300 + 1e300, EMB_R * 1e-300) == 1.0
        with pytest.raises(
            InputError, match=re.escape("`policy_emb` must lie within float64's reach of `reference_emb`")
        ):
            signals.squared_mahalanobis_distances(EMB_P * 1e300 + 1e300, EMB_R * 1e-300)
        # a tiny reference under a ridge that its rescaling pushes past 1.8e308, with a PCA projection
        tiny_reference = [[0.0, 0.0], [0.0, 5.65758172e-251]]
        projected = signals.squared_mahalanobis_distances(
            np.ones((2, 2)), tiny_reference, n_components=1, ridge=1.0
        )
        np.testing.assert_allclose(projected, [1.0, 1.0], rtol=1e-12)
        # ... unless a huge ridge makes the reference's Gaussian wide enough
        wide = signals.squared_mahalanobis_distances([[1.0, 1.0, 1.0]], EMB_R * 1e-300, ridge=1e300)
        assert wide[0] == pytest.approx(3e-300, rel=1e-12)
        # CSI of clusters at 1.7e308: the distances between rows overflow in the plain formulas; the
        # normalised index (1.7e308) is representable, the sum (5.1e308) is not
        huge = [[1.7e308, 0.0], [1.7e308, 1.0], [-1.7e308, 0.0]]
        normalised = signals.cluster_separation_index(
            huge, [[0.0, 0.0]], eps=2.0, min_samples=1, normalize=True
        )
        assert normalised == pytest.approx(1.7e308, rel=1e-12)
        with pytest.raises(InputError, match=re.escape("must give a CSI representable in float64")):
            signals.cluster_separation_index(huge, [[0.0, 0.0]], eps=2.0, min_samples=1)
        # means and medians of values at the top of the range
        assert signals.robust_baseline([1.7e308] * 4).median == 1.7e308
        np.testing.assert_array_equal(signals.ensemble_reward([[1.7e308], [1.7e308]], "mean"), [1.7e308])
        assert (
            signals.reward_drift(
                [0.0, 0.0, 1.1125369292536007e-308], [0.0, 0.0, 1.1125369292536007e-308 / 2], standardize=True
            )
            > 0.0
        )
        # the standardised W1 against a reference whose squares underflow used to be inf
        assert math.isfinite(
            signals.reward_drift([0.0], [0.0, 0.0, 1.1125369292536007e-308], standardize=True)
        )
        # a CUSUM whose x - target overflows, though z does not
        result = signals.cusum([1e308], target=-1e308, scale=1e300)
        assert result.alarms.tolist() == [0]
        assert math.isfinite(result.upper[0])
        alarm, _ = signals.Cusum(-1e308, 1e300).update(signals.CusumState(), 1e308)
        assert alarm
        # EMA of values at the top of the range stays within them
        values = np.full(5, 1.7976931348623157e308)
        assert np.isfinite(signals.ema(values, alpha=0.3)).all()
        assert (
            signals.ema_update(1.7976931348623157e308, 1.7976931348623157e308, alpha=0.3)
            <= 1.7976931348623157e308
        )
