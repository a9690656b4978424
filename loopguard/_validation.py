"""Validation conventions shared by every public record and kernel.

Two families live here:

* ``check_*`` functions validate one value and return it normalised (``float``, ``int``, ``str``). The
  ``attrs`` validator factories (:func:`real`, :func:`integer`, :func:`boolean`, :func:`one_of`,
  :func:`name_string`, :func:`path_string`) wrap them for frozen config records, so a record and a kernel
  reject bad input with the same words.
* ``as_*_array`` functions turn array-likes (lists, numpy arrays, CPU or GPU torch tensors) into numpy arrays
  and check dimensionality, emptiness, size caps and finiteness.

Messages always read "`name` must be <rule>, got <value>." Type mistakes (``True`` for a number, a string
for an array) raise :class:`~loopguard.exceptions.LoopguardTypeError` (a ``TypeError``); value mistakes raise
:class:`~loopguard.exceptions.ConfigError` or :class:`~loopguard.exceptions.InputError` (``ValueError``).

DoS caps (documented limits that bound the work one call can be asked to do):

================================  ==========
``MAX_TRAJECTORIES``              100,000 trajectories (or samples, or embeddings) per batch
``MAX_TOKENS_PER_TRAJECTORY``     1,000,000 tokens in one trajectory
``MAX_ENSEMBLE_MEMBERS``          32 reward models in an ensemble
``MAX_EMBEDDING_DIM``             65,536 dimensions per embedding
``MAX_NGRAM_N``                   32 tokens per n-gram
``MAX_SERIES_LENGTH``             10,000,000 points in a time series of per-step values
``MAX_NAME_LENGTH``               64 characters in a name
``MAX_PATH_LENGTH``               4,096 characters in a path
================================  ==========

Example:
    >>> from loopguard._validation import check_real
    >>> check_real("trip_band", 0.3, lo=0.0, hi=1.0, lo_inclusive=False)
    0.3
    >>> check_real("trip_band", True)
    Traceback (most recent call last):
    ...
    loopguard.exceptions.LoopguardTypeError: `trip_band` must be a real number (not bool), got True.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Collection
from typing import Any

import numpy as np
from numpy.typing import NDArray

from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError

__all__ = [
    "MAX_EMBEDDING_DIM",
    "MAX_ENSEMBLE_MEMBERS",
    "MAX_NAME_LENGTH",
    "MAX_NGRAM_N",
    "MAX_PATH_LENGTH",
    "MAX_SERIES_LENGTH",
    "MAX_TOKENS_PER_TRAJECTORY",
    "MAX_TRAJECTORIES",
    "as_float_array",
    "as_int_array",
    "boolean",
    "check_bool",
    "check_choice",
    "check_int",
    "check_name",
    "check_path",
    "check_real",
    "check_same_length",
    "check_text",
    "describe",
    "integer",
    "name_string",
    "one_of",
    "path_string",
    "real",
    "to_numpy",
]

MAX_TRAJECTORIES = 100_000
MAX_TOKENS_PER_TRAJECTORY = 1_000_000
MAX_ENSEMBLE_MEMBERS = 32
MAX_EMBEDDING_DIM = 65_536
MAX_NGRAM_N = 32
MAX_SERIES_LENGTH = 10_000_000
MAX_NAME_LENGTH = 64
MAX_PATH_LENGTH = 4096

_REPR_LIMIT = 80

AttrsValidator = Callable[[Any, Any, Any], None]


def describe(value: object) -> str:
    """Return a short ``repr`` of ``value`` for error messages (long values are cut with an ellipsis).

    Example:
        >>> describe("x" * 100)[:12]
        "'xxxxxxxxxxx"
        >>> len(describe("x" * 100)) <= 80
        True
    """
    text = repr(value)
    if len(text) > _REPR_LIMIT:
        text = text[: _REPR_LIMIT - 3] + "..."
    return text


def _bound(value: float) -> str:
    """Print a bound as written: integers in full (``1000000``, not ``1e+06``), other values with ``:g``."""
    if float(value).is_integer() and abs(value) < 1e16:
        return str(int(value))
    return f"{value:g}"


def _interval(lo: float | None, hi: float | None, lo_inclusive: bool, hi_inclusive: bool) -> str:
    if lo is not None and hi is not None:
        left = "[" if lo_inclusive else "("
        right = "]" if hi_inclusive else ")"
        return f"in {left}{_bound(lo)}, {_bound(hi)}{right}"
    if lo is not None:
        return f"{'>=' if lo_inclusive else '>'} {_bound(lo)}"
    if hi is not None:
        return f"{'<=' if hi_inclusive else '<'} {_bound(hi)}"
    return "finite"


def _check_range(
    name: str,
    value: float,
    lo: float | None,
    hi: float | None,
    lo_inclusive: bool,
    hi_inclusive: bool,
) -> None:
    too_low = lo is not None and (value < lo or (value == lo and not lo_inclusive))
    too_high = hi is not None and (value > hi or (value == hi and not hi_inclusive))
    if too_low or too_high:
        msg = f"`{name}` must be {_interval(lo, hi, lo_inclusive, hi_inclusive)}, got {describe(value)}."
        raise ConfigError(msg)


def check_real(
    name: str,
    value: object,
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_inclusive: bool = True,
    hi_inclusive: bool = True,
) -> float:
    """Validate a finite real number, optionally inside an interval, and return it as ``float``.

    Args:
        name: Argument name used in the error message.
        value: The value to check. ``bool`` is rejected even though it subclasses ``int``.
        lo: Lower bound, or ``None`` for none.
        hi: Upper bound, or ``None`` for none.
        lo_inclusive: Whether ``lo`` itself is allowed.
        hi_inclusive: Whether ``hi`` itself is allowed.

    Returns:
        ``float(value)``.

    Raises:
        LoopguardTypeError: ``value`` is a bool or not a real number.
        ConfigError: ``value`` is NaN, infinite, or outside the interval.

    Example:
        >>> check_real("gain", 1.5, lo=1.0, lo_inclusive=False)
        1.5
        >>> check_real("gain", 1.0, lo=1.0, lo_inclusive=False)
        Traceback (most recent call last):
        ...
        loopguard.exceptions.ConfigError: `gain` must be > 1, got 1.0.
    """
    if isinstance(value, (bool, np.bool_)):
        msg = f"`{name}` must be a real number (not bool), got {describe(value)}."
        raise LoopguardTypeError(msg)
    if not isinstance(value, numbers.Real):
        msg = f"`{name}` must be a real number, got {describe(value)} of type {type(value).__name__}."
        raise LoopguardTypeError(msg)
    result = float(value)
    if not math.isfinite(result):
        msg = f"`{name}` must be finite, got {describe(result)}."
        raise ConfigError(msg)
    _check_range(name, result, lo, hi, lo_inclusive, hi_inclusive)
    return result


def check_int(name: str, value: object, *, lo: int | None = None, hi: int | None = None) -> int:
    """Validate an integer (``bool`` and integral floats rejected), optionally in ``[lo, hi]``.

    Example:
        >>> check_int("dwell_steps", 2, lo=1)
        2
        >>> check_int("dwell_steps", 2.0, lo=1)
        Traceback (most recent call last):
        ...
        loopguard.exceptions.LoopguardTypeError: `dwell_steps` must be an integer, got 2.0 of type float.
    """
    if isinstance(value, (bool, np.bool_)):
        msg = f"`{name}` must be an integer (not bool), got {describe(value)}."
        raise LoopguardTypeError(msg)
    if not isinstance(value, numbers.Integral):
        msg = f"`{name}` must be an integer, got {describe(value)} of type {type(value).__name__}."
        raise LoopguardTypeError(msg)
    result = int(value)
    _check_range(name, result, lo, hi, True, True)
    return result


def check_bool(name: str, value: object) -> bool:
    """Validate a real ``bool`` (``0``/``1`` and strings are rejected).

    Example:
        >>> check_bool("normalize", 1)
        Traceback (most recent call last):
        ...
        loopguard.exceptions.LoopguardTypeError: `normalize` must be a bool, got 1 of type int.
    """
    if not isinstance(value, (bool, np.bool_)):
        msg = f"`{name}` must be a bool, got {describe(value)} of type {type(value).__name__}."
        raise LoopguardTypeError(msg)
    return bool(value)


def check_text(name: str, value: object, *, max_length: int, what: str = "") -> str:
    """Validate a non-empty ``str`` with no null bytes and at most ``max_length`` characters.

    Args:
        name: Argument name used in the error message.
        value: The value to check.
        max_length: Cap on the number of characters.
        what: Optional kind of string for the message ("name", "path").

    Example:
        >>> check_text("sentinels[0]", "", max_length=8)
        Traceback (most recent call last):
        ...
        loopguard.exceptions.ConfigError: `sentinels[0]` must be a non-empty string, got ''.
    """
    kind = f"{what} string" if what else "string"
    if not isinstance(value, str):
        msg = f"`{name}` must be a {kind}, got {describe(value)} of type {type(value).__name__}."
        raise LoopguardTypeError(msg)
    if "\x00" in value:
        msg = f"`{name}` must not contain null bytes, got {describe(value)}."
        raise ConfigError(msg)
    if not value:
        msg = f"`{name}` must be a non-empty {kind}, got ''."
        raise ConfigError(msg)
    if len(value) > max_length:
        msg = f"`{name}` must be at most {max_length} characters, got {len(value)} characters."
        raise ConfigError(msg)
    return value


def check_choice(name: str, value: object, allowed: Collection[str]) -> str:
    """Validate that ``value`` is one of the ``allowed`` names (a closed allowlist).

    Example:
        >>> check_choice("method", "spearman", ("pearson", "spearman"))
        'spearman'
        >>> check_choice("method", "kendall", ("pearson", "spearman"))
        Traceback (most recent call last):
        ...
        loopguard.exceptions.ConfigError: `method` must be one of 'pearson', 'spearman', got 'kendall'.
    """
    text = check_text(name, value, max_length=MAX_NAME_LENGTH, what="name")
    if text not in allowed:
        options = ", ".join(repr(option) for option in sorted(allowed))
        msg = f"`{name}` must be one of {options}, got {describe(text)}."
        raise ConfigError(msg)
    return text


def check_name(name: str, value: object) -> str:
    """Validate a name: non-empty ``str``, no null bytes, at most ``MAX_NAME_LENGTH`` characters."""
    return check_text(name, value, max_length=MAX_NAME_LENGTH, what="name")


def check_path(name: str, value: object) -> str:
    """Validate a filesystem path (``str`` or ``os.PathLike``): no null bytes, at most 4096 characters.

    Example:
        >>> check_path("log_path", "runs/a.jsonl")
        'runs/a.jsonl'
    """
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, bytes):
        msg = f"`{name}` must be a str or os.PathLike path, got bytes {describe(value)}."
        raise LoopguardTypeError(msg)
    return check_text(name, value, max_length=MAX_PATH_LENGTH, what="path")


# --------------------------------------------------------------------------------------------------
# attrs validator factories


def real(
    *,
    lo: float | None = None,
    hi: float | None = None,
    lo_inclusive: bool = True,
    hi_inclusive: bool = True,
    optional: bool = False,
) -> AttrsValidator:
    """Return an ``attrs`` validator that applies :func:`check_real` to the attribute.

    Example:
        >>> import attrs
        >>> @attrs.frozen
        ... class Bands:
        ...     trip: float = attrs.field(default=0.3, validator=real(lo=0.0, hi=1.0))
        >>> Bands(trip=float("nan"))
        Traceback (most recent call last):
        ...
        loopguard.exceptions.ConfigError: `trip` must be finite, got nan.
    """

    def validate(_instance: Any, attribute: Any, value: Any) -> None:
        if optional and value is None:
            return
        check_real(
            attribute.name, value, lo=lo, hi=hi, lo_inclusive=lo_inclusive, hi_inclusive=hi_inclusive
        )

    return validate


def integer(*, lo: int | None = None, hi: int | None = None, optional: bool = False) -> AttrsValidator:
    """Return an ``attrs`` validator that applies :func:`check_int` to the attribute."""

    def validate(_instance: Any, attribute: Any, value: Any) -> None:
        if optional and value is None:
            return
        check_int(attribute.name, value, lo=lo, hi=hi)

    return validate


def boolean() -> AttrsValidator:
    """Return an ``attrs`` validator that applies :func:`check_bool` to the attribute."""

    def validate(_instance: Any, attribute: Any, value: Any) -> None:
        check_bool(attribute.name, value)

    return validate


def one_of(*allowed: str, optional: bool = False) -> AttrsValidator:
    """Return an ``attrs`` validator that applies :func:`check_choice` with a closed allowlist."""
    frozen = frozenset(allowed)

    def validate(_instance: Any, attribute: Any, value: Any) -> None:
        if optional and value is None:
            return
        check_choice(attribute.name, value, frozen)

    return validate


def name_string(*, optional: bool = False) -> AttrsValidator:
    """Return an ``attrs`` validator that applies :func:`check_name`."""

    def validate(_instance: Any, attribute: Any, value: Any) -> None:
        if optional and value is None:
            return
        check_name(attribute.name, value)

    return validate


def path_string(*, optional: bool = False) -> AttrsValidator:
    """Return an ``attrs`` validator that applies :func:`check_path`."""

    def validate(_instance: Any, attribute: Any, value: Any) -> None:
        if optional and value is None:
            return
        check_path(attribute.name, value)

    return validate


# --------------------------------------------------------------------------------------------------
# arrays


def to_numpy(name: str, value: object) -> NDArray[Any]:
    """Convert an array-like (including CPU/GPU torch tensors, without importing torch) to numpy.

    Raises:
        LoopguardTypeError: ``value`` is a scalar bool, a string, bytes or ``None``.
        InputError: ``value`` is a ragged nested list.
    """
    if isinstance(value, (bool, np.bool_, str, bytes)) or value is None:
        msg = f"`{name}` must be an array of numbers, got {describe(value)} of type {type(value).__name__}."
        raise LoopguardTypeError(msg)
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor, detected by duck typing
        tensor = value.detach().cpu()
        if str(tensor.dtype) in ("torch.bfloat16", "torch.float16"):
            tensor = tensor.float()
        value = tensor.numpy()
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as error:  # ragged nested lists
        msg = f"`{name}` must be a rectangular array of numbers, got {describe(value)} ({error})."
        raise InputError(msg) from error


def _check_array_shape(
    name: str, array: NDArray[Any], ndim: int, allow_empty: bool, max_len: int | None
) -> None:
    if array.ndim != ndim:
        msg = f"`{name}` must be a {ndim}-D array, got shape {array.shape}."
        raise InputError(msg)
    if array.size == 0 and not allow_empty:
        msg = f"`{name}` must not be empty, got shape {array.shape}."
        raise InputError(msg)
    if max_len is not None and array.shape[0] > max_len:
        msg = f"`{name}` must have at most {max_len:,} rows (DoS cap), got {array.shape[0]:,}."
        raise InputError(msg)


def as_float_array(
    name: str,
    value: object,
    *,
    ndim: int = 1,
    allow_empty: bool = False,
    max_len: int | None = MAX_TRAJECTORIES,
    finite: bool = True,
) -> NDArray[np.float64]:
    """Convert an array-like of numbers to a float64 numpy array and validate it.

    Args:
        name: Argument name used in error messages.
        value: List, tuple, numpy array or torch tensor (any device) of real numbers.
        ndim: Required number of dimensions.
        allow_empty: Whether an array with no elements is acceptable.
        max_len: Cap on the length of the first axis (a DoS cap), or ``None``.
        finite: Reject NaN and +-Inf entries.

    Returns:
        A float64 array (a copy only when conversion requires one).

    Raises:
        LoopguardTypeError: booleans, strings, complex numbers or objects instead of real numbers.
        InputError: wrong dimensionality, empty, over the cap, or non-finite.

    Example:
        >>> as_float_array("rewards", [1, 2, 3])
        array([1., 2., 3.])
        >>> as_float_array("rewards", [1.0, float("nan")])
        Traceback (most recent call last):
        ...
        loopguard.exceptions.InputError: `rewards` must be finite, got nan at index (1,).
    """
    array = to_numpy(name, value)
    if array.dtype.kind == "b":
        msg = f"`{name}` must hold numbers, got booleans (convert with .astype(float) if intended)."
        raise LoopguardTypeError(msg)
    if array.dtype.kind not in "iuf":
        msg = f"`{name}` must hold real numbers, got dtype {array.dtype}."
        raise LoopguardTypeError(msg)
    _check_array_shape(name, array, ndim, allow_empty, max_len)
    result = np.asarray(array, dtype=np.float64)
    if finite and result.size and not np.isfinite(result).all():
        index = tuple(int(i) for i in np.argwhere(~np.isfinite(result))[0])
        msg = f"`{name}` must be finite, got {float(result[index])} at index {index}."
        raise InputError(msg)
    return result


def as_int_array(
    name: str,
    value: object,
    *,
    ndim: int = 1,
    allow_empty: bool = False,
    max_len: int | None = MAX_TRAJECTORIES,
    lo: int | None = None,
) -> NDArray[np.int64]:
    """Convert an array-like of integers to an int64 numpy array and validate it.

    Floats are rejected even when integral, so a float array of lengths does not truncate silently.

    Example:
        >>> as_int_array("lengths", [3, 5], lo=0)
        array([3, 5])
        >>> as_int_array("lengths", [3, -1], lo=0)
        Traceback (most recent call last):
        ...
        loopguard.exceptions.InputError: `lengths` must be >= 0, got -1 at index (1,).
    """
    array = to_numpy(name, value)
    if array.dtype.kind == "b":
        msg = f"`{name}` must hold integers, got booleans."
        raise LoopguardTypeError(msg)
    if array.dtype.kind not in "iu":
        msg = f"`{name}` must hold integers, got dtype {array.dtype}."
        raise LoopguardTypeError(msg)
    _check_array_shape(name, array, ndim, allow_empty, max_len)
    if array.dtype == np.uint64 and array.size and int(array.max()) > np.iinfo(np.int64).max:
        msg = f"`{name}` must fit in int64, got {int(array.max())}."
        raise InputError(msg)
    result = np.asarray(array, dtype=np.int64)
    if lo is not None and result.size and int(result.min()) < lo:
        index = tuple(int(i) for i in np.argwhere(result < lo)[0])
        msg = f"`{name}` must be >= {lo}, got {int(result[index])} at index {index}."
        raise InputError(msg)
    return result


def check_same_length(**arrays: NDArray[Any]) -> int:
    """Check that every array has the same first-axis length and return it.

    Example:
        >>> import numpy as np
        >>> check_same_length(rewards=np.zeros(3), lengths=np.zeros(4))
        Traceback (most recent call last):
        ...
        loopguard.exceptions.InputError: `rewards` and `lengths` must have the same length, got 3 and 4.
    """
    items = list(arrays.items())
    first_name, first = items[0]
    for other_name, other in items[1:]:
        if len(other) != len(first):
            msg = (
                f"`{first_name}` and `{other_name}` must have the same length, "
                f"got {len(first)} and {len(other)}."
            )
            raise InputError(msg)
    return len(first)
