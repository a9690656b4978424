"""Tests for the collapse (echo trap) kernels."""

from __future__ import annotations

import math
import re
import statistics
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError
from loopguard.signals import TrendMethod, entropy_trend, group_reward_std, zero_std_group_fraction
from loopguard.signals._collapse import group_spread

# --------------------------------------------------------------------------------------------------
# independent references


def naive_group_std(rewards: list[float], group_size: int, ddof: int) -> list[float]:
    stdev = statistics.stdev if ddof == 1 else statistics.pstdev
    return [stdev(rewards[i : i + group_size]) for i in range(0, len(rewards), group_size)]


def naive_zero_fraction(rewards: list[float], group_size: int, atol: float) -> float:
    groups = [rewards[i : i + group_size] for i in range(0, len(rewards), group_size)]
    return sum(max(g) - min(g) <= atol for g in groups) / len(groups)


@st.composite
def grouped_rewards(draw: st.DrawFn, discrete: bool = False) -> tuple[list[float], int]:
    group_size = draw(st.integers(2, 8))
    n_groups = draw(st.integers(1, 10))
    values = st.sampled_from([0.0, 0.5, 1.0]) if discrete else st.integers(-400, 400).map(lambda v: v / 16)
    rewards = draw(st.lists(values, min_size=group_size * n_groups, max_size=group_size * n_groups))
    return rewards, group_size


# --------------------------------------------------------------------------------------------------
# group_reward_std


def test_group_std_hand_case() -> None:
    # group 0: [1, 0, 1, 0], mean 0.5, squared deviations sum 1 -> sample var 1/3, population var 1/4
    # group 1: [2, 2, 2, 2] -> 0
    rewards = [1.0, 0.0, 1.0, 0.0, 2.0, 2.0, 2.0, 2.0]
    np.testing.assert_allclose(group_reward_std(rewards, 4), [math.sqrt(1 / 3), 0.0], rtol=1e-12)
    np.testing.assert_allclose(group_reward_std(rewards, 4, ddof=0), [0.5, 0.0], rtol=1e-12)
    np.testing.assert_allclose(group_reward_std(rewards, 2), [math.sqrt(0.5)] * 2 + [0.0] * 2, rtol=1e-12)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("ddof", [0, 1])
