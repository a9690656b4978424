"""Pieces shared by every controller: the output record, input checks and state (de)serialisation.

A controller is a frozen config object with two pure methods, ``init`` and ``update``; its memory is a frozen
state value that :meth:`to_dict` turns into plain JSON types and ``from_dict`` validates on the way back in.
This module holds the parts all of them use, so the words of every message are the same everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

import attrs

from loopguard._saved_state import as_state_error
from loopguard._validation import check_bool, check_int, check_real, describe
from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError, StateError

__all__ = [
    "MAX_HISTORY",
    "STATE_VERSION",
    "ControlOutput",
    "Direction",
    "FieldSpec",
    "check_base_beta",
    "check_beta_fits",
    "check_floor_ceil",
    "check_measurement",
    "check_state",
    "check_steps",
    "decode_state",
    "direction_of",
    "encode_state",
    "fmt_beta",
    "load_state",
    "snap_to_base",
]

Direction = Literal["raise", "lower", "hold"]

STATE_VERSION = 1
"""Version written into every serialised state; ``from_dict`` refuses any other."""

MAX_HISTORY = 10_000
"""Cap on a list stored in a state (the PID derivative delay), so a state payload stays small."""

# Relative tolerance under which a relaxed beta counts as back at the user's base beta (float round-off of
# repeated multiply/divide by the gain).
_SNAP = 1e-9


@attrs.frozen
class ControlOutput:
    """What a KL controller decided in one update, and why.

    Attributes:
        beta: The KL coefficient to use from now on; always in ``[beta_floor, beta_ceil]`` and > 0.
        direction: ``"raise"``, ``"lower"`` or ``"hold"``: how ``beta`` compares with the previous beta.
        components: The numbers behind the decision (controller-specific keys, all ``float``), for logging.
        reason: One plain-English sentence with the numbers, e.g.
            ``"raised beta 0.01 -> 0.015: vote 0.71 >= trip 0.30 for 2 steps"``.

    Example:
        >>> out = ControlOutput(beta=0.015, direction="raise", components={"vote": 0.71}, reason="...")
        >>> out.direction
        'raise'
    """

    beta: float
    direction: Direction
    components: dict[str, float]
    reason: str


def fmt_beta(value: float) -> str:
    """Format a KL coefficient for a reason sentence (4 significant digits).

    Example:
        >>> fmt_beta(0.015000000001), fmt_beta(1e-6)
        ('0.015', '1e-06')
    """
    return f"{value:.4g}"


def direction_of(before: float, after: float) -> Direction:
    """Compare two betas exactly: ``"raise"``, ``"lower"`` or ``"hold"``.

    Example:
        >>> direction_of(0.01, 0.015), direction_of(0.01, 0.01)
        ('raise', 'hold')
    """
    if after > before:
        return "raise"
    if after < before:
        return "lower"
    return "hold"


def snap_to_base(value: float, base: float) -> float:
    """Return ``base`` when ``value`` is within float round-off of it (or below it), else ``value``."""
    return base if value <= base * (1.0 + _SNAP) else value


@contextmanager
def _as_input_error() -> Iterator[None]:
    try:
        yield
    except ConfigError as error:  # a bad measurement is data, not configuration
        raise InputError(str(error)) from None


def check_measurement(name: str, value: object, *, lo: float, hi: float | None) -> float:
    """Validate one measurement (a vote, a score, a KL): a finite real in ``[lo, hi]``.

    Raises:
        LoopguardTypeError: ``value`` is a bool or not a real number.
        InputError: ``value`` is NaN, infinite or out of range.

    Example:
        >>> check_measurement("vote", 1.5, lo=0.0, hi=1.0)
        Traceback (most recent call last):
        ...
        loopguard.exceptions.InputError: `vote` must be in [0, 1], got 1.5.
    """
    with _as_input_error():
        return check_real(name, value, lo=lo, hi=hi)


def check_steps(name: str, value: object) -> int:
    """Validate a step count given to ``update`` (an int >= 1); range errors are :class:`InputError`."""
    with _as_input_error():
        return check_int(name, value, lo=1)


def check_base_beta(base_beta: object, beta_floor: float, beta_ceil: float) -> float:
    """Validate the user's starting beta: finite, > 0 and inside ``[beta_floor, beta_ceil]``.

    Example:
        >>> check_base_beta(2.0, 1e-6, 1.0)
        Traceback (most recent call last):
        ...
        loopguard.exceptions.ConfigError: `base_beta` must be in [beta_floor, beta_ceil] = [1e-06, 1], got
        2.0.
    """
    value = check_real("base_beta", base_beta, lo=0.0, lo_inclusive=False)
    if not beta_floor <= value <= beta_ceil:
        msg = (
            f"`base_beta` must be in [beta_floor, beta_ceil] = [{beta_floor:g}, {beta_ceil:g}], "
            f"got {describe(value)}."
        )
        raise ConfigError(msg)
    return value


def check_floor_ceil(beta_floor: float, beta_ceil: float) -> None:
    """Cross-field check shared by the KL controllers: ``beta_floor < beta_ceil``."""
    if not beta_floor < beta_ceil:
        msg = f"`beta_ceil` must be > beta_floor ({beta_floor:g}), got {describe(beta_ceil)}."
        raise ConfigError(msg)


def check_state(state: object, state_type: type, owner: str) -> None:
    """Reject a state of the wrong type (for example a PID state handed to a bang-bang controller)."""
    if not isinstance(state, state_type):
        article = "an" if state_type.__name__[0] in "AEIOU" else "a"
        msg = (
            f"`state` must be {article} {state_type.__name__} (from {owner}.init or "
            f"{state_type.__name__}.from_dict), got {describe(state)} of type {type(state).__name__}."
        )
        raise LoopguardTypeError(msg)


def check_beta_fits(state_beta: float, base_beta: float, beta_floor: float, beta_ceil: float) -> None:
    """Reject a state whose betas lie outside this controller's ``[beta_floor, beta_ceil]``.

    That happens when a state saved under one configuration is loaded into a controller with another.
    """
    for name, value in (("state.base_beta", base_beta), ("state.beta", state_beta)):
        if not beta_floor <= value <= beta_ceil:
            msg = (
                f"`{name}` must be in this controller's [beta_floor, beta_ceil] = "
                f"[{beta_floor:g}, {beta_ceil:g}], got {describe(value)} (saved under another config?)."
            )
            raise ConfigError(msg)


@attrs.frozen
class FieldSpec:
    """How one key of a serialised state is validated by :func:`decode_state`.

    Attributes:
        kind: ``"real"``, ``"int"``, ``"bool"``, ``"int_or_none"`` or ``"real_list"``.
        lo: Lower bound (inclusive unless ``lo_inclusive`` is False) for numbers and list items.
        hi: Upper bound (inclusive) for numbers and list items.
        lo_inclusive: Whether ``lo`` itself is allowed.
    """

    kind: Literal["real", "int", "bool", "int_or_none", "real_list"]
    lo: float | None = None
    hi: float | None = None
    lo_inclusive: bool = True


def _decode_value(key: str, value: Any, spec: FieldSpec) -> Any:
    name = f"state.{key}"
    if spec.kind == "real":
        return check_real(name, value, lo=spec.lo, hi=spec.hi, lo_inclusive=spec.lo_inclusive)
    if spec.kind == "bool":
        return check_bool(name, value)
    if spec.kind == "int_or_none" and value is None:
        return None
    if spec.kind in ("int", "int_or_none"):
        lo = None if spec.lo is None else math.ceil(spec.lo)
        return check_int(name, value, lo=lo)
    if not isinstance(value, (list, tuple)):
        msg = f"`{name}` must be a list of numbers, got {describe(value)} of type {type(value).__name__}."
        raise StateError(msg)
    if len(value) > MAX_HISTORY:
        msg = f"`{name}` must have at most {MAX_HISTORY:,} items, got {len(value):,}."
        raise StateError(msg)
    return tuple(check_real(f"{name}[{i}]", item, lo=spec.lo, hi=spec.hi) for i, item in enumerate(value))


def decode_state(payload: object, state_name: str, specs: Mapping[str, FieldSpec]) -> dict[str, Any]:
    """Validate a serialised state and return its fields as keyword arguments for the state class.

    The payload must be a dict with exactly the keys ``kind``, ``version`` and those in ``specs``; ``kind``
    must name ``state_name`` and ``version`` must be :data:`STATE_VERSION`.

    Raises:
        StateError: the payload is not a dict; wrong ``kind`` or ``version``; missing or unexpected keys; a
            value of the wrong type or out of range.
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
    expected = {"kind", "version", *specs}
    missing = sorted(expected - set(payload))
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
    with as_state_error():
        return {key: _decode_value(key, payload[key], spec) for key, spec in specs.items()}


S = TypeVar("S")


def load_state(state_type: Callable[..., S], payload: object, specs: Mapping[str, FieldSpec]) -> S:
    """Decode ``payload`` with :func:`decode_state` and build the state, its invariants checked.

    Raises:
        StateError: anything :func:`decode_state` refuses, or a state whose fields contradict each other.
    """
    name = getattr(state_type, "__name__", str(state_type))
    fields = decode_state(payload, name, specs)
    with as_state_error():
        return state_type(**fields)


def encode_state(state_name: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """Build the JSON-ready dict of a state: ``kind``, ``version``, then the fields (tuples become lists)."""
    result: dict[str, Any] = {"kind": state_name, "version": STATE_VERSION}
    for key, value in fields.items():
        result[key] = list(value) if isinstance(value, tuple) else value
    return result
