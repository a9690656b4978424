"""Early warnings of collapse in group-based RL (GRPO, RLOO): the "echo trap".

RAGEN (Wang et al., 2025) describes a collapse mode of multi-turn agent RL in which the policy settles
into a few repetitive reasoning patterns. Its early warnings, visible long before the mean reward falls:
the spread of rewards among the rollouts of one prompt (in-group reward std) drops sharply, and the mean
token entropy falls; gradient-norm spikes confirm the collapse. Group-relative methods make the first one
acute: a group whose rollouts all got the same reward has zero advantage and teaches nothing. (RAGEN's
mitigation, training only on the top fraction of prompt groups ranked by in-group reward std, is a data
filter, not a signal, and is not implemented here.)

Rewards are laid out as TRL's GRPO lays them out: ``B = G * group_size`` entries, and each run of
``group_size`` consecutive entries is the rollouts of one prompt. When groups differ in size (a trainer left
some completions out), pass the sizes of the consecutive groups instead of one ``group_size``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from loopguard._validation import (
    as_float_array,
    as_group_sizes,
    check_int,
    check_real,
    scalar_value,
)
from loopguard.exceptions import InputError
from loopguard.signals._numeric import plain_std
from loopguard.signals._trend import TrendMethod, series_slope

__all__ = ["entropy_trend", "group_reward_std", "zero_std_group_fraction"]

_ZERO_STD_ATOL = 1e-8  # TRL's tolerance for a zero-std group

GroupStatistic = Callable[[NDArray[np.float64]], NDArray[np.float64]]


def _as_groups(rewards: object, group_size: object) -> tuple[NDArray[np.float64], int | NDArray[np.int64]]:
    """Validate rewards and the group layout.

    Returns ``(rewards, layout)``: ``layout`` is an int ``>= 2`` for equal groups, or the validated ragged
    sizes (each ``>= 1``, adding up to ``len(rewards)``). A sequence of equal sizes ``>= 2`` becomes the
    int, so it gives exactly the same numbers as passing the int.
    """
    if hasattr(group_size, "ndim") and getattr(group_size, "ndim", None) == 0:
        group_size = scalar_value("group_size", group_size)  # a 0-d array or tensor is a plain int
    if isinstance(group_size, (numbers.Number, str, bytes, np.bool_)) or group_size is None:
        size = check_int("group_size", group_size, lo=2)
        array = as_float_array("rewards", rewards)
        if len(array) % size != 0:
            msg = (
                f"`rewards` must have a length divisible by `group_size` (rollouts per prompt), "
                f"got {len(array)} rewards and group_size {size}."
            )
            raise InputError(msg)
        return array, size
    sizes = as_group_sizes("group_size", group_size)
    array = as_float_array("rewards", rewards)
    as_group_sizes("group_size", sizes, total=len(array))
    first = int(sizes[0])
    if first >= 2 and bool((sizes == first).all()):
        return array, first
    return array, sizes


def _per_group(
    array: NDArray[np.float64], layout: int | NDArray[np.int64], statistic: GroupStatistic
) -> NDArray[np.float64]:
    """Apply ``statistic`` (one value per row of a ``[groups, members]`` matrix) to every group of >= 2.

    Ragged groups are batched by size, so each group goes through exactly the arithmetic it would get in a
    batch of equal groups; groups of one member are left out. Results come back in group order.
    """
    if isinstance(layout, int):
        return statistic(array.reshape(-1, layout))
    sizes = layout
    starts = np.zeros(len(sizes), dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    kept = np.flatnonzero(sizes >= 2)
    result = np.empty(len(kept), dtype=np.float64)
    kept_sizes = sizes[kept]
    for member_count in np.unique(kept_sizes).tolist():
        chosen = np.flatnonzero(kept_sizes == member_count)
        rows = starts[kept[chosen]][:, np.newaxis] + np.arange(member_count, dtype=np.int64)
        result[chosen] = statistic(array[rows])
    return result


def _group_range(groups: NDArray[np.float64]) -> NDArray[np.float64]:
    """``max - min`` per group; it can overflow to +inf only for a huge range, which is not flat anyway."""
    with np.errstate(over="ignore"):
        return np.asarray(groups.max(axis=1) - groups.min(axis=1), dtype=np.float64)


def _group_std(groups: NDArray[np.float64], ddof: int) -> NDArray[np.float64]:
    """Std per row, computed on the row divided by a power of two near its largest magnitude.

    Scaling by ``2**e`` is exact, so squares cannot overflow (rewards near 1e308) or underflow (rewards
    near 1e-308) and the result equals :func:`numpy.std` wherever that did neither. Rows of identical
    values get exactly 0.0. A std beyond float64's range comes back as inf (the caller reports it).
    """
    exponents = np.frexp(np.abs(groups).max(axis=1))[1] - 1
    scaled = np.ldexp(groups, -exponents[:, np.newaxis])
    with np.errstate(over="ignore"):
        std: NDArray[np.float64] = np.ldexp(plain_std(scaled, axis=1, ddof=ddof), exponents)
    std[groups.max(axis=1) == groups.min(axis=1)] = 0.0  # no range (max - min is 0 only for equal values)
    return std


def group_reward_std(rewards: object, group_size: int | ArrayLike, *, ddof: int = 1) -> NDArray[np.float64]:
    r"""Standard deviation of the rewards within each prompt's group of rollouts.

    In GRPO the advantage of a rollout is its reward minus its group's mean (divided by the group's std),
    so a group with no spread contributes no gradient. RAGEN observed that the in-group reward std drops
    sharply well before the mean reward collapses; track its batch mean (or a low quantile) per step. RAGEN's
    mitigation keeps only the top 25 % of groups ranked by this std for the update; these values are the
    ranking key such a filter needs.

    .. math::

        s_g = \sqrt{\frac{1}{n_g - \mathrm{ddof}} \sum_{i=1}^{n_g} \left(r_{g,i} - \bar r_g\right)^2},
        \qquad n_g = \text{members of group } g

    ``ddof=1`` (Bessel's correction, the default) is the per-group std TRL's GRPO divides advantages by
    (``scale_rewards="group"``) and tests for ``frac_reward_zero_std``. TRL's logged ``reward_std`` is a
    different number: the std over the whole batch, not per group. A group whose rewards are all identical
    gets exactly ``0.0`` (not the ~1e-17 residue a rounded float mean can leave).

    **Ragged groups.** ``group_size`` may also be the sizes of consecutive groups (e.g. when a trainer left
    "unscorable" completions out of the batch, so some prompts kept fewer rollouts). A group with fewer
    than 2 members has no spread to measure (its sample std is undefined, its population std trivially 0)
    and is **left out**, with either ``ddof``: the result has one std per group of 2 or more members, in
    group order, and is empty when there is no such group. A sequence of equal sizes gives exactly the
    numbers of the equivalent int.

    Args:
        rewards: Rewards, shape ``[B]``, group-contiguous (with an int ``group_size``, entries
            ``g * group_size .. (g + 1) * group_size - 1`` are prompt ``g``'s rollouts), finite,
            ``B <= MAX_TRAJECTORIES`` (100,000).
        group_size: Rollouts per prompt (TRL's ``num_generations``), an integer ``>= 2`` that divides
            ``B``; or a sequence of group sizes, integers ``>= 1`` adding up to ``B``.
        ddof: Delta degrees of freedom, ``0`` (population std) or ``1`` (sample std, default).

    Returns:
        float64 array, one std per prompt group (per group of >= 2 members when ``group_size`` is a
        sequence), in the order the groups appear.

    Raises:
        LoopguardTypeError: booleans or non-numbers, or a non-integer ``group_size`` / ``ddof``.
        ConfigError: an int ``group_size`` below 2, or ``ddof`` not 0 or 1.
        InputError: ``rewards`` empty, not 1-D, over the cap, NaN/Inf, or its length not a multiple of
            ``group_size``; group sizes below 1 or not adding up to ``B``; or a std that overflows float64.

    Example:
        >>> group_reward_std([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0], group_size=4)
        array([0.57735027, 0.        ])
        >>> group_reward_std([1.0, 0.0, 1.0, 0.0], group_size=4, ddof=0)
        array([0.5])
        >>> group_reward_std([1.0, 0.0, 1.0, 7.0, 2.0, 2.0], group_size=[3, 1, 2])  # singleton left out
        array([0.57735027, 0.        ])

    References:
        Wang, Z., Wang, K., Wang, Q., et al. (2025). RAGEN: Understanding Self-Evolution in LLM Agents via
        Multi-Turn Reinforcement Learning. arXiv:2504.20073.
    """
    correction = check_int("ddof", ddof, lo=0, hi=1)
    array, layout = _as_groups(rewards, group_size)
    return _stds(array, layout, correction)


def _stds(array: NDArray[np.float64], layout: int | NDArray[np.int64], ddof: int) -> NDArray[np.float64]:
    """:func:`group_reward_std` of validated rewards and layout."""
    std = _per_group(array, layout, lambda groups: _group_std(groups, ddof))
    if not np.isfinite(std).all():
        msg = (
            "`rewards` must have per-group stds representable in float64 (a group spans more than "
            f"~1.8e308), got one beyond it in group {int(np.argmax(~np.isfinite(std)))}."
        )
        raise InputError(msg)
    return std


def zero_std_group_fraction(
    rewards: object, group_size: int | ArrayLike, *, atol: float = _ZERO_STD_ATOL
) -> float:
    r"""Fraction of prompt groups whose rollouts all received the same reward (within ``atol``).

    Such a group has zero advantage under GRPO/RLOO: it spends generation compute and teaches nothing. A
    rising fraction is the batch-level face of RAGEN's early warning (in-group reward std collapsing). It
    also rises, harmlessly, when prompts become too easy (all rollouts correct) or too hard (all wrong):
    read it together with the mean reward.

    .. math::

        \mathrm{frac} = \frac{1}{G} \sum_{g=1}^{G}
            \mathbf{1}\left[\max_i r_{g,i} - \min_i r_{g,i} \le \mathrm{atol}\right]

    Relation to TRL's ``frac_reward_zero_std``: TRL tests ``isclose(std_g, 0)``, i.e. the Bessel-corrected
    group std ``<= 1e-8`` (with ``scale_rewards="group"`` or ``"none"`` and the default
    ``multi_objective_aggregation``; other settings test the batch-wide std). This kernel tests the range
    instead: it is exactly 0 for identical rewards whatever their magnitude, whereas a std computed from a
    rounded mean (in float32 on GPU, say) can leave a residue near the tolerance. With the same tolerance
    the two agree whenever a group's rewards are identical (the common case with discrete rewards); they can
    differ only for a group whose range lies in ``(atol, atol * sqrt(2 * (group_size - 1))]``, since
    ``range / sqrt(2 (n - 1)) <= std <= range * sqrt(n / (n - 1)) / 2 <= range / sqrt(2)``.

    **Ragged groups** (``group_size`` a sequence of sizes): the fraction is taken over the groups of 2 or
    more members only, :math:`G` counting those. A single rollout cannot show whether a prompt's rollouts
    agree, so it is neither a zero-std group nor a group with spread. With no group of 2 or more members
    the fraction is ``0.0``: no evidence of collapse (the documented value for a degenerate batch, never
    NaN; callers that must tell "none measurable" apart check the sizes, as the Guard's collapse detector
    does by skipping such a step).

    Args:
        rewards: Rewards, shape ``[B]``, group-contiguous, finite, ``B <= MAX_TRAJECTORIES`` (100,000).
        group_size: Rollouts per prompt (TRL's ``num_generations``), an integer ``>= 2`` that divides
            ``B``; or a sequence of group sizes, integers ``>= 1`` adding up to ``B``.
        atol: Absolute tolerance on a group's reward range, finite, ``>= 0``. Default ``1e-8``, TRL's
            tolerance; use 0 for exact equality.

    Returns:
        A fraction in ``[0, 1]``.

    Raises:
        LoopguardTypeError: booleans or non-numbers, or a non-integer ``group_size``.
        ConfigError: an int ``group_size`` below 2, or ``atol`` negative or not finite.
        InputError: ``rewards`` empty, not 1-D, over the cap, NaN/Inf, or its length not a multiple of
            ``group_size``; group sizes below 1 or not adding up to ``B``.

    Example:
        >>> zero_std_group_fraction([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5], group_size=2)
        0.75
        >>> zero_std_group_fraction([1.0, 1.0, 1.0, 0.3, 0.0, 1.0], group_size=[3, 1, 2])  # 1 of 2 groups
        0.5
        >>> zero_std_group_fraction([1.0, 0.0], group_size=[1, 1])  # no group to judge
        0.0

    References:
        Wang, Z., Wang, K., Wang, Q., et al. (2025). RAGEN: Understanding Self-Evolution in LLM Agents via
        Multi-Turn Reinforcement Learning. arXiv:2504.20073.
    """
    tolerance = check_real("atol", atol, lo=0.0)
    array, layout = _as_groups(rewards, group_size)
    return _zero_fraction(array, layout, tolerance)


def _zero_fraction(array: NDArray[np.float64], layout: int | NDArray[np.int64], atol: float) -> float:
    """:func:`zero_std_group_fraction` of validated rewards and layout."""
    ranges = _per_group(array, layout, _group_range)
    if ranges.size == 0:
        return 0.0
    return int(np.count_nonzero(ranges <= atol)) / ranges.size


def group_spread(
    rewards: object, group_size: int | ArrayLike, *, ddof: int = 1
) -> tuple[NDArray[np.float64], float]:
    """:func:`group_reward_std` and :func:`zero_std_group_fraction` (default ``atol``), validated once.

    For a caller that needs both (the ``collapse`` signal): the values of the two calls, at the cost of
    one validation of ``rewards`` and ``group_size``.
    """
    correction = check_int("ddof", ddof, lo=0, hi=1)
    array, layout = _as_groups(rewards, group_size)
    return _stds(array, layout, correction), _zero_fraction(array, layout, _ZERO_STD_ATOL)


def entropy_trend(mean_entropies: object, *, method: TrendMethod = "ols") -> float:
    r"""Slope per step of the mean token entropy of the policy's completions.

    A falling entropy (negative slope) is an early collapse warning: the policy is becoming certain of a
    narrow set of continuations, which RAGEN reports alongside the drop of in-group reward std before the
    reward collapses. Some decline is normal as a policy learns a task; judge the slope against a healthy
    warm-up, not against zero. ``"theil_sen"`` ignores a few spiky steps.

    .. math::

        \hat\beta_{\mathrm{OLS}} = \frac{\sum_t (t - \bar t)(H_t - \bar H)}{\sum_t (t - \bar t)^2},
        \qquad
        \hat\beta_{\mathrm{TS}} = \operatorname{median}_{i < j} \frac{H_j - H_i}{j - i}

    with :math:`t = 0, \dots, n - 1` the position in the series (pass equally spaced steps, e.g. TRL's
    logged ``entropy`` at every step). A constant series gives ``0.0``.

    Args:
        mean_entropies: Mean per-token entropy (nats or bits, consistently) per step, 1-D, finite,
            ``>= 0``, at least 2 points; at most ``MAX_SERIES_LENGTH`` (10,000,000) points for ``"ols"`` and
            4,096 for ``"theil_sen"``.
        method: ``"ols"`` (default) or ``"theil_sen"``.

    Returns:
        Entropy units per step.

    Raises:
        LoopguardTypeError, ConfigError, InputError: as :func:`~loopguard.signals.length_trend`, whose series
            checks this shares (the same kernel): non-numbers or booleans, an unknown ``method``, a series
            not 1-D, shorter than 2 points, over the cap, NaN/Inf or negative.

    Example:
        >>> entropy_trend([1.2, 1.1, 0.9, 0.6])
        -0.2

    References:
        Wang, Z., Wang, K., Wang, Q., et al. (2025). RAGEN: Understanding Self-Evolution in LLM Agents via
        Multi-Turn Reinforcement Learning. arXiv:2504.20073.
    """
    return series_slope(mean_entropies, method=method, name="mean_entropies", nonnegative=True)
