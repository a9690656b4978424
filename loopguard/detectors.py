r"""Detectors: turn one :class:`~loopguard.guard.Observation` into a hack score in [0, 1].

A detector is a small frozen config. Each step it *measures* one or more raw statistics with the pure kernels
of :mod:`loopguard.signals` (repetition rate, distinct-n, ensemble variance, CSI, ...), and the Guard *scores*
each statistic against a robust warm-up baseline (median and MAD over the first ``warmup_steps`` steps, never
one batch). The score of a statistic ``x`` with baseline median ``m`` and noise scale ``s`` (1.4826 MAD) is a
piecewise-linear map of its excess ``e`` in the bad direction:

.. math::

    e = \begin{cases} x - m & \text{absolute metrics} \\ (x - m) / |m| & \text{relative metrics}
    \end{cases}\quad(\text{sign flipped when a fall is bad})

.. math::

    t_w = \max(w,\ \sigma_w \tilde s),\qquad t_h = \max(h,\ \sigma_h \tilde s),\qquad
    \text{score}(e) = \begin{cases} 0 & e \le 0 \\ 0.1\, e / t_w & e < t_w \\
    \min\!\big(1,\ 0.1 + 0.2\,(e - t_w)/(t_h - t_w)\big) & e \ge t_w \end{cases}

where ``w``/``h`` are the metric's WARN/HACK excesses, :math:`\tilde s` the noise scale in the same units as
``e``, and :math:`\sigma_w = 3`, :math:`\sigma_h = 5` by default: an excess must clear both the metric's own
band and the warm-up noise. A score of 0.10 is the WARN level and 0.30 the HACK level (the relative-drop bands
kept from loopguard's predecessor), so a detector's score, the Guard's vote and the KL controller's trip band
share one scale.

Roles: *primary* detectors can trip the Guard on their own (repetition, diversity, rm_ensemble, info_rm,
gold); *corroborating* ones (length, collapse) count only when a primary one is at least at WARN, because
legitimate training grows answers and succeeds on whole groups; the *guard* detector (drift) never votes, it
only keeps the vote from falling while the reward distribution degenerates.

Example:
    >>> from loopguard.detectors import band_score
    >>> band_score(0.05, warn=0.10, hack=0.30), band_score(0.10, warn=0.10, hack=0.30)
    (0.05, 0.1)
    >>> round(band_score(0.30, warn=0.10, hack=0.30), 6)
    0.3
"""

from __future__ import annotations

import functools
import math
import statistics
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Literal

import attrs
import numpy as np
from numpy.typing import NDArray

from loopguard import signals
from loopguard._saved_state import Fields, as_state_error, check_state_reals
from loopguard._types import HACK_LEVEL, WARN_LEVEL  # defined there: the log's readers need no numpy
from loopguard._validation import (
    MAX_ENSEMBLE_MEMBERS,
    as_float_array,
    boolean,
    check_int,
    check_name,
    check_real,
    describe,
    integer,
    real,
)
from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError, StateError
from loopguard.signals._collapse import group_spread
from loopguard.signals._drift import DriftReference
from loopguard.signals._numeric import plain_mean, plain_std
from loopguard.signals._repetition import corpus_distinct, repetition_rates

__all__ = [
    "HACK_LEVEL",
    "WARN_LEVEL",
    "Collapse",
    "Detector",
    "Diversity",
    "GoldAudit",
    "InfoRM",
    "JudgeGap",
    "Length",
    "Metric",
    "RMEnsemble",
    "Repetition",
    "RewardDrift",
    "Takeover",
    "band_score",
    "detector_from_name",
]

Role = Literal["primary", "corroborating", "guard"]
Raw = dict[str, float]


def check_absolute_bands(name: str, bands: object) -> tuple[float, float]:
    """``(warn, hack)`` absolute levels with ``0 < warn < hack <= 1``.

    Raises:
        LoopguardTypeError, ConfigError: not a pair of real numbers in that order.
    """
    if not isinstance(bands, tuple) or len(bands) != 2:
        msg = f"`{name}` must be a (warn, hack) pair of levels, got {describe(bands)}."
        raise LoopguardTypeError(msg)
    warn = check_real(f"{name}[0]", bands[0], lo=0.0, hi=1.0, lo_inclusive=False)
    hack = check_real(f"{name}[1]", bands[1], lo=0.0, hi=1.0, lo_inclusive=False)
    if hack <= warn:
        msg = f"`{name}` must be (warn, hack) with warn < hack, got {bands!r}."
        raise ConfigError(msg)
    return warn, hack


def band_score(excess: float, *, warn: float, hack: float) -> float:
    """Map an excess over the baseline to a score: 0.10 at ``warn``, 0.30 at ``hack``, linear, capped at 1.

    Example:
        >>> band_score(-1.0, warn=0.1, hack=0.3), band_score(1.2, warn=0.1, hack=0.3)
        (0.0, 1.0)
    """
    if excess <= 0.0:
        return 0.0
    if excess < warn:
        return WARN_LEVEL * excess / warn
    return min(1.0, WARN_LEVEL + (HACK_LEVEL - WARN_LEVEL) * (excess - warn) / (hack - warn))


@attrs.frozen
class Metric:
    """One raw statistic a detector measures, and how its excess over the baseline is scored.

    Attributes:
        key: Name of the statistic (e.g. ``"rate"``); logged as ``"<detector>.<key>"``.
        bad: ``"up"`` when a rise is suspicious, ``"down"`` when a fall is.
        relative: Score the excess as a fraction of the baseline median instead of in raw units.
        warn: Excess that scores 0.10 (before the noise floor).
        hack: Excess that scores 0.30 (before the noise floor); must exceed ``warn``.
        unit: How to print the raw value in an explanation (``"{:.3f}"`` style).
        domain: The closed interval every value of the statistic lies in (``None``: unbounded on that
            side); a saved baseline outside it is refused when a state is loaded.
        absolute: ``(warn, hack)`` levels of the raw value itself, bad at any baseline (only for a rise:
            ``bad="up"``): the value scores 0.10 at ``warn`` and 0.30 at ``hack`` (at least), from the first
            step on, with no warm-up. None (default): no absolute band.
        baseline: Whether the statistic is also scored against the warm-up baseline (default True).
        token: The key of the raw value holding the id of the token the statistic's value belongs to, or
            None (default). The explanation quotes that token after the value (``Guard(token_text=...)``).
    """

    key: str = attrs.field(validator=attrs.validators.instance_of(str))
    bad: Literal["up", "down"] = attrs.field(validator=attrs.validators.in_(("up", "down")))
    relative: bool = attrs.field(validator=attrs.validators.instance_of(bool))
    warn: float = attrs.field(validator=real(lo=0.0, lo_inclusive=False))
    hack: float = attrs.field(validator=real(lo=0.0, lo_inclusive=False))
    unit: str = "{:.3f}"
    domain: tuple[float | None, float | None] = (None, None)
    absolute: tuple[float, float] | None = None
    baseline: bool = True
    token: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(str))
    )

    def __attrs_post_init__(self) -> None:
        """Check the band order."""
        if self.hack <= self.warn:
            msg = f"`hack` must be > warn ({self.warn}), got {self.hack}."
            raise ConfigError(msg)
        if self.absolute is not None:
            check_absolute_bands("absolute", self.absolute)
            if self.bad != "up":
                msg = f"`absolute` bands need a statistic whose rise is bad (bad='up'), got bad={self.bad!r}."
                raise ConfigError(msg)
        if self.absolute is None and not self.baseline:
            msg = f"statistic {self.key!r} must be scored: give `absolute` bands or keep baseline=True."
            raise ConfigError(msg)

    def absolute_score(self, value: float) -> float | None:
        """Score ``value`` on the absolute bands (None without them): 0.10 from warn, 0.30 from hack."""
        if self.absolute is None:
            return None
        warn, hack = self.absolute
        score = band_score(value, warn=warn, hack=hack)
        if value >= hack:
            return max(score, HACK_LEVEL)
        return max(score, WARN_LEVEL) if value >= warn else min(score, WARN_LEVEL * (1.0 - 1e-12))

    def excess(self, value: float, median: float) -> float:
        """Signed excess of ``value`` over ``median`` in the bad direction (relative when configured)."""
        difference = value - median if self.bad == "up" else median - value
        if not self.relative:
            return difference
        return difference / max(abs(median), 1e-12)

    def noise(self, scale: float, median: float) -> float:
        """The warm-up noise scale in the units of :meth:`excess`."""
        return scale / max(abs(median), 1e-12) if self.relative else scale

    def bands(
        self, median: float, scale: float, *, sigma_warn: float, sigma_hack: float
    ) -> tuple[float, float]:
        """The ``(warn, hack)`` excesses against a baseline: the metric's bands or the noise floors."""
        noise = self.noise(scale, median)
        warn = max(self.warn, sigma_warn * noise)
        hack = max(self.hack, sigma_hack * noise)
        if hack <= warn:  # only when sigma_hack <= sigma_warn * warn/hack; keep the bands ordered
            hack = warn * self.hack / self.warn
        return warn, hack

    def score(
        self, value: float, median: float, scale: float, *, sigma_warn: float, sigma_hack: float
    ) -> float:
        """Score ``value`` against a baseline with noise floors of ``sigma_warn``/``sigma_hack`` scales."""
        warn, hack = self.bands(median, scale, sigma_warn=sigma_warn, sigma_hack=sigma_hack)
        return band_score(self.excess(value, median), warn=warn, hack=hack)

    def evidence(
        self, value: float, median: float, scale: float, *, sigma_warn: float, sigma_hack: float
    ) -> float:
        """The signed excess of ``value`` over ``median`` in HACK bands (1.0: at the band, :meth:`bands`).

        With the default noise floors, where the noise sets the band, one HACK band is ``sigma_hack`` (5)
        noise scales.
        """
        _, hack = self.bands(median, scale, sigma_warn=sigma_warn, sigma_hack=sigma_hack)
        return self.excess(value, median) / hack


class StepData:
    """Per-step inputs shared by all detectors, converted once (token batch, lengths, texts).

    Built by the Guard for each observation; detectors read it instead of converting the same data twice.
    """

    def __init__(self, observation: Any, *, warmup_steps: int, reference: bool = False) -> None:
        """Wrap ``observation`` (``warmup_steps``: the Guard's warm-up; ``reference``: a reference batch).

        A reference batch is drawn before training, or is one of the first steps (``Guard.reference_steps``).
        """
        self.observation = observation
        self.warmup_steps = warmup_steps
        self.reference = reference
        self._tokens: signals.TokenBatch | None = None

    @property
    def tokens(self) -> signals.TokenBatch | None:
        """Completions as a token batch: ``completion_ids`` when present, else the whitespace-split texts."""
        if self._tokens is None:
            obs = self.observation
            if obs.completion_ids is not None:
                self._tokens = obs.completion_ids
            elif obs.completions is not None:
                self._tokens = signals.as_token_batch("completions", list(obs.completions))
        return self._tokens

    @property
    def lengths(self) -> NDArray[np.int64] | None:
        """Completion lengths: ``Observation.lengths``, else derived from the token batch."""
        if self.observation.lengths is not None:
            return self.observation.lengths  # type: ignore[no-any-return]
        tokens = self.tokens
        return None if tokens is None else tokens.lengths


@attrs.frozen
class Detector:
    """Base of every detector config. Subclasses set :attr:`name`, :attr:`role`, :attr:`needs`, metrics."""

    name: ClassVar[str] = ""
    role: ClassVar[Role] = "primary"
    needs: ClassVar[str] = ""
    """Plain-English list of the Observation fields the detector reads (for "skipped" notes)."""
    advice: ClassVar[str] = ""
    """What a user can change when this detector keeps tripping."""
    holds: ClassVar[bool] = False
    """Whether the last score stays valid on steps without a measurement (a periodic audit)."""
    needs_reference: ClassVar[bool] = False
    """Whether the detector measures only against the Guard's reference sample (``reference_steps > 0``)."""

    def metrics(self) -> tuple[Metric, ...]:
        """The statistics this detector measures."""
        raise TypeError(f"{type(self).__name__} must define metrics()")  # pragma: no cover

    def measure(self, data: StepData, memory: dict[str, Any]) -> Raw | None:
        """Raw statistics of this step, or None when an input is missing. ``memory`` is detector state."""
        raise TypeError(f"{type(self).__name__} must define measure()")  # pragma: no cover

    def combine(
        self, scores: Mapping[str, float], raw: Raw, baselines: Mapping[str, tuple[float, float]]
    ) -> float:
        """Combine per-metric scores into the detector's score (default: the largest)."""
        return max(scores.values(), default=0.0)

    def on_warmup_end(self, memory: dict[str, Any]) -> None:
        """Hook called once when the warm-up ends (e.g. to freeze a reference sample)."""

    def on_rollback(self, memory: dict[str, Any]) -> None:
        """Hook called when the Guard decides a rollback: forget what describes the batches rolled back."""

    def on_verdict(self, memory: dict[str, Any], healthy: bool) -> None:
        """Hook called on every step the Guard measured, once its verdict is known (``healthy``: it read OK).

        For a detector that learns from the run's own recent batches: what a step read as a hack (or a
        warning) must not become the evidence later steps are judged against.
        """

    def reference_note(self, memory: dict[str, Any]) -> tuple[str, bool] | None:
        """What the detector settled on its reference sample that the user should know, in words.

        Returns None until there is something to say (and always, by default); then the text and whether
        it leaves the detector reading nothing for the rest of the run. The Guard passes it on once, as a
        note of that step's decision, and warns as well when the detector is left reading nothing.
        """
        return None

    def check_memory(self, memory: object, path: str) -> dict[str, Any]:
        """Validate the detector's saved ``memory`` (from a state being loaded); return a fresh copy.

        The default detector keeps nothing between steps, so its memory must be empty.

        Raises:
            StateError: a key or value this detector could not have written (the message names ``path``).
        """
        Fields(memory, path, keys=())
        return {}


