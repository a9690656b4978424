"""A KL controller with the interface verl, OpenRLHF and older TRL PPO loops call, driven by loopguard.

Those engines hold a KL-controller object (Ziegler et al.'s ``AdaptiveKLController`` or a
``FixedKLController``), read its ``value`` as the KL coefficient, and call ``update(current_kl, n_steps)``
once per step. :class:`GuardedKLController` has the same two members, so swapping that one object hands the
coefficient to loopguard; ``observe(...)`` feeds it what the step produced (rewards, completions, ...), and
the Guard's decision sets ``value``. Rollbacks and stops are the engine's to carry out: the controller
reports them (``rollback_requested``, ``should_stop``, and ``restore_before``: the Guard's restore target)
and never touches the model.

verl (``ray_trainer.py`` keeps ``self.kl_ctrl_in_reward``)::

    from loopguard import EscalationLadder, Guard
    from loopguard.integrations import GuardedKLController

    trainer.kl_ctrl_in_reward = GuardedKLController(
        Guard(mode="kl_control", ladder=EscalationLadder(max_rollbacks=0)),
        init_kl_coef=config.algorithm.kl_ctrl.kl_coef,
    )
    # in the training step, after the rewards are computed:
    trainer.kl_ctrl_in_reward.observe(
        batch.batch["token_level_scores"].sum(-1).tolist(),
        completion_ids=batch.batch["responses"].tolist(),
        group_size=config.actor_rollout_ref.rollout.n,
        step=global_steps,
    )
    if trainer.kl_ctrl_in_reward.should_stop:
        break
    # verl itself then calls .update(current_kl=..., n_steps=...) and reads .value as before

Example:
    >>> from loopguard import Guard, Observation
    >>> controller = GuardedKLController(Guard(mode="kl_control", warmup_steps=3), init_kl_coef=0.1)
    >>> controller.update(current_kl=0.02, n_steps=64)  # the engine's call, as with Ziegler's controller
    >>> decision = controller.observe([1.0, 0.0, 0.5, 0.25])  # the step's KL is the update's 0.02
    >>> controller.value, decision.action, controller.last_kl
    (0.1, 'none', 0.02)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loopguard._saved_state import open_state
from loopguard._validation import check_real, describe
from loopguard.adapters._distributed import RankSync, synced_step
from loopguard.exceptions import ConfigError, LoopguardTypeError, StateError
from loopguard.guard import Decision, Guard, Observation

__all__ = ["GuardedKLController"]

STATE_KIND = "loopguard.GuardedKLController"
STATE_VERSION = 1
_STATE_KEYS = ("kind", "version", "value", "last_kl", "n_steps", "observed", "guard")


class GuardedKLController:
    """``.value`` / ``.update(current_kl, n_steps)`` (the engines' interface) plus ``.observe(...)``.

    Args:
        guard: The Guard that decides (default: ``Guard(mode="kl_control")`` starting at ``init_kl_coef``).
            A Guard without a coefficient of its own starts at ``init_kl_coef``.
        init_kl_coef: The starting coefficient, > 0 (the engines' ``kl_coef``).
        sync: Rank synchronisation when several processes each hold a controller (default: nothing in a
            single process; engines that run the controller on one driver process need nothing).

    Attributes:
        last_kl: The latest ``current_kl`` given to :meth:`update` (used as the next observation's KL).
        n_steps: The total ``n_steps`` given to :meth:`update`.
        last_decision: The latest decision from :meth:`observe`.

    Raises:
        LoopguardTypeError: ``guard`` is not a Guard.
        ConfigError: ``init_kl_coef`` <= 0, or a ``log_only`` Guard (it never sets a coefficient).
    """

    def __init__(
        self, guard: Guard | None = None, *, init_kl_coef: float = 0.05, sync: RankSync | None = None
    ):
        """Validate and start at ``init_kl_coef``."""
        coef = check_real("init_kl_coef", init_kl_coef, lo=0.0, lo_inclusive=False)
        if guard is None:
            guard = Guard(mode="kl_control", beta=coef)
        if not isinstance(guard, Guard):
            msg = f"`guard` must be a loopguard.Guard, got {describe(guard)}."
            raise LoopguardTypeError(msg)
        if guard.mode == "log_only":
            msg = (
                "`guard` must control the coefficient (mode 'kl_control', 'pid_lagrangian' or 'adaptive_kl')."
            )
            raise ConfigError(msg)
        self.guard = guard
        self.sync = RankSync() if sync is None else sync
        self._value = float(guard.beta) if guard.beta is not None else coef
        self.last_kl: float | None = None
        self.n_steps = 0
        self.last_decision: Decision | None = None
        self._observed = 0

    @property
    def value(self) -> float:
        """The KL coefficient the engine uses now."""
        return self._value

    @property
    def kl_coef(self) -> float:
        """The same as :attr:`value` (the name some verl forks read)."""
        return self._value

    @property
    def should_stop(self) -> bool:
        """Whether the Guard decided to stop training (terminal)."""
        return self.guard.stopped

    @property
    def rollback_requested(self) -> bool:
        """Whether the latest decision asks the engine to restore its last good checkpoint."""
        return self.last_decision is not None and self.last_decision.action == "rollback"

    @property
    def restore_before(self) -> int | None:
        """On a requested rollback or a stop: restore the newest good checkpoint saved before this step.

        The Guard's ``Decision.restore_before`` (the hack's onset); None for other decisions.
        """
        return None if self.last_decision is None else self.last_decision.restore_before

    def update(self, current_kl: float, n_steps: int) -> None:
        """The engines' per-step call: record the measured KL (``value`` changes only through the Guard)."""
        self.last_kl = check_real("current_kl", float(current_kl), lo=0.0)
        self.n_steps += int(n_steps)

    def observe(
        self,
        rewards: Observation | Any,
        *,
        step: int | None = None,
        can_rollback: bool = False,
        **fields: Any,
    ) -> Decision | None:
        """Feed one step to the Guard; its decision sets :attr:`value`.

        Args:
            rewards: An :class:`~loopguard.Observation`, or the step's proxy rewards (then ``fields`` are
                the Observation's other fields: ``completions``, ``completion_ids``, ``group_size``, ...).
            step: The step (default: one more than the previous observation's).
            can_rollback: Whether the engine can restore a good checkpoint if asked (then the Guard's ladder
                may set :attr:`rollback_requested` before it stops; default False: raise beta, then stop).
            **fields: Observation fields; ``kl`` defaults to the last :meth:`update` KL and ``beta`` to
                :attr:`value`.

        Returns:
            The decision (None only when distributed and no rank observed anything).
        """
        if isinstance(rewards, Observation):
            if fields or step is not None:
                msg = "pass either an Observation or rewards with fields, not both."
                raise LoopguardTypeError(msg)
            observation = rewards
        else:
            fields.setdefault("kl", self.last_kl)
            fields.setdefault("beta", self._value)
            observation = Observation(self._observed if step is None else step, rewards, **fields)
        decision = synced_step(self.guard, observation, can_rollback=bool(can_rollback), sync=self.sync)
        self._observed = observation.step + 1
        if decision is not None:
            self.last_decision = decision
            if decision.beta_after is not None:
                self._value = float(decision.beta_after)
        return decision

    def state_dict(self) -> dict[str, Any]:
        """The controller's state as plain JSON."""
        return {
            "kind": STATE_KIND,
            "version": STATE_VERSION,
            "value": self._value,
            "last_kl": self.last_kl,
            "n_steps": self.n_steps,
            "observed": self._observed,
            "guard": self.guard.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output: every field checked first, then all applied, or nothing.

        Raises:
            StateError: not a GuardedKLController state of this version, unknown or missing keys, a value of
                the wrong type or out of range (``value`` must be a finite coefficient > 0 and equal the
                Guard's beta), or a Guard state that does not fit this Guard. The controller is then
                unchanged.
        """
        fields = open_state(
            state, kind=STATE_KIND, version=STATE_VERSION, keys=_STATE_KEYS, owner="GuardedKLController"
        )
        value = fields.real("value", lo=0.0, lo_inclusive=False)
        last_kl = fields.real("last_kl", lo=0.0, optional=True)
        n_steps = fields.integer("n_steps", lo=0)
        observed = fields.integer("observed", lo=0)
        guard = self.guard.decode_state(fields.raw("guard"))
        if guard.beta is not None and guard.beta != value:
            msg = f"`state['value']` must equal the Guard's beta {guard.beta!r}, got {value!r}."
            raise StateError(msg)
        self.guard.load_state_dict(guard)
        self._value, self.last_kl, self.n_steps, self._observed = value, last_kl, n_steps, observed
