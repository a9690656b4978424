import json
import math
import re
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopguard import ConfigError, InputError, LoopguardTypeError
from loopguard.signals import (
    MAX_MEDIAN_WINDOW,
    Cusum,
    CusumResult,
    CusumState,
    cusum,
    ema,
    ema_update,
    rolling_median,
)

finite = st.floats(
    min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False, allow_subnormal=False
)
series = st.lists(finite, min_size=1, max_size=60)
alphas = st.floats(min_value=1e-3, max_value=1.0, exclude_min=False)


# --------------------------------------------------------------------------------------------------
# independent references


def naive_ema(values, alpha):
    out = [float(values[0])]
    for x in values[1:]:
        out.append(alpha * x + (1.0 - alpha) * out[-1])
    return out


def closed_form_ema(values, alpha):
    """y_t = (1 - a)^t x_0 + sum_{s=1}^{t} a (1 - a)^(t - s) x_s, computed term by term."""
    out = []
    for t in range(len(values)):
        total = (1.0 - alpha) ** t * values[0]
        for s in range(1, t + 1):
            total += alpha * (1.0 - alpha) ** (t - s) * values[s]
        out.append(total)
    return out


def naive_rolling_median(values, window):
    return [statistics.median(values[max(0, t - window + 1) : t + 1]) for t in range(len(values))]


def naive_cusum(values, target, scale, k, h, direction):
    """Tabular CUSUM written out plainly: returns raw S+ / S- per step and (index, sign) alarms."""
    s_plus = s_minus = 0.0
    ups, downs, alarms = [], [], []
    for t, x in enumerate(values):
        z = (x - target) / scale
        if direction in ("both", "up"):
            s_plus = max(0.0, s_plus + z - k)
        if direction in ("both", "down"):
            s_minus = max(0.0, s_minus - z - k)
        ups.append(s_plus)
        downs.append(s_minus)
        if s_plus > h:
            alarms.append((t, 1))
            s_plus = 0.0
        elif s_minus > h:
            alarms.append((t, -1))
            s_minus = 0.0
    return ups, downs, alarms


def stream(detector, values, state=None):
    state = detector.init() if state is None else state
    flags, states = [], []
    for x in values:
        alarm, state = detector.update(state, x)
        flags.append(alarm)
        states.append(state)
    return flags, states


# --------------------------------------------------------------------------------------------------
# ema


def test_ema_hand_computed():
    np.testing.assert_array_equal(ema([0.0, 1.0, 1.0, 1.0], alpha=0.5), [0.0, 0.5, 0.75, 0.875])
    np.testing.assert_array_equal(ema([4.0, 0.0], alpha=0.25), [4.0, 3.0])
    np.testing.assert_array_equal(ema([7.0], alpha=0.3), [7.0])
    assert ema([1, 2, 3], alpha=0.5).dtype == np.float64


def test_ema_alpha_one_is_identity():
    x = np.array([3.0, -1.0, 2.5, 8.0])
    np.testing.assert_array_equal(ema(x, alpha=1.0), x)


@pytest.mark.parametrize("alpha", [0.01, 0.1, 0.5, 0.9, 1.0])
def test_ema_matches_naive_loop_and_closed_form(alpha):
    rng = np.random.default_rng(7)
    for n in (1, 2, 5, 40):
        x = rng.normal(3.0, 2.0, size=n).tolist()
        got = ema(x, alpha=alpha)
        np.testing.assert_allclose(got, naive_ema(x, alpha), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got, closed_form_ema(x, alpha), rtol=1e-10, atol=1e-10)


def test_ema_update_hand_computed():
    assert ema_update(0.5, 1.0, alpha=0.5) == 0.75
    assert ema_update(10.0, 0.0, alpha=0.1) == pytest.approx(9.0)
    assert ema_update(2, 4, alpha=1.0) == 4.0
    assert isinstance(ema_update(np.float32(1.0), np.array(3.0), alpha=0.5), float)


