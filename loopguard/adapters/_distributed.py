"""One decision on every rank: reductions over torch.distributed that cost nothing in a single process.

A guard that lets ranks disagree (one raises beta, another does not; one rolls back, another keeps training)
silently corrupts a run. :class:`RankSync` wraps the few collectives loopguard needs; every method is a
plain local computation, with **zero** collective calls, when ``torch.distributed`` is not initialised or the
world has one process (torch is not even imported then). When it is initialised, each method issues the same
fixed number of collectives on every rank, so callers only need to call the methods in the same order on
every rank.

:func:`synced_step` is the decision protocol the adapters use (documented in ``docs/distributed.md``):

1. one ``all_reduce(max)`` of ``[has an observation, cannot roll back]``: a rank with nothing to observe still
   takes part, and a rollback is offered to the Guard only when every rank can load the checkpoint;
2. every rank with an observation steps its own Guard on its rank-local data;
3. one ``all_reduce(max)`` of a severity code (verdict, then action, then vote; ties go to the lowest rank):
   the most severe rank wins -- severity by max, the conservative choice for a safety signal;
4. the winner broadcasts its Guard state and decision as JSON (two broadcasts: length, then UTF-8 bytes;
   never pickle) and every other rank loads them, so the Guards stay identical and every rank applies the
   same action and the same beta at the same step.

:func:`synced_restore` runs a rollback on every rank behind barriers: the other ranks load first, then the
main process loads and discards the abandoned newer checkpoints, so no rank reads a checkpoint directory
while another deletes from it.

Example:
    >>> sync = RankSync()  # no process group here: everything is local
    >>> sync.active, sync.rank, sync.world_size, sync.is_main
    (False, 0, 1, True)
    >>> sync.reduce([1.0, 3.0], "mean"), sync.any(False), sync.all(True), sync.collectives
    ([1.0, 3.0], False, True, 0)
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from loopguard._validation import check_choice
from loopguard.exceptions import CheckpointError

if TYPE_CHECKING:
    from loopguard.guard import Decision, Guard, Observation

__all__ = ["RankSync", "decision_from_dict", "severity", "synced_restore", "synced_step"]

Op = Literal["sum", "mean", "max", "min"]
_OPS = ("sum", "mean", "max", "min")
_VERDICT_RANK = {"OK": 0, "WARN": 1, "HACK": 2}
# lowering beta is the least conservative action, stopping the most
_ACTION_RANK = {"lower_beta": 0, "none": 1, "raise_beta": 2, "rollback": 3, "stop": 4}
T = TypeVar("T")


def severity(decision: Decision) -> int:
    """An integer that orders decisions by how conservative they are: verdict, then action, then vote.

    Example:
        >>> from loopguard import Guard, Observation
        >>> decision = Guard(mode="log_only", warmup_steps=3).step(Observation(0, [1.0, 0.0]))
        >>> severity(decision)
        1000
    """
    vote = decision.vote if math.isfinite(decision.vote) else 1.0
    base = _VERDICT_RANK[decision.verdict] * 5 + _ACTION_RANK[decision.action]
    return base * 1000 + round(min(max(vote, 0.0), 1.0) * 999)


def decision_from_dict(payload: Mapping[str, Any]) -> Decision:
    """Rebuild a :class:`~loopguard.guard.Decision` from ``Decision.to_dict()`` (e.g. after a JSON trip).

    Example:
        >>> from loopguard import Guard, Observation
        >>> decision = Guard(mode="log_only", warmup_steps=3).step(Observation(0, [1.0, 0.0]))
        >>> decision_from_dict(json.loads(json.dumps(decision.to_dict()))) == decision
        True
    """
    from loopguard.guard import Decision

    values = dict(payload)
    values["notes"] = tuple(values.get("notes", ()))
    values["errors"] = tuple(values.get("errors", ()))
    return Decision(**values)


class RankSync:
    """The collectives loopguard uses, as no-ops outside an initialised multi-process group.

    Args:
        group: A ``torch.distributed`` process group (None: the default group).

    Attributes:
        collectives: How many collective calls this object issued (0 in a single process).
    """

    def __init__(self, group: Any = None) -> None:
        """Use ``group`` (or the default process group) when one is initialised."""
        self.group = group
        self.collectives = 0

    @staticmethod
    def _dist() -> Any:
        """``torch.distributed`` when it is initialised, else None (without importing torch)."""
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        return dist

    @property
    def active(self) -> bool:
        """Whether collectives are issued: an initialised process group with more than one rank."""
        dist = self._dist()
        return dist is not None and int(dist.get_world_size(self.group)) > 1

    @property
    def rank(self) -> int:
        """This process's rank in the group (0 when not distributed)."""
        dist = self._dist()
        return 0 if dist is None else int(dist.get_rank(self.group))

    @property
    def world_size(self) -> int:
        """The number of ranks (1 when not distributed)."""
        dist = self._dist()
        return 1 if dist is None else int(dist.get_world_size(self.group))

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0."""
        return self.rank == 0

    def _device(self) -> Any:
        import torch

        dist = self._dist()
        if dist is not None and dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def reduce(self, values: Sequence[float], op: Op) -> list[float]:
        """Reduce a vector of floats across ranks (one collective); every rank gets the result.

        ``"mean"`` is the sum divided by the world size. Single process: the values, unchanged.
        """
        op = check_choice("op", op, _OPS)  # type: ignore[assignment]
        out = [float(v) for v in values]
        if not self.active:
            return out
        import torch

        dist = self._dist()
        tensor = torch.tensor(out, dtype=torch.float64, device=self._device())
        kind = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}.get(
            op, dist.ReduceOp.MIN
        )
        dist.all_reduce(tensor, op=kind, group=self.group)
        self.collectives += 1
        if op == "mean":
            tensor = tensor / self.world_size
        return [float(v) for v in tensor.cpu().tolist()]

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is True on any rank (one collective)."""
        return self.reduce([1.0 if flag else 0.0], "max")[0] > 0.5

    def all(self, flag: bool) -> bool:
        """Whether ``flag`` is True on every rank (one collective)."""
        return self.reduce([1.0 if flag else 0.0], "min")[0] > 0.5

    def barrier(self) -> None:
        """Wait for every rank (one collective; nothing in a single process)."""
        if not self.active:
            return
        self._dist().barrier(group=self.group)
        self.collectives += 1

    def broadcast_json(self, payload: Any, src: int) -> Any:
        """Send a JSON-serialisable ``payload`` from rank ``src`` to every rank (two collectives, no pickle).

        Other ranks' ``payload`` is ignored. Single process: ``payload`` through a JSON round trip.
        """
        if not self.active:
            return json.loads(json.dumps(payload, default=float))
        import torch

        dist = self._dist()
        device = self._device()
        data = json.dumps(payload, default=float).encode("utf-8") if self.rank == src else b""
        size = torch.tensor([len(data)], dtype=torch.int64, device=device)
        dist.broadcast(size, src=self._global(src), group=self.group)
        buffer = torch.zeros(int(size.item()), dtype=torch.uint8, device=device)
        if self.rank == src:
            buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        dist.broadcast(buffer, src=self._global(src), group=self.group)
        self.collectives += 2
        return json.loads(buffer.cpu().numpy().tobytes().decode("utf-8"))

    def _global(self, rank: int) -> int:
        if self.group is None:
            return rank
        return int(self._dist().get_global_rank(self.group, rank))


