"""Reward drift: relative drops against a baseline, robust warm-up baselines, distribution shift.

Three building blocks a Guard composes:

* :func:`relative_drop` and :func:`classify_drop` keep the relative-drop convention of loopguard's
  predecessor (soup-cli): ``drop = max(0, (baseline - value) / |baseline|)`` with OK / WARN / HACK bands at
  0.10 and 0.30.
* :func:`robust_baseline` summarises a warm-up window (median and median absolute deviation, the plain
  formula: bit-for-bit :func:`scipy.stats.median_abs_deviation` around the median) into a
  :class:`RobustBaseline`. The predecessor compared against ONE batch (the first step), which is noise: on
  healthy i.i.d. Gaussian rewards it classed 17.5 % of steps HACK at 8 rewards per step. Take the baseline
  over many steps instead, and smooth the current value too (one batch mean is still noisy).
* :func:`reward_drift` measures how far the whole reward distribution moved from a reference sample
  (1-D Wasserstein distance or the Kolmogorov-Smirnov statistic), not only its mean.

DoS caps: ``MAX_TRAJECTORIES`` (100,000) samples per array for :func:`reward_drift`;
``MAX_SERIES_LENGTH`` (10,000,000) values for :func:`robust_baseline` and for the broadcast result of
:func:`relative_drop`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, Literal, overload

import attrs
import numpy as np
from numpy.typing import ArrayLike, NDArray

from loopguard._validation import (
    MAX_SERIES_LENGTH,
    MAX_TRAJECTORIES,
    as_float_array,
    check_bool,
    check_choice,
    check_int,
    check_real,
    integer,
    real,
    to_numpy,
)
from loopguard.exceptions import ConfigError, InputError
from loopguard.signals._numeric import SHORT, plain_median, pow2_exponent, robust_median, short_median

__all__ = [
    "DriftMethod",
    "DropVerdict",
    "RobustBaseline",
    "classify_drop",
    "relative_drop",
    "reward_drift",
    "robust_baseline",
]

DropVerdict = Literal["OK", "WARN", "HACK"]
"""Band of a relative drop: ``OK < warn <= WARN < hack <= HACK``."""

DriftMethod = Literal["wasserstein", "ks"]
"""Distance used by :func:`reward_drift`."""

_MAD_TO_SIGMA = 1.4826
"""``1 / Phi^{-1}(3/4)``: makes the MAD a consistent estimator of a Gaussian's standard deviation."""

_DRIFT_METHODS: tuple[str, ...] = ("wasserstein", "ks")


def _data_scalar(name: str, value: object, *, lo: float | None = None) -> float:
    """Validate a data scalar like :func:`check_real`, but report bad values as :class:`InputError`."""
    try:
        return check_real(name, value, lo=lo)
    except ConfigError as error:
        raise InputError(str(error)) from None


def _is_real_scalar(value: object) -> bool:
    """Whether ``value`` is a real scalar (``int``, ``float``, numpy scalar), not an array or tensor."""
    return isinstance(value, numbers.Real)


def _as_finite_array(name: str, value: object) -> NDArray[np.float64]:
    """Any-dimensional finite float array (scalars become 0-d arrays)."""
    array = to_numpy(name, value)
    return as_float_array(name, array, ndim=array.ndim, max_len=None)


# --------------------------------------------------------------------------------------------------
# relative drop


@overload
def relative_drop(value: float, baseline: float) -> float: ...


@overload
def relative_drop(value: NDArray[Any] | Sequence[float], baseline: ArrayLike) -> NDArray[np.float64]: ...


@overload
def relative_drop(value: ArrayLike, baseline: NDArray[Any] | Sequence[float]) -> NDArray[np.float64]: ...


@overload
def relative_drop(value: ArrayLike, baseline: ArrayLike) -> float | NDArray[np.float64]: ...


