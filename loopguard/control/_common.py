"""Pieces shared by every controller: input and output records, base classes, checks and JSON states.

A KL controller is a frozen config object with two pure methods, ``init`` and ``update``; its memory is a
frozen state value that ``to_dict`` turns into plain JSON types and ``from_dict`` validates on the way back
in. This module holds what all of them use, so the words of every message are the same everywhere:

* :class:`ControlInput` -- what one step gives a KL controller (hack vote, measured KL, batch size);
* :class:`ControlOutput` -- what it decided, and why;
* :class:`KLController` -- the interface the Guard drives, and :class:`KLControllerBase`, which carries the
  shared checks so that each controller only writes its step.

The states' shared JSON base, :class:`~loopguard.control._state.JSONState`, lives in ``_state.py``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar, runtime_checkable

import attrs

from loopguard._validation import check_bool, check_int, check_real, describe
from loopguard.control._state import JSONState
from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError

__all__ = [
    "ControlInput",
    "ControlOutput",
    "Direction",
    "KLController",
    "KLControllerBase",
    "change_reason",
    "check_base_beta",
    "check_beta_fits",
    "check_floor_ceil",
    "check_measurement",
    "check_state",
    "check_steps",
    "direction_of",
    "fmt_beta",
    "snap_to_base",
    "steps_text",
]

Direction = Literal["raise", "lower", "hold"]

# Relative tolerance under which a relaxed beta counts as back at the user's base beta (float round-off of
# repeated multiply/divide by the gain).
_SNAP = 1e-9


# ------------------------------------------------------------------------------------------------ checks


@contextmanager
def _as_input_error() -> Iterator[None]:
    try:
        yield
    except ConfigError as error:  # a bad measurement is data, not configuration
        raise InputError(str(error)) from None


def check_measurement(name: str, value: object, *, lo: float | None, hi: float | None) -> float:
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
    """Validate a step count (an int >= 1); range errors are :class:`InputError`."""
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


# ------------------------------------------------------------------------------------------ input/output


def _vote(value: object) -> float:
    return check_measurement("vote", value, lo=0.0, hi=1.0)


def _kl(value: object) -> float | None:
    return None if value is None else check_measurement("kl", value, lo=None, hi=None)


def _batch_size(value: object) -> int | None:
    return None if value is None else check_steps("batch_size", value)


def _scale(value: object) -> float | None:
    return None if value is None else check_measurement("advantage_scale", value, lo=0.0, hi=None)


@attrs.frozen
class ControlInput:
    """What one step gives a KL controller; each controller reads the fields it steers on.

    :class:`~loopguard.control.BangBang` and :class:`~loopguard.control.PIDLagrangian` read ``vote``;
    :class:`~loopguard.control.AdaptiveKL` reads ``kl`` and ``batch_size``;
    :class:`~loopguard.control.BangBang` sizes its first raise from ``kl`` and ``advantage_scale``. Values
    are checked and stored as plain ``float``/``int`` when the record is built.

    Attributes:
        vote: The Guard's combined hack score, a finite number in [0, 1]. Default 0.0.
        kl: The step's measured mean KL to the reference policy, finite, or None when the step has none. It
            may be slightly negative (a k1 estimate on one batch); AdaptiveKL clips it to 0.
        batch_size: Completions in the step (an int >= 1), or None.
        advantage_scale: The typical size of the advantages the policy gradient multiplies (1.0 when the
            trainer normalises them, as GRPO does by default; the rewards' within-group spread otherwise),
            finite and >= 0, or None when unknown.

    Raises:
        LoopguardTypeError: a bool or non-number where a number is expected.
        InputError: ``vote`` NaN, infinite or outside [0, 1]; ``kl`` NaN or infinite; ``batch_size < 1``.

    Example:
        >>> ControlInput(vote=0.4).vote, ControlInput(kl=-0.001, batch_size=8).kl
        (0.4, -0.001)
        >>> ControlInput(vote=1.5)
        Traceback (most recent call last):
        ...
        loopguard.exceptions.InputError: `vote` must be in [0, 1], got 1.5.
    """

    vote: float = attrs.field(default=0.0, converter=_vote)
    kl: float | None = attrs.field(default=None, converter=_kl)
    batch_size: int | None = attrs.field(default=None, converter=_batch_size)
    advantage_scale: float | None = attrs.field(default=None, converter=_scale)


@attrs.frozen
class ControlOutput:
    """What a KL controller decided in one update, and why.

    Attributes:
        beta: The KL coefficient to use from now on; always in ``[beta_floor, beta_ceil]`` and > 0.
        direction: ``"raise"``, ``"lower"`` or ``"hold"``: how ``beta`` compares with the previous beta.
        components: The numbers behind the decision (controller-specific keys, all ``float``), for logging.
        reason: One plain-English sentence with the numbers, e.g.
            ``"raised beta 0.01 -> 0.015: vote 0.71 >= trip 0.30 for 2 steps"``.
        note: A note for the Guard to show once (e.g. why a controller could not act on this step), or None.

    Example:
        >>> out = ControlOutput(beta=0.015, direction="raise", components={"vote": 0.71}, reason="...")
        >>> out.direction, out.note
        ('raise', None)
    """

    beta: float
    direction: Direction
    components: dict[str, float]
    reason: str
    note: str | None = None

    @classmethod
    def step(cls, before: float, beta: float, components: dict[str, float], reason: str) -> ControlOutput:
        """Build the output of a step that moved beta from ``before`` to ``beta`` (compared exactly)."""
        return cls(beta=beta, direction=direction_of(before, beta), components=components, reason=reason)


def fmt_beta(value: float) -> str:
    """Format a KL coefficient for a reason sentence (4 significant digits).

    Example:
        >>> fmt_beta(0.015000000001), fmt_beta(1e-6)
        ('0.015', '1e-06')
    """
    return f"{value:.4g}"


def steps_text(n: int) -> str:
    """``"1 step"`` or ``"n steps"``, for a reason sentence."""
    return f"{n} step" if n == 1 else f"{n} steps"


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


def change_reason(before: float, beta: float, computed: float, why: str, *, tag: str = "") -> str | None:
    """Word a raise, a lowering, or a lowering the cooldown blocked; None for a plain hold.

    Args:
        before: Beta before the step.
        beta: Beta after the step.
        computed: The beta the controller computed (``beta`` unless a lowering was blocked).
        why: The numbers behind the step, appended after a colon.
        tag: Words put after the new beta of a raise or a lowering, such as ``" (at the floor)"``.

    Example:
        >>> change_reason(0.02, 0.02, 0.01, "KL 0.1 < 1")
        'held beta 0.02: the controller would lower it to 0.01, but lowering is not allowed now (cooldown after a rollback); KL 0.1 < 1'
    """  # noqa: E501
    if beta > before:
        return f"raised beta {fmt_beta(before)} -> {fmt_beta(beta)}{tag}: {why}"
    if beta < before:
        return f"lowered beta {fmt_beta(before)} -> {fmt_beta(beta)}{tag}: {why}"
    if computed < before:
        return (
            f"held beta {fmt_beta(before)}: the controller would lower it to {fmt_beta(computed)}, but "
            f"lowering is not allowed now (cooldown after a rollback); {why}"
        )
    return None


# ----------------------------------------------------------------------------------------- controllers


@runtime_checkable
class KLController(Protocol):
    """What the Guard needs from a KL controller.

    :class:`~loopguard.control.BangBang`, :class:`~loopguard.control.PIDLagrangian` and
    :class:`~loopguard.control.AdaptiveKL` implement it; so can your own.

    Attributes:
        name: The Guard's mode string (``"kl_control"``, ``"pid_lagrangian"``, ``"adaptive_kl"``).
        acts_while_warming: Whether the controller acts from the first step (True) or only once the Guard's
            warm-up has ended (False: it steers on the hack vote, which needs baselines).
        state_type: The class of its states (``state_type.from_dict`` reads a saved one back).
        beta_ceil: The largest beta the controller ever outputs.
    """

    name: ClassVar[str]
    acts_while_warming: ClassVar[bool]
    state_type: ClassVar[type[Any]]  # a JSONState subclass; Any so each controller can name its own

    @property
    def beta_ceil(self) -> float:
        """The largest beta the controller ever outputs."""

    def init(self, base_beta: float) -> Any:
        """Return the first state, at the user's ``base_beta``."""

    def validate(self, state: Any) -> None:
        """Raise when ``state`` could not have come from this controller."""

    def update(
        self, state: Any, signal: ControlInput, *, allow_lower: bool = True
    ) -> tuple[ControlOutput, Any]:
        """Advance one step: ``(output, new_state)``."""


class BetaState(Protocol):
    """What :class:`KLControllerBase` reads from a state: the current and the user's beta."""

    @property
    def beta(self) -> float:
        """The current KL coefficient."""

    @property
    def base_beta(self) -> float:
        """The user's starting beta."""


StateT = TypeVar("StateT", bound=BetaState)


class KLControllerBase(abc.ABC, Generic[StateT]):
    """The shared half of every KL controller: bounds checks, ``validate`` and ``update``'s argument checks.

    A subclass is an ``attrs.frozen`` class with ``beta_floor``/``beta_ceil`` fields, the class variables
    ``name``, ``acts_while_warming`` and ``state_type``, and a ``_step`` that does the controller's own math
    on checked arguments (stable-baselines3's ``on_step``/``_on_step`` split).
    """

    __slots__ = ()
    name: ClassVar[str]
    acts_while_warming: ClassVar[bool]
    state_type: ClassVar[type[JSONState]]
    beta_floor: float
    beta_ceil: float

    def __attrs_post_init__(self) -> None:
        """Check the cross-field rules: the controller's own, then ``beta_floor < beta_ceil``."""
        self._check_config()
        check_floor_ceil(self.beta_floor, self.beta_ceil)

    def _check_config(self) -> None:
        """Check the controller's own cross-field rules (none by default)."""

    def _base(self, base_beta: object) -> float:
        return check_base_beta(base_beta, self.beta_floor, self.beta_ceil)

    def _clip(self, beta: float) -> float:
        return min(self.beta_ceil, max(self.beta_floor, beta))

    @staticmethod
    def _settle(before: float, computed: float, allow_lower: bool) -> float:
        """The beta to use: ``computed``, or ``before`` if it would lower beta and lowering is not allowed."""
        return before if (computed < before and not allow_lower) else computed

    def validate(self, state: StateT) -> None:
        """Check that ``state`` could have come from this controller (its betas inside the bounds).

        Raises:
            LoopguardTypeError: ``state`` is not this controller's state type.
            ConfigError: a beta outside ``[beta_floor, beta_ceil]`` (a state saved under another config).
        """
        check_state(state, self.state_type, type(self).__name__)
        check_beta_fits(state.beta, state.base_beta, self.beta_floor, self.beta_ceil)

    def update(
        self, state: StateT, signal: ControlInput, *, allow_lower: bool = True
    ) -> tuple[ControlOutput, StateT]:
        """Advance one step with this step's :class:`ControlInput`.

        Args:
            state: The state returned by ``init`` or the previous ``update``.
            signal: This step's input; the controller reads its own fields (see the class).
            allow_lower: When False (cooldown after a rollback), a step that would lower beta holds it
                instead; the controller's memory still advances.

        Returns:
            ``(output, new_state)``; ``output.components`` are listed in the class docstring.

        Raises:
            LoopguardTypeError: ``state`` is not this controller's state, ``signal`` is not a
                :class:`ControlInput`, or ``allow_lower`` is not a bool.
            InputError: ``signal`` lacks what the controller needs (AdaptiveKL: ``batch_size``).
            ConfigError: ``state`` does not fit this controller's configuration.
        """
        self.validate(state)
        if not isinstance(signal, ControlInput):
            msg = (
                f"`signal` must be a ControlInput (e.g. ControlInput(vote=0.4)), got {describe(signal)} "
                f"of type {type(signal).__name__}."
            )
            raise LoopguardTypeError(msg)
        allow_lower = check_bool("allow_lower", allow_lower)
        return self._step(state, signal, allow_lower)

    @abc.abstractmethod
    def _step(self, state: StateT, signal: ControlInput, allow_lower: bool) -> tuple[ControlOutput, StateT]:
        """The controller's own step, on checked arguments."""
