"""Where rollbacks happen: rollback checkpoints on a CheckpointManager, and the restore.

Policy (documented in ``docs/trl.md``):

* **Scope.** A store belongs to one run (:mod:`loopguard.adapters._run_scope`): at the start of each
  training session it is claimed for the run's identity (a store holding another run's checkpoints is
  refused), and after ``resume_from_checkpoint`` from step ``s`` the run's checkpoints saved after ``s`` (an
  abandoned timeline) are discarded, so steps are saved again from ``s`` on and a rollback never lands on
  the abandoned timeline.
* **Saving.** Every ``every`` optimizer steps, on the main process, and only while the Guard's latest
  verdict is OK: the policy, the optimizer, the LR scheduler, the RNG states, the reference model when TRL
  keeps it in sync with the policy (``sync_ref_model=True``; a fixed reference needs no copy), and the
  mitigator's state as ``extra_state``.
* **Good marks.** A checkpoint is *pending* until the next save boundary and marked good only if every Guard
  verdict in between was OK (a confirmation window: the hack may have begun before it was detected). Without a
  mitigator to confirm, a checkpoint is good when saved.
* **Restoring.** The newest good checkpoint saved strictly before the hack's onset (the first non-OK verdict
  of the current episode): weights, optimizer, the synced reference model, and the LR scheduler only when
  asked (by default the LR stays on the global-step schedule). RNG streams are not rewound (that would replay
  the draws that led into the hack). Newer checkpoints are discarded (main process). ``global_step`` does not
  rewind: transformers' loop cannot go back, so the step counter, the dataloader and ``max_steps`` keep going.
  GRPO / RLOO's buffered generations are dropped so the next batch comes from the restored policy.

Example:
    >>> import torch
    >>> from loopguard.checkpoint import CheckpointManager
    >>> store = RollbackStore(CheckpointManager(in_memory=True), every=2, confirm=True)
    >>> store.can_rollback(before_step=10)
    False
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from loopguard._validation import check_path, describe
from loopguard.exceptions import LoopguardTypeError

__all__ = ["RollbackStore", "open_manager", "synced_reference"]


def synced_reference(trainer: Any, args: Any) -> Any:
    """The reference model when TRL keeps it in sync with the policy (it then drifts and must be saved)."""
    if getattr(args, "sync_ref_model", False):
        return getattr(trainer, "ref_model", None)
    return None


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


class RollbackStore:
    """Rollback checkpoints on a CheckpointManager (see the module docs for the policy).

    Args:
        manager: The :class:`~loopguard.checkpoint.CheckpointManager`.
        every: Optimizer steps between saves.
        confirm: Mark a checkpoint good only after a healthy confirmation window (True when a mitigator
            reports verdicts), else as soon as it is saved.
    """

    def __init__(self, manager: Any, every: int, *, confirm: bool) -> None:
        """Wrap ``manager``."""
        self.manager = manager
        self.every = every
        self.confirm = confirm
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

    def observe(self, verdict: str) -> None:
        """Feed one Guard verdict: a non-OK verdict disqualifies the pending checkpoint."""
        if verdict != "OK":
            self.pending = None

    def can_rollback(self, before_step: int) -> bool:
        """Whether a good checkpoint saved strictly before ``before_step`` exists."""
        return self.manager.last_good(before_step=before_step) is not None

    def save(
        self,
        trainer: Any,
        args: Any,
        state: Any,
        healthy: bool,
        extra_state: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """At a save boundary: confirm the pending checkpoint, then save this step's if ``healthy``.

        ``extra_state`` is called only when a checkpoint is written.
        """
        step = int(state.global_step)
        if step % self.every:
            return
        main = bool(state.is_world_process_zero)
        if self.pending is not None and main:
            self.manager.mark_good(self.pending)
        self.pending = None
        if not healthy or not main:
            return
        self.manager.save(
            step,
            trainer.model,
            trainer.optimizer,
            trainer.lr_scheduler,
            ref_model=synced_reference(trainer, args),
            rng=True,
            extra_state=None if extra_state is None else extra_state(),
        )
        if self.confirm:
            self.pending = step
        else:
            self.manager.mark_good(step)

    def rollback(
        self,
        trainer: Any,
        args: Any,
        state: Any,
        *,
        before_step: int,
        restore_scheduler: bool,
        discard_newer: bool | None = None,
    ) -> int:
        """Restore the newest good checkpoint before ``before_step`` into the trainer; returns its step.

        ``discard_newer`` defaults to "on the main process" (see ``synced_restore`` for multi-rank order).
        """
        restored = self.manager.restore(
            "last_good",
            trainer.model,
            trainer.optimizer,
            trainer.lr_scheduler if restore_scheduler else None,
            ref_model=synced_reference(trainer, args),
            rng=False,
            before_step=before_step,
            discard_newer=bool(state.is_world_process_zero) if discard_newer is None else discard_newer,
        )
        self.pending = None
        if hasattr(trainer, "_buffered_inputs"):
            trainer._buffered_inputs = None  # the next batch is generated by the restored policy
        return int(restored.step)
