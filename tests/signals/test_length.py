"""Tests for the length-exploitation kernels and the shared trend helper."""

from __future__ import annotations

import math
import re
import statistics
import warnings
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import stats

from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError
from loopguard.signals import (
    CorrelationMethod,
    TrendMethod,
    length_stratified_gain,
    length_trend,
    reward_length_correlation,
    reward_length_slope,
)
from loopguard.signals._trend import MAX_THEIL_SEN_LENGTH, series_slope

# --------------------------------------------------------------------------------------------------
# independent references


def naive_pearson(x: list[float], y: list[float]) -> float:
    mx, my = math.fsum(x) / len(x), math.fsum(y) / len(y)
    sxy = math.fsum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    sxx = math.fsum((a - mx) ** 2 for a in x)
    syy = math.fsum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy)


def naive_ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def naive_stratified_gain(
    p_r: list[float], p_l: list[int], r_r: list[float], r_l: list[int], width: int, min_count: int
) -> float:
    policy: dict[int, list[float]] = defaultdict(list)
    reference: dict[int, list[float]] = defaultdict(list)
    for reward, length in zip(p_r, p_l, strict=True):
        policy[length // width].append(reward)
    for reward, length in zip(r_r, r_l, strict=True):
        reference[length // width].append(reward)
    total = 0
    acc = 0.0
    for b in policy:
        if b in reference and len(policy[b]) >= min_count and len(reference[b]) >= min_count:
            n = len(policy[b]) + len(reference[b])
            total += n
            acc += (statistics.fmean(policy[b]) - statistics.fmean(reference[b])) * n
    return acc / total


def naive_pairwise_median_slope(values: list[float]) -> float:
    slopes = [
        (values[j] - values[i]) / (j - i) for i in range(len(values)) for j in range(i + 1, len(values))
    ]
    return statistics.median(slopes)


rewards_st = st.lists(st.integers(-1000, 1000).map(lambda v: v / 8), min_size=2, max_size=40)


@st.composite
def rewards_and_lengths(draw: st.DrawFn, min_size: int = 2) -> tuple[list[float], list[int]]:
    n = draw(st.integers(min_size, 40))
    rewards = draw(st.lists(st.integers(-1000, 1000).map(lambda v: v / 8), min_size=n, max_size=n))
    lengths = draw(st.lists(st.integers(0, 500), min_size=n, max_size=n))
    return rewards, lengths


# --------------------------------------------------------------------------------------------------
# reward_length_correlation


def test_correlation_hand_case() -> None:
    # rewards 1, 2, 3 against lengths 1, 3, 2: centred products (-1)(-1) + 0 + (1)(0) = 1, sxx = syy = 2
    assert reward_length_correlation([1.0, 2.0, 3.0], [1, 3, 2]) == pytest.approx(0.5)
    # ranks are the values themselves here, so Spearman agrees
    assert reward_length_correlation([1.0, 2.0, 3.0], [1, 3, 2], method="spearman") == pytest.approx(0.5)
    assert reward_length_correlation([1.0, 2.0], [5, 9]) == pytest.approx(1.0)
    assert reward_length_correlation([1.0, 2.0], [9, 5]) == pytest.approx(-1.0)


@pytest.mark.parametrize("seed", range(5))
def test_correlation_matches_scipy_and_naive(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 300, size=50)
    rewards = 0.01 * lengths + rng.normal(size=50)
    rewards[:5] = rewards[5]  # ties in rewards, exercised by Spearman's average ranks
    expected_p = stats.pearsonr(rewards, lengths).statistic
    expected_s = stats.spearmanr(rewards, lengths).statistic
    assert reward_length_correlation(rewards, lengths) == pytest.approx(expected_p, abs=1e-12)
    assert reward_length_correlation(rewards, lengths, method="spearman") == pytest.approx(
        expected_s, abs=1e-12
    )
    r_list, l_list = rewards.tolist(), [float(v) for v in lengths]
    assert reward_length_correlation(rewards, lengths) == pytest.approx(naive_pearson(r_list, l_list))
    assert reward_length_correlation(rewards, lengths, method="spearman") == pytest.approx(
        naive_pearson(naive_ranks(r_list), naive_ranks(l_list))
    )


def test_correlation_accepts_numpy_int_dtypes_and_large_rewards() -> None:
    lengths = np.array([10, 20, 30, 40], dtype=np.uint16)
    rewards = np.array([1e300, 2e300, 2.5e300, 4e300])
    expected = naive_pearson([1.0, 2.0, 2.5, 4.0], [10.0, 20.0, 30.0, 40.0])
    assert reward_length_correlation(rewards, lengths) == pytest.approx(expected)


@pytest.mark.parametrize("method", ["pearson", "spearman"])
def test_correlation_constant_input_is_zero_without_warnings(method: CorrelationMethod) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reward_length_correlation([0.5, 0.5, 0.5], [1, 2, 3], method=method) == 0.0
        assert reward_length_correlation([0.1, 0.2, 0.3], [7, 7, 7], method=method) == 0.0
        assert reward_length_correlation([0.1, 0.1], [7, 7], method=method) == 0.0


@settings(max_examples=50, deadline=None)
@given(data=rewards_and_lengths(), method=st.sampled_from(["pearson", "spearman"]))
def test_correlation_bounded_and_never_nan(
    data: tuple[list[float], list[int]], method: CorrelationMethod
) -> None:
    rewards, lengths = data
    value = reward_length_correlation(rewards, lengths, method=method)
    assert isinstance(value, float)
    assert -1.0 <= value <= 1.0
    assert not math.isnan(value)


@settings(max_examples=50, deadline=None)
@given(
    data=rewards_and_lengths(),
    scale=st.sampled_from([0.5, 2.0, 3.75, 10.0]),
    shift=st.sampled_from([-100.0, 0.0, 3.5, 100.0]),
)
def test_pearson_invariant_under_positive_affine_rewards(
    data: tuple[list[float], list[int]], scale: float, shift: float
) -> None:
    rewards, lengths = data
    transformed = [scale * r + shift for r in rewards]
    assert reward_length_correlation(transformed, lengths) == pytest.approx(
        reward_length_correlation(rewards, lengths), abs=1e-9
    )
    flipped = [-r for r in rewards]
    assert reward_length_correlation(flipped, lengths) == pytest.approx(
        -reward_length_correlation(rewards, lengths), abs=1e-12
    )


@settings(max_examples=50, deadline=None)
@given(
    data=rewards_and_lengths(), seed=st.integers(0, 2**16), method=st.sampled_from(["pearson", "spearman"])
)
def test_correlation_invariant_under_joint_permutation(
    data: tuple[list[float], list[int]], seed: int, method: CorrelationMethod
) -> None:
    rewards, lengths = data
    order = np.random.default_rng(seed).permutation(len(rewards))
    permuted = reward_length_correlation(
        np.asarray(rewards)[order],
        np.asarray(lengths)[order],
        method=method,
    )
    assert permuted == pytest.approx(reward_length_correlation(rewards, lengths, method=method), abs=1e-12)


@settings(max_examples=50, deadline=None)
@given(data=rewards_and_lengths())
def test_spearman_invariant_under_monotone_length_transform(data: tuple[list[float], list[int]]) -> None:
    rewards, lengths = data
    squared = [v * v for v in lengths]  # strictly increasing on lengths >= 0
    assert reward_length_correlation(rewards, squared, method="spearman") == pytest.approx(
        reward_length_correlation(rewards, lengths, method="spearman"), abs=1e-12
    )


# --------------------------------------------------------------------------------------------------
# reward_length_slope


def test_slope_hand_case() -> None:
    # lengths 0, 10, 20 (mean 10), rewards 1, 1, 4 (mean 2): sum (L - 10)(r - 2) = 10 + 0 + 20 = 30, sxx = 200
    assert reward_length_slope([1.0, 1.0, 4.0], [0, 10, 20]) == pytest.approx(0.15)


@pytest.mark.parametrize("seed", range(5))
def test_slope_matches_polyfit(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 1000, size=64)
    rewards = 0.003 * lengths + rng.normal(size=64)
    expected = np.polyfit(lengths.astype(float), rewards, 1)[0]
    assert reward_length_slope(rewards, lengths) == pytest.approx(expected, rel=1e-9)
    assert reward_length_slope(rewards, lengths) == pytest.approx(stats.linregress(lengths, rewards).slope)


def test_slope_constant_inputs_are_zero() -> None:
    assert reward_length_slope([0.1, 0.9, 0.4], [50, 50, 50]) == 0.0
    assert reward_length_slope([0.3, 0.3, 0.3], [1, 50, 70]) == 0.0
    assert reward_length_slope([0.0, 0.0], [0, 0]) == 0.0


@settings(max_examples=50, deadline=None)
@given(data=rewards_and_lengths(), scale=st.sampled_from([0.5, 2.0, 8.0]), shift=st.sampled_from([-3.0, 7.0]))
def test_slope_is_linear_in_rewards(data: tuple[list[float], list[int]], scale: float, shift: float) -> None:
    rewards, lengths = data
    base = reward_length_slope(rewards, lengths)
    assert not math.isnan(base)
    transformed = [scale * r + shift for r in rewards]
    assert reward_length_slope(transformed, lengths) == pytest.approx(scale * base, rel=1e-9, abs=1e-12)


@settings(max_examples=50, deadline=None)
@given(data=rewards_and_lengths())
def test_slope_sign_matches_correlation(data: tuple[list[float], list[int]]) -> None:
    rewards, lengths = data
    slope = reward_length_slope(rewards, lengths)
    rho = reward_length_correlation(rewards, lengths)
    assume(abs(rho) > 1e-9)
    assert math.copysign(1.0, slope) == math.copysign(1.0, rho)


# --------------------------------------------------------------------------------------------------
# length_stratified_gain


def test_stratified_gain_hand_case() -> None:
    # width 10. bin 0: policy [1, 3] (mean 2), ref [0, 0] (mean 0), n = 4, diff 2.
    # bin 1: policy [5, 5, 5] (mean 5), ref [4, 6, 8, 2] (mean 5), n = 7, diff 0.
    # bin 2: policy [9] only one item -> dropped.  WGain = (2 * 4 + 0 * 7) / 11 = 8 / 11.
    policy_r = [1.0, 3.0, 5.0, 5.0, 5.0, 9.0]
    policy_l = [0, 9, 10, 15, 19, 25]
    ref_r = [0.0, 0.0, 4.0, 6.0, 8.0, 2.0, 7.0, 7.0]
    ref_l = [2, 3, 11, 12, 13, 14, 20, 29]
    assert length_stratified_gain(policy_r, policy_l, ref_r, ref_l, bin_width=10) == pytest.approx(8 / 11)
    # min_count=1 keeps bin 2 (policy [9], ref [7, 7]: diff 2, n = 3): (8 + 0 + 6) / 14 = 1
    assert length_stratified_gain(
        policy_r, policy_l, ref_r, ref_l, bin_width=10, min_count=1
    ) == pytest.approx(1.0)


def test_stratified_gain_entirely_length() -> None:
    # the reward is a function of the length bin only; the policy writes longer, so its raw gain is positive
    rng = np.random.default_rng(0)
    ref_l = rng.integers(0, 64, size=200)
    policy_l = rng.integers(32, 128, size=200)

    def reward(lengths: np.ndarray) -> np.ndarray:
        return (lengths // 16) * 0.25

    raw_gain = float(reward(policy_l).mean() - reward(ref_l).mean())
    assert raw_gain > 0.3
    assert length_stratified_gain(reward(policy_l), policy_l, reward(ref_l), ref_l) == pytest.approx(
        0.0, abs=1e-12
    )


def test_stratified_gain_real_improvement_survives() -> None:
    lengths = np.arange(0, 64)
    base = (lengths // 16) * 0.25
    assert length_stratified_gain(base + 0.5, lengths, base, lengths) == pytest.approx(0.5)


@pytest.mark.parametrize("seed", range(5))
def test_stratified_gain_matches_naive(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p_l = rng.integers(0, 200, size=80)
    r_l = rng.integers(0, 150, size=60)
    p_r = rng.normal(size=80) + 0.01 * p_l
    r_r = rng.normal(size=60) + 0.01 * r_l
    for width, min_count in [(16, 2), (7, 1), (20, 3)]:
        expected = naive_stratified_gain(
            p_r.tolist(), p_l.tolist(), r_r.tolist(), r_l.tolist(), width, min_count
        )
        got = length_stratified_gain(p_r, p_l, r_r, r_l, bin_width=width, min_count=min_count)
        assert got == pytest.approx(expected, rel=1e-9, abs=1e-12)


@st.composite
def two_batches(draw: st.DrawFn) -> tuple[list[float], list[int], list[float], list[int]]:
    n_p = draw(st.integers(2, 30))
    n_r = draw(st.integers(2, 30))
    p_r = draw(st.lists(st.integers(-80, 80).map(lambda v: v / 4), min_size=n_p, max_size=n_p))
    r_r = draw(st.lists(st.integers(-80, 80).map(lambda v: v / 4), min_size=n_r, max_size=n_r))
    p_l = draw(st.lists(st.integers(0, 40), min_size=n_p, max_size=n_p))
    r_l = draw(st.lists(st.integers(0, 40), min_size=n_r, max_size=n_r))
    return p_r, p_l, r_r, r_l


def _has_common_bin(p_l: list[int], r_l: list[int], width: int, min_count: int) -> bool:
    p_counts = np.bincount(np.asarray(p_l) // width, minlength=64)
    r_counts = np.bincount(np.asarray(r_l) // width, minlength=64)
    return bool(((p_counts >= min_count) & (r_counts >= min_count)).any())


@settings(max_examples=50, deadline=None)
@given(batches=two_batches(), width=st.integers(1, 20), min_count=st.integers(1, 3))
def test_stratified_gain_properties(
    batches: tuple[list[float], list[int], list[float], list[int]], width: int, min_count: int
) -> None:
    p_r, p_l, r_r, r_l = batches
    assume(_has_common_bin(p_l, r_l, width, min_count))
    gain = length_stratified_gain(p_r, p_l, r_r, r_l, bin_width=width, min_count=min_count)
    assert not math.isnan(gain)
    assert gain == pytest.approx(naive_stratified_gain(p_r, p_l, r_r, r_l, width, min_count), abs=1e-9)
    # antisymmetric in the two sides
    swapped = length_stratified_gain(r_r, r_l, p_r, p_l, bin_width=width, min_count=min_count)
    assert swapped == pytest.approx(-gain, abs=1e-9)
    # adding c to every policy reward adds c (the weights sum to one)
    shifted = length_stratified_gain(
        [r + 1.5 for r in p_r], p_l, r_r, r_l, bin_width=width, min_count=min_count
    )
    assert shifted == pytest.approx(gain + 1.5, abs=1e-9)
    # bounded by the extreme per-bin differences, hence by the extreme rewards
    assert min(p_r) - max(r_r) - 1e-9 <= gain <= max(p_r) - min(r_r) + 1e-9


@settings(max_examples=50, deadline=None)
@given(batches=two_batches())
def test_stratified_gain_single_bin_equals_raw_gain(
    batches: tuple[list[float], list[int], list[float], list[int]],
) -> None:
    p_r, p_l, r_r, r_l = batches
    gain = length_stratified_gain(p_r, p_l, r_r, r_l, bin_width=1000)
    assert gain == pytest.approx(statistics.fmean(p_r) - statistics.fmean(r_r), abs=1e-9)


@settings(max_examples=50, deadline=None)
@given(batches=two_batches())
def test_stratified_gain_same_batch_is_zero(
    batches: tuple[list[float], list[int], list[float], list[int]],
) -> None:
    p_r, p_l, _, _ = batches
    assume(_has_common_bin(p_l, p_l, 16, 2))
    assert length_stratified_gain(p_r, p_l, p_r, p_l) == pytest.approx(0.0, abs=1e-12)


def test_stratified_gain_no_common_bin() -> None:
    message = (
        "`policy_lengths` and `reference_lengths` must share at least one length bin of width 16 "
        "holding >= 2 completions from each side (no common length range), "
        "got policy lengths 100..120 and reference lengths 0..20."
    )
    with pytest.raises(InputError, match=re.escape(message)):
        length_stratified_gain([1.0, 1.0, 1.0], [100, 110, 120], [0.0, 0.0, 0.0], [0, 10, 20])
    # overlap exists but holds a single policy item
    with pytest.raises(InputError, match=re.escape("(no common length range)")):
        length_stratified_gain([1.0, 1.0], [5, 100], [0.0, 0.0], [1, 2])


# --------------------------------------------------------------------------------------------------
# length_trend and series_slope


@pytest.mark.parametrize("seed", range(4))
def test_trend_matches_polyfit_and_theilslopes(seed: int) -> None:
    rng = np.random.default_rng(seed)
    series = 200.0 + 1.5 * np.arange(60) + rng.normal(scale=5.0, size=60)
    series[10] = 2000.0  # one spike
    assert length_trend(series) == pytest.approx(np.polyfit(np.arange(60.0), series, 1)[0], rel=1e-9)
    assert length_trend(series, method="theil_sen") == pytest.approx(
        stats.theilslopes(series).slope, rel=1e-12
    )
    assert length_trend(series, method="theil_sen") == pytest.approx(
        naive_pairwise_median_slope(series.tolist()), rel=1e-12
    )
    assert abs(length_trend(series, method="theil_sen") - 1.5) < abs(length_trend(series) - 1.5)


def test_trend_hand_cases() -> None:
    assert length_trend([5.0, 7.0]) == 2.0
    assert length_trend([5.0, 7.0], method="theil_sen") == 2.0
    assert length_trend([10.0, 10.0, 10.0]) == 0.0
    assert length_trend([10.0, 10.0, 10.0], method="theil_sen") == 0.0
    # x centred at 1: (-1)(0 - 3) + 0 + (1)(6 - 3) = 6, sxx = 2 -> 3; pairwise slopes 3, 3, 3 -> 3
    assert length_trend([0.0, 3.0, 6.0]) == pytest.approx(3.0)
    assert length_trend([0, 3, 6], method="theil_sen") == pytest.approx(3.0)


@settings(max_examples=50, deadline=None)
@given(
    values=st.lists(st.floats(0.0, 1e4, allow_nan=False), min_size=2, max_size=50),
    method=st.sampled_from(["ols", "theil_sen"]),
    slope=st.sampled_from([-2.0, 0.5, 3.0]),
)
def test_trend_properties(values: list[float], method: TrendMethod, slope: float) -> None:
    base = length_trend(values, method=method)
    assert math.isfinite(base)
    # adding a linear ramp adds its slope; adding a constant changes nothing
    ramp = [v + 1e5 + slope * i for i, v in enumerate(values)]
    assert length_trend(ramp, method=method) == pytest.approx(base + slope, abs=1e-6)
    # reversing the series flips the sign
    assert length_trend(values[::-1], method=method) == pytest.approx(-base, abs=1e-9)
    # the slope lies between the extreme pairwise slopes
    pairwise = [
        (values[j] - values[i]) / (j - i) for i in range(len(values)) for j in range(i + 1, len(values))
    ]
    assert min(pairwise) - 1e-9 <= base <= max(pairwise) + 1e-9


def test_series_slope_reports_callers_name_and_huge_values() -> None:
    with pytest.raises(
        InputError, match=re.escape("`mean_lengths` must have at least 2 points to fit a slope, got 1.")
    ):
        length_trend([3.0])
    assert series_slope([1e300, 1.5e300, 2e300]) == pytest.approx(5e299)
    assert series_slope([1e300, 1.5e300, 2e300], method="theil_sen") == pytest.approx(5e299)
    with pytest.raises(InputError, match=re.escape("`values` must have a slope representable in float64")):
        series_slope([-1.7e308, 1.7e308])


def test_trend_caps() -> None:
    too_long = np.zeros(MAX_THEIL_SEN_LENGTH + 1)
    message = f"`mean_lengths` must have at most {MAX_THEIL_SEN_LENGTH:,} points for method='theil_sen'"
    with pytest.raises(InputError, match=re.escape(message)):
        length_trend(too_long, method="theil_sen")
    assert length_trend(too_long) == 0.0  # OLS takes it
    huge = np.zeros(10_000_001)  # one over MAX_SERIES_LENGTH; rejected before any arithmetic
    with pytest.raises(
        InputError, match=re.escape("`mean_lengths` must have at most 10,000,000 rows (DoS cap)")
    ):
        length_trend(huge)


# --------------------------------------------------------------------------------------------------
# bad inputs


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"method": "kendall"}, ConfigError, "`method` must be one of 'pearson', 'spearman', got 'kendall'."),
        ({"method": 1}, LoopguardTypeError, "`method` must be a name string, got 1 of type int."),
        ({"lengths": [1, 2]}, InputError, "`rewards` and `lengths` must have the same length, got 3 and 2."),
        ({"lengths": [1, -2, 3]}, InputError, "`lengths` must be >= 0, got -2 at index (1,)."),
        (
            {"lengths": [1.0, 2.0, 3.0]},
            LoopguardTypeError,
            "`lengths` must hold integers, got dtype float64.",
        ),
        ({"lengths": [True, False, True]}, LoopguardTypeError, "`lengths` must hold integers, got booleans."),
        (
            {"rewards": [1.0, float("nan"), 2.0]},
            InputError,
            "`rewards` must be finite, got nan at index (1,).",
        ),
        (
            {"rewards": [1.0, float("inf"), 2.0]},
            InputError,
            "`rewards` must be finite, got inf at index (1,).",
        ),
        ({"rewards": [[1.0, 2.0, 3.0]]}, InputError, "`rewards` must be a 1-D array, got shape (1, 3)."),
        ({"rewards": [], "lengths": []}, InputError, "`rewards` must not be empty, got shape (0,)."),
        (
            {"rewards": [1.0], "lengths": [3]},
            InputError,
            "`rewards` must hold at least 2 completions to correlate, got 1.",
        ),
        (
            {"rewards": "abc"},
            LoopguardTypeError,
            "`rewards` must be an array of numbers, got 'abc' of type str.",
        ),
    ],
)
def test_correlation_bad_inputs(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    arguments: dict[str, Any] = {"rewards": [1.0, 2.0, 3.0], "lengths": [1, 2, 3]}
    arguments.update(kwargs)
    with pytest.raises(error, match=re.escape(message)):
        reward_length_correlation(**arguments)


def test_correlation_cap() -> None:
    n = 100_001
    with pytest.raises(
        InputError, match=re.escape("`rewards` must have at most 100,000 rows (DoS cap), got 100,001.")
    ):
        reward_length_correlation(np.zeros(n), np.zeros(n, dtype=np.int64))


@pytest.mark.parametrize(
    ("rewards", "lengths", "error", "message"),
    [
        (
            [1.0, 2.0],
            [1, 2, 3],
            InputError,
            "`rewards` and `lengths` must have the same length, got 2 and 3.",
        ),
        ([1.0], [1], InputError, "`rewards` must hold at least 2 completions to fit a slope, got 1."),
        ([1.0, 2.0], [1.5, 2.5], LoopguardTypeError, "`lengths` must hold integers, got dtype float64."),
        ([1.0, 2.0], [1, -1], InputError, "`lengths` must be >= 0, got -1 at index (1,)."),
        ([1.0, float("nan")], [1, 2], InputError, "`rewards` must be finite, got nan at index (1,)."),
        ([True, False], [1, 2], LoopguardTypeError, "`rewards` must hold numbers, got booleans"),
    ],
)
def test_slope_bad_inputs(rewards: object, lengths: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        reward_length_slope(rewards, lengths)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"bin_width": 0}, ConfigError, "`bin_width` must be >= 1, got 0."),
        ({"bin_width": True}, LoopguardTypeError, "`bin_width` must be an integer (not bool), got True."),
        ({"bin_width": 16.0}, LoopguardTypeError, "`bin_width` must be an integer, got 16.0 of type float."),
        ({"min_count": 0}, ConfigError, "`min_count` must be >= 1, got 0."),
        ({"min_count": False}, LoopguardTypeError, "`min_count` must be an integer (not bool), got False."),
        (
            {"policy_lengths": [1, 2]},
            InputError,
            "`policy_rewards` and `policy_lengths` must have the same length, got 3 and 2.",
        ),
        (
            {"reference_rewards": [1.0]},
            InputError,
            "`reference_rewards` and `reference_lengths` must have the same length, got 1 and 3.",
        ),
        ({"policy_lengths": [1, 2, -3]}, InputError, "`policy_lengths` must be >= 0, got -3 at index (2,)."),
        (
            {"reference_lengths": [1.0, 2.0, 3.0]},
            LoopguardTypeError,
            "`reference_lengths` must hold integers",
        ),
        ({"reference_rewards": [0.0, float("nan"), 1.0]}, InputError, "`reference_rewards` must be finite"),
        ({"policy_rewards": [], "policy_lengths": []}, InputError, "`policy_rewards` must not be empty"),
    ],
)
def test_stratified_gain_bad_inputs(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    arguments: dict[str, Any] = {
        "policy_rewards": [1.0, 2.0, 3.0],
        "policy_lengths": [1, 2, 3],
        "reference_rewards": [0.0, 1.0, 2.0],
        "reference_lengths": [1, 2, 3],
    }
    arguments.update(kwargs)
    with pytest.raises(error, match=re.escape(message)):
        length_stratified_gain(**arguments)


@pytest.mark.parametrize(
    ("values", "method", "error", "message"),
    [
        ([1.0, 2.0], "linear", ConfigError, "`method` must be one of 'ols', 'theil_sen', got 'linear'."),
        ([], "ols", InputError, "`mean_lengths` must not be empty, got shape (0,)."),
        ([4.0], "theil_sen", InputError, "`mean_lengths` must have at least 2 points to fit a slope, got 1."),
        ([1.0, float("nan")], "ols", InputError, "`mean_lengths` must be finite, got nan at index (1,)."),
        ([1.0, -2.0], "ols", InputError, "`mean_lengths` must be >= 0, got -2.0 at index 1."),
        ([[1.0, 2.0]], "ols", InputError, "`mean_lengths` must be a 1-D array, got shape (1, 2)."),
        ([True, False], "ols", LoopguardTypeError, "`mean_lengths` must hold numbers, got booleans"),
    ],
)
def test_trend_bad_inputs(values: object, method: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        length_trend(values, method=method)
