"""Length exploitation: is the reward being earned by writing longer, rather than better, completions?

Reward models trained on human preferences often prefer longer answers, and RLHF policies learn to exploit
that. Four per-batch views of it live here: the correlation between reward and length, the OLS slope of
reward on length, the length-stratified ("weighted") reward gain over a reference batch, and the per-step
trend of the mean length. None of them is a hack detector on its own: reasoning tasks grow length on
purpose, so a length signal should only ever *support* a verdict raised by another signal.

References (cited by short name in the functions below):
    Singhal, P., Goyal, T., Xu, J., Durrett, G. (2023). A Long Way to Go: Investigating Length Correlations
    in RLHF. arXiv:2310.03716.

    Chen, L., Zhu, C., Soselia, D., et al. (2024). ODIN: Disentangled Reward Mitigates Hacking in RLHF.
    arXiv:2402.07319.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from loopguard._validation import (
    as_float_array,
    as_int_array,
    check_choice,
    check_int,
    check_same_length,
)
from loopguard.exceptions import InputError
from loopguard.signals._trend import TrendMethod, _ols_slope, series_slope

__all__ = [
    "CorrelationMethod",
    "length_stratified_gain",
    "length_trend",
    "reward_length_correlation",
    "reward_length_slope",
]

CorrelationMethod = Literal["pearson", "spearman"]
"""Correlation coefficient: Pearson (linear) or Spearman (rank, monotone)."""

_CORRELATION_METHODS = ("pearson", "spearman")


def _rewards_and_lengths(
    rewards: object, lengths: object, rewards_name: str = "rewards", lengths_name: str = "lengths"
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Validate a batch of finite rewards and non-negative integer lengths of the same length."""
    reward_array = as_float_array(rewards_name, rewards)
    length_array = as_int_array(lengths_name, lengths, lo=0)
    check_same_length(**{rewards_name: reward_array, lengths_name: length_array})
    return reward_array, length_array


def _pearson(x: NDArray[np.float64], y: NDArray[np.float64]) -> float:
    """Closed-form Pearson correlation, ``0.0`` when either side is constant, clipped to [-1, 1]."""
    x_scale = float(np.max(np.abs(x)))
    y_scale = float(np.max(np.abs(y)))
    if x_scale == 0.0 or y_scale == 0.0:
        return 0.0
    xc = x / x_scale  # correlation is scale-invariant; scaling first keeps squares from overflowing
    xc = xc - xc.mean()
    yc = y / y_scale
    yc = yc - yc.mean()
    sxx = float(np.dot(xc, xc))
    syy = float(np.dot(yc, yc))
    if sxx == 0.0 or syy == 0.0:
        return 0.0
    r = float(np.dot(xc, yc)) / (math.sqrt(sxx) * math.sqrt(syy))
    return min(1.0, max(-1.0, r))