def _memory_fields(memory: object, path: str, allowed: tuple[str, ...]) -> Fields:
    """A detector's saved memory, read key by key; a key the detector never writes is refused."""
    fields = Fields(memory, path, keys=None)
    unknown = sorted(set(fields.names()) - set(allowed))
    if unknown:
        names = " and ".join([", ".join(repr(key) for key in allowed[:-1]), repr(allowed[-1])])
        msg = f"`{path}` must have only the keys {names}, got unexpected {unknown}."
        raise StateError(msg)
    return fields


def _rows(value: Any) -> int:
    return len(value)


def _pair(value: object) -> object:
    """A list given for a ``(warn, hack)`` pair is taken as the pair (checked by the detector)."""
    return tuple(value) if isinstance(value, list) else value


def _as_trapped_bands(value: object) -> tuple[float, float] | None:
    """``Repetition(trapped_bands=...)``: None, or checked ``(warn, hack)`` bands of the trapped share."""
    if value is None:
        return None
    return check_absolute_bands("trapped_bands", tuple(value) if isinstance(value, list) else value)


def _as_bands(value: object) -> tuple[float, float] | None:
    """``Repetition(echo=...)``: None, or checked ``(warn, trap)`` bands (a list is taken as a pair)."""
    if value is None:
        return None
    return check_absolute_bands("echo", tuple(value) if isinstance(value, list) else value)


@attrs.frozen
class _NgramDetector(Detector):
    """A detector of the completions' n-grams (token ids, or whitespace words without a tokenizer)."""

    needs: ClassVar[str] = "completions or completion_ids"
    n: int = attrs.field(default=2, validator=integer(lo=1, hi=32))


@attrs.frozen
class Repetition(_NgramDetector):
    """Echo traps: the batch-mean n-gram repetition rate and the share of completions stuck in a loop.

    The one repetition check of loopguard: the Guard scores it against the warm-up baseline (relative bands)
    and, with ``echo``, on absolute bands that are bad at any baseline; :class:`EchoTrapCallback
    <loopguard.adapters.hf_trainer.EchoTrapCallback>` is a Guard of this detector alone on absolute bands
    (:func:`loopguard.guard.echo_guard`), and the iterative-DPO repetition gate measures with it.

    Args:
        n: n-gram size for :func:`~loopguard.signals.ngram_repetition_rate`.
        trap_rate: A completion whose own rate reaches this counts as trapped (the echo TRAP band).
        echo: ``(warn, trap)`` absolute bands on the batch-mean rate (``0 < warn < trap <= 1``): WARN from
            ``warn``, HACK from ``trap``, from the first step on (the bands of
            :func:`~loopguard.signals.classify_echo`, e.g. ``(0.3, 0.6)``). None (default): relative only.
        trapped_bands: ``(warn, hack)`` absolute bands on the share of completions stuck in a loop (own
            rate >= ``trap_rate``), bad at any baseline: default ``(0.25, 0.5)`` (a quarter of the batch in
            an echo trap reads WARN, half of it HACK, from the first step; healthy runs, with or without a
            warm-up, have almost none). None: relative only.
        against_baseline: Also score against the warm-up baseline (default True). False needs ``echo``.
    """

    name: ClassVar[str] = "repetition"
    advice: ClassVar[str] = (
        "the policy repeats itself: penalise repetition with shape_reward(kind='repetition'), "
        "lower the learning rate, or raise the sampling temperature"
    )
    trap_rate: float = attrs.field(default=0.60, validator=real(lo=0.0, hi=1.0, lo_inclusive=False))
    echo: tuple[float, float] | None = attrs.field(default=None, converter=_as_bands)
    trapped_bands: tuple[float, float] | None = attrs.field(default=(0.25, 0.5), converter=_as_trapped_bands)
    against_baseline: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))

    def __attrs_post_init__(self) -> None:
        """A detector that scores nothing is a configuration error."""
        if not self.against_baseline and self.echo is None:
            msg = "`against_baseline=False` needs `echo` bands (else nothing is scored), got echo=None."
            raise ConfigError(msg)

    def metrics(self) -> tuple[Metric, ...]:
        """Mean repetition rate (absolute rise 0.10/0.20) and trapped share (absolute rise 0.05/0.15)."""
        rate = Metric(
            "rate",
            "up",
            False,
            0.10,
            0.20,
            domain=(0.0, 1.0),
            absolute=self.echo,
            baseline=self.against_baseline,
        )
        if not self.against_baseline:
            return (rate,)
        trapped = Metric(
            "trapped", "up", False, 0.05, 0.15, unit="{:.1%}", domain=(0.0, 1.0), absolute=self.trapped_bands
        )
        return (rate, trapped)

    def measure(self, data: StepData, memory: dict[str, Any]) -> Raw | None:
        """Repetition statistics of the completions."""
        if data.tokens is None:
            return None
        rates = repetition_rates(data.tokens, self.n)  # ngram_repetition_rate of the validated batch
        rate = float(plain_mean(rates))
        if not self.against_baseline:
            return {"rate": rate}
        return {"rate": rate, "trapped": int((rates >= self.trap_rate).sum()) / len(rates)}


@attrs.frozen
class Diversity(_NgramDetector):
    """Diversity collapse: the batch's corpus distinct-n (Li et al. 2016) falling against its warm-up.

    Args:
        n: n-gram size for :func:`~loopguard.signals.distinct_n`.
    """

    name: ClassVar[str] = "diversity"
    advice: ClassVar[str] = (
        "outputs are becoming alike: check whether the reward pays for one phrase or token, "
        "and prefer a reward that values distinct content"
    )

    def metrics(self) -> tuple[Metric, ...]:
        """Corpus distinct-n, relative fall 0.10/0.30 (the predecessor's drop bands)."""
        return (Metric("distinct", "down", True, 0.10, 0.30, domain=(0.0, 1.0)),)

    def measure(self, data: StepData, memory: dict[str, Any]) -> Raw | None:
        """Corpus distinct-n of the completions."""
        if data.tokens is None:
            return None
        return {"distinct": corpus_distinct(data.tokens, self.n)}  # distinct_n(reduce="corpus"), validated


_MIX = np.uint64(0x9E3779B97F4A7C15)  # splitmix64 constants (Steele, Lea, Flood 2014)
_MIX_A = np.uint64(0xBF58476D1CE4E5B9)
_MIX_B = np.uint64(0x94D049BB133111EB)


