"""Where rollbacks happen: rollback checkpoints on a CheckpointManager, and the restore.

Policy (documented in ``docs/trl.md``):

* **Scope.** A store belongs to one run (:mod:`loopguard.adapters._run_scope`): at the start of each
  training session it is claimed for the run's identity (a store holding another run's checkpoints is
  refused), and after ``resume_from_checkpoint`` from step ``s`` the run's checkpoints saved after ``s`` (an
  abandoned timeline) are discarded, so steps are saved again from ``s`` on and a rollback never lands on
  the abandoned timeline.
* **Saving.** Every ``every`` steps, on the main process (every rank together for a sharded policy: FSDP2's
  DTensor parameters go through ``torch.distributed.checkpoint``), and only while the Guard says the run is
  healthy (:attr:`~loopguard.Guard.healthy`): the policy, the optimizer, the LR scheduler, the RNG states, the
  reference model when it drifts with the policy (TRL's ``sync_ref_model=True``; a fixed reference needs no
  copy), and the adapter's state as ``extra_state``. A store that only rollbacks can read
  (``resumable=False``: the mitigator's own store in memory, which does not outlive the process) leaves out
  the RNG states and the adapter's state: a rollback restores neither, and copying the adapter's state (every
  detector's reference sample, checked value by value) was most of such a save's cost.
* **Good marks.** A checkpoint is *pending* until the next save boundary and marked good then only if the
  Guard confirms it (:meth:`~loopguard.Guard.confirms`: every verdict since its save was OK, no rollback or
  stop; a confirmation window, since the hack may have begun before it was detected). Without a Guard to
  confirm, a checkpoint is good when saved.
* **Restoring.** The newest good checkpoint saved strictly before the Guard's ``Decision.restore_before``
  (the hack's onset): weights, optimizer, the reference model when it drifts, and the LR scheduler only when
  the adapter passes it. RNG streams are not rewound (that would replay the draws that led into the hack).
  Newer checkpoints are discarded (main process).

The TRL callbacks (:mod:`loopguard.adapters.hf_trainer`) and :class:`~loopguard.adapters.loop.LoopGuard`
both save and restore through this one class, so a hand-written loop gets the guarantees of a TRL run.

Example:
    >>> import torch
    >>> from loopguard.checkpoint import CheckpointManager
    >>> from loopguard import Guard
    >>> store = RollbackStore(CheckpointManager(in_memory=True), every=2, guard=Guard(mode="log_only"))
    >>> store.can_rollback(before_step=10)
    False
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from loopguard._validation import check_path, describe
from loopguard.exceptions import ConfigError, LoopguardTypeError

if TYPE_CHECKING:
    from loopguard.guard import Guard

__all__ = ["Parts", "RollbackStore", "open_manager", "require_shared", "restore_good", "synced_reference"]


def synced_reference(trainer: Any, args: Any) -> Any:
    """The reference model when TRL keeps it in sync with the policy (it then drifts and must be saved)."""
    if getattr(args, "sync_ref_model", False):
        return getattr(trainer, "ref_model", None)
    return None


def require_shared(manager: Any, world_size: int) -> None:
    """Refuse an in-memory store when several processes train: each would hold its own, and only rank 0 saves.

    Raises:
        ConfigError: ``manager`` is in memory and ``world_size > 1`` (no rollback could ever happen).
    """
    if world_size > 1 and bool(getattr(manager, "in_memory", False)):
        msg = (
            f"`checkpoint` is an in-memory CheckpointManager, but {world_size} processes train: each process "
            "would hold a store of its own and only rank 0 saves, so no rank could ever roll back. Give a "
            "directory every rank can read (CheckpointManager(path), or checkpoint='path')."
        )
        raise ConfigError(msg)


def open_manager(checkpoint: Any, *, keep_last: int = 3) -> Any:
    """A CheckpointManager from a manager (returned as is) or a directory path.

    Raises:
        LoopguardTypeError: anything else.
        MissingDependencyError: torch / safetensors are not installed.
    """
    from loopguard.checkpoint import CheckpointManager

    if isinstance(checkpoint, CheckpointManager):
        return checkpoint
    if isinstance(checkpoint, (str, os.PathLike)):
        return CheckpointManager(check_path("checkpoint", checkpoint), keep_last=keep_last)
    msg = f"`checkpoint` must be a CheckpointManager or a directory path, got {describe(checkpoint)}."
    raise LoopguardTypeError(msg)


@attrs.frozen
class Parts:
    """What a checkpoint holds and a rollback restores: the policy and, when given, its training state.

    Attributes:
        model: The policy (a ``torch.nn.Module``).
        optimizer: Its optimizer, or None.
        scheduler: Its LR scheduler, or None (on a rollback: None keeps the LR on its schedule).
        ref_model: The KL reference model when it drifts with the policy (saved and restored), else None.
    """

    model: Any
    optimizer: Any = None
    scheduler: Any = None
    ref_model: Any = None

    def check(self) -> None:
        """Refuse, on every rank alike, a policy no checkpoint can hold (FSDP1; ZeRO-3 without its engine).

        Raises:
            ConfigError: as ``CheckpointManager.save`` would on the main process alone (the other ranks would
                then wait for it in their next collective).
        """
        from loopguard.checkpoint._manager import refuse_unsaveable

        refuse_unsaveable(self.model)

    @property
    def sharded(self) -> bool:
        """Whether the policy is sharded (FSDP2's DTensors, a DeepSpeed engine): every rank saves it."""
        from loopguard.checkpoint._sharded import engine_of

        return engine_of(self.model) is not None


class RollbackStore:
    """Rollback checkpoints on a CheckpointManager, confirmed by a Guard (see the module docs for the policy).

    Args:
        manager: The :class:`~loopguard.checkpoint.CheckpointManager`.
        every: Steps between saves.
        guard: The Guard whose verdicts say when a save is safe and which checkpoint is confirmed good; None
            marks every checkpoint good when it is saved (nothing watches the run).
        resumable: Also save what only a resume reads: the RNG states and the adapter's state
            (``extra_state``). Default True; False for a store nothing but this store's rollbacks reads.
    """

    def __init__(self, manager: Any, every: int, *, guard: Guard | None, resumable: bool = True) -> None:
        """Wrap ``manager``."""
        self.manager = manager
        self.every = every
        self.guard = guard
        self.resumable = resumable
        self.pending: int | None = None
        self.run: Any = None

    def start(self, run: Any, *, main: bool) -> list[int]:
        """Scope the store to ``run`` (a :class:`~loopguard.adapters._run_scope.Run`) for a training session.

        Claims the store for the run's identity (the main process writes the claim) and, after a resume from
        step ``s``, discards the run's checkpoints newer than ``s`` (main process). Idempotent per session.

        Returns:
            The steps discarded (empty on a fresh start and on other ranks).

        Raises:
            ConfigError: the store holds another run's checkpoints (see ``CheckpointManager.claim``).
            CheckpointError: the store's index or claim cannot be read.
        """
        if self.run is run:
            return []
        self.manager.claim(run.id, create=main)
        self.manager.good_steps()  # an unreadable index (good.json) fails here, at the start, not mid-run
        discarded: list[int] = []
        if run.resumed_from is not None and main:
            discarded = self.manager.discard_after(run.resumed_from)
        self.pending = None
        self.run = run
        return discarded

    def can_rollback(self, before_step: int) -> bool:
        """Whether a good checkpoint saved strictly before ``before_step`` exists."""
        return self.manager.last_good(before_step=before_step) is not None

    def due(self, step: int) -> bool:
        """Whether ``step`` is a save boundary (every ``every`` steps): only then does :meth:`save` act."""
        return step % self.every == 0

    def save(
        self,
        step: int,
        parts: Parts,
        *,
        main: bool,
        extra_state: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """At a save boundary: mark the checkpoint the Guard confirms good, then save this step's if healthy.

        Call it on every rank at every step (the main process writes); ``extra_state`` is called only when a
        checkpoint is written, and never by a store that is not ``resumable``.
        """
        if not self.due(step):
            return
        parts.check()
        pending, self.pending = self.pending, None
        if pending is not None and main and (self.guard is None or self.guard.confirms(pending)):
            self.manager.mark_good(pending)
        if (self.guard is not None and not self.guard.healthy) or not (main or parts.sharded):
            return
        self._write(step, parts, extra_state)
        if self.guard is None:
            self.manager.mark_good(step)
        else:
            self.pending = step

    def save_initial(
        self, parts: Parts, *, main: bool, extra_state: Callable[[], dict[str, Any]] | None = None
    ) -> None:
        """Save the policy training starts from as step 0, marked good at once (main process writes).

        The starting policy is the reference the run is measured against, not a product of the reward being
        watched, so it needs no confirmation window: it is the rollback target of a flaw that pays from the
        first step. Skipped when the store already holds a step-0 checkpoint.
        """
        parts.check()
        if not (main or parts.sharded) or 0 in self.manager.steps():
            return
        self._write(0, parts, extra_state)
        if main:
            self.manager.mark_good(0)

    def _write(self, step: int, parts: Parts, extra_state: Callable[[], dict[str, Any]] | None) -> None:
        """Save ``parts`` (the main process; every rank together for a sharded policy)."""
        self.manager.save(
            step,
            parts.model,
            parts.optimizer,
            parts.scheduler,
            ref_model=parts.ref_model,
            rng=self.resumable,
            extra_state=None if extra_state is None or not self.resumable else extra_state(),
        )

    def rollback(self, parts: Parts, *, before_step: int, discard_newer: bool) -> int:
        """Restore the newest good checkpoint saved before ``before_step`` into ``parts``; its step."""
        self.pending = None
        return restore_good(self.manager, parts, before_step=before_step, discard_newer=discard_newer)


def restore_good(manager: Any, parts: Parts, *, before_step: int, discard_newer: bool) -> int:
    """Restore the newest good checkpoint of ``manager`` saved strictly before ``before_step``; its step.

    RNG streams are not rewound (that would replay the draws that led into the hack).
    """
    restored = manager.restore(
        "last_good",
        parts.model,
        parts.optimizer,
        parts.scheduler,
        ref_model=parts.ref_model,
        rng=False,
        before_step=before_step,
        discard_newer=discard_newer,
    )
    return int(restored.step)
