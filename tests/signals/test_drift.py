import itertools
import math
import re
import statistics

import attrs
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from loopguard import ConfigError, InputError, LoopguardTypeError
from loopguard._validation import MAX_TRAJECTORIES
from loopguard.signals import (
    RobustBaseline,
    classify_drop,
    relative_drop,
    reward_drift,
    robust_baseline,
)

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
nonzero = finite.filter(lambda x: abs(x) > 1e-3)
samples = st.lists(finite, min_size=1, max_size=20)
# values on a 1/8 grid: an affine map cannot absorb a tiny difference into a large offset
grid_samples = st.lists(st.integers(-8_000, 8_000).map(lambda k: k / 8), min_size=1, max_size=20)

# --------------------------------------------------------------------------------------------------
# independent references


def naive_drop(value, baseline):
    return max(0.0, (baseline - value) / abs(baseline))


def naive_band(drop, warn=0.10, hack=0.30):
    if drop < warn:
        return "OK"
    return "WARN" if drop < hack else "HACK"


def naive_mad(values):
    centre = statistics.median(values)
    return statistics.median([abs(x - centre) for x in values])


def naive_wasserstein_equal_sizes(a, b):
    return statistics.fmean(abs(x - y) for x, y in zip(sorted(a), sorted(b), strict=True))


def _ecdf(sample, x):
    return sum(1 for v in sample if v <= x) / len(sample)


def naive_wasserstein(a, b):
    # integral of |F_a - F_b| over the pooled support: piecewise constant between pooled points
    points = sorted(set(a) | set(b))
    return sum((hi - lo) * abs(_ecdf(a, lo) - _ecdf(b, lo)) for lo, hi in itertools.pairwise(points))


def naive_ks(a, b):
    return max(abs(_ecdf(a, x) - _ecdf(b, x)) for x in list(a) + list(b))


# --------------------------------------------------------------------------------------------------
# relative_drop


@pytest.mark.parametrize(
    ("value", "baseline", "expected"),
    [
        (0.8, 1.0, 0.2),
        (1.0, 1.0, 0.0),
        (1.2, 1.0, 0.0),
        (0.0, 2.0, 1.0),
        (-1.0, 1.0, 2.0),  # crossing zero: more than 100 %
        (-1.5, -1.0, 0.5),  # negative baseline: fell further below zero
        (-0.5, -1.0, 0.0),  # negative baseline: rose towards zero, no drop
        (3, 4, 0.25),
    ],
)
def test_relative_drop_hand_cases(value, baseline, expected):
    got = relative_drop(value, baseline)
    assert isinstance(got, float)
    assert got == pytest.approx(expected, abs=1e-15)


def test_relative_drop_arrays_broadcast_and_match_naive():
    got = relative_drop([[1.0], [0.5]], [1.0, 2.0])
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, [[0.0, 0.5], [0.5, 0.75]])
    rng = np.random.default_rng(3)
    values = rng.normal(1.0, 1.0, size=50)
    baselines = rng.normal(0.0, 2.0, size=50)
    expected = [naive_drop(v, b) for v, b in zip(values.tolist(), baselines.tolist(), strict=True)]
    np.testing.assert_allclose(relative_drop(values, baselines), expected, rtol=1e-15)


def test_relative_drop_return_rule():
    assert isinstance(relative_drop(np.float32(0.5), 1), float)
    zero_d = relative_drop(np.array(0.5), 1.0)
    assert isinstance(zero_d, np.ndarray)
    assert zero_d.shape == ()
    assert float(zero_d) == 0.5
    assert relative_drop([0.5], 1.0).shape == (1,)


def test_relative_drop_torch_inputs():
    torch = pytest.importorskip("torch", reason="torch is part of the `hf` extra")
    np.testing.assert_allclose(relative_drop(torch.tensor([0.5, 2.0]), 1.0), [0.5, 0.0])


@settings(max_examples=50, deadline=None)
@given(value=finite, baseline=nonzero, scale=st.floats(1e-3, 1e3))
def test_relative_drop_properties(value, baseline, scale):
    drop = relative_drop(value, baseline)
    assert math.isfinite(drop)
    assert drop >= 0.0
    assert (drop == 0.0) == (value >= baseline)
    assert drop == pytest.approx(naive_drop(value, baseline), rel=1e-12)
    # unit-free: rescaling value and baseline together leaves the drop unchanged
    assert relative_drop(value * scale, baseline * scale) == pytest.approx(drop, rel=1e-9, abs=1e-12)


