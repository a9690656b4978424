"""PID Lagrangian KL control (the ``pid_lagrangian`` mode), after Stooke, Achiam and Abbeel (2020).

The hack score is treated as a constraint cost with a limit; the KL coefficient is the Lagrange multiplier's
stand-in. A plain integral (gradient-ascent) multiplier oscillates and overshoots; adding an EMA'd
proportional term and a one-sided, delayed derivative damps it. The multiplier is added to the user's own
beta, so with no hacking the run keeps exactly the regularisation it was configured with.
"""

from __future__ import annotations

from typing import Any

import attrs

from loopguard._validation import check_bool, describe, integer, real
from loopguard.control._common import (
    MAX_HISTORY,
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
)
from loopguard.exceptions import ConfigError

__all__ = ["PIDLagrangian", "PIDLagrangianState"]


def _history(value: Any) -> tuple[float, ...]:
    return tuple(float(item) for item in value)


@attrs.frozen
class PIDLagrangianState:
    r"""Memory of a :class:`PIDLagrangian` controller between steps (a frozen value).

    Attributes:
        step: Number of updates so far.
        base_beta: The user's starting beta; the multiplier is added to it.
        beta: The current KL coefficient (the last output).
        integral: The integral term :math:`I \ge 0` (already multiplied by ``ki``, in beta units).
        p_ema: The EMA'd error :math:`P` (score units, before ``kp``).
        j_ema: The EMA'd score :math:`J_{ema}` (meaningless while ``j_history`` is empty).
        j_history: The last ``d_delay`` values of :math:`J_{ema}`, oldest first; empty before the first
            update.
    """

    step: int = attrs.field(validator=integer(lo=0))
    base_beta: float = attrs.field(validator=real(lo=0.0, lo_inclusive=False))
    beta: float = attrs.field(validator=real(lo=0.0, lo_inclusive=False))
    integral: float = attrs.field(validator=real(lo=0.0))
    p_ema: float = attrs.field(validator=real(lo=-1.0, hi=1.0))
    j_ema: float = attrs.field(validator=real(lo=0.0, hi=1.0))
    j_history: tuple[float, ...] = attrs.field(converter=_history)

    def __attrs_post_init__(self) -> None:
        """Check the history's length cap and range, and that beta never sits below the user's beta."""
        if len(self.j_history) > MAX_HISTORY:
            msg = f"`j_history` must have at most {MAX_HISTORY:,} items, got {len(self.j_history):,}."
            raise ConfigError(msg)
        if any(not 0.0 <= item <= 1.0 for item in self.j_history):  # NaN fails the comparison too
            msg = f"`j_history` must hold numbers in [0, 1], got {describe(self.j_history)}."
            raise ConfigError(msg)
        if self.beta < self.base_beta:  # beta = clip(base_beta + lambda), lambda >= 0, base_beta >= floor
            msg = f"`beta` must be >= base_beta ({self.base_beta:g}), got {describe(self.beta)}."
            raise ConfigError(msg)

    def to_dict(self) -> dict[str, Any]:
        """Return the state as plain JSON types (``j_history`` becomes a list).

        Example:
            >>> PIDLagrangian().init(0.04).to_dict()["j_history"]
            []
        """
        return encode_state("PIDLagrangianState", attrs.asdict(self, recurse=False))

    @classmethod
    def from_dict(cls, payload: object) -> PIDLagrangianState:
        """Rebuild a state from :meth:`to_dict` output, validating every key, type and range.

        Raises:
            StateError: ``payload`` is not a dict; wrong ``kind``/``version``; missing or extra keys; a
                value of the wrong type or out of range; fields that contradict each other.

        Example:
            >>> import json
            >>> ctl = PIDLagrangian()
            >>> _, state = ctl.update(ctl.init(0.04), 0.9)
            >>> PIDLagrangianState.from_dict(json.loads(json.dumps(state.to_dict()))) == state
            True
        """
        return load_state(cls, payload, _STATE_SPECS)


_STATE_SPECS = {
    "step": FieldSpec("int", lo=0),
    "base_beta": FieldSpec("real", lo=0.0, lo_inclusive=False),
    "beta": FieldSpec("real", lo=0.0, lo_inclusive=False),
    "integral": FieldSpec("real", lo=0.0),
    "p_ema": FieldSpec("real", lo=-1.0, hi=1.0),
    "j_ema": FieldSpec("real", lo=0.0, hi=1.0),
    "j_history": FieldSpec("real_list", lo=0.0, hi=1.0),
}