@pytest.mark.parametrize("alpha", [0.05, 0.3, 1.0])
def test_ema_update_chain_agrees_with_batch(alpha):
    x = np.random.default_rng(3).normal(size=50)
    y = [float(x[0])]
    for value in x[1:]:
        y.append(ema_update(y[-1], value, alpha=alpha))
    np.testing.assert_allclose(ema(x, alpha=alpha), y, rtol=1e-12, atol=1e-12)


def test_ema_accepts_torch_tensors():
    torch = pytest.importorskip("torch", reason="torch is part of the `hf` extra")
    np.testing.assert_allclose(ema(torch.tensor([0.0, 1.0]), alpha=0.5), [0.0, 0.5])
    assert ema_update(torch.tensor(0.0), torch.tensor(1.0), alpha=0.5) == 0.5


@settings(max_examples=50, deadline=None)
@given(values=series, alpha=alphas)
def test_ema_stays_within_prefix_range(values, alpha):
    y = ema(values, alpha=alpha)
    x = np.asarray(values)
    assert y.shape == x.shape
    assert np.isfinite(y).all()
    lo = np.minimum.accumulate(x)
    hi = np.maximum.accumulate(x)
    tol = 1e-9 * np.maximum(1.0, np.abs(x).max())
    assert np.all(y >= lo - tol)
    assert np.all(y <= hi + tol)
    assert y[0] == x[0]


@settings(max_examples=50, deadline=None)
@given(values=series, alpha=alphas, shift=finite, factor=st.floats(0.5, 4.0))
def test_ema_is_affine_equivariant(values, alpha, shift, factor):
    x = np.asarray(values)
    scale = max(1.0, np.abs(x).max(), abs(shift))
    np.testing.assert_allclose(
        ema(factor * x + shift, alpha=alpha), factor * ema(x, alpha=alpha) + shift, atol=1e-9 * factor * scale
    )


@settings(max_examples=50, deadline=None)
@given(value=finite, alpha=alphas, n=st.integers(1, 30))
def test_ema_of_constant_is_constant(value, alpha, n):
    np.testing.assert_allclose(ema([value] * n, alpha=alpha), value, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("alpha", "error", "message"),
    [
        (0, ConfigError, "`alpha` must be in (0, 1], got 0.0."),
        (0.0, ConfigError, "`alpha` must be in (0, 1], got 0.0."),
        (1.5, ConfigError, "`alpha` must be in (0, 1], got 1.5."),
        (-0.2, ConfigError, "`alpha` must be in (0, 1], got -0.2."),
        (True, LoopguardTypeError, "`alpha` must be a real number (not bool), got True."),
        (float("nan"), ConfigError, "`alpha` must be finite, got nan."),
        (float("inf"), ConfigError, "`alpha` must be finite, got inf."),
        ("0.5", LoopguardTypeError, "`alpha` must be a real number, got '0.5' of type str."),
    ],
)
def test_bad_alpha(alpha, error, message):
    with pytest.raises(error, match=re.escape(message)):
        ema([1.0, 2.0], alpha=alpha)
    with pytest.raises(error, match=re.escape(message)):
        ema_update(1.0, 2.0, alpha=alpha)


@pytest.mark.parametrize(
    ("values", "error", "message"),
    [
        ([], InputError, "`values` must not be empty, got shape (0,)."),
        ([[1.0, 2.0]], InputError, "`values` must be a 1-D array, got shape (1, 2)."),
        ([1.0, float("nan")], InputError, "`values` must be finite, got nan at index (1,)."),
        ([1.0, float("inf")], InputError, "`values` must be finite, got inf at index (1,)."),
        ([True, False], LoopguardTypeError, "`values` must hold numbers, got booleans"),
        ("abc", LoopguardTypeError, "`values` must be an array of numbers, got 'abc' of type str."),
    ],
)
def test_bad_series(values, error, message):
    with pytest.raises(error, match=re.escape(message)):
        ema(values, alpha=0.5)
    with pytest.raises(error, match=re.escape(message)):
        rolling_median(values, window=3)
    with pytest.raises(error, match=re.escape(message)):
        cusum(values, target=0.0, scale=1.0)


