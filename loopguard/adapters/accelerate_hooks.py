"""Raw Accelerate loops: loopguard's state in ``Accelerator.save_state`` / ``load_state`` as JSON; reductions.

``Accelerator.register_for_checkpointing`` pickles custom objects (and loads them with
``weights_only=False``); loopguard's state is plain JSON, so :func:`register_state` uses Accelerate's save and
load *pre-hooks* instead: ``save_state(dir)`` writes ``dir/loopguard_state.json`` (the main process only,
atomically) and ``load_state(dir)`` reads it on every rank and hands it to the object's
``load_state_dict``. Nothing is ever unpickled.

The reductions are :class:`~loopguard.adapters._distributed.RankSync` over the process group Accelerate
initialised (``torch.distributed``'s default group): :func:`rank_sync` returns one, and
:class:`~loopguard.adapters.loop.LoopGuard` uses it to give every rank the same decision.

Usage (``examples/accelerate_loop.py`` is a complete loop)::

    accelerator = Accelerator()
    loop = LoopGuard(Guard(...), set_beta=..., checkpoint=manager, sync=rank_sync(accelerator))
    register_state(accelerator, loop)
    ...
    accelerator.save_state(folder)  # writes folder/loopguard_state.json (main process)
    accelerator.load_state(folder)  # every rank: loop.load_state_dict(...)

Example:
    >>> rank_sync(None).active  # a single process: no collective is ever issued
    False
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Protocol

from loopguard._saved_state import read_state_file, write_state_file
from loopguard.adapters._distributed import RankSync
from loopguard.exceptions import LoopguardTypeError, StateError

__all__ = ["STATE_FILE", "JSONStateful", "rank_sync", "read_state", "register_state"]

STATE_FILE = "loopguard_state.json"


class JSONStateful(Protocol):
    """An object whose state is plain JSON (LoopGuard, RewardHackMitigator, Guard)."""

    def state_dict(self) -> dict[str, Any]:
        """The state as JSON types."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""


def rank_sync(accelerator: Any) -> RankSync:
    """The reductions for ``accelerator``'s processes (no collective when it runs a single process).

    Accelerate initialises ``torch.distributed``'s default process group for multi-process runs, which is
    the group :class:`RankSync` uses.
    """
    del accelerator  # the default process group is the accelerator's
    return RankSync()


def read_state(folder: str | os.PathLike[str], filename: str = STATE_FILE) -> dict[str, Any]:
    """The JSON state :func:`register_state` wrote into an Accelerate checkpoint folder.

    Raises:
        FileNotFoundError: the folder has no loopguard state.
        StateError: the file is not a regular file, not strict JSON (``NaN`` included) or not a JSON object.
    """
    path = os.path.join(os.fspath(folder), filename)
    payload = read_state_file(path)
    if not isinstance(payload, dict):
        msg = f"{path} must hold a JSON object, got {type(payload).__name__}."
        raise StateError(msg)
    return payload


def register_state(accelerator: Any, obj: JSONStateful, *, filename: str = STATE_FILE) -> tuple[Any, Any]:
    """Save ``obj.state_dict()`` with ``accelerator.save_state`` and load it with ``load_state``, as JSON.

    Args:
        accelerator: An ``accelerate.Accelerator``.
        obj: Anything with JSON ``state_dict()`` / ``load_state_dict(state)``.
        filename: The file name inside the checkpoint folder.

    Returns:
        The two hook handles (save, load); ``handle.remove()`` unregisters.

    Raises:
        LoopguardTypeError: ``obj`` has no ``state_dict`` / ``load_state_dict``, or ``filename`` is a path.
    """
    if not callable(getattr(obj, "state_dict", None)) or not callable(getattr(obj, "load_state_dict", None)):
        msg = f"`obj` must have state_dict() and load_state_dict(), got {type(obj).__name__}."
        raise LoopguardTypeError(msg)
    if not isinstance(filename, str) or os.path.basename(filename) != filename or filename in ("", ".", ".."):
        msg = f"`filename` must be a plain file name, got {filename!r}."
        raise LoopguardTypeError(msg)

    def save_hook(models: Any, weights: Any, output_dir: str) -> None:
        if not accelerator.is_main_process:
            return
        os.makedirs(output_dir, exist_ok=True)
        write_state_file(os.path.join(output_dir, filename), obj.state_dict())

    def load_hook(models: Any, input_dir: str) -> None:
        path = os.path.join(input_dir, filename)
        if not os.path.lexists(path):
            warnings.warn(
                f"loopguard: {path} not found; the loopguard state starts fresh.",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        obj.load_state_dict(read_state(input_dir, filename))

    return (
        accelerator.register_save_state_pre_hook(save_hook),
        accelerator.register_load_state_pre_hook(load_hook),
    )