def synced_step(
    guard: Guard, observation: Observation | None, *, can_rollback: bool, sync: RankSync
) -> Decision | None:
    """Step ``guard`` so that every rank gets the same decision and the same Guard state (module docs).

    Single process: ``guard.step(observation, can_rollback=can_rollback)`` (None without an observation),
    with no collective. Distributed: 1 collective when no rank has an observation, else 4, on every rank.

    Returns:
        The decision every rank applies, or None when no rank observed anything this step.
    """
    if not sync.active:
        return None if observation is None else guard.step(observation, can_rollback=can_rollback)
    has_batch, cannot = sync.reduce([observation is not None, not can_rollback], "max")
    if has_batch < 0.5:
        return None
    local = None if observation is None else guard.step(observation, can_rollback=cannot < 0.5)
    world, rank = sync.world_size, sync.rank
    code = -1 if local is None else severity(local) * world + (world - 1 - rank)
    best = int(sync.reduce([float(code)], "max")[0])
    winner = world - 1 - best % world
    mine = (
        None
        if local is None or rank != winner
        else {"guard": guard.state_dict(), "decision": local.to_dict()}
    )
    payload = sync.broadcast_json(mine, src=winner)
    if rank == winner and local is not None:
        return local
    guard.load_state_dict(payload["guard"])
    return decision_from_dict(payload["decision"])


def synced_restore(
    sync: RankSync, restore: Callable[[bool], T], *, main: bool, collective: bool = False
) -> T:
    """Run ``restore(discard_newer)`` on every rank behind barriers (module docs); returns its result.

    Single process: ``restore(main)`` with no collective. Distributed: three collectives on every rank (two
    barriers and a check that every rank succeeded), whatever fails. ``collective=True`` (a sharded policy,
    whose restore every rank runs together and which agrees on failures itself): ``restore(main)`` on every
    rank at once.

    Raises:
        Exception: this rank's restore failed (re-raised).
        CheckpointError: another rank's restore failed.
    """
    if not sync.active or collective:
        return restore(main)
    result: list[T] = []
    failure: BaseException | None = None
    sync.barrier()  # the main process's last save is complete before any rank reads the store
    if not main:
        try:
            result.append(restore(False))
        except Exception as error:
            failure = error
    sync.barrier()  # the other ranks are done reading before the main process discards newer checkpoints
    if main:
        try:
            result.append(restore(True))
        except Exception as error:
            failure = error
    elsewhere = sync.any(failure is not None)
    if failure is not None:
        raise failure
    if elsewhere:
        msg = "the rollback failed on another rank; this rank restored, so the ranks may now differ."
        raise CheckpointError(msg)
    return result[0]