@pytest.mark.parametrize(
    ("previous", "value", "error", "message"),
    [
        (1.0, float("nan"), InputError, "`value` must be finite, got nan."),
        (float("-inf"), 1.0, InputError, "`previous` must be finite, got -inf."),
        (1.0, True, LoopguardTypeError, "`value` must be a real number (not bool), got True."),
        (None, 1.0, LoopguardTypeError, "`previous` must be a real number, got None of type NoneType."),
        (1.0, np.array([1.0, 2.0]), InputError, "`value` must be a single number (0-d), got shape (2,)."),
        (1.0, np.array("x"), LoopguardTypeError, "`value` must be a real number, got dtype <U1."),
    ],
)
def test_bad_ema_update_observations(previous, value, error, message):
    with pytest.raises(error, match=re.escape(message)):
        ema_update(previous, value, alpha=0.5)


# --------------------------------------------------------------------------------------------------
# rolling_median


def test_rolling_median_hand_computed():
    x = [1.0, 9.0, 2.0, 3.0, 100.0, 4.0]
    np.testing.assert_array_equal(rolling_median(x, window=3), [1.0, 5.0, 2.0, 3.0, 3.0, 4.0])
    np.testing.assert_array_equal(rolling_median([1, 2, 3, 4], window=2), [1.0, 1.5, 2.5, 3.5])
    np.testing.assert_array_equal(rolling_median(x, window=1), x)
    # window longer than the series: every position is the median of its prefix
    np.testing.assert_array_equal(rolling_median([4.0, 2.0, 6.0], window=10), [4.0, 3.0, 4.0])


@pytest.mark.parametrize("window", [1, 2, 3, 4, 7, 10, 25])
def test_rolling_median_matches_statistics_median(window):
    rng = np.random.default_rng(window)
    for n in (1, 3, 9, 20):
        x = rng.normal(size=n).tolist()
        np.testing.assert_allclose(
            rolling_median(x, window=window), naive_rolling_median(x, window), rtol=1e-15
        )
        ties = rng.integers(0, 3, size=n).astype(float).tolist()
        np.testing.assert_array_equal(rolling_median(ties, window=window), naive_rolling_median(ties, window))


def test_rolling_median_long_window_spans_several_blocks():
    # window 5000: a 4999-position prefix and full windows processed in more than one memory block
    rng = np.random.default_rng(11)
    x = rng.normal(size=5300)
    expected = [np.median(x[max(0, t - 4999) : t + 1]) for t in range(len(x))]
    np.testing.assert_allclose(rolling_median(x, window=5000), expected, rtol=1e-15)


def test_rolling_median_midpoint_does_not_overflow():
    np.testing.assert_array_equal(rolling_median([1e308, 1e308], window=2), [1e308, 1e308])
    np.testing.assert_array_equal(rolling_median([-1e308, 1e308, 1e308], window=2), [-1e308, 0.0, 1e308])


def test_rolling_median_ignores_a_short_spike():
    x = np.zeros(20)
    x[10] = 1e6
    assert np.all(rolling_median(x, window=5) == 0.0)


@settings(max_examples=50, deadline=None)
@given(values=series, window=st.integers(1, 12))
def test_rolling_median_within_window_range(values, window):
    x = np.asarray(values)
    m = rolling_median(x, window=window)
    assert m.shape == x.shape
    assert np.isfinite(m).all()
    for t in range(len(x)):
        span = x[max(0, t - window + 1) : t + 1]
        assert span.min() <= m[t] <= span.max()


@settings(max_examples=50, deadline=None)
@given(values=series, window=st.integers(1, 12))
def test_rolling_median_is_odd_and_monotone(values, window):
    x = np.asarray(values)
    m = rolling_median(x, window=window)
    np.testing.assert_array_equal(rolling_median(-x, window=window), -m)
    assert np.all(rolling_median(x + np.abs(x) + 1.0, window=window) >= m)


