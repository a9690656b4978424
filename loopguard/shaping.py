r"""Bounded reward shaping that group normalisation cannot cancel, and that never hides the hack.

:func:`shape_reward` wraps a TRL-style reward function ``fn(prompts=..., completions=..., completion_ids=...,
**columns)`` and subtracts a penalty from each reward. Three gamed features are penalised:

* ``"length"`` -- tokens (or words) beyond a target length;
* ``"repetition"`` -- the per-completion n-gram repetition rate
  (:func:`loopguard.signals.ngram_repetition_rate`);
* ``"sentinel"`` -- occurrences of configured strings (an empty ``<think></think>`` block, a canned refusal,
  a reward-model trigger phrase).

Two design rules follow from what went wrong before (see ``docs/``):

1. **No flat region.** GRPO turns the rewards of each group of completions into advantages
   :math:`A_i = (r_i - \bar r_g) / \sigma_g`. A penalty that saturates (a cap at 32 words, a clipped ramp)
   gives the same value to every completion past the cap, so it drops out of the advantage exactly: the
   policy is no longer pushed away from *longer* once it is long. Every penalty here is bounded by
   ``strength`` and *strictly increasing* in the gamed feature, so two completions that differ in the feature
   always differ in the penalty.
2. **The unshaped reward stays observable.** Each call publishes a frozen :class:`ShapingRecord` (raw
   rewards, penalties, shaped rewards, the measured feature) on ``wrapper.last_call``, and, when TRL passes
   its ``log_metric`` / ``log_extra`` callbacks, also logs the unshaped reward next to the shaped one. A Guard
   must read the raw rewards, never the shaped ones: shaping lowers exactly the reward a hack inflates.

Example:
    >>> from loopguard.shaping import shape_reward
    >>> def correct(prompts, completions, **kwargs):
    ...     return [1.0 for _ in completions]
    >>> shaped = shape_reward(correct, "length", 0.5, target_length=4)
    >>> shaped(prompts=["q", "q"], completions=["a b c", "a b c d e f g h"])
    [1.0, 0.75]
    >>> shaped.__name__, shaped.last_call.raw
    ('correct', (1.0, 1.0))
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, cast

import attrs
import numpy as np
from numpy.typing import ArrayLike, NDArray

from loopguard._reward_fn import CallLog, check_reward_fn, plain_number, reward_name, wrap_reward
from loopguard._validation import (
    MAX_NGRAM_N,
    MAX_TOKENS_PER_TRAJECTORY,
    MAX_TRAJECTORIES,
    as_float_array,
    boolean,
    check_bool,
    check_choice,
    check_int,
    check_text,
    describe,
    integer,
    one_of,
    real,
)
from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError
from loopguard.signals import as_token_batch, ngram_repetition_rate

__all__ = [
    "MAX_SENTINELS",
    "MAX_SENTINEL_LENGTH",
    "LengthUnit",
    "ShapedReward",
    "ShapingConfig",
    "ShapingKind",
    "ShapingMeasure",
    "ShapingRecord",
    "shape_reward",
]

ShapingKind = Literal["length", "repetition", "sentinel"]
"""The gamed feature a shaped reward penalises."""

LengthUnit = Literal["auto", "tokens", "words"]
"""How ``"length"`` and ``"repetition"`` read a completion: ``"auto"`` uses token ids when given."""

ShapingMeasure = Literal["tokens", "words", "occurrences"]
"""What the features of one :class:`ShapingRecord` count."""

MAX_SENTINELS = 64
"""DoS cap: at most this many sentinel strings."""

MAX_SENTINEL_LENGTH = 256
"""DoS cap: at most this many characters in one sentinel string."""

_KINDS: tuple[str, ...] = ("length", "repetition", "sentinel")
_UNITS: tuple[str, ...] = ("auto", "tokens", "words")
# Which kinds each optional keyword argument applies to; passing it for another kind is an error. Once
# defaults are filled in, each of these is also required (non-None) for the kinds it applies to.
_APPLIES_TO: dict[str, tuple[str, ...]] = {
    "target_length": ("length",),
    "scale": ("length",),
    "n": ("repetition",),
    "unit": ("length", "repetition"),
    "sentinels": ("sentinel",),
}


# --------------------------------------------------------------------------------------------------
# configuration


def _check_applicable(kind: str, values: dict[str, object], *, require: bool) -> None:
    """Reject arguments ``kind`` ignores (no silent no-ops); with ``require``, demand those it uses."""
    for field, value in values.items():
        kinds = _APPLIES_TO[field]
        if value is not None and kind not in kinds:
            users = " and ".join(repr(user) for user in kinds)
            msg = (
                f"`{field}` must be None when `kind` is {kind!r} (it only applies to {users}), "
                f"got {describe(value)}."
            )
            raise ConfigError(msg)
        if require and value is None and kind in kinds:
            msg = f"`{field}` must be given when `kind` is {kind!r}, got None."
            raise ConfigError(msg)


def _validate_sentinels(_instance: Any, _attribute: Any, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, tuple):
        msg = f"`sentinels` must be a tuple of strings, got {describe(value)} of type {type(value).__name__}."
        raise LoopguardTypeError(msg)
    if not value:
        msg = "`sentinels` must hold at least one string, got ()."
        raise ConfigError(msg)
    if len(value) > MAX_SENTINELS:
        msg = f"`sentinels` must hold at most {MAX_SENTINELS} strings (DoS cap), got {len(value)}."
        raise ConfigError(msg)
    seen: set[str] = set()
    for index, item in enumerate(value):
        name = f"sentinels[{index}]"
        check_text(name, item, max_length=MAX_SENTINEL_LENGTH)
        if item in seen:
            msg = f"`{name}` must not repeat an earlier sentinel (it would count twice), got {item!r}."
            raise ConfigError(msg)
        seen.add(item)


@attrs.frozen
class ShapingConfig:
    r"""The validated, resolved settings of one shaped reward (``wrapper.shaping``).

    Built by :func:`shape_reward`, which fills the per-kind defaults; constructing one directly validates the
    same rules. Fields that do not apply to ``kind`` are ``None``.

    Attributes:
        kind: ``"length"``, ``"repetition"`` or ``"sentinel"``.
        strength: Upper bound of the penalty, finite and > 0.
        target_length: ``"length"`` only: the length at and below which there is no penalty, in
            ``[0, MAX_TOKENS_PER_TRAJECTORY]``.
        scale: ``"length"`` only: the excess length at which the penalty reaches ``strength / 2``, >= 1.
        n: ``"repetition"`` only: n-gram length in ``[1, MAX_NGRAM_N]``.
        unit: ``"length"`` / ``"repetition"`` only: ``"auto"``, ``"tokens"`` or ``"words"``.
        sentinels: ``"sentinel"`` only: the strings to count.
        log_to_trainer: Whether to report unshaped rewards through TRL's ``log_metric`` / ``log_extra``.

    Example:
        >>> config = ShapingConfig(kind="length", strength=1.0, target_length=10, scale=10.0, unit="auto")
        >>> config.penalty([5, 10, 20, 30])
        array([0. , 0. , 0.5 , 0.666...])
    """

    kind: str = attrs.field(validator=one_of(*_KINDS))
    strength: float = attrs.field(validator=real(lo=0.0, lo_inclusive=False))
    target_length: int | None = attrs.field(
        default=None, validator=integer(lo=0, hi=MAX_TOKENS_PER_TRAJECTORY, optional=True)
    )
    scale: float | None = attrs.field(default=None, validator=real(lo=1.0, optional=True))
    n: int | None = attrs.field(default=None, validator=integer(lo=1, hi=MAX_NGRAM_N, optional=True))
    unit: str | None = attrs.field(default=None, validator=one_of(*_UNITS, optional=True))
    sentinels: tuple[str, ...] | None = attrs.field(default=None, validator=_validate_sentinels)
    log_to_trainer: bool = attrs.field(default=True, validator=boolean())

    def __attrs_post_init__(self) -> None:
        """Require every field the kind needs and reject every field it ignores (no silent no-ops)."""
        _check_applicable(self.kind, {field: getattr(self, field) for field in _APPLIES_TO}, require=True)

    def penalty(self, features: ArrayLike) -> NDArray[np.float64]:
        r"""Map measured features to penalties in ``[0, strength]``.

        With :math:`s` = ``strength``:

        .. math::

            p_{\mathrm{length}}(L) = s\,\frac{x}{x + \kappa},\quad x = \max(0, L - L_0);\qquad
            p_{\mathrm{repetition}}(r) = s\,r;\qquad
            p_{\mathrm{sentinel}}(c) = s\,\frac{c}{c + 1}

        where :math:`L_0` is ``target_length`` and :math:`\kappa` is ``scale``. Each map is 0 at no excess,
        strictly increasing after it (for length: strictly increasing for :math:`L > L_0`, zero at and below
        it), and stays below :math:`s` (repetition reaches :math:`s` only at rate 1).

        Args:
            features: 1-D array of lengths (``"length"``), repetition rates in ``[0, 1]``
                (``"repetition"``) or occurrence counts (``"sentinel"``); all finite and >= 0. May be empty.

        Returns:
            A float64 array of penalties, same shape as ``features``.

        Raises:
            LoopguardTypeError: ``features`` is not an array of real numbers.
            InputError: ``features`` is not 1-D, holds NaN/Inf or negative values, or (``"repetition"``)
                values above 1.

        Example:
            >>> config = ShapingConfig(kind="sentinel", strength=1.0, sentinels=("<think></think>",))
            >>> config.penalty([0, 1, 3])
            array([0. , 0.5 , 0.75])
        """
        values = as_float_array("features", features, allow_empty=True)
        if values.size and float(values.min()) < 0.0:
            msg = f"`features` must be >= 0, got {float(values.min())!r}."
            raise InputError(msg)
        if self.kind == "repetition":
            if values.size and float(values.max()) > 1.0:
                msg = f"`features` must be repetition rates in [0, 1], got {float(values.max())!r}."
                raise InputError(msg)
            return self.strength * values
        if self.kind == "length":
            excess = np.maximum(values - float(cast(int, self.target_length)), 0.0)
            return self.strength * excess / (excess + cast(float, self.scale))
        return self.strength * values / (values + 1.0)


# --------------------------------------------------------------------------------------------------
# records


@attrs.frozen
class ShapingRecord:
    """What one call of a shaped reward saw and returned (``wrapper.last_call``), one entry per completion.

    Attributes:
        call_index: 1 for the wrapper's first published call, then 2, 3, ... (per process). A reader that
            remembers the last index it consumed can tell a new call from one it has already seen, and a
            jump of more than 1 from calls it missed.
        global_step: ``trainer_state.global_step`` when TRL passed ``trainer_state``, else ``None``.
        kind: The shaping kind.
        measure: What :attr:`features` count: ``"tokens"``, ``"words"`` (length and repetition rates are
            computed on these) or ``"occurrences"`` (sentinel).
        features: The measured feature: length, repetition rate, or sentinel count.
        raw: The wrapped function's rewards, unchanged (``None`` where it returned ``None``).
        penalties: The penalty subtracted, or ``None`` where none was applied (a non-finite or ``None`` raw
            reward).
        shaped: What the wrapper returned: ``raw - penalty``, or the raw value where no penalty was applied.

    Example:
        >>> record = ShapingRecord(call_index=1, global_step=None, kind="sentinel", measure="occurrences",
        ...                        features=(1.0,), raw=(2.0,), penalties=(0.5,), shaped=(1.5,))
        >>> record.raw_rewards()
        array([2.])
    """

    call_index: int
    global_step: int | None
    kind: str
    measure: str
    features: tuple[float, ...]
    raw: tuple[float | None, ...]
    penalties: tuple[float | None, ...]
    shaped: tuple[float | None, ...]

    def raw_rewards(self) -> NDArray[np.float64]:
        """Return the unshaped rewards as a float64 array, with ``None`` entries as NaN (TRL's convention).

        NaN here always means "the reward function returned ``None`` (or NaN) for this completion", never a
        computation failure: drop those entries before computing statistics (``np.nanmean`` or a mask).
        """
        return np.array([math.nan if value is None else value for value in self.raw], dtype=np.float64)


class ShapedReward(Protocol):
    """A reward function returned by :func:`shape_reward`: callable like the original, plus observability.

    Attributes:
        unshaped: The wrapped reward function, exactly as passed.
        shaping: The resolved :class:`ShapingConfig`.
        last_call: The :class:`ShapingRecord` of the most recent completed call, or ``None`` before the
            first.
    """

    __name__: str
    __qualname__: str
    __doc__: str | None
    __module__: str
    unshaped: Callable[..., Any]
    shaping: ShapingConfig
    last_call: ShapingRecord | None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function and return shaped rewards (a coroutine when the original is async)."""


# --------------------------------------------------------------------------------------------------
# measuring completions


def _message_text(message: object, where: str) -> str | None:
    """Text of one chat message if it is an assistant message, else ``None``."""
    if not isinstance(message, dict):
        msg = f"`{where}` must be a message dict with 'role' and 'content', got {describe(message)}."
        raise LoopguardTypeError(msg)
    if message.get("role") != "assistant":
        return None
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):  # multimodal content blocks: keep the text parts
        parts = [part.get("text") for part in content if isinstance(part, dict)]
        return "\n".join(part for part in parts if isinstance(part, str))
    msg = f"`{where}['content']` must be a string, a list of content blocks or None, got {describe(content)}."
    raise LoopguardTypeError(msg)


