"""Slope of a per-step series: the one place trend kernels do their regression.

:func:`series_slope` fits a straight line to a 1-D series indexed ``0 .. n-1`` (one point per training step)
and returns its slope per step, by ordinary least squares or by the Theil-Sen median of pairwise slopes
(robust to a few spiky steps). :func:`_ols_slope` is the shared closed-form OLS slope of ``y`` on an
arbitrary ``x``; public kernels (``length_trend``, ``entropy_trend``, ``reward_length_slope``) call these
two functions instead of repeating the arithmetic.
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from loopguard._validation import MAX_SERIES_LENGTH, as_float_array, check_choice
from loopguard.exceptions import InputError

__all__ = ["MAX_THEIL_SEN_LENGTH", "TrendMethod", "mann_kendall_z", "series_slope"]

TrendMethod = Literal["ols", "theil_sen"]
"""Regression used by the trend kernels: ordinary least squares or Theil-Sen."""

_TREND_METHODS = ("ols", "theil_sen")

MAX_THEIL_SEN_LENGTH = 4096
"""DoS cap on the series length for ``method="theil_sen"``: it compares every pair of points, so a series
of ``n`` points holds ``n * (n - 1) / 2`` slopes (8.4 million, 67 MB, at the cap). Use a trailing window."""


_CACHED_PAIRS = 128
"""Series up to this length keep their index pairs (8,128 pairs, 130 kB at most each): the Guard tests its
warm-up for a trend at every step, on series of a few dozen points."""


def _pairs(n: int) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """Indices ``(i, j)`` of every pair ``i < j`` of ``n`` points, row-major (``np.triu_indices(n, k=1)``)."""
    return _cached_pairs(n) if n <= _CACHED_PAIRS else np.triu_indices(n, k=1)


@functools.lru_cache(maxsize=64)
def _cached_pairs(n: int) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    earlier, later = np.triu_indices(n, k=1)
    earlier.setflags(write=False)
    later.setflags(write=False)
    return earlier, later


def _ols_slope(x: NDArray[np.float64], y: NDArray[np.float64]) -> float:
    """Closed-form OLS slope of ``y`` on ``x`` (same length, finite); ``0.0`` when ``x`` is constant.

    Both arrays are divided by their largest magnitude before centring, so squares and products cannot
    overflow; the slope is scaled back at the end. Returns ``0.0`` when ``y`` is constant as well.
    The caller checks that the scaled-back result is finite.
    """
    x_scale = float(np.max(np.abs(x)))
    y_scale = float(np.max(np.abs(y)))
    if x_scale == 0.0 or y_scale == 0.0:
        return 0.0
    xc = x / x_scale
    xc = xc - xc.mean()
    yc = y / y_scale
    yc = yc - yc.mean()
    sxx = float(np.dot(xc, xc))
    if sxx == 0.0:
        return 0.0
    return float(np.dot(xc, yc)) / sxx * (y_scale / x_scale)


def _theil_sen_slope(y: NDArray[np.float64]) -> float:
    """Median of ``(y[j] - y[i]) / (j - i)`` over all pairs ``i < j`` (x is the index, so no ties in x)."""
    n = len(y)
    slopes = np.empty(n * (n - 1) // 2, dtype=np.float64)
    start = 0
    for lag in range(1, n):  # one vectorised pass per lag, not per pair
        stop = start + n - lag
        chunk = slopes[start:stop]
        np.subtract(y[lag:], y[:-lag], out=chunk)
        chunk /= lag
        start = stop
    return float(np.median(slopes, overwrite_input=True))


def series_slope(
    values: object, *, method: TrendMethod = "ols", name: str = "values", nonnegative: bool = False
) -> float:
    r"""Slope per step of a 1-D series whose x coordinate is the step index ``0 .. n-1``.

    ``"ols"`` is the least-squares line; one spike moves it. ``"theil_sen"`` is the median of the slopes
    between every pair of points: up to ~29 % of the points can be arbitrary outliers without moving it
    far (its breakdown point), at ``O(n^2)`` cost, hence its own cap.

    .. math::

        \hat\beta_{\mathrm{OLS}} = \frac{\sum_t (t - \bar t)(v_t - \bar v)}{\sum_t (t - \bar t)^2},
        \qquad
        \hat\beta_{\mathrm{TS}} = \operatorname{median}_{i < j} \frac{v_j - v_i}{j - i}

    A constant series has slope ``0.0`` under both methods. The series is scaled by its largest
    magnitude before the arithmetic, so large finite values do not overflow intermediate sums.

    Args:
        values: Per-step values, 1-D, finite, at least 2 points; at most ``MAX_SERIES_LENGTH``
            (10,000,000) points for ``"ols"`` and ``MAX_THEIL_SEN_LENGTH`` (4,096) for ``"theil_sen"``.
        method: ``"ols"`` or ``"theil_sen"``.
        name: Argument name used in error messages (callers pass their own argument's name).
        nonnegative: Also reject negative values (for series of lengths or entropies).

    Returns:
        The slope in units of ``values`` per step.

    Raises:
        LoopguardTypeError: ``values`` is not an array of real numbers, or ``method`` is not a string.
        ConfigError: ``method`` is not one of the allowed names.
        InputError: ``values`` is not 1-D, has fewer than 2 points, exceeds the cap, holds NaN/Inf (or a
            negative value with ``nonnegative=True``), or the slope itself overflows float64.

    Example:
        >>> series_slope([0.0, 1.0, 2.0, 3.0, 20.0])  # the last-step spike drags the OLS line
        4.2
        >>> series_slope([0.0, 1.0, 2.0, 3.0, 20.0], method="theil_sen")
        1.0

    References:
        Theil, H. (1950). A rank-invariant method of linear and polynomial regression analysis.
        Proceedings of the Royal Netherlands Academy of Sciences 53.
        Sen, P. K. (1968). Estimates of the regression coefficient based on Kendall's tau. Journal of the
        American Statistical Association 63(324).
    """
    chosen = check_choice("method", method, _TREND_METHODS)
    series = as_float_array(name, values, max_len=MAX_SERIES_LENGTH)
    n = len(series)
    if nonnegative and n and float(series.min()) < 0.0:
        index = int(np.argmax(series < 0.0))
        msg = f"`{name}` must be >= 0, got {float(series[index])} at index {index}."
        raise InputError(msg)
    if n < 2:
        msg = f"`{name}` must have at least 2 points to fit a slope, got {n}."
        raise InputError(msg)
    if chosen == "theil_sen" and n > MAX_THEIL_SEN_LENGTH:
        msg = (
            f"`{name}` must have at most {MAX_THEIL_SEN_LENGTH:,} points for method='theil_sen' "
            f"(DoS cap: it compares every pair; pass a trailing window), got {n:,}."
        )
        raise InputError(msg)
    if chosen == "ols":
        slope = _ols_slope(np.arange(n, dtype=np.float64), series)
    else:
        scale = float(np.max(np.abs(series)))
        slope = 0.0 if scale == 0.0 else _theil_sen_slope(series / scale) * scale
    if not math.isfinite(slope):
        msg = f"`{name}` must have a slope representable in float64 (rescale the series), got {slope}."
        raise InputError(msg)
    return slope


def mann_kendall_z(values: object, *, name: str = "values") -> float:
    r"""Mann-Kendall z statistic of a monotonic trend in a 1-D series (positive: rising, negative: falling).

    The test counts, over every pair of points, whether the later one is higher or lower; it needs no
    straight line and no normal noise, so a learning curve that rises fast then flattens still reads as a
    rise. Ties (a statistic stuck at 0) count for neither and shrink the variance.

    .. math::

        S = \sum_{i<j} \operatorname{sign}(v_j - v_i), \qquad
        \operatorname{Var} S = \frac{n(n-1)(2n+5) - \sum_t t(t-1)(2t+5)}{18}, \qquad
        z = \frac{S - \operatorname{sign}(S)}{\sqrt{\operatorname{Var} S}}

    where ``t`` runs over the sizes of groups of tied values. Under no trend, ``z`` is about standard
    normal: ``z >= 2.33`` is a rise at one-sided p < 0.01.

    Args:
        values: Per-step values, 1-D, finite, at most :data:`MAX_THEIL_SEN_LENGTH` points (every pair is
            compared).
        name: Argument name used in error messages.

    Returns:
        ``z``; ``0.0`` for fewer than 3 points or a constant series.

    Raises:
        LoopguardTypeError, InputError: not a finite 1-D series, or longer than the cap.

    Example:
        >>> round(mann_kendall_z([0.0, 1.0, 2.0, 3.0, 4.0, 5.0]), 3)
        2.63
        >>> mann_kendall_z([1.0, 1.0, 1.0, 1.0])
        0.0

    References:
        Mann, H. B. (1945). Nonparametric tests against trend. Econometrica 13(3), 245-259.
        Kendall, M. G. (1975). Rank Correlation Methods, 4th ed. Griffin, London.
    """
    series = as_float_array(name, values, max_len=MAX_THEIL_SEN_LENGTH)
    n = len(series)
    if n < 3:
        return 0.0
    earlier_index, later_index = _pairs(n)
    later, earlier = series[later_index], series[earlier_index]
    s = float(
        np.count_nonzero(later > earlier) - np.count_nonzero(later < earlier)
    )  # no subtraction: no overflow
    _, counts = np.unique(series, return_counts=True)
    ties = float(np.sum(counts * (counts - 1.0) * (2.0 * counts + 5.0)))
    variance = (n * (n - 1.0) * (2.0 * n + 5.0) - ties) / 18.0
    if variance <= 0.0 or s == 0.0:
        return 0.0
    return (s - math.copysign(1.0, s)) / math.sqrt(variance)
