"""How the Guard smooths each signal's score over steps and combines the signals into one vote.

Two small kinds of object, passed to :class:`~loopguard.Guard` as ``smoothing=`` and ``vote=``:

* smoothing (per signal, over steps): :class:`Median` (the median of the last ``window`` scores; default),
  :class:`EMA` (weight ``alpha`` on the new score) and :class:`NoSmoothing`. The arithmetic is
  :func:`loopguard.signals.rolling_median` and :func:`loopguard.signals.ema_update`.
* the vote (across signals, one step): :class:`Conservative` (default: the max when the scores disagree by
  more than ``tolerance``, else the mean), :class:`Mean`, :class:`Max` and :class:`KOfN` (the ``k``-th
  largest score).

The names ``"median"``, ``"ema"``, ``"none"``, ``"conservative"``, ``"mean"``, ``"max"`` and ``"k_of_n"`` are
shorthands for each object with its defaults.

Example:
    >>> from loopguard.scoring import Conservative, Median
    >>> Median(window=3).smooth([0.1, 0.5], 0.2, previous=0.3)
    ([0.1, 0.5, 0.2], 0.2)
    >>> Conservative(tolerance=0.2).combine([0.05, 0.6])
    0.6
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import attrs
import numpy as np

from loopguard._validation import check_choice, describe, integer, real
from loopguard.exceptions import LoopguardTypeError
from loopguard.signals import ema_update, rolling_median
from loopguard.signals._numeric import plain_mean

__all__ = [
    "EMA",
    "Conservative",
    "KOfN",
    "Max",
    "Mean",
    "Median",
    "NoSmoothing",
    "Smoother",
    "Vote",
    "as_smoother",
    "as_vote",
]


# -------------------------------------------------------------------------------------------- smoothing


def _plain(value: object) -> bool:
    """A finite Python float other than -0.0: its median is :func:`~loopguard.signals.rolling_median`'s bits.

    (The order of -0.0 and 0.0 among equal values is numpy's to choose; any other value is left to
    :func:`~loopguard.signals.rolling_median` too, which validates it.)
    """
    return type(value) is float and math.isfinite(value) and (value != 0.0 or math.copysign(1.0, value) > 0)


@attrs.frozen
class Smoother:
    """Base of the per-signal smoothers: :meth:`smooth` folds a new score into the recent ones."""

    name: ClassVar[str] = ""

    @property
    def memory(self) -> int:
        """How many recent scores the smoother keeps (the longest ``recent`` list a state may hold)."""
        return 1

    def smooth(self, recent: Sequence[float], score: float, *, previous: float) -> tuple[list[float], float]:
        """Return the new list of recent scores and the smoothed score.

        Args:
            recent: The scores kept so far for this signal (empty after the warm-up and after a rollback).
            score: This step's score.
            previous: The previous smoothed score (meaningless while ``recent`` is empty).
        """
        raise TypeError(f"{type(self).__name__} must define smooth()")  # pragma: no cover


@attrs.frozen
class Median(Smoother):
    """The median of the last ``window`` scores (a spike shorter than half the window does not show).

    Args:
        window: Scores per median, in [1, 1000]. Default 3.
    """

    name: ClassVar[str] = "median"
    window: int = attrs.field(default=3, validator=integer(lo=1, hi=1000))

    @property
    def memory(self) -> int:
        """The window."""
        return self.window

    def smooth(self, recent: Sequence[float], score: float, *, previous: float) -> tuple[list[float], float]:
        """Append ``score`` to the window and take its median."""
        kept = [*recent, score][-self.window :]
        if all(map(_plain, kept)):  # the same arithmetic, without the array round trip
            ordered = sorted(kept)
            low, high = ordered[(len(ordered) - 1) // 2], ordered[len(ordered) // 2]
            middle = (low + high) / 2.0
            return kept, middle if math.isfinite(middle) else 0.5 * low + 0.5 * high
        return kept, float(rolling_median(kept, window=self.window)[-1])  # raises for a bad value


@attrs.frozen
class EMA(Smoother):
    """An exponential moving average of the scores, started at the first score.

    Args:
        alpha: Weight on the new score, in (0, 1]. Default 0.5.
    """

    name: ClassVar[str] = "ema"
    alpha: float = attrs.field(default=0.5, validator=real(lo=0.0, hi=1.0, lo_inclusive=False))

    def smooth(self, recent: Sequence[float], score: float, *, previous: float) -> tuple[list[float], float]:
        """Fold ``score`` into the average (the first score starts it)."""
        smoothed = score if not recent else ema_update(previous, score, alpha=self.alpha)
        return [score], smoothed


@attrs.frozen
class NoSmoothing(Smoother):
    """Each step's score as it is."""

    name: ClassVar[str] = "none"

    def smooth(self, recent: Sequence[float], score: float, *, previous: float) -> tuple[list[float], float]:
        """Return ``score`` unchanged (nothing is kept)."""
        return [], score