@attrs.frozen
class PIDLagrangian:
    r"""PID Lagrangian KL controller (Stooke, Achiam and Abbeel 2020), added on top of the user's beta.

    Each update takes the hack score :math:`J_k \in [0, 1]` (the Guard's vote) and the limit :math:`J_{lim}`:

    .. math::

        \Delta_k &= J_k - J_{lim} \\
        I_k &= \operatorname{clip}(I_{k-1} + K_i\,\Delta_k,\ 0,\ I_{max}) \\
        P_k &= \alpha_p P_{k-1} + (1 - \alpha_p)\,\Delta_k \\
        J^{ema}_k &= \alpha_d J^{ema}_{k-1} + (1 - \alpha_d)\,J_k \\
        D_k &= \max(0,\ J^{ema}_k - J^{ema}_{k - d}) \\
        \lambda_k &= \max(0,\ K_p P_k + I_k + K_d D_k) \\
        \beta_k &= \operatorname{clip}(\beta_0 + \lambda_k,\ \beta_{floor},\ \beta_{ceil})

    The alphas weight the *old* value (as in the paper's code). The integral is projected to :math:`\ge 0`
    (no negative wind-up during healthy steps, so the first real hack gets a full response) and clamped at
    :math:`I_{max}` (anti-windup); the derivative is one-sided (only a rising score pushes beta up) and taken
    against the EMA from :math:`d` = ``d_delay`` updates earlier.

    Start-up (the paper is silent; these choices avoid a spurious kick): :math:`P_0 = I_0 = 0`;
    :math:`J^{ema}` starts at the first score rather than at 0 (a zero start would make :math:`D > 0` for the
    first ~20 healthy steps and raise beta with no hack); until ``d_delay`` updates have passed, :math:`D` is
    taken against the oldest stored EMA (the first one).

    With the score at or below the limit from the start and constant, :math:`\lambda = 0` and beta stays
    exactly at :math:`\beta_0`. ``update(..., allow_lower=False)`` holds beta where it was instead of
    lowering it (P, I and D still advance); :math:`K_p, K_i, K_d` are in beta units per unit of score.

    Args:
        limit: Target hack score :math:`J_{lim}` in (0, 1). Default 0.15: the controller settles the score
            near the limit, and 0.15 leaves room for noise below the bang-bang trip band (0.30) while sitting
            above its release band (0.10).
        kp: Proportional gain (>= 0). Default 0.1.
        ki: Integral gain (>= 0). Default 0.01: a sustained score of 0.8 adds 0.0065 to beta per step from
            the integral alone; with P and D, 10 such steps take beta from 0.04 to 0.13 (from 0.001 to 0.092).
        kd: Derivative gain (>= 0). Default 0.1.
        ema_p: EMA weight of the old proportional value, in [0, 1). Default 0.95 (the paper's code).
        ema_d: EMA weight of the old score EMA, in [0, 1). Default 0.95.
        d_delay: Derivative delay in updates, in [1, 10000]. Default 10.
        integral_max: Anti-windup clamp :math:`I_{max}` (> 0), or ``None`` (default) for
            ``beta_ceil - base_beta``: the integral alone never winds past the value that pins beta at the
            ceiling, so it unwinds promptly once the hack stops.
        beta_floor: Smallest beta, > 0. Default 1e-6.
        beta_ceil: Largest beta, > beta_floor. Default 1.0.

    The gains were chosen on real GRPO training (``python -m benchmarks.goodhart``, docs/benchmarks.md): from
    a beta of 0.001, gains of 1.0 / 0.1 / 1.0 drove beta to the 1.0 ceiling within a few steps of a hack and
    froze learning; among 1x, 0.3x, 0.1x and 0.03x those gains, 0.1x kept the most gold reward across the
    benchmark's scenarios. On the simulated plant of ``tests/control/test_pid_lagrangian.py`` (hack pressure
    :math:`h_{t+1} = h_t + \text{drift} - c \log(\beta_t/\beta_0) + \text{noise}`) they hold the score
    below 0.30 after the transient over base betas 0.001-0.3 (see docs/controllers.md).

    Raises:
        LoopguardTypeError: a bool or non-number where a number is expected.
        ConfigError: a value out of range, all gains 0, or ``beta_floor >= beta_ceil``.

    Example:
        >>> ctl = PIDLagrangian()
        >>> state = ctl.init(0.04)
        >>> for score in [0.05, 0.8, 0.8, 0.8]:
        ...     out, state = ctl.update(state, score)
        ...     print(f"{score:.2f} {out.beta:.4f} {out.direction}")
        0.05 0.0400 hold
        0.80 0.0530 raise
        0.80 0.0662 raise
        0.80 0.0790 raise
        >>> sorted(out.components)
        ['base_beta', 'd', 'error', 'i', 'lambda', 'limit', 'p', 'score']

    References:
        Stooke, A., Achiam, J. and Abbeel, P. (2020). Responsive Safety in Reinforcement Learning by PID
        Lagrangian Methods. ICML 2020, arXiv:2007.03964.
    """

    limit: float = attrs.field(
        default=0.15, validator=real(lo=0.0, hi=1.0, lo_inclusive=False, hi_inclusive=False)
    )
    kp: float = attrs.field(default=0.1, validator=real(lo=0.0))
    ki: float = attrs.field(default=0.01, validator=real(lo=0.0))
    kd: float = attrs.field(default=0.1, validator=real(lo=0.0))
    ema_p: float = attrs.field(default=0.95, validator=real(lo=0.0, hi=1.0, hi_inclusive=False))
    ema_d: float = attrs.field(default=0.95, validator=real(lo=0.0, hi=1.0, hi_inclusive=False))
    d_delay: int = attrs.field(default=10, validator=integer(lo=1, hi=MAX_HISTORY))
    integral_max: float | None = attrs.field(
        default=None, validator=real(lo=0.0, lo_inclusive=False, optional=True)
    )
    beta_floor: float = attrs.field(default=1e-6, validator=real(lo=0.0, lo_inclusive=False))
    beta_ceil: float = attrs.field(default=1.0, validator=real(lo=0.0, lo_inclusive=False))

    def __attrs_post_init__(self) -> None:
        """Check the cross-field rules: some gain is > 0 and ``beta_floor < beta_ceil``."""
        if self.kp == 0.0 and self.ki == 0.0 and self.kd == 0.0:
            msg = "`kp`, `ki` and `kd` must not all be 0, got 0, 0, 0 (the controller would never act)."
            raise ConfigError(msg)
        check_floor_ceil(self.beta_floor, self.beta_ceil)

    def init(self, base_beta: float) -> PIDLagrangianState:
        """Start at the user's beta with zero multiplier and an empty derivative history.

        Raises:
            LoopguardTypeError: ``base_beta`` is a bool or not a number.
            ConfigError: ``base_beta`` is not finite, <= 0 or outside ``[beta_floor, beta_ceil]``.
        """
        base = check_base_beta(base_beta, self.beta_floor, self.beta_ceil)
        return PIDLagrangianState(
            step=0, base_beta=base, beta=base, integral=0.0, p_ema=0.0, j_ema=0.0, j_history=()
        )

    def _integral_max(self, base_beta: float) -> float:
        return self.integral_max if self.integral_max is not None else self.beta_ceil - base_beta

    def validate(self, state: PIDLagrangianState) -> None:
        """Check that ``state`` could have come from this controller.

        Raises:
            LoopguardTypeError: ``state`` is not a :class:`PIDLagrangianState`.
            ConfigError: a beta outside ``[beta_floor, beta_ceil]``, an integral above the anti-windup clamp
                or a derivative history longer than ``d_delay`` (a state saved under another config).
        """
        check_state(state, PIDLagrangianState, "PIDLagrangian")
        check_beta_fits(state.beta, state.base_beta, self.beta_floor, self.beta_ceil)
        if len(state.j_history) > self.d_delay:
            msg = (
                f"`state.j_history` must have at most d_delay ({self.d_delay}) items, "
                f"got {len(state.j_history)} (a state saved under another config?)."
            )
            raise ConfigError(msg)
        clamp = self._integral_max(state.base_beta)
        if state.integral > clamp:
            msg = (
                f"`state.integral` must be at most the anti-windup clamp {clamp:g}, got "
                f"{describe(state.integral)} (a state saved under another config?)."
            )
            raise ConfigError(msg)

    def update(
        self, state: PIDLagrangianState, score: float, *, allow_lower: bool = True
    ) -> tuple[ControlOutput, PIDLagrangianState]:
        r"""Advance one step with the current hack score.

        Args:
            state: The state from :meth:`init` or the previous :meth:`update`.
            score: The hack score of this step, a finite number in [0, 1].
            allow_lower: When False (cooldown after a rollback), beta is held instead of lowered; the
                controller's P, I and D still advance.

        Returns:
            ``(output, new_state)``. ``output.components``: ``score``, ``limit``, ``error`` (:math:`\Delta`),
            ``p`` (:math:`K_p P`), ``i`` (:math:`I`), ``d`` (:math:`K_d D`), ``lambda``
            (:math:`\max(0, p + i + d)`) and ``base_beta``; all three terms are in beta units.

        Raises:
            LoopguardTypeError: ``state`` is not a :class:`PIDLagrangianState`, or ``score``/``allow_lower``
                has the wrong type.
            InputError: ``score`` is NaN, infinite or outside [0, 1].
            ConfigError: ``state`` does not fit this controller (beta outside the bounds, or a derivative
                history longer than ``d_delay``).
        """
        self.validate(state)
        score = check_measurement("score", score, lo=0.0, hi=1.0)
        allow_lower = check_bool("allow_lower", allow_lower)

        error = score - self.limit
        integral = min(self._integral_max(state.base_beta), max(0.0, state.integral + self.ki * error))
        # The clamps only guard against float round-off pushing an EMA a hair outside its range.
        p_ema = min(1.0, max(-1.0, self.ema_p * state.p_ema + (1.0 - self.ema_p) * error))
        if state.j_history:
            # Written as a step towards the score, so a constant score leaves the EMA exactly unchanged
            # (a * x + (1 - a) * x can differ from x by one ulp, which read as a positive derivative), and
            # kept between the old EMA and the score: the step can round past the score (1.0 + (1e-119 - 1.0)
            # is 0.0), and an EMA that undershoots a falling score and then "rises" to the next, smaller
            # one would also read as a positive derivative.
            step = state.j_ema + (1.0 - self.ema_d) * (score - state.j_ema)
            j_ema = min(max(score, state.j_ema), max(min(score, state.j_ema), step))
            reference = state.j_history[0]
        else:
            j_ema = reference = score
        derivative = max(0.0, j_ema - reference)
        p_term, d_term = self.kp * p_ema, self.kd * derivative
        lam = max(0.0, p_term + integral + d_term)
        computed = min(self.beta_ceil, max(self.beta_floor, state.base_beta + lam))

        before = state.beta
        beta = before if (computed < before and not allow_lower) else computed
        why = (
            f"score {score:.2f} vs limit {self.limit:g} (error {error:+.2f}); lambda {lam:.4g} = "
            f"P {p_term:.4g} + I {integral:.4g} + D {d_term:.4g}"
        )
        if beta > before:
            reason = f"raised beta {fmt_beta(before)} -> {fmt_beta(beta)}: {why}"
            if beta == self.beta_ceil:
                reason += " (now at the ceiling)"
        elif beta < before:
            reason = f"lowered beta {fmt_beta(before)} -> {fmt_beta(beta)}: {why}"
        elif computed < before:
            reason = (
                f"held beta {fmt_beta(before)}: the controller would lower it to {fmt_beta(computed)}, but "
                f"lowering is not allowed now (cooldown after a rollback); {why}"
            )
        elif beta == self.beta_ceil and state.base_beta + lam > self.beta_ceil:
            reason = f"held beta at the ceiling {fmt_beta(before)}: {why}"
        elif beta == state.base_beta:
            reason = f"held beta {fmt_beta(before)} (the starting beta): {why}"
        else:
            reason = f"held beta {fmt_beta(before)}: {why}"

        new_state = PIDLagrangianState(
            step=state.step + 1,
            base_beta=state.base_beta,
            beta=beta,
            integral=integral,
            p_ema=p_ema,
            j_ema=j_ema,
            j_history=(*state.j_history, j_ema)[-self.d_delay :],
        )
        components = {
            "score": score,
            "limit": self.limit,
            "error": error,
            "p": p_term,
            "i": integral,
            "d": d_term,
            "lambda": lam,
            "base_beta": state.base_beta,
        }
        output = ControlOutput(
            beta=beta, direction=direction_of(before, beta), components=components, reason=reason
        )
        return output, new_state