@settings(max_examples=50, deadline=None)
@given(a=finite, b=finite, baseline=nonzero)
def test_relative_drop_is_monotone_non_increasing_in_value(a, b, baseline):
    low, high = min(a, b), max(a, b)
    assert relative_drop(low, baseline) >= relative_drop(high, baseline)


def test_relative_drop_zero_baseline_is_an_input_error():
    message = (
        "`baseline` must be non-zero (a relative drop from 0 is undefined; use an absolute threshold on "
        "baseline - value instead), got 0.0"
    )
    with pytest.raises(InputError, match=re.escape(message + ".")):
        relative_drop(0.5, 0.0)
    with pytest.raises(InputError, match=re.escape(message + " at index (1,).")):
        relative_drop([0.5, 0.5], [1.0, 0.0])


def test_relative_drop_bad_inputs():
    with pytest.raises(InputError, match=re.escape("`value` must be finite, got nan at index ().")):
        relative_drop(float("nan"), 1.0)
    with pytest.raises(InputError, match=re.escape("`baseline` must be finite, got inf at index (1,).")):
        relative_drop(1.0, [1.0, float("inf")])
    with pytest.raises(LoopguardTypeError, match=re.escape("`value` must be an array of numbers, got True")):
        relative_drop(True, 1.0)
    with pytest.raises(LoopguardTypeError, match=re.escape("`baseline` must hold numbers, got booleans")):
        relative_drop(1.0, [True])
    message = "`baseline` must be an array of numbers, got '1'"
    with pytest.raises(LoopguardTypeError, match=re.escape(message)):
        relative_drop(1.0, "1")
    with pytest.raises(InputError, match=re.escape("`value` must not be empty, got shape (0,).")):
        relative_drop([], 1.0)
    message = "`value` and `baseline` must have broadcastable shapes, got (2,) and (3,)."
    with pytest.raises(InputError, match=re.escape(message)):
        relative_drop([1.0, 2.0], [1.0, 2.0, 3.0])


def test_relative_drop_caps_and_overflow():
    message = "`value` and `baseline` must broadcast to at most 10,000,000 elements (DoS cap), got shape"
    with pytest.raises(InputError, match=re.escape(message)):
        relative_drop(np.zeros((10_000, 1)), np.ones((1, 1_001)))
    message = "`value` and `baseline` must give a relative drop representable in float64, got one beyond"
    with pytest.raises(InputError, match=re.escape(message)):
        relative_drop(-1e308, 1e-10)
    # baseline - value overflows here, the drop (2.0) does not: it used to be refused
    assert relative_drop(-1e308, 1e308) == 2.0
    np.testing.assert_array_equal(relative_drop([-1.7e308, 1.7e308], 1.7e308), [2.0, 0.0])


# --------------------------------------------------------------------------------------------------
# classify_drop


@pytest.mark.parametrize(
    ("drop", "expected"),
    [
        (0.0, "OK"),
        (0.0999, "OK"),
        (0.10, "WARN"),
        (0.2999, "WARN"),
        (0.30, "HACK"),
        (5.0, "HACK"),
        (1, "HACK"),
    ],
)
def test_classify_drop_default_bands_at_boundaries(drop, expected):
    assert classify_drop(drop) == expected
    assert naive_band(drop) == expected


def test_classify_drop_custom_bands():
    assert classify_drop(0.05, warn=0.05, hack=0.5) == "WARN"
    assert classify_drop(0.049, warn=0.05, hack=0.5) == "OK"
    assert classify_drop(0.5, warn=0.05, hack=0.5) == "HACK"


def test_classify_drop_float_rounding_at_the_edge_is_exact():
    # 1.0 - 0.9 is 0.09999999999999998 in float64: below the WARN edge, so OK (documented)
    assert classify_drop(relative_drop(0.9, 1.0)) == "OK"
    assert classify_drop(relative_drop(0.7, 1.0)) == "HACK"  # 0.30000000000000004


@settings(max_examples=50, deadline=None)
@given(
    a=st.floats(0.0, 10.0),
    b=st.floats(0.0, 10.0),
    warn=st.floats(0.01, 1.0),
    gap=st.floats(0.01, 1.0),
)
def test_classify_drop_matches_naive_and_is_monotone(a, b, warn, gap):
    hack = warn + gap
    rank = {"OK": 0, "WARN": 1, "HACK": 2}
    low, high = min(a, b), max(a, b)
    assert classify_drop(low, warn=warn, hack=hack) == naive_band(low, warn, hack)
    assert rank[classify_drop(low, warn=warn, hack=hack)] <= rank[classify_drop(high, warn=warn, hack=hack)]


