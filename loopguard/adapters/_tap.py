"""``loopguard.tap``: record what a reward function saw and returned, for trainers that do not expose it.

GRPO and RLOO keep every completion and every reward function's output in ``trainer._logs``, so the
:class:`~loopguard.RewardHackMitigator` reads them there. Other trainers (TRL's online DPO, a custom
``Trainer`` subclass, a raw loop) compute rewards and throw them away. Wrapping the reward function with
:func:`tap` keeps a bounded record of each call -- prompts, completions, completion token ids, rewards, and
the unshaped rewards when the function is a :func:`~loopguard.shape_reward` wrapper -- which the callbacks
read once per training step.

No torch, no transformers: ``import loopguard`` exports :func:`tap` directly.

Example:
    >>> import loopguard
    >>> def correct(prompts, completions, **kwargs):
    ...     return [float("4" in c) for c in completions]
    >>> tapped = loopguard.tap(correct)
    >>> tapped(prompts=["2+2=", "2+2="], completions=["4", "5"])
    [1.0, 0.0]
    >>> tapped.__name__, [record.rewards for record in tapped.records()]
    ('correct', [(1.0, 0.0)])
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import attrs

from loopguard._reward_fn import CallLog, check_reward_fn, real_or_none, reward_name, wrap_reward
from loopguard._validation import check_int
from loopguard.shaping import _completion_text

__all__ = ["TapRecord", "TappedReward", "completion_text", "is_tapped", "prompt_text", "tap"]

_DEFAULT_MAX_CALLS = 256


def completion_text(completion: object) -> str:
    """Text of one completion: a string, or the assistant contents of a conversation joined by newlines.

    Example:
        >>> completion_text([{"role": "assistant", "content": "hi"}])
        'hi'
    """
    return _completion_text(completion, 0)


def prompt_text(prompt: object) -> str:
    r"""Text of one prompt: a string, or every message's text content joined by newlines.

    Example:
        >>> prompt_text([{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}])
        'be brief\n2+2?'
    """
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)):
        parts: list[str] = []
        for message in prompt:
            content = message.get("content") if isinstance(message, dict) else message
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, (list, tuple)):
                parts.extend(
                    block["text"]
                    for block in content
                    if isinstance(block, dict) and isinstance(block.get("text"), str)
                )
        return "\n".join(parts)
    return str(prompt)


def _reward(value: object) -> float | None:
    return real_or_none(value, refuse=True)


def _ids(value: object) -> tuple[tuple[int, ...], ...] | None:
    if value is None:
        return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, Sequence):
        return None
    # copied row by row in C (TRL passes lists of Python ints); the Observation checks every id later, and
    # names the row of one that is not an integer
    return tuple(tuple(row.tolist() if hasattr(row, "tolist") else row) for row in value)


@attrs.frozen
class TapRecord:
    """One call of a tapped reward function.

    Attributes:
        index: 1-based call number of this wrapper (consumers remember the last index they read).
        global_step: ``trainer_state.global_step`` when the trainer passed its state, else None.
        prompts: Prompt texts (conversations flattened to text), or None when not passed.
        completions: Completion texts (assistant contents of conversations).
        completion_ids: Completion token ids when the caller passed ``completion_ids``, else None.
        rewards: What the function returned, ``None`` (and NaN) kept as ``None``.
        unshaped: The unshaped rewards when the tapped function is a :func:`~loopguard.shape_reward`
            wrapper, else None.
    """

    index: int
    global_step: int | None
    prompts: tuple[str, ...] | None
    completions: tuple[str, ...]
    completion_ids: tuple[tuple[int, ...], ...] | None
    rewards: tuple[float | None, ...]
    unshaped: tuple[float | None, ...] | None

    def proxy(self) -> tuple[float | None, ...]:
        """The rewards to score: the unshaped ones when known, else what the function returned."""
        return self.unshaped if self.unshaped is not None else self.rewards


class TappedReward(Protocol):
    """A reward function returned by :func:`tap`: callable like the original, with its recent calls.

    Attributes:
        tapped: The wrapped reward function, exactly as passed.
        max_calls: How many recent calls are kept.
    """

    __name__: str
    __qualname__: str
    tapped: Callable[..., Any]
    max_calls: int

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function (a coroutine when it is async) and record the call."""

    def records(self, after: int = 0) -> list[TapRecord]:
        """Recorded calls with ``index > after``, oldest first."""

    def clear(self) -> None:
        """Forget every recorded call (the call counter keeps counting)."""


def is_tapped(fn: object) -> bool:
    """Whether ``fn`` was returned by :func:`tap`.

    Example:
        >>> is_tapped(tap(lambda prompts, completions, **kw: [0.0] * len(completions)))
        True
    """
    return callable(fn) and callable(getattr(fn, "records", None)) and hasattr(fn, "tapped")


