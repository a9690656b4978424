"""Reward-model ensembles: disagreement between members and conservative aggregate rewards.

An ensemble of ``K`` reward models scores the same ``B`` samples; the scores form a ``[K, B]`` matrix (one
row per member). Two kinds of kernel live here:

* :func:`ensemble_disagreement` measures how much the members disagree on each sample (variance or standard
  deviation across members). Rising disagreement means the policy moved to where the members were not
  trained: the classic symptom of reward-model over-optimisation.
* :func:`ensemble_reward` turns the matrix into one conservative reward per sample (mean, median, worst case,
  uncertainty-weighted), usable directly as the training reward.

Ensembles do not remove hacks that all members share: if every member was trained on the same preference
data, they tend to be fooled the same way (Eisenstein et al. 2023), and neither the disagreement nor the
conservative aggregates see it.

DoS caps: at most ``MAX_ENSEMBLE_MEMBERS`` (32) members and ``MAX_TRAJECTORIES`` (100,000) samples.

References (cited by short name in the functions below):
    Coste, T., Anwar, U., Kirk, R., Krueger, D. (2023). Reward Model Ensembles Help Mitigate
    Overoptimization. arXiv:2310.02743.

    Eisenstein, J., Nagpal, C., Agarwal, A., et al. (2023). Helping or Herding? Reward Model Ensembles
    Mitigate but do not Eliminate Reward Hacking. arXiv:2312.09244.
"""

from __future__ import annotations

import math
from typing import Literal, overload

import numpy as np
from numpy.typing import ArrayLike, NDArray

from loopguard._validation import (
    MAX_ENSEMBLE_MEMBERS,
    MAX_TRAJECTORIES,
    as_float_array,
    check_bool,
    check_choice,
    check_real,
    describe,
    to_numpy,
)
from loopguard.exceptions import ConfigError, InputError
from loopguard.signals._numeric import robust_mean, robust_median

__all__ = [
    "DisagreementStatistic",
    "EnsembleMethod",
    "ensemble_disagreement",
    "ensemble_reward",
]

DisagreementStatistic = Literal["variance", "std"]
"""Spread measure across ensemble members."""

EnsembleMethod = Literal["mean", "median", "min", "uwo", "mean_minus_std"]
"""Aggregation rule for :func:`ensemble_reward`."""

_STATISTICS: tuple[str, ...] = ("variance", "std")
_REDUCTIONS: tuple[str, ...] = ("mean", "none")
_METHODS: tuple[str, ...] = ("mean", "median", "min", "uwo", "mean_minus_std")
_DEFAULT_COEF: dict[str, float] = {"uwo": 0.5, "mean_minus_std": 1.0}
_TINY_VARIANCE = 2.0**-900  # below it the plain squares may have underflowed: recomputed on rescaled scores


def _as_scores(scores: object) -> NDArray[np.float64]:
    """Validate a ``[K members, B samples]`` score matrix and return it as float64."""
    array = to_numpy("scores", scores)
    if array.ndim != 2:
        msg = (
            "`scores` must be a 2-D array shaped [members, samples] "
            f"(wrap a single model's scores as [scores]), got shape {array.shape}."
        )
        raise InputError(msg)
    members, samples = array.shape
    if members > MAX_ENSEMBLE_MEMBERS:
        msg = f"`scores` must have at most {MAX_ENSEMBLE_MEMBERS} members (rows; DoS cap), got {members:,}."
        raise InputError(msg)
    if samples > MAX_TRAJECTORIES:
        msg = f"`scores` must have at most {MAX_TRAJECTORIES:,} samples (columns; DoS cap), got {samples:,}."
        raise InputError(msg)
    return as_float_array("scores", array, ndim=2, max_len=None)