def test_classify_drop_bad_inputs():
    with pytest.raises(InputError, match=re.escape("`drop` must be >= 0, got -0.1.")):
        classify_drop(-0.1)
    with pytest.raises(InputError, match=re.escape("`drop` must be finite, got nan.")):
        classify_drop(float("nan"))
    with pytest.raises(InputError, match=re.escape("`drop` must be finite, got inf.")):
        classify_drop(math.inf)
    message = "`drop` must be a real number (not bool), got True."
    with pytest.raises(LoopguardTypeError, match=re.escape(message)):
        classify_drop(True)
    with pytest.raises(ConfigError, match=re.escape("`warn` must be > 0, got 0.0.")):
        classify_drop(0.2, warn=0.0)
    with pytest.raises(ConfigError, match=re.escape("`warn` must be < `hack`, got warn=0.3 and hack=0.3.")):
        classify_drop(0.2, warn=0.3, hack=0.3)
    with pytest.raises(ConfigError, match=re.escape("`hack` must be finite, got inf.")):
        classify_drop(0.2, hack=math.inf)
    with pytest.raises(LoopguardTypeError, match=re.escape("`hack` must be a real number, got '0.3'")):
        classify_drop(0.2, hack="0.3")


# --------------------------------------------------------------------------------------------------
# robust_baseline and RobustBaseline


def test_robust_baseline_hand_case():
    base = robust_baseline([1.0, 1.2, 0.9, 5.0, 1.1])
    assert (base.median, base.count) == (1.1, 5)
    assert base.mad == pytest.approx(0.1)  # |x - 1.1| = 0.1, 0.1, 0.2, 3.9, 0.0 -> median 0.1
    assert base.scale == pytest.approx(0.14826)
    assert base.zscore(1.1 + 0.14826) == pytest.approx(1.0)
    # even count: the median averages the middle pair; MAD likewise
    base = robust_baseline([4, 1, 2, 3])
    assert (base.median, base.mad, base.count) == (2.5, 1.0, 4)


@pytest.mark.parametrize("size", [3, 4, 20, 101])
def test_robust_baseline_matches_statistics_module(size):
    values = np.random.default_rng(size).standard_t(df=2, size=size)
    base = robust_baseline(values)
    assert base.median == pytest.approx(statistics.median(values.tolist()), rel=1e-15, abs=1e-15)
    assert base.mad == pytest.approx(naive_mad(values.tolist()), rel=1e-12, abs=1e-15)
    assert base.count == size
    assert isinstance(base.median, float)
    assert isinstance(base.count, int)