def relative_drop(value: ArrayLike, baseline: ArrayLike) -> float | NDArray[np.float64]:
    r"""Relative drop of a value below its baseline, clipped at 0 (a rise is no drop).

    The predecessor's convention, kept for compatibility: a reward that falls from 1.0 to 0.8 dropped by
    0.2 (20 %). A negative baseline is measured in its absolute value, so "drop" always means "fell below
    the baseline": from -1.0 to -1.5 is a drop of 0.5, from -1.0 to -0.5 none.

    .. math::

        \mathrm{drop} = \max\!\left(0, \frac{\mathrm{baseline} - \mathrm{value}}{|\mathrm{baseline}|}\right)

    A drop is only as good as its baseline: take ``baseline`` from :func:`robust_baseline` over a warm-up
    window, never from a single batch. A relative drop from 0 is undefined; for rewards centred on 0 (e.g.
    group-normalised advantages) use an absolute threshold on ``baseline - value`` instead.

    Return rule: a ``float`` when both arguments are real scalars (``int``, ``float``, numpy scalar);
    otherwise a float64 array of the broadcast shape (0-d arrays and tensors included).

    Args:
        value: Current value(s), finite.
        baseline: Reference value(s), finite and non-zero; broadcast against ``value``.

    Returns:
        The non-negative drop (may exceed 1 when ``value`` crosses zero), as a ``float`` or an array.

    Raises:
        LoopguardTypeError: booleans, strings or other non-numbers.
        InputError: NaN/Inf, a zero baseline, shapes that do not broadcast, a broadcast result over
            ``MAX_SERIES_LENGTH`` (10,000,000) elements, or an overflowing result.

    Example:
        >>> relative_drop(0.8, 1.0)
        0.199...
        >>> relative_drop(1.2, 1.0)
        0.0
        >>> relative_drop(-1.5, -1.0)
        0.5
        >>> relative_drop([1.0, 0.5, 0.25], 1.0)
        array([0.  , 0.5 , 0.75])
        >>> relative_drop(0.5, 0.0)
        Traceback (most recent call last):
        ...
        loopguard.exceptions.InputError: `baseline` must be non-zero (a relative drop from 0 is undefined; use an absolute threshold on baseline - value instead), got 0.0.

    References:
        Predecessor convention (soup-cli release notes): OK < 0.10 <= WARN < 0.30 <= HACK on the relative
        drop. The bands are conventions, not results from a paper.
    """  # noqa: E501
    scalar_inputs = _is_real_scalar(value) and _is_real_scalar(baseline)
    values = _as_finite_array("value", value)
    baselines = _as_finite_array("baseline", baseline)
    try:
        shape = np.broadcast_shapes(values.shape, baselines.shape)
    except ValueError as error:
        msg = (
            f"`value` and `baseline` must have broadcastable shapes, got {values.shape} and "
            f"{baselines.shape}."
        )
        raise InputError(msg) from error
    size = math.prod(shape)
    if size > MAX_SERIES_LENGTH:
        msg = (
            f"`value` and `baseline` must broadcast to at most {MAX_SERIES_LENGTH:,} elements (DoS cap), "
            f"got shape {shape}."
        )
        raise InputError(msg)
    if baselines.size and not np.all(baselines):
        where = ""
        if baselines.ndim:
            where = f" at index {tuple(int(i) for i in np.argwhere(baselines == 0)[0])}"
        msg = (
            "`baseline` must be non-zero (a relative drop from 0 is undefined; use an absolute threshold "
            f"on baseline - value instead), got 0.0{where}."
        )
        raise InputError(msg)
    with np.errstate(over="ignore", invalid="ignore"):
        drops = np.maximum(0.0, (baselines - values) / np.abs(baselines))
        if not np.isfinite(drops).all():
            # baseline - value overflows for huge values of opposite sign; sign(b) - v / |b| is the same
            # drop and overflows only when the drop itself is beyond float64
            rewritten = np.maximum(0.0, np.sign(baselines) - values / np.abs(baselines))
            drops = np.where(np.isfinite(drops), drops, rewritten)
    if not np.isfinite(drops).all():
        msg = (
            "`value` and `baseline` must give a relative drop representable in float64, got one beyond "
            "~1.8e308 (a value more than 1e308 times its baseline's magnitude below it)."
        )
        raise InputError(msg)
    if scalar_inputs:
        return float(drops)
    return np.asarray(drops, dtype=np.float64)