class _Recorder:
    """Thread-safe bounded store of :class:`TapRecord` s, one per wrapper (its ``finish`` step)."""

    def __init__(self, fn: Any, max_calls: int) -> None:
        self.fn = fn
        self.name = reward_name(fn)
        self.calls: CallLog[TapRecord] = CallLog(keep=max_calls)
        self.warned = False

    def record(self, _prepared: None, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        """Record one call of the tapped function and return its ``output`` unchanged."""
        try:
            completions = kwargs.get("completions", args[1] if len(args) > 1 else None)
            prompts = kwargs.get("prompts", args[0] if args else None)
            if completions is None or output is None:
                return output
            last_call = getattr(self.fn, "last_call", None)
            unshaped = getattr(last_call, "raw", None) if hasattr(self.fn, "shaping") else None
            step = getattr(kwargs.get("trainer_state"), "global_step", None)
            self.calls.add(
                lambda index: TapRecord(
                    index=index,
                    global_step=step if isinstance(step, int) and not isinstance(step, bool) else None,
                    prompts=None if prompts is None else tuple(prompt_text(p) for p in prompts),
                    completions=tuple(completion_text(c) for c in completions),
                    completion_ids=_ids(kwargs.get("completion_ids")),
                    rewards=tuple(_reward(value) for value in output),
                    unshaped=None if unshaped is None else tuple(_reward(value) for value in unshaped),
                )
            )
        except Exception as error:  # recording must never break the reward call
            if not self.warned:
                self.warned = True
                warnings.warn(
                    f"loopguard.tap({self.name!r}) could not record a call and will keep trying: "
                    f"{type(error).__name__}: {error}",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return output

    def records(self, after: int = 0) -> list[TapRecord]:
        return self.calls.since(check_int("after", after, lo=0))


def tap(reward_fn: Callable[..., Any], *, max_calls: int = _DEFAULT_MAX_CALLS) -> TappedReward:
    """Wrap a reward function so every call is recorded for loopguard's callbacks; behaviour is unchanged.

    The wrapper forwards every argument, returns exactly what ``reward_fn`` returns, and then records the call
    as a :class:`TapRecord` (prompts and completions as text, ``completion_ids`` when passed, the rewards, and
    the unshaped rewards of a :func:`~loopguard.shape_reward` wrapper). It keeps ``reward_fn``'s ``__name__``
    (TRL's metric name ``rewards/<name>/mean``), ``__qualname__``, ``__doc__`` and ``__module__``
    (partials are unwrapped as TRL does), and it is a coroutine function exactly when ``reward_fn`` is async.
    ``completions`` (and ``prompts``) are read from the keyword arguments, as TRL passes them, or from the
    first two positional arguments. Only the ``max_calls`` most recent calls are kept; recording never
    raises (a failure warns once and the reward is returned anyway).

    Put the tap *inside* any other wrapper you want observed raw: ``tap(shape_reward(fn, ...))`` records the
    unshaped rewards of the shaping wrapper too, and the mitigator scores those.

    Args:
        reward_fn: A TRL-style reward function (sync or async; a function, ``functools.partial`` or callable
            instance).
        max_calls: Recent calls to keep, in [1, 100000]. Default 256.

    Returns:
        A :class:`TappedReward`: call it like ``reward_fn``; ``records(after=0)`` lists the recorded calls,
        ``clear()`` drops them, ``tapped`` is ``reward_fn``.

    Raises:
        LoopguardTypeError: ``reward_fn`` is not callable or is a torch module (TRL calls reward models with
            tokenised inputs, which the tap cannot read), or ``max_calls`` is not an int.
        ConfigError: ``max_calls`` out of range.

    Example:
        >>> import asyncio, inspect
        >>> async def judge(prompts, completions, **kwargs):
        ...     return [len(c) / 10 for c in completions]
        >>> tapped = tap(judge)
        >>> inspect.iscoroutinefunction(tapped), tapped.__name__
        (True, 'judge')
        >>> asyncio.run(tapped(prompts=["p"], completions=["abcde"], completion_ids=[[5, 6]]))
        [0.5]
        >>> record = tapped.records()[-1]
        >>> record.completions, record.completion_ids, record.rewards
        (('abcde',), ((5, 6),), (0.5,))
    """
    check_reward_fn("reward_fn", reward_fn, ". GRPO and RLOO need no tap: the mitigator reads their rewards.")
    max_calls = check_int("max_calls", max_calls, lo=1, hi=100_000)
    recorder = _Recorder(reward_fn, max_calls)
    # no __dict__ copy: a shaped reward's last_call would go stale
    wrapper = wrap_reward(reward_fn, recorder.record, copy_attributes=False, module=__name__)
    tapped = cast(TappedReward, wrapper)
    tapped.tapped = reward_fn
    tapped.max_calls = max_calls
    tapped.records = recorder.records  # type: ignore[method-assign]
    tapped.clear = recorder.calls.clear  # type: ignore[method-assign]
    return tapped
