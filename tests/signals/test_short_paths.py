"""The Python fast paths of small inputs give numpy's bits (and hand anything unusual back to numpy)."""

import math

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from loopguard.scoring import Median
from loopguard.signals import rolling_median
from loopguard.signals._numeric import SHORT, plain_mean, plain_median, plain_std, short_median

_EDGES = [0.0, -0.0, 1.0, -1.0, 0.1, 0.3, 5e-324, -5e-324, 1e308, -1e308, 1.7e308, -1.7e308]
_VALUES = st.one_of(st.sampled_from(_EDGES), st.floats(allow_nan=False, allow_infinity=False))


def _bits(value: float) -> bytes:
    return np.float64(value).tobytes()


@settings(max_examples=1000, deadline=None)
@given(st.lists(_VALUES, min_size=1, max_size=12))
@example([1.7e308, 1.7e308])
@example([-0.0, 0.0, 0.0])
def test_short_median_has_the_bits_of_numpy_median(values):
    median = short_median(values)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = float(np.median(np.array(values)))
    if median is None:  # numpy decides: an overflow, or -0.0 among the values
        assert not math.isfinite(expected) or (-0.0 in values and any(math.copysign(1.0, v) < 0 for v in values))
    else:
        assert _bits(median) == _bits(expected), values


@settings(max_examples=1000, deadline=None)
@given(st.lists(_VALUES, min_size=1, max_size=40))
@example([1.7e308, 1.7e308])
@example([-0.0, 0.0, 1.0, -0.0])
def test_plain_median_has_the_bits_of_numpy_median(values):
    array = np.array(values)
    with np.errstate(over="ignore", invalid="ignore"):
        assert _bits(plain_median(array)) == _bits(float(np.median(array))), values


def test_short_median_leaves_long_lists_to_numpy():
    assert short_median([1.0] * SHORT) == 1.0
    assert short_median([1.0] * (SHORT + 1)) is None


@settings(max_examples=1000, deadline=None)
@given(st.lists(_VALUES, max_size=6), _VALUES, st.integers(1, 5))
def test_median_smoothing_has_the_bits_of_rolling_median(recent, score, window):
    kept, smoothed = Median(window=window).smooth(recent, score, previous=0.0)
    assert kept == [*recent, score][-window:]
    assert _bits(smoothed) == _bits(float(rolling_median(kept, window=window)[-1]))


_ROWS = st.tuples(st.integers(1, 5), st.integers(2, 20)).flatmap(
    lambda shape: st.lists(_VALUES, min_size=shape[0] * shape[1], max_size=shape[0] * shape[1]).map(
        lambda values: np.array(values).reshape(shape)
    )
)


@settings(max_examples=1000, deadline=None)
@given(_ROWS, st.sampled_from([None, 0, 1]), st.integers(0, 1))
@example(np.array([[1.7e308, -1.7e308, 1.0]]), None, 0)
def test_plain_mean_and_std_have_the_bits_of_numpys(array, axis, ddof):
    with np.errstate(over="ignore", invalid="ignore"):
        pairs = [(plain_mean(array, axis), np.mean(array, axis=axis))]
        if (array.size if axis is None else array.shape[axis]) > ddof:
            pairs.append((plain_std(array, axis, ddof), np.std(array, axis=axis, ddof=ddof)))
    for got, expected in pairs:
        assert np.shape(got) == np.shape(expected)
        assert np.asarray(got).tobytes() == np.asarray(expected).tobytes(), (array, axis, ddof)