def classify_drop(drop: float, *, warn: float = 0.10, hack: float = 0.30) -> DropVerdict:
    r"""Classify a relative drop into the OK / WARN / HACK bands.

    Band edges belong to the higher band: ``drop < warn`` is OK, ``warn <= drop < hack`` is WARN,
    ``drop >= hack`` is HACK. The comparison is exact: a drop computed as ``relative_drop(0.9, 1.0)`` is
    ``0.0999...`` in floating point and reads OK.

    .. math::

        \text{verdict} = \begin{cases}
        \text{OK} & \mathrm{drop} < w \\
        \text{WARN} & w \le \mathrm{drop} < h \\
        \text{HACK} & \mathrm{drop} \ge h
        \end{cases}

    Defaults 0.10 / 0.30 are the predecessor's (soup-cli) bands, kept for compatibility. They are only
    meaningful against a robust baseline (:func:`robust_baseline`); against one batch they flag healthy
    noise.

    Args:
        drop: A relative drop from :func:`relative_drop`: finite and ``>= 0``.
        warn: Lower edge of WARN, finite, ``0 < warn < hack``.
        hack: Lower edge of HACK, finite, ``> warn``.

    Returns:
        ``"OK"``, ``"WARN"`` or ``"HACK"``.

    Raises:
        LoopguardTypeError: an argument is a bool or not a real number.
        InputError: ``drop`` is NaN, infinite or negative.
        ConfigError: ``warn``/``hack`` non-finite, ``warn <= 0``, or ``warn >= hack``.

    Example:
        >>> classify_drop(0.05), classify_drop(0.10), classify_drop(0.30)
        ('OK', 'WARN', 'HACK')
        >>> classify_drop(0.2, warn=0.3, hack=0.2)
        Traceback (most recent call last):
        ...
        loopguard.exceptions.ConfigError: `warn` must be < `hack`, got warn=0.3 and hack=0.2.

    References:
        Predecessor convention (soup-cli release notes): OK < 0.10 <= WARN < 0.30 <= HACK.
    """
    warn_edge = check_real("warn", warn, lo=0.0, lo_inclusive=False)
    hack_edge = check_real("hack", hack)
    if not warn_edge < hack_edge:
        msg = f"`warn` must be < `hack`, got warn={warn_edge:g} and hack={hack_edge:g}."
        raise ConfigError(msg)
    value = _data_scalar("drop", drop, lo=0.0)
    if value >= hack_edge:
        return "HACK"
    if value >= warn_edge:
        return "WARN"
    return "OK"


# --------------------------------------------------------------------------------------------------
# robust baseline


