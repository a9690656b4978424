"""The one core that wraps a TRL reward function ``fn(prompts, completions, **kwargs) -> rewards``.

:func:`loopguard.tap` (records each call) and :func:`loopguard.shape_reward` (subtracts a penalty) are both
built on :func:`wrap_reward`: it calls ``fn`` exactly as the trainer called the wrapper (awaiting it when it
is async), hands the output to the wrapper's own ``finish`` step and returns what that returns, and gives
the wrapper the identity TRL reads: ``__name__`` (TRL's metric name ``rewards/<name>/mean``; partials are
unwrapped as TRL does, and a callable instance without ``__name__`` lends its class name), ``__qualname__``,
``__doc__``, ``__module__``, ``__wrapped__`` (so :func:`inspect.signature` shows ``fn``'s), and it is a
coroutine function exactly when calling ``fn`` returns a coroutine. :func:`check_reward_fn` refuses what
is not a reward function, :func:`real_or_none` reads one reward value, and a :class:`CallLog` numbers and
keeps the records a wrapper makes of its calls.

Example:
    >>> def correct(prompts, completions, **kwargs):
    ...     return [float("4" in c) for c in completions]
    >>> doubled = wrap_reward(correct, lambda _, args, kwargs, output: [2 * r for r in output],
    ...                       copy_attributes=False, module=__name__)
    >>> doubled(prompts=["2+2="], completions=["4"]), doubled.__name__
    ([2.0], 'correct')
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from loopguard._validation import describe
from loopguard.exceptions import LoopguardTypeError

__all__ = [
    "CallLog",
    "check_reward_fn",
    "is_async",
    "plain_number",
    "real_or_none",
    "reward_name",
    "unwrap_partial",
    "wrap_reward",
]

Prepare = Callable[[tuple[Any, ...], dict[str, Any]], Any]
"""``prepare(args, kwargs) -> prepared``: runs before ``fn`` (and may refuse the call by raising)."""

Finish = Callable[[Any, tuple[Any, ...], dict[str, Any], Any], Any]
"""``finish(prepared, args, kwargs, output) -> result``: what the wrapper returns for ``fn``'s output."""

R = TypeVar("R")


def check_reward_fn(name: str, fn: object, advice: str) -> None:
    """Refuse a non-callable or a torch module (TRL calls reward models with tokenised inputs).

    ``name`` is the argument's name; ``advice`` ends the torch-module message (it starts with its own
    punctuation).

    Raises:
        LoopguardTypeError: ``fn`` is not callable, or is a ``torch.nn.Module``.
    """
    if not callable(fn):
        msg = f"`{name}` must be callable, got {describe(fn)} of type {type(fn).__name__}."
        raise LoopguardTypeError(msg)
    if any(cls.__name__ == "Module" and cls.__module__.startswith("torch.nn") for cls in type(fn).__mro__):
        msg = (
            f"`{name}` must be a reward function, got a torch module ({type(fn).__name__}); TRL calls reward "
            f"models with tokenised inputs{advice}"
        )
        raise LoopguardTypeError(msg)


def unwrap_partial(fn: Any) -> Any:
    """The function under any ``functools.partial`` layers (where TRL reads the name)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` returns a coroutine (functions, partials, objects with async ``__call__``)."""
    target = unwrap_partial(fn)
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(type(target).__call__)


def reward_name(fn: Callable[..., Any]) -> str:
    """The name TRL gives ``fn``'s metrics: the unwrapped function's ``__name__``, else its class name."""
    target = unwrap_partial(fn)
    return str(getattr(target, "__name__", type(target).__name__))


def plain_number(value: object) -> object:
    """``value.item()`` for a numpy or torch scalar (not a real number, but has ``item``), else ``value``."""
    if not isinstance(value, numbers.Real) and hasattr(value, "item"):
        return value.item()
    return value


def real_or_none(value: object, *, refuse: bool) -> float | None:
    """One reward as a finite float: ``None``, NaN and infinities become ``None``; scalars are unwrapped.

    Anything else (a bool, a string) raises ``TypeError`` when ``refuse``, else becomes ``None``.

    Example:
        >>> real_or_none(float("nan"), refuse=True), real_or_none("x", refuse=False)
        (None, None)
    """
    if value is None:
        return None
    value = plain_number(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        if not refuse:
            return None
        msg = f"reward must be a real number or None, got {describe(value)}"
        raise TypeError(msg)
    result = float(value)
    return result if math.isfinite(result) else None


def _nothing(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    return None


def wrap_reward(
    fn: Callable[..., Any],
    finish: Finish,
    *,
    prepare: Prepare = _nothing,
    copy_attributes: bool,
    module: str,
) -> Any:
    """A function called like ``fn`` that returns ``finish(prepare(args, kwargs), args, kwargs, fn(...))``.

    Args:
        fn: The reward function (sync or async; a function, ``functools.partial`` or callable instance).
        finish: Turns ``fn``'s output into the wrapper's result (see :data:`Finish`).
        prepare: Runs before ``fn`` is called (see :data:`Prepare`); by default nothing.
        copy_attributes: Copy ``fn.__dict__`` onto the wrapper (``functools.update_wrapper``'s default).
        module: ``__module__`` when ``fn`` has none (the wrapping module's name).

    Returns:
        The wrapper (``async def`` exactly when ``fn`` is async), with ``fn``'s identity (module docs).
    """
    target = unwrap_partial(fn)
    name = reward_name(fn)
    wrapper: Callable[..., Any]
    if is_async(fn):

        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            prepared = prepare(args, kwargs)
            return finish(prepared, args, kwargs, await fn(*args, **kwargs))

        wrapper = async_wrapper
    else:

        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            prepared = prepare(args, kwargs)
            return finish(prepared, args, kwargs, fn(*args, **kwargs))

        wrapper = sync_wrapper

    functools.update_wrapper(wrapper, fn, updated=("__dict__",) if copy_attributes else ())
    wrapper.__name__ = name
    wrapper.__qualname__ = str(getattr(target, "__qualname__", name))
    wrapper.__doc__ = getattr(target, "__doc__", None)
    wrapper.__module__ = str(getattr(target, "__module__", None) or module)
    return wrapper


class CallLog(Generic[R]):
    """The records one wrapper makes of its calls: numbered 1, 2, ... under one lock, the latest ``keep``.

    Example:
        >>> calls = CallLog[str](keep=2)
        >>> [calls.add(lambda number: f"call {number}") for _ in range(3)]
        ['call 1', 'call 2', 'call 3']
        >>> calls.since(after=0), calls.since(after=2)
        (['call 2', 'call 3'], ['call 3'])
    """

    def __init__(self, keep: int) -> None:
        """Keep the ``keep`` most recent records."""
        self._lock = threading.Lock()
        self._count = 0
        self._records: deque[tuple[int, R]] = deque(maxlen=keep)

    def add(self, make: Callable[[int], R]) -> R:
        """Number the next call and keep ``make(number)``, built under the lock so records never interleave.

        A ``make`` that raises uses up its number and keeps nothing.
        """
        with self._lock:
            self._count += 1
            record = make(self._count)
            self._records.append((self._count, record))
            return record

    def since(self, after: int) -> list[R]:
        """The kept records numbered above ``after``, oldest first."""
        with self._lock:
            return [record for number, record in self._records if number > after]

    def clear(self) -> None:
        """Forget every kept record (the numbering goes on)."""
        with self._lock:
            self._records.clear()