def test_group_std_matches_naive_loop(seed: int, ddof: int) -> None:
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=48)
    for group_size in (2, 3, 8, 48):
        got = group_reward_std(rewards, group_size, ddof=ddof)
        assert got.shape == (48 // group_size,)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, naive_group_std(rewards.tolist(), group_size, ddof), rtol=1e-12)


def test_group_std_identical_rewards_exactly_zero() -> None:
    # 0.1 * 3 / 3 != 0.1 in floating point: a mean-based std would leave a residue
    rewards = [0.1, 0.1, 0.1, 1e200, 1e200, 1e200, -7.3, -7.3, -7.3]
    assert group_reward_std(rewards, 3).tolist() == [0.0, 0.0, 0.0]
    assert group_reward_std([0.0] * 6, 3).tolist() == [0.0, 0.0]


def test_group_std_large_values_do_not_overflow() -> None:
    got = group_reward_std([1e300, -1e300, 3e300, 1e300], 2, ddof=0)
    np.testing.assert_allclose(got, [1e300, 1e300], rtol=1e-12)


@settings(max_examples=50, deadline=None)
@given(data=grouped_rewards(), seed=st.integers(0, 2**16), ddof=st.sampled_from([0, 1]))
def test_group_std_permutation_properties(data: tuple[list[float], int], seed: int, ddof: int) -> None:
    rewards, group_size = data
    base = group_reward_std(rewards, group_size, ddof=ddof)
    assert np.all(base >= 0.0)
    assert not np.isnan(base).any()
    rng = np.random.default_rng(seed)
    groups = np.asarray(rewards).reshape(-1, group_size)
    # permuting the groups permutes the output
    order = rng.permutation(len(groups))
    permuted = group_reward_std(groups[order].reshape(-1), group_size, ddof=ddof)
    np.testing.assert_allclose(permuted, base[order], rtol=1e-12, atol=1e-12)
    # shuffling rollouts inside each group changes nothing
    shuffled = rng.permuted(groups, axis=1)
    np.testing.assert_allclose(
        group_reward_std(shuffled.reshape(-1), group_size, ddof=ddof), base, atol=1e-12
    )


@settings(max_examples=50, deadline=None)
@given(
    data=grouped_rewards(), scale=st.sampled_from([-3.0, 0.5, 2.0]), shift=st.sampled_from([-5.0, 0.0, 9.0])
)
def test_group_std_affine_equivariance(data: tuple[list[float], int], scale: float, shift: float) -> None:
    rewards, group_size = data
    base = group_reward_std(rewards, group_size)
    transformed = group_reward_std([scale * r + shift for r in rewards], group_size)
    np.testing.assert_allclose(transformed, abs(scale) * base, rtol=1e-9, atol=1e-12)
    # the population std never exceeds the sample std
    assert np.all(group_reward_std(rewards, group_size, ddof=0) <= base + 1e-12)


# --------------------------------------------------------------------------------------------------
# zero_std_group_fraction


def test_zero_fraction_hand_cases() -> None:
    assert zero_std_group_fraction([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5], 2) == 0.75
    assert zero_std_group_fraction([1.0, 1.0, 1.0, 0.0, 0.0, 0.0], 3) == 1.0
    assert zero_std_group_fraction([1.0, 0.0, 1.0, 0.0, 1.0, 0.0], 3) == 0.0
    assert zero_std_group_fraction([1.0, 1.0 + 1e-9, 2.0, 3.0], 2) == 0.5  # within the default 1e-8
    assert zero_std_group_fraction([1.0, 1.0 + 1e-9, 2.0, 3.0], 2, atol=0.0) == 0.0
    assert zero_std_group_fraction([1.0, 1.5, 2.0, 3.0], 2, atol=0.5) == 0.5  # range <= atol is inclusive
    assert zero_std_group_fraction([0.1 + 0.2, 0.3, 5.0, 5.0], 2, atol=0.0) == 0.5  # 0.30000000000000004


def test_zero_fraction_agrees_with_trl_rule_on_discrete_rewards() -> None:
    # TRL: isclose(sample std per group, 0) with atol 1e-8; identical for exactly-equal groups
    rng = np.random.default_rng(3)
    rewards = rng.choice([0.0, 1.0], size=(64, 4), p=[0.8, 0.2])
    trl_rule = float(np.mean(np.isclose(rewards.std(axis=1, ddof=1), 0.0, rtol=1e-5, atol=1e-8)))
    assert zero_std_group_fraction(rewards.reshape(-1), 4) == trl_rule


@settings(max_examples=50, deadline=None)
@given(
    data=grouped_rewards(discrete=True), atol=st.sampled_from([0.0, 1e-8, 0.5, 2.0]), seed=st.integers(0, 999)
)
def test_zero_fraction_properties(data: tuple[list[float], int], atol: float, seed: int) -> None:
    rewards, group_size = data
    value = zero_std_group_fraction(rewards, group_size, atol=atol)
    assert value == pytest.approx(naive_zero_fraction(rewards, group_size, atol))
    assert 0.0 <= value <= 1.0
    # monotone non-decreasing in atol
    assert zero_std_group_fraction(rewards, group_size, atol=atol + 0.6) >= value
    # a zero-range group has zero std, and (for atol = 0) the converse
    zero_std = group_reward_std(rewards, group_size) == 0.0
    assert zero_std_group_fraction(rewards, group_size, atol=0.0) == pytest.approx(float(np.mean(zero_std)))
    # invariant to group order
    groups = np.asarray(rewards).reshape(-1, group_size)
    order = np.random.default_rng(seed).permutation(len(groups))
    assert zero_std_group_fraction(groups[order].reshape(-1), group_size, atol=atol) == value


def test_zero_fraction_huge_range_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert zero_std_group_fraction([-1.7e308, 1.7e308, 2.0, 2.0], 2) == 0.5


# --------------------------------------------------------------------------------------------------
# entropy_trend


@pytest.mark.parametrize("seed", range(4))
def test_entropy_trend_matches_polyfit_and_theilslopes(seed: int) -> None:
    rng = np.random.default_rng(seed)
    series = np.clip(2.0 - 0.01 * np.arange(80) + rng.normal(scale=0.05, size=80), 0.0, None)
    series[40] = 6.0  # gradient-spike step
    assert entropy_trend(series) == pytest.approx(np.polyfit(np.arange(80.0), series, 1)[0], rel=1e-9)
    assert entropy_trend(series, method="theil_sen") == pytest.approx(
        stats.theilslopes(series).slope, rel=1e-12
    )


def test_entropy_trend_hand_cases() -> None:
    # mean 0.85; centred x -1.5, -0.5, 0.5, 1.5; y - mean 0.35, 0.25, 0.05, -0.65
    # sum of products -0.525 - 0.125 + 0.025 - 0.975 = -1.6, sxx = 5 -> -0.32
    assert entropy_trend([1.2, 1.1, 0.9, 0.2]) == pytest.approx(-0.32)
    # pairwise slopes -0.1, -0.2, -0.7, -0.15, -0.45, -1/3 -> median (-1/3 - 0.2) / 2
    assert entropy_trend([1.2, 1.1, 0.9, 0.2], method="theil_sen") == pytest.approx((-1 / 3 - 0.2) / 2)
    assert entropy_trend([0.7, 0.7]) == 0.0


@settings(max_examples=50, deadline=None)
@given(
    values=st.lists(st.floats(0.0, 10.0, allow_nan=False), min_size=2, max_size=50),
    method=st.sampled_from(["ols", "theil_sen"]),
)
def test_entropy_trend_properties(values: list[float], method: TrendMethod) -> None:
    slope = entropy_trend(values, method=method)
    assert math.isfinite(slope)
    # a series sorted in decreasing order never has a positive slope
    assert entropy_trend(sorted(values, reverse=True), method=method) <= 1e-12
    assert entropy_trend(sorted(values), method=method) >= -1e-12
    # scaling the units scales the slope
    assert entropy_trend([2.0 * v for v in values], method=method) == pytest.approx(2.0 * slope, abs=1e-12)


# --------------------------------------------------------------------------------------------------
# bad inputs


@pytest.mark.parametrize("function", [group_reward_std, zero_std_group_fraction])
@pytest.mark.parametrize(
    ("rewards", "group_size", "error", "message"),
    [
        (
            [1.0] * 10,
            4,
            InputError,
            "`rewards` must have a length divisible by `group_size` (rollouts per prompt), "
            "got 10 rewards and group_size 4.",
        ),
        ([1.0] * 4, 1, ConfigError, "`group_size` must be >= 2, got 1."),
        ([1.0] * 4, True, LoopguardTypeError, "`group_size` must be an integer (not bool), got True."),
        ([1.0] * 4, 2.0, LoopguardTypeError, "`group_size` must be an integer, got 2.0 of type float."),
        ([1.0, float("nan"), 1.0, 1.0], 2, InputError, "`rewards` must be finite, got nan at index (1,)."),
        ([1.0, float("-inf"), 1.0, 1.0], 2, InputError, "`rewards` must be finite, got -inf at index (1,)."),
        ([], 2, InputError, "`rewards` must not be empty, got shape (0,)."),
        ([[1.0, 2.0]], 2, InputError, "`rewards` must be a 1-D array, got shape (1, 2)."),
        ([True, False], 2, LoopguardTypeError, "`rewards` must hold numbers, got booleans"),
        (None, 2, LoopguardTypeError, "`rewards` must be an array of numbers, got None of type NoneType."),
    ],
)
def test_grouped_bad_inputs(
    function: Any, rewards: object, group_size: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=re.escape(message)):
        function(rewards, group_size)


def test_grouped_cap() -> None:
    with pytest.raises(
        InputError, match=re.escape("`rewards` must have at most 100,000 rows (DoS cap), got 100,002.")
    ):
        zero_std_group_fraction(np.zeros(100_002), 2)


@pytest.mark.parametrize(
    ("ddof", "error", "message"),
    [
        (2, ConfigError, "`ddof` must be in [0, 1], got 2."),
        (-1, ConfigError, "`ddof` must be in [0, 1], got -1."),
        (True, LoopguardTypeError, "`ddof` must be an integer (not bool), got True."),
        (1.0, LoopguardTypeError, "`ddof` must be an integer, got 1.0 of type float."),
    ],
)
def test_group_std_bad_ddof(ddof: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        group_reward_std([1.0, 2.0], 2, ddof=ddof)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("atol", "error", "message"),
    [
        (-1e-9, ConfigError, "`atol` must be >= 0, got -1e-09."),
        (float("nan"), ConfigError, "`atol` must be finite, got nan."),
        (float("inf"), ConfigError, "`atol` must be finite, got inf."),
        (False, LoopguardTypeError, "`atol` must be a real number (not bool), got False."),
        ("0.1", LoopguardTypeError, "`atol` must be a real number, got '0.1' of type str."),
    ],
)
def test_zero_fraction_bad_atol(atol: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        zero_std_group_fraction([1.0, 2.0], 2, atol=atol)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("values", "method", "error", "message"),
    [
        ([1.0, 2.0], "median", ConfigError, "`method` must be one of 'ols', 'theil_sen', got 'median'."),
        ([1.0], "ols", InputError, "`mean_entropies` must have at least 2 points to fit a slope, got 1."),
        (
            [0.5, float("nan")],
            "theil_sen",
            InputError,
            "`mean_entropies` must be finite, got nan at index (1,).",
        ),
        ([0.5, -0.1], "ols", InputError, "`mean_entropies` must be >= 0, got -0.1 at index 1."),
        ([], "ols", InputError, "`mean_entropies` must not be empty, got shape (0,)."),
        ("1.0 2.0", "ols", LoopguardTypeError, "`mean_entropies` must be an array of numbers"),
    ],
)
def test_entropy_trend_bad_inputs(values: object, method: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        entropy_trend(values, method=method)


def test_entropy_trend_theil_sen_cap() -> None:
    with pytest.raises(InputError, match=re.escape("`mean_entropies` must have at most 4,096 points")):
        entropy_trend(np.ones(4097), method="theil_sen")


# --------------------------------------------------------------------------------------------------
# ragged groups: group_size as a sequence of group sizes


def naive_ragged_std(rewards: list[float], sizes: list[int], ddof: int) -> list[float]:
    stdev = statistics.stdev if ddof == 1 else statistics.pstdev
    result, start = [], 0
    for size in sizes:
        group = rewards[start : start + size]
        start += size
        if len(group) >= 2:  # a single rollout has no spread: left out
            result.append(stdev(group))
    return result


def naive_ragged_zero_fraction(rewards: list[float], sizes: list[int], atol: float) -> float:
    flags, start = [], 0
    for size in sizes:
        group = rewards[start : start + size]
        start += size
        if len(group) >= 2:
            flags.append(max(group) - min(group) <= atol)
    return sum(flags) / len(flags) if flags else 0.0


@st.composite
def ragged_rewards(draw: st.DrawFn) -> tuple[list[float], list[int]]:
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=10))
    values = st.sampled_from([0.0, 0.5, 1.0]) | st.integers(-400, 400).map(lambda v: v / 16)
    rewards = draw(st.lists(values, min_size=sum(sizes), max_size=sum(sizes)))
    return rewards, sizes