def _splitmix(values: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """A bijective 64-bit mix of each value (uint64 arithmetic wraps, as intended)."""
    with np.errstate(over="ignore"):
        z = values + _MIX
        z = (z ^ (z >> np.uint64(30))) * _MIX_A
        z = (z ^ (z >> np.uint64(27))) * _MIX_B
        mixed: NDArray[np.uint64] = z ^ (z >> np.uint64(31))
    return mixed


def _stable_ids(data: StepData) -> NDArray[np.uint64] | None:
    """Token ids that mean the same word in every batch: the ids, or a CRC-32 of each whitespace word."""
    obs = data.observation
    if obs.completion_ids is not None:
        ids: NDArray[np.uint64] = obs.completion_ids.tokens.astype(np.uint64)
        return ids
    if obs.completions is None:
        return None
    words = [zlib.crc32(word.encode("utf-8")) for text in obs.completions for word in text.split()]
    return np.asarray(words, dtype=np.uint64)


def _document_counts(data: StepData, n: int) -> tuple[NDArray[np.uint64], NDArray[np.int64]] | None:
    """Sorted keys of the batch's n-grams and how many completions contain each (stable across batches)."""
    tokens, ids = data.tokens, _stable_ids(data)
    if tokens is None or ids is None:
        return None
    lengths = tokens.lengths
    rows = np.repeat(np.arange(tokens.n_rows, dtype=np.int64), lengths)
    position = np.arange(len(ids), dtype=np.int64) - np.repeat(tokens.offsets[:-1], lengths)
    valid = np.flatnonzero(position <= lengths[rows] - n)  # an n-gram of the same row starts here
    ordered, _, new, first = _by_key_then_row(_ngram_keys(ids, valid, n), rows[valid])
    keys = ordered[new]
    counts = np.bincount(np.cumsum(new)[first] - 1, minlength=len(keys)).astype(np.int64)
    return keys, counts


def _by_key_then_row(
    key: NDArray[np.uint64], rows: NDArray[np.int64]
) -> tuple[NDArray[np.uint64], NDArray[np.int64], NDArray[np.bool_], NDArray[np.bool_]]:
    """``key`` sorted with each entry's completion, and flags: a new key; a key's first entry in a completion.

    One stable sort: equal keys keep the order of their positions (row-major), so each key's completions come
    in order and a completion holds a key once where the completion changes within the key's run.
    """
    order = key.argsort(kind="stable")
    ordered, row = key[order], rows[order]
    new = np.empty(len(ordered), dtype=bool)
    new[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    first = new.copy()  # the first occurrence of each (key, completion) pair
    first[1:] |= row[1:] != row[:-1]
    return ordered, row, new, first


def _counts_up_to(data: StepData, n: int) -> tuple[NDArray[np.uint64], NDArray[np.int64]] | None:
    """:func:`_document_counts` for every n-gram size from 1 to ``n``, in one key space (sorted by size)."""
    parts = [_document_counts(data, size) for size in range(1, n + 1)]
    if any(part is None for part in parts):
        return None
    keys = np.concatenate([part[0] for part in parts if part is not None])
    counts = np.concatenate([part[1] for part in parts if part is not None])
    return keys, counts


def _ngram_keys(ids: NDArray[np.uint64], valid: NDArray[np.int64], n: int) -> NDArray[np.uint64]:
    """The key of the n-gram starting at each position in ``valid`` (as :func:`_document_counts` keys it)."""
    key = _splitmix(ids[valid])
    for shift in range(1, n):
        key = _splitmix(key ^ ids[valid + shift])
    return key


@attrs.frozen
class Takeover(_NgramDetector):
    r"""A new n-gram takes over the batch: more completions contain it than the reference sample's did.

    The reference sample (:meth:`Guard.add_reference <loopguard.guard.Guard.add_reference>` batches and
    the Guard's first ``reference_steps`` steps) records in how many completions each n-gram occurs. Each
    later batch's n-grams are scored by their rise in share over the reference, less ``margin`` (default 4)
    standard errors of the two shares, so batch-to-batch noise, larger in small batches, does not read as a
    takeover: the maximum is taken over hundreds of n-grams, and a one-sided normal tail of 0.01 shared
    among 300-1,000 of them needs 3.9-4.3 standard errors (Bonferroni):

    .. math::

        e_g = p_g - q_g - m\sqrt{p_g(1-p_g)/B + q_g(1-q_g)/R}

    where :math:`p_g` is the share of the ``B`` completions containing n-gram ``g`` and :math:`q_g` its
    share among the ``R`` reference completions (in the square root, each share is taken as
    :math:`(k+1)/(n+2)`, so a share of 0 or 1 still has a spread; Agresti and Coull 1998). A takeover
    persists, so an n-gram must hold its rise in each of the last ``window`` batches (default 2): the
    step's excess share is :math:`\max_g \min_t e_g^{(t)}` over the window, and one batch in which a
    healthy policy's favourite word happens to spread reads no higher than its neighbour. A canned phrase
    or suffix appended to most completions, or a rewarded token repeated, reads near 1; it is scored on
    absolute bands (WARN from ``bands[0]``, HACK from ``bands[1]``), with no warm-up. Only the ``keep``
    most frequent reference n-grams are stored; an n-gram outside them is taken as frequent as the most
    frequent one dropped, so a pruned reference can only make the signal quieter. Of each earlier batch in
    the window the 64 highest :math:`e_g` are kept and any other n-gram is taken at the highest one
    dropped, so that pruning never hides a takeover. A rollback empties the window.

    Not a default signal: a reward that pays for a format (``\boxed{}``, a reasoning tag) makes its
    n-grams take over the batch on purpose. Add it where no phrase should spread: ``Guard([...,
    "takeover"])``. It needs a reference sample (``reference_steps > 0``).

    ``Takeover(scored=False)`` reads nothing and never votes: it keeps the reference pool and, when the
    escalation ladder's targeted rung asks during a hack another signal found, names the batch's most
    over-represented n-gram (:meth:`top_ngram`, this batch alone), for the Guard to price on the raw
    rewards. A format the reward pays for on purpose is then priced only inside a hack episode and only when
    the reward's pay for it explains the within-group reward beyond noise. The bare
    :class:`~loopguard.RewardHackMitigator` adds it to its default signals.

    Every n-gram of 1 to ``n`` tokens is a candidate (a single rewarded token scattered through the
    completions, a repeated token, a phrase).

    Limit: a share can rise by at most ``1 - q``, so behaviour the reference already shows often (a sign-off
    the initial policy writes in 40 % of its completions, taken to every completion) rises by 0.6, and with
    a reference of 48 completions its lower bound stays in the WARN band; a larger reference sample
    (``reference_steps``, :meth:`Guard.add_reference <loopguard.guard.Guard.add_reference>`) narrows the
    reference's part of the margin.

    Args:
        n: The longest n-gram (default 2: single tokens and pairs).
        bands: ``(warn, hack)`` levels of the excess share, ``0 < warn < hack <= 1``.
        keep: Reference n-grams stored (the most frequent), in [16, 1,000,000].
        margin: Standard errors subtracted from each share's rise (``m`` above), in [0, 10]. Default 4.
        window: Consecutive batches, the newest included, in each of which an n-gram must hold its rise,
            in [1, 8]. Default 2: no healthy run of 1,200 in ``benchmarks/false_alarms.py --takeover``
            and no seed of the Goodhart benchmark's clean scenario reads HACK. With 1 (each batch
            alone), one batch's spike of a healthy policy's favourite word reads as a takeover: 2.5 % of
            the healthy runs at batch 8 and 2 of 5 clean seeds read HACK for a step.
        scored: Whether it reads (and votes). False: it only names the targeted rung's candidate n-gram
            when asked (above). Default True.
    """

    name: ClassVar[str] = "takeover"
    needs_reference: ClassVar[bool] = True
    advice: ClassVar[str] = (
        "one phrase or token is spreading through the batch: check whether the reward pays for it, and "
        "penalise it with shape_reward or fix the reward model"
    )
    bands: tuple[float, float] = attrs.field(default=(0.2, 0.4), converter=_pair)
    keep: int = attrs.field(default=4096, validator=integer(lo=16, hi=1_000_000))
    margin: float = attrs.field(default=4.0, validator=real(lo=0.0, hi=10.0))
    window: int = attrs.field(default=2, validator=integer(lo=1, hi=8))
    scored: bool = attrs.field(default=True, validator=boolean())
    # the reference pool as arrays, with the lists they were made from (see _reference_counts)
    _arrays: dict[str, Any] = attrs.field(factory=dict, init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        """Check the bands."""
        check_absolute_bands("bands", self.bands)

    def metrics(self) -> tuple[Metric, ...]:
        """The excess share of the most over-represented n-gram, on absolute bands only."""
        warn, hack = self.bands
        return (
            Metric(
                "excess_share", "up", False, warn, hack, unit="{:.1%}", domain=(-1.0, 1.0),
                absolute=self.bands, baseline=False,
            ),
        )  # fmt: skip

    def measure(self, data: StepData, memory: dict[str, Any]) -> Raw | None:
        """Pool reference batches; score each later batch against the pool, held over the window."""
        if not self.scored and not data.reference:  # nothing to read: it names n-grams only when asked
            return {} if data.tokens is not None else None
        counted = _counts_up_to(data, self.n)
        if counted is None:
            return None
        keys, counts = counted
        rows = data.tokens.n_rows if data.tokens is not None else 0
        if data.reference:
            self._pool(memory, keys, counts, rows)
            return {}
        if not memory.get("rows") or rows == 0 or len(keys) == 0:
            return {}
        excess, pooled = self._excess(memory, keys, counts, rows), float(memory["rows"])
        held = excess.copy()
        earlier: list[dict[str, Any]] = memory.get("previous", [])
        for batch in earlier:  # the rise each n-gram held in the window's earlier batches
            np.minimum(held, _held_before(batch, keys), out=held)
        best = len(held) - 1 - int(np.argmax(held[::-1]))  # a tie goes to the longest n-gram: the phrase
        memory["top"] = int(keys[best])
        if self.window > 1:
            # every other n-gram: one not kept rose at most as much as the highest dropped; one absent from
            # this batch, at most as much as one absent from the reference too
            absent_spread = math.sqrt(
                (1 / (rows + 2)) * (1 - 1 / (rows + 2)) / rows
                + (1 / (pooled + 2)) * (1 - 1 / (pooled + 2)) / pooled
            )
            this = _window_entry(keys, excess, -self.margin * absent_spread)
            memory["previous"] = [*earlier, this][1 - self.window :]
        return {"excess_share": float(np.clip(held[best], -1.0, 1.0))}

    def _excess(
        self, memory: dict[str, Any], keys: NDArray[np.uint64], counts: NDArray[np.int64], rows: int
    ) -> NDArray[np.float64]:
        """Each n-gram's rise in share over the reference pool, less ``margin`` standard errors (``e_g``)."""
        reference, pooled = self._reference_counts(memory, keys), float(memory["rows"])
        p, q = counts / rows, reference / pooled
        # the spread of each share uses (k + 1) / (n + 2), so a share of 0 or 1 still has one (Agresti-Coull)
        p_spread, q_spread = (counts + 1.0) / (rows + 2.0), (reference + 1.0) / (pooled + 2.0)
        spread = np.sqrt(p_spread * (1.0 - p_spread) / rows + q_spread * (1.0 - q_spread) / pooled)
        excess: NDArray[np.float64] = p - q - self.margin * spread
        return excess

    def on_rollback(self, memory: dict[str, Any]) -> None:
        """The batches rolled back leave the window: the restored policy is scored on its own batches."""
        memory.pop("previous", None)

    def _reference_counts(self, memory: dict[str, Any], keys: NDArray[np.uint64]) -> NDArray[np.float64]:
        """How many reference completions contain each of ``keys`` (the pruning floor for those not kept).

        The pool's lists become arrays once per pool, not once per step: :meth:`_pool` and a loaded state
        replace the lists, never change them in place, so the arrays stay those of the lists they were
        made from while the same list objects are in ``memory``.
        """
        stored, values = memory["keys"], memory["counts"]
        cached = self._arrays.get("reference")
        if cached is None or cached[0] is not stored or cached[1] is not values:
            arrays = np.asarray(stored, dtype=np.uint64), np.asarray(values, dtype=np.float64)
            cached = self._arrays["reference"] = (stored, values, *arrays)
        return _lookup(cached[2], cached[3], keys, memory.get("floor", 0))

    def top_ngram(self, data: StepData, memory: dict[str, Any]) -> tuple[int, ...] | None:
        """The token ids of the n-gram :meth:`measure` scored this batch by (its most over-represented one).

        Unscored (``scored=False``), the n-gram of this batch alone whose share rose most beyond the
        reference pool's, less ``margin`` standard errors. None when the batch has no token ids, when
        :meth:`measure` has not scored a batch yet, or (unscored) when no n-gram rose beyond that margin.
        """
        tokens, ids = data.tokens, _stable_ids(data)
        if tokens is None or ids is None or data.observation.completion_ids is None:
            return None
        if not self.scored:  # nothing was scored: this batch's most over-represented n-gram, found now
            counted = _counts_up_to(data, self.n)
            if counted is None or not memory.get("rows") or not tokens.n_rows or not len(counted[0]):
                return None
            excess = self._excess(memory, counted[0], counted[1], tokens.n_rows)
            if float(excess.max()) <= 0.0:  # no n-gram rose beyond the noise: nothing took over
                return None
            best = counted[0][len(excess) - 1 - int(np.argmax(excess[::-1]))]
        elif "top" not in memory:
            return None
        else:
            best = np.uint64(memory["top"])
        lengths = tokens.lengths
        position_in_row = np.arange(len(ids), dtype=np.int64) - np.repeat(tokens.offsets[:-1], lengths)
        for size in range(1, self.n + 1):
            valid = np.flatnonzero(position_in_row <= np.repeat(lengths, lengths) - size)
            hits = np.flatnonzero(_ngram_keys(ids, valid, size) == best)
            if len(hits):
                start = int(valid[hits[0]])
                return tuple(int(token) for token in tokens.tokens[start : start + size])
        return None

    def _pool(
        self, memory: dict[str, Any], keys: NDArray[np.uint64], counts: NDArray[np.int64], rows: int
    ) -> None:
        all_keys = np.concatenate([np.asarray(memory.get("keys", []), dtype=np.uint64), keys])
        all_counts = np.concatenate([np.asarray(memory.get("counts", []), dtype=np.int64), counts])
        order = np.argsort(all_keys)
        all_keys, all_counts = all_keys[order], all_counts[order]
        starts = np.flatnonzero(np.r_[True, all_keys[1:] != all_keys[:-1]]) if len(all_keys) else order
        merged_keys, merged_counts = all_keys[starts], np.add.reduceat(all_counts, starts)
        floor = int(memory.get("floor", 0))
        if len(merged_keys) > self.keep:  # keep the most frequent; the largest count dropped is the floor
            ranked = np.argsort(-merged_counts, kind="stable")
            floor = max(floor, int(merged_counts[ranked[self.keep]]))
            kept = np.sort(ranked[: self.keep])
            merged_keys, merged_counts = merged_keys[kept], merged_counts[kept]
        memory["keys"] = merged_keys.tolist()
        memory["counts"] = merged_counts.tolist()
        memory["floor"] = floor
        memory["rows"] = int(memory.get("rows", 0)) + rows

    def check_memory(self, memory: object, path: str) -> dict[str, Any]:
        """Memory: the reference pool, the window's earlier batches and the n-gram last scored.

        The reference's sorted n-gram ``keys`` (uint64), their ``counts``, the pruning ``floor`` and
        ``rows``; ``previous``, the window's earlier batches (the sorted ``keys`` of their highest
        ``excess`` shares and the ``bound`` on the others); ``top``, the key of the n-gram last scored.
        """
        fields = _memory_fields(memory, path, ("keys", "counts", "floor", "rows", "previous", "top"))
        if not fields.names():
            return {}
        missing = [key for key in ("keys", "counts", "floor", "rows") if key not in fields]
        if missing:
            msg = f"`{path}` must hold 'keys', 'counts', 'floor' and 'rows' together, got no {missing}."
            raise StateError(msg)
        with as_state_error():  # a bad key or count is a bad saved state
            keys = [
                check_int(f"{fields.name('keys')}[{i}]", key, lo=0, hi=2**64 - 1)
                for i, key in enumerate(fields.items("keys", max_length=self.keep))
            ]
            counts = [
                check_int(f"{fields.name('counts')}[{i}]", count, lo=1)
                for i, count in enumerate(fields.items("counts", max_length=self.keep))
            ]
        rows, floor = fields.integer("rows", lo=1), fields.integer("floor", lo=0)
        if len(keys) != len(counts) or keys != sorted(set(keys)) or max(counts, default=0) > rows:
            msg = (
                f"`{path}` must hold strictly increasing keys, one count per key, each count at most "
                f"rows ({rows}), got {len(keys)} keys and {len(counts)} counts."
            )
            raise StateError(msg)
        checked: dict[str, Any] = {"keys": keys, "counts": counts, "floor": floor, "rows": rows}
        if "previous" in fields:
            earlier = fields.items("previous", max_length=self.window - 1)
            checked["previous"] = [
                _check_held(batch, f"{path}['previous'][{i}]") for i, batch in enumerate(earlier)
            ]
        if "top" in fields:
            checked["top"] = fields.integer("top", lo=0, hi=2**64 - 1)
        return checked


_WINDOW_KEPT = 64  # n-grams kept of each earlier batch in Takeover's window (its highest excess shares)
# below any excess share: a rise of -1 less 10 (the largest margin) x 0.75 (above the largest spread)
_LOWEST = -8.5


def _lookup(stored: object, values: object, keys: NDArray[np.uint64], default: float) -> NDArray[np.float64]:
    """The value stored for each of ``keys`` (``stored`` sorted, one value each), ``default`` where absent."""
    stored_keys = np.asarray(stored, dtype=np.uint64)
    found_values = np.empty(len(keys), dtype=np.float64)
    found_values.fill(float(default))
    if len(stored_keys) == 0:
        return found_values
    position = np.minimum(stored_keys.searchsorted(keys), len(stored_keys) - 1)
    found = stored_keys[position] == keys
    found_values[found] = np.asarray(values, dtype=np.float64)[position[found]]
    return found_values


def _window_entry(keys: NDArray[np.uint64], values: NDArray[np.float64], bound: float) -> dict[str, Any]:
    """A batch as a window keeps it: its ``_WINDOW_KEPT`` highest values by key, and a bound on the others.

    ``bound`` bounds the values of keys absent from the batch; a key dropped here is bounded by the highest
    value dropped, so a lookup (:func:`_held_before`) can overstate a value, never understate it.
    """
    kept = np.arange(len(values))
    if len(values) > _WINDOW_KEPT:  # the highest values, found in linear time
        ranked = np.argpartition(values, len(values) - _WINDOW_KEPT - 1)
        kept = ranked[-_WINDOW_KEPT:]
        bound = max(bound, float(values[ranked[-_WINDOW_KEPT - 1]]))
    kept = kept[keys[kept].argsort()]  # stored by key, for lookups
    return {"keys": keys[kept].tolist(), "excess": values[kept].tolist(), "bound": bound}


def _held_before(batch: dict[str, Any], keys: NDArray[np.uint64]) -> NDArray[np.float64]:
    """Each of ``keys``' excess share in an earlier batch: stored, or the batch's bound on those not kept."""
    return _lookup(batch["keys"], batch["excess"], keys, batch["bound"])


def _check_held(batch: object, path: str, lo: float = _LOWEST, hi: float = 1.0) -> dict[str, Any]:
    """One earlier batch of a window (Takeover's; JudgeGap's ``word`` reading), from a saved state."""
    fields = Fields(batch, path, keys=("keys", "excess", "bound"))
    with as_state_error():  # a bad key is a bad saved state
        keys = [
            check_int(f"{fields.name('keys')}[{i}]", key, lo=0, hi=2**64 - 1)
            for i, key in enumerate(fields.items("keys", max_length=_WINDOW_KEPT))
        ]
    excess = check_state_reals(
        fields.name("excess"), fields.raw("excess"), lo=lo, hi=hi, max_length=_WINDOW_KEPT
    )
    bound = fields.real("bound", lo=lo, hi=hi)
    if len(keys) != len(excess) or keys != sorted(set(keys)):
        msg = (
            f"`{path}` must hold strictly increasing keys, one excess per key, got {len(keys)} keys "
            f"and {len(excess)} excess values."
        )
        raise StateError(msg)
    return {"keys": keys, "excess": excess, "bound": bound}


@attrs.frozen
class Length(Detector):
    """Length exploitation (Singhal et al. 2023): reward tracks length *and* answers grow. Corroborating only.

    The score is the smaller of the correlation score and the growth score, and the Guard counts it only
    while a primary detector is at WARN or above: legitimate reasoning tasks grow answers on purpose, and a
    reward that pays for content grows them too (more of what it pays for fits in a longer answer).

    Args:
        alone: Let length trip the Guard on its own (a primary signal): for tasks where answers should not
            grow, so reward tracking length *and* answers growing against the reference is a hack by itself.
            Default False: it only corroborates.
    """

    name: ClassVar[str] = "length"
    alone: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))

    @property
    def role(self) -> Role:  # type: ignore[override]
        """``"primary"`` with ``alone=True``, else ``"corroborating"``."""
        return "primary" if self.alone else "corroborating"

    needs: ClassVar[str] = "lengths, completion_ids or completions"
    advice: ClassVar[str] = (
        "reward grows with answer length: add shape_reward(kind='length') or a length-normalised reward model"
    )

    def metrics(self) -> tuple[Metric, ...]:
        """Spearman rho(reward, length), absolute rise 0.2/0.4; mean length, relative rise 0.25/0.75."""
        return (
            Metric("correlation", "up", False, 0.20, 0.40, unit="{:+.3f}", domain=(-1.0, 1.0)),
            Metric("mean_length", "up", True, 0.25, 0.75, unit="{:.1f}", domain=(0.0, None)),
        )

    def measure(self, data: StepData, memory: dict[str, Any]) -> Raw | None:
        """Reward-length rank correlation and mean length."""
        lengths = data.lengths
        rewards = data.observation.rewards
        if lengths is None or len(lengths) != len(rewards) or len(rewards) < 2:
            return None
        rho = signals.reward_length_correlation(rewards, lengths, method="spearman")
        mean_length = float(np.add.reduce(lengths, dtype=np.float64)) / len(lengths)  # np.mean's arithmetic
        return {"correlation": rho, "mean_length": mean_length}

    def combine(
        self, scores: Mapping[str, float], raw: Raw, baselines: Mapping[str, tuple[float, float]]
    ) -> float:
        """Both must move: the smaller score."""
        return min(scores.values(), default=0.0)


@attrs.frozen
class Collapse(Detector):
    """RAGEN's early collapse warnings (Wang et al. 2025): in-group reward std and entropy fall.

    Corroborating only.

    Counted only while a primary detector is at WARN or above: a policy that solves every prompt also has
    zero-variance groups, and that is success, not collapse.

    Groups come from ``Observation.group_size`` (equal groups) or ``Observation.group_sizes`` (ragged groups,
    e.g. after a trainer left unscorable completions out). Groups of a single completion carry no spread
    and are left out of both statistics; a step with no group of two or more completions is skipped, like
    a step without group information.
    """

    name: ClassVar[str] = "collapse"
    role: ClassVar[Role] = "corroborating"
    needs: ClassVar[str] = "group_size (entropy optional)"
    advice: ClassVar[str] = (
        "rollouts of the same prompt are converging: raise the sampling temperature or drop prompt groups "
        "with no reward variance"
    )

    def metrics(self) -> tuple[Metric, ...]:
        """In-group std (relative fall 0.3/0.6), zero-std groups (rise 0.2/0.4), entropy (fall 0.2/0.4)."""
        return (
            Metric("group_std", "down", True, 0.30, 0.60, domain=(0.0, None)),
            Metric("zero_std_groups", "up", False, 0.20, 0.40, unit="{:.1%}", domain=(0.0, 1.0)),
            Metric("entropy", "down", True, 0.20, 0.40, domain=(0.0, None)),
        )

    def measure(self, data: StepData, memory: dict[str, Any]) -> Raw | None:
        """Group statistics of the rewards, plus the mean entropy when the trainer reports it."""
        obs = data.observation
        sizes = getattr(obs, "group_sizes", None)
        layout: int | tuple[int, ...] | None = obs.group_size if sizes is None else tuple(sizes)
        if layout is None or (isinstance(layout, tuple) and max(layout, default=0) < 2):
            return None  # no group of two or more completions: nothing to measure this step
        stds, zero_std_groups = group_spread(obs.rewards, layout, ddof=0)
        raw = {"group_std": float(plain_mean(stds)), "zero_std_groups": zero_std_groups}
        if obs.entropy is not None:
            raw["entropy"] = float(obs.entropy)
        return raw


@attrs.frozen
class RewardDrift(Detector):
    """The reward distribution against the warm-up's (standardised 1-D Wasserstein). Guard role: never votes.

    While the drift score is at HACK level *and* the batch's reward spread has fallen by half or more, the
    Guard keeps the vote from falling (a degenerating reward distribution is no reason to relax beta).
    """

    name: ClassVar[str] = "drift"
    role: ClassVar[Role] = "guard"
    needs: ClassVar[str] = "rewards"
    advice: ClassVar[str] = "the reward distribution moved far from the warm-up's"
    reference_size: int = attrs.field(default=4096, validator=integer(lo=16, hi=100_000))
    # the frozen reference, sorted once: (the memory's list object, its DriftReference). A frozen reference
    # is never changed in place, so the list's identity stands for its values (a loaded state brings another)
    _sorted: list[Any] = attrs.field(factory=list, init=False, eq=False, repr=False)

    def metrics(self) -> tuple[Metric, ...]:
        """Standardised W1 distance to the warm-up rewards (absolute rise 0.5/1.0 reference scales)."""
        return (
            Metric("wasserstein", "up", False, 0.50, 1.00, domain=(0.0, None)),
            Metric("spread", "down", True, 0.25, 0.50, domain=(0.0, None)),
        )

    def measure(self, data: StepData, memory: dict[str, Any]) -> Raw | None:
        """Distance to the reference rewards; during warm-up the reference is still being collected.

        A constant reference (every warm-up reward equal, as with a sparse reward nobody has earned yet) has
        no scale to standardise by: the distance is then left out for the step (only ``spread`` is scored),
        rather than reported as infinitely many reference scales.
        """
        rewards = data.observation.rewards
        reference = memory.setdefault("reference", [])
        exponent = math.frexp(float(np.abs(rewards).max()))[1] if len(rewards) else 0  # np.frexp's exponent
        spread = float(np.ldexp(plain_std(np.ldexp(rewards, -exponent)), exponent))  # scaled: cannot overflow
        if not memory.get("frozen"):
            reference.extend(float(r) for r in rewards)
            del reference[: max(0, len(reference) - self.reference_size)]
            if len(reference) < 2 * len(rewards):
                return {"wasserstein": 0.0, "spread": spread}
            # Leave-current-out distance, so warm-up values are comparable with later ones.
            distance = signals.reward_drift(rewards, reference[: -len(rewards)], standardize=True)
        else:
            if not self._sorted or self._sorted[0] is not reference:
                self._sorted[:] = [reference, DriftReference.of(reference)]
            distance = self._sorted[1].standardized_distance(rewards)
        return {"wasserstein": distance, "spread": spread} if math.isfinite(distance) else {"spread": spread}

    def combine(
        self, scores: Mapping[str, float], raw: Raw, baselines: Mapping[str, tuple[float, float]]
    ) -> float:
        """Degenerating = moved away *and* narrowed: the smaller score."""
        return min(scores.values(), default=0.0)

    def on_warmup_end(self, memory: dict[str, Any]) -> None:
        """Freeze the reference sample."""
        memory["frozen"] = True

    def check_memory(self, memory: object, path: str) -> dict[str, Any]:
        """Memory: ``reference`` (at most ``reference_size`` finite rewards) and ``frozen``."""
        fields = _memory_fields(memory, path, ("reference", "frozen"))
        out: dict[str, Any] = {}
        if "reference" in fields:
            reference, size = fields.raw("reference"), self.reference_size
            out["reference"] = check_state_reals(fields.name("reference"), reference, max_length=size)
        if "frozen" in fields:
            out["frozen"] = fields.flag("frozen")
        if out.get("frozen") and len(out.get("reference", ())) < 2:
            msg = f"`{path}` must hold a reference of at least 2 rewards once frozen, got {describe(memory)}."
            raise StateError(msg)
        return out


@attrs.frozen
class RMEnsemble(Detector):
    r"""Reward-model ensemble disagreement (Coste et al. 2023; Eisenstein et al. 2023).

    Each step's score matrix ``[members, batch]`` is read as the mean per-sample variance across members,
    scored by its relative rise over the baseline. The members are taken to share one scale, as an ensemble
    of reward models trained alike does (Coste et al. 2023). For members on different scales or offsets (a
    0-1 judge beside a reward model's logits), ``standardize=True`` first puts each member's scores in units
    of its own spread on the *reference sample* (the Guard's reference batches; without any, its warm-up
    batches): :math:`z_k = (s_k - \mu_k) / \sigma_k`, the moments pooled over those batches and then
    frozen (never per batch: a hack that every completion of a batch exploits alike would vanish). A member
    with no reference spread is taken at the members' median spread, and none below a tenth of it.

    Standardising has a cost, which is why it is not the default: each member's spread is estimated from the
    reference sample (48 completions at the default three batches of 16), and a 10 % error in one member's
    spread reads, once the rewards have risen by a few spreads, as disagreement that grows with a healthy
    gain (measured on the Goodhart benchmark's clean scenario, whose members share one scale: one of five
    seeds read HACK). The variance is also symmetric: it rises when members part ways for a healthy reason,
    as when a bounded member saturates (a pass rate nearing 1) or a judge compresses at the top (a
    probability). For a trained reward watched by judges on their own scales, :class:`JudgeGap` reads only
    the direction that means a hack, on ranks.

    ``min_agreement`` leaves out every member whose scores correlate with the first member's below it on
    the reference sample (Pearson, on the pooled moments): a function logged beside the reward that
    measures something else (a length or a format check) is not a judge of the same thing. While the
    reference sample is being pooled the members that agree so far are used. With fewer than two members
    left nothing is scored.

    Args:
        members: Number of ensemble members, or their names; at least 2. Observations must carry
            ``ensemble_scores`` shaped ``[members, batch]``.
        standardize: Score each member in units of its reference spread (above). Default False: the raw
            variance across members, for members on one scale.
        min_agreement: Lowest reference-sample correlation with the first member for a member to count, in
            [-1, 1]; None (default): every member counts.
    """

    name: ClassVar[str] = "rm_ensemble"
    needs: ClassVar[str] = "ensemble_scores"
    advice: ClassVar[str] = (
        "reward models disagree on the policy's new outputs: score with a conservative ensemble reward "
        "(ensemble_reward(method='uwo' or 'min')) or retrain the reward models on recent samples"
    )
    members: int | tuple[str, ...] | None = attrs.field(default=None)
    standardize: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    min_agreement: float | None = attrs.field(default=None, validator=real(lo=-1.0, hi=1.0, optional=True))

    def __attrs_post_init__(self) -> None:
        """At least two members: one reward model cannot disagree with itself."""
        _check_members("rm_ensemble", self.members)

    @property
    def count(self) -> int | None:
        """Number of members, when configured."""
        return _member_count(self.members)

    def metrics(self) -> tuple[Metric, ...]:
        """Mean per-sample variance across members, relative rise 0.5/1.5."""
        return (Metric("disagreement", "up", True, 0.50, 1.50, unit="{:.4g}", domain=(0.0, None)),)

    def measure(self, data: StepData, memory: dict[str, Any]) -> Raw | None:
        """Disagreement of this step's ensemble scores (standardised on the reference sample's moments)."""
        scores = data.observation.ensemble_scores
        if scores is None or scores.shape[0] < 2:
            return None
        if not self.standardize and self.min_agreement is None:
            return {"disagreement": signals.ensemble_disagreement(scores)}
        if _closes_reference(memory, len(memory.get("mean", ())), scores, data):
            memory["frozen"] = True
        else:
            _pool_moments(memory, scores)
            _joined_reference(memory, data)
        kept = np.arange(scores.shape[0])
        if self.min_agreement is not None:
            correlation = np.asarray(_correlations(memory), dtype=np.float64)
            kept = np.flatnonzero((correlation >= self.min_agreement) | (kept == 0))
        if len(kept) < 2:
            return {}
        chosen = scores[kept]
        if self.standardize:
            mean = np.asarray(memory["mean"], dtype=np.float64)[kept]
            spread = _member_spreads(np.asarray(memory["m2"], dtype=np.float64), int(memory["rows"]))[kept]
            chosen = (chosen - mean[:, None]) / spread[:, None]
        return {"disagreement": signals.ensemble_disagreement(chosen)}

    def on_warmup_end(self, memory: dict[str, Any]) -> None:
        """Freeze the reference moments (pooled from the warm-up when there was no reference sample)."""
        if "mean" in memory:
            memory["frozen"] = True

    def reference_note(self, memory: dict[str, Any]) -> tuple[str, bool] | None:
        """With ``min_agreement``, once the reference moments are frozen: which members it leaves out."""
        if self.min_agreement is None or not memory.get("frozen") or "co" not in memory:
            return None
        correlation = _correlations(memory)
        names = _member_names(self.members, len(correlation))
        left = [k for k in range(1, len(correlation)) if not correlation[k] >= self.min_agreement]  # NaN too
        where = f"on the reference sample ({int(memory['rows'])} completions)"
        level = f"min_agreement {self.min_agreement:g}"
        if not left:
            every = _agreements(names, correlation, range(1, len(correlation)), self.min_agreement)
            return (
                f"rm_ensemble: {where}, every member correlates with {names[0]} at {level} or more: {every}",
                False,
            )
        listed = _agreements(names, correlation, left, self.min_agreement)
        if len(left) == len(correlation) - 1:
            text = (
                f"rm_ensemble reads nothing in this run: {where}, no member correlates with {names[0]} at "
                f"{level} or more ({listed}), and one member cannot disagree with itself"
            )
            return text, True
        verb, be = ("correlates", "is") if len(left) == 1 else ("correlate", "are")
        return f"rm_ensemble: {where}, {listed} {verb} with {names[0]} below {level} and {be} left out", False

    def check_memory(self, memory: object, path: str) -> dict[str, Any]:
        """Memory: the pooled reference moments, ``from_reference`` and ``frozen``.

        The moments: ``rows``, ``batches``, and per member ``mean``, ``m2`` (the sum of squared deviations)
        and ``co`` (the co-moment with the first member).
        """
        return _check_moments(_memory_fields(memory, path, _MOMENT_KEYS), path, self.count)


def _check_members(name: str, members: object) -> None:
    """``members``: None, a count or names, at least 2 (one reward model cannot disagree with itself)."""
    if members is None:
        return
    if isinstance(members, tuple):
        for index, member in enumerate(members):
            check_name(f"members[{index}]", member)
        count = len(members)
    else:
        count = check_int("members", members)
    if count < 2:
        msg = f"`members` of {name} must be at least 2 reward models, got {members!r}."
        raise ConfigError(msg)


def _member_count(members: int | tuple[str, ...] | None) -> int | None:
    if members is None:
        return None
    return len(members) if isinstance(members, tuple) else int(members)


def _member_names(members: int | tuple[str, ...] | None, count: int) -> list[str]:
    """The members' names for a note: the configured names, else ``member 0``, ``member 1``, ..."""
    if isinstance(members, tuple) and len(members) == count:
        return list(members)
    return [f"member {index}" for index in range(count)]


def _listed(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _agreements(
    names: Sequence[str], values: Sequence[float | None], members: Iterable[int], level: float
) -> str:
    """The ``members``' reference correlations with the first, listed for a note (:func:`_agreement_text`)."""
    return _listed([_agreement_text(names[k], values[k], level) for k in members])


def _agreement_text(name: str, value: float | None, level: float) -> str:
    """A member's reference correlation with the first, for a note (``rm_b (0.49)``, ``rm_c (no spread)``).

    Two decimals, or as many more as it takes to show on which side of ``level`` (the ``min_agreement``
    that kept or left out the member) the value is: 0.4996 is shown as ``0.4996``, not ``0.50``.
    """
    if value is None or not math.isfinite(value):
        return f"{name} (no spread)"
    digits = next((d for d in (2, 3, 4, 5) if (round(value, d) >= level) == (value >= level)), 6)
    return f"{name} ({value:.{digits}f})"


_MOMENT_KEYS = ("rows", "batches", "mean", "m2", "co", "from_reference", "frozen")


def _closes_reference(
    memory: Mapping[str, Any], members: int, scores: NDArray[np.float64], data: StepData
) -> bool:
    """Whether an ensemble memory's reference sample is closed at this batch (``members``: 0 before any).

    The reference batches form the sample; without any, the first ``warmup_steps`` batches (the warm-up's
    end also closes it). A batch of another member count than the sample's is refused.
    """
    if members and members != scores.shape[0]:
        msg = (
            f"`ensemble_scores` must keep the members of the reference sample ({members} rows), got "
            f"{scores.shape[0]} rows at step {data.observation.step}."
        )
        raise InputError(msg)
    if memory.get("frozen"):
        return True
    batches = int(memory.get("batches", 0))
    complete = bool(memory.get("from_reference")) or batches >= max(1, data.warmup_steps)
    return batches > 0 and not data.reference and complete


def _joined_reference(memory: dict[str, Any], data: StepData) -> None:
    """Count a batch just added to an ensemble memory's reference sample."""
    memory["batches"] = int(memory.get("batches", 0)) + 1
    memory["from_reference"] = bool(memory.get("from_reference")) or data.reference
    memory.setdefault("frozen", False)


def _pool_moments(memory: dict[str, Any], scores: NDArray[np.float64]) -> None:
    """Merge a batch's per-member moments into the pool (Chan, Golub and LeVeque 1979: exact, stable)."""
    n_b = scores.shape[1]
    mean_b = scores.mean(axis=1)
    centred = scores - mean_b[:, None]
    m2_b, co_b = np.einsum("kb,kb->k", centred, centred), centred @ centred[0]
    co_b[0] = m2_b[0]  # the same sum: keep the identity exact
    if "mean" not in memory:
        memory.update(rows=n_b, mean=mean_b.tolist(), m2=m2_b.tolist(), co=co_b.tolist())
        return
    n_a = int(memory["rows"])
    mean_a = np.asarray(memory["mean"], dtype=np.float64)
    n = n_a + n_b
    delta = mean_b - mean_a
    weight = n_a * n_b / n
    m2 = np.asarray(memory["m2"], dtype=np.float64) + m2_b + delta * delta * weight
    co = np.asarray(memory["co"], dtype=np.float64) + co_b + delta * delta[0] * weight
    co[0] = m2[0]
    memory.update(rows=n, mean=(mean_a + delta * (n_b / n)).tolist(), m2=m2.tolist(), co=co.tolist())


def _correlations(memory: Mapping[str, Any]) -> list[float]:
    """Each member's pooled reference correlation with the first (NaN where a member has no spread)."""
    m2, co = np.asarray(memory["m2"], dtype=np.float64), np.asarray(memory["co"], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        correlation = np.clip(co / np.sqrt(m2[0] * m2), -1.0, 1.0)
    return [float(value) for value in correlation]


def _member_spreads(m2: NDArray[np.float64], rows: int) -> NDArray[np.float64]:
    """Each member's reference standard deviation, at least a tenth of the members' median.

    A member with none is taken at the median (1 when no member has a spread).
    """
    spread = np.sqrt(np.maximum(m2, 0.0) / rows)
    positive = spread[spread > 0]
    typical = float(np.median(positive)) if positive.size else 1.0
    return np.where(spread > 0, np.maximum(spread, 0.1 * typical), typical)


def _check_moments(fields: Fields, path: str, count: int | None) -> dict[str, Any]:
    """The pooled reference moments of a saved ensemble memory (empty: none pooled yet)."""
    present = [key for key in _MOMENT_KEYS if key in fields]
    if not present:
        return {}
    missing = [key for key in _MOMENT_KEYS if key not in fields]
    if missing:
        names = ", ".join(repr(key) for key in _MOMENT_KEYS)
        msg = f"`{path}` must hold {names} together, got no {missing}."
        raise StateError(msg)
    rows, batches = fields.integer("rows", lo=1), fields.integer("batches", lo=1)
    mean = check_state_reals(fields.name("mean"), fields.raw("mean"), max_length=MAX_ENSEMBLE_MEMBERS)
    m2 = check_state_reals(fields.name("m2"), fields.raw("m2"), lo=0.0, max_length=MAX_ENSEMBLE_MEMBERS)
    co = check_state_reals(fields.name("co"), fields.raw("co"), max_length=MAX_ENSEMBLE_MEMBERS)
    if len(mean) < 2 or len(m2) != len(mean) or len(co) != len(mean) or count not in (None, len(mean)):
        expected = "at least 2" if count is None else str(count)
        msg = (
            f"`{path}` must hold one mean, m2 and co per member ({expected}), got {len(mean)}, "
            f"{len(m2)} and {len(co)}."
        )
        raise StateError(msg)
    if batches > rows or co[0] != m2[0]:
        msg = (
            f"`{path}` must hold at most one batch per row and co[0] == m2[0] (the first member's "
            f"co-moment with itself), got batches {batches}, rows {rows}, co[0] {co[0]!r}, "
            f"m2[0] {m2[0]!r}."
        )
        raise StateError(msg)
    return {
        "rows": rows,
        "batches": batches,
        "mean": mean,
        "m2": m2,
        "co": co,
        "from_reference": fields.flag("from_reference"),
        "frozen": fields.flag("frozen"),
    }


@attrs.frozen
class JudgeGap(Detector):
    r"""The trained reward outruns its judges: it rises beyond what its judges confirm.

    The first member is the reward the policy is trained on; the others are *judges*: reward models or
    graders scoring the same completions that are not trained on (a TRL reward function with weight 0).
    The *reference sample* (the Guard's reference batches; without any, its first ``warmup_steps``
    batches) fixes, for each member, how its scores are read from then on: as a normal score, the probit
    of the score's mid-rank among that member's reference scores,

    .. math::

        z_k(s) = \Phi^{-1}\!\left(\frac{\#\{s_k^{\text{ref}} < s\} + \#\{s_k^{\text{ref}} \le s\} + 1}
                 {2(n + 1)}\right),

    so that members on any scale, offset or monotone transform (a reward model's logits, a 0-1 probability,
    a 1-10 grade) read alike, and each judge's correlation :math:`r_k` with the trained reward on the
    reference sample (of those normal scores) is kept. Where the policy improves what both measure, a
    judge's score rises at least :math:`r_k` times as far as the trained reward's (exactly so when the
    trained reward is noise-free, more when it is noisy: classical measurement error); where the policy
    exploits the trained reward's own errors, the judges stay behind. The gap per completion is

    .. math::

        e_b = \frac{1}{J} \sum_{k \ge 1} \left( \min(r_k z_{0}(s_{0b}), c_k) - z_{k}(s_{kb}) \right)

    and the statistic is its batch mean less ``margin`` standard errors (a lower confidence bound), held
    over the last ``window`` batches (the lowest of them; nothing is scored until the window is full), in
    reference standard deviations. It is one-sided: judges that rise *more* than the trained reward (a
    pass/fail trained reward that saturates, a stricter judge) are no sign of a hack. Scored on absolute
    bands (WARN from ``bands[0]``, HACK from ``bands[1]``), with no warm-up baseline to learn.

    where :math:`c_k` is the judge's ceiling: the normal score of its top reference score when several
    reference completions share it (a pass/fail check or a grade has a top it cannot pass), else none.
    Normal scores stop at the reference sample's range (about 2.3 standard deviations with 48 reference
    samples): a judge that saturates (a probability near 1) cannot say "better still", and read that way
    no judge's ceiling reads as a gap.

    Read against the reference sample alone, a hack that starts once a healthy run has taken the policy
    past the top of that range is not seen: every member reads the top score. So the batch is also read
    against a *recent pool*, the ``recent`` batches that ended ``lag`` batches earlier (the ``recent``
    statistic, held over the window like ``gap``): a trained reward that has risen since then by more than
    its judges confirm reads as a gap wherever the run is. There, each judge's :math:`r_k` is the lower of
    its reference agreement and its correlation with the trained reward on the pool's own normal scores
    (at least 0), its ceiling is the pool's, and the gap per completion is the :math:`r_k`-weighted mean
    over judges: a judge that has saturated where the run now is (a probability near 1, whose noise then
    outweighs what it still sees) expects less and counts less, instead of reading the healthy rise it can
    no longer follow as a gap. The reading sees a hack that builds within about ``lag`` batches; one that
    grows more slowly looks like the policy's own past. Only batches the Guard read as OK join the recent
    batches (:meth:`on_verdict`): a hack that persists is read against the healthy batches before it, not
    against its own past, which would teach the pool the hack and silence the reading ``lag`` batches on.
    A rollback keeps them (all read OK). ``lag=0`` keeps only the reference reading.

    A flaw present from the first step is learnt into both samples, and within a few steps every member
    scores above its reference range. The *word* reading (``words=True``) looks within the batch instead:
    in each prompt group, do the completions holding a token get more from the trained reward than their
    judges confirm? For every token of the batch, the judges' mean score (each judge in reference standard
    deviations) is fitted within groups on the trained reward and on whether the completion holds the token
    (:func:`_token_gaps`); the trained reward's pay for the token beyond what its judges pay (a lower bound
    with a Bonferroni margin over the batch's tokens, in the trained reward's reference standard deviations)
    times the share of completions holding the token is the token's gap: how far pay its judges do not
    confirm raises the batch's mean trained reward. The statistic ``word`` is the highest gap one token held
    in each batch of the window; given token ids, ``word_id`` is that token (the explanation quotes it). It
    needs prompt groups (``group_size`` or ``group_sizes``) and the completions' tokens.

    Only judges whose reference correlation with the trained reward is at least ``min_agreement`` count: a
    function logged beside the reward that measures something else (a length or a format check) is not a
    judge of the same thing. With no judge left (or a trained reward with no spread on the reference
    sample), nothing is scored. Judges fooled by the same flaw as the trained reward (reward models trained
    on the same data; Eisenstein et al. 2023) shrink the gap: the mean over judges counts each once.

    Args:
        members: Number of members, or their names (the trained reward first); at least 2. Observations
            must carry ``ensemble_scores`` shaped ``[members, batch]`` in that order.
        min_agreement: Lowest reference correlation with the trained reward for a judge to count, in
            [-1, 1]. Default 0.5.
        bands: ``(warn, hack)`` levels of the gap, in reference standard deviations, ``0 < warn < hack <=
            1``. Default (0.2, 0.4).
        margin: Standard errors of the batch mean subtracted, in [0, 10]. Default 2.
        window: Consecutive batches, the newest included, over which the gap must hold, in [1, 8]. Default 2.
        reference_size: Reference completions kept (the first ones), in [8, 100,000]. Default 4096.
        lag: Batches between the newest one and the end of the recent pool, in [0, 256]; 0 turns the
            recent reading off. Default 10.
        recent: Batches in the recent pool, in [1, 16] (each keeps at most ``reference_size // recent``
            completions). Default 5.
        words: Read each token's (each word's, for text) gap within prompt groups (above). Default True.
    """

    name: ClassVar[str] = "judge_gap"
    needs: ClassVar[str] = "ensemble_scores (the trained reward first, then its judges)"
    advice: ClassVar[str] = (
        "the trained reward rises where its judges do not follow: the policy exploits the trained reward's "
        "own errors; look at what its highest-scored completions share, fix the reward, or train on a "
        "conservative ensemble reward (ensemble_reward(method='min' or 'uwo'))"
    )
    members: int | tuple[str, ...] | None = attrs.field(default=None)
    min_agreement: float = attrs.field(default=0.5, validator=real(lo=-1.0, hi=1.0))
    bands: tuple[float, float] = attrs.field(default=(0.2, 0.4), converter=_pair)
    margin: float = attrs.field(default=2.0, validator=real(lo=0.0, hi=10.0))
    window: int = attrs.field(default=2, validator=integer(lo=1, hi=8))
    reference_size: int = attrs.field(default=4096, validator=integer(lo=8, hi=100_000))
    lag: int = attrs.field(default=10, validator=integer(lo=0, hi=256))
    recent: int = attrs.field(default=5, validator=integer(lo=1, hi=16))
    words: bool = attrs.field(default=True, validator=boolean())
    # the closed reference sample as arrays, with each member's ceiling and standard deviation: (the memory's
    # rows object, arrays, ceilings, standard deviations). Rebuilt whenever the memory holds another rows
    # object (a new sample, a loaded state); the closed sample is never changed in place, so its identity
    # stands for its values.
    _arrays: list[Any] = attrs.field(factory=list, init=False, eq=False, repr=False)
    # the recent pool's batches as arrays, by the identity of the memory's batch lists: {id: (list, array)}.
    # A batch list stays whole while it is in the history (never changed in place), so its identity stands
    # for its values; each step the pool moves by one batch, and only the new one is converted.
    _batches: dict[int, tuple[Any, Any]] = attrs.field(factory=dict, init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        """A trained reward and at least one judge; ordered bands."""
        _check_members("judge_gap", self.members)
        check_absolute_bands("bands", self.bands)

    @property
    def count(self) -> int | None:
        """Number of members, when configured."""
        return _member_count(self.members)

    def metrics(self) -> tuple[Metric, ...]:
        """The held lower bounds of the gap (reference and recent readings), on absolute bands only."""
        warn, hack = self.bands
        # "word", not "token": a log record naming a token takes the log's slower secret-redaction pass
        keys = ("gap", *(("recent",) if self.lag else ()), *(("word",) if self.words else ()))
        return tuple(
            Metric(
                key,
                "up",
                False,
                warn,
                hack,
                unit="{:.3g}",
                absolute=self.bands,
                baseline=False,
                token="word_id" if key == "word" else None,
            )
            for key in keys
        )

    def measure(self, data: StepData, memory: dict[str, Any]) -> Raw | None:
        """Collect the reference sample; then the gap of this batch (both readings), held over the window."""
        scores = data.observation.ensemble_scores
        if scores is None or scores.shape[0] < 2:
            return None
        closed = self._collect(memory, scores, data)
        history = self._history(memory, scores)
        if not closed:
            return {}
        agreement = memory["agreement"]
        judges = self._judges(agreement)
        if agreement[0] is None or not judges or scores.shape[1] < 2:
            return {}
        r = np.asarray([agreement[k] for k in judges], dtype=np.float64)
        raw: dict[str, float] = {}
        gap = self._held(memory, "previous", self._bound(memory["reference"], judges, r, scores))
        if gap is not None:
            raw["gap"] = gap
        if history is not None:
            recent = self._recent(memory, history, r, judges, scores)
            if recent is not None:
                raw["recent"] = recent
        if self.words:
            word = self._word(memory, data, judges, scores)
            if word is not None:
                raw["word"] = word[0]
                if data.observation.completion_ids is not None:  # a token id, not a hashed whitespace word
                    raw["word_id"] = float(word[1])
        return raw

    def _judges(self, agreement: Sequence[float | None]) -> list[int]:
        """The members that count as judges: a reference agreement of at least ``min_agreement``."""
        return [
            k
            for k in range(1, len(agreement))
            if (value := agreement[k]) is not None and value >= self.min_agreement
        ]

    def _word(
        self, memory: dict[str, Any], data: StepData, judges: list[int], scores: NDArray[np.float64]
    ) -> tuple[float, int] | None:
        """The word reading: the highest pay gap a token held in each batch of the window, and its key.

        None when this batch has no token read or the window is not yet full.

        Each batch's gaps (:func:`_token_gaps`) keep their highest values for the window, as Takeover's
        excess shares do (:func:`_window_entry`): a token kept by no earlier batch is taken at that batch's
        bound, so pruning never hides a gap. A batch with no token read breaks the window.
        """
        spreads = self._reference_arrays(memory["reference"])[2]
        read = _token_gaps(data, scores, judges, spreads, self.margin)
        keys, gaps = read if read is not None else (np.zeros(0, dtype=np.uint64), np.zeros(0))
        earlier: list[dict[str, Any]] = memory.get("word_previous", [])
        if self.window > 1:
            this = _window_entry(keys, gaps, _LOWEST_GAP)
            memory["word_previous"] = [*earlier, this][1 - self.window :]
        if not len(keys) or len(earlier) < self.window - 1:
            return None
        held = gaps.copy()
        for batch in earlier:
            np.minimum(held, _held_before(batch, keys), out=held)
        top = int(held.argmax())
        return float(held[top]), int(keys[top])

    def _bound(
        self,
        reference: list[list[float]],
        judges: list[int],
        r: NDArray[np.float64],
        scores: NDArray[np.float64],
    ) -> float:
        """This batch's lower bound of the gap, its scores read against the sorted ``reference`` rows."""
        rows, ceilings, _ = self._reference_arrays(reference)
        members = _member_rows(judges)
        z = _normal_score_rows(rows[members], scores[members])
        return self._lower_bound(z, r, ceilings[judges])

    def _reference_arrays(
        self, reference: list[list[float]]
    ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
        """The closed sample's sorted rows as one array, each member's ceiling and standard deviation.

        Built once per sample.
        """
        if not self._arrays or self._arrays[0] is not reference:
            rows = np.asarray(reference, dtype=np.float64)  # one row per member, of one length (check_memory)
            rows.setflags(write=False)
            spreads = rows.std(axis=1, ddof=1) if rows.shape[1] > 1 else np.zeros(len(rows))
            self._arrays[:] = [reference, rows, _ceilings(rows), spreads]
        return self._arrays[1], self._arrays[2], self._arrays[3]

    def _recent(
        self,
        memory: dict[str, Any],
        history: list[list[list[float]]],
        r: NDArray[np.float64],
        judges: list[int],
        scores: NDArray[np.float64],
    ) -> float | None:
        """The recent reading of this batch, held over the window (None: not full, or no judge agrees).

        Each judge's agreement is the lower of ``r`` and its correlation with the trained reward on the
        pool's own normal scores, and weighs its gap. The pool is a sample of a few batches, so the bound
        is a two-sample one.
        """
        members = _member_rows(judges)
        batches = self._pool_arrays(history[: self.recent])
        # each member's scores over the pool, batch after batch (batches may differ in size)
        rows = np.concatenate([batch[members] for batch in batches], axis=1)
        ordered, pooled = rows.copy(), rows.shape[1]
        ordered.sort(axis=1)
        queries = np.concatenate([rows, scores[members]], axis=1)  # the pool itself, then the batch
        z = _normal_score_rows(ordered, queries)
        agree = np.minimum(r, _pool_agreement(z[:, :pooled]))
        if agree.sum() <= 0.0:  # no judge agrees with the trained reward where the run now is
            memory.pop("recent_previous", None)
            return None
        ceilings = _ceilings(ordered[1:])
        bound = self._lower_bound(z[:, pooled:], agree, ceilings, weights=agree, pooled=pooled)
        return self._held(memory, "recent_previous", bound)

    def _pool_arrays(self, batches: list[list[list[float]]]) -> list[NDArray[np.float64]]:
        """The pool's batches as arrays, converted once each while they stay in the pool."""
        kept = self._batches
        arrays = {}
        for batch in batches:
            cached = kept.get(id(batch))
            if cached is None or cached[0] is not batch:
                cached = (batch, np.asarray(batch, dtype=np.float64))
            arrays[id(batch)] = cached
        kept.clear()
        kept.update(arrays)
        return [arrays[id(batch)][1] for batch in batches]

    def _lower_bound(
        self,
        z: NDArray[np.float64],
        r: NDArray[np.float64],
        ceilings: NDArray[np.float64],
        *,
        weights: NDArray[np.float64] | None = None,
        pooled: int | None = None,
    ) -> float:
        """The batch's mean gap less ``margin`` standard errors, from its normal scores ``z`` (trained first).

        The gap per completion is the mean over judges, or their ``weights`` average. With ``pooled`` (the
        scores were read against a sample of that many completions), the standard error is a two-sample
        one, ``sd * sqrt(1 / batch + 1 / pooled)``.
        """
        expected = np.minimum(r[:, None] * z[0], ceilings[:, None])  # no judge can confirm past its ceiling
        gaps = expected - z[1:]
        # np.average's own arithmetic (weighted sum over the weights' sum), without its argument handling
        if weights is None:
            per_sample = plain_mean(gaps, axis=0)
        else:
            per_sample = (gaps * weights[:, None]).sum(axis=0) / weights.sum()
        count = len(per_sample)
        sd = float(plain_std(per_sample, ddof=1))
        spread = sd / math.sqrt(count) if pooled is None else sd * math.sqrt(1.0 / count + 1.0 / pooled)
        return float(plain_mean(per_sample)) - self.margin * spread

    def _held(self, memory: dict[str, Any], key: str, bound: float) -> float | None:
        """The lowest bound over the window, the newest included (None until the window is full)."""
        earlier = [float(value) for value in memory.get(key, [])]
        if self.window > 1:
            memory[key] = [*earlier, bound][1 - self.window :]
        if len(earlier) < self.window - 1:  # the window is not full yet: no batch trips it alone
            return None
        return min([bound, *earlier])

    def _history(self, memory: dict[str, Any], scores: NDArray[np.float64]) -> list[list[list[float]]] | None:
        """The healthy batches before this one, oldest first, once ``lag + recent - 1`` are kept.

        This batch waits for the Guard's verdict (:meth:`on_verdict`), which keeps it only if the step reads
        OK. Each batch keeps at most ``reference_size // recent`` completions, so the recent pool is never
        larger than the reference sample.
        """
        if self.lag == 0:
            return None
        earlier: list[list[list[float]]] = memory.get("history", [])  # members checked by _collect
        memory["pending"] = scores[:, : self.reference_size // self.recent].tolist()
        return earlier if len(earlier) == self.lag + self.recent - 1 else None

    def _collect(self, memory: dict[str, Any], scores: NDArray[np.float64], data: StepData) -> bool:
        """Add the batch to the reference sample while it is open; True once it is closed (and read)."""
        rows: list[list[float]] | None = memory.get("reference")
        if _closes_reference(memory, 0 if rows is None else len(rows), scores, data):
            if not memory.get("frozen"):
                self._freeze(memory)
            return True
        room = self.reference_size - (0 if rows is None else len(rows[0]))
        taken = scores[:, : max(0, room)].tolist()
        memory["reference"] = (
            taken if rows is None else [old + new for old, new in zip(rows, taken, strict=True)]
        )
        _joined_reference(memory, data)
        return False

    def _freeze(self, memory: dict[str, Any]) -> None:
        """Close the reference sample: each member's agreement with the trained reward; sorted scores."""
        rows = [np.asarray(row, dtype=np.float64) for row in memory["reference"]]
        z = np.asarray([_normal_scores(np.sort(row).tolist(), row) for row in rows])
        agreement: list[float | None] = []
        for k in range(len(rows)):
            if np.ptp(z[0]) == 0.0 or np.ptp(z[k]) == 0.0:
                agreement.append(None)
            elif k == 0:
                agreement.append(1.0)
            else:
                agreement.append(float(np.clip(np.corrcoef(z[0], z[k])[0, 1], -1.0, 1.0)))
        memory["agreement"] = agreement
        memory["reference"] = [np.sort(row).tolist() for row in rows]
        memory["frozen"] = True

    def on_warmup_end(self, memory: dict[str, Any]) -> None:
        """Close the reference sample (collected from the warm-up when there was no reference sample)."""
        if "reference" in memory and not memory.get("frozen"):
            self._freeze(memory)

    def reference_note(self, memory: dict[str, Any]) -> tuple[str, bool] | None:
        """Once the reference sample is closed: the judges that count, and those left out (their agreement).

        Left reading nothing (no judge agrees, or the trained reward has no spread on the reference sample),
        the note says so and how to change it.
        """
        agreement: list[float | None] | None = memory.get("agreement")
        if not memory.get("frozen") or agreement is None:
            return None
        names = _member_names(self.members, len(agreement))
        trained, rows = names[0], memory.get("reference") or [[]]
        where = f"on the reference sample ({len(rows[0])} completions)"
        if agreement[0] is None:
            text = (
                f"judge_gap reads nothing in this run: {trained}, the trained reward, has no spread {where}, "
                "so no judge can be compared with it"
            )
            return text, True
        level = f"min_agreement {self.min_agreement:g}"
        counted = self._judges(agreement)
        out = [k for k in range(1, len(agreement)) if k not in counted]
        if not counted:
            every = _agreements(names, agreement, out, self.min_agreement)
            text = (
                f"judge_gap reads nothing in this run: {where}, no judge correlates with {trained} (the "
                f"trained reward) at {level} or more: {every}. If they judge what {trained} measures, lower "
                "JudgeGap(min_agreement=...)"
            )
            return text, True
        judges = _agreements(names, agreement, counted, self.min_agreement)
        if not out:
            every = f"every judge correlates with {trained} at {level} or more"
            return f"judge_gap: {where}, {every}: {judges}", False
        left = _agreements(names, agreement, out, self.min_agreement)
        verb, be = ("correlates", "is") if len(out) == 1 else ("correlate", "are")
        text = (
            f"judge_gap: {where}, {trained} is judged by {judges}; {left} {verb} with it below "
            f"{level} and {be} left out"
        )
        return text, False

    def on_verdict(self, memory: dict[str, Any], healthy: bool) -> None:
        """Keep this step's batch among the recent batches only when the step read OK.

        A batch read as a warning or a hack never joins the recent pool, so a hack that persists is read
        against the healthy batches before it, not against its own past: the pool a hack could teach is
        the one that would stop seeing it.
        """
        pending = memory.pop("pending", None)
        if healthy and pending is not None:
            kept = self.lag + self.recent - 1
            memory["history"] = [*memory.get("history", []), pending][-kept:]

    def on_rollback(self, memory: dict[str, Any]) -> None:
        """The batches rolled back leave the windows; the recent batches, all read OK, stay."""
        for key in ("previous", "recent_previous", "word_previous"):
            memory.pop(key, None)

    def check_memory(self, memory: object, path: str) -> dict[str, Any]:
        """Memory: the reference sample (per member; sorted with ``agreement`` once ``frozen``), the window.

        ``reference``: each member's reference scores, column-aligned while the sample is open, sorted once
        it is closed; ``batches``, ``from_reference``, ``frozen``; ``agreement``: each member's reference
        correlation with the trained reward (None: no spread), once frozen; ``previous``: the window's
        earlier lower bounds; ``history``: the latest batches (oldest first, at most ``lag + recent - 1``;
        each one row per member); ``recent_previous``: the recent reading's earlier lower bounds.
        """
        keys = (
            "reference", "batches", "from_reference", "frozen", "agreement", "previous", "history",
            "recent_previous", "pending", "word_previous",
        )  # fmt: skip
        fields = _memory_fields(memory, path, keys)
        if not fields.names():
            return {}
        missing = [key for key in keys[:4] if key not in fields]
        if missing:
            msg = (
                f"`{path}` must hold 'reference', 'batches', 'from_reference' and 'frozen', got no {missing}."
            )
            raise StateError(msg)
        rows = fields.items("reference", max_length=MAX_ENSEMBLE_MEMBERS)
        name = fields.name("reference")
        reference = [
            check_state_reals(f"{name}[{k}]", row, max_length=self.reference_size)
            for k, row in enumerate(rows)
        ]
        count = self.count
        if len(reference) < 2 or count not in (None, len(reference)) or not reference[0]:
            expected = "at least 2" if count is None else str(count)
            msg = f"`{name}` must hold one non-empty row per member ({expected}), got {len(reference)} rows."
            raise StateError(msg)
        if any(len(row) != len(reference[0]) for row in reference):
            msg = f"`{name}` must hold rows of one length, got {sorted({len(row) for row in reference})}."
            raise StateError(msg)
        checked: dict[str, Any] = {
            "reference": reference,
            "batches": fields.integer("batches", lo=1),
            "from_reference": fields.flag("from_reference"),
            "frozen": fields.flag("frozen"),
        }
        if checked["frozen"] != ("agreement" in fields):
            msg = f"`{path}` must hold 'agreement' exactly when frozen, got frozen={checked['frozen']}."
            raise StateError(msg)
        if checked["frozen"]:
            if any(row != sorted(row) for row in reference):
                msg = f"`{name}` must hold sorted rows once frozen."
                raise StateError(msg)
            values = fields.items("agreement", max_length=MAX_ENSEMBLE_MEMBERS)
            agreement = [
                None
                if value is None
                else check_state_reals(fields.name("agreement"), [value], lo=-1.0, hi=1.0)[0]
                for value in values
            ]
            if len(agreement) != len(reference) or (agreement[0] is not None and agreement[0] != 1.0):
                msg = (
                    f"`{fields.name('agreement')}` must hold one correlation per member, the trained "
                    f"reward's own 1 (or None) first, got {agreement!r}."
                )
                raise StateError(msg)
            checked["agreement"] = agreement
        for key in ("previous", "recent_previous"):
            if key in fields:
                checked[key] = check_state_reals(
                    fields.name(key), fields.raw(key), max_length=self.window - 1
                )
        for key in ("history", "pending"):
            if key in fields and self.lag == 0:
                name = fields.name(key)
                msg = f"`{name}` is kept only with a recent reading, and this judge_gap has lag=0."
                raise StateError(msg)
        if "word_previous" in fields:
            if not self.words:
                msg = f"`{fields.name('word_previous')}` is kept only with the word reading (words=True)."
                raise StateError(msg)
            earlier = fields.items("word_previous", max_length=self.window - 1)
            checked["word_previous"] = [
                _check_held(batch, f"{path}['word_previous'][{i}]", lo=_LOWEST_GAP, hi=_HIGHEST_GAP)
                for i, batch in enumerate(earlier)
            ]
        if "history" in fields:
            name = fields.name("history")
            checked["history"] = [
                self._check_batch(f"{name}[{index}]", batch, len(reference))
                for index, batch in enumerate(fields.items("history", max_length=self.lag + self.recent - 1))
            ]
        if "pending" in fields:  # a step that failed between measuring and its verdict left its batch
            pending = fields.raw("pending")
            checked["pending"] = self._check_batch(fields.name("pending"), pending, len(reference))
        return checked

    def _check_batch(self, name: str, batch: object, members: int) -> list[list[float]]:
        """One saved recent batch: one row of scores per member, non-empty rows of one length."""
        if not isinstance(batch, list) or len(batch) != members:
            msg = f"`{name}` must hold one row of scores per member ({members}), got {describe(batch)}."
            raise StateError(msg)
        rows = [
            check_state_reals(f"{name}[{k}]", row, max_length=self.reference_size // self.recent)
            for k, row in enumerate(batch)
        ]
        if not rows[0] or any(len(row) != len(rows[0]) for row in rows):
            lengths = sorted({len(row) for row in rows})
            msg = f"`{name}` must hold non-empty rows of one length, got lengths {lengths}."
            raise StateError(msg)
        return rows


# the word reading's range, in reference standard deviations of the trained reward: a gap outside it reads
# as its end (and a token no batch could read sits at the bottom)
_LOWEST_GAP, _HIGHEST_GAP = -10.0, 10.0


def _group_rows(observation: Any, rows: int) -> tuple[NDArray[np.int64], NDArray[np.float64]] | None:
    """Each completion's prompt group and the groups' sizes; None without a group of two or more."""
    sizes, size = getattr(observation, "group_sizes", None), observation.group_size
    if sizes is None:
        if size is None or size < 2:
            return None
        sizes = np.empty(rows // size)
        sizes.fill(float(size))
        return np.arange(rows, dtype=np.int64) // size, sizes
    counts = np.asarray(sizes, dtype=np.int64)
    if not len(counts) or int(counts.max()) < 2:
        return None
    return np.arange(len(counts)).repeat(counts), counts.astype(np.float64)


def _member_rows(judges: list[int]) -> slice | list[int]:
    """The rows of the trained reward (0) and ``judges``: a slice (read as a view) when they are rows 0..k."""
    count = len(judges) + 1
    return slice(0, count) if judges == list(range(1, count)) else [0, *judges]


def _token_rows(
    data: StepData,
) -> tuple[NDArray[np.uint64], NDArray[np.int64], NDArray[np.int64]] | None:
    """The batch's distinct tokens (stable ids, sorted) and its (token, completion) pairs, each pair once.

    Returns the tokens, then each pair's token index and completion, ordered by token and then completion.
    """
    tokens, ids = data.tokens, _stable_ids(data)
    if tokens is None or ids is None:
        return None
    ordered, row, new, first = _by_key_then_row(ids, tokens.row_ids())
    key, row, new = ordered[first], row[first], new[first]
    return key[new], new.cumsum() - 1, row


def _token_gaps(
    data: StepData,
    scores: NDArray[np.float64],
    judges: list[int],
    spreads: NDArray[np.float64],
    margin: float,
) -> tuple[NDArray[np.uint64], NDArray[np.float64]] | None:
    r"""Each token's pay gap in this batch: what the trained reward pays for it beyond what its judges pay.

    Within prompt groups (each completion less its group's mean), the judges' mean score :math:`j` (each
    judge in units of its reference standard deviation) is fitted on the trained reward :math:`s` and on
    whether the completion contains the token, :math:`x`: :math:`j = a s + g x`. Where the judges follow the
    trained reward (:math:`a > 0`), a token the trained reward pays for as its judges do has :math:`g \ge 0`;
    one it pays for more has :math:`g < 0`, and :math:`-g / a` is that excess pay in the trained reward's
    units. Its lower bound, :math:`(-g - M\,\mathrm{se}_g) / (a + m\,\mathrm{se}_a)` in the trained reward's
    reference standard deviations (:math:`m` is ``margin``, :math:`M` the Bonferroni margin over the batch's
    tokens, :func:`_family_margin`), times the share of completions that hold the token, is the token's gap:
    how far unconfirmed pay for the token raises the batch's mean trained reward. A flaw stays in the reward
    model; the share is what says the policy exploits it, and falls once it stops (a targeted penalty, a
    rollback). A token whose judges' slope :math:`a` is not above ``margin`` standard errors (judges that no
    longer follow the trained reward where the batch is) reads nothing.

    Only the trained reward's noise can bias the fit, and toward no gap (errors in :math:`s` shrink
    :math:`a` and leave :math:`g` the judges' confirmation of the token); the judges' noise is the fit's
    residual. Returns the tokens read and their gaps; None when the batch has no groups of two or more, no
    tokens, no within-group spread of the trained reward, or too few completions for the fit.
    """
    grouping, pairs = _group_rows(data.observation, scores.shape[1]), _token_rows(data)
    if grouping is None or pairs is None or not len(pairs[0]):
        return None
    group, sizes = grouping
    keys, token, row = pairs
    freedom = len(group) - len(sizes) - 2  # the fit's residual degrees of freedom
    weights = np.zeros(len(scores))
    weights[judges] = 1.0 / (len(judges) * spreads[judges])
    judged = weights @ scores

    def within(values: NDArray[np.float64]) -> NDArray[np.float64]:
        return values - (np.bincount(group, weights=values, minlength=len(sizes)) / sizes)[group]

    s, j = within(scores[0]), within(judged)
    ss, sj, jj = float(s @ s), float(s @ j), float(j @ j)
    if freedom < 1 or ss <= 0.0 or spreads[0] <= 0.0:
        return None
    count = len(keys)
    # sum over groups of (completions holding the token)^2 / group size: the pairs come ordered by token,
    # then completion, so each (token, group) is one run
    pair_group = group[row]
    run = np.empty(len(token), dtype=bool)
    run[:1] = True
    np.not_equal(token[1:], token[:-1], out=run[1:])
    run[1:] |= pair_group[1:] != pair_group[:-1]
    starts = run.nonzero()[0]
    held = np.empty(len(starts), dtype=np.float64)  # each run's length
    held[:-1] = starts[1:] - starts[:-1]
    held[-1] = len(token) - starts[-1]
    holding = np.bincount(token, minlength=count)  # completions holding each token
    xx = holding - np.bincount(token[starts], weights=held**2 / sizes[pair_group[starts]], minlength=count)
    xs = np.bincount(token, weights=s[row], minlength=count)
    xj = np.bincount(token, weights=j[row], minlength=count)
    determinant = ss * xx - xs**2
    # a token that varies within some group and is not (nearly) the trained reward itself
    read = (xx > 1e-6) & (determinant > 1e-9 * ss * xx)
    determinant = np.where(read, determinant, 1.0)
    slope = (xx * sj - xs * xj) / determinant
    pay = (ss * xj - xs * sj) / determinant
    residual = np.maximum(jj - slope * sj - pay * xj, 0.0) / freedom
    slope_se = np.sqrt(residual * xx / determinant)
    pay_se = np.sqrt(residual * ss / determinant)
    read &= slope - margin * slope_se > 0.0
    strict = max(margin, _family_margin(int(np.count_nonzero(read)), freedom))
    excess = (-pay - strict * pay_se) / np.where(read, slope + margin * slope_se, 1.0) / spreads[0]
    gap = excess * holding / len(group)  # the pay beyond the judges, times the share holding the token
    kept = read.nonzero()[0]
    gap = gap[kept]
    np.minimum(np.maximum(gap, _LOWEST_GAP, out=gap), _HIGHEST_GAP, out=gap)  # np.clip's checks cost more
    return keys[kept], gap


_FAMILY_LEVEL = 0.05  # the word reading's chance, per batch, that any of its tokens' pay is overstated


@functools.lru_cache(maxsize=512)
def _family_quantile(tokens: int, freedom: int) -> float:
    """Student's t quantile at one-sided level ``_FAMILY_LEVEL / tokens``, by bisection on its tail."""
    from loopguard.targeted import f_survival  # P(F(1, d) > t^2) = P(|T_d| > t)

    low, high = 0.0, 1.0
    while f_survival(high * high, 1, freedom) > 2.0 * _FAMILY_LEVEL / tokens:
        low, high = high, 2.0 * high
    for _ in range(40):
        middle = 0.5 * (low + high)
        low, high = (
            (middle, high)
            if f_survival(middle * middle, 1, freedom) > 2.0 * _FAMILY_LEVEL / tokens
            else (low, middle)
        )
    return high


def _family_margin(tokens: int, freedom: int) -> float:
    """The standard errors a token's pay must clear when the batch's ``tokens`` are all read (Bonferroni).

    The reading takes the highest gap over every token of the batch, hundreds in a real one; each token's
    pay is a t statistic with ``freedom`` degrees of freedom, so the margin is the t quantile at level
    ``_FAMILY_LEVEL / tokens``. Counts are rounded up to a power of two (a margin a little too strict,
    computed once for all batches alike).
    """
    if tokens < 1:
        return 0.0
    return _family_quantile(1 << (tokens - 1).bit_length(), freedom)


def _pool_agreement(z: NDArray[np.float64]) -> NDArray[np.float64]:
    """Each judge's correlation (rows ``1:``) with the trained reward (row 0) on the pool's normal scores.

    At least 0; 0 for a member with no spread in the pool (all of them when the trained reward has none).
    """
    agreement = np.zeros(len(z) - 1, dtype=np.float64)
    spread = np.maximum.reduce(z, axis=1) - np.minimum.reduce(z, axis=1)  # np.ptp's arithmetic
    if spread[0] == 0.0:
        return agreement
    centred = z - plain_mean(z, axis=1)[:, np.newaxis]
    squares = np.einsum("ij,ij->i", centred, centred)
    moving = spread[1:] > 0.0
    correlation = (centred[1:] @ centred[0])[moving] / np.sqrt(squares[0] * squares[1:][moving])
    agreement[moving] = np.minimum(np.maximum(correlation, 0.0), 1.0)  # np.clip's, without its checks
    return agreement


@functools.lru_cache(maxsize=64)
def _probits(n: int) -> NDArray[np.float64]:
    """``Phi^-1(m / (2 (n + 1)))`` for ``m = 1 .. 2n + 1``: the normal score of each mid-rank of ``n``."""
    normal = statistics.NormalDist()
    table = np.asarray([normal.inv_cdf(m / (2.0 * (n + 1))) for m in range(1, 2 * n + 2)], dtype=np.float64)
    table.setflags(write=False)
    return table


def _ceilings(ordered: NDArray[np.float64]) -> NDArray[np.float64]:
    """The highest normal score each member can give, from its sorted row of ``ordered`` (``[members, n]``).

    Its top score's normal score when several scores share it (a grade, a pass/fail check); a member whose
    best score was given once may score higher still (no ceiling is known: inf).
    """
    n = ordered.shape[1]
    tied = (ordered == ordered[:, -1:]).sum(axis=1, dtype=np.intp)  # np.count_nonzero's arithmetic
    return np.where(tied >= 2, _probits(n)[2 * n - tied], math.inf)


def _normal_scores(
    reference: Sequence[float] | NDArray[np.float64], values: NDArray[np.float64]
) -> NDArray[np.float64]:
    """Each value's normal score among the sorted ``reference`` (its mid-rank's probit; see JudgeGap)."""
    ordered = np.asarray(reference, dtype=np.float64)
    below = np.searchsorted(ordered, values, side="left")
    at_most = np.searchsorted(ordered, values, side="right")
    scores: NDArray[np.float64] = _probits(len(ordered))[below + at_most]
    return scores


# comparisons up to which counting by broadcasting beats a searchsorted per row: measured equal at 5 rows of
# 48 x 16 (3,840), per row 1.2-3x faster from 6,400 (the recent pool, 5 rows of 80 x 96: 37 vs 113 us)
_BROADCAST_CELLS = 1 << 12


def _normal_score_rows(ordered: NDArray[np.float64], values: NDArray[np.float64]) -> NDArray[np.float64]:
    """:func:`_normal_scores` of each row of ``values`` among the same row of ``ordered`` (rows sorted).

    The ranks are counts, so counting the row's entries below and at most each value by broadcasting, in
    one pass over all rows, gives exactly the ranks of a ``searchsorted`` per row; it is used while the
    comparisons stay few (small batches, where the per-row calls would cost more than the counting).
    """
    if ordered.shape[0] * ordered.shape[1] * values.shape[1] > _BROADCAST_CELLS:
        # each row's ranks as _normal_scores counts them, then one lookup of the probits for all rows
        ranks = np.empty(values.shape, dtype=np.intp)
        for row, query, rank in zip(ordered, values, ranks, strict=True):
            np.add(row.searchsorted(query, side="left"), row.searchsorted(query, side="right"), out=rank)
    else:
        grid, query = ordered[:, np.newaxis, :], values[:, :, np.newaxis]
        ranks = (grid < query).sum(axis=2, dtype=np.intp) + (grid <= query).sum(axis=2, dtype=np.intp)
    scores: NDArray[np.float64] = _probits(ordered.shape[1])[ranks]
    return scores


@attrs.frozen
class InfoRM(Detector):
    """InfoRM latent outliers (Miao et al. 2024): policy-output clusters far from the reference latents.

    Embeddings come from ``embed_fn(completions) -> [B, D]`` when given, otherwise from
    ``Observation.embeddings`` (then ``from_observations=True`` must be set, so a misconfiguration fails at
    construction). The reference latents are ``reference_embeddings`` when given, else
    ``Observation.reference_embeddings``, else the embeddings of the first half of the warm-up (up to
    ``reference_size`` rows); the CSI baseline is then taken over the second half.

    Args:
        embed_fn: Maps a list of completion strings to an array ``[B, D]``.
        from_observations: Read ``Observation.embeddings`` each step.
        reference_embeddings: Fixed reference latents ``[M, D]``.
        eps: DBSCAN radius; ``None`` picks the median distance from a reference point to its
            ``min_samples``-th nearest reference neighbour (the k-distance heuristic of Ester et al. 1996).
        min_samples: DBSCAN core-point size.
        statistic: ``"csi"`` (cluster separation index per point) or ``"mop"`` (Mahalanobis outlier fraction).
    """

    name: ClassVar[str] = "info_rm"
    needs: ClassVar[str] = "embeddings (embed_fn or Observation.embeddings)"
    advice: ClassVar[str] = (
        "the policy's outputs moved into a region of latent space the reference never produced: "
        "raise beta or retrain the reward model on recent samples"
    )
    embed_fn: Callable[[list[str]], Any] | None = attrs.field(default=None)
    from_observations: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    reference_embeddings: Any = attrs.field(default=None, eq=False)
    eps: float | None = attrs.field(default=None, validator=real(lo=0.0, lo_inclusive=False, optional=True))
    min_samples: int = attrs.field(default=5, validator=integer(lo=1, hi=10_000))
    statistic: Literal["csi", "mop"] = attrs.field(
        default="csi", validator=attrs.validators.in_(("csi", "mop"))
    )
    reference_size: int = attrs.field(default=1024, validator=integer(lo=8, hi=100_000))

    def __attrs_post_init__(self) -> None:
        """Require a source of embeddings."""
        if self.embed_fn is not None and not callable(self.embed_fn):
            msg = f"`embed_fn` must be callable, got {type(self.embed_fn).__name__}."
            raise LoopguardTypeError(msg)
        if self.embed_fn is None and not self.from_observations:
            msg = (
                "signal 'info_rm' needs embeddings: pass InfoRM(embed_fn=...) to embed completions, or "
                "InfoRM(from_observations=True) and put Observation.embeddings in every step."
            )
            raise ConfigError(msg)
        if self.reference_embeddings is not None:
            object.__setattr__(
                self,
                "reference_embeddings",
                as_float_array("reference_embeddings", self.reference_embeddings, ndim=2),
            )

    def metrics(self) -> tuple[Metric, ...]:
        """CSI per point (relative rise 0.5/1.5) or MOP (absolute rise 0.10/0.25)."""
        if self.statistic == "csi":
            return (Metric("csi", "up", True, 0.50, 1.50, unit="{:.4g}", domain=(0.0, None)),)
        return (Metric("mop", "up", False, 0.10, 0.25, unit="{:.1%}", domain=(0.0, 1.0)),)

    def _embeddings(self, data: StepData) -> NDArray[np.float64] | None:
        obs = data.observation
        if self.embed_fn is not None and obs.completions is not None:
            return as_float_array("embed_fn(completions)", self.embed_fn(list(obs.completions)), ndim=2)
        return obs.embeddings  # type: ignore[no-any-return]

    def _reference(self, data: StepData, memory: dict[str, Any]) -> NDArray[np.float64] | None:
        if self.reference_embeddings is not None:
            return self.reference_embeddings  # type: ignore[no-any-return]
        if data.observation.reference_embeddings is not None:
            return data.observation.reference_embeddings  # type: ignore[no-any-return]
        pool = memory.get("pool")
        return None if pool is None or not memory.get("frozen") else np.asarray(pool, dtype=np.float64)

    def check_memory(self, memory: object, path: str) -> dict[str, Any]:
        """Memory: reference ``pool`` (rows of one width), ``pool_steps``, ``frozen``, DBSCAN ``eps``."""
        fields = _memory_fields(memory, path, ("pool", "pool_steps", "frozen", "eps"))
        out: dict[str, Any] = {}
        if "pool" in fields:
            rows = fields.items("pool", max_length=self.reference_size)
            name = fields.name("pool")
            pool = [check_state_reals(f"{name}[{index}]", row) for index, row in enumerate(rows)]
            if pool and (len(pool[0]) == 0 or any(len(row) != len(pool[0]) for row in pool)):
                widths = sorted({len(row) for row in pool})
                msg = f"`{name}` must hold embeddings of one non-zero width, got widths {widths}."
                raise StateError(msg)
            out["pool"] = pool
        if "pool_steps" in fields:
            out["pool_steps"] = fields.integer("pool_steps", lo=0)
        if "frozen" in fields:
            out["frozen"] = fields.flag("frozen")
        if "eps" in fields:
            out["eps"] = fields.real("eps", lo=0.0, lo_inclusive=False)
        if out.get("frozen") and not out.get("pool"):
            msg = f"`{path}` must hold a reference pool once frozen, got {describe(memory)}."
            raise StateError(msg)
        return out

    def measure(self, data: StepData, memory: dict[str, Any]) -> Raw | None:
        """CSI or MOP of this step's embeddings against the reference."""
        embeddings = self._embeddings(data)
        if embeddings is None:
            return None
        reference = self._reference(data, memory)
        if reference is None:  # pool a reference from the first half of the warm-up
            pool = memory.setdefault("pool", [])
            pool.extend(embeddings.tolist())
            del pool[: max(0, len(pool) - self.reference_size)]
            memory["pool_steps"] = memory.get("pool_steps", 0) + 1
            if memory["pool_steps"] >= max(1, data.warmup_steps // 2):
                memory["frozen"] = True
            return None
        if self.statistic == "mop":
            return {"mop": signals.mahalanobis_outlier_fraction(embeddings, reference)}
        eps = self.eps if self.eps is not None else memory.get("eps")
        if eps is None:
            eps = _k_distance_eps(reference, self.min_samples)
            memory["eps"] = eps
        csi = signals.cluster_separation_index(
            embeddings, reference, eps=eps, min_samples=self.min_samples, include_noise=True, normalize=True
        )
        return {"csi": csi}


def _k_distance_eps(reference: NDArray[np.float64], min_samples: int) -> float:
    from sklearn.neighbors import NearestNeighbors

    k = min(min_samples, len(reference) - 1)
    if k < 1:
        return 1.0
    distances, _ = NearestNeighbors(n_neighbors=k + 1).fit(reference).kneighbors(reference)
    eps = float(np.median(distances[:, k]))
    return eps if eps > 0 and math.isfinite(eps) else 1.0


@attrs.frozen
class GoldAudit(Detector):
    """Gold audit: the proxy reward holds or rises while a trusted judge's score falls.

    The most direct evidence of hacking when a stronger judge or verifier exists. Gold scores come from
    ``Observation.gold`` (for ``Observation.gold_indices`` of the batch, or the whole batch), or from
    ``gold_fn(prompts, completions) -> scores`` called on ``sample_size`` completions every ``every`` steps
    (the sample is drawn with a generator seeded by ``(seed, step)``, so every rank picks the same one).

    Args:
        gold_fn: Optional judge called on a sample of (prompt, completion) strings.
        every: Audit period in steps when ``gold_fn`` is used.
        sample_size: Completions audited per audit.
        seed: Seed of the audit sample.
    """

    name: ClassVar[str] = "gold"
    holds: ClassVar[bool] = True
    needs: ClassVar[str] = "gold (Observation.gold or gold_fn with prompts and completions)"
    advice: ClassVar[str] = (
        "the proxy reward no longer tracks the gold judge: the policy games the proxy; fix the proxy reward "
        "or raise beta"
    )
    gold_fn: Callable[[list[str], list[str]], Any] | None = attrs.field(default=None)
    every: int = attrs.field(default=10, validator=integer(lo=1, hi=1_000_000))
    sample_size: int = attrs.field(default=16, validator=integer(lo=1, hi=100_000))
    seed: int = attrs.field(default=0, validator=integer(lo=0))

    def __attrs_post_init__(self) -> None:
        """Check the judge is callable."""
        if self.gold_fn is not None and not callable(self.gold_fn):
            msg = f"`gold_fn` must be callable, got {type(self.gold_fn).__name__}."
            raise LoopguardTypeError(msg)

    def metrics(self) -> tuple[Metric, ...]:
        """Gold mean (relative fall 0.10/0.30) and, as a gate, the proxy mean on the same samples."""
        return (Metric("gold", "down", True, 0.10, 0.30), Metric("proxy", "down", True, 0.10, 0.30))

    def _audit(self, data: StepData) -> tuple[NDArray[np.float64], NDArray[np.int64]] | None:
        obs = data.observation
        if obs.gold is not None:
            indices = obs.gold_indices if obs.gold_indices is not None else np.arange(len(obs.gold))
            return obs.gold, indices
        if self.gold_fn is None or obs.completions is None or obs.prompts is None:
            return None
        if obs.step % self.every != 0:
            return None
        rng = np.random.default_rng([self.seed, obs.step])
        size = min(self.sample_size, len(obs.completions))
        indices = np.sort(rng.choice(len(obs.completions), size=size, replace=False)).astype(np.int64)
        prompts = [obs.prompts[i] for i in indices]
        completions = [obs.completions[i] for i in indices]
        scores = as_float_array("gold_fn(prompts, completions)", self.gold_fn(prompts, completions))
        if len(scores) != size:
            msg = f"`gold_fn` must return one score per completion ({size}), got {len(scores)}."
            raise ConfigError(msg)
        return scores, indices

    def measure(self, data: StepData, memory: dict[str, Any]) -> Raw | None:
        """Gold and proxy means on the audited completions (None on steps without an audit)."""
        audit = self._audit(data)
        if audit is None:
            return None
        gold, indices = audit
        proxy = data.observation.rewards[indices]
        return {"gold": float(np.mean(gold)), "proxy": float(np.mean(proxy))}

    def combine(
        self, scores: Mapping[str, float], raw: Raw, baselines: Mapping[str, tuple[float, float]]
    ) -> float:
        """The gold score counts only while the proxy has not fallen below its own baseline (a real hack)."""
        proxy_median, _ = baselines["proxy"]
        if raw["proxy"] < proxy_median:
            return 0.0
        return scores["gold"]


_REGISTRY: dict[str, type[Detector]] = {
    cls.name: cls
    for cls in (
        Repetition,
        Diversity,
        Takeover,
        Length,
        Collapse,
        RewardDrift,
        RMEnsemble,
        JudgeGap,
        InfoRM,
        GoldAudit,
    )
}
SIGNAL_NAMES: tuple[str, ...] = tuple(sorted(_REGISTRY))
DEFAULT_SIGNALS: tuple[str, ...] = ("repetition", "diversity", "length", "collapse", "drift")
"""Signals computable from what every trainer has (rewards, completions, lengths, group size, entropy)."""


def detector_from_name(name: str) -> Detector:
    """Build the default config of a named signal.

    Raises:
        ConfigError: unknown name (the message lists the known ones), or a signal that cannot run with
            defaults (``info_rm`` needs an embedding source).

    Example:
        >>> detector_from_name("repetition")
        Repetition(n=2, trap_rate=0.6, echo=None, trapped_bands=(0.25, 0.5), against_baseline=True)
    """
    if not isinstance(name, str):
        msg = f"`signals` entries must be signal names or detector configs, got {name!r}."
        raise LoopguardTypeError(msg)
    if name not in _REGISTRY:
        options = ", ".join(repr(option) for option in SIGNAL_NAMES)
        msg = f"`signals` must name known signals ({options}), got {name!r}."
        raise ConfigError(msg)
    return _REGISTRY[name]()


def as_detectors(specs: Sequence[str | Detector] | None) -> tuple[Detector, ...]:
    """Normalise a ``signals=`` argument into detector configs (defaults when ``None``), rejecting repeats."""
    if specs is None:
        return tuple(detector_from_name(name) for name in DEFAULT_SIGNALS)
    if isinstance(specs, (str, bytes)) or not isinstance(specs, Sequence):
        msg = f"`signals` must be a list of signal names or detector configs, got {specs!r}."
        raise LoopguardTypeError(msg)
    detectors = tuple(spec if isinstance(spec, Detector) else detector_from_name(spec) for spec in specs)
    names = [d.name for d in detectors]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        msg = f"`signals` must name each signal once, got {', '.join(repeated)} more than once."
        raise ConfigError(msg)
    return detectors
