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

__all__ = ["pow2_exponent", "robust_mean", "robust_median"]


def pow2_exponent(max_abs: float) -> int:
    """Exponent ``e`` such that ``max_abs / 2**e`` lies in ``[1, 2)``; 0 when ``max_abs`` is 0.

    Example:
        >>> pow2_exponent(1e308), pow2_exponent(3.0), pow2_exponent(0.0), pow2_exponent(5e-324)
        (1023, 1, 0, -1074)
    """
    if max_abs == 0.0 or not math.isfinite(max_abs):
        return 0
    return math.frexp(max_abs)[1] - 1


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