def _completion_text(completion: object, index: int) -> str:
    """Text of one completion: a string, or the assistant contents of a conversation joined by newlines."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)):
        texts = [_message_text(message, f"completions[{index}][{j}]") for j, message in enumerate(completion)]
        return "\n".join(text for text in texts if text is not None)
    msg = (
        f"`completions[{index}]` must be a string or a list of chat messages, "
        f"got {describe(completion)} of type {type(completion).__name__}."
    )
    raise LoopguardTypeError(msg)


def _measure(
    config: ShapingConfig, completions: object, completion_ids: object
) -> tuple[NDArray[np.float64], str]:
    """Measure the gamed feature of every completion; return features and what they count."""
    if isinstance(completions, (str, bytes)) or not isinstance(completions, Sequence):
        msg = f"`completions` must be a list of completions, got {describe(completions)}."
        raise LoopguardTypeError(msg)
    count = len(completions)
    if count > MAX_TRAJECTORIES:
        msg = f"`completions` must have at most {MAX_TRAJECTORIES:,} entries (DoS cap), got {count:,}."
        raise InputError(msg)
    texts = [_completion_text(completion, i) for i, completion in enumerate(completions)]

    if config.kind == "sentinel":
        sentinels = cast(tuple[str, ...], config.sentinels)
        counts = [sum(text.count(sentinel) for sentinel in sentinels) for text in texts]
        return np.asarray(counts, dtype=np.float64), "occurrences"

    use_tokens = config.unit == "tokens" or (config.unit == "auto" and completion_ids is not None)
    if config.unit == "tokens" and completion_ids is None:
        msg = "`completion_ids` must be passed when `unit` is 'tokens', got None."
        raise InputError(msg)
    if count == 0:
        return np.zeros(0, dtype=np.float64), "tokens" if use_tokens else "words"

    if use_tokens:
        rows = completion_ids if isinstance(completion_ids, Sequence) else ()
        if any(isinstance(row, (str, bytes)) for row in rows):
            msg = "`completion_ids` must hold token-id sequences, got strings."
            raise LoopguardTypeError(msg)
        batch = as_token_batch("completion_ids", completion_ids)
        source: object = batch
        lengths = batch.lengths
        if len(lengths) != count:
            msg = (
                "`completion_ids` and `completions` must have the same length, "
                f"got {len(lengths)} and {count}."
            )
            raise InputError(msg)
        measure = "tokens"
    else:
        source = texts
        lengths = np.fromiter((len(text.split()) for text in texts), dtype=np.int64, count=count)
        measure = "words"

    if config.kind == "length":
        return lengths.astype(np.float64), measure
    return ngram_repetition_rate(source, cast(int, config.n), reduce="none"), measure


# --------------------------------------------------------------------------------------------------
# combining rewards and penalties


def _as_reward(value: object, index: int) -> float | None:
    """One raw reward as ``float`` (``None`` kept); numpy / torch scalars are unwrapped."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        msg = f"`fn` must return real numbers or None, got {value!r} (bool) at index {index}."
        raise LoopguardTypeError(msg)
    unwrapped = plain_number(value)
    if unwrapped is not value:
        return _as_reward(unwrapped, index)
    if not isinstance(value, numbers.Real):
        msg = f"`fn` must return real numbers or None, got {describe(value)} at index {index}."
        raise LoopguardTypeError(msg)
    return float(value)