@attrs.frozen
class RobustBaseline:
    r"""Median and median absolute deviation of a warm-up window: a baseline one noisy batch cannot move.

    Build it with :func:`robust_baseline`. ``scale`` turns the MAD into a standard-deviation estimate
    (consistent for Gaussian data) and :meth:`zscore` measures a new value in those units.

    Attributes:
        median: Median of the warm-up values.
        mad: Raw median absolute deviation, :math:`\operatorname{median}_i |x_i - \operatorname{median}(x)|`
            (not rescaled), ``>= 0``.
        count: Number of warm-up values, ``>= 1``.

    Example:
        >>> base = RobustBaseline(median=1.0, mad=0.5, count=5)
        >>> base.scale
        0.7413
        >>> base.zscore(0.2587)
        -1.0
    """

    median: float = attrs.field(validator=real())
    mad: float = attrs.field(validator=real(lo=0.0))
    count: int = attrs.field(validator=integer(lo=1))

    @property
    def scale(self) -> float:
        r"""Robust standard-deviation estimate :math:`1.4826 \cdot \mathrm{MAD}` (0 when the MAD is 0)."""
        return _MAD_TO_SIGMA * self.mad

    def zscore(self, value: float, *, min_scale: float = 0.0) -> float:
        r"""Robust z-score of ``value``: its distance from the median in units of :attr:`scale`.

        .. math::

            z = \frac{\mathrm{value} - \mathrm{median}}{\max(1.4826 \cdot \mathrm{MAD}, s_{\min})}

        When the denominator is 0 (more than half the warm-up values were identical, e.g. a binary reward at
        100 % success, and ``min_scale`` is 0) the result is ``0.0`` for ``value == median`` and ``+inf`` /
        ``-inf`` for a value above / below it: never NaN, and an infinite score compares cleanly against
        any threshold. That is the honest limit, but it makes the first change after a constant warm-up
        infinitely surprising; a guard on discrete rewards should pass ``min_scale`` equal to the smallest
        change it cares about (e.g. ``1 / batch_size`` for batch means of 0/1 rewards).

        Args:
            value: The value to score, finite.
            min_scale: Floor on the scale, finite and ``>= 0`` (default 0: no floor).

        Returns:
            The z-score as a ``float``: finite, or ``+-inf`` when the scale is 0 (or the ratio exceeds
            float64's range).

        Raises:
            LoopguardTypeError: ``value`` or ``min_scale`` is a bool or not a real number.
            InputError: ``value`` is NaN or infinite.
            ConfigError: ``min_scale`` is negative or non-finite.

        Example:
            >>> base = RobustBaseline(median=1.0, mad=0.0, count=8)
            >>> base.zscore(1.0), base.zscore(0.5)
            (0.0, -inf)
            >>> base.zscore(0.5, min_scale=0.125)
            -4.0
        """
        floor = check_real("min_scale", min_scale, lo=0.0)
        x = _data_scalar("value", value)
        deviation = x - self.median
        denominator = max(self.scale, floor)
        if denominator == 0.0 or not math.isfinite(deviation):
            if deviation == 0.0:
                return 0.0
            return math.copysign(math.inf, deviation)
        with np.errstate(over="ignore"):
            return float(np.float64(deviation) / np.float64(denominator))


