"""Hand-written PPO / GRPO / REINFORCE loops: step the Guard, then apply its decision in one call.

A raw loop owns its KL coefficient, its model and its optimizer, so loopguard cannot reach into them the way
the trainer callbacks do. Two pieces cover it:

* :func:`apply_decision` -- apply one :class:`~loopguard.guard.Decision`: write ``beta_after`` through a
  setter, restore the newest good checkpoint saved before the hack's onset through a
  :class:`~loopguard.checkpoint.CheckpointManager` on a rollback (on every rank, behind barriers, when
  ``torch.distributed`` is initialised), and report a stop flag the loop obeys.
* :class:`LoopGuard` -- a Guard bound to the loop's setter and checkpoint store: it asks the store whether a
  rollback is possible, keeps every rank's decision identical (see :mod:`loopguard.adapters.distributed`),
  applies the decision and, with ``checkpoint_every``, saves rollback checkpoints that the Guard confirms good
  after a healthy window: the same store and the same guarantees as a TRL run
  (:mod:`loopguard.adapters._rollback`). Every decision (the onset, when a save is safe, which checkpoint is
  good, what to restore) is the Guard's; this module only carries it out.

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

from loopguard._saved_state import decode_rollbacks, open_versioned_state
from loopguard._validation import check_bool, check_int
from loopguard.adapters._distributed import RankSync, synced_restore, synced_step
from loopguard.adapters._respond import ReferenceAdapter, reanchor
from loopguard.adapters._rollback import Parts, RollbackStore, require_shared, restore_good
from loopguard.exceptions import ConfigError

if TYPE_CHECKING:
    from loopguard.guard import Decision, Guard, Observation

__all__ = ["Applied", "LoopGuard", "ReferenceAdapter", "apply_decision"]

_STATE_KIND = "loopguard.LoopGuard"
_STATE_VERSION = 2
_STATE_KEYS = ("kind", "version", "guard", "rollbacks")
_STATE_KEYS_V1 = ("kind", "version", "guard", "onset", "rollbacks")  # the onset now lives in the Guard


@attrs.frozen
class Applied:
    """What :func:`apply_decision` did.

    Attributes:
        action: The decision's action (``"none"`` when there was no decision this step).
        beta: The coefficient written through the setter (None when nothing was written).
        rolled_back_to: The checkpoint step restored (None when there was no rollback).
        stop: Whether the loop must stop now.
        decision: The decision applied (None when no rank observed anything this step).
        reanchored: Whether the KL reference model now holds the restored policy (a rollback with
            ``decision.reanchor`` and a reference model given).
    """

    action: str
    beta: float | None
    rolled_back_to: int | None
    stop: bool
    decision: Decision | None = None
    reanchored: bool = False


def apply_decision(
    decision: Decision,
    *,
    set_beta: Callable[[float], Any] | None = None,
    checkpoint: Any = None,
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    ref_model: Any = None,
    before_step: int | None = None,
    sync: RankSync | None = None,
    reference: Any = None,
) -> Applied:
    """Apply one Guard decision to a hand-written loop.

    The ladder's targeted penalty is not applied here: subtract ``guard.penalty(completion_ids)`` (when not
    None) from the rewards the loop trains on, and keep giving the Guard the raw rewards.

    Args:
        decision: From ``Guard.step`` (identical on every rank when it came from :class:`LoopGuard`).
        set_beta: Called with ``decision.beta_after`` when the Guard has a coefficient (log-only Guards
            without one never call it).
        checkpoint: A :class:`~loopguard.checkpoint.CheckpointManager`; needed for a rollback.
        model: Receives the restored weights on a rollback.
        optimizer: Receives the restored optimizer state, if given.
        scheduler: Receives the restored scheduler state, if given.
        ref_model: Receives the restored reference model, if it drifts with the policy and was saved.
        before_step: The checkpoint restored is the newest good one saved strictly before it (default: the
            Guard's ``decision.restore_before``, the hack's onset).
        sync: Rank synchronisation (default: a :class:`RankSync`, which does nothing in a single process).
            Newer checkpoints are discarded by rank 0 only.
        reference: The KL reference model the loop measures its KL against: on a rollback with
            ``decision.reanchor`` (the ladder's default) its weights become the restored policy's, so a
            raised beta holds the policy near a good one. Default: ``ref_model`` (if given). For a PEFT LoRA
            policy whose reference is the base model, a :class:`~loopguard.adapters.loop.ReferenceAdapter`
            of the policy: the restored adapter is copied into its reference adapter.

    Returns:
        An :class:`Applied`; the loop stops when ``stop`` is True.

    Raises:
        ConfigError: a rollback without ``checkpoint`` and ``model``.

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
            msg = (
                "a rollback needs `checkpoint` (a CheckpointManager) and `model`, got "
                f"checkpoint={checkpoint!r} and model={'None' if model is None else type(model).__name__}."
            )
            raise ConfigError(msg)
        before = before_step if before_step is not None else _restore_before(decision)
        parts = Parts(model, optimizer, scheduler, ref_model)
        restored = synced_restore(
            sync,
            lambda discard: restore_good(checkpoint, parts, before_step=before, discard_newer=discard),
            main=sync.is_main,
            collective=parts.sharded,
        )
    anchored = False
    if restored is not None and decision.reanchor:
        anchored = reanchor(model, reference if reference is not None else ref_model)
    return Applied(decision.action, beta, restored, decision.action == "stop", decision, anchored)


def _restore_before(decision: Decision) -> int:
    return decision.restore_before if decision.restore_before is not None else decision.step


class LoopGuard:
    """A :class:`~loopguard.guard.Guard` for a hand-written loop: decide (the same on every rank) and apply.

    Args:
        guard: The Guard (its ladder decides rollbacks and stops; it keeps the checkpoint ledger).
        set_beta: Writes the KL coefficient the loop uses.
        checkpoint: A :class:`~loopguard.checkpoint.CheckpointManager` holding the loop's checkpoints (needed
            for rollbacks).
        checkpoint_every: Save a rollback checkpoint every this many steps from :meth:`step` (given
            ``model=``), only while the Guard says the run is healthy, and mark it good once the Guard
            confirms it (the next save boundary after a window of OK verdicts). None (default): the loop
            saves on its own (:meth:`healthy` says when a save is safe; mark a checkpoint of step ``s`` good
            at the next save boundary if ``guard.confirms(s)``).
        restore_on_stop: On a stop, also restore the newest good checkpoint saved before the hack's onset
            (when one exists on every rank and ``model`` is given), so the loop ends with healthy weights.
        sync: Rank synchronisation (default: :class:`RankSync` over the default process group; nothing
            happens in a single process).

    Attributes:
        rollbacks: ``{"step", "restored_step"}`` for each rollback.
        last_decision: The latest decision.

    Raises:
        ConfigError, LoopguardTypeError: ``checkpoint_every`` not an integer >= 1, or without ``checkpoint``;
            an in-memory ``checkpoint`` when several processes train (each would hold its own store).
    """

    def __init__(
        self,
        guard: Guard,
        *,
        set_beta: Callable[[float], Any] | None = None,
        checkpoint: Any = None,
        checkpoint_every: int | None = None,
        restore_on_stop: bool = True,
        sync: RankSync | None = None,
    ) -> None:
        """Wrap ``guard``."""
        self.guard = guard
        self.restore_on_stop = check_bool("restore_on_stop", restore_on_stop)
        self.set_beta = set_beta
        self.checkpoint = checkpoint
        self.sync = RankSync() if sync is None else sync
        if checkpoint is not None:
            require_shared(checkpoint, self.sync.world_size)
        self._store: RollbackStore | None = None
        if checkpoint_every is not None:
            every = check_int("checkpoint_every", checkpoint_every, lo=1)
            if checkpoint is None:
                msg = f"`checkpoint` must be a CheckpointManager when checkpoint_every={every}, got None."
                raise ConfigError(msg)
            self._store = RollbackStore(checkpoint, every, guard=guard)
        self.rollbacks: list[dict[str, int]] = []
        self.last_decision: Decision | None = None

    def save_start(
        self, model: Any, *, optimizer: Any = None, scheduler: Any = None, ref_model: Any = None
    ) -> None:
        """Keep the policy training starts from as the good checkpoint of step 0 (call before training).

        It is the rollback target of a flaw that pays from the first step, before any later checkpoint can
        be confirmed good. Needs ``checkpoint_every`` (the store); the main process writes.

        Raises:
            ConfigError: no store (``checkpoint_every`` was not given).
        """
        if self._store is None:
            msg = "`save_start` needs the rollback store: give LoopGuard checkpoint= and checkpoint_every=."
            raise ConfigError(msg)
        parts = Parts(model, optimizer, scheduler, ref_model)
        self._store.save_initial(parts, main=self.sync.is_main, extra_state=self.state_dict)

    @property
    def onset(self) -> int | None:
        """The step of the first non-OK verdict of the current episode (None when healthy): the Guard's."""
        return self.guard.onset

    def healthy(self) -> bool:
        """Whether the latest verdict was OK and training was not stopped (a checkpoint saved now is safe)."""
        return self.guard.healthy

    def step(
        self,
        observation: Observation | None,
        *,
        model: Any = None,
        optimizer: Any = None,
        scheduler: Any = None,
        ref_model: Any = None,
        step: int | None = None,
        reference: Any = None,
    ) -> Applied:
        """Observe (None: this rank has nothing this step), decide on every rank alike, apply the decision.

        ``step`` (default: the observation's) is the current step: where a new episode would begin when
        asking whether a rollback is possible, and the step a checkpoint is saved as. Call this on every
        rank at every step, after the optimizer step; ``model`` (and the optimizer, scheduler and a drifting
        reference model) receive a restore and are saved at ``checkpoint_every``. ``reference`` (default:
        ``ref_model``) is the KL reference re-anchored on the restored policy after a rollback (see
        :func:`apply_decision`); subtract ``guard.penalty(completion_ids)`` from the trained rewards once the
        ladder switches the targeted penalty on.
        """
        now = step if step is not None else (observation.step if observation is not None else 0)
        target = self.guard.rollback_target(now)
        manager = self.checkpoint
        can_rollback = manager is not None and manager.last_good(before_step=target) is not None
        decision = synced_step(self.guard, observation, can_rollback=can_rollback, sync=self.sync)
        parts = None if model is None else Parts(model, optimizer, scheduler, ref_model)
        applied = Applied("none", None, None, False, None)
        if decision is not None:
            applied = self._apply(decision, parts, reference)
        if self._store is not None and parts is not None:
            self._store.save(int(now), parts, main=self.sync.is_main, extra_state=self.state_dict)
        return applied

    def _apply(self, decision: Decision, parts: Parts | None, reference: Any = None) -> Applied:
        applied = apply_decision(
            decision,
            set_beta=self.set_beta,
            checkpoint=self.checkpoint,
            model=None if parts is None else parts.model,
            optimizer=None if parts is None else parts.optimizer,
            scheduler=None if parts is None else parts.scheduler,
            ref_model=None if parts is None else parts.ref_model,
            sync=self.sync,
            reference=reference,
        )
        self.last_decision = decision
        if applied.stop:
            if self.restore_on_stop and self.checkpoint is not None and parts is not None:
                applied = attrs.evolve(applied, rolled_back_to=self._restore_at_stop(decision, parts))
        elif applied.rolled_back_to is not None:
            self.rollbacks.append({"step": int(decision.step), "restored_step": applied.rolled_back_to})
        return applied

    def _restore_at_stop(self, decision: Decision, parts: Parts) -> int | None:
        before = _restore_before(decision)
        # the same answer on every rank (one collective when distributed), then the same restore
        if not self.sync.all(self.checkpoint.last_good(before_step=before) is not None):
            return None
        return synced_restore(
            self.sync,
            lambda discard: restore_good(self.checkpoint, parts, before_step=before, discard_newer=discard),
            main=self.sync.is_main,
            collective=parts.sharded,
        )

    def state_dict(self) -> dict[str, Any]:
        """The Guard's state and the rollbacks, as plain JSON."""
        return {
            "kind": _STATE_KIND,
            "version": _STATE_VERSION,
            "guard": self.guard.state_dict(),
            "rollbacks": [dict(entry) for entry in self.rollbacks],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (and write the Guard's beta through the setter): all or nothing.

        A version-1 state (which kept the hack's onset here, not in the Guard) still loads.

        Raises:
            StateError: not a LoopGuard state of a readable version, unknown or missing keys, a bad value, or
                a Guard state that does not fit this Guard. Nothing is changed then.
        """
        versions = {1: _STATE_KEYS_V1, _STATE_VERSION: _STATE_KEYS}
        fields, version = open_versioned_state(state, kind=_STATE_KIND, versions=versions, owner="LoopGuard")
        old = version == 1
        guard = self.guard.decode_state(fields.raw("guard"))
        if old:
            guard.episode.onset = fields.integer("onset", lo=0, optional=True)
            guard.episode.healthy = guard.episode.healthy and guard.episode.onset is None
        rollbacks = decode_rollbacks(fields)
        self.guard.load_state_dict(guard)
        self.rollbacks = rollbacks
        if self.set_beta is not None and self.guard.beta is not None and self.guard.mode != "log_only":
            self.set_beta(float(self.guard.beta))