# ------------------------------------------------------------------------------------------------- votes


@attrs.frozen
class Vote:
    """Base of the vote rules: :meth:`combine` turns the voting signals' scores into one score."""

    name: ClassVar[str] = ""

    def combine(self, scores: Sequence[float]) -> float:
        """The vote of a non-empty list of scores in [0, 1]."""
        raise TypeError(f"{type(self).__name__} must define combine()")  # pragma: no cover


@attrs.frozen
class Conservative(Vote):
    """The max when the scores disagree by more than ``tolerance``, else their mean.

    One strong signal trips the Guard even when the others are quiet, while agreeing signals are averaged.

    Args:
        tolerance: Spread (max - min) above which the max is taken, in [0, 1]. Default 0.2.
    """

    name: ClassVar[str] = "conservative"
    tolerance: float = attrs.field(default=0.2, validator=real(lo=0.0, hi=1.0))

    def combine(self, scores: Sequence[float]) -> float:
        """Max on disagreement, mean otherwise."""
        spread = max(scores) - min(scores)
        if spread > self.tolerance:
            return max(scores)
        return float(plain_mean(np.asarray(scores, dtype=np.float64)))  # np.mean's arithmetic, no wrappers


@attrs.frozen
class Mean(Vote):
    """The mean of the scores."""

    name: ClassVar[str] = "mean"

    def combine(self, scores: Sequence[float]) -> float:
        """The mean."""
        return float(np.mean(scores))


@attrs.frozen
class Max(Vote):
    """The largest score (any one signal trips)."""

    name: ClassVar[str] = "max"

    def combine(self, scores: Sequence[float]) -> float:
        """The max."""
        return max(scores)


@attrs.frozen
class KOfN(Vote):
    """The ``k``-th largest score: ``k`` signals must agree (all of them when fewer vote).

    Args:
        k: Which largest score, in [1, 64]. Default 2.
    """

    name: ClassVar[str] = "k_of_n"
    k: int = attrs.field(default=2, validator=integer(lo=1, hi=64))

    def combine(self, scores: Sequence[float]) -> float:
        """The k-th largest."""
        ordered = sorted(scores, reverse=True)
        return ordered[min(self.k, len(ordered)) - 1]


_SMOOTHERS: dict[str, type[Smoother]] = {cls.name: cls for cls in (Median, EMA, NoSmoothing)}
_VOTES: dict[str, type[Vote]] = {cls.name: cls for cls in (Conservative, Mean, Max, KOfN)}


def as_smoother(value: object) -> Smoother:
    """A :class:`Smoother` from an object or its shorthand name (``"median"``, ``"ema"``, ``"none"``).

    Raises:
        ConfigError: an unknown name.
        LoopguardTypeError: neither a name nor a Smoother.
    """
    return _resolve("smoothing", value, Smoother, _SMOOTHERS)  # type: ignore[return-value]


def as_vote(value: object) -> Vote:
    """A :class:`Vote` from an object or its shorthand name (``"conservative"``, ``"mean"``, ...).

    Raises:
        ConfigError: an unknown name.
        LoopguardTypeError: neither a name nor a Vote.
    """
    return _resolve("vote", value, Vote, _VOTES)  # type: ignore[return-value]


def _resolve(name: str, value: object, base: type, table: dict[str, type]) -> object:
    if isinstance(value, base):
        return value
    if isinstance(value, str):
        return table[check_choice(name, value, sorted(table))]()
    names = ", ".join(repr(key) for key in sorted(table))
    msg = f"`{name}` must be a {base.__name__} or one of {names}, got {describe(value)}."
    raise LoopguardTypeError(msg)