@settings(max_examples=200, deadline=None)
@given(data=ragged_rewards(), ddof=st.integers(0, 1), atol=st.sampled_from([0.0, 1e-8, 0.3]))
def test_ragged_groups_match_a_naive_loop(
    data: tuple[list[float], list[int]], ddof: int, atol: float
) -> None:
    rewards, sizes = data
    expected = naive_ragged_std(rewards, sizes, ddof)
    got = group_reward_std(rewards, sizes, ddof=ddof)
    assert got.shape == (len(expected),)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)
    assert zero_std_group_fraction(rewards, sizes, atol=atol) == naive_ragged_zero_fraction(
        rewards, sizes, atol
    )


@settings(max_examples=100, deadline=None)
@given(data=ragged_rewards(), ddof=st.integers(0, 1))
def test_group_spread_is_both_statistics_validated_once(data: tuple[list[float], list[int]], ddof: int) -> None:
    # the collapse signal's one call: the stds and the zero-std share of the two public kernels, bit for bit
    rewards, sizes = data
    stds, zero = group_spread(rewards, sizes, ddof=ddof)
    assert stds.tolist() == group_reward_std(rewards, sizes, ddof=ddof).tolist()
    assert zero == zero_std_group_fraction(rewards, sizes) == naive_ragged_zero_fraction(rewards, sizes, 1e-8)
    with pytest.raises(InputError, match="must add up to the number of rewards"):
        group_spread([*rewards, 0.0], sizes, ddof=ddof)


