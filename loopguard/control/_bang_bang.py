"""Bang-bang KL control with hysteresis (the ``kl_control`` mode).

The simplest closed loop: when the hack vote stays at or above a trip band, multiply beta by a gain every
step; when it has stayed at or below a lower release band for a while, divide it back down, step by step, to
the user's own starting beta and never below it. Between the two bands nothing moves, so a vote hovering
near one threshold cannot make beta flap.
"""

from __future__ import annotations

import math
from typing import ClassVar, NamedTuple

import attrs

from loopguard._validation import boolean, describe, integer, real
from loopguard.control._common import (
    ControlInput,
    ControlOutput,
    KLControllerBase,
    change_reason,
    fmt_beta,
    snap_to_base,
    steps_text,
)
from loopguard.control._state import JSONState, StateField
from loopguard.exceptions import ConfigError

__all__ = ["BangBang", "BangBangState"]

_MIN_KL = 1e-3  # nats per token: below it the policy has not moved and the sized beta is the ceiling anyway
_SNAP = 1e-3  # a remembered floor within this relative distance of the starting beta is forgotten


@attrs.frozen
class BangBangState(JSONState):
    """Memory of a :class:`BangBang` controller between steps (a frozen value: keep an old one to roll back).

    Attributes:
        step: Number of updates so far.
        base_beta: The user's starting beta; beta is never relaxed below it.
        beta: The current KL coefficient.
        tripped: Whether the controller is tripped (beta above base, or raised and not yet released).
        steps_above: Consecutive updates with ``vote >= trip_band`` (0 after any other vote).
        steps_below: Consecutive updates with ``vote <= release_band`` (0 after any other vote).
        floor_beta: The remembered beta that last held a hack off (beta at the first relaxing step after
            a trip; when that was the ceiling, at most the beta sized to the run then), decaying toward
            ``base_beta``; relaxing never goes below it. None when there is no memory (never tripped, memory
            off, or decayed back to ``base_beta``).
        raise_kl: The measured KL to the reference at the last raise while tripped (what ``hold_receding``
            compares with), or None (untripped, or no KL measured at that raise).
        raise_step: ``step`` just after the last raise while tripped, or None (untripped, or relaxing or
            rolled back since): a tripped state with None is relaxing, and needs ``dwell_steps`` high votes
            in a row to raise again.
        remember: Whether the beta at this trip's first relaxing step may become the floor. False from
            :meth:`BangBang.forget` on a tripped controller (the flaw's pay changed, and the beta raised in
            this trip answered the old pay) to that first relaxing step; a later trip (the hack back under
            the new pay) is remembered as usual.
    """

    step: int = attrs.field(validator=StateField("int", lo=0))
    base_beta: float = attrs.field(validator=StateField("real", lo=0.0, lo_inclusive=False))
    beta: float = attrs.field(validator=StateField("real", lo=0.0, lo_inclusive=False))
    tripped: bool = attrs.field(validator=StateField("bool"))
    steps_above: int = attrs.field(validator=StateField("int", lo=0))
    steps_below: int = attrs.field(validator=StateField("int", lo=0))
    floor_beta: float | None = attrs.field(
        default=None, validator=StateField("real", lo=0.0, lo_inclusive=False, optional=True)
    )
    raise_kl: float | None = attrs.field(default=None, validator=StateField("real", optional=True))
    raise_step: int | None = attrs.field(default=None, validator=StateField("int", lo=1, optional=True))
    remember: bool = attrs.field(default=True, validator=StateField("bool"))

    def __attrs_post_init__(self) -> None:
        """Check the invariants every reachable state satisfies: never below base; untripped means at base."""
        if self.beta < self.base_beta:
            msg = f"`beta` must be >= base_beta ({self.base_beta:g}), got {describe(self.beta)}."
            raise ConfigError(msg)
        if not self.tripped and self.beta != self.base_beta:
            msg = f"`beta` must be base_beta ({self.base_beta:g}) when untripped, got {describe(self.beta)}."
            raise ConfigError(msg)
        if self.floor_beta is not None and not self.base_beta < self.floor_beta <= self.beta:
            msg = (
                f"`floor_beta` must be in (base_beta, beta] = ({self.base_beta:g}, {self.beta:g}] or None, "
                f"got {describe(self.floor_beta)}."
            )
            raise ConfigError(msg)
        if not self.remember and self.floor_beta is not None:
            msg = f"`floor_beta` must be None when remember is False, got {describe(self.floor_beta)}."
            raise ConfigError(msg)
        if not self.tripped and (self.raise_kl is not None or self.raise_step is not None):
            msg = (
                "`raise_kl` and `raise_step` must be None when untripped, "
                f"got {describe(self.raise_kl)} and {describe(self.raise_step)}."
            )
            raise ConfigError(msg)
        if self.raise_step is not None and self.raise_step > self.step:
            msg = f"`raise_step` must be <= step ({self.step}), got {self.raise_step}."
            raise ConfigError(msg)
        if self.steps_above and self.steps_below:
            msg = (
                "`steps_above` and `steps_below` cannot both be > 0, "
                f"got {self.steps_above} and {self.steps_below}."
            )
            raise ConfigError(msg)