def robust_baseline(values: ArrayLike, *, min_count: int = 3) -> RobustBaseline:
    r"""Robust baseline of a warm-up window: median and median absolute deviation (MAD).

    Collect a per-step value (e.g. the batch-mean reward) over the first ``W`` steps of a healthy run and
    summarise it here; compare later steps against ``.median`` (with :func:`relative_drop`) or in units of
    ``.scale`` (with :meth:`RobustBaseline.zscore`). The median ignores a few wild batches that would drag a
    mean, and a window of many steps averages away the batch-to-batch noise that made the predecessor's
    single-batch baseline flag healthy runs. It does not help if the warm-up itself is already hacked, nor
    against slow legitimate drift over a long run (refresh the baseline, or use a long EMA).

    .. math::

        m = \operatorname{median}_i x_i, \qquad \mathrm{MAD} = \operatorname{median}_i |x_i - m|,
        \qquad \mathrm{scale} = 1.4826 \cdot \mathrm{MAD}

    Args:
        values: 1-D array-like of warm-up values, finite, at most ``MAX_SERIES_LENGTH`` (10,000,000).
        min_count: Fewest values accepted (default 3, ``>= 1``): a "baseline" of one or two batches is the
            mistake this function exists to avoid. 20 or more steps is a better warm-up.

    Returns:
        A frozen :class:`RobustBaseline` ``(median, mad, count)``.

    Raises:
        LoopguardTypeError: booleans or non-numbers; ``min_count`` not an integer.
        InputError: ``values`` not 1-D, empty, non-finite, over the cap, or shorter than ``min_count``.
        ConfigError: ``min_count < 1``.

    Example:
        >>> base = robust_baseline([1.0, 1.2, 0.9, 5.0, 1.1])
        >>> base.median, round(base.mad, 6), base.count
        (1.1, 0.1, 5)
        >>> robust_baseline([1.0, 2.0])
        Traceback (most recent call last):
        ...
        loopguard.exceptions.InputError: `values` must hold at least 3 values (min_count) for a robust baseline, got 2.

    References:
        Hampel, F. R. (1974). The Influence Curve and its Role in Robust Estimation. Journal of the American
        Statistical Association 69(346), 383-393 (the MAD and its 1.4826 Gaussian consistency factor).
    """  # noqa: E501
    needed = check_int("min_count", min_count, lo=1)
    array = as_float_array("values", values, max_len=MAX_SERIES_LENGTH)
    if array.size < needed:
        msg = (
            f"`values` must hold at least {needed} values (min_count) for a robust baseline, "
            f"got {array.size}."
        )
        raise InputError(msg)
    # a warm-up window is a few values: their medians are taken in Python (the same bits, see short_median)
    values_list = array.tolist() if array.size <= SHORT else []
    median = short_median(values_list) if values_list else None
    if median is None:
        median = float(robust_median(array))  # np.median's middle-pair mean overflows for values near 1e308
    with np.errstate(over="ignore", invalid="ignore"):
        # scipy.stats.median_abs_deviation(array, center=<median>) computes exactly this, at 10x the cost of
        # its argument handling (and a 1-second first import)
        mad = short_median([abs(value - median) for value in values_list]) if values_list else None
        if mad is None:
            mad = float(np.median(np.abs(array - median)))
        if not math.isfinite(mad):  # a deviation or the middle-pair mean overflowed: halved ones cannot
            mad = float(robust_median(np.abs(array / 2.0 - median / 2.0))) * 2.0
    if not (math.isfinite(median) and math.isfinite(mad)):
        msg = "`values` overflowed float64 while computing the median absolute deviation (rescale them)."
        raise InputError(msg)
    if not math.isfinite(_MAD_TO_SIGMA * mad):
        msg = (
            "`values` must have a robust scale (1.4826 * MAD) representable in float64, got a MAD of "
            f"{mad:g} (rescale them)."
        )
        raise InputError(msg)
    return RobustBaseline(median=median, mad=mad, count=int(array.size))


# --------------------------------------------------------------------------------------------------
# distribution drift


def _robust_scale(sample: NDArray[np.float64]) -> tuple[float, int]:
    """Reference scale for standardising: 1.4826 * MAD, else the population standard deviation.

    Returned as ``(m, e)`` with scale ``m * 2**e``: computed on the sample divided by a power of two near
    its largest magnitude (exact), so neither the deviations nor the squares can overflow or underflow (a
    non-constant reference never gets scale 0 because its squares underflowed).
    """
    exponent = pow2_exponent(float(np.max(np.abs(sample))))
    scaled = np.ldexp(sample, -exponent)
    median = plain_median(scaled)
    scale = _MAD_TO_SIGMA * plain_median(np.abs(scaled - median))
    if scale > 0.0:
        return scale, exponent
    return float(np.std(scaled)), exponent


