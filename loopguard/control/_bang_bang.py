"""Bang-bang KL control with hysteresis (the ``kl_control`` mode).

The simplest closed loop: when the hack vote stays at or above a trip band, multiply beta by a gain every
step; when it has stayed at or below a lower release band for a while, divide it back down, step by step, to
the user's own starting beta and never below it. Between the two bands nothing moves, so a vote hovering
near one threshold cannot make beta flap.
"""

from __future__ import annotations

from typing import Any

import attrs

from loopguard._validation import boolean, check_bool, describe, integer, real
from loopguard.control._common import (
    ControlOutput,
    FieldSpec,
    check_base_beta,
    check_beta_fits,
    check_floor_ceil,
    check_measurement,
    check_state,
    direction_of,
    encode_state,
    fmt_beta,
    load_state,
    snap_to_base,
)
from loopguard.exceptions import ConfigError

__all__ = ["BangBang", "BangBangState"]


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


@attrs.frozen
class BangBangState:
    """Memory of a :class:`BangBang` controller between steps (a frozen value: keep an old one to roll back).

    Attributes:
        step: Number of updates so far.
        base_beta: The user's starting beta; beta is never relaxed below it.
        beta: The current KL coefficient.
        tripped: Whether the controller is tripped (beta above base, or raised and not yet released).
        steps_above: Consecutive updates with ``vote >= trip_band`` (0 after any other vote).
        steps_below: Consecutive updates with ``vote <= release_band`` (0 after any other vote).
    """

    step: int = attrs.field(validator=integer(lo=0))
    base_beta: float = attrs.field(validator=real(lo=0.0, lo_inclusive=False))
    beta: float = attrs.field(validator=real(lo=0.0, lo_inclusive=False))
    tripped: bool = attrs.field(validator=boolean())
    steps_above: int = attrs.field(validator=integer(lo=0))
    steps_below: int = attrs.field(validator=integer(lo=0))

    def __attrs_post_init__(self) -> None:
        """Check the invariants every reachable state satisfies: never below base; untripped means at base."""
        if self.beta < self.base_beta:
            msg = f"`beta` must be >= base_beta ({self.base_beta:g}), got {describe(self.beta)}."
            raise ConfigError(msg)
        if not self.tripped and self.beta != self.base_beta:
            msg = f"`beta` must be base_beta ({self.base_beta:g}) when untripped, got {describe(self.beta)}."
            raise ConfigError(msg)
        if self.steps_above and self.steps_below:
            msg = (
                "`steps_above` and `steps_below` cannot both be > 0, "
                f"got {self.steps_above} and {self.steps_below}."
            )
            raise ConfigError(msg)

    def to_dict(self) -> dict[str, Any]:
        """Return the state as plain JSON types (``json.dumps`` works on it).

        Example:
            >>> BangBang().init(0.01).to_dict()["beta"]
            0.01
        """
        return encode_state("BangBangState", attrs.asdict(self, recurse=False))

    @classmethod
    def from_dict(cls, payload: object) -> BangBangState:
        """Rebuild a state from :meth:`to_dict` output, validating every key, type and invariant.

        Raises:
            StateError: ``payload`` is not a dict; wrong ``kind``/``version``; missing or extra keys; a
                value of the wrong type or out of range; fields that contradict each other.

        Example:
            >>> import json
            >>> state = BangBang().init(0.01)
            >>> BangBangState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
            True
        """
        return load_state(cls, payload, _STATE_SPECS)


_STATE_SPECS = {
    "step": FieldSpec("int", lo=0),
    "base_beta": FieldSpec("real", lo=0.0, lo_inclusive=False),
    "beta": FieldSpec("real", lo=0.0, lo_inclusive=False),
    "tripped": FieldSpec("bool"),
    "steps_above": FieldSpec("int", lo=0),
    "steps_below": FieldSpec("int", lo=0),
}