def _mad_arrays():
    rng = np.random.default_rng(2024)
    for size in [1, 2, 3, 4, 5, 8, 9, 100, 101, 1_000, 1_001]:
        for _ in range(20):
            yield rng.normal(size=size)
            yield rng.standard_t(df=1, size=size) * 10.0 ** rng.integers(-300, 300)  # heavy tails, any scale
            yield rng.integers(0, 3, size=size).astype(np.float64)  # ties: a few distinct values
            yield np.round(rng.normal(size=size), 1)
        values = rng.normal(size=size)
        values[: size // 3] = 1e9  # a minority of outliers
        yield values
        yield np.full(size, 0.7)  # constant series
        yield np.full(size, -1e300)
        yield rng.normal(size=size) * 5e-324  # subnormals
    yield np.array([0.0, 1.0, 1.0, 1.0, 2.0, 1e6])


def test_robust_baseline_mad_is_bit_identical_to_the_numpy_formula():
    for values in _mad_arrays():
        base = robust_baseline(values, min_count=1)
        assert base.median == float(np.median(values))
        expected = float(np.median(np.abs(values - np.median(values))))
        assert np.float64(base.mad).tobytes() == np.float64(expected).tobytes(), values


def test_robust_baseline_and_wasserstein_have_the_bits_of_scipy():
    # both are computed without scipy (its first import costs about a second inside a training step)
    from scipy import stats

    from loopguard.signals._numeric import pow2_exponent

    for values in _mad_arrays():
        base = robust_baseline(values, min_count=1)
        centre = np.float64(base.median)
        expected = float(stats.median_abs_deviation(values, center=lambda _values, axis, c=centre: c))
        assert np.float64(base.mad).tobytes() == np.float64(expected).tobytes(), values
    rng = np.random.default_rng(7)
    for size, other in itertools.product((1, 2, 7, 16, 33), (1, 5, 16, 64)):
        for a, b in (
            (rng.normal(size=size), rng.normal(0.5, 2.0, size=other)),
            (rng.integers(0, 3, size=size) / 2.0, rng.integers(0, 3, size=other) / 2.0),  # ties
        ):
            exponent = pow2_exponent(max(float(np.max(np.abs(a))), float(np.max(np.abs(b)))))
            scaled = stats.wasserstein_distance(np.ldexp(a, -exponent), np.ldexp(b, -exponent))
            assert reward_drift(a, b) == float(np.ldexp(scaled, exponent)), (a, b)


def test_a_reference_sorted_once_gives_the_standardised_distance_bit_for_bit():
    # the Guard's frozen warm-up rewards are sorted and scaled once (DriftReference), then read every step
    from scipy import stats

    from loopguard.signals._drift import DriftReference

    rng = np.random.default_rng(11)
    for size, other in itertools.product((1, 3, 16, 64), (2, 7, 48, 320)):
        for a, b in (
            (rng.normal(size=size), rng.normal(0.5, 2.0, size=other)),
            (rng.integers(0, 3, size=size) / 2.0, rng.integers(0, 4, size=other) / 3.0),  # ties
            (rng.normal(size=size) * 1e-3, rng.lognormal(0.0, 2.0, size=other) * 1e5),  # far apart scales
        ):
            kept = DriftReference.of(b.tolist())
            got = kept.standardized_distance(a)
            assert np.float64(got).tobytes() == np.float64(reward_drift(a, b, standardize=True)).tobytes()
            mad = stats.median_abs_deviation(b, scale="normal")  # 1.4826 MAD (scipy: 1 / Phi^-1(3/4))
            scale = mad if mad > 0 else np.std(b)
            distance = stats.wasserstein_distance(a, b)
            if scale > 0:
                assert got == pytest.approx(distance / scale, rel=1e-4)
            else:  # a constant reference
                assert got == (0.0 if distance == 0 else math.inf)
            assert not kept.ordered.flags.writeable
            assert kept.ordered.tolist() == sorted(b.tolist())


def test_one_drift_detector_reads_each_memory_against_its_own_reference():
    # a detector keeps the frozen reference sorted between steps; a memory holding another reference (a loaded
    # state, a second Guard given the same detector) is read against that one, not the kept one
    from loopguard import Observation
    from loopguard.detectors import RewardDrift, StepData

    rng = np.random.default_rng(5)
    memories = [{"reference": rng.normal(size=64).tolist(), "frozen": True} for _ in range(2)]
    shared = RewardDrift()
    for step in range(6):
        rewards = rng.normal(0.3 * step, 1.0, 16)
        data = StepData(Observation(step, rewards), warmup_steps=1)
        for memory in memories:
            assert shared.measure(data, memory) == RewardDrift().measure(data, memory)
    loaded = {"reference": [value + 1.0 for value in memories[0]["reference"]], "frozen": True}
    data = StepData(Observation(6, rng.normal(size=16)), warmup_steps=1)
    assert shared.measure(data, loaded) == RewardDrift().measure(data, loaded)
    assert shared.measure(data, loaded) != shared.measure(data, memories[0])


def test_robust_baseline_mad_where_the_plain_formula_overflows():
    # the middle-pair mean of the deviations overflows: taken on halved values instead
    base = robust_baseline([-1.1e308, -1.1e308, 1.1e308, 1.1e308], min_count=1)
    assert (base.median, base.mad) == (0.0, 1.1e308)
    # a deviation overflows (2e308), the median deviation does not
    base = robust_baseline([-1e308, 1e308, 1e308], min_count=1)
    assert (base.median, base.mad) == (1e308, 0.0)
    with pytest.raises(InputError, match=re.escape("robust scale (1.4826 * MAD) representable in float64")):
        robust_baseline([-1.7e308, 1.7e308], min_count=1)


def test_robust_baseline_scale_estimates_gaussian_sigma():
    values = np.random.default_rng(0).normal(5.0, 2.0, size=20_000)
    base = robust_baseline(values)
    assert base.median == pytest.approx(5.0, abs=0.05)
    assert base.scale == pytest.approx(2.0, rel=0.03)


@settings(max_examples=50, deadline=None)
@given(values=st.lists(finite, min_size=3, max_size=30), shift=finite, factor=st.floats(1e-2, 1e2))
def test_robust_baseline_properties(values, shift, factor):
    base = robust_baseline(values)
    assert min(values) <= base.median <= max(values)
    assert base.mad >= 0.0
    assert base.mad <= max(values) - min(values)
    moved = robust_baseline([factor * x + shift for x in values])
    assert moved.median == pytest.approx(factor * base.median + shift, rel=1e-9, abs=1e-6)
    assert moved.mad == pytest.approx(factor * base.mad, rel=1e-9, abs=1e-6)


@settings(max_examples=50, deadline=None)
@given(values=st.lists(st.floats(-10.0, 10.0), min_size=7, max_size=21), outlier=st.floats(1e3, 1e9))
def test_robust_baseline_resists_a_minority_of_outliers(values, outlier):
    # replacing fewer than half of the values by huge outliers keeps the median inside the clean range
    n_bad = (len(values) - 1) // 2
    clean = sorted(values)
    dirty = clean[n_bad:] + [outlier] * n_bad
    base = robust_baseline(dirty)
    assert min(values) <= base.median <= max(values)
    assert base.mad <= 20.0


def test_robust_baseline_is_a_frozen_validated_record():
    base = RobustBaseline(median=1.0, mad=0.5, count=5)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        base.median = 2.0
    assert attrs.evolve(base, count=6).count == 6
    with pytest.raises(ConfigError, match=re.escape("`mad` must be >= 0, got -0.1.")):
        RobustBaseline(median=1.0, mad=-0.1, count=5)
    with pytest.raises(ConfigError, match=re.escape("`median` must be finite, got nan.")):
        RobustBaseline(median=math.nan, mad=0.1, count=5)
    with pytest.raises(ConfigError, match=re.escape("`count` must be >= 1, got 0.")):
        RobustBaseline(median=1.0, mad=0.1, count=0)


def test_zscore_reference_and_zero_scale_rules():
    base = RobustBaseline(median=2.0, mad=0.5, count=9)
    for value in (-3.0, 1.0, 2.0, 2.7):
        assert base.zscore(value) == pytest.approx((value - 2.0) / (1.4826 * 0.5), rel=1e-15)
    assert base.zscore(3.0, min_scale=10.0) == pytest.approx(0.1)
    assert base.zscore(3.0, min_scale=0.1) == pytest.approx(1.0 / 0.7413)  # floor below scale: no effect
    flat = RobustBaseline(median=1.0, mad=0.0, count=8)
    assert flat.scale == 0.0
    assert flat.zscore(1.0) == 0.0
    assert flat.zscore(0.5) == -math.inf
    assert flat.zscore(1.5) == math.inf
    assert flat.zscore(0.5, min_scale=0.125) == -4.0


@settings(max_examples=50, deadline=None)
@given(
    median=finite,
    mad=st.one_of(st.just(0.0), st.floats(0.0, 1e3)),
    value=finite,
    min_scale=st.one_of(st.just(0.0), st.floats(0.0, 10.0)),
)
def test_zscore_never_nan_and_sign_follows_the_deviation(median, mad, value, min_scale):
    z = RobustBaseline(median=median, mad=mad, count=3).zscore(value, min_scale=min_scale)
    assert not math.isnan(z)
    assert (z > 0) == (value > median)
    assert (z < 0) == (value < median)


def test_zscore_bad_inputs():
    base = RobustBaseline(median=1.0, mad=0.5, count=5)
    with pytest.raises(InputError, match=re.escape("`value` must be finite, got nan.")):
        base.zscore(math.nan)
    message = "`value` must be a real number (not bool), got True."
    with pytest.raises(LoopguardTypeError, match=re.escape(message)):
        base.zscore(True)
    with pytest.raises(ConfigError, match=re.escape("`min_scale` must be >= 0, got -1.0.")):
        base.zscore(1.0, min_scale=-1.0)


def test_robust_baseline_bad_inputs():
    message = "`values` must hold at least 3 values (min_count) for a robust baseline, got 2."
    with pytest.raises(InputError, match=re.escape(message)):
        robust_baseline([1.0, 2.0])
    assert robust_baseline([1.0], min_count=1).count == 1
    with pytest.raises(ConfigError, match=re.escape("`min_count` must be >= 1, got 0.")):
        robust_baseline([1.0, 2.0, 3.0], min_count=0)
    message = "`min_count` must be an integer (not bool), got True."
    with pytest.raises(LoopguardTypeError, match=re.escape(message)):
        robust_baseline([1.0, 2.0, 3.0], min_count=True)
    message = "`min_count` must be an integer, got 3.0 of type float."
    with pytest.raises(LoopguardTypeError, match=re.escape(message)):
        robust_baseline([1.0, 2.0, 3.0], min_count=3.0)
    with pytest.raises(InputError, match=re.escape("`values` must be finite, got nan at index (1,).")):
        robust_baseline([1.0, math.nan, 2.0])
    with pytest.raises(InputError, match=re.escape("`values` must be a 1-D array, got shape (1, 3).")):
        robust_baseline([[1.0, 2.0, 3.0]])
    with pytest.raises(InputError, match=re.escape("`values` must not be empty, got shape (0,).")):
        robust_baseline([])
    with pytest.raises(LoopguardTypeError, match=re.escape("`values` must hold numbers, got booleans")):
        robust_baseline([True, False, True])


# --------------------------------------------------------------------------------------------------
# the purpose: a warm-up baseline instead of ONE batch


def test_robust_warmup_baseline_cuts_false_hacks_on_healthy_noise():
    # 200 healthy runs, 120 steps, 8 i.i.d. Gaussian rewards per step (mean 1, sd 0.3): no hacking at all.
    rng = np.random.default_rng(20240611)
    runs, steps, per_step, warmup = 200, 120, 8, 20
    batch_means = rng.normal(1.0, 0.3, size=(runs, steps, per_step)).mean(axis=2)
    evaluated = batch_means[:, warmup:]  # both baselines judge the same steps

    robust_hacks = np.zeros(evaluated.shape, dtype=bool)
    first_hacks = np.zeros(evaluated.shape, dtype=bool)
    for run in range(runs):
        median = robust_baseline(batch_means[run, :warmup]).median
        robust_drops = relative_drop(evaluated[run], median)
        first_drops = relative_drop(evaluated[run], batch_means[run, 0])  # the predecessor's baseline
        robust_hacks[run] = [classify_drop(d) == "HACK" for d in robust_drops.tolist()]
        first_hacks[run] = [classify_drop(d) == "HACK" for d in first_drops.tolist()]

    robust_rate, first_rate = robust_hacks.mean(), first_hacks.mean()
    assert robust_rate <= 0.01
    assert first_rate >= 3 * robust_rate
    # the single-batch baseline ruins whole runs: its worst run is flagged on many steps
    assert first_hacks.mean(axis=1).max() >= 0.15
    assert robust_hacks.mean(axis=1).max() <= 0.06


# --------------------------------------------------------------------------------------------------
# reward_drift


def test_reward_drift_hand_cases():
    assert reward_drift([0.0, 1.0, 2.0], [1.0, 2.0, 3.0]) == pytest.approx(1.0)
    assert reward_drift([0.0, 1.0, 2.0], [1.0, 2.0, 3.0], "ks") == pytest.approx(1.0 / 3.0)
    assert reward_drift([0.0], [5.0]) == pytest.approx(5.0)
    assert reward_drift([0.0], [5.0], "ks") == 1.0
    # standardized: W = 10, reference MAD = 10 -> 10 / 14.826
    got = reward_drift([0.0, 10.0, 20.0], [10.0, 20.0, 30.0], standardize=True)
    assert got == pytest.approx(10.0 / 14.826)


@pytest.mark.parametrize(("n_current", "n_reference"), [(5, 5), (12, 12), (4, 9), (17, 6)])
def test_reward_drift_matches_naive(n_current, n_reference):
    rng = np.random.default_rng(n_current * 31 + n_reference)
    current = rng.normal(0.3, 1.0, size=n_current).round(1)  # rounding creates ties
    reference = rng.normal(0.0, 1.5, size=n_reference).round(1)
    a, b = current.tolist(), reference.tolist()
    expected_w = naive_wasserstein_equal_sizes(a, b) if n_current == n_reference else naive_wasserstein(a, b)
    assert reward_drift(current, reference) == pytest.approx(expected_w, rel=1e-12, abs=1e-12)
    assert reward_drift(current, reference) == pytest.approx(naive_wasserstein(a, b), rel=1e-12, abs=1e-12)
    assert reward_drift(current, reference, "ks") == pytest.approx(naive_ks(a, b), abs=1e-12)


def test_standardize_uses_mad_then_falls_back_to_std_then_to_zero_or_inf():
    reference = [0.0, 1.0, 1.0, 1.0, 1.0]  # MAD 0, population std 0.4
    current = [0.0, 0.0, 1.0, 1.0, 1.0]
    raw = reward_drift(current, reference)
    assert raw == pytest.approx(0.2)
    assert reward_drift(current, reference, standardize=True) == pytest.approx(0.2 / 0.4)
    assert reward_drift([2.0, 2.0], [2.0, 2.0, 2.0], standardize=True) == 0.0
    assert reward_drift([2.0, 3.0], [2.0, 2.0, 2.0], standardize=True) == math.inf


@settings(max_examples=50, deadline=None)
@given(a=samples, b=samples)
def test_reward_drift_properties(a, b):
    w_ab, w_ba = reward_drift(a, b), reward_drift(b, a)
    ks_ab, ks_ba = reward_drift(a, b, "ks"), reward_drift(b, a, "ks")
    assert w_ab >= 0.0
    assert 0.0 <= ks_ab <= 1.0
    assert w_ab == pytest.approx(w_ba, rel=1e-9, abs=1e-9)
    assert ks_ab == pytest.approx(ks_ba, abs=1e-12)
    assert not math.isnan(reward_drift(a, b, standardize=True))
    assert reward_drift(a, list(reversed(a))) == pytest.approx(0.0, abs=1e-9)
    assert reward_drift(a, a, "ks") == 0.0
    assert reward_drift(a, a, standardize=True) == 0.0


@settings(max_examples=50, deadline=None)
@given(a=grid_samples, b=grid_samples, factor=st.floats(1e-2, 1e2), shift=st.floats(-1e3, 1e3))
def test_standardized_wasserstein_is_invariant_to_affine_rescaling(a, b, factor, shift):
    base = reward_drift(a, b, standardize=True)
    assume(math.isfinite(base))
    moved = reward_drift([factor * x + shift for x in a], [factor * x + shift for x in b], standardize=True)
    assert moved == pytest.approx(base, rel=1e-6, abs=1e-6)
    # the raw distance scales with the data instead
    raw = reward_drift(a, b)
    assert reward_drift([factor * x for x in a], [factor * x for x in b]) == pytest.approx(
        factor * raw, rel=1e-9, abs=1e-9
    )


def test_reward_drift_torch_inputs():
    torch = pytest.importorskip("torch", reason="torch is part of the `hf` extra")
    assert reward_drift(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 2.0])) == pytest.approx(1.0)