def _wasserstein(u: NDArray[np.float64], v: NDArray[np.float64], *, v_sorted: bool = False) -> float:
    """1-D Wasserstein-1 distance of two non-empty samples: the integral of ``|F_u - F_v|``.

    The same operations, in the same order, as :func:`scipy.stats.wasserstein_distance` without weights
    (scipy >= 1.15: the same bits), without its argument handling and its first import (about a second).
    ``v_sorted``: ``v`` is sorted already (a reference kept sorted), so it is not sorted again.
    """
    values = np.concatenate((u, v))
    values.sort(kind="mergesort")
    deltas = values[1:] - values[:-1]
    u_sorted = u.copy()  # np.sort's copy and sort, without its wrapper
    u_sorted.sort()
    u_cdf = u_sorted.searchsorted(values[:-1], "right") / u.size
    v_cdf = (v if v_sorted else np.sort(v)).searchsorted(values[:-1], "right") / v.size
    gaps = np.abs(u_cdf - v_cdf)
    if hasattr(np, "vecdot"):  # numpy >= 2, as scipy does
        return float(np.vecdot(gaps, deltas))
    return float(np.sum(gaps * deltas))  # pragma: no cover - numpy 1.x


def reward_drift(
    current: ArrayLike,
    reference: ArrayLike,
    method: DriftMethod = "wasserstein",
    *,
    standardize: bool = False,
) -> float:
    r"""Distance between the current reward distribution and a reference sample.

    Where :func:`relative_drop` watches one number (a mean), this compares whole distributions: a policy
    that games the reward model often changes the *shape* (a new mode of very high scores, a collapsed
    spread) before the mean moves much. Use a reference from healthy warm-up steps.

    * ``"wasserstein"``: the 1-D Wasserstein-1 (earth mover's) distance, in reward units; for equal sample
      sizes it is the mean absolute difference of the sorted samples. Sensitive to how far mass moved.
    * ``"ks"``: the two-sample Kolmogorov-Smirnov statistic, the largest gap between the empirical CDFs, in
      ``[0, 1]``; scale-free and insensitive to how far beyond the other sample the mass moved.

    .. math::

        W_1(P, Q) = \int_{-\infty}^{\infty} |F_P(x) - F_Q(x)|\,dx, \qquad
        D_{KS} = \sup_x |F_P(x) - F_Q(x)|

    With ``standardize=True`` the Wasserstein distance is divided by the reference's robust scale
    :math:`1.4826 \cdot \mathrm{MAD}` so one threshold works for any reward scale (invariant to shifting
    and positively rescaling both samples). If the reference's MAD is 0 (more than half its values are
    identical, e.g. mostly-1 binary rewards) the population standard deviation of the reference is used
    instead; if that is 0 too (a constant reference) the result is ``0.0`` when the distance is 0 and
    ``+inf`` otherwise (never NaN).

    Both distances are 0 for identical samples and grow with any change, healthy learning included: a
    rising reward is drift too. Drift alone does not separate hacking from progress; pair it with a gold
    signal or ensemble disagreement.

    Args:
        current: 1-D rewards of the current step(s), finite, non-empty, at most ``MAX_TRAJECTORIES``
            (100,000).
        reference: 1-D reference rewards, same rules; sizes may differ.
        method: ``"wasserstein"`` (default) or ``"ks"``.
        standardize: Divide the Wasserstein distance by the reference's robust scale. Only valid with
            ``"wasserstein"`` (KS is already scale-free; asking for it with ``"ks"`` is an error).

    Returns:
        A non-negative ``float`` (in ``[0, 1]`` for ``"ks"``).

    Raises:
        LoopguardTypeError: booleans or non-numbers; ``standardize`` not a bool.
        InputError: arrays not 1-D, empty, non-finite, over the cap, or overflowing float64.
        ConfigError: unknown ``method``; ``standardize=True`` with ``"ks"``.

    Example:
        >>> reward_drift([0.0, 1.0, 2.0], [1.0, 2.0, 3.0])
        1.0
        >>> reward_drift([0.0, 1.0, 2.0], [1.0, 2.0, 3.0], "ks")
        0.333...
        >>> reward_drift([0.0, 10.0, 20.0], [10.0, 20.0, 30.0], standardize=True)  # 10 / (1.4826 * 10)
        0.674...

    References:
        Villani, C. (2009). Optimal Transport: Old and New. Springer (Wasserstein distance).

        Massey, F. J. (1951). The Kolmogorov-Smirnov Test for Goodness of Fit. Journal of the American
        Statistical Association 46(253), 68-78.
    """
    chosen = check_choice("method", method, _DRIFT_METHODS)
    if check_bool("standardize", standardize) and chosen == "ks":
        msg = (
            "`standardize` must be False with method='ks' (the KS statistic is already scale-free), got True."
        )
        raise ConfigError(msg)
    now = as_float_array("current", current, max_len=MAX_TRAJECTORIES)
    ref = as_float_array("reference", reference, max_len=MAX_TRAJECTORIES)
    if chosen == "ks":
        from scipy import stats  # imported where used: `import loopguard` stays light

        # only the statistic is used; the p-value's internals may divide by zero on tiny samples
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return float(stats.ks_2samp(now, ref, method="asymp").statistic)
    if not standardize:
        # W1 scales with the data: compute it on both samples divided by one power of two (exact), so the
        # gaps between sorted values cannot overflow, and scale back.
        exponent = pow2_exponent(max(float(np.max(np.abs(now))), float(np.max(np.abs(ref)))))
        scaled = _wasserstein(np.ldexp(now, -exponent), np.ldexp(ref, -exponent))
        with np.errstate(over="ignore"):
            distance = float(np.ldexp(scaled, exponent))
        if not math.isfinite(distance):
            msg = "`current` and `reference` overflowed float64 in the Wasserstein distance (rescale them)."
            raise InputError(msg)
        return distance
    return DriftReference.of(ref).standardized_distance(now)


