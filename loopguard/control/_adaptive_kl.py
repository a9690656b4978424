"""Adaptive KL control (Ziegler et al. 2019), the controller other RLHF libraries ship, for comparison.

It steers the *measured KL* towards a target, not the hack score: beta goes up when the policy drifts
further from the reference than the target and down when it stays closer. It knows nothing about reward
hacking, and it will lower beta below the user's setting when the KL is small; that is its purpose, and the
reason loopguard's own modes (:class:`~loopguard.control.BangBang`, :class:`~loopguard.control.PIDLagrangian`)
steer on the hack score instead. It is here so users and the benchmarks can compare like with like.
"""

from __future__ import annotations

from typing import Any

import attrs

from loopguard._validation import check_bool, integer, one_of, real
from loopguard.control._common import (
    ControlOutput,
    FieldSpec,
    check_base_beta,
    check_beta_fits,
    check_floor_ceil,
    check_measurement,
    check_state,
    check_steps,
    direction_of,
    encode_state,
    fmt_beta,
    load_state,
)

__all__ = ["AdaptiveKL", "AdaptiveKLState"]

_ERROR_CLIP = 0.2  # Ziegler et al. 2019: the proportional error is clipped to [-0.2, 0.2]
_PPO_TOLERANCE = 1.5  # Schulman et al. 2017: act when KL leaves [target / 1.5, 1.5 * target]
_PPO_FACTOR = 2.0  # ... by halving or doubling beta


@attrs.frozen
class AdaptiveKLState:
    """Memory of an :class:`AdaptiveKL` controller between steps (a frozen value).

    Attributes:
        step: Number of updates so far (calls to ``update``, whatever their ``n_steps``).
        base_beta: The user's starting beta (kept for reference; this controller may go below it).
        beta: The current KL coefficient.
    """

    step: int = attrs.field(validator=integer(lo=0))
    base_beta: float = attrs.field(validator=real(lo=0.0, lo_inclusive=False))
    beta: float = attrs.field(validator=real(lo=0.0, lo_inclusive=False))

    def to_dict(self) -> dict[str, Any]:
        """Return the state as plain JSON types.

        Example:
            >>> AdaptiveKL().init(0.1).to_dict()
            {'kind': 'AdaptiveKLState', 'version': 1, 'step': 0, 'base_beta': 0.1, 'beta': 0.1}
        """
        return encode_state("AdaptiveKLState", attrs.asdict(self, recurse=False))

    @classmethod
    def from_dict(cls, payload: object) -> AdaptiveKLState:
        """Rebuild a state from :meth:`to_dict` output, validating every key, type and range.

        Raises:
            StateError: ``payload`` is not a dict; wrong ``kind``/``version``; missing or extra keys; a
                value of the wrong type or out of range; fields that contradict each other.
        """
        return load_state(cls, payload, _STATE_SPECS)


_STATE_SPECS = {
    "step": FieldSpec("int", lo=0),
    "base_beta": FieldSpec("real", lo=0.0, lo_inclusive=False),
    "beta": FieldSpec("real", lo=0.0, lo_inclusive=False),
}