def test_reward_drift_bad_inputs():
    message = "`method` must be one of 'ks', 'wasserstein', got 'kl'."
    with pytest.raises(ConfigError, match=re.escape(message)):
        reward_drift([1.0], [1.0], "kl")
    message = (
        "`standardize` must be False with method='ks' (the KS statistic is already scale-free), got True."
    )
    with pytest.raises(ConfigError, match=re.escape(message)):
        reward_drift([1.0], [1.0], "ks", standardize=True)
    message = "`standardize` must be a bool, got 1 of type int."
    with pytest.raises(LoopguardTypeError, match=re.escape(message)):
        reward_drift([1.0], [1.0], standardize=1)
    with pytest.raises(InputError, match=re.escape("`current` must be a 1-D array, got shape (1, 2).")):
        reward_drift([[1.0, 2.0]], [1.0])
    with pytest.raises(InputError, match=re.escape("`reference` must not be empty, got shape (0,).")):
        reward_drift([1.0], [])
    with pytest.raises(InputError, match=re.escape("`current` must be finite, got nan at index (0,).")):
        reward_drift([math.nan], [1.0])
    with pytest.raises(LoopguardTypeError, match=re.escape("`reference` must hold numbers, got booleans")):
        reward_drift([1.0], [True])
    message = "`reference` must have at most 100,000 rows (DoS cap), got 100,001."
    with pytest.raises(InputError, match=re.escape(message)):
        reward_drift([1.0], np.zeros(MAX_TRAJECTORIES + 1))
    message = "`current` and `reference` overflowed float64 in the Wasserstein distance (rescale them)."
    with pytest.raises(InputError, match=re.escape(message)):
        reward_drift([1e308, 1e308], [-1e308, -1e308])
