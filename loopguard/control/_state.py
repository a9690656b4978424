"""One JSON form for every controller state, derived from the attrs fields' validators.

A state is a frozen attrs class that subclasses :class:`JSONState` and gives every field a :class:`StateField`
as its validator. The same check then validates the state when it is built (errors name the field, ``beta``)
and reads it back from JSON in ``from_dict`` (errors name ``state.beta``, and are
:class:`~loopguard.exceptions.StateError`), so the rules of a field are written once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Literal, TypeVar

import attrs

from loopguard._saved_state import as_state_error
from loopguard._validation import check_bool, check_int, check_real, describe
from loopguard.exceptions import ConfigError, LoopguardTypeError, StateError

__all__ = ["MAX_HISTORY", "STATE_VERSION", "JSONState", "StateField", "to_tuple"]

STATE_VERSION = 1
"""Version written into every serialised state; ``from_dict`` refuses any other."""

MAX_HISTORY = 10_000
"""Cap on a list stored in a state (the PID derivative delay), so a state payload stays small."""


def to_tuple(value: object) -> object:
    """Attrs converter for a ``real_list`` field: a list or tuple becomes a tuple (the rest is checked)."""
    return tuple(value) if isinstance(value, (list, tuple)) else value


@attrs.frozen
class StateField:
    """The check of one field of a :class:`JSONState`, used as its attrs validator and by ``from_dict``.

    When a state is built, it validates the attribute (errors name the field, ``beta``); ``from_dict`` calls
    :meth:`read` on the JSON value first (errors name ``state.beta``) and builds the state from its result.

    Attributes:
        kind: ``"real"``, ``"int"``, ``"bool"`` or ``"real_list"`` (a list of reals, at most
            :data:`MAX_HISTORY` items; pair it with ``converter=to_tuple``).
        lo: Lower bound (inclusive unless ``lo_inclusive`` is False) for numbers and list items.
        hi: Upper bound (inclusive) for numbers and list items.
        lo_inclusive: Whether ``lo`` itself is allowed.
        optional: Whether None is allowed.

    Example:
        >>> StateField("real", lo=0.0, lo_inclusive=False).read("state.beta", 0)
        Traceback (most recent call last):
        ...
        loopguard.exceptions.ConfigError: `state.beta` must be > 0, got 0.0.
    """

    kind: Literal["real", "int", "bool", "real_list"]
    lo: float | None = None
    hi: float | None = None
    lo_inclusive: bool = True
    optional: bool = False

    def __call__(self, _instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        """Validate ``value`` as attrs does, naming the attribute."""
        self.read(attribute.name, value)

    def read(self, name: str, value: object) -> Any:
        """Check ``value`` and return it normalised (``float``, ``int``, ``bool``, tuple of floats or None).

        Raises:
            LoopguardTypeError: the wrong type (a bool for a number, a string for a list, ...).
            ConfigError: NaN, infinite, out of range, or a list longer than :data:`MAX_HISTORY`.
        """
        if self.optional and value is None:
            return None
        if self.kind == "real":
            return check_real(name, value, lo=self.lo, hi=self.hi, lo_inclusive=self.lo_inclusive)
        if self.kind == "int":
            lo = None if self.lo is None else math.ceil(self.lo)
            hi = None if self.hi is None else math.floor(self.hi)
            return check_int(name, value, lo=lo, hi=hi)
        if self.kind == "bool":
            return check_bool(name, value)
        if not isinstance(value, (list, tuple)):
            msg = f"`{name}` must be a list of numbers, got {describe(value)} of type {type(value).__name__}."
            raise LoopguardTypeError(msg)
        if len(value) > MAX_HISTORY:
            msg = f"`{name}` must have at most {MAX_HISTORY:,} items, got {len(value):,}."
            raise ConfigError(msg)
        return tuple(check_real(f"{name}[{i}]", item, lo=self.lo, hi=self.hi) for i, item in enumerate(value))


_S = TypeVar("_S", bound="JSONState")


def _checked_layout(
    payload: object, state_name: str, keys: Iterable[str], added: Iterable[str] = ()
) -> Mapping[str, Any]:
    """Check that ``payload`` is a dict of this state's kind and version with exactly the right keys.

    ``added`` are keys of fields added after the first release (they have defaults): a payload saved before
    them may lack them.
    """
    if not isinstance(payload, Mapping):
        msg = (
            f"`state` must be a dict (from {state_name}.to_dict()), got {describe(payload)} "
            f"of type {type(payload).__name__}."
        )
        raise StateError(msg)
    if "kind" in payload and payload["kind"] != state_name:  # checked first: the likeliest mix-up
        msg = f"`state['kind']` must be {state_name!r}, got {describe(payload['kind'])}."
        raise StateError(msg)
    expected = {"kind", "version", *keys}
    missing = sorted(expected - set(payload) - set(added))
    unexpected = sorted(str(key) for key in set(payload) - expected)
    if missing or unexpected:
        msg = (
            f"`state` must have exactly the keys {sorted(expected)}, got missing {missing}, "
            f"unexpected {unexpected}."
        )
        raise StateError(msg)
    version = payload["version"]
    if isinstance(version, bool) or version != STATE_VERSION:
        msg = f"`state['version']` must be {STATE_VERSION}, got {describe(version)}."
        raise StateError(msg)
    return payload


class JSONState:
    """Base of every controller state: ``to_dict``/``from_dict`` derived from the attrs fields.

    A subclass is an ``attrs.frozen`` class whose every field has a :class:`StateField` as its validator. The
    JSON layout is ``{"kind": <class name>, "version": 1, <field>: <value>, ...}`` in field order, tuples
    written as lists. ``from_dict`` refuses a payload that is not a dict, the wrong ``kind`` or ``version``,
    missing or unknown keys, a value of the wrong type, NaN or infinite, out of range, or fields that
    contradict each other (the class's ``__attrs_post_init__``), always with a
    :class:`~loopguard.exceptions.StateError` that names the field. A field with a default was added after
    the first release: a payload saved before it may lack its key, which then takes the default.

    Example:
        >>> import json
        >>> from loopguard.control import AdaptiveKL, AdaptiveKLState
        >>> state = AdaptiveKL().init(0.1)
        >>> state.to_dict()
        {'kind': 'AdaptiveKLState', 'version': 1, 'step': 0, 'base_beta': 0.1, 'beta': 0.1}
        >>> AdaptiveKLState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
        True
        >>> AdaptiveKLState.from_dict({**state.to_dict(), "beta": float("nan")})
        Traceback (most recent call last):
        ...
        loopguard.exceptions.StateError: `state.beta` must be finite, got nan.
    """

    __slots__ = ()
    __attrs_attrs__: ClassVar[Any]

    @classmethod
    def _fields(cls) -> dict[str, StateField]:
        checks = {}
        for field in attrs.fields(cls):
            if not isinstance(field.validator, StateField):
                msg = f"{cls.__name__}.{field.name} must have a StateField validator, got {field.validator!r}"
                raise TypeError(msg)  # a programming error in loopguard, not bad input
            checks[field.name] = field.validator
        return checks

    def to_dict(self) -> dict[str, Any]:
        """Return the state as plain JSON types (``json.dumps`` works on it; tuples become lists)."""
        result: dict[str, Any] = {"kind": type(self).__name__, "version": STATE_VERSION}
        for name in self._fields():
            value = getattr(self, name)
            result[name] = list(value) if isinstance(value, tuple) else value
        return result

    @classmethod
    def from_dict(cls: type[_S], payload: object) -> _S:
        """Rebuild a state from :meth:`to_dict` output, validating every key, type, range and invariant.

        Raises:
            StateError: ``payload`` is not a dict; wrong ``kind``/``version``; missing or extra keys; a
                value of the wrong type, not finite or out of range; fields that contradict each other.
        """
        checks = cls._fields()
        added = [f.name for f in attrs.fields(cls) if f.default is not attrs.NOTHING]
        fields = _checked_layout(payload, cls.__name__, checks, added)
        with as_state_error():
            values = {
                key: check.read(f"state.{key}", fields[key]) for key, check in checks.items() if key in fields
            }
            return cls(**values)