@pytest.mark.parametrize(
    ("window", "error", "message"),
    [
        (0, ConfigError, f"`window` must be in [1, {MAX_MEDIAN_WINDOW}], got 0."),
        (-3, ConfigError, f"`window` must be in [1, {MAX_MEDIAN_WINDOW}], got -3."),
        (MAX_MEDIAN_WINDOW + 1, ConfigError, f"`window` must be in [1, {MAX_MEDIAN_WINDOW}], got 10001."),
        (True, LoopguardTypeError, "`window` must be an integer (not bool), got True."),
        (3.0, LoopguardTypeError, "`window` must be an integer, got 3.0 of type float."),
    ],
)
def test_bad_window(window, error, message):
    with pytest.raises(error, match=re.escape(message)):
        rolling_median([1.0, 2.0, 3.0], window=window)


# --------------------------------------------------------------------------------------------------
# CUSUM: reference and hand-computed cases


def test_step_shift_alarms_on_third_step():
    # z = (16 - 10) / 2 = 3; S+ = 2.5, 5.0 (not > 5), 7.5 > 5 -> alarm at the third value (index 2)
    detector = Cusum(target=10.0, scale=2.0, k=0.5, h=5.0)
    flags, states = stream(detector, [16.0] * 4)
    assert flags == [False, False, True, False]
    assert [s.upper for s in states] == [2.5, 5.0, 0.0, 2.5]
    assert states[2].last_alarm == 2
    assert states[2].last_direction == "up"
    result = cusum([16.0] * 4, target=10.0, scale=2.0)
    np.testing.assert_array_equal(result.upper, [2.5, 5.0, 7.5, 2.5])
    np.testing.assert_array_equal(result.lower, [0.0, 0.0, 0.0, 0.0])
    assert result.alarms.tolist() == [2]
    assert result.alarm_signs.tolist() == [1]


def test_downward_shift_alarms_down_and_one_sided_charts():
    values = [4.0] * 3  # z = -3 with target 10, scale 2
    both = cusum(values, target=10.0, scale=2.0)
    assert both.alarms.tolist() == [2]
    assert both.alarm_signs.tolist() == [-1]
    np.testing.assert_array_equal(both.lower, [2.5, 5.0, 7.5])
    assert both.state.last_direction == "down"
    up = cusum(values, target=10.0, scale=2.0, direction="up")
    assert up.alarms.size == 0
    np.testing.assert_array_equal(up.lower, 0.0)
    down = cusum([16.0] * 3, target=10.0, scale=2.0, direction="down")
    assert down.alarms.size == 0
    np.testing.assert_array_equal(down.upper, 0.0)


def test_alarm_resets_only_the_alarming_side():
    # from a loaded state with both sides positive: z = 1.5 -> S+ = 4.5 + 1.5 - 0.5 = 5.5 > 5 (reset),
    # S- = 4.5 - 1.5 - 0.5 = 2.5 (kept)
    alarm, state = Cusum(0.0, 1.0).update(CusumState(upper=4.5, lower=4.5), 1.5)
    assert alarm
    assert (state.upper, state.lower, state.last_direction) == (0.0, 2.5, "up")


@settings(max_examples=50, deadline=None)
@given(
    values=st.lists(st.floats(-20, 20), min_size=1, max_size=80), k=st.floats(0.0, 1.0), h=st.floats(0.1, 6.0)
)
def test_other_side_is_zero_at_every_alarm_from_init(values, k, h):
    result = cusum(values, target=0.0, scale=1.0, k=k, h=h)
    up = result.alarm_signs > 0
    assert np.all(result.lower[result.alarms[up]] == 0.0)
    assert np.all(result.upper[result.alarms[~up]] == 0.0)
    assert np.all(np.minimum(result.upper, result.lower) <= h)


def test_constant_series_at_target_never_alarms():
    result = cusum([3.25] * 500, target=3.25, scale=0.1, k=0.0, h=0.01)
    assert result.alarms.size == 0
    assert np.all(result.upper == 0.0)
    assert np.all(result.lower == 0.0)
    assert result.state == CusumState(steps=500)


