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

import functools
import inspect
import math
import numbers
import threading
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import attrs

from loopguard._validation import check_int, describe
from loopguard.exceptions import LoopguardTypeError
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
    if value is None:
        return None
    if not isinstance(value, numbers.Real) and hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        msg = f"reward must be a real number or None, got {describe(value)}"
        raise TypeError(msg)
    result = float(value)
    return result if math.isfinite(result) else None


def _ids(value: object) -> tuple[tuple[int, ...], ...] | None:
    if value is None:
        return None
    if hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, Sequence):
        return None
    return tuple(tuple(int(token) for token in row) for row in value)


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


def _unwrap_partial(fn: Any) -> Any:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _is_async(fn: Callable[..., Any]) -> bool:
    target = _unwrap_partial(fn)
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(type(target).__call__)


class _Recorder:
    """Thread-safe bounded store of :class:`TapRecord` s, one per wrapper."""

    def __init__(self, name: str, max_calls: int) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.count = 0
        self.calls: deque[TapRecord] = deque(maxlen=max_calls)
        self.warned = False

    def record(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        try:
            completions = kwargs.get("completions", args[1] if len(args) > 1 else None)
            prompts = kwargs.get("prompts", args[0] if args else None)
            if completions is None or output is None:
                return
            last_call = getattr(fn, "last_call", None)
            unshaped = getattr(last_call, "raw", None) if hasattr(fn, "shaping") else None
            step = getattr(kwargs.get("trainer_state"), "global_step", None)
            with self.lock:
                self.count += 1
                self.calls.append(
                    TapRecord(
                        index=self.count,
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

    def records(self, after: int = 0) -> list[TapRecord]:
        after = check_int("after", after, lo=0)
        with self.lock:
            return [record for record in self.calls if record.index > after]

    def clear(self) -> None:
        with self.lock:
            self.calls.clear()


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
        >>> import asyncio
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
    if not callable(reward_fn):
        msg = f"`reward_fn` must be callable, got {describe(reward_fn)} of type {type(reward_fn).__name__}."
        raise LoopguardTypeError(msg)
    if any(
        cls.__name__ == "Module" and cls.__module__.startswith("torch.nn") for cls in type(reward_fn).__mro__
    ):
        msg = (
            f"`reward_fn` must be a reward function, got a torch module ({type(reward_fn).__name__}); TRL "
            "calls reward models with tokenised inputs. GRPO and RLOO need no tap: the mitigator reads their "
            "rewards."
        )
        raise LoopguardTypeError(msg)
    max_calls = check_int("max_calls", max_calls, lo=1, hi=100_000)
    target = _unwrap_partial(reward_fn)
    name = str(getattr(target, "__name__", type(target).__name__))
    recorder = _Recorder(name, max_calls)
    fn = reward_fn

    wrapper: Callable[..., Any]
    if _is_async(fn):

        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            output = await fn(*args, **kwargs)
            recorder.record(fn, args, kwargs, output)
            return output

        wrapper = async_wrapper
    else:

        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            output = fn(*args, **kwargs)
            recorder.record(fn, args, kwargs, output)
            return output

        wrapper = sync_wrapper

    functools.update_wrapper(
        wrapper, fn, updated=()
    )  # no __dict__ copy: a shaped reward's last_call would go stale
    tapped = cast(TappedReward, wrapper)
    tapped.__name__ = name
    tapped.__qualname__ = str(getattr(target, "__qualname__", name))
    tapped.__doc__ = getattr(target, "__doc__", None)
    tapped.__module__ = str(getattr(target, "__module__", None) or __name__)
    tapped.tapped = reward_fn
    tapped.max_calls = max_calls
    tapped.records = recorder.records  # type: ignore[method-assign]
    tapped.clear = recorder.clear  # type: ignore[method-assign]
    return tapped
