"""The escalation ladder: raise beta, then take the pay out of the exploit and roll back, then stop.

Raising the KL coefficient is the first and cheapest response to reward hacking; when it has not helped
after a while, the ladder switches on a *targeted penalty* (when the tripping signal names a feature the
reward pays for: :mod:`loopguard.targeted`) and asks for a rollback to the last good checkpoint (a bounded
number of times, with a cooldown so the restored policy gets a fair chance; the KL reference is re-anchored
on the restored policy), and only when all of that is used up and the hack persists does it ask to stop the
run. It takes one bool per step ("is this step hacking?"), so it works with every controller.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import attrs

from loopguard._validation import boolean, check_bool, integer
from loopguard.control._common import check_state, steps_text
from loopguard.control._state import JSONState, StateField
from loopguard.exceptions import ConfigError

__all__ = ["EscalationLadder", "LadderAction", "LadderOutput", "LadderState"]

LadderAction = Literal["none", "raise_beta", "rollback", "stop"]

RUNG_NONE, RUNG_RAISE, RUNG_ROLLBACK, RUNG_STOP = 0, 1, 2, 3


@attrs.frozen
class LadderOutput:
    """What the escalation ladder asks for in one step, and why.

    Attributes:
        action: ``"none"`` (healthy step), ``"raise_beta"`` (hacking: the KL controller raises beta),
            ``"rollback"`` (restore the last good checkpoint) or ``"stop"`` (end the run; terminal).
        rung: The rung this step stands on: 0 none, 1 raise beta, 2 rollback (also every step of the cooldown
            after a rollback, so the rung never drops during a cooldown), 3 stop.
        in_cooldown: True on a rollback step (when ``cooldown_steps > 0``) and on the ``cooldown_steps`` steps
            after it; the Guard then passes ``allow_lower=False`` to the KL controller.
        components: The counters behind the decision (all ``float``), for logging.
        reason: A plain-English sentence with the numbers.
        shape: True on the step the ladder switches the targeted penalty on (with a rollback when one is
            available, else with a raise of beta).
    """

    action: LadderAction
    rung: int
    in_cooldown: bool
    components: dict[str, float]
    reason: str
    shape: bool = False


@attrs.frozen
class LadderState(JSONState):
    """Memory of an :class:`EscalationLadder` between steps (a frozen value).

    Attributes:
        step: Number of updates so far.
        consecutive_hacking: Hacking steps in a row; reset by a healthy step and by a rollback.
        consecutive_healthy: Healthy steps in a row; reset by a hacking step.
        total_hacking_steps: All hacking steps so far (never reset).
        total_rollbacks: All rollbacks so far (never reset).
        cooldown_left: Steps of cooldown still to come after the current one (0 when none).
        last_rollback_step: The step number (1-based) of the last rollback, or None.
        stop_step: The step at which the ladder said stop, or None; once set, every update says stop.
        shaped_step: The step at which the targeted penalty was switched on, or None.
    """

    step: int = attrs.field(validator=StateField("int", lo=0))
    consecutive_hacking: int = attrs.field(validator=StateField("int", lo=0))
    consecutive_healthy: int = attrs.field(validator=StateField("int", lo=0))
    total_hacking_steps: int = attrs.field(validator=StateField("int", lo=0))
    total_rollbacks: int = attrs.field(validator=StateField("int", lo=0))
    cooldown_left: int = attrs.field(validator=StateField("int", lo=0))
    last_rollback_step: int | None = attrs.field(validator=StateField("int", lo=1, optional=True))
    stop_step: int | None = attrs.field(validator=StateField("int", lo=1, optional=True))
    shaped_step: int | None = attrs.field(default=None, validator=StateField("int", lo=1, optional=True))

    def __attrs_post_init__(self) -> None:
        """Check counter invariants that every reachable state satisfies."""
        if self.consecutive_hacking and self.consecutive_healthy:
            msg = (
                "`consecutive_hacking` and `consecutive_healthy` cannot both be > 0, "
                f"got {self.consecutive_hacking} and {self.consecutive_healthy}."
            )
            raise ConfigError(msg)
        if not self.consecutive_hacking <= self.total_hacking_steps <= self.step:
            msg = (
                "`total_hacking_steps` must be in [consecutive_hacking, step] = "
                f"[{self.consecutive_hacking}, {self.step}], got {self.total_hacking_steps}."
            )
            raise ConfigError(msg)
        for name, value in (
            ("last_rollback_step", self.last_rollback_step),
            ("stop_step", self.stop_step),
            ("shaped_step", self.shaped_step),
        ):
            if value is not None and value > self.step:
                msg = f"`{name}` must be <= step ({self.step}), got {value}."
                raise ConfigError(msg)
        if (self.total_rollbacks == 0) != (self.last_rollback_step is None):
            msg = (
                "`last_rollback_step` must be set exactly when total_rollbacks > 0, got "
                f"{self.last_rollback_step} with total_rollbacks {self.total_rollbacks}."
            )
            raise ConfigError(msg)

    @property
    def stopped(self) -> bool:
        """Whether the ladder has said stop (terminal)."""
        return self.stop_step is not None


@attrs.frozen
class EscalationLadder:
    r"""Escalate from raising beta to rolling back to stopping, with patience per rung and a cooldown.

    Each step gets one bool, ``hacking`` (the Guard's verdict), and ``can_rollback`` (whether a good
    checkpoint exists). With :math:`c_t` the consecutive hacking steps (reset by a healthy step and by a
    rollback):

    * healthy step: action ``"none"``;
    * hacking step: ``"raise_beta"`` (the KL controller does the raising), unless

      * the **targeted rung** (``targeted=True``, once per run): the first hacking step with
        :math:`c_t \ge` ``shape_patience`` on which ``can_shape`` is True (the Guard found a feature the
        reward pays for) has ``shape`` True: the penalty goes on while beta is raised, before any rollback
        (the exploit stops paying, so there is nothing to hold off and nothing lost to roll back). When it
        comes at a step that would roll back or stop, it rides with the rollback, or replaces the stop;
      * ``"rollback"`` when :math:`c_t \ge` ``rollback_patience``, fewer than ``max_rollbacks`` rollbacks were
        made, ``can_rollback`` is True and the ladder is not in a cooldown. A rollback resets :math:`c_t` to 0
        and starts a cooldown of ``cooldown_steps`` steps, during which there is no other rollback and
        ``in_cooldown`` is True (the Guard must not lower beta);
      * ``"stop"`` when no rollback is available (``max_rollbacks`` used, or ``can_rollback`` False),
        the targeted rung is used or unavailable, and :math:`c_t \ge` ``stop_patience``. Stop is
        terminal: every later update returns ``"stop"``.

    So with ``can_rollback`` True the ladder never stops before all ``max_rollbacks`` rollbacks were tried,
    and a stop needs ``stop_patience`` consecutive hacking steps after the last rollback. A stop may come
    during a cooldown (the cooldown forbids de-escalating and rolling back, not escalating further). A healthy
    step never raises anything; ``consecutive_*`` counters reset, ``total_*`` counters never do.

    Args:
        rollback_patience: Consecutive hacking steps before a rollback, >= 1. Default 10: bang-bang at gain
            1.5 takes 8 raises to go from a typical beta of 0.04 to the 1.0 ceiling, so 10 hacking steps in a
            row mean raising beta has had its chance.
        stop_patience: Consecutive hacking steps, with no rollback available, before stopping, >= 1.
            Default 10.
        max_rollbacks: Rollbacks allowed in the run, >= 0. Default 2.
        cooldown_steps: Steps after a rollback with no further rollback and no lowering of beta, >= 0.
            Default 20 (twice the rollback patience: the restored policy gets time to settle under the raised
            beta before it can be judged again).
        targeted: Allow the targeted rung (the Guard switches on a penalty on the feature the reward pays
            for, :mod:`loopguard.targeted`; the adapters subtract it from the trained reward). Default True.
        shape_patience: Consecutive hacking steps before the targeted rung may act, >= 1. Default 3 (one
            more than bang-bang's dwell: the signal has tripped, and the premium is measured on more than
            one batch).
        reanchor: On a rollback, make the restored policy the KL reference (the adapters copy it into
            TRL's ``ref_model``, or the reference model given to a raw loop), so a raised beta holds the
            policy near a good policy rather than near the initial one (Elastic Reset, Noukhovitch et al.
            2023; ProRL's reference resets, Liu et al. 2025; TRL's ``sync_ref_model``). Default True.

    Raises:
        LoopguardTypeError: a bool or non-integer where an integer is expected.
        ConfigError: a value out of range.

    Example:
        >>> ladder = EscalationLadder(rollback_patience=2, stop_patience=2, max_rollbacks=1, cooldown_steps=1)
        >>> state = ladder.init()
        >>> for hacking in [True, True, True, True, True]:
        ...     out, state = ladder.update(state, hacking=hacking)
        ...     print(out.action, out.rung, out.in_cooldown)
        raise_beta 1 False
        rollback 2 True
        raise_beta 2 True
        stop 3 False
        stop 3 False
        >>> print(out.reason)  # doctest: +ELLIPSIS
        training was stopped at step 4; the ladder is terminal ...

    References:
        Stooke, A., Achiam, J. and Abbeel, P. (2020). Responsive Safety in Reinforcement Learning by PID
        Lagrangian Methods. arXiv:2007.03964 (the KL multiplier as the first, continuous response).
    """

    rollback_patience: int = attrs.field(default=10, validator=integer(lo=1))
    stop_patience: int = attrs.field(default=10, validator=integer(lo=1))
    max_rollbacks: int = attrs.field(default=2, validator=integer(lo=0))
    cooldown_steps: int = attrs.field(default=20, validator=integer(lo=0))
    targeted: bool = attrs.field(default=True, validator=boolean())
    shape_patience: int = attrs.field(default=3, validator=integer(lo=1))
    reanchor: bool = attrs.field(default=True, validator=boolean())

    def init(self) -> LadderState:
        """Start on the bottom rung with every counter at 0."""
        return LadderState(
            step=0,
            consecutive_hacking=0,
            consecutive_healthy=0,
            total_hacking_steps=0,
            total_rollbacks=0,
            cooldown_left=0,
            last_rollback_step=None,
            stop_step=None,
        )

    def _components(self, state: LadderState, hacking: bool, can_rollback: bool) -> dict[str, float]:
        return {
            "hacking": float(hacking),
            "can_rollback": float(can_rollback),
            "consecutive_hacking": float(state.consecutive_hacking),
            "consecutive_healthy": float(state.consecutive_healthy),
            "total_hacking_steps": float(state.total_hacking_steps),
            "total_rollbacks": float(state.total_rollbacks),
            "cooldown_left": float(state.cooldown_left),
            "rollback_patience": float(self.rollback_patience),
            "stop_patience": float(self.stop_patience),
            "max_rollbacks": float(self.max_rollbacks),
        }

    def _no_rollback_why(self, total_rollbacks: int) -> str:
        if self.max_rollbacks == 0:
            return "rollbacks are disabled (max_rollbacks=0)"
        if total_rollbacks >= self.max_rollbacks:
            return f"the rollback budget is used up ({total_rollbacks} of {self.max_rollbacks})"
        made = f"{total_rollbacks} of {self.max_rollbacks} rollbacks made"
        return f"there is no good checkpoint to roll back to ({made})"

    def validate(self, state: LadderState) -> None:
        """Check that ``state`` could have come from this ladder (its counters within the configured budget).

        Raises:
            LoopguardTypeError: ``state`` is not a :class:`LadderState`.
            ConfigError: more rollbacks than ``max_rollbacks`` or a longer cooldown than ``cooldown_steps``
                (a state saved under another config).
        """
        check_state(state, LadderState, "EscalationLadder")
        if state.total_rollbacks > self.max_rollbacks:
            msg = (
                f"`state.total_rollbacks` must be at most max_rollbacks ({self.max_rollbacks}), got "
                f"{state.total_rollbacks} (a state saved under another config?)."
            )
            raise ConfigError(msg)
        if state.cooldown_left > self.cooldown_steps:
            msg = (
                f"`state.cooldown_left` must be at most cooldown_steps ({self.cooldown_steps}), got "
                f"{state.cooldown_left} (a state saved under another config?)."
            )
            raise ConfigError(msg)

    def update(
        self, state: LadderState, *, hacking: bool, can_rollback: bool = True, can_shape: bool = False
    ) -> tuple[LadderOutput, LadderState]:
        """Advance one step.

        Args:
            state: The state from :meth:`init` or the previous :meth:`update`.
            hacking: Whether this step is judged hacking (e.g. the Guard's verdict is HACK).
            can_rollback: Whether a good checkpoint exists to roll back to now.
            can_shape: Whether a targeted penalty can be switched on now (the Guard found a feature the
                reward pays for); used only with ``targeted=True``, once per run.

        Returns:
            ``(output, new_state)``. ``output.components``: ``hacking``, ``can_rollback`` (1.0/0.0), the new
            state's ``consecutive_hacking``, ``consecutive_healthy``, ``total_hacking_steps``,
            ``total_rollbacks``, ``cooldown_left``, and the config's ``rollback_patience``,
            ``stop_patience`` and ``max_rollbacks``.

        Raises:
            LoopguardTypeError: ``state`` is not a :class:`LadderState`, or ``hacking``/``can_rollback`` is
                not a bool.
        """
        self.validate(state)
        hacking = check_bool("hacking", hacking)
        can_rollback = check_bool("can_rollback", can_rollback)
        can_shape = check_bool("can_shape", can_shape) and self.targeted and state.shaped_step is None
        if state.stop_step is not None:
            reason = (
                f"training was stopped at step {state.stop_step}; the ladder is terminal "
                "(start a new ladder to resume mitigation)"
            )
            move = _Move("stop", RUNG_STOP, False, reason, attrs.evolve(state, step=state.step + 1))
        elif hacking:
            move = self._hacking(state, can_rollback, can_shape)
        else:
            move = self._healthy(state)
        components = self._components(move.state, hacking, can_rollback)
        out = LadderOutput(move.action, move.rung, move.in_cooldown, components, move.reason, move.shape)
        return out, move.state

    def _cooling(self, cooldown_left: int) -> str:
        return f"cooldown after rollback: {steps_text(cooldown_left)} left, beta is not lowered"

    def _healthy(self, state: LadderState) -> _Move:
        """A healthy step: no action; the hacking streak ends and the cooldown counts down."""
        in_cooldown = state.cooldown_left > 0
        new_state = attrs.evolve(
            state,
            step=state.step + 1,
            consecutive_hacking=0,
            consecutive_healthy=state.consecutive_healthy + 1,
            cooldown_left=max(0, state.cooldown_left - 1),
        )
        reason = f"healthy for {steps_text(new_state.consecutive_healthy)} in a row: no action"
        if in_cooldown:
            reason += f"; {self._cooling(new_state.cooldown_left)}"
        return _Move("none", RUNG_ROLLBACK if in_cooldown else RUNG_NONE, in_cooldown, reason, new_state)

    def _hacking(self, state: LadderState, can_rollback: bool, can_shape: bool) -> _Move:
        """A hacking step: roll back, stop, or (most often) let the KL controller raise beta."""
        in_cooldown = state.cooldown_left > 0
        rollback_open = state.total_rollbacks < self.max_rollbacks and can_rollback
        new_state = attrs.evolve(
            state,
            step=state.step + 1,
            consecutive_hacking=state.consecutive_hacking + 1,
            consecutive_healthy=0,
            total_hacking_steps=state.total_hacking_steps + 1,
            cooldown_left=max(0, state.cooldown_left - 1),
        )
        streak = new_state.consecutive_hacking
        due = streak >= self.rollback_patience and not in_cooldown
        if can_shape and streak >= self.shape_patience:
            return self._shape(new_state, rollback_open and due)
        if due and rollback_open:
            return self._rollback(new_state)
        if not rollback_open and streak >= self.stop_patience:
            return self._stop(new_state)
        reason = f"hacking for {steps_text(streak)} in a row: raise beta"
        if in_cooldown:
            reason += f"; {self._cooling(new_state.cooldown_left)}"
        if rollback_open:
            more = f"rollback after {self.rollback_patience} in a row"
            reason += ", no rollback until it ends" if in_cooldown else f"; {more}"
        else:
            why = self._no_rollback_why(new_state.total_rollbacks)
            reason += f"; {why}, stop after {self.stop_patience} in a row"
        return _Move(
            "raise_beta", RUNG_ROLLBACK if in_cooldown else RUNG_RAISE, in_cooldown, reason, new_state
        )

    def _rollback(self, state: LadderState) -> _Move:
        """Ask for a rollback: the streak resets and the cooldown starts."""
        total_rollbacks = state.total_rollbacks + 1
        reason = (
            "roll back to the last good checkpoint "
            f"(rollback {total_rollbacks} of {self.max_rollbacks}): hacking persisted for "
            f"{steps_text(state.consecutive_hacking)} in a row while beta was raised; "
            f"cooldown of {steps_text(self.cooldown_steps)} with no further rollback and no lowering of "
            "beta"
        )
        new_state = attrs.evolve(
            state,
            consecutive_hacking=0,
            total_rollbacks=total_rollbacks,
            last_rollback_step=state.step,
            cooldown_left=self.cooldown_steps,
        )
        return _Move("rollback", RUNG_ROLLBACK, self.cooldown_steps > 0, reason, new_state)

    def _shape(self, state: LadderState, rollback_open: bool) -> _Move:
        """Switch the targeted penalty on (with a rollback when one is available); the streak resets."""
        what = (
            f"hacking persisted for {steps_text(state.consecutive_hacking)} in a row while beta was raised: "
            "take the pay out of the exploit with a targeted penalty"
        )
        if rollback_open:
            move = self._rollback(state)
            shaped = attrs.evolve(move.state, shaped_step=state.step)
            reason = f"take the pay out of the exploit with a targeted penalty, and {move.reason}"
            return move._replace(reason=reason, state=shaped, shape=True)
        shaped = attrs.evolve(state, shaped_step=state.step, consecutive_hacking=0)
        in_cooldown = state.cooldown_left > 0
        rung = RUNG_ROLLBACK if in_cooldown else RUNG_RAISE
        return _Move("raise_beta", rung, in_cooldown, f"{what}; raise beta", shaped, True)

    def _stop(self, state: LadderState) -> _Move:
        """Ask to stop the run (terminal), saying what to try next."""
        reason = (
            f"stop training: hacking persisted for {steps_text(state.consecutive_hacking)} in a row and "
            f"{self._no_rollback_why(state.total_rollbacks)}; {state.total_hacking_steps} hacking steps in "
            "all. "
            "Raising beta did not stop it. To go on, try a "
            "higher beta_ceil or a stronger starting beta, a sturdier reward (an ensemble, a gold "
            "check, reward shaping), or a lower learning rate, then resume from the last good "
            "checkpoint."
        )
        return _Move("stop", RUNG_STOP, False, reason, attrs.evolve(state, stop_step=state.step))


class _Move(NamedTuple):
    """One ladder step's outcome before the components are added."""

    action: LadderAction
    rung: int
    in_cooldown: bool
    reason: str
    state: LadderState
    shape: bool = False