@attrs.frozen
class BangBang(KLControllerBase[BangBangState]):
    r"""Bang-bang KL controller with hysteresis, relaxing back to the user's beta and never below it.

    Each update takes the hack vote :math:`v_t \in [0, 1]`. Let :math:`a_t` be the number of consecutive votes
    :math:`\ge \tau_{trip}` ending at step :math:`t` and :math:`b_t` the number of consecutive votes
    :math:`\le \tau_{rel}`. The controller trips when :math:`a_t \ge` ``dwell_steps`` and then

    .. math::

        \beta_{t+1} =
        \begin{cases}
            \min(\beta_{ceil},\ g\,\beta_t) & \text{raising and } v_t \ge \tau_{trip}
                \text{, or relaxing and } a_t \ge \text{dwell\_steps} \\
            \max(\beta_0,\ \beta_t / g) & \text{tripped and } b_t \ge \text{release\_patience} \\
            \beta_t & \text{otherwise}
        \end{cases}

    where :math:`\beta_0` is the user's starting beta (``init(base_beta)``) and :math:`g` the gain. A trip
    is *raising* from the raise that trips it to its first relaxing step or a rollback, and *relaxing* from
    then on: one noisy batch raises a relaxing beta no more than it trips a resting one. It untrips when
    beta is back at :math:`\beta_0`. Two refinements make the first response count and keep
    a flaw that keeps paying from coming back:

    * **A first raise sized to the run** (``size_fraction`` :math:`f > 0`). The raise that trips the
      controller jumps to at least :math:`\beta^\star = f\,|A| / \sqrt{2\,\mathrm{KL}}`, where KL is
      the step's measured per-token KL to the reference (``ControlInput.kl``) and :math:`|A|` the advantage
      scale (``ControlInput.advantage_scale``: 1 when the trainer normalises advantages). The KL term's
      gradient on a token's log-probability is about the log-ratio :math:`\delta` to the reference, whose
      root mean square is :math:`\sqrt{2\,\mathrm{KL}}` (the k3 estimator is :math:`\approx\delta^2/2`),
      while the policy-gradient term's is :math:`|A|`; so at :math:`\beta^\star` the pull back toward
      the reference is :math:`f` times the push of the reward. Without a KL or an advantage scale, the
      first raise is :math:`g\,\beta_t` like every other.
    * **Beta with memory** (``memory_half_life`` :math:`h > 0`). The beta at the first relaxing step after
      a trip held the hack off; it becomes the floor :math:`\beta_{mem}` that relaxing never goes below,
      and the floor decays toward :math:`\beta_0` by half every :math:`h` healthy steps. So beta relaxes
      slowly from the level that worked instead of falling back to the user's beta, where the flaw pays
      again (a limit cycle of trips and releases). A new trip that holds at a higher beta resets the floor
      there. A trip held off only at the ceiling ran out of room rather than measured the beta that holds:
      its floor is at most the first raise's sized beta :math:`\beta^\star` at that step's KL (the ceiling
      when it cannot be sized). ``memory_half_life=0`` relaxes all the way down by the gain, as the first
      release did.
    * **No wind-up while the hack recedes** (``hold_receding``). Once tripped, a raise needs evidence that
      the beta in force is not enough. The step right after a raise never has it: its batch (and its KL)
      come from a policy the trainer updated before the raise, so that step holds. After that, a KL to the
      reference below the one measured at the last raise shows the raised beta already pulling the policy
      back, and the controller holds rather than piling gain steps onto a response that is under way (an
      integrator's wind-up under dead time, Åström and Murray 2008, ch. 10); a KL at or above it raises.
      Without a KL, only the one-step wait applies. A relaxing step or a rollback forgets the last raise:
      a new trip compares with its own raise, not with a policy that no longer exists.

    Counters mean *consecutive*: a vote that is not
    :math:`\ge \tau_{trip}` resets :math:`a_t`, and a vote that is not :math:`\le \tau_{rel}` resets
    :math:`b_t`. Hence a vote strictly inside the band :math:`(\tau_{rel}, \tau_{trip})` never changes beta or
    the tripped flag; it only interrupts a streak, so tripping needs ``dwell_steps`` high votes in a row and
    relaxing needs ``release_patience`` low votes in a row. Once relaxing has started, each further low vote
    divides beta by the gain again.

    Invariants: :math:`\beta_0 \le \beta_t \le \beta_{ceil}` at every step (so beta is never 0 and never
    below the user's setting, unlike the predecessor, which relaxed to a floor below it); an untripped
    controller sits exactly at :math:`\beta_0`.

    ``update(state, ControlInput(vote=..., kl=...))`` reads ``signal.vote`` (and ``signal.kl`` when given).
    ``update(..., allow_lower=False)`` (the escalation ladder's cooldown after a rollback) turns a relaxing
    step into a hold: the counters still advance, so the first allowed low vote after the cooldown relaxes at
    once. ``output.components`` holds ``vote``, ``trip_band``, ``release_band``, ``steps_above``,
    ``steps_below``, ``gain``, ``base_beta``, ``tripped`` (1.0/0.0), ``lower_blocked`` (1.0 when
    ``allow_lower=False`` turned a relaxing step into a hold), ``floor_beta``, ``held_receding`` (1.0 when
    a hacking vote held beta instead of raising it while the hack recedes) and ``held_dwell`` (1.0 when a
    relaxing trip held a hacking vote short of ``dwell_steps`` in a row).

    Args:
        trip_band: Vote at or above which a step counts as hacking, in (0, 1]. Default 0.30.
        release_band: Vote at or below which a step counts as healthy, in [0, trip_band). Default 0.10.
        dwell_steps: Consecutive hacking votes needed to trip, and to raise a relaxing beta again (>= 1).
            Default 2, so one noisy batch never trips, nor raises beta on its way down.
        release_patience: Consecutive healthy votes before beta starts relaxing (>= 1). Default 3.
        gain: Multiplicative step, > 1. Default 1.5 (about 8 raises from 0.04 to the 1.0 ceiling).
        beta_floor: Smallest beta any state may hold, > 0. Default 1e-6. ``base_beta`` must be >= it.
        beta_ceil: Largest beta, > beta_floor. Default 1.0.
        size_fraction: :math:`f` above, in [0, 10]: the first raise's KL pull as a fraction of the reward's
            push. Default 0.5. 0 turns sizing off (every raise is one gain step).
        memory_half_life: :math:`h` above, healthy steps for the remembered floor to halve its distance
            to the starting beta, >= 0. Default 50. 0 turns the memory off.
        hold_receding: Hold a tripped beta on the step after a raise and while the KL stays below the one
            measured at the last raise (above). Default True; False raises on every hacking vote of a raising
            trip.

    Raises:
        LoopguardTypeError: a bool or non-number where a number is expected.
        ConfigError: a value out of range, ``release_band >= trip_band`` or ``beta_floor >= beta_ceil``.

    Example:
        >>> ctl = BangBang(memory_half_life=0)  # no memory: relax all the way back to the user's beta
        >>> state = ctl.init(0.01)
        >>> for vote in [0.5, 0.5, 0.2, 0.05, 0.05, 0.05]:
        ...     out, state = ctl.update(state, ControlInput(vote=vote))
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

    name: ClassVar[str] = "kl_control"
    acts_while_warming: ClassVar[bool] = False  # it steers on the hack vote, which needs the warm-up
    state_type: ClassVar[type[BangBangState]] = BangBangState

    trip_band: float = attrs.field(default=0.30, validator=real(lo=0.0, hi=1.0, lo_inclusive=False))
    release_band: float = attrs.field(default=0.10, validator=real(lo=0.0, hi=1.0))
    dwell_steps: int = attrs.field(default=2, validator=integer(lo=1))
    release_patience: int = attrs.field(default=3, validator=integer(lo=1))
    gain: float = attrs.field(default=1.5, validator=real(lo=1.0, lo_inclusive=False))
    beta_floor: float = attrs.field(default=1e-6, validator=real(lo=0.0, lo_inclusive=False))
    beta_ceil: float = attrs.field(default=1.0, validator=real(lo=0.0, lo_inclusive=False))
    size_fraction: float = attrs.field(default=0.5, validator=real(lo=0.0, hi=10.0))
    memory_half_life: float = attrs.field(default=50.0, validator=real(lo=0.0, hi=1e6))
    hold_receding: bool = attrs.field(default=True, validator=boolean())

    def _check_config(self) -> None:
        """Check the cross-field rule ``release_band < trip_band``."""
        if not self.release_band < self.trip_band:
            msg = f"`release_band` must be < trip_band ({self.trip_band:g}), got {self.release_band!r}."
            raise ConfigError(msg)

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
        base = self._base(base_beta)
        return BangBangState(step=0, base_beta=base, beta=base, tripped=False, steps_above=0, steps_below=0)

    def _step(
        self, state: BangBangState, signal: ControlInput, allow_lower: bool
    ) -> tuple[ControlOutput, BangBangState]:
        vote = signal.vote
        above, below = vote >= self.trip_band, vote <= self.release_band
        steps_above = state.steps_above + 1 if above else 0
        steps_below = state.steps_below + 1 if below else 0
        floor = state.floor_beta
        raise_kl, raise_step = (state.raise_kl, state.raise_step) if state.tripped else (None, None)
        remember = state.remember
        receding = None
        raising = raise_step is not None  # a trip between its raise and its first relaxing step
        if above and (raising or steps_above >= self.dwell_steps):
            receding = self._receding(state, signal, steps_above)
            if receding is not None:
                move = _Move(state.beta, True, False, receding)
            else:
                sized = None if state.tripped else self._sized(signal)
                move = self._raise(state.beta, vote, steps_above, sized)
                raise_kl, raise_step = signal.kl, state.step + 1
        elif below and state.tripped and steps_below >= self.release_patience:
            capped = None
            if self.memory_half_life > 0:
                floor = self._remember(state, steps_below)
                if floor is not None and steps_below == self.release_patience and floor >= self.beta_ceil:
                    floor, capped = self._uncensored(state, signal)
            remember = True  # the trip the forgetting fell in is over: a new one is remembered as usual
            move = self._relax(state, vote, steps_below, allow_lower, floor, capped)
            raise_kl = raise_step = None  # the raised beta held the hack off: a new trip starts afresh
        else:
            move = _Move(
                state.beta, state.tripped, False, self._hold_reason(state, vote, steps_above, steps_below)
            )
        if floor is not None and not state.base_beta < floor <= move.beta:
            floor = None if floor <= state.base_beta or not move.tripped else min(floor, move.beta)
        new_state = BangBangState(
            step=state.step + 1,
            base_beta=state.base_beta,
            beta=move.beta,
            tripped=move.tripped,
            steps_above=steps_above,
            steps_below=steps_below,
            floor_beta=floor,
            raise_kl=raise_kl if move.tripped else None,
            raise_step=raise_step if move.tripped else None,
            remember=remember,
        )
        components = {
            "vote": vote,
            "trip_band": self.trip_band,
            "release_band": self.release_band,
            "steps_above": float(steps_above),
            "steps_below": float(steps_below),
            "gain": self.gain,
            "base_beta": state.base_beta,
            "tripped": float(move.tripped),
            "lower_blocked": float(move.blocked),
            "floor_beta": state.base_beta if floor is None else floor,
            "held_receding": float(receding is not None),
            "held_dwell": float(above and state.tripped and not raising and steps_above < self.dwell_steps),
        }
        return ControlOutput.step(state.beta, move.beta, components, move.reason), new_state

    def forget(self, state: BangBangState) -> BangBangState:
        """``state`` without its remembered floor, so relaxing may go back to the user's beta.

        The Guard calls this when the escalation ladder switches a targeted penalty on: the flaw that needed
        the remembered beta no longer pays as it did. On a tripped controller, nor does the beta of this
        trip (raised against the old pay, and perhaps again while the policy unlearns the flaw) become the
        floor when it holds the hack off; a later trip (the hack back with the penalty in force) is
        remembered as usual.

        Example:
            >>> ctl = BangBang()
            >>> held = BangBangState(step=9, base_beta=0.01, beta=0.3, tripped=True, steps_above=0,
            ...                      steps_below=4, floor_beta=0.3)
            >>> ctl.forget(held).floor_beta is None
            True
        """
        self.validate(state)
        return attrs.evolve(state, floor_beta=None, remember=not state.tripped)

    def after_rollback(self, state: BangBangState) -> BangBangState:
        """``state`` without its last raise, which described a policy the rollback discarded.

        The KL measured before a rollback says nothing about the restored policy (nor, after a re-anchoring,
        about the new reference), so a new raise does not wait for it.

        The Guard calls this on every rollback.

        Example:
            >>> ctl = BangBang()
            >>> raised = BangBangState(step=9, base_beta=0.01, beta=0.3, tripped=True, steps_above=3,
            ...                        steps_below=0, raise_kl=0.8, raise_step=9)
            >>> restored = ctl.after_rollback(raised)
            >>> restored.raise_kl, restored.raise_step, restored.beta
            (None, None, 0.3)
        """
        self.validate(state)
        return attrs.evolve(state, raise_kl=None, raise_step=None)

    def _receding(self, state: BangBangState, signal: ControlInput, steps_above: int) -> str | None:
        """Why a tripped controller holds instead of raising again, or None to raise.

        The raise on the previous step cannot show yet: that step's batch and KL come from a policy trained
        before it. After that, a KL below the one measured at the last raise shows the raised beta pulling
        the policy back, and raising further would only wind beta up while the hack recedes.
        """
        if not (self.hold_receding and state.tripped and state.beta < self.beta_ceil):
            return None
        held = f"held beta {fmt_beta(state.beta)}: vote {signal.vote:.2f} >= trip {self.trip_band:g} for "
        held += steps_text(steps_above)
        if state.raise_step is not None and state.step <= state.raise_step:
            return (
                f"{held}, but beta was raised on the previous step and this step's batch comes from a policy "
                "trained before that raise: waiting one step to see its effect"
            )
        if state.raise_kl is None or signal.kl is None or signal.kl >= state.raise_kl:
            return None
        return (
            f"{held}, but the KL to the reference has fallen since the last raise ({state.raise_kl:.3g} -> "
            f"{signal.kl:.3g} nats/token), so the raised beta is already pulling the policy back"
        )

    def _sized(self, signal: ControlInput) -> tuple[float, str] | None:
        """The first raise's size, f |A| / sqrt(2 KL), and its explanation; None when it cannot be sized."""
        kl, scale = signal.kl, signal.advantage_scale
        if self.size_fraction == 0 or kl is None or scale is None or scale <= 0:
            return None
        kl = max(kl, _MIN_KL)
        beta = self.size_fraction * scale / math.sqrt(2.0 * kl)
        why = (
            f"sized so that the KL pull beta*sqrt(2*KL) is {self.size_fraction:g} x the advantage scale "
            f"{scale:.3g} at the measured KL {kl:.3g} nats/token"
        )
        return beta, why

    def _raise(self, before: float, vote: float, steps_above: int, sized: tuple[float, str] | None) -> _Move:
        """Multiply beta by the gain (when tripping now: at least the sized beta), up to the ceiling."""
        stepped = before * self.gain
        beta = min(self.beta_ceil, stepped)
        why = f"vote {vote:.2f} >= trip {self.trip_band:g} for {steps_text(steps_above)}"
        if sized is not None and sized[0] > stepped:
            beta = min(self.beta_ceil, sized[0])
            why += f"; {sized[1]}"
        reason = (
            change_reason(before, beta, beta, why) or f"held beta at the ceiling {fmt_beta(before)}: {why}"
        )
        if before < beta == self.beta_ceil:
            reason += " (now at the ceiling)"
        return _Move(beta, True, False, reason)

    def _remember(self, state: BangBangState, steps_below: int) -> float | None:
        """The floor after this healthy step: beta on the first relaxing step, then halving every h steps."""
        base = state.base_beta
        if steps_below == self.release_patience:  # the beta now held the hack off for release_patience steps
            return state.beta if state.beta > base and state.remember else None
        if state.floor_beta is None:
            return None
        floor = base + (state.floor_beta - base) * 0.5 ** (1.0 / self.memory_half_life)
        return None if floor - base <= _SNAP * base else floor

    def _uncensored(self, state: BangBangState, signal: ControlInput) -> tuple[float | None, str | None]:
        """The floor of a trip held off at the ceiling: at most the beta sized to the run, and why.

        A trip that reached the ceiling ran out of room: the ceiling held the hack off, but it is a bound of
        the controller, not a measure of the lowest beta that would have (the raises before it came one gain
        step at a time, each waiting for the last to show). Remembered, it would hold the policy next to the
        reference for many half-lives. So the floor is at most the beta sized for a first raise at this
        step's KL (``size_fraction`` of the reward's push), the strongest response the run's own scale asks
        for; without a KL or an advantage scale, the ceiling stands.
        """
        sized = self._sized(signal)
        if sized is None or sized[0] >= state.beta:
            return state.beta, None
        base = state.base_beta
        floor = sized[0] if sized[0] > base else None
        why = (
            f"the ceiling {fmt_beta(state.beta)} held the hack off, and the remembered beta is at most the "
            f"one sized to the run, {fmt_beta(max(sized[0], base))} ({sized[1]})"
        )
        return floor, why

    def _relax(
        self,
        state: BangBangState,
        vote: float,
        steps_below: int,
        allow_lower: bool,
        floor: float | None,
        capped: str | None = None,
    ) -> _Move:
        """Divide beta by the gain, down to the remembered floor or the user's beta (or hold).

        ``capped``: why the floor of a trip held off at the ceiling is lower than the ceiling (said once, on
        the trip's first relaxing step).
        """
        before, base = state.beta, state.base_beta
        relaxed = snap_to_base(max(base if floor is None else floor, before / self.gain), base)
        why = f"vote {vote:.2f} <= release {self.release_band:g}"
        if not allow_lower:
            reason = (
                f"held beta {fmt_beta(before)}: {why} for {steps_text(steps_below)}, "
                "but lowering is not allowed now (cooldown after a rollback)"
            )
            if capped is not None:
                reason += f"; {capped}"
            return _Move(before, state.tripped, relaxed < before, reason)
        if relaxed == before:
            if floor is not None:
                text = f"held beta {fmt_beta(before)}: {why} for {steps_text(steps_below)}"
                return _Move(before, True, False, f"{text}; it held the hack off, remembered as the floor")
            # tripped at the ceiling with base == ceil: nothing left to relax
            return _Move(before, False, False, f"held beta {fmt_beta(before)} (the starting beta): {why}")
        reason = (
            f"lowered beta {fmt_beta(before)} -> {fmt_beta(relaxed)}: {why} for {steps_text(steps_below)}"
        )
        halving = (
            f"halves its distance to the starting beta {fmt_beta(base)} every {self.memory_half_life:g} "
            "healthy steps"
        )
        if capped is not None:  # said whatever the relaxed beta: the floor is not the beta that held
            reason += f"; {capped}" + ("" if floor is None else f"; it {halving}")
        elif relaxed == base:
            reason += "; back at the starting beta, released"
        elif floor is not None and relaxed == floor:
            reason += f"; following the remembered beta that held the hack off, which {halving}"
        return _Move(relaxed, relaxed > base, False, reason)

    def _hold_reason(self, state: BangBangState, vote: float, steps_above: int, steps_below: int) -> str:
        """Word a step that leaves beta where it is: dwelling, waiting to relax, healthy, or in the band."""
        before, v = fmt_beta(state.beta), f"{vote:.2f}"
        trip, rel = f"{self.trip_band:g}", f"{self.release_band:g}"
        if steps_above:
            needed = "raise again" if state.tripped else "trip"
            return (
                f"held beta {before}: vote {v} >= trip {trip} for {steps_above} of "
                f"{self.dwell_steps} steps needed to {needed}"
            )
        if steps_below and state.tripped:
            return (
                f"held beta {before}: vote {v} <= release {rel} for {steps_below} of "
                f"{self.release_patience} steps needed to relax"
            )
        if steps_below:
            return f"held beta {before} (the starting beta): vote {v} <= release {rel}"
        return f"held beta {before}: vote {v} inside the hysteresis band ({rel}, {trip})"


class _Move(NamedTuple):
    """One bang-bang step's outcome: new beta and tripped flag, whether a lowering was blocked, and why."""

    beta: float
    tripped: bool
    blocked: bool
    reason: str
