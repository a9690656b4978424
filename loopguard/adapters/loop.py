"""Hand-written PPO / GRPO / REINFORCE loops: step the Guard, then apply its decision in one call.

A raw loop owns its KL coefficient, its model and its optimizer, so loopguard cannot reach into them the way
the trainer callbacks do. Two pieces cover it:

* :func:`apply_decision` -- apply one :class:`~loopguard.guard.Decision`: write ``beta_after`` through a
  setter, restore the newest good checkpoint saved before the hack's onset through a
  :class:`~loopguard.checkpoint.CheckpointManager` on a rollback (on every rank, behind barriers, when
  ``torch.distributed`` is initialised), and report a stop flag the loop obeys.
* :class:`LoopGuard` -- a Guard plus that bookkeeping: it tracks the hack's onset, asks the manager whether
  a rollback is possible, keeps every rank's decision identical (see
  :mod:`loopguard.adapters._distributed`), and applies the decision. Saving checkpoints stays in the loop
  (:meth:`LoopGuard.healthy` says when a save is safe).

Example:
    >>> from loopguard import Guard, Observation
    >>> betas = []
    >>> loop = LoopGuard(Guard(mode="kl_control", warmup_steps=3, beta=0.1), set_beta=betas.append)
    >>> applied = loop.step(Observation(0, [1.0, 0.0, 0.5]))
    >>> applied.action, applied.stop, applied.rolled_back_to, betas
    ('none', False, None, [0.1])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from loopguard._saved_state import decode_rollbacks, open_state
from loopguard.adapters._distributed import RankSync, synced_restore, synced_step

if TYPE_CHECKING:
    from loopguard.guard import Decision, Guard, Observation

__all__ = ["Applied", "LoopGuard", "apply_decision"]

_STATE_KIND = "loopguard.LoopGuard"
_STATE_KEYS = ("kind", "version", "guard", "onset", "rollbacks")


@attrs.frozen
class Applied:
    """What :func:`apply_decision` did.

    Attributes:
        action: The decision's action (``"none"`` when there was no decision this step).
        beta: The coefficient written through the setter (None when nothing was written).
        rolled_back_to: The checkpoint step restored (None when there was no rollback).
        stop: Whether the loop must stop now.
        decision: The decision applied (None when no rank observed anything this step).
    """

    action: str
    beta: float | None
    rolled_back_to: int | None
    stop: bool
    decision: Decision | None = None


def apply_decision(
    decision: Decision,
    *,
    set_beta: Callable[[float], Any] | None = None,
    checkpoint: Any = None,
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    before_step: int | None = None,
    sync: RankSync | None = None,
) -> Applied:
    """Apply one Guard decision to a hand-written loop.

    Args:
        decision: From ``Guard.step`` (identical on every rank when it came from :class:`LoopGuard`).
        set_beta: Called with ``decision.beta_after`` when the Guard has a coefficient (log-only Guards
            without one never call it).
        checkpoint: A :class:`~loopguard.checkpoint.CheckpointManager`; needed for a rollback.
        model: Receives the restored weights on a rollback.
        optimizer: Receives the restored optimizer state, if given.
        scheduler: Receives the restored scheduler state, if given.
        before_step: The hack's onset: the checkpoint restored is the newest good one saved strictly before
            it (default: ``decision.step``).
        sync: Rank synchronisation (default: a :class:`RankSync`, which does nothing in a single process).
            Newer checkpoints are discarded by rank 0 only.

    Returns:
        An :class:`Applied`; the loop stops when ``stop`` is True.

    Raises:
        ValueError: a rollback without ``checkpoint`` and ``model``.

    Example:
        >>> from loopguard import Guard, Observation
        >>> decision = Guard(mode="log_only", warmup_steps=3).step(Observation(0, [1.0, 0.0]))
        >>> apply_decision(decision).stop
        False
    """
    sync = RankSync() if sync is None else sync
    beta = None
    if set_beta is not None and decision.beta_after is not None:
        beta = float(decision.beta_after)
        set_beta(beta)
    restored = None
    if decision.action == "rollback":
        if checkpoint is None or model is None:
            msg = "a rollback needs `checkpoint` (a CheckpointManager) and `model`."
            raise ValueError(msg)
        before = decision.step if before_step is None else before_step
        restored = synced_restore(
            sync,
            lambda discard: int(
                checkpoint.restore(
                    "last_good",
                    model,
                    optimizer,
                    scheduler,
                    rng=False,
                    before_step=before,
                    discard_newer=discard,
                ).step
            ),
            main=sync.is_main,
        )
    return Applied(decision.action, beta, restored, decision.action == "stop", decision)


class LoopGuard:
    """A :class:`~loopguard.guard.Guard` for a hand-written loop: decide (the same on every rank) and apply.

    Args:
        guard: The Guard (its ladder decides rollbacks and stops).
        set_beta: Writes the KL coefficient the loop uses.
        checkpoint: A :class:`~loopguard.checkpoint.CheckpointManager` holding the loop's good checkpoints
            (needed for rollbacks).
        restore_on_stop: On a stop, also restore the newest good checkpoint saved before the hack's onset
            (when one exists on every rank and ``model`` is given), so the loop ends with healthy weights.
        sync: Rank synchronisation (default: :class:`RankSync` over the default process group; nothing
            happens in a single process).

    Attributes:
        onset: The step of the first non-OK verdict of the current episode (None when healthy).
        rollbacks: ``{"step", "restored_step"}`` for each rollback.
        last_decision: The latest decision.
    """

    def __init__(
        self,
        guard: Guard,
        *,
        set_beta: Callable[[float], Any] | None = None,
        checkpoint: Any = None,
        restore_on_stop: bool = True,
        sync: RankSync | None = None,
    ) -> None:
        """Wrap ``guard``."""
        self.guard = guard
        self.restore_on_stop = bool(restore_on_stop)
        self.set_beta = set_beta
        self.checkpoint = checkpoint
        self.sync = RankSync() if sync is None else sync
        self.onset: int | None = None
        self.rollbacks: list[dict[str, int]] = []
        self.last_decision: Decision | None = None

    def healthy(self) -> bool:
        """Whether the latest verdict was OK and training was not stopped (a checkpoint saved now is safe)."""
        decision = self.last_decision
        return not self.guard.stopped and (decision is None or decision.verdict == "OK")

    def step(
        self,
        observation: Observation | None,
        *,
        model: Any = None,
        optimizer: Any = None,
        scheduler: Any = None,
        step: int | None = None,
    ) -> Applied:
        """Observe (None: this rank has nothing this step), decide on every rank alike, apply the decision.

        ``step`` (default: the observation's) is the current step, used as the onset of a new episode when
        asking whether a rollback is possible; call this on every rank at every step.
        """
        now = step if step is not None else (observation.step if observation is not None else 0)
        onset = self.onset if self.onset is not None else now
        can_rollback = (
            self.checkpoint is not None and self.checkpoint.last_good(before_step=onset) is not None
        )
        decision = synced_step(self.guard, observation, can_rollback=can_rollback, sync=self.sync)
        if decision is None:
            return Applied("none", None, None, False, None)
        if decision.verdict == "OK":
            self.onset = None
        elif self.onset is None:
            self.onset = decision.step
        applied = apply_decision(
            decision,
            set_beta=self.set_beta,
            checkpoint=self.checkpoint,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            before_step=self.onset,
            sync=self.sync,
        )
        if applied.stop and self.restore_on_stop and self.checkpoint is not None and model is not None:
            before = self.onset if self.onset is not None else decision.step
            # the same answer on every rank (one collective when distributed), then the same restore
            if self.sync.all(self.checkpoint.last_good(before_step=before) is not None):
                restored = apply_decision(
                    attrs.evolve(decision, action="rollback"),
                    checkpoint=self.checkpoint,
                    model=model,
                    optimizer=optimizer,
                    scheduler=scheduler,
                    before_step=before,
                    sync=self.sync,
                ).rolled_back_to
                applied = attrs.evolve(applied, rolled_back_to=restored)
            self.last_decision = decision
            return applied
        if applied.rolled_back_to is not None:
            self.rollbacks.append({"step": int(decision.step), "restored_step": applied.rolled_back_to})
            self.onset = None
        self.last_decision = decision
        return applied

    def state_dict(self) -> dict[str, Any]:
        """The Guard's state, the onset and the rollbacks, as plain JSON."""
        return {
            "kind": _STATE_KIND,
            "version": 1,
            "guard": self.guard.state_dict(),
            "onset": self.onset,
            "rollbacks": [dict(entry) for entry in self.rollbacks],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (and write the Guard's beta through the setter): all or nothing.

        Raises:
            StateError: not a LoopGuard state of this version, unknown or missing keys, a bad value, or a
                Guard state that does not fit this Guard. Nothing is changed then.
        """
        fields = open_state(state, kind=_STATE_KIND, version=1, keys=_STATE_KEYS, owner="LoopGuard")
        guard = self.guard.decode_state(fields.raw("guard"))
        onset = fields.integer("onset", lo=0, optional=True)
        rollbacks = decode_rollbacks(fields)
        self.guard.load_state_dict(guard)
        self.onset, self.rollbacks = onset, rollbacks
        if self.set_beta is not None and self.guard.beta is not None and self.guard.mode != "log_only":
            self.set_beta(float(self.guard.beta))