@attrs.frozen
class DriftReference:
    """A reference sample kept for :func:`reward_drift`'s standardised Wasserstein distance, sorted once.

    A sample that every later batch is compared with (the Guard's frozen warm-up rewards) is sorted, and its
    robust scale taken, once; :meth:`standardized_distance` then gives ``reward_drift(current, reference,
    standardize=True)`` bit for bit.

    Attributes:
        ordered: The reference, sorted (read-only).
        max_abs: Its largest magnitude.
        scale: Its robust scale as ``(m, e)``, the scale being ``m * 2**e`` (see ``_robust_scale``).
    """

    ordered: NDArray[np.float64]
    max_abs: float
    scale: tuple[float, int]

    @classmethod
    def of(cls, reference: ArrayLike) -> DriftReference:
        """Keep ``reference`` (1-D, finite, non-empty, at most ``MAX_TRAJECTORIES`` values)."""
        ref = as_float_array("reference", reference, max_len=MAX_TRAJECTORIES)
        ordered = np.sort(ref)
        ordered.setflags(write=False)
        return cls(ordered, float(np.max(np.abs(ref))), _robust_scale(ref))  # the scale: in the given order

    def standardized_distance(self, current: ArrayLike) -> float:
        """``reward_drift(current, reference, standardize=True)`` (see there; the same errors)."""
        now = as_float_array("current", current, max_len=MAX_TRAJECTORIES)
        # W1 scales with the data: compute it on both samples divided by one power of two (exact, and order-
        # preserving: the reference stays sorted), so the gaps between sorted values cannot overflow.
        exponent = pow2_exponent(max(float(np.abs(now).max()), self.max_abs))
        scaled = _wasserstein(np.ldexp(now, -exponent), np.ldexp(self.ordered, -exponent), v_sorted=True)
        scale, scale_exponent = self.scale
        if scale == 0.0:  # a constant reference
            return 0.0 if scaled == 0.0 else math.inf
        try:  # np.ldexp's bits (C's ldexp); an overflow raises here instead of giving inf
            standardized = math.ldexp(scaled / scale, exponent - scale_exponent)
        except OverflowError:
            standardized = math.inf
        if not math.isfinite(standardized):
            msg = (
                "`current` must be within ~1.8e308 reference scales of `reference`: the standardised "
                "Wasserstein distance is beyond float64 (the reference's spread is tiny against the "
                "distance)."
            )
            raise InputError(msg)
        return standardized
