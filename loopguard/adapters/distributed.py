"""One decision on every rank: the rank-synchronisation helpers behind every adapter, for your own loops.

:class:`~loopguard.adapters.LoopGuard`, ``RewardHackMitigator`` and ``GuardedKLController`` already use
these; reach for them when you write an adapter of your own or need a collective loopguard-style (no
pickle, nothing at all in a single process). ``docs/distributed.md`` describes the protocol,
``docs/loops.md`` how a raw loop uses it.

* :class:`RankSync` -- the few collectives loopguard needs (``reduce``, ``any``, ``all``, ``barrier``,
  ``broadcast_json``) over ``torch.distributed``'s default group or a group you pass; plain local
  computations, with no collective and without importing torch, when no multi-process group is initialised.
* :func:`synced_step` -- step a Guard so that every rank gets the same decision and the same Guard state
  (the most severe rank wins; its state and decision are broadcast as JSON).
* :func:`synced_restore` -- run a checkpoint restore on every rank behind barriers (the other ranks load
  first, then the main process loads and discards the newer checkpoints).
* :func:`severity` -- the order ``synced_step`` reduces decisions by (verdict, then action, then vote);
  :func:`decision_from_dict` -- a :class:`~loopguard.Decision` back from ``Decision.to_dict()``.

Example:
    >>> from loopguard import Guard, Observation
    >>> sync = RankSync()  # no process group here: everything is local
    >>> decision = synced_step(
    ...     Guard(mode="log_only", warmup_steps=3), Observation(0, [1.0, 0.0]), can_rollback=False, sync=sync
    ... )
    >>> decision.action, sync.active, sync.world_size, sync.collectives
    ('none', False, 1, 0)
"""

from __future__ import annotations

from loopguard.adapters._distributed import (
    RankSync,
    decision_from_dict,
    severity,
    synced_restore,
    synced_step,
)

__all__ = ["RankSync", "decision_from_dict", "severity", "synced_restore", "synced_step"]