@pytest.mark.parametrize("direction", ["both", "up", "down"])
@pytest.mark.parametrize(("k", "h"), [(0.5, 5.0), (0.0, 1.0), (0.25, 2.0), (1.0, 0.5)])
def test_cusum_matches_naive_loop(direction, k, h):
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.normal(1.0, 0.5, 80), rng.normal(2.0, 0.5, 40), rng.normal(0.0, 0.5, 40)])
    ups, downs, alarms = naive_cusum(x.tolist(), 1.0, 0.5, k, h, direction)
    result = cusum(x, target=1.0, scale=0.5, k=k, h=h, direction=direction)
    assert isinstance(result, CusumResult)
    np.testing.assert_array_equal(result.upper, ups)
    np.testing.assert_array_equal(result.lower, downs)
    assert list(zip(result.alarms.tolist(), result.alarm_signs.tolist(), strict=True)) == alarms
    assert result.alarms.dtype == np.int64
    assert result.alarm_signs.dtype == np.int8
    assert len(alarms) > 0


@pytest.mark.parametrize("direction", ["both", "up", "down"])
def test_streaming_agrees_with_batch(direction):
    x = np.random.default_rng(9).normal(0.3, 1.0, 300)
    detector = Cusum(0.0, 1.0, k=0.25, h=3.0, direction=direction)
    result = cusum(x, target=0.0, scale=1.0, k=0.25, h=3.0, direction=direction)
    flags, states = stream(detector, x)
    assert np.flatnonzero(flags).tolist() == result.alarms.tolist()
    assert states[-1] == result.state
    assert result.state.alarms == len(result.alarms)
    assert result.state.steps == 300
    for t, state in enumerate(states):
        expected_upper = (
            0.0 if flags[t] and result.alarm_signs[result.alarms == t][0] > 0 else result.upper[t]
        )
        expected_lower = (
            0.0 if flags[t] and result.alarm_signs[result.alarms == t][0] < 0 else result.lower[t]
        )
        assert (state.upper, state.lower, state.steps) == (expected_upper, expected_lower, t + 1)


def test_stream_continues_from_batch_state():
    x = np.random.default_rng(1).normal(0.5, 1.0, 200)
    whole = cusum(x, target=0.0, scale=1.0)
    head = cusum(x[:120], target=0.0, scale=1.0)
    _, states = stream(Cusum(0.0, 1.0), x[120:], state=head.state)
    assert states[-1] == whole.state


def test_state_json_round_trip_and_resume():
    detector = Cusum(target=0.0, scale=1.0, k=0.5, h=2.0)
    x = np.random.default_rng(2).normal(0.8, 1.0, 60)
    _, states = stream(detector, x[:30])
    saved = states[-1]
    assert saved.alarms > 0
    restored = CusumState.from_dict(json.loads(json.dumps(saved.to_dict())))
    assert restored == saved
    assert type(restored.upper) is float
    assert type(restored.steps) is int
    _, resumed = stream(detector, x[30:], state=restored)
    _, straight = stream(detector, x)
    assert resumed[-1] == straight[-1]
    fresh = CusumState.from_dict(json.loads(json.dumps(detector.init().to_dict())))
    assert fresh == CusumState() == detector.init()


def test_state_is_frozen():
    state = CusumState()
    with pytest.raises(AttributeError):
        state.upper = 1.0  # type: ignore[misc]


# --------------------------------------------------------------------------------------------------
# CUSUM: properties

cusum_params = {
    "values": st.lists(st.floats(-50, 50, allow_nan=False, allow_subnormal=False), min_size=1, max_size=80),
    "k": st.floats(0.0, 2.0),
    "h": st.floats(0.1, 8.0),
    "direction": st.sampled_from(["both", "up", "down"]),
}


@settings(max_examples=50, deadline=None)
@given(**cusum_params)
def test_cusum_statistics_nonnegative_and_alarms_exactly_above_h(values, k, h, direction):
    result = cusum(values, target=0.0, scale=1.0, k=k, h=h, direction=direction)
    assert np.all(result.upper >= 0.0)
    assert np.all(result.lower >= 0.0)
    assert np.isfinite(result.upper).all()
    assert np.isfinite(result.lower).all()
    above = (result.upper > h) | (result.lower > h)
    assert np.flatnonzero(above).tolist() == result.alarms.tolist()
    assert np.all(result.alarm_signs == np.where(result.upper[result.alarms] > h, 1, -1))
    assert 0.0 <= result.state.upper <= h
    assert 0.0 <= result.state.lower <= h
    if direction == "up":
        assert np.all(result.lower == 0.0)
    if direction == "down":
        assert np.all(result.upper == 0.0)