@settings(max_examples=50, deadline=None)
@given(data=grouped_rewards(), ddof=st.integers(0, 1))
def test_equal_sizes_as_a_sequence_are_exactly_the_int(data: tuple[list[float], int], ddof: int) -> None:
    rewards, group_size = data
    sizes = [group_size] * (len(rewards) // group_size)
    np.testing.assert_array_equal(
        group_reward_std(rewards, sizes, ddof=ddof), group_reward_std(rewards, group_size, ddof=ddof)
    )
    assert zero_std_group_fraction(rewards, sizes) == zero_std_group_fraction(rewards, group_size)


def test_ragged_hand_case_and_container_kinds() -> None:
    torch = pytest.importorskip("torch", reason="torch is part of the `hf` extra")

    rewards = [1.0, 0.0, 1.0, 7.0, 2.0, 2.0, 3.0]  # groups [1, 0, 1], [7], [2, 2], [3]
    for sizes in ([3, 1, 2, 1], (3, 1, 2, 1), np.array([3, 1, 2, 1]), torch.tensor([3, 1, 2, 1])):
        np.testing.assert_allclose(group_reward_std(rewards, sizes), [math.sqrt(1 / 3), 0.0], rtol=1e-12)
        np.testing.assert_allclose(
            group_reward_std(rewards, sizes, ddof=0), [math.sqrt(2 / 9), 0.0], rtol=1e-12
        )
        assert zero_std_group_fraction(rewards, sizes) == 0.5


def test_no_group_of_two_gives_an_empty_std_and_a_zero_fraction() -> None:
    assert group_reward_std([1.0, 2.0, 3.0], [1, 1, 1]).shape == (0,)
    assert group_reward_std([1.0, 2.0, 3.0], [1, 1, 1], ddof=0).shape == (0,)
    assert zero_std_group_fraction([1.0, 2.0, 3.0], [1, 1, 1]) == 0.0
    # an int group_size keeps its rule: groups of one are a configuration error there
    with pytest.raises(ConfigError, match=re.escape("`group_size` must be >= 2, got 1.")):
        group_reward_std([1.0, 2.0], 1)


@pytest.mark.parametrize("function", [group_reward_std, zero_std_group_fraction])
@pytest.mark.parametrize(
    ("rewards", "sizes", "error", "message"),
    [
        ([1.0] * 5, [2, 2], InputError, "`group_size` must add up to the number of rewards (5), got 4 in 2 groups."),
        ([1.0] * 3, [4], InputError, "`group_size` must add up to the number of rewards (3), got a group of 4."),
        ([1.0] * 4, [2**62, 2**62, 2**62, 2**62], InputError, "`group_size` must add up to the number of rewards (4), got a group of"),
        ([1.0] * 4, [4, 0], InputError, "`group_size` must be >= 1, got 0 at index (1,)."),
        ([1.0] * 4, [5, -1], InputError, "`group_size` must be >= 1, got -1 at index (1,)."),
        ([1.0] * 4, [2.0, 2.0], LoopguardTypeError, "`group_size` must hold integers, got dtype float64."),
        ([1.0] * 4, [True, True], LoopguardTypeError, "`group_size` must hold integers, got booleans."),
        ([1.0] * 4, [[2, 2]], InputError, "`group_size` must be a 1-D array shaped [G] (one size per group), got shape (1, 2)."),
        ([1.0] * 4, [], InputError, "`group_size` must not be empty, got shape (0,)."),
        ([1.0, float("nan")], [1, 1], InputError, "`rewards` must be finite, got nan at index (1,)."),
        ("ab", [1, 1], LoopguardTypeError, "`rewards` must be an array of numbers"),
    ],
)  # fmt: skip
def test_ragged_bad_inputs(
    function: Any, rewards: object, sizes: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=re.escape(message)):
        function(rewards, sizes)


def test_ragged_std_beyond_float64_is_an_error() -> None:
    with pytest.raises(
        InputError, match=re.escape("`rewards` must have per-group stds representable in float64")
    ):
        group_reward_std([1.0, 1.7e308, -1.7e308], [1, 2])
    # a representable std of huge rewards is returned (the plain squares overflow)
    np.testing.assert_allclose(group_reward_std([1e308, -1e308], [2], ddof=0), [1e308], rtol=1e-15)