@attrs.frozen
class BangBang:
    r"""Bang-bang KL controller with hysteresis, relaxing back to the user's beta and never below it.

    Each update takes the hack vote :math:`v_t \in [0, 1]`. Let :math:`a_t` be the number of consecutive votes
    :math:`\ge \tau_{trip}` ending at step :math:`t` and :math:`b_t` the number of consecutive votes
    :math:`\le \tau_{rel}`. The controller trips when :math:`a_t \ge` ``dwell_steps`` and then

    .. math::

        \beta_{t+1} =
        \begin{cases}
            \min(\beta_{ceil},\ g\,\beta_t) & \text{tripped and } v_t \ge \tau_{trip} \\
            \max(\beta_0,\ \beta_t / g) & \text{tripped and } b_t \ge \text{release\_patience} \\
            \beta_t & \text{otherwise}
        \end{cases}

    where :math:`\beta_0` is the user's starting beta (``init(base_beta)``) and :math:`g` the gain. It
    untrips when beta is back at :math:`\beta_0`. Counters mean *consecutive*: a vote that is not
    :math:`\ge \tau_{trip}` resets :math:`a_t`, and a vote that is not :math:`\le \tau_{rel}` resets
    :math:`b_t`. Hence a vote strictly inside the band :math:`(\tau_{rel}, \tau_{trip})` never changes beta or
    the tripped flag; it only interrupts a streak, so tripping needs ``dwell_steps`` high votes in a row and
    relaxing needs ``release_patience`` low votes in a row. Once relaxing has started, each further low vote
    divides beta by the gain again.

    Invariants: :math:`\beta_0 \le \beta_t \le \beta_{ceil}` at every step (so beta is never 0 and never
    below the user's setting, unlike the predecessor, which relaxed to a floor below it); an untripped
    controller sits exactly at :math:`\beta_0`.

    ``update(..., allow_lower=False)`` (the escalation ladder's cooldown after a rollback) turns a relaxing
    step into a hold: the counters still advance, so the first allowed low vote after the cooldown relaxes at
    once.

    Args:
        trip_band: Vote at or above which a step counts as hacking, in (0, 1]. Default 0.30.
        release_band: Vote at or below which a step counts as healthy, in [0, trip_band). Default 0.10.
        dwell_steps: Consecutive hacking votes needed to trip (>= 1). Default 2, so one noisy batch never
            trips.
        release_patience: Consecutive healthy votes before beta starts relaxing (>= 1). Default 3.
        gain: Multiplicative step, > 1. Default 1.5 (about 8 raises from 0.04 to the 1.0 ceiling).
        beta_floor: Smallest beta any state may hold, > 0. Default 1e-6. ``base_beta`` must be >= it.
        beta_ceil: Largest beta, > beta_floor. Default 1.0.

    Raises:
        LoopguardTypeError: a bool or non-number where a number is expected.
        ConfigError: a value out of range, ``release_band >= trip_band`` or ``beta_floor >= beta_ceil``.

    Example:
        >>> ctl = BangBang()
        >>> state = ctl.init(0.01)
        >>> for vote in [0.5, 0.5, 0.2, 0.05, 0.05, 0.05]:
        ...     out, state = ctl.update(state, vote)
        ...     print(f"{vote:.2f} {out.beta:.4f} {out.direction}")
        0.50 0.0100 hold
        0.50 0.0150 raise
        0.20 0.0150 hold
        0.05 0.0150 hold
        0.05 0.0150 hold
        0.05 0.0100 lower
        >>> print(out.reason)
        lowered beta 0.015 -> 0.01: vote 0.05 <= release 0.1 for 3 steps; back at the starting beta, released

    References:
        Åström, K. J. and Murray, R. M. (2008). Feedback Systems: An Introduction for Scientists and
        Engineers, Princeton University Press (on-off control with hysteresis).
        Ziegler, D. M. et al. (2019). Fine-Tuning Language Models from Human Preferences. arXiv:1909.08593
        (the KL coefficient beta as the control input).
    """

    trip_band: float = attrs.field(default=0.30, validator=real(lo=0.0, hi=1.0, lo_inclusive=False))
    release_band: float = attrs.field(default=0.10, validator=real(lo=0.0, hi=1.0))
    dwell_steps: int = attrs.field(default=2, validator=integer(lo=1))
    release_patience: int = attrs.field(default=3, validator=integer(lo=1))
    gain: float = attrs.field(default=1.5, validator=real(lo=1.0, lo_inclusive=False))
    beta_floor: float = attrs.field(default=1e-6, validator=real(lo=0.0, lo_inclusive=False))
    beta_ceil: float = attrs.field(default=1.0, validator=real(lo=0.0, lo_inclusive=False))

    def __attrs_post_init__(self) -> None:
        """Check the cross-field rules: ``release_band < trip_band`` and ``beta_floor < beta_ceil``."""
        if not self.release_band < self.trip_band:
            msg = f"`release_band` must be < trip_band ({self.trip_band:g}), got {self.release_band!r}."
            raise ConfigError(msg)
        check_floor_ceil(self.beta_floor, self.beta_ceil)

    def init(self, base_beta: float) -> BangBangState:
        """Start at the user's beta, untripped.

        Args:
            base_beta: The KL coefficient the user configured; finite, > 0, in ``[beta_floor, beta_ceil]``.

        Returns:
            The initial state (step 0, beta = base_beta).

        Raises:
            LoopguardTypeError: ``base_beta`` is a bool or not a number.
            ConfigError: ``base_beta`` is not finite, <= 0 or outside ``[beta_floor, beta_ceil]``.
        """
        base = check_base_beta(base_beta, self.beta_floor, self.beta_ceil)
        return BangBangState(step=0, base_beta=base, beta=base, tripped=False, steps_above=0, steps_below=0)

    def validate(self, state: BangBangState) -> None:
        """Check that ``state`` could have come from this controller (its betas inside the bounds).

        Raises:
            LoopguardTypeError: ``state`` is not a :class:`BangBangState`.
            ConfigError: a beta outside ``[beta_floor, beta_ceil]`` (a state saved under another config).
        """
        check_state(state, BangBangState, "BangBang")
        check_beta_fits(state.beta, state.base_beta, self.beta_floor, self.beta_ceil)

    def update(
        self, state: BangBangState, vote: float, *, allow_lower: bool = True
    ) -> tuple[ControlOutput, BangBangState]:
        """Advance one step with the current hack vote.

        Args:
            state: The state returned by :meth:`init` or the previous :meth:`update`.
            vote: The hack vote of this step, a finite number in [0, 1].
            allow_lower: When False (cooldown after a rollback), a step that would lower beta holds it
                instead; the counters still advance.

        Returns:
            ``(output, new_state)``. ``output.components`` holds ``vote``, ``trip_band``, ``release_band``,
            ``steps_above``, ``steps_below``, ``gain``, ``base_beta``, ``tripped`` (1.0/0.0) and
            ``lower_blocked`` (1.0 when ``allow_lower=False`` turned a relaxing step into a hold).

        Raises:
            LoopguardTypeError: ``state`` is not a :class:`BangBangState`, or ``vote``/``allow_lower`` has the
                wrong type.
            InputError: ``vote`` is NaN, infinite or outside [0, 1].
            ConfigError: ``state`` holds a beta outside this controller's ``[beta_floor, beta_ceil]``.
        """
        self.validate(state)
        vote = check_measurement("vote", vote, lo=0.0, hi=1.0)
        allow_lower = check_bool("allow_lower", allow_lower)

        above = vote >= self.trip_band
        below = vote <= self.release_band
        steps_above = state.steps_above + 1 if above else 0
        steps_below = state.steps_below + 1 if below else 0
        before, base = state.beta, state.base_beta
        beta, tripped, blocked = before, state.tripped, False
        v, trip, rel = f"{vote:.2f}", f"{self.trip_band:g}", f"{self.release_band:g}"

        if above and (tripped or steps_above >= self.dwell_steps):
            tripped = True
            beta = min(self.beta_ceil, before * self.gain)
            if beta > before:
                reason = f"raised beta {fmt_beta(before)} -> {fmt_beta(beta)}: vote {v} >= trip {trip}"
                reason += f" for {_steps(steps_above)}"
                if beta == self.beta_ceil:
                    reason += " (now at the ceiling)"
            else:
                reason = f"held beta at the ceiling {fmt_beta(before)}: vote {v} >= trip {trip}"
                reason += f" for {_steps(steps_above)}"
        elif above:
            reason = (
                f"held beta {fmt_beta(before)}: vote {v} >= trip {trip} for {steps_above} of "
                f"{self.dwell_steps} steps needed to trip"
            )
        elif below and tripped and steps_below >= self.release_patience:
            relaxed = snap_to_base(max(base, before / self.gain), base)
            if allow_lower:
                beta = relaxed
                tripped = beta > base
                reason = f"lowered beta {fmt_beta(before)} -> {fmt_beta(beta)}: vote {v} <= release {rel}"
                reason += f" for {_steps(steps_below)}"
                if not tripped:
                    reason += "; back at the starting beta, released"
                if beta == before:  # tripped at the ceiling with base == ceil: nothing left to relax
                    reason = f"held beta {fmt_beta(before)} (the starting beta): vote {v} <= release {rel}"
            else:
                blocked = relaxed < before
                reason = (
                    f"held beta {fmt_beta(before)}: vote {v} <= release {rel} for {_steps(steps_below)}, "
                    "but lowering is not allowed now (cooldown after a rollback)"
                )
        elif below and tripped:
            reason = (
                f"held beta {fmt_beta(before)}: vote {v} <= release {rel} for {steps_below} of "
                f"{self.release_patience} steps needed to relax"
            )
        elif below:
            reason = f"held beta {fmt_beta(before)} (the starting beta): vote {v} <= release {rel}"
        else:
            reason = f"held beta {fmt_beta(before)}: vote {v} inside the hysteresis band ({rel}, {trip})"

        new_state = BangBangState(
            step=state.step + 1,
            base_beta=base,
            beta=beta,
            tripped=tripped,
            steps_above=steps_above,
            steps_below=steps_below,
        )
        components = {
            "vote": vote,
            "trip_band": self.trip_band,
            "release_band": self.release_band,
            "steps_above": float(steps_above),
            "steps_below": float(steps_below),
            "gain": self.gain,
            "base_beta": base,
            "tripped": float(tripped),
            "lower_blocked": float(blocked),
        }
        output = ControlOutput(
            beta=beta, direction=direction_of(before, beta), components=components, reason=reason
        )
        return output, new_state
