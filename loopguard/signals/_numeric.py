"""Float64 helpers that cannot overflow on finite input: power-of-two rescaling, means and medians.

Kernels promise a finite result (or an :class:`~loopguard.exceptions.InputError` saying the result cannot be
represented) for *any* finite input, ``1e308`` and ``5e-324`` included. Intermediate sums and squares are
what overflow, so the kernels first compute the plain way and, only where that was not finite, again on
values rescaled by a power of two. Scaling by ``2**e`` is exact for every normal number, so a rescaled
computation gives the same bits as the plain one wherever the plain one did not overflow or underflow.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "SHORT",
    "plain_mean",
    "plain_median",
    "plain_std",
    "pow2_exponent",
    "robust_mean",
    "robust_median",
    "short_median",
]


def pow2_exponent(max_abs: float) -> int:
    """Exponent ``e`` such that ``max_abs / 2**e`` lies in ``[1, 2)``; 0 when ``max_abs`` is 0.

    Example:
        >>> pow2_exponent(1e308), pow2_exponent(3.0), pow2_exponent(0.0), pow2_exponent(5e-324)
        (1023, 1, 0, -1074)
    """
    if max_abs == 0.0 or not math.isfinite(max_abs):
        return 0
    return math.frexp(max_abs)[1] - 1


SHORT = 128
"""Lists up to this long are cheaper to take the median of in Python (:func:`short_median`) than in numpy."""


def short_median(values: list[float]) -> float | None:
    """:func:`numpy.median` of a short non-empty list of floats, in Python; None where numpy must decide.

    The middle value, or the two middle values summed and halved, exactly as numpy takes them (a mean of
    the middle pair), so the result has numpy's bits. None (the caller asks numpy) for a list longer than
    :data:`SHORT`, a value that is not a ``float`` (numpy converts it first), a median that is not finite
    (numpy's overflow handling and warnings apply), and a list holding -0.0, where which of two equal
    zeros lands in the middle is numpy's choice.

    Example:
        >>> short_median([3.0, 1.0, 2.0, 10.0]), short_median([0.5]), short_median([1.7e308, 1.7e308])
        (2.5, 0.5, None)
    """
    if len(values) > SHORT or not all(type(value) is float for value in values):
        return None
    if 0.0 in values and any(math.copysign(1.0, value) < 0.0 for value in values if value == 0.0):
        return None
    ordered = sorted(values)
    half = len(ordered) // 2
    middle = ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2.0
    return middle if math.isfinite(middle) else None


def plain_mean(values: NDArray[np.float64], axis: int | None = None) -> Any:
    """:func:`numpy.mean` of a non-empty float64 array (all of it, or along ``axis``), with numpy's bits.

    numpy's own arithmetic, one sum and one division, without the argument handling that costs more than
    the arithmetic on the short arrays a Guard reads every step.

    Example:
        >>> float(plain_mean(np.array([1.0, 2.0, 4.0]))), plain_mean(np.array([[1.0, 2.0], [3.0, 5.0]]), 1)
        (2.3333333333333335, array([1.5, 4. ]))
    """
    count = values.size if axis is None else values.shape[axis]
    return np.add.reduce(values, axis=axis) / count


def plain_std(values: NDArray[np.float64], axis: int | None = None, ddof: int = 0) -> Any:
    """:func:`numpy.std` of a float64 array of more than ``ddof`` values (along ``axis``), with numpy's bits.

    numpy's arithmetic (the mean, the squared deviations summed, divided by ``count - ddof``, the square
    root), without its argument handling; an overflow overflows (and warns) as numpy's does.

    Example:
        >>> float(plain_std(np.array([1.0, 2.0, 4.0]))), plain_std(np.array([[1.0, 2.0], [3.0, 5.0]]), 1, 1)
        (1.247219128924647, array([0.70710678, 1.41421356]))
    """
    count = values.size if axis is None else values.shape[axis]
    deviation = values - np.add.reduce(values, axis=axis, keepdims=True) / count
    return np.sqrt(np.add.reduce(deviation * deviation, axis=axis) / (count - ddof))


def plain_median(values: NDArray[np.float64]) -> float:
    """:func:`numpy.median` of a non-empty 1-D float64 array, with numpy's bits but not its wrapper's cost.

    The middle order statistic, or the two middle ones summed and halved (numpy's mean of the pair), found
    with one :func:`numpy.partition`. Where the median is 0 (which of two signed zeros lands in the middle
    is numpy's choice) or not finite (numpy's overflow warning applies) numpy itself is asked.

    Example:
        >>> plain_median(np.array([3.0, 1.0, 2.0, 10.0])), plain_median(np.array([0.5]))
        (2.5, 0.5)
    """
    half = values.size // 2
    if values.size % 2:
        middle = float(np.partition(values, half)[half])
    else:
        part = np.partition(values, (half - 1, half))
        with np.errstate(over="ignore"):
            middle = float((part[half - 1] + part[half]) / 2.0)
    if middle == 0.0 or not math.isfinite(middle):
        return float(np.median(values))
    return middle


def robust_median(values: NDArray[np.float64], axis: int | None = None) -> Any:
    """:func:`numpy.median` that cannot overflow near the largest float.

    Where the mean of the two middle values overflows (``(a + b) / 2`` for ``a = b = 1e308``), it is taken
    on halved values instead (``(a/2 + b/2) / 2 * 2`` does not overflow).

    Example:
        >>> float(robust_median(np.array([1.7e308, 1.7e308])))
        1.7e+308
    """
    with np.errstate(over="ignore", invalid="ignore"):
        result = np.median(values, axis=axis)
    if np.isfinite(result).all():
        return result
    halves = np.median(values / 2.0, axis=axis) * 2.0
    return np.where(np.isfinite(result), result, halves)


def robust_mean(values: NDArray[np.float64], axis: int | None = None) -> Any:
    """:func:`numpy.mean` that cannot overflow near the largest float.

    Where the plain sum overflows, the mean is taken on values rescaled by a power of two and scaled back,
    clipped to the range of the values (rounding could otherwise push a mean of values at ``+-1.8e308``
    past the largest float).

    Example:
        >>> float(robust_mean(np.array([1.7e308, 1.7e308, 1.7e308])))
        1.7e+308
    """
    with np.errstate(over="ignore", invalid="ignore"):
        result = np.mean(values, axis=axis)
    if np.isfinite(result).all():
        return result
    exponent = pow2_exponent(float(np.max(np.abs(values))))
    with np.errstate(over="ignore", under="ignore"):
        scaled = np.ldexp(np.mean(np.ldexp(values, -exponent), axis=axis), exponent)
    fallback = np.clip(scaled, np.min(values, axis=axis), np.max(values, axis=axis))
    return np.where(np.isfinite(result), result, fallback)