@settings(max_examples=50, deadline=None)
@given(**cusum_params, target=st.floats(-10, 10), scale=st.floats(0.1, 10))
def test_cusum_mirror_symmetry(values, k, h, direction, target, scale):
    x = np.asarray(values)
    mirrored = {"both": "both", "up": "down", "down": "up"}[direction]
    a = cusum(x, target=target, scale=scale, k=k, h=h, direction=direction)
    b = cusum(-x, target=-target, scale=scale, k=k, h=h, direction=mirrored)
    np.testing.assert_array_equal(a.upper, b.lower)
    np.testing.assert_array_equal(a.lower, b.upper)
    np.testing.assert_array_equal(a.alarms, b.alarms)
    np.testing.assert_array_equal(a.alarm_signs, -b.alarm_signs)


@settings(max_examples=50, deadline=None)
@given(shift=st.floats(0.6, 20.0), k=st.floats(0.0, 0.5), h=st.floats(0.5, 10.0), n=st.integers(1, 50))
def test_step_shift_alarms_within_hand_bound(shift, k, h, n):
    # S+ after m steps is m * (shift - k); the first m with m * (shift - k) > h is floor(h / (shift - k)) + 1
    bound = math.floor(h / (shift - k)) + 1
    result = cusum([5.0 + shift * 2.0] * (bound + n), target=5.0, scale=2.0, k=k, h=h, direction="up")
    assert result.alarms.size > 0
    assert result.alarms[0] + 1 <= bound + 1  # one step of slack for rounding at an exact boundary
    assert result.alarms[0] + 1 >= bound - 1


@settings(max_examples=50, deadline=None)
@given(value=st.floats(-1e3, 1e3), n=st.integers(1, 100), direction=st.sampled_from(["both", "up", "down"]))
def test_constant_at_target_never_alarms_property(value, n, direction):
    result = cusum([value] * n, target=value, scale=1e-3, k=0.0, h=1e-6, direction=direction)
    assert result.alarms.size == 0


# --------------------------------------------------------------------------------------------------
# CUSUM: bad inputs


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"scale": 0.0}, ConfigError, "`scale` must be > 0, got 0.0."),
        ({"scale": -1.0}, ConfigError, "`scale` must be > 0, got -1.0."),
        ({"scale": True}, LoopguardTypeError, "`scale` must be a real number (not bool), got True."),
        ({"target": float("nan")}, ConfigError, "`target` must be finite, got nan."),
        ({"target": None}, LoopguardTypeError, "`target` must be a real number, got None of type NoneType."),
        ({"k": -0.1}, ConfigError, "`k` must be >= 0, got -0.1."),
        ({"k": float("inf")}, ConfigError, "`k` must be finite, got inf."),
        ({"h": 0.0}, ConfigError, "`h` must be > 0, got 0.0."),
        ({"h": float("nan")}, ConfigError, "`h` must be finite, got nan."),
        (
            {"direction": "sideways"},
            ConfigError,
            "`direction` must be one of 'both', 'down', 'up', got 'sideways'.",
        ),
        ({"direction": 1}, LoopguardTypeError, "`direction` must be a name string, got 1 of type int."),
    ],
)
def test_bad_cusum_config(kwargs, error, message):
    config = {"target": 0.0, "scale": 1.0, **kwargs}
    with pytest.raises(error, match=re.escape(message)):
        Cusum(**config)
    with pytest.raises(error, match=re.escape(message)):
        cusum([1.0, 2.0], **config)


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (float("nan"), InputError, "`value` must be finite, got nan."),
        (float("inf"), InputError, "`value` must be finite, got inf."),
        (np.float64("nan"), InputError, "`value` must be finite, got nan."),
        (True, LoopguardTypeError, "`value` must be a real number (not bool), got True."),
        ("1.0", LoopguardTypeError, "`value` must be a real number, got '1.0' of type str."),
        (1e308, InputError, "`value` standardised as (value - target) / scale must be finite, got inf"),
    ],
)
def test_bad_streamed_value_leaves_state_unchanged(value, error, message):
    _, states = stream(Cusum(target=0.0, scale=1.0), [2.0, 1.0])
    state = states[-1]
    assert state.upper == 2.0
    before = state.to_dict()
    detector = Cusum(target=-1e308, scale=1.0)  # a value of 1e308 overflows its standardisation
    with pytest.raises(error, match=re.escape(message)):
        detector.update(state, value)
    assert state.to_dict() == before
    alarm, after = detector.update(state, -1e308)  # the old state is still usable
    assert not alarm
    assert after.steps == before["steps"] + 1