def _member_spread(
    scores: NDArray[np.float64], ddof: int, *, root: bool
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Variance (or, with ``root``, standard deviation) across members (axis 0) as ``(m, e)``: ``m * 2**e``.

    The variance is shift-invariant, so it is computed on the deviations from the first member: identical
    members then give exactly 0 (not a rounding residue), and large common offsets lose no precision.
    Samples whose plain variance overflowed (scores near 1e308) or fell to a tiny or zero value (scores near
    1e-308, whose squares underflow) are computed again on their scores divided by a power of two near their
    largest magnitude (exact), and carried as ``m * 2**e``: a standard deviation is then representable even
    where its square is not.
    """
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        variance = np.asarray(np.var(scores - scores[:1], axis=0, ddof=ddof), dtype=np.float64)
    exponents = np.zeros(variance.shape, dtype=np.int64)
    redo = np.flatnonzero(~(variance >= _TINY_VARIANCE) | ~np.isfinite(variance))
    if redo.size:
        columns = scores[:, redo]
        column_exponents = (np.frexp(np.max(np.abs(columns), axis=0))[1] - 1).astype(np.int64)
        scaled = np.ldexp(columns, -column_exponents)
        variance[redo] = np.var(scaled - scaled[:1], axis=0, ddof=ddof)
        exponents[redo] = 2 * column_exponents
    if not root:
        return variance, exponents
    odd = exponents % 2  # sqrt(m * 2**e) = sqrt(m * 2**(e % 2)) * 2**(e // 2)
    return np.sqrt(np.ldexp(variance, odd)), exponents // 2


def _times_power_of_two(
    weight: float, mantissa: NDArray[np.float64], exponent: NDArray[np.int64]
) -> NDArray[np.float64]:
    """``weight * mantissa * 2**exponent`` without an intermediate overflow (inf only if the result is)."""
    weight_mantissa, weight_exponent = math.frexp(weight)
    with np.errstate(over="ignore"):
        return np.asarray(np.ldexp(weight_mantissa * mantissa, exponent + weight_exponent), dtype=np.float64)


def _check_finite_result(result: NDArray[np.float64], what: str = "result") -> NDArray[np.float64]:
    if not np.isfinite(result).all():
        index = int(np.argmax(~np.isfinite(result)))
        msg = (
            f"`scores` must give a {what} representable in float64, got one beyond ~1.8e308 at sample "
            f"{index} (rescale the scores)."
        )
        raise InputError(msg)
    return result


def _check_unbiased(unbiased: object, members: int) -> int:
    """Return the ``ddof`` for ``unbiased``; the unbiased estimator needs two members."""
    if check_bool("unbiased", unbiased) and members < 2:
        msg = (
            f"`unbiased` must be False when `scores` has one member (K - 1 = 0), got True with K = {members}."
        )
        raise ConfigError(msg)
    return 1 if unbiased else 0


@overload
def ensemble_disagreement(
    scores: ArrayLike,
    *,
    statistic: DisagreementStatistic = ...,
    unbiased: bool = ...,
    reduce: Literal["mean"] = ...,
) -> float: ...


@overload
def ensemble_disagreement(
    scores: ArrayLike,
    *,
    statistic: DisagreementStatistic = ...,
    unbiased: bool = ...,
    reduce: Literal["none"],
) -> NDArray[np.float64]: ...


def ensemble_disagreement(
    scores: ArrayLike,
    *,
    statistic: DisagreementStatistic = "variance",
    unbiased: bool = False,
    reduce: Literal["mean", "none"] = "mean",
) -> float | NDArray[np.float64]:
    r"""Disagreement of reward-model ensemble members: per-sample spread across members.

    For each sample ``b`` the spread of the ``K`` member scores is measured (variance or standard
    deviation), then averaged over the batch (``reduce="mean"``) or returned per sample (``reduce="none"``).
    Rising disagreement during training means the policy is producing outputs on which the members were not
    trained, so their scores stop agreeing: the symptom of over-optimisation that ensembles make visible.
    It does not see a hack that all members share (they agree on it).

    .. math::

        \bar r_b = \frac{1}{K}\sum_{k=1}^{K} r_{k,b}, \qquad
        \mathrm{Var}_b = \frac{1}{K - \delta}\sum_{k=1}^{K} (r_{k,b} - \bar r_b)^2, \qquad
        D = \frac{1}{B}\sum_{b=1}^{B} \mathrm{Var}_b \;\; (\text{or } \sqrt{\mathrm{Var}_b})

    with :math:`\delta = 1` when ``unbiased`` else 0. With ``reduce="mean"`` and ``statistic="std"`` the
    batch value is the mean of the per-sample standard deviations (not the square root of the mean variance).

    With a single member (``K == 1``) and ``unbiased=False`` the disagreement is 0 for every sample: one
    model cannot disagree with itself. Members that agree exactly give exactly 0.

    Args:
        scores: Scores shaped ``[K members, B samples]`` (list of lists, numpy array or torch tensor),
            finite, ``1 <= K <= MAX_ENSEMBLE_MEMBERS`` (32), ``1 <= B <= MAX_TRAJECTORIES`` (100,000).
        statistic: ``"variance"`` (default; the quantity UWO penalises) or ``"std"`` (same units as the
            reward).
        unbiased: Use the ``K - 1`` denominator (sample variance) instead of ``K`` (population variance,
            default). Needs ``K >= 2``.
        reduce: ``"mean"`` returns the batch mean as a ``float``; ``"none"`` returns the ``[B]`` array.

    Returns:
        A non-negative ``float`` (``reduce="mean"``) or a non-negative float64 array of shape ``[B]``.

    Raises:
        LoopguardTypeError: ``scores`` holds booleans or non-numbers; ``unbiased`` is not a bool.
        InputError: ``scores`` is not 2-D, is empty, holds NaN/Inf, exceeds a cap, or overflows float64.
        ConfigError: unknown ``statistic`` or ``reduce``; ``unbiased=True`` with one member.

    Example:
        >>> scores = [[1.0, 2.0, 0.0], [3.0, 2.0, 0.0]]
        >>> ensemble_disagreement(scores, reduce="none")
        array([1., 0., 0.])
        >>> ensemble_disagreement(scores)
        0.333...
        >>> ensemble_disagreement(scores, statistic="std", unbiased=True, reduce="none")
        array([1.414..., 0. , 0. ])

    References:
        Coste et al. (2023), arXiv:2310.02743 (disagreement as the over-optimisation symptom); Eisenstein et
        al. (2023), arXiv:2312.09244 (hacks every member shares).
    """
    chosen_statistic = check_choice("statistic", statistic, _STATISTICS)
    chosen_reduce = check_choice("reduce", reduce, _REDUCTIONS)
    array = _as_scores(scores)
    ddof = _check_unbiased(unbiased, array.shape[0])
    mantissa, exponent = _member_spread(array, ddof, root=chosen_statistic == "std")
    spread = _check_finite_result(_times_power_of_two(1.0, mantissa, exponent), chosen_statistic)
    if chosen_reduce == "none":
        return spread
    return float(robust_mean(spread))


def ensemble_reward(
    scores: ArrayLike,
    method: EnsembleMethod = "mean",
    *,
    coef: float | None = None,
    unbiased: bool = False,
) -> NDArray[np.float64]:
    r"""Aggregate reward-model ensemble scores into one conservative reward per sample.

    The aggregates are rewards a trainer can optimise directly; the conservative ones (``"min"``,
    ``"uwo"``, ``"mean_minus_std"``) pay less for samples the members disagree on, which is where a policy
    exploits reward-model errors. None of them helps against a hack that every member rewards: the members
    then agree, the spread is small, and the aggregate is as high as each member's score.

    .. math::

        \text{mean: } \bar r_b = \tfrac{1}{K}\textstyle\sum_k r_{k,b} \qquad
        \text{median: } \operatorname{median}_k r_{k,b} \qquad
        \text{min (WCO): } \min_k r_{k,b}

        \text{uwo: } \bar r_b - \lambda \, \mathrm{Var}_k(r_{k,b}) \qquad
        \text{mean\_minus\_std: } \bar r_b - \lambda \, \sqrt{\mathrm{Var}_k(r_{k,b})}

    ``Var`` uses the ``K`` denominator, or ``K - 1`` with ``unbiased=True``.

    Methods:
        * ``"mean"``: plain average (Coste et al.; Eisenstein et al.).
        * ``"median"``: robust to one wild member (Eisenstein et al.).
        * ``"min"``: worst-case optimisation, WCO (Coste et al.).
        * ``"uwo"``: uncertainty-weighted optimisation, mean minus ``coef`` times the *variance* (Coste et
          al.). Default ``coef`` 0.5, their best-of-n value; their PPO configuration used 0.1.
        * ``"mean_minus_std"``: mean minus ``coef`` times the *standard deviation* (Eisenstein et al.).
          Default ``coef`` 1.0 is loopguard's choice: the paper's value was not verified.

    With a single member every method returns that member's scores (its spread is 0).

    Args:
        scores: Scores shaped ``[K members, B samples]``, finite, ``1 <= K <= MAX_ENSEMBLE_MEMBERS`` (32),
            ``1 <= B <= MAX_TRAJECTORIES`` (100,000).
        method: One of ``"mean"``, ``"median"``, ``"min"``, ``"uwo"``, ``"mean_minus_std"``.
        coef: Penalty weight :math:`\lambda \ge 0` for ``"uwo"`` (default 0.5) and ``"mean_minus_std"``
            (default 1.0). Passing it with any other method is an error, not a silent no-op.
        unbiased: Use the ``K - 1`` denominator for the spread of ``"uwo"`` / ``"mean_minus_std"`` (needs
            ``K >= 2``). Passing ``True`` with a method that has no spread term is an error.

    Returns:
        A float64 array of shape ``[B]``.

    Raises:
        LoopguardTypeError: ``scores`` holds booleans or non-numbers; ``coef`` is not a real number;
            ``unbiased`` is not a bool.
        InputError: ``scores`` is not 2-D, is empty, holds NaN/Inf, exceeds a cap, or overflows float64.
        ConfigError: unknown ``method``; ``coef`` negative or non-finite; ``coef`` or ``unbiased=True``
            with a method that does not use it; ``unbiased=True`` with one member.

    Example:
        >>> scores = [[1.0, 2.0], [3.0, 2.0]]
        >>> ensemble_reward(scores)
        array([2., 2.])
        >>> ensemble_reward(scores, "min")
        array([1., 2.])
        >>> ensemble_reward(scores, "uwo")  # 2 - 0.5 * 1
        array([1.5, 2. ])
        >>> ensemble_reward(scores, "mean_minus_std", coef=2.0)  # 2 - 2 * 1
        array([0., 2.])

    References:
        Coste et al. (2023), arXiv:2310.02743 (mean, WCO, UWO); Eisenstein et al. (2023), arXiv:2312.09244
        (mean, median, mean minus std).
    """
    chosen = check_choice("method", method, _METHODS)
    penalised = chosen in _DEFAULT_COEF
    if coef is not None and not penalised:
        msg = (
            f"`coef` must be None with method={chosen!r} (only 'uwo' and 'mean_minus_std' use it), "
            f"got {describe(coef)}."
        )
        raise ConfigError(msg)
    if check_bool("unbiased", unbiased) and not penalised:
        msg = (
            f"`unbiased` must be False with method={chosen!r} (only 'uwo' and 'mean_minus_std' use a "
            "spread), got True."
        )
        raise ConfigError(msg)
    weight = _DEFAULT_COEF.get(chosen, 0.0) if coef is None else check_real("coef", coef, lo=0.0)
    array = _as_scores(scores)
    ddof = _check_unbiased(unbiased, array.shape[0])

    if chosen == "median":
        result = robust_median(array, axis=0)  # np.median's middle-pair mean overflows near 1e308
    elif chosen == "min":
        result = np.min(array, axis=0)
    else:
        result = robust_mean(array, axis=0)
        if penalised:
            mantissa, exponent = _member_spread(array, ddof, root=chosen == "mean_minus_std")
            penalty = _times_power_of_two(weight, mantissa, exponent)
            with np.errstate(over="ignore", invalid="ignore"):
                result = result - penalty
    return _check_finite_result(np.asarray(result, dtype=np.float64))
