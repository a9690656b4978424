"""Adaptive KL control (Ziegler et al. 2019), the controller other RLHF libraries ship, for comparison.

It steers the *measured KL* towards a target, not the hack score: beta goes up when the policy drifts
further from the reference than the target and down when it stays closer. It knows nothing about reward
hacking, and it will lower beta below the user's setting when the KL is small; that is its purpose, and the
reason loopguard's own modes (:class:`~loopguard.control.BangBang`, :class:`~loopguard.control.PIDLagrangian`)
steer on the hack score instead. It is here so users and the benchmarks can compare like with like.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from loopguard._validation import integer, one_of, real
from loopguard.control._common import ControlInput, ControlOutput, KLControllerBase, change_reason, fmt_beta
from loopguard.control._state import JSONState, StateField
from loopguard.exceptions import InputError

__all__ = ["AdaptiveKL", "AdaptiveKLState"]

_ERROR_CLIP = 0.2  # Ziegler et al. 2019: the proportional error is clipped to [-0.2, 0.2]
_PPO_TOLERANCE = 1.5  # Schulman et al. 2017: act when KL leaves [target / 1.5, 1.5 * target]
_PPO_FACTOR = 2.0  # ... by halving or doubling beta


@attrs.frozen
class AdaptiveKLState(JSONState):
    """Memory of an :class:`AdaptiveKL` controller between steps (a frozen value).

    Attributes:
        step: Number of updates that had a KL (a step without one leaves the state as it was).
        base_beta: The user's starting beta (kept for reference; this controller may go below it).
        beta: The current KL coefficient.
    """

    step: int = attrs.field(validator=StateField("int", lo=0))
    base_beta: float = attrs.field(validator=StateField("real", lo=0.0, lo_inclusive=False))
    beta: float = attrs.field(validator=StateField("real", lo=0.0, lo_inclusive=False))


@attrs.frozen
class AdaptiveKL(KLControllerBase[AdaptiveKLState]):
    r"""Adaptive KL controller: steer the measured KL towards a target (Ziegler et al. 2019, or the PPO rule).

    ``rule="ziegler"`` (what TRL <= 0.11, trlx, OpenRLHF and verl ship as the adaptive controller):

    .. math::

        e_t = \operatorname{clip}\left(\frac{KL_t}{KL_{target}} - 1,\ -0.2,\ 0.2\right), \qquad
        \beta_{t+1} = \operatorname{clip}\left(\beta_t \left(1 + e_t\,\frac{n_t}{H}\right),\
            \beta_{floor},\ \beta_{ceil}\right)

    with :math:`n_t` = ``signal.batch_size`` (the work done since the last update, in the same unit as the
    horizon :math:`H`: the batch size in samples, as old TRL's ``AdaptiveKLController`` and verl pass it) and
    :math:`KL_t` = ``max(0, signal.kl)``. ``rule="ppo"`` (Schulman et al. 2017, section 4):

    .. math::

        \beta_{t+1} =
        \begin{cases}
            \beta_t / 2 & KL_t < KL_{target} / 1.5 \\
            2\,\beta_t & KL_t > 1.5\,KL_{target} \\
            \beta_t & \text{otherwise}
        \end{cases}

    then clipped to :math:`[\beta_{floor}, \beta_{ceil}]`; the batch size is ignored by this rule (but must be
    given, as for the other rule).

    Unlike the other controllers, this one lowers beta *below* the user's starting beta whenever the KL
    stays under the target: that is its job (a KL-targeting controller), and why it cannot be a hack
    mitigation on its own. Only ``update(..., allow_lower=False)`` (the ladder's cooldown) stops it lowering
    beta. Beta never leaves ``[beta_floor, beta_ceil]``, so it is never 0 (with a batch larger than
    :math:`5 H` the Ziegler factor would be negative; the floor catches it).

    It acts from the first step (``acts_while_warming``): it needs no hack-score baseline. A step with no KL
    (``signal.kl is None``) holds beta, leaves the state unchanged and carries a ``note`` for the Guard to
    show. ``output.components``: ``kl`` (after clipping at 0), ``target``, ``error`` (Ziegler: the clipped
    error; PPO: ``kl / target - 1``), ``factor`` (the multiplier applied before clamping), ``n_steps`` (the
    batch size) and ``base_beta``.

    Args:
        target: KL target, > 0. Default 6.0 (old TRL's ``target``, in nats per sequence; verl's default
            ``target_kl`` is 0.1 for a per-token KL).
        horizon: :math:`H`, an integer >= 1. Default 10000 (old TRL).
        beta_floor: Smallest beta, > 0. Default 1e-6.
        beta_ceil: Largest beta, > beta_floor. Default 1.0.
        rule: ``"ziegler"`` (default) or ``"ppo"``.

    Raises:
        LoopguardTypeError: a bool or non-number where a number is expected.
        ConfigError: a value out of range, an unknown rule, or ``beta_floor >= beta_ceil``.

    Example:
        >>> ctl = AdaptiveKL(target=6.0, horizon=100)
        >>> state = ctl.init(0.1)
        >>> out, state = ctl.update(state, ControlInput(kl=9.0, batch_size=10))  # e = clip(0.5) = 0.2
        >>> out.beta, out.direction  # factor 1 + 0.2 * 10 / 100
        (0.102, 'raise')
        >>> ppo = AdaptiveKL(rule="ppo")
        >>> out, state = ppo.update(state, ControlInput(kl=1.0, batch_size=10))
        >>> out.beta  # 1.0 < 6 / 1.5: halved
        0.051
        >>> out, same = ctl.update(state, ControlInput(vote=0.9))  # no KL this step: hold
        >>> out.direction, out.note, same is state
        ('hold', 'adaptive_kl holds beta: this step has no kl', True)

    References:
        Ziegler, D. M., Stiennon, N., Wu, J., Brown, T. B., Radford, A., Amodei, D., Christiano, P. and
        Irving, G. (2019). Fine-Tuning Language Models from Human Preferences. arXiv:1909.08593.
        Schulman, J., Wolski, F., Dhariwal, P., Radford, A. and Klimov, O. (2017). Proximal Policy
        Optimization Algorithms. arXiv:1707.06347.
    """

    name: ClassVar[str] = "adaptive_kl"
    acts_while_warming: ClassVar[bool] = True  # it steers on the measured KL, which needs no baseline
    state_type: ClassVar[type[AdaptiveKLState]] = AdaptiveKLState

    target: float = attrs.field(default=6.0, validator=real(lo=0.0, lo_inclusive=False))
    horizon: int = attrs.field(default=10_000, validator=integer(lo=1))
    beta_floor: float = attrs.field(default=1e-6, validator=real(lo=0.0, lo_inclusive=False))
    beta_ceil: float = attrs.field(default=1.0, validator=real(lo=0.0, lo_inclusive=False))
    rule: str = attrs.field(default="ziegler", validator=one_of("ziegler", "ppo"))

    def init(self, base_beta: float) -> AdaptiveKLState:
        """Start at the user's beta.

        Raises:
            LoopguardTypeError: ``base_beta`` is a bool or not a number.
            ConfigError: ``base_beta`` is not finite, <= 0 or outside ``[beta_floor, beta_ceil]``.
        """
        base = self._base(base_beta)
        return AdaptiveKLState(step=0, base_beta=base, beta=base)

    def _step(
        self, state: AdaptiveKLState, signal: ControlInput, allow_lower: bool
    ) -> tuple[ControlOutput, AdaptiveKLState]:
        if signal.kl is None:
            note = "adaptive_kl holds beta: this step has no kl"
            return ControlOutput(
                beta=state.beta, direction="hold", components={}, reason="", note=note
            ), state
        if signal.batch_size is None:
            msg = (
                "`signal.batch_size` must be the number of completions in the step (an int >= 1) when "
                "`signal.kl` is given: adaptive_kl scales its step by it, got None."
            )
            raise InputError(msg)
        # KL estimates (k1) can dip below 0 on a batch; the controller wants a divergence (>= 0).
        kl = max(0.0, signal.kl)
        n_steps = signal.batch_size  # the batch size, as in old TRL's AdaptiveKLController and verl
        error, factor, why = self._factor(kl, n_steps)
        before = state.beta
        computed = self._clip(before * factor)
        beta = self._settle(before, computed, allow_lower)
        bound = ""
        if beta == self.beta_ceil and before * factor > self.beta_ceil:
            bound = " (at the ceiling)"
        elif beta == self.beta_floor and before * factor < self.beta_floor:
            bound = " (at the floor)"
        reason = change_reason(before, beta, computed, why, tag=bound)
        if reason is None:
            reason = f"held beta {fmt_beta(before)}{bound}: {why}"
        components = {
            "kl": kl,
            "target": self.target,
            "error": error,
            "factor": factor,
            "n_steps": float(n_steps),
            "base_beta": state.base_beta,
        }
        new_state = AdaptiveKLState(step=state.step + 1, base_beta=state.base_beta, beta=beta)
        return ControlOutput.step(before, beta, components, reason), new_state

    def _factor(self, kl: float, n_steps: int) -> tuple[float, float, str]:
        """The error, the factor beta is multiplied by, and the words behind it, under this rule."""
        ratio_error = kl / self.target - 1.0
        if self.rule == "ziegler":
            error = min(_ERROR_CLIP, max(-_ERROR_CLIP, ratio_error))
            factor = 1.0 + error * n_steps / self.horizon
            why = (
                f"KL {kl:.4g} vs target {self.target:g} (error {ratio_error:+.3f}, clipped {error:+.3f}); "
                f"factor 1 + ({error:+.3f}) x {n_steps}/{self.horizon} = {factor:.6g}"
            )
            return error, factor, why
        if kl < self.target / _PPO_TOLERANCE:
            return (
                ratio_error,
                1.0 / _PPO_FACTOR,
                f"KL {kl:.4g} < target/1.5 = {self.target / _PPO_TOLERANCE:.4g}; halve",
            )
        if kl > self.target * _PPO_TOLERANCE:
            return (
                ratio_error,
                _PPO_FACTOR,
                f"KL {kl:.4g} > 1.5 x target = {self.target * _PPO_TOLERANCE:.4g}; double",
            )
        return ratio_error, 1.0, f"KL {kl:.4g} within [target/1.5, 1.5 x target] around {self.target:g}"