def _raw_rewards(output: object, count: int) -> list[float | None]:
    if output is None or isinstance(output, (str, bytes, dict)) or not hasattr(output, "__iter__"):
        msg = f"`fn` must return a sequence of rewards (one per completion), got {describe(output)}."
        raise LoopguardTypeError(msg)
    rewards = [_as_reward(value, i) for i, value in enumerate(cast(Any, output))]
    if len(rewards) != count:
        msg = f"`fn` must return one reward per completion, got {len(rewards)} for {count} completions."
        raise InputError(msg)
    return rewards


def _global_step(trainer_state: object) -> int | None:
    step: object = getattr(trainer_state, "global_step", None)
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, numbers.Integral):
        return None
    return int(step)


def _mean(values: Sequence[float | None]) -> float | None:
    finite = [value for value in values if value is not None and math.isfinite(value)]
    return math.fsum(finite) / len(finite) if finite else None


def _penalise(raw: list[float | None], penalty: list[float]) -> tuple[list[float | None], list[float | None]]:
    """Penalties applied and shaped rewards: a ``None`` or non-finite raw reward gets none and stays."""
    penalties: list[float | None] = []
    shaped: list[float | None] = []
    for value, amount in zip(raw, penalty, strict=True):
        if value is None or not math.isfinite(value):
            penalties.append(None)
            shaped.append(value)
        else:
            penalties.append(amount)
            shaped.append(value - amount)
    return penalties, shaped


