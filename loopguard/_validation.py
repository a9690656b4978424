"""Validation conventions shared by every public record and kernel.

Two families live here:

* ``check_*`` functions validate one value and return it normalised (``float``, ``int``, ``str``). The
  ``attrs`` validator factories (:func:`real`, :func:`integer`, :func:`boolean`, :func:`one_of`,
  :func:`name_string`, :func:`path_string`) wrap them for frozen config records, so a record and a kernel
  reject bad input with the same words. Hand-written because ``attrs.validators`` accept ``True`` as a
  number and word their messages their own way.
* ``as_*_array`` functions turn array-likes (lists, numpy arrays, CPU or GPU torch tensors) into numpy arrays
  and check dimensionality, emptiness, size caps and finiteness.

numpy is imported inside the array functions, not at import: the checks of plain values (and so the records
of a mitigation log, which ``loopguard report`` reads) run without it.

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

import functools
import importlib
import math
import numbers
import os
import sys
from collections.abc import Callable, Collection, Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError, MissingDependencyError

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

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
    "as_group_sizes",
    "as_int_array",
    "boolean",
    "check_bool",
    "check_choice",
    "check_int",
    "check_name",
    "check_number_type",
    "check_path",
    "check_real",
    "check_same_length",
    "check_text",
    "describe",
    "finite_floats",
    "import_extra",
    "integer",
    "is_bool",
    "name_string",
    "one_of",
    "path_string",
    "plain_row",
    "real",
    "scalar_value",
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
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

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


def is_bool(value: object) -> bool:
    """Whether ``value`` is a ``bool`` or a numpy bool, without importing numpy.

    A numpy bool can exist only once numpy is imported, so numpy is looked up in ``sys.modules``, never
    imported here.

    Example:
        >>> import numpy as np
        >>> is_bool(True), is_bool(np.bool_(False)), is_bool(1)
        (True, True, False)
    """
    if isinstance(value, bool):
        return True
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.bool_)


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


def check_number_type(name: str, value: object, kind: type, what: str) -> None:
    """Refuse a bool (``np.bool_`` too) and anything that is not a ``kind`` (a :mod:`numbers` ABC).

    ``what`` names the expected kind in the message: "`{name}` must be {what} (not bool), got ...".

    Raises:
        LoopguardTypeError: ``value`` is a bool or not a ``kind``.
    """
    if is_bool(value):
        msg = f"`{name}` must be {what} (not bool), got {describe(value)}."
        raise LoopguardTypeError(msg)
    if not isinstance(value, kind):
        msg = f"`{name}` must be {what}, got {describe(value)} of type {type(value).__name__}."
        raise LoopguardTypeError(msg)


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
    if type(value) is not float and type(value) is not int:  # exact float and int need no ABC check
        check_number_type(name, value, numbers.Real, "a real number")
    result = float(cast(numbers.Real, value))
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
    if type(value) is not int:  # an exact int needs no ABC check (a bool's type is bool)
        check_number_type(name, value, numbers.Integral, "an integer")
    result = int(cast(numbers.Integral, value))
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
    if not is_bool(value):
        msg = f"`{name}` must be a bool, got {describe(value)} of type {type(value).__name__}."
        raise LoopguardTypeError(msg)
    return bool(value)


def finite_floats(items: Iterable[object], kinds: Collection[type]) -> bool:
    """Whether the floats among ``items`` (exact ``float``; ``kinds`` holds the items' types) are all finite.

    Read in the interpreter's own loops, for the long rows of floats a Guard's state and log records carry:
    their sum is finite exactly when every term is, unless finite terms overflow it (then term by term).
    ``items`` is read more than once.

    Example:
        >>> finite_floats([1e308, 1e308, "a"], {float, str}), finite_floats([0.5, float("nan")], {float})
        (True, False)
    """
    if float not in kinds:
        return True
    mixed = len(kinds) > 1
    floats = cast("Iterable[float]", [item for item in items if type(item) is float] if mixed else items)
    return math.isfinite(sum(floats)) or all(map(math.isfinite, floats))


def plain_row(items: Iterable[object], allowed: Collection[type]) -> bool:
    """Whether every item's exact type is in ``allowed`` and every float among them is finite.

    Read at once (:func:`finite_floats`): the rows of floats of log records and logged rewards. ``items`` is
    read more than once.

    Example:
        >>> plain_row([0.5, None, 1.0], {float, type(None)}), plain_row([0.5, True], {float})
        (True, False)
    """
    kinds = set(map(type, items))
    return kinds.issubset(allowed) and finite_floats(items, kinds)


def check_text(
    name: str, value: object, *, max_length: int, what: str = "", allow_empty: bool = False
) -> str:
    """Validate a non-empty ``str`` with no null bytes and at most ``max_length`` characters.

    Args:
        name: Argument name used in the error message.
        value: The value to check.
        max_length: Cap on the number of characters.
        what: Optional kind of string for the message ("name", "path").
        allow_empty: Accept ``""``.

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
    if not value and not allow_empty:
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


def import_extra(message: str, *modules: str) -> list[ModuleType]:
    """Import ``modules`` in order; a missing one raises :class:`MissingDependencyError` (an install hint).

    ``message`` names the extra ("... needs the `hf` extra: pip install 'loopguard[hf]'"); an ``{error}`` in
    it is replaced by the ``ImportError``.

    Raises:
        MissingDependencyError: a module cannot be imported (chained to the ``ImportError``).
    """
    try:
        return [importlib.import_module(module) for module in modules]
    except ImportError as error:
        raise MissingDependencyError(message.format(error=error)) from error


# --------------------------------------------------------------------------------------------------
# attrs validator factories


def _validator(check: Callable[[str, Any], object], *, optional: bool) -> AttrsValidator:
    """An ``attrs`` validator applying ``check(attribute name, value)`` (skipping ``None`` if optional)."""

    def validate(_instance: Any, attribute: Any, value: Any) -> None:
        if optional and value is None:
            return
        check(attribute.name, value)

    return validate


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
    check = functools.partial(check_real, lo=lo, hi=hi, lo_inclusive=lo_inclusive, hi_inclusive=hi_inclusive)
    return _validator(check, optional=optional)


def integer(*, lo: int | None = None, hi: int | None = None, optional: bool = False) -> AttrsValidator:
    """Return an ``attrs`` validator that applies :func:`check_int` to the attribute."""
    return _validator(functools.partial(check_int, lo=lo, hi=hi), optional=optional)


def boolean() -> AttrsValidator:
    """Return an ``attrs`` validator that applies :func:`check_bool` to the attribute."""
    return _validator(check_bool, optional=False)


def one_of(*allowed: str, optional: bool = False) -> AttrsValidator:
    """Return an ``attrs`` validator that applies :func:`check_choice` with a closed allowlist."""
    return _validator(functools.partial(check_choice, allowed=frozenset(allowed)), optional=optional)


def name_string(*, optional: bool = False) -> AttrsValidator:
    """Return an ``attrs`` validator that applies :func:`check_name`."""
    return _validator(check_name, optional=optional)


def path_string(*, optional: bool = False) -> AttrsValidator:
    """Return an ``attrs`` validator that applies :func:`check_path`."""
    return _validator(check_path, optional=optional)


# --------------------------------------------------------------------------------------------------
# arrays


def _is_tensor(value: object) -> bool:
    """Whether ``value`` is a torch tensor, detected by duck typing (torch is never imported here)."""
    return hasattr(value, "detach") and hasattr(value, "cpu") and hasattr(value, "numpy")


def _tensor_to_numpy(name: str, tensor: Any) -> NDArray[Any]:
    """Copy a tensor on any real device to numpy; refuse tensors that hold no readable data.

    Half-precision floats (``bfloat16``, ``float16``, ``float8``) are widened to ``float32`` first: numpy has
    no bfloat16. Gradients, strides and conjugate/negative views are resolved here, so callers can pass what a
    trainer computed as is.
    """
    import numpy as np

    if getattr(tensor, "is_meta", False):
        msg = (
            f"`{name}` is on the meta device (it holds no data, only a shape), got a tensor of shape "
            f"{tuple(tensor.shape)} on 'meta'; pass a tensor with values (on CPU or an accelerator)."
        )
        raise InputError(msg)
    layout = str(getattr(tensor, "layout", "torch.strided"))
    if layout != "torch.strided" or getattr(tensor, "is_nested", False):
        kind = "nested" if getattr(tensor, "is_nested", False) else layout
        msg = f"`{name}` must be a dense (strided) tensor, got a {kind} tensor; convert it with .to_dense()."
        raise InputError(msg)
    try:
        plain = tensor.detach().cpu()
        if plain.is_floating_point() and plain.element_size() < 4:
            plain = plain.float()
        plain = plain.resolve_conj().resolve_neg()
        return np.asarray(plain.numpy())
    except TypeError as error:  # a dtype numpy cannot hold (complex32, quantized, ...)
        dtype = getattr(tensor, "dtype", "?")
        msg = f"`{name}` must be a tensor of real numbers, got dtype {dtype} ({error})."
        raise LoopguardTypeError(msg) from error
    except (RuntimeError, ValueError, NotImplementedError) as error:  # no readable data (fake tensors, ...)
        msg = f"`{name}` could not be copied out of its tensor ({type(error).__name__}: {error})."
        raise InputError(msg) from error


def _unmasked(name: str, value: np.ma.MaskedArray[Any, Any]) -> NDArray[Any]:
    """The data of a masked array with no masked element; a masked element is refused, never guessed."""
    import numpy as np

    mask = np.ma.getmaskarray(value)
    if mask.any():
        first = tuple(int(i) for i in np.argwhere(mask)[0])
        msg = (
            f"`{name}` must have no masked elements (loopguard does not guess what a masked value means), "
            f"got a masked array with {int(mask.sum()):,} masked of {mask.size:,} (first at index {first}); "
            "drop them with .compressed() or fill them with .filled(value) first."
        )
        raise InputError(msg)
    return np.asarray(np.ma.getdata(value))


def _stack_items(name: str, value: list[Any] | tuple[Any, ...]) -> NDArray[Any]:
    """Convert a list item by item (tensors, masked rows) so that an error names the item, then stack."""
    import numpy as np

    parts = [to_numpy(f"{name}[{index}]", item) for index, item in enumerate(value)]
    shapes = sorted({part.shape for part in parts})
    if len(shapes) > 1:
        msg = (
            f"`{name}` must be a rectangular array of numbers, got items of different shapes "
            f"{describe(shapes)}."
        )
        raise InputError(msg)
    try:
        return np.stack(parts)
    except (ValueError, TypeError) as error:  # pragma: no cover - equal shapes always stack
        msg = f"`{name}` must be a rectangular array of numbers ({error})."
        raise InputError(msg) from error


def to_numpy(name: str, value: object) -> NDArray[Any]:
    """Convert an array-like (including CPU/GPU torch tensors, without importing torch) to numpy.

    Masked arrays are accepted only when no element is masked (their data is used); a torch tensor on the
    ``meta`` device, a sparse tensor or one whose data cannot be read is refused.

    Raises:
        LoopguardTypeError: ``value`` is a scalar bool, a string, bytes or ``None``, or a tensor of a dtype
            numpy cannot hold.
        InputError: ``value`` is a ragged nested list, a masked array with masked elements, or a tensor
            with no readable data (meta device, sparse).

    Example:
        >>> import numpy as np
        >>> to_numpy("rewards", np.ma.array([1.0, 2.0], mask=[False, True]))
        Traceback (most recent call last):
        ...
        loopguard.exceptions.InputError: `rewards` must have no masked elements (loopguard does not guess what a masked value means), got a masked array with 1 masked of 2 (first at index (1,)); drop them with .compressed() or fill them with .filled(value) first.
    """  # noqa: E501
    import numpy as np

    if is_bool(value) or isinstance(value, (str, bytes)) or value is None:
        msg = f"`{name}` must be an array of numbers, got {describe(value)} of type {type(value).__name__}."
        raise LoopguardTypeError(msg)
    items = value if isinstance(value, (list, tuple)) else None  # first: the common case, once per token row
    if items is None:
        if isinstance(value, np.ma.MaskedArray):
            return _unmasked(name, value)
        if type(value) is np.ndarray:
            return value
        if isinstance(value, np.ndarray):
            return np.asarray(value)  # a subclass (np.matrix, np.memmap) as a plain array
        if _is_tensor(value):
            return _tensor_to_numpy(name, value)
    try:
        array = np.asarray(value)
    except (ValueError, TypeError, RuntimeError, NotImplementedError, OverflowError) as error:
        if items:  # e.g. a list of GPU / meta tensors: convert item by item, naming the bad one
            return _stack_items(name, items)
        msg = f"`{name}` must be a rectangular array of numbers, got {describe(value)} ({error})."
        raise InputError(msg) from error
    if items is not None and array.ndim >= 2 and any(isinstance(row, np.ma.MaskedArray) for row in items):
        return _stack_items(name, items)  # np.asarray would drop the rows' masks
    return array


def _python_int_overflow(name: str, value: object, array: NDArray[Any], what: str) -> None:
    """Explain a list of Python ints that numpy could not hold as int64 (it fell back to float64/object)."""
    import numpy as np

    if array.dtype.kind not in "fO" or not isinstance(value, (list, tuple)):
        return
    try:
        items = np.asarray(value, dtype=object)
    except (ValueError, TypeError):
        return
    flat = items.reshape(-1).tolist()
    if not flat or not all(isinstance(item, numbers.Integral) and not is_bool(item) for item in flat):
        return
    for index, item in enumerate(flat):
        if not _INT64_MIN <= int(item) <= _INT64_MAX:
            where = tuple(int(i) for i in np.unravel_index(index, items.shape))
            msg = (
                f"`{name}` must hold {what} that fit in int64 ([-2**63, 2**63 - 1]), "
                f"got {int(item)} at index {where}."
            )
            raise InputError(msg)


def _check_array_shape(
    name: str,
    array: NDArray[Any],
    ndim: int,
    allow_empty: bool,
    max_len: int | None,
    shape: str | None = None,
) -> None:
    if array.ndim != ndim:
        shaped = f" shaped {shape}" if shape else ""
        msg = f"`{name}` must be a {ndim}-D array{shaped}, got shape {array.shape}."
        raise InputError(msg)
    if array.size == 0 and not allow_empty:
        msg = f"`{name}` must not be empty, got shape {array.shape}."
        raise InputError(msg)
    if max_len is not None and array.shape[0] > max_len:
        msg = f"`{name}` must have at most {max_len:,} rows (DoS cap), got {array.shape[0]:,}."
        raise InputError(msg)


def _python_reals(name: str, array: NDArray[Any]) -> NDArray[Any]:
    """Convert an object array built from a list of Python numbers to float64 (others are left as is)."""
    import numpy as np

    flat = array.reshape(-1).tolist()
    if not all(isinstance(item, numbers.Real) and not is_bool(item) for item in flat):
        return array
    try:
        return np.array(flat, dtype=np.float64).reshape(array.shape)
    except OverflowError as error:  # an int beyond float64's range
        msg = f"`{name}` must hold numbers representable in float64, got an integer beyond 1.8e308 ({error})."
        raise InputError(msg) from error


def scalar_value(name: str, value: object) -> object:
    """Unwrap a 0-d or one-element numpy array or torch tensor into a Python number; pass anything else on.

    A value a trainer logs as a tensor (``kl=torch.tensor(0.02)``, ``step=torch.tensor(7)``) is then checked
    like a plain number by :func:`check_real` / :func:`check_int`.

    Raises:
        InputError: an array or tensor with more (or fewer) than one element, a masked element, or a tensor
            with no data (meta device).

    Example:
        >>> import numpy as np
        >>> scalar_value("kl", np.array([0.5]))
        0.5
        >>> scalar_value("kl", np.array([0.5, 0.25]))
        Traceback (most recent call last):
        ...
        loopguard.exceptions.InputError: `kl` must be a single number (a 0-d or one-element array or tensor), got shape (2,).
    """  # noqa: E501
    if type(value) is float or type(value) is int:  # what trainers log, passed on without the ABC checks
        return value
    import numpy as np

    if isinstance(value, (numbers.Number, str, bytes)) or value is None or is_bool(value):
        return value
    if isinstance(value, np.ndarray) or _is_tensor(value):
        array = to_numpy(name, value)
        shape: tuple[int, ...] = array.shape
        item: Callable[[], object] = array.item  # a Python scalar, for an array of one element of any shape
    elif hasattr(value, "item") and hasattr(value, "shape"):  # another array library (JAX, CuPy, ...)
        shape = tuple(int(length) for length in value.shape)
        item = value.item
    else:
        return value
    if math.prod(shape) != 1:
        msg = f"`{name}` must be a single number (a 0-d or one-element array or tensor), got shape {shape}."
        raise InputError(msg)
    return item()


def as_float_array(
    name: str,
    value: object,
    *,
    ndim: int = 1,
    allow_empty: bool = False,
    max_len: int | None = MAX_TRAJECTORIES,
    finite: bool = True,
    shape: str | None = None,
) -> NDArray[np.float64]:
    """Convert an array-like of numbers to a float64 numpy array and validate it.

    Args:
        name: Argument name used in error messages.
        value: List, tuple, numpy array or torch tensor (any device) of real numbers.
        ndim: Required number of dimensions.
        allow_empty: Whether an array with no elements is acceptable.
        max_len: Cap on the length of the first axis (a DoS cap), or ``None``.
        finite: Reject NaN and +-Inf entries.
        shape: How to describe the expected shape in an error message (e.g. ``"[K, B]"``), or ``None``.

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
    import numpy as np

    if type(value) is np.ndarray and value.dtype == np.float64:  # the kernels' own arrays: none to convert
        result: NDArray[np.float64] = value
        _check_array_shape(name, result, ndim, allow_empty, max_len, shape)
    else:
        array = to_numpy(name, value)
        if array.dtype.kind == "b":
            msg = f"`{name}` must hold numbers, got booleans (convert with .astype(float) if intended)."
            raise LoopguardTypeError(msg)
        if array.dtype.kind == "O" and isinstance(value, (list, tuple)):
            array = _python_reals(name, array)  # e.g. floats mixed with ints beyond int64
        if array.dtype.kind not in "iuf":
            msg = f"`{name}` must hold real numbers, got dtype {array.dtype}."
            raise LoopguardTypeError(msg)
        _check_array_shape(name, array, ndim, allow_empty, max_len, shape)
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
    shape: str | None = None,
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
    import numpy as np

    array = to_numpy(name, value)
    if array.dtype.kind == "b":
        msg = f"`{name}` must hold integers, got booleans."
        raise LoopguardTypeError(msg)
    if array.size == 0 and isinstance(value, (list, tuple)):
        array = array.astype(np.int64)  # numpy types an empty list float64: it holds no float
    if array.dtype.kind not in "iu":
        _python_int_overflow(name, value, array, "integers")
        msg = f"`{name}` must hold integers, got dtype {array.dtype}."
        raise LoopguardTypeError(msg)
    _check_array_shape(name, array, ndim, allow_empty, max_len, shape)
    if array.dtype == np.uint64 and array.size and int(array.max()) > np.iinfo(np.int64).max:
        msg = f"`{name}` must fit in int64, got {int(array.max())}."
        raise InputError(msg)
    result = np.asarray(array, dtype=np.int64)
    if lo is not None and result.size and int(result.min()) < lo:
        index = tuple(int(i) for i in np.argwhere(result < lo)[0])
        msg = f"`{name}` must be >= {lo}, got {int(result[index])} at index {index}."
        raise InputError(msg)
    return result


def as_group_sizes(name: str, value: object, *, total: int | None = None) -> NDArray[np.int64]:
    """Validate the sizes of consecutive groups: 1-D integers ``>= 1`` that add up to ``total`` when given.

    Example:
        >>> as_group_sizes("group_sizes", [4, 3, 1], total=8)
        array([4, 3, 1])
        >>> as_group_sizes("group_sizes", [4, 3], total=8)
        Traceback (most recent call last):
        ...
        loopguard.exceptions.InputError: `group_sizes` must add up to the number of rewards (8), got 7 in 2 groups.
    """  # noqa: E501
    sizes = as_int_array(name, value, lo=1, shape="[G] (one size per group)")
    if total is not None:
        largest = int(sizes.max())
        if largest > total:  # checked first: a sum of huge sizes could wrap around in int64
            msg = f"`{name}` must add up to the number of rewards ({total}), got a group of {largest}."
            raise InputError(msg)
        count = int(sizes.sum())
        if count != total:
            groups = len(sizes)
            msg = f"`{name}` must add up to the number of rewards ({total}), got {count} in {groups} groups."
            raise InputError(msg)
    return sizes


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