def test_batch_overflow_is_an_input_error():
    with pytest.raises(InputError, match=re.escape("must be finite, got inf for value 1e+308.")):
        cusum([0.0, 1e308], target=-1e308, scale=1.0)


def test_update_rejects_foreign_state():
    detector = Cusum(0.0, 1.0, h=2.0)
    with pytest.raises(
        LoopguardTypeError, match=re.escape("`state` must be a CusumState, got {} of type dict.")
    ):
        detector.update({}, 1.0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=re.escape("`state.upper` must be <= h (2), got 4.0.")):
        detector.update(CusumState(upper=4.0), 0.0)
    with pytest.raises(ConfigError, match=re.escape("`state.lower` must be <= h (2), got 2.5.")):
        detector.update(CusumState(lower=2.5), 0.0)


def _payload(**changes):
    payload = {"upper": 1.0, "lower": 0.0, "steps": 5, "alarms": 1, "last_alarm": 2, "last_direction": "up"}
    payload.update(changes)
    return payload


@pytest.mark.parametrize(
    ("payload", "error", "message"),
    [
        ([1, 2], LoopguardTypeError, "`payload` must be a mapping, got [1, 2] of type list."),
        (
            {k: v for k, v in _payload().items() if k != "steps"},
            ConfigError,
            "must have the keys upper, lower, steps, alarms, last_alarm, last_direction; missing steps.",
        ),
        (_payload(extra=1), ConfigError, "unknown ['extra']."),
        (_payload(upper=-1.0), ConfigError, "`upper` must be >= 0, got -1.0."),
        (_payload(lower=float("nan")), ConfigError, "`lower` must be finite, got nan."),
        (_payload(upper="1.0"), LoopguardTypeError, "`upper` must be a real number, got '1.0' of type str."),
        (_payload(steps=True), LoopguardTypeError, "`steps` must be an integer (not bool), got True."),
        (_payload(steps=5.0), LoopguardTypeError, "`steps` must be an integer, got 5.0 of type float."),
        (_payload(alarms=6), ConfigError, "`alarms` must be <= steps (5), got 6."),
        (_payload(last_alarm=None), ConfigError, "must both be None when alarms == 0 and both set otherwise"),
        (
            _payload(last_direction=None),
            ConfigError,
            "must both be None when alarms == 0 and both set otherwise",
        ),
        (_payload(last_alarm=5), ConfigError, "`last_alarm` must be < steps (5), got 5."),
        (_payload(last_alarm=-1), ConfigError, "`last_alarm` must be >= 0, got -1."),
        (
            _payload(last_direction="left"),
            ConfigError,
            "`last_direction` must be one of 'down', 'up', got 'left'.",
        ),
        (
            _payload(alarms=0),
            ConfigError,
            "must both be None when alarms == 0 and both set otherwise, got alarms=0, last_alarm=2",
        ),
    ],
)
def test_malformed_state_payload(payload, error, message):
    with pytest.raises(error, match=re.escape(message)):
        CusumState.from_dict(payload)


def test_valid_payload_loads():
    state = CusumState.from_dict(_payload(upper=1))
    assert state == CusumState(upper=1.0, steps=5, alarms=1, last_alarm=2, last_direction="up")
    assert type(state.upper) is float