@attrs.frozen
class AdaptiveKL:
    r"""Adaptive KL controller: steer the measured KL towards a target (Ziegler et al. 2019, or the PPO rule).

    ``rule="ziegler"`` (what TRL <= 0.11, trlx, OpenRLHF and verl ship as the adaptive controller):

    .. math::

        e_t = \operatorname{clip}\left(\frac{KL_t}{KL_{target}} - 1,\ -0.2,\ 0.2\right), \qquad
        \beta_{t+1} = \operatorname{clip}\left(\beta_t \left(1 + e_t\,\frac{n_t}{H}\right),\
            \beta_{floor},\ \beta_{ceil}\right)

    with :math:`n_t` = ``n_steps`` (the work done since the last update, in the same unit as the horizon
    :math:`H`; TRL passes the batch size in samples). ``rule="ppo"`` (Schulman et al. 2017, section 4):

    .. math::

        \beta_{t+1} =
        \begin{cases}
            \beta_t / 2 & KL_t < KL_{target} / 1.5 \\
            2\,\beta_t & KL_t > 1.5\,KL_{target} \\
            \beta_t & \text{otherwise}
        \end{cases}

    then clipped to :math:`[\beta_{floor}, \beta_{ceil}]`; ``n_steps`` is ignored by this rule.

    Unlike the other controllers, this one lowers beta *below* the user's starting beta whenever the KL
    stays under the target: that is its job (a KL-targeting controller), and why it cannot be a hack
    mitigation on its own. Only ``update(..., allow_lower=False)`` (the ladder's cooldown) stops it lowering
    beta. Beta never leaves ``[beta_floor, beta_ceil]``, so it is never 0 (with ``n_steps > 5 H`` the Ziegler
    factor would be negative; the floor catches it).

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
        >>> out, state = ctl.update(state, 9.0, n_steps=10)  # e = clip(0.5) = 0.2; factor 1 + 0.2 * 10 / 100
        >>> out.beta, out.direction
        (0.102, 'raise')
        >>> out, state = AdaptiveKL(rule="ppo").update(state, 1.0)  # 1.0 < 6 / 1.5: halve
        >>> out.beta
        0.051

    References:
        Ziegler, D. M., Stiennon, N., Wu, J., Brown, T. B., Radford, A., Amodei, D., Christiano, P. and
        Irving, G. (2019). Fine-Tuning Language Models from Human Preferences. arXiv:1909.08593.
        Schulman, J., Wolski, F., Dhariwal, P., Radford, A. and Klimov, O. (2017). Proximal Policy
        Optimization Algorithms. arXiv:1707.06347.
    """

    target: float = attrs.field(default=6.0, validator=real(lo=0.0, lo_inclusive=False))
    horizon: int = attrs.field(default=10_000, validator=integer(lo=1))
    beta_floor: float = attrs.field(default=1e-6, validator=real(lo=0.0, lo_inclusive=False))
    beta_ceil: float = attrs.field(default=1.0, validator=real(lo=0.0, lo_inclusive=False))
    rule: str = attrs.field(default="ziegler", validator=one_of("ziegler", "ppo"))

    def __attrs_post_init__(self) -> None:
        """Check the cross-field rule ``beta_floor < beta_ceil``."""
        check_floor_ceil(self.beta_floor, self.beta_ceil)

    def init(self, base_beta: float) -> AdaptiveKLState:
        """Start at the user's beta.

        Raises:
            LoopguardTypeError: ``base_beta`` is a bool or not a number.
            ConfigError: ``base_beta`` is not finite, <= 0 or outside ``[beta_floor, beta_ceil]``.
        """
        base = check_base_beta(base_beta, self.beta_floor, self.beta_ceil)
        return AdaptiveKLState(step=0, base_beta=base, beta=base)

    def validate(self, state: AdaptiveKLState) -> None:
        """Check that ``state`` could have come from this controller (its betas inside the bounds).

        Raises:
            LoopguardTypeError: ``state`` is not an :class:`AdaptiveKLState`.
            ConfigError: a beta outside ``[beta_floor, beta_ceil]`` (a state saved under another config).
        """
        check_state(state, AdaptiveKLState, "AdaptiveKL")
        check_beta_fits(state.beta, state.base_beta, self.beta_floor, self.beta_ceil)

    def update(
        self, state: AdaptiveKLState, kl: float, n_steps: int = 1, *, allow_lower: bool = True
    ) -> tuple[ControlOutput, AdaptiveKLState]:
        """Advance one update with the measured KL.

        Args:
            state: The state from :meth:`init` or the previous :meth:`update`.
            kl: The measured KL divergence from the reference policy, finite and >= 0.
            n_steps: Work since the last update (an int >= 1), in the horizon's unit; ignored by ``"ppo"``.
            allow_lower: When False (cooldown after a rollback), a step that would lower beta holds it.

        Returns:
            ``(output, new_state)``. ``output.components``: ``kl``, ``target``, ``error`` (Ziegler: the
            clipped error; PPO: ``kl / target - 1``), ``factor`` (the multiplier applied before clamping),
            ``n_steps`` and ``base_beta``.

        Raises:
            LoopguardTypeError: ``state`` is not an :class:`AdaptiveKLState`, or an argument has the wrong
                type.
            InputError: ``kl`` is NaN, infinite or negative, or ``n_steps < 1``.
            ConfigError: ``state`` holds a beta outside this controller's ``[beta_floor, beta_ceil]``.
        """
        self.validate(state)
        kl = check_measurement("kl", kl, lo=0.0, hi=None)
        n_steps = check_steps("n_steps", n_steps)
        allow_lower = check_bool("allow_lower", allow_lower)

        ratio_error = kl / self.target - 1.0
        if self.rule == "ziegler":
            error = min(_ERROR_CLIP, max(-_ERROR_CLIP, ratio_error))
            factor = 1.0 + error * n_steps / self.horizon
            why = (
                f"KL {kl:.4g} vs target {self.target:g} (error {ratio_error:+.3f}, clipped {error:+.3f}); "
                f"factor 1 + ({error:+.3f}) x {n_steps}/{self.horizon} = {factor:.6g}"
            )
        else:
            error = ratio_error
            if kl < self.target / _PPO_TOLERANCE:
                factor = 1.0 / _PPO_FACTOR
                why = f"KL {kl:.4g} < target/1.5 = {self.target / _PPO_TOLERANCE:.4g}; halve"
            elif kl > self.target * _PPO_TOLERANCE:
                factor = _PPO_FACTOR
                why = f"KL {kl:.4g} > 1.5 x target = {self.target * _PPO_TOLERANCE:.4g}; double"
            else:
                factor = 1.0
                why = f"KL {kl:.4g} within [target/1.5, 1.5 x target] around {self.target:g}"
        computed = min(self.beta_ceil, max(self.beta_floor, state.beta * factor))

        before = state.beta
        beta = before if (computed < before and not allow_lower) else computed
        bound = ""
        if beta == self.beta_ceil and state.beta * factor > self.beta_ceil:
            bound = " (at the ceiling)"
        elif beta == self.beta_floor and state.beta * factor < self.beta_floor:
            bound = " (at the floor)"
        if beta > before:
            reason = f"raised beta {fmt_beta(before)} -> {fmt_beta(beta)}{bound}: {why}"
        elif beta < before:
            reason = f"lowered beta {fmt_beta(before)} -> {fmt_beta(beta)}{bound}: {why}"
        elif computed < before:
            reason = (
                f"held beta {fmt_beta(before)}: the controller would lower it to {fmt_beta(computed)}, but "
                f"lowering is not allowed now (cooldown after a rollback); {why}"
            )
        else:
            reason = f"held beta {fmt_beta(before)}{bound}: {why}"

        new_state = AdaptiveKLState(step=state.step + 1, base_beta=state.base_beta, beta=beta)
        components = {
            "kl": kl,
            "target": self.target,
            "error": error,
            "factor": factor,
            "n_steps": float(n_steps),
            "base_beta": state.base_beta,
        }
        output = ControlOutput(
            beta=beta, direction=direction_of(before, beta), components=components, reason=reason
        )
        return output, new_state