def _log_unshaped(
    kwargs: dict[str, Any], name: str, raw: list[float | None], penalties: list[float | None]
) -> None:
    """Report the unshaped rewards and penalties through TRL's ``log_extra`` / ``log_metric`` when passed."""
    log_metric, log_extra = kwargs.get("log_metric"), kwargs.get("log_extra")
    if callable(log_extra):
        log_extra(f"{name}/unshaped", raw)
        log_extra(f"{name}/penalty", penalties)
    if callable(log_metric):
        for suffix, values in (("unshaped_mean", raw), ("penalty_mean", penalties)):
            mean = _mean(values)
            if mean is not None:
                log_metric(f"{name}/{suffix}", mean)


class _Shaper:
    """The steps around one wrapped call: measure before it; penalise, publish and log after it."""

    def __init__(self, config: ShapingConfig, name: str) -> None:
        self.config = config
        self.name = name
        self.calls: CallLog[ShapingRecord] = CallLog(keep=1)  # numbers the records; one lock
        self.owner: ShapedReward | None = None

    def prepare(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[NDArray[np.float64], str]:
        """Measure the completions (refusing a call without ``completions=``) before ``fn`` runs."""
        if "completions" not in kwargs:
            msg = (
                f"the shaped reward function {self.name!r} must be called with `completions=` as a keyword "
                "argument (TRL's convention), got keywords "
                f"{sorted(kwargs)!r}."
            )
            raise LoopguardTypeError(msg)
        return _measure(self.config, kwargs["completions"], kwargs.get("completion_ids"))

    def finish(
        self,
        prepared: tuple[NDArray[np.float64], str],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: object,
    ) -> list[float | None]:
        """Subtract the penalties from ``fn``'s output, publish the record, log, return the shaped rewards."""
        features, measure = prepared
        raw = _raw_rewards(output, len(features))
        penalties, shaped = _penalise(raw, self.config.penalty(features).tolist())
        record = ShapingRecord(
            call_index=0,
            global_step=_global_step(kwargs.get("trainer_state")),
            kind=self.config.kind,
            measure=measure,
            features=tuple(features.tolist()),
            raw=tuple(raw),
            penalties=tuple(penalties),
            shaped=tuple(shaped),
        )
        self.calls.add(lambda index: self._publish(attrs.evolve(record, call_index=index)))
        if self.config.log_to_trainer:
            _log_unshaped(kwargs, self.name, raw, penalties)
        return shaped

    def _publish(self, record: ShapingRecord) -> ShapingRecord:
        if self.owner is not None:
            self.owner.last_call = record
        return record


def _resolve_config(
    kind: object, strength: float, given: dict[str, Any], log_to_trainer: object
) -> ShapingConfig:
    """Validate :func:`shape_reward`'s arguments (``given``: the per-kind ones), fill in the defaults."""
    kind = cast(ShapingKind, check_choice("kind", kind, _KINDS))
    log_to_trainer = check_bool("log_to_trainer", log_to_trainer)
    _check_applicable(kind, given, require=False)  # required ones are checked once defaults are filled in
    values = dict(given)
    if kind == "length":
        if values["target_length"] is not None and values["scale"] is None:
            length0 = check_int("target_length", values["target_length"], lo=0, hi=MAX_TOKENS_PER_TRAJECTORY)
            values["scale"] = float(max(length0, 1))
        values["unit"] = "auto" if values["unit"] is None else values["unit"]
    elif kind == "repetition":
        values["n"] = 2 if values["n"] is None else values["n"]
        values["unit"] = "auto" if values["unit"] is None else values["unit"]
    if isinstance(values["sentinels"], list):
        values["sentinels"] = tuple(values["sentinels"])
    config = ShapingConfig(kind=kind, strength=strength, log_to_trainer=log_to_trainer, **values)
    # attrs validated the values; store them normalised (float strength, int lengths).
    return attrs.evolve(
        config,
        strength=float(config.strength),
        target_length=None if config.target_length is None else int(config.target_length),
        scale=None if config.scale is None else float(config.scale),
        n=None if config.n is None else int(config.n),
    )


def shape_reward(
    fn: Callable[..., Any],
    kind: ShapingKind = "length",
    strength: float = 0.5,
    *,
    target_length: int | None = None,
    scale: float | None = None,
    n: int | None = None,
    unit: LengthUnit | None = None,
    sentinels: Sequence[str] | None = None,
    log_to_trainer: bool = True,
) -> ShapedReward:
    r"""Wrap a reward function so it subtracts a bounded, strictly increasing penalty on a gamed feature.

    The wrapper is called exactly like ``fn`` -- TRL's ``fn(prompts=..., completions=..., completion_ids=...,
    **dataset_columns, trainer_state=..., log_extra=..., log_metric=...)``, with ``completions`` passed by
    keyword -- forwards every argument unchanged, and returns one shaped reward per completion:

    .. math::

        \tilde r_i = r_i - p(f_i), \qquad 0 \le p(f_i) \le s

    with :math:`s` = ``strength`` and :math:`f_i` the gamed feature of completion :math:`i`:

    .. math::

        p_{\mathrm{length}} = s\,\frac{x_i}{x_i + \kappa},\ x_i = \max(0, L_i - L_0);\qquad
        p_{\mathrm{repetition}} = s\,\rho_i;\qquad
        p_{\mathrm{sentinel}} = s\,\frac{c_i}{c_i + 1}

    :math:`L_i` is the length, :math:`L_0` = ``target_length``, :math:`\kappa` = ``scale``, :math:`\rho_i`
    the per-completion n-gram repetition rate (:func:`loopguard.signals.ngram_repetition_rate`), and
    :math:`c_i` the total number of (non-overlapping, per sentinel) occurrences of the ``sentinels`` in the
    completion's text. No map has a flat region after it starts: a longer (more repetitive, more
    sentinel-laden) completion always gets a strictly larger penalty, so GRPO's per-group normalisation
    :math:`(\tilde r_i - \bar{\tilde r}_g)/\sigma_g` still ranks it lower. A capped penalty would give the
    same value to every completion past the cap, which the normalisation subtracts away.

    **What is measured.** ``"length"`` and ``"repetition"`` read token ids when ``completion_ids`` is passed
    (TRL always passes it; ``len(completion_ids[i])`` is the length, which in tool-calling runs includes
    tool-result tokens) and whitespace-separated words of the text otherwise (``unit="auto"``); ``unit=
    "tokens"`` or ``"words"`` forces one. ``"sentinel"`` always reads text. A conversational completion (a
    list of ``{"role", "content"}`` messages) contributes the contents of its assistant messages joined by
    newlines (text blocks of multimodal content included; other roles, such as tool results, ignored).

    **Not applicable.** A ``None`` reward (TRL: "this function does not apply to this completion") stays
    ``None`` and gets no penalty; so do NaN and infinite rewards, which are returned unchanged.

    **Observing the unshaped reward.** After every call the wrapper publishes a frozen
    :class:`ShapingRecord` on ``wrapper.last_call`` (raw rewards, penalties, shaped rewards, features, a
    per-process ``call_index`` and TRL's ``global_step``); ``wrapper.unshaped`` is ``fn`` and
    ``wrapper.shaping`` the resolved :class:`ShapingConfig`. A Guard must score ``last_call.raw_rewards()``
    (or ``fn`` itself), never the shaped rewards, which the penalty pushes down exactly when a length or
    repetition hack pushes the raw reward up. Read ``last_call`` once per generation batch and skip a record
    whose ``call_index`` you have already consumed (TRL reuses one generation batch for
    ``steps_per_generation`` optimizer steps, and also calls reward functions during evaluation, so compare
    ``global_step`` too). The record is replaced whole under a lock, so a reader in another thread sees one
    complete call, never a mix; only the latest call is kept. The record is per process: under DDP each rank
    sees its own slice. With ``log_to_trainer=True`` and TRL's callbacks present, the wrapper also logs the
    metrics ``<name>/unshaped_mean`` and ``<name>/penalty_mean`` (``log_metric``; TRL averages them over
    ranks) and the per-completion columns ``<name>/unshaped`` and ``<name>/penalty`` (``log_extra``; TRL
    gathers them over ranks into its completions log). Wrapping a shaped reward again stacks the penalties;
    the outer record's ``raw`` is then the inner wrapper's output, and the true raw reward is on the
    innermost wrapper's ``last_call``.

    **Identity.** The wrapper keeps ``fn``'s ``__name__`` (TRL's metric name ``rewards/<name>/mean``),
    ``__qualname__``, ``__doc__`` and ``__module__`` (partials are unwrapped as TRL does; a callable instance
    without ``__name__`` lends its class name), and is a coroutine function (``async def``) exactly when
    calling ``fn`` returns a coroutine (async functions, partials of them, instances with an async
    ``__call__``).

    Args:
        fn: The reward function to wrap (sync or async; a function, ``functools.partial`` or callable
            instance). A torch ``nn.Module`` reward model is rejected: TRL calls those with tokenised inputs,
            not with completions.
        kind: The gamed feature: ``"length"``, ``"repetition"`` or ``"sentinel"``. Default ``"length"``.
        strength: Upper bound :math:`s` of the penalty, finite and > 0. Default 0.5: half the gap between a
            wrong (0) and a right (1) answer under a binary correctness reward, so shaping can reorder
            completions of equal correctness but never rank a wrong answer above a right one.
        target_length: ``"length"`` only, required: the length (tokens or words, see ``unit``) up to which
            there is no penalty, in ``[0, MAX_TOKENS_PER_TRAJECTORY]`` (1,000,000).
        scale: ``"length"`` only: excess length :math:`\kappa` at which the penalty is ``strength / 2``, >= 1.
            Default ``max(target_length, 1)``: half the maximum penalty at twice the target, 0.8 of it at five
            times the target. Smaller values punish the first excess tokens harder; the penalty keeps
            rising either way.
        n: ``"repetition"`` only: n-gram length in ``[1, MAX_NGRAM_N]`` (32). Default 2 (bigrams).
        unit: ``"length"`` / ``"repetition"`` only: ``"auto"`` (default: tokens when ``completion_ids`` is
            passed, else words), ``"tokens"`` (``completion_ids`` then required at call time) or ``"words"``.
        sentinels: ``"sentinel"`` only, required: a non-empty tuple (or list) of distinct non-empty strings
            without null bytes, at most ``MAX_SENTINELS`` (64) of at most ``MAX_SENTINEL_LENGTH`` (256)
            characters each. Counting is case-sensitive substring counting (``str.count``).
        log_to_trainer: Report the unshaped reward through TRL's ``log_metric`` / ``log_extra`` when they are
            passed. Default ``True``.

    Returns:
        A :class:`ShapedReward`: a function (``async`` when ``fn`` is) returning a list of floats (``None``
        kept), with the attributes ``unshaped``, ``shaping`` and ``last_call``.

    Raises:
        LoopguardTypeError: ``fn`` not callable or a torch module; ``strength``, ``scale``,
            ``target_length``, ``n`` or ``log_to_trainer`` of the wrong type (a bool for a number);
            ``sentinels`` not a tuple or list of strings.
        ConfigError: unknown ``kind`` or ``unit``; ``strength`` not finite or <= 0; a value out of range; a
            required per-kind argument missing; an argument given for a kind it does not apply to (it would
            be silently ignored); empty, duplicate, over-long or null-byte sentinels.

        At call time the wrapper raises ``LoopguardTypeError`` when ``completions`` is not passed by keyword
        or is malformed, or ``fn`` returns something other than real numbers / ``None``; ``InputError`` when
        ``fn`` returns the wrong number of rewards, ``completion_ids`` does not match ``completions``, or a
        DoS cap is exceeded.

    Example:
        >>> def judge(prompts, completions, **kwargs):
        ...     return [1.0, 1.0, None]
        >>> shaped = shape_reward(judge, "sentinel", 1.0, sentinels=("<think></think>",))
        >>> shaped(prompts=["p"] * 3, completions=["ok", "<think></think> ok", "<think></think>"])
        [1.0, 0.5, None]
        >>> shaped.last_call.features, shaped.last_call.penalties
        ((0.0, 1.0, 1.0), (0.0, 0.5, None))
        >>> shape_reward(judge, "repetition", 0.5, target_length=10)
        Traceback (most recent call last):
        ...
        loopguard.exceptions.ConfigError: `target_length` must be None when `kind` is 'repetition' (it only applies to 'length'), got 10.

    References:
        Zhihong Shao, Peiyi Wang, Qihao Zhu, et al. (2024). "DeepSeekMath: Pushing the Limits of Mathematical
        Reasoning in Open Language Models." arXiv:2402.03300 (GRPO's group-normalised advantage).
        Zihan Wang, Kangrui Wang, Qineng Wang, et al. (2025). "RAGEN: Understanding Self-Evolution in LLM
        Agents via Multi-Turn Reinforcement Learning." arXiv:2504.20073 (the repetition "echo trap").
    """  # noqa: E501
    check_reward_fn("fn", fn, ", so wrap a function that scores completions instead.")
    given = {"target_length": target_length, "scale": scale, "n": n, "unit": unit, "sentinels": sentinels}
    config = _resolve_config(kind, strength, given, log_to_trainer)
    shaper = _Shaper(config, reward_name(fn))
    wrapper = wrap_reward(fn, shaper.finish, prepare=shaper.prepare, copy_attributes=True, module=__name__)
    shaped = cast(ShapedReward, wrapper)
    shaped.unshaped = fn
    shaped.shaping = config
    shaped.last_call = None
    shaper.owner = shaped
    return shaped
