"""PID Lagrangian KL control (the ``pid_lagrangian`` mode), after Stooke, Achiam and Abbeel (2020).

The hack score is treated as a constraint cost with a limit; the KL coefficient is the Lagrange multiplier's
stand-in. A plain integral (gradient-ascent) multiplier oscillates and overshoots; adding an EMA'd
proportional term and a one-sided, delayed derivative damps it. The multiplier is added to the user's own
beta, so with no hacking the run keeps exactly the regularisation it was configured with.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import attrs

from loopguard._validation import describe, integer, real
from loopguard.control._common import ControlInput, ControlOutput, KLControllerBase, change_reason, fmt_beta
from loopguard.control._state import MAX_HISTORY, JSONState, StateField, to_tuple
from loopguard.exceptions import ConfigError

__all__ = ["PIDLagrangian", "PIDLagrangianState"]


@attrs.frozen
class PIDLagrangianState(JSONState):
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

    step: int = attrs.field(validator=StateField("int", lo=0))
    base_beta: float = attrs.field(validator=StateField("real", lo=0.0, lo_inclusive=False))
    beta: float = attrs.field(validator=StateField("real", lo=0.0, lo_inclusive=False))
    integral: float = attrs.field(validator=StateField("real", lo=0.0))
    p_ema: float = attrs.field(validator=StateField("real", lo=-1.0, hi=1.0))
    j_ema: float = attrs.field(validator=StateField("real", lo=0.0, hi=1.0))
    j_history: tuple[float, ...] = attrs.field(
        converter=to_tuple, validator=StateField("real_list", lo=0.0, hi=1.0)
    )

    def __attrs_post_init__(self) -> None:
        """Check that beta never sits below the user's beta (the history's range is its field's check)."""
        if self.beta < self.base_beta:  # beta = clip(base_beta + lambda), lambda >= 0, base_beta >= floor
            msg = f"`beta` must be >= base_beta ({self.base_beta:g}), got {describe(self.beta)}."
            raise ConfigError(msg)


@attrs.frozen
class PIDLagrangian(KLControllerBase[PIDLagrangianState]):
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
    exactly at :math:`\beta_0`. ``update(state, ControlInput(vote=...))`` reads ``signal.vote`` as
    :math:`J_k`; ``update(..., allow_lower=False)`` holds beta where it was instead of lowering it (P, I
    and D still advance); :math:`K_p, K_i, K_d` are in beta units per unit of score. ``output.components``:
    ``score``, ``limit``, ``error`` (:math:`\Delta`), ``p`` (:math:`K_p P`), ``i`` (:math:`I`), ``d``
    (:math:`K_d D`), ``lambda`` (:math:`\max(0, p + i + d)`) and ``base_beta``; all three terms are in beta
    units.

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
        >>> state, betas = ctl.init(0.04), []
        >>> for score in [0.05, 0.8, 0.8, 0.8]:  # healthy, then a hack: beta rises step by step
        ...     out, state = ctl.update(state, ControlInput(vote=score))
        ...     betas.append(round(out.beta, 4))
        >>> betas, out.direction
        ([0.04, 0.053, 0.0662, 0.079], 'raise')
        >>> sorted(out.components)
        ['base_beta', 'd', 'error', 'i', 'lambda', 'limit', 'p', 'score']

    References:
        Stooke, A., Achiam, J. and Abbeel, P. (2020). Responsive Safety in Reinforcement Learning by PID
        Lagrangian Methods. ICML 2020, arXiv:2007.03964.
    """

    name: ClassVar[str] = "pid_lagrangian"
    acts_while_warming: ClassVar[bool] = False  # it steers on the hack vote, which needs the warm-up
    state_type: ClassVar[type[PIDLagrangianState]] = PIDLagrangianState

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

    def _check_config(self) -> None:
        """Check the cross-field rule: some gain is > 0."""
        if self.kp == 0.0 and self.ki == 0.0 and self.kd == 0.0:
            msg = "`kp`, `ki` and `kd` must not all be 0, got 0, 0, 0 (the controller would never act)."
            raise ConfigError(msg)

    def init(self, base_beta: float) -> PIDLagrangianState:
        """Start at the user's beta with zero multiplier and an empty derivative history.

        Raises:
            LoopguardTypeError: ``base_beta`` is a bool or not a number.
            ConfigError: ``base_beta`` is not finite, <= 0 or outside ``[beta_floor, beta_ceil]``.
        """
        base = self._base(base_beta)
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
        super().validate(state)
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

    def _step(
        self, state: PIDLagrangianState, signal: ControlInput, allow_lower: bool
    ) -> tuple[ControlOutput, PIDLagrangianState]:
        score = signal.vote
        terms = self._terms(state, score)
        computed = self._clip(state.base_beta + terms.lam)
        before = state.beta
        beta = self._settle(before, computed, allow_lower)
        new_state = PIDLagrangianState(
            step=state.step + 1,
            base_beta=state.base_beta,
            beta=beta,
            integral=terms.integral,
            p_ema=terms.p_ema,
            j_ema=terms.j_ema,
            j_history=(*state.j_history, terms.j_ema)[-self.d_delay :],
        )
        components = {
            "score": score,
            "limit": self.limit,
            "error": terms.error,
            "p": terms.p,
            "i": terms.integral,
            "d": terms.d,
            "lambda": terms.lam,
            "base_beta": state.base_beta,
        }
        reason = self._reason(state, beta, computed, terms, score)
        return ControlOutput.step(before, beta, components, reason), new_state

    def _terms(self, state: PIDLagrangianState, score: float) -> _Terms:
        """The PID terms of this step, from the previous state and the score."""
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
        p_term, d_term = self.kp * p_ema, self.kd * max(0.0, j_ema - reference)
        lam = max(0.0, p_term + integral + d_term)
        return _Terms(error, integral, p_ema, j_ema, p_term, d_term, lam)

    def _reason(
        self, state: PIDLagrangianState, beta: float, computed: float, terms: _Terms, score: float
    ) -> str:
        """Word the step: what happened to beta, then the score and the three terms behind lambda."""
        before = state.beta
        why = (
            f"score {score:.2f} vs limit {self.limit:g} (error {terms.error:+.2f}); lambda {terms.lam:.4g} = "
            f"P {terms.p:.4g} + I {terms.integral:.4g} + D {terms.d:.4g}"
        )
        reason = change_reason(before, beta, computed, why)
        if reason is not None:
            return reason + (" (now at the ceiling)" if before < beta == self.beta_ceil else "")
        if beta == self.beta_ceil and state.base_beta + terms.lam > self.beta_ceil:
            return f"held beta at the ceiling {fmt_beta(before)}: {why}"
        if beta == state.base_beta:
            return f"held beta {fmt_beta(before)} (the starting beta): {why}"
        return f"held beta {fmt_beta(before)}: {why}"


class _Terms(NamedTuple):
    """One PID step's numbers: the error, the new memory (integral, EMAs) and the terms, in beta units."""

    error: float
    integral: float
    p_ema: float
    j_ema: float
    p: float
    d: float
    lam: float