def _average_ranks(values: NDArray[np.float64]) -> NDArray[np.float64]:
    """1-based ranks, ties given their average rank: :func:`scipy.stats.rankdata`'s default, same values.

    Example:
        >>> _average_ranks(np.array([3.0, 1.0, 3.0, 2.0]))
        array([3.5, 1. , 3.5, 2. ])
    """
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    new = np.empty(len(values), dtype=bool)
    new[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    tie = np.cumsum(new)  # the 1-based tie group of each sorted position
    bounds = np.r_[np.flatnonzero(new), len(values)]  # where each tie group starts, then the end
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = 0.5 * (bounds[tie] + bounds[tie - 1] + 1)
    return ranks


def reward_length_correlation(
    rewards: object, lengths: object, *, method: CorrelationMethod = "pearson"
) -> float:
    r"""Correlation between the reward of each completion and its length in tokens.

    A strongly positive value means the reward model pays for length: Singhal et al. (2023) found reward
    and length strongly correlated across the RLHF settings they studied, with much of PPO's reward gain
    explained by longer outputs. ``"pearson"`` measures a linear relation; ``"spearman"`` (Pearson on
    average ranks) any monotone one and is robust to a few very long completions, e.g. ones clipped at
    the generation limit.

    .. math::

        \rho = \frac{\sum_i (r_i - \bar r)(L_i - \bar L)}
                     {\sqrt{\sum_i (r_i - \bar r)^2} \sqrt{\sum_i (L_i - \bar L)^2}}

    (for Spearman, :math:`r_i` and :math:`L_i` are replaced by their ranks, ties averaged).

    If all rewards are equal, or all lengths are equal, the correlation is undefined; this returns
    ``0.0`` (no evidence of a length relation) instead of NaN, so a guard does not crash on a batch where
    every completion got the same score.

    Args:
        rewards: Scalar reward per completion, shape ``[B]``, finite, ``2 <= B <= MAX_TRAJECTORIES``
            (100,000).
        lengths: Completion length in tokens, shape ``[B]``, integers ``>= 0`` (token counts; float arrays
            are rejected rather than truncated).
        method: ``"pearson"`` (default) or ``"spearman"``.

    Returns:
        The correlation in ``[-1, 1]``; ``0.0`` when either input is constant.

    Raises:
        LoopguardTypeError: booleans or non-numbers, float ``lengths``, or a non-string ``method``.
        ConfigError: ``method`` is not one of the allowed names.
        InputError: wrong dimensionality, mismatched lengths, fewer than 2 completions, over the cap,
            NaN/Inf rewards or negative lengths.

    Example:
        >>> reward_length_correlation([0.1, 0.5, 0.4, 0.9], [10, 40, 30, 80])
        0.99...
        >>> reward_length_correlation([0.1, 0.5, 0.4, 0.9], [10, 40, 50, 80], method="spearman")
        0.8
        >>> reward_length_correlation([1.0, 1.0, 1.0], [10, 40, 30])  # constant rewards: undefined -> 0
        0.0

    References:
        Singhal et al. (2023), arXiv:2310.03716; Chen et al. (2024, ODIN), arXiv:2402.07319.
    """
    chosen = check_choice("method", method, _CORRELATION_METHODS)
    reward_array, length_array = _rewards_and_lengths(rewards, lengths)
    if len(reward_array) < 2:
        msg = f"`rewards` must hold at least 2 completions to correlate, got {len(reward_array)}."
        raise InputError(msg)
    # max == min rather than np.ptp: the range of rewards near +-1.8e308 overflows (the test does not)
    if reward_array.max() == reward_array.min() or length_array.max() == length_array.min():
        return 0.0
    x = length_array.astype(np.float64)
    y = reward_array
    if chosen == "spearman":
        x, y = _average_ranks(x), _average_ranks(y)
    return _pearson(x, y)


def reward_length_slope(rewards: object, lengths: object) -> float:
    r"""OLS slope of reward on completion length: how much reward one extra token buys, on average.

    Unlike the correlation, the slope keeps units (reward per token), so it can be compared against the
    reward gain a training step produced: a slope of 0.002 with completions 200 tokens longer than at the
    start accounts for 0.4 reward.

    .. math::

        \hat\beta = \frac{\sum_i (L_i - \bar L)(r_i - \bar r)}{\sum_i (L_i - \bar L)^2}

    If all lengths are equal the slope is undefined; this returns ``0.0`` (length explains nothing in
    this batch). Constant rewards give ``0.0`` as well, by the formula.

    Args:
        rewards: Scalar reward per completion, shape ``[B]``, finite, ``2 <= B <= MAX_TRAJECTORIES``
            (100,000).
        lengths: Completion length in tokens, shape ``[B]``, integers ``>= 0``.

    Returns:
        Reward units per token; ``0.0`` when the lengths are constant.

    Raises:
        LoopguardTypeError: booleans or non-numbers, or float ``lengths``.
        InputError: wrong dimensionality, mismatched lengths, fewer than 2 completions, over the cap,
            NaN/Inf rewards, negative lengths, or a slope that overflows float64.

    Example:
        >>> reward_length_slope([0.0, 1.0, 2.0], [100, 200, 300])
        0.01
        >>> reward_length_slope([0.0, 1.0, 2.0], [100, 100, 100])  # constant lengths: undefined -> 0
        0.0

    References:
        Singhal et al. (2023), arXiv:2310.03716.
    """
    reward_array, length_array = _rewards_and_lengths(rewards, lengths)
    if len(reward_array) < 2:
        msg = f"`rewards` must hold at least 2 completions to fit a slope, got {len(reward_array)}."
        raise InputError(msg)
    slope = _ols_slope(length_array.astype(np.float64), reward_array)
    if not math.isfinite(slope):
        msg = f"`rewards` must have a slope on length representable in float64 (rescale), got {slope}."
        raise InputError(msg)
    return slope


def length_stratified_gain(
    policy_rewards: object,
    policy_lengths: object,
    reference_rewards: object,
    reference_lengths: object,
    *,
    bin_width: int = 16,
    min_count: int = 2,
) -> float:
    r"""Reward gain of the policy over a reference, measured only between completions of similar length.

    Both batches are cut into length bins ``[k * w, (k + 1) * w)``. Inside a bin, length is (nearly) held
    fixed, so the difference of mean rewards is gain that length cannot explain. The per-bin differences
    are averaged with weights equal to the bin's share of the kept data. Compare the result with the raw
    gain ``mean(policy_rewards) - mean(reference_rewards)``: a stratified gain much smaller than the raw
    gain means most of the improvement came from writing longer (Singhal et al.'s "weighted reward gain").

    .. math::

        \mathrm{WGain} = \sum_{b \in K} \left(\bar r^{\pi}_b - \bar r^{\mathrm{ref}}_b\right)
                          \frac{n^{\pi}_b + n^{\mathrm{ref}}_b}{N},
        \qquad N = \sum_{b \in K} \left(n^{\pi}_b + n^{\mathrm{ref}}_b\right)

    where :math:`K` is the set of bins holding at least ``min_count`` completions from *each* side.
    Completions in other bins are ignored. A ``bin_width`` larger than every length makes a single bin,
    and the result is exactly the raw gain.

    Args:
        policy_rewards: Rewards of the current policy's completions, shape ``[B_pi]``, finite.
        policy_lengths: Their lengths in tokens, shape ``[B_pi]``, integers ``>= 0``.
        reference_rewards: Rewards of reference (e.g. SFT or first-step) completions, shape ``[B_ref]``,
            finite. Same prompts are not required, but a comparable prompt mix is.
        reference_lengths: Their lengths in tokens, shape ``[B_ref]``, integers ``>= 0``.
        bin_width: Bin width in tokens, ``>= 1``. Default 16, inside the 15-20 token range the length
            analyses use: narrow enough that length barely varies within a bin, wide enough to fill bins
            from batches of a few hundred completions.
        min_count: Minimum completions per side for a bin to count, ``>= 1``. Default 2, so no bin's mean
            rests on a single completion.

    Returns:
        The stratified gain, in reward units.

    Raises:
        LoopguardTypeError: booleans or non-numbers, float lengths, or non-integer ``bin_width`` /
            ``min_count``.
        ConfigError: ``bin_width`` or ``min_count`` below 1.
        InputError: empty or mismatched arrays, over the cap (``MAX_TRAJECTORIES`` = 100,000 per side),
            NaN/Inf rewards, negative lengths, or no bin holding ``min_count`` completions from each side
            (no common length range).

    Example:
        >>> # rewards depend only on length (bin 0 -> 0.0, bin 1 -> 1.0); the policy just writes longer
        >>> policy_r, policy_l = [0.0, 0.0, 1.0, 1.0, 1.0, 1.0], [3, 5, 20, 21, 22, 23]
        >>> ref_r, ref_l = [0.0, 0.0, 0.0, 0.0, 1.0, 1.0], [1, 2, 3, 4, 18, 19]
        >>> float(np.mean(policy_r) - np.mean(ref_r))  # raw gain
        0.333...
        >>> length_stratified_gain(policy_r, policy_l, ref_r, ref_l)  # none of it survives stratification
        0.0

    References:
        Singhal et al. (2023), arXiv:2310.03716; Chen et al. (2024, ODIN), arXiv:2402.07319.
    """
    width = check_int("bin_width", bin_width, lo=1)
    minimum = check_int("min_count", min_count, lo=1)
    p_rewards, p_lengths = _rewards_and_lengths(
        policy_rewards, policy_lengths, "policy_rewards", "policy_lengths"
    )
    r_rewards, r_lengths = _rewards_and_lengths(
        reference_rewards, reference_lengths, "reference_rewards", "reference_lengths"
    )
    n_policy = len(p_rewards)
    keys, inverse = np.unique(np.concatenate([p_lengths // width, r_lengths // width]), return_inverse=True)
    n_bins = len(keys)
    policy_bin, reference_bin = inverse[:n_policy], inverse[n_policy:]
    count_p = np.bincount(policy_bin, minlength=n_bins)
    count_r = np.bincount(reference_bin, minlength=n_bins)
    keep = (count_p >= minimum) & (count_r >= minimum)
    if not keep.any():
        msg = (
            f"`policy_lengths` and `reference_lengths` must share at least one length bin of width {width} "
            f"holding >= {minimum} completions from each side (no common length range), got policy lengths "
            f"{int(p_lengths.min())}..{int(p_lengths.max())} and reference lengths "
            f"{int(r_lengths.min())}..{int(r_lengths.max())}."
        )
        raise InputError(msg)
    scale = max(float(np.max(np.abs(p_rewards))), float(np.max(np.abs(r_rewards))))
    if scale == 0.0:
        return 0.0
    sum_p = np.bincount(policy_bin, weights=p_rewards / scale, minlength=n_bins)
    sum_r = np.bincount(reference_bin, weights=r_rewards / scale, minlength=n_bins)
    kept_p, kept_r = count_p[keep], count_r[keep]
    difference = sum_p[keep] / kept_p - sum_r[keep] / kept_r
    weight = (kept_p + kept_r).astype(np.float64)
    gain = float(np.dot(difference, weight) / weight.sum()) * scale
    if not math.isfinite(gain):
        msg = f"`policy_rewards` must give a gain representable in float64 (rescale), got {gain}."
        raise InputError(msg)
    return gain


def length_trend(mean_lengths: object, *, method: TrendMethod = "ols") -> float:
    r"""Slope, in tokens per step, of the per-step mean completion length.

    A steadily rising mean length together with a rising reward is the classic length-exploitation
    trajectory. But reasoning tasks (math, code, long chain-of-thought under GRPO) grow length *on
    purpose* as the policy learns to think longer: a positive trend alone is not a hack, and a guard must
    not act on it without agreement from another signal (the predecessor tripped on exactly that).
    ``"theil_sen"`` ignores a few spiky steps (one batch of truncated completions).

    .. math::

        \hat\beta_{\mathrm{OLS}} = \frac{\sum_t (t - \bar t)(\bar L_t - \overline{\bar L})}
                                          {\sum_t (t - \bar t)^2},
        \qquad
        \hat\beta_{\mathrm{TS}} = \operatorname{median}_{i < j} \frac{\bar L_j - \bar L_i}{j - i}

    with :math:`t = 0, \dots, n - 1` the position in the series (pass equally spaced steps, e.g. TRL's
    ``completions/mean_length`` read at every step or every ``logging_steps``). A constant series gives
    ``0.0``.

    Args:
        mean_lengths: Mean completion length per step, 1-D, finite, ``>= 0``, at least 2 points; at most
            ``MAX_SERIES_LENGTH`` (10,000,000) points for ``"ols"`` and 4,096 for ``"theil_sen"``.
        method: ``"ols"`` (default) or ``"theil_sen"``.

    Returns:
        Tokens per step (per logged step if the series is subsampled).

    Raises:
        LoopguardTypeError: non-numbers or booleans, or a non-string ``method``.
        ConfigError: ``method`` is not one of the allowed names.
        InputError: not 1-D, fewer than 2 points, over the cap, NaN/Inf or negative values.

    Example:
        >>> length_trend([120.0, 131.0, 140.0, 152.0])
        10.5
        >>> length_trend([120.0, 131.0, 900.0, 152.0], method="theil_sen")  # one truncation spike
        10.83...

    References:
        Singhal et al. (2023), arXiv:2310.03716.

        Sen, P. K. (1968). Estimates of the regression coefficient based on Kendall's tau. Journal of the
        American Statistical Association 63(324).
    """
    return series_slope(mean_lengths, method=method, name="mean_lengths", nonnegative=True)
