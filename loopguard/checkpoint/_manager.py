"""CheckpointManager: atomic, verified, rollback-oriented checkpoints of an RL training run.

On disk a store is one directory::

    <directory>/
      step-00000100/            one complete checkpoint per step (8+ digit, zero-padded)
        manifest.json           written last: step, files with SHA-256 and size, versions, contents
        model.safetensors       full state_dict, or only the PEFT adapter weights
        optimizer.pt            torch.save(optimizer.state_dict()), loaded with weights_only=True
        scheduler.pt            torch.save(scheduler.state_dict()), loaded with weights_only=True
        rng.json                python `random` and numpy global generator states
        rng.safetensors         torch CPU generator state and one state per CUDA device
        ref_model.safetensors   the reference model (when passed)
        rollout_buffer.safetensors, rollout_buffer.json   the rollout buffer's tensors and JSON values
        extra_state.json        e.g. Guard.state_dict()
      good.json                 which steps are marked good (replaced atomically)
      .lock                     lock file serialising writers of this store (filelock, flock)
      .tmp-step-...-<hex>/      a save in progress (or one that died); never listed, removed on next use
      .del-step-...-<hex>/      a pruned checkpoint being deleted; never listed, removed on next use

A save writes everything into a ``.tmp-`` sibling, ``fsync``-s each file and the directory, renames it to
``step-N`` in one atomic ``rename`` and ``fsync``-s the parent. A directory named ``step-N`` therefore
always holds a complete checkpoint, whatever moment the process was killed at.

Hand-written because the Trainer's, Accelerate's and ``torch.distributed.checkpoint``'s checkpoints neither
verify every byte before loading nor keep which steps are rollback targets.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import numbers
import os
import platform
import re
import stat
import sys
import warnings
from collections.abc import Callable, Collection, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import IO, Any, Literal, cast

import attrs
import numpy as np
import safetensors
import safetensors.torch
import torch

from loopguard._run import RUN_ID_PATTERN, check_run_id
from loopguard._saved_state import replace_durably
from loopguard._validation import check_bool, check_choice, check_int, check_path, describe
from loopguard.checkpoint import _sharded
from loopguard.checkpoint._io import (
    CheckpointError,
    disk_error,
    entry_kind,
    load_json,
    locked,
    open_child_dir,
    open_root,
    random_suffix,
    read_small,
    read_verified,
    remove_tree,
    write_file,
    write_safetensors,
    write_small_atomic,
)
from loopguard.checkpoint._state import (
    ModuleState,
    RngState,
    RolloutState,
    Snapshot,
    Stateful,
    TorchState,
    _check_optimizer,
    _check_scheduler,
    apply_snapshot,
    capture_module,
    check_json,
    check_torch_state,
    clone_tree,
    json_copy,
    unwrapped_class,
)
from loopguard.exceptions import ConfigError, LoopguardTypeError

__all__ = ["FORMAT_VERSION", "CheckpointManager", "RestoredCheckpoint", "refuse_unsaveable", "steps_to_keep"]

FORMAT = "loopguard-checkpoint"
FORMAT_VERSION = 1
INDEX_FORMAT = "loopguard-good-index"
MANIFEST = "manifest.json"
INDEX = "good.json"
RUN_INDEX = "run.json"
RUN_FORMAT = "loopguard-store-run"
MAX_STEP = 10**15
MAX_MANIFEST_BYTES = 16 * 2**20
MAX_JSON_FILE_BYTES = 256 * 2**20

_POSIX = os.name == "posix" and {os.open, os.stat, os.rename, os.mkdir, os.unlink} <= os.supports_dir_fd
_STEP = re.compile(r"step-(\d{8,})")
_TEMP = re.compile(r"\.tmp-step-\d{8,}-[0-9a-f]{16}")
_DELETING = re.compile(r"\.del-step-\d{8,}-[0-9a-f]{16}")
_TEMP_INDEX = re.compile(r"\.tmp-(?:good|run)-[0-9a-f]{16}")
_SHA256 = re.compile(r"[0-9a-f]{64}")

# Which files each part of a checkpoint occupies; a manifest may list no other names.
_PART_FILES: dict[str, tuple[str, ...]] = {
    "model": ("model.safetensors",),
    "ref_model": ("ref_model.safetensors",),
    "optimizer": ("optimizer.pt",),
    "scheduler": ("scheduler.pt",),
    "rng": ("rng.json", "rng.safetensors"),
    "rollout_buffer": ("rollout_buffer.safetensors", "rollout_buffer.json"),
    "extra_state": ("extra_state.json",),
}
_FILES = frozenset(name for names in _PART_FILES.values() for name in names)

StepSpec = int | Literal["last_good", "latest"]


def _check_step(name: str, value: object) -> int:
    step = check_int(name, value, lo=0)
    if step > MAX_STEP:
        msg = f"`{name}` must be at most {MAX_STEP:,}, got {step:,}."
        raise ConfigError(msg)
    return step


def _step_name(step: int) -> str:
    return f"step-{step:08d}"


def _parse_step_name(name: str) -> int | None:
    match = _STEP.fullmatch(name)
    if match is None:
        return None
    step = int(match.group(1))
    return step if _step_name(step) == name else None


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _versions() -> dict[str, str]:
    try:
        loopguard_version = version("loopguard")
    except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
        loopguard_version = "0.0.0+unknown"
    versions = {
        "loopguard": loopguard_version,
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "safetensors": str(safetensors.__version__),
        "numpy": str(np.__version__),
    }
    for name in ("transformers", "peft", "trl", "accelerate"):
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = str(getattr(module, "__version__", "unknown"))
    return versions


def _dumps(value: Any, *, indent: int | None = None) -> bytes:
    return json.dumps(value, allow_nan=False, ensure_ascii=True, indent=indent).encode("ascii")


def _show_steps(steps: Collection[int]) -> str:
    ordered = sorted(steps)
    if not ordered:
        return "none"
    if len(ordered) > 8:
        return ", ".join(str(step) for step in ordered[:3]) + ", ..., " + ", ".join(map(str, ordered[-3:]))
    return ", ".join(str(step) for step in ordered)


def steps_to_keep(steps: Collection[int], good: Collection[int], keep_last: int | None) -> set[int]:
    """The checkpoints pruning keeps: the ``keep_last`` newest, plus the newest good one older than them.

    This keeps every rollback target that is still reachable: for any onset step ``t`` after the oldest of
    the ``keep_last`` newest checkpoints, ``last_good(before_step=t)`` returns exactly what it would with
    nothing pruned, and the newest good checkpoint is never deleted. ``keep_last=None`` keeps everything.

    Example:
        >>> sorted(steps_to_keep([10, 20, 30, 40, 50], good=[10, 20], keep_last=2))
        [20, 40, 50]
        >>> sorted(steps_to_keep([10, 20, 30, 40, 50], good=[10, 40], keep_last=2))
        [10, 40, 50]
    """
    ordered = sorted(set(steps))
    if keep_last is None or len(ordered) <= keep_last:
        return set(ordered)
    newest = ordered[-keep_last:]
    keep = set(newest)
    older_good = [step for step in good if step < newest[0] and step in keep.union(ordered)]
    if older_good:
        keep.add(max(older_good))
    return keep


@attrs.frozen(eq=False)
class RestoredCheckpoint:
    """What :meth:`CheckpointManager.restore` loaded.

    Attributes:
        step: The step of the restored checkpoint.
        path: Its directory, or ``None`` for an in-memory manager.
        good: Whether it is marked good.
        created: When it was saved (UTC, ISO 8601).
        extra_state: The ``extra_state`` passed to ``save`` (a fresh JSON copy), or ``None``.
        rollout_buffer: The rollout buffer passed to ``save`` (tensors on CPU, same key order), or ``None``.
    """

    step: int
    path: Path | None
    good: bool
    created: str
    extra_state: dict[str, Any] | None
    rollout_buffer: dict[str, Any] | None


class CheckpointManager:
    """Save, verify, mark good, prune and restore full RL training checkpoints.

    Args:
        directory: Where checkpoints live (created if missing; absolute or relative, anywhere -- no need to
            be under the working directory; the directory itself may be a symlink, entries inside it may
            not). Must be ``None`` when ``in_memory=True``.
        keep_last: How many of the newest checkpoints pruning keeps (an int >= 1), or ``None`` to keep all.
            The newest good checkpoint older than those is kept as well (see :func:`steps_to_keep`).
        in_memory: Keep CPU copies of the state dicts in this process instead of writing files. Memory cost
            per checkpoint: the model's (or adapter's) tensors, the optimizer state (2x the trainable
            parameters for Adam/AdamW), the reference model's tensors and the rollout buffer, all on CPU;
            at most ``keep_last + 1`` checkpoints are held. Nothing survives the process.

    Checkpoints are identified by their training step, which must increase from one save to the next.
    "Good" marks (:meth:`mark_good`) persist in ``good.json`` next to the checkpoints, so a restarted
    process knows which checkpoints are rollback targets.

    One manager (one process) writes a store at a time -- savers on the same machine serialise on a
    ``flock`` -- and a manager is not thread-safe. Under data parallelism save on rank 0 and restore on
    every rank (restore only reads, unless ``discard_newer=True``, which rank 0 alone should pass).

    A **sharded** model (``DTensor`` parameters: FSDP2's ``fully_shard``, tensor parallelism) is saved and
    restored through ``torch.distributed.checkpoint`` (DCP) by every rank together: call :meth:`save` and
    :meth:`restore` on every rank of the default process group, with the same arguments; each rank writes
    and hashes its own shards, rank 0 writes the manifest (``"engine": "dcp"``) and renames the checkpoint
    into place only once every rank's files are complete, and a failure on any rank raises on every rank.
    Mark checkpoints good on rank 0, as under data parallelism. Sharded checkpoints live on disk (a folder
    every rank can read), hold each rank's RNG states, and cannot hold a rollout buffer. DeepSpeed ZeRO-3
    (parameters partitioned without DTensors) is not supported: see ``docs/distributed.md``.

    Raises:
        LoopguardTypeError: ``keep_last`` or ``in_memory`` of the wrong type (``True`` for a count).
        ConfigError: ``keep_last < 1``; ``directory`` missing (or given with ``in_memory=True``), not a
            directory, or not creatable; an on-disk store on a system without POSIX file semantics.
        CheckpointError: the store's ``.lock`` is a symlink, directory, FIFO, socket or device (the
            message names it: remove it). Every method that locks the store (``save``, ``mark_good``,
            ``restore``, ``verify``) raises the same; and every on-disk method raises it when the store's
            directory has gone or is no longer a directory.

    Example:
        >>> import torch
        >>> from loopguard.checkpoint import CheckpointManager
        >>> model = torch.nn.Linear(3, 1)
        >>> manager = CheckpointManager(in_memory=True, keep_last=2)
        >>> for step in (5, 10, 15):
        ...     _ = manager.save(step, model)
        >>> manager.steps()
        (10, 15)
        >>> manager.last_good() is None
        True
        >>> CheckpointManager(in_memory=True, keep_last=True)
        Traceback (most recent call last):
        ...
        loopguard.exceptions.LoopguardTypeError: `keep_last` must be an integer (not bool), got True.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        keep_last: int | None = 3,
        in_memory: bool = False,
    ) -> None:
        """Validate the settings, create the directory and clear what dead saves left behind."""
        self._in_memory = check_bool("in_memory", in_memory)
        self._keep_last = None if keep_last is None else check_int("keep_last", keep_last, lo=1)
        self._memory: dict[int, Snapshot] = {}
        self._memory_good: set[int] = set()
        self._memory_runs: dict[int, str | None] = {}
        self._root: str | None = None
        self._run: str | None = None
        if self._in_memory:
            if directory is not None:
                msg = (
                    "`directory` must be None when in_memory=True (nothing is written to disk), "
                    f"got {describe(os.fspath(directory))}."
                )
                raise ConfigError(msg)
            return
        if directory is None:
            msg = "`directory` must be a path when in_memory=False, got None."
            raise ConfigError(msg)
        if not _POSIX:
            msg = (
                "on-disk checkpoints need POSIX file semantics (Linux or macOS: O_NOFOLLOW, dir fsync); "
                "use in_memory=True here."
            )
            raise ConfigError(msg)
        root = os.path.abspath(check_path("directory", directory))
        if os.path.lexists(root) and not os.path.isdir(root):
            msg = f"`directory` must be a directory, got {describe(root)} (not a directory)."
            raise ConfigError(msg)
        try:
            os.makedirs(root, exist_ok=True)
        except OSError as error:
            msg = f"`directory` must be a directory that can be created, got {describe(root)} ({error})."
            raise ConfigError(msg) from None
        self._root = root
        with self._open() as root_fd, locked(root_fd, root):
            self._cleanup(root_fd)

    def __repr__(self) -> str:
        """Show the directory and settings."""
        return f"CheckpointManager({self._root!r}, keep_last={self._keep_last}, in_memory={self._in_memory})"

    @property
    def directory(self) -> Path | None:
        """The store's directory (absolute), or ``None`` in memory."""
        return None if self._root is None else Path(self._root)

    @property
    def keep_last(self) -> int | None:
        """How many of the newest checkpoints pruning keeps (``None``: all)."""
        return self._keep_last

    @property
    def in_memory(self) -> bool:
        """Whether checkpoints are CPU copies held in this process."""
        return self._in_memory

    # ------------------------------------------------------------------------------------ listing

    def steps(self) -> tuple[int, ...]:
        """The steps of all complete checkpoints, oldest first (temporary, half-deleted ones never appear)."""
        if self._in_memory:
            return tuple(sorted(self._memory))
        with self._open() as root_fd:
            return tuple(self._scan(root_fd))

    def good_steps(self) -> tuple[int, ...]:
        """The steps of the checkpoints marked good, oldest first.

        Raises:
            CheckpointError: ``good.json`` is malformed or not a regular file (as :meth:`mark_good`).
        """
        if self._in_memory:
            return tuple(sorted(self._memory_good & set(self._memory)))
        with self._open() as root_fd:
            return tuple(sorted(self._read_good(root_fd) & set(self._scan(root_fd))))

    def last_good(self, before_step: int | None = None) -> int | None:
        """The rollback target: the newest good checkpoint's step, strictly before ``before_step`` if given.

        Pass the detected onset of the hack as ``before_step``: a checkpoint saved at the onset step or
        later may already carry the hacked policy, even if it was marked good before the hack was detected.

        Returns:
            A step, or ``None`` when no such checkpoint exists.

        Example:
            >>> import torch
            >>> manager = CheckpointManager(in_memory=True, keep_last=None)
            >>> for step in (10, 20, 30):
            ...     _ = manager.save(step, torch.nn.Linear(2, 2))
            ...     manager.mark_good(step)
            >>> manager.last_good(), manager.last_good(before_step=30), manager.last_good(before_step=10)
            (30, 20, None)
        """
        before = None if before_step is None else _check_step("before_step", before_step)
        candidates = [step for step in self.good_steps() if before is None or step < before]
        return max(candidates) if candidates else None

    def mark_good(self, step: int) -> None:
        """Mark a saved checkpoint good: the run stayed healthy for a confirmation window after it.

        The mark is persisted (``good.json``, replaced atomically) before this returns. Marking twice is
        harmless.

        Raises:
            LoopguardTypeError: ``step`` is not an int.
            ConfigError: no complete checkpoint has this step.
            CheckpointError: ``good.json`` is malformed (or nested too deeply), or is not a regular file
                (a symlink, FIFO, socket, device or directory: refused at once); ``.lock`` is not a
                regular file.
            CheckpointWriteError: the disk failed while ``good.json`` was replaced (full, quota, file
                size limit, I/O error); an ``OSError`` with the errno. ``good.json`` is unchanged.
        """
        step = _check_step("step", step)
        if self._in_memory:
            self._require_saved(step, self._memory)
            self._memory_good.add(step)
            return
        with self._open() as root_fd, locked(root_fd, self._disk_root()):
            steps = self._scan(root_fd)
            self._require_saved(step, steps)
            good = self._read_good(root_fd) & set(steps)
            if step not in good:
                self._write_good(root_fd, good | {step})

    # ------------------------------------------------------------------------------------ save

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: Stateful | None = None,
        scheduler: Stateful | None = None,
        *,
        ref_model: torch.nn.Module | None = None,
        rollout_buffer: Mapping[str, Any] | None = None,
        rng: bool = True,
        extra_state: dict[str, Any] | None = None,
    ) -> Path | None:
        """Save a complete checkpoint of the run at ``step`` atomically, then prune.

        Everything is validated before anything is written, so a save that succeeds can be restored.

        Args:
            step: The training step (int >= 0), greater than every saved step. Save after the optimizer
                update of global step ``N`` with ``step=N``.
            model: The policy. A ``peft.PeftModel`` saves only its adapters' weights (every adapter in
                ``peft_config``); any other ``torch.nn.Module`` saves its full ``state_dict()``. Tied
                weights are stored once.
            optimizer: Saved with ``torch.save`` of its ``state_dict()``. Its state may contain only what
                ``torch.load(weights_only=True)`` accepts (tensors, numbers, strings, lists, tuples, dicts).
            scheduler: An LR scheduler; same rule.
            ref_model: A reference model that can drift from its initial weights (synced or EMA
                references); must be a different module from ``model``.
            rollout_buffer: A mapping of names (non-empty ``str``, at most 256 characters, not
                ``"__metadata__"``; at most 10,000 entries) to dense tensors (saved as safetensors,
                restored on CPU) or JSON values (dict with str keys, list, str, int, finite float, bool,
                None; tuples are refused because they would come back as lists).
            rng: Save the python ``random``, numpy global, torch CPU and (if CUDA is initialised) every
                CUDA device's RNG state.
            extra_state: A JSON object (dict with str keys, JSON values), e.g. ``Guard.state_dict()``.

        Returns:
            The checkpoint's directory, or ``None`` for an in-memory manager.

        Raises:
            LoopguardTypeError: a wrong type anywhere (the message names the argument and the path inside
                it, e.g. ``optimizer.state_dict()['param_groups'][0]['fn']``).
            ConfigError: ``step`` negative or not greater than the newest saved step; a non-finite float in
                JSON; ``ref_model is model``.
            CheckpointWriteError: the disk failed (full, over quota, over a file-size limit, read-only, an
                I/O error), whatever ``torch.save`` made of the failed write; an ``OSError`` that keeps the
                errno (``errno.ENOSPC`` for a full disk) and names the file. Nothing of this step is left
                behind, earlier checkpoints and ``good.json`` are untouched, and the same save succeeds
                once space is back.
            CheckpointError: ``.lock`` or ``good.json`` is not a regular file (see :meth:`mark_good`).
        """
        step = _check_step("step", step)
        rng = check_bool("rng", rng)
        engine, refused = _sharded.route(model)
        if engine is not None:
            extra_sharded = _checked_extra(extra_state)
            if ref_model is model:
                msg = "`ref_model` must be a separate module from `model`, got the same object."
                raise ConfigError(msg)
            return self._save_sharded(
                engine, step, model, optimizer, scheduler, ref_model, rollout_buffer, rng, extra_sharded
            )
        _refuse(refused)
        model_state = capture_module("model", model)
        ref_state = None
        if ref_model is not None:
            if ref_model is model:
                msg = "`ref_model` must be a separate module from `model`, got the same object."
                raise ConfigError(msg)
            ref_state = capture_module("ref_model", ref_model)
        extra = _checked_extra(extra_state)
        snapshot = Snapshot(
            step=step,
            created=_now(),
            model=model_state,
            ref_model=ref_state,
            optimizer=_capture_stateful("optimizer", optimizer),
            scheduler=_capture_stateful("scheduler", scheduler),
            rng=RngState.capture() if rng else None,
            rollout=None if rollout_buffer is None else RolloutState.capture(rollout_buffer),
            extra_state=extra,
        )
        if self._in_memory:
            self._save_memory(snapshot)
            return None
        return self._save_disk(snapshot)

    def _save_memory(self, snapshot: Snapshot) -> None:
        self._require_newer(snapshot.step, self._memory)
        self._memory_runs[snapshot.step] = self._run
        self._memory[snapshot.step] = Snapshot(
            step=snapshot.step,
            created=snapshot.created,
            model=snapshot.model.cloned(),
            ref_model=None if snapshot.ref_model is None else snapshot.ref_model.cloned(),
            optimizer=_cloned_torch_state(snapshot.optimizer),
            scheduler=_cloned_torch_state(snapshot.scheduler),
            rng=None if snapshot.rng is None else snapshot.rng.cloned(),
            rollout=None if snapshot.rollout is None else snapshot.rollout.cloned(),
            extra_state=None if snapshot.extra_state is None else json_copy(snapshot.extra_state),
        )
        keep = steps_to_keep(self._memory, self._memory_good, self._keep_last)
        for step in [step for step in self._memory if step not in keep]:
            del self._memory[step]
            self._memory_good.discard(step)

    def _start_save(self, root_fd: int, step: int) -> tuple[str, list[int]]:
        """Under the store's lock: clear dead saves, check that ``step`` is new, name its temporary folder.

        Returns:
            The temporary folder's name (not created yet) and the steps saved so far.
        """
        self._cleanup(root_fd)
        steps = self._scan(root_fd)
        self._require_newer(step, steps)
        final = _step_name(step)
        if entry_kind(final, root_fd) is not None:
            msg = (
                f"`step` {step} cannot be saved: {os.path.join(self._disk_root(), final)} exists but is not "
                "a complete checkpoint (no manifest.json); move it out of the store."
            )
            raise ConfigError(msg)
        return f".tmp-{final}-{random_suffix()}", steps

    def _save_disk(self, snapshot: Snapshot) -> Path:
        root = self._disk_root()
        final = _step_name(snapshot.step)
        with self._open() as root_fd, locked(root_fd, root):
            temp, steps = self._start_save(root_fd, snapshot.step)
            temp_path = os.path.join(root, temp)
            try:
                os.mkdir(temp, 0o755, dir_fd=root_fd)
                temp_fd = open_child_dir(temp, root_fd)
                try:
                    files = _write_parts(temp_fd, snapshot, temp_path)
                    manifest = _dumps(_manifest(snapshot, files, self._run), indent=2)
                    write_file(temp_fd, MANIFEST, lambda writer: _write_bytes(writer, manifest), temp_path)
                    os.fsync(temp_fd)  # the entries created in it are durable before the rename
                finally:
                    os.close(temp_fd)
                replace_durably(temp, final, dir_fd=root_fd)
            except BaseException as error:
                with contextlib.suppress(OSError):  # the next save or construction retries the clean-up
                    remove_tree(temp, root_fd)
                if isinstance(error, OSError):  # a full disk, a quota, an I/O error: errno kept
                    outcome = (
                        f"step {snapshot.step} was not saved and the store is unchanged (earlier checkpoints "
                        f"and {INDEX} are intact); free space (or fix the disk) and save again"
                    )
                    raise disk_error(error, root, outcome) from error
                raise
            self._prune_saved(root_fd, [*steps, snapshot.step], final)
        return Path(root) / final

    def _prune_saved(self, root_fd: int, steps: list[int], final: str) -> None:
        """Prune after the save of ``final``; a failure warns (the new checkpoint is complete: go on)."""
        try:
            self._prune(root_fd, steps)
        except (OSError, CheckpointError) as error:
            where = os.path.join(self._disk_root(), final)
            warnings.warn(
                f"saved {where}, but pruning older checkpoints failed: {error}", RuntimeWarning, stacklevel=4
            )

    # ------------------------------------------------------------------------------------ restore

    def restore(
        self,
        step: StepSpec,
        model: torch.nn.Module,
        optimizer: Stateful | None = None,
        scheduler: Stateful | None = None,
        *,
        ref_model: torch.nn.Module | None = None,
        rng: bool = True,
        before_step: int | None = None,
        discard_newer: bool = False,
    ) -> RestoredCheckpoint:
        """Verify a checkpoint completely, then load it into the live objects.

        On disk, the checkpoint directory and every entry in it must be real (no symlinks, no
        subdirectories), ``manifest.json`` may name only the known checkpoint files (no paths), and every
        listed file must have the recorded size and SHA-256 -- the bytes hashed are the bytes decoded.
        Tensors are decoded with safetensors, optimizer and scheduler states with
        ``torch.load(weights_only=True)``, everything else from JSON. Then the saved state is checked
        against the live objects (keys, shapes, dtypes, classes, parameter groups). Only when all of this
        passes is anything live modified; any failure raises :class:`CheckpointError` naming the file and
        leaves the model, optimizer, scheduler and RNGs as they were. Files not listed in the manifest are
        never opened.

        Args:
            step: A saved step, ``"last_good"`` (:meth:`last_good` with ``before_step``) or ``"latest"``.
            model: Receives the weights (the adapters, for a PEFT model: it must have the same adapters).
            optimizer: Receives the optimizer state, if given (the checkpoint must hold one).
            scheduler: Receives the scheduler state, if given (the checkpoint must hold one).
            ref_model: Receives the reference model's weights, if given (the checkpoint must hold them).
            rng: Restore the RNG states (the checkpoint must hold them; pass ``False`` for one saved with
                ``rng=False``).
            before_step: With ``step="last_good"``: the detected onset of the hack; only checkpoints saved
                strictly before it are candidates.
            discard_newer: After a successful restore, delete every checkpoint newer than the restored one
                (their good marks first). Pass ``True`` when rolling back, so the abandoned timeline can
                never become a rollback target and steps can be saved again from the restored one onwards;
                leave ``False`` to load a checkpoint without changing the store (e.g. for evaluation).

        Returns:
            A :class:`RestoredCheckpoint` with the step, the ``extra_state`` and the rollout buffer.

        Raises:
            CheckpointError: tampered, truncated, missing or symlinked files, a malformed manifest, no good
                checkpoint (before ``before_step``), or saved state that does not fit the live objects.
                Also, at once and without blocking: a FIFO, socket, device or directory in place of any
                file read (``good.json``, ``manifest.json``, a checkpoint file) or of ``.lock``; a size in
                the manifest that differs from the file's (``2**49`` is refused before anything is
                allocated) or a sparse file too large to be genuine; JSON nested more than 100 levels deep.
            ConfigError: an unknown step, or ``before_step`` without ``step="last_good"``.
            LoopguardTypeError: arguments of the wrong type.
        """
        rng = check_bool("rng", rng)
        discard_newer = check_bool("discard_newer", discard_newer)
        if ref_model is not None and ref_model is model:
            msg = "`ref_model` must be a separate module from `model`, got the same object."
            raise ConfigError(msg)
        for name, value in (("model", model), ("ref_model", ref_model)):
            if value is not None and not isinstance(value, torch.nn.Module):
                msg = f"`{name}` must be a torch.nn.Module, got {type(value).__name__}."
                raise LoopguardTypeError(msg)
        wanted = {
            "optimizer": optimizer is not None,
            "scheduler": scheduler is not None,
            "ref_model": ref_model is not None,
            "rng": rng,
        }

        def load(where: str, snapshot: Snapshot, *, clone: bool) -> None:
            apply_snapshot(
                where,
                snapshot,
                model=model,
                optimizer=optimizer,
                scheduler=scheduler,
                ref_model=ref_model,
                rng=rng,
                clone=clone,
            )

        engine, refused = _sharded.route(model)
        if engine is not None:
            parts = _Live(model, optimizer, scheduler, ref_model, rng)
            return self._restore_sharded(engine, step, before_step, wanted, parts, discard_newer)
        _refuse(refused)
        if self._in_memory:
            return self._restore_memory(step, before_step, wanted, load, discard_newer)
        return self._restore_disk(step, before_step, wanted, load, discard_newer)

    def _restore_memory(
        self, step: object, before_step: object, wanted: Mapping[str, bool], load: _Load, discard_newer: bool
    ) -> RestoredCheckpoint:
        target = self._resolve(step, before_step, self._memory, self._memory_good)
        snapshot = self._memory[target]
        where = f"in-memory checkpoint of step {target}"
        self._require_own(where, self._memory_runs.get(target))
        _require_parts(where, snapshot, wanted)
        load(where, snapshot, clone=True)
        if discard_newer:
            for dropped in [other for other in self._memory if other > target]:
                del self._memory[dropped]
                self._memory_good.discard(dropped)
        rollout = None if snapshot.rollout is None else snapshot.rollout.cloned().as_dict()
        extra = None if snapshot.extra_state is None else json_copy(snapshot.extra_state)
        return RestoredCheckpoint(target, None, target in self._memory_good, snapshot.created, extra, rollout)

    def _restore_disk(
        self, step: object, before_step: object, wanted: Mapping[str, bool], load: _Load, discard_newer: bool
    ) -> RestoredCheckpoint:
        with self._open() as root_fd, locked(root_fd, self._disk_root()):
            steps = self._scan(root_fd)
            good = self._read_good(root_fd) & set(steps)
            target = self._resolve(step, before_step, steps, good)
            snapshot = self._load(root_fd, target, wanted)
            where = os.path.join(self._disk_root(), _step_name(target))
            if snapshot is None:  # pragma: no cover - _load refuses a sharded checkpoint to restore
                raise _fail(where, "is sharded")
            load(f"checkpoint {where}", snapshot, clone=False)
            if discard_newer:
                self._discard_newer(root_fd, where, [other for other in steps if other > target], good)
        rollout = None if snapshot.rollout is None else snapshot.rollout.as_dict()
        return RestoredCheckpoint(
            target, Path(where), target in good, snapshot.created, snapshot.extra_state, rollout
        )

    def _discard_newer(self, root_fd: int, where: str, newer: list[int], good: set[int]) -> None:
        """Unmark and delete the checkpoints after a restored one; a failure warns (the restore stands)."""
        try:
            self._forget(root_fd, newer, good)
        except (OSError, CheckpointError) as error:  # the restore succeeded: report, do not undo it
            warnings.warn(
                f"restored {where}, but discarding the newer checkpoints {newer} failed: {error}",
                RuntimeWarning,
                stacklevel=4,
            )

    def verify(self, step: StepSpec) -> None:
        """Check a checkpoint completely without loading it into anything (as :meth:`restore` would).

        Raises:
            CheckpointError: the same integrity and hostile-entry failures :meth:`restore` reports.
            ConfigError: an unknown step.
        """
        if self._in_memory:
            self._resolve(step, None, self._memory, self._memory_good)
            return
        with self._open() as root_fd, locked(root_fd, self._disk_root()):
            steps = self._scan(root_fd)
            target = self._resolve(step, None, steps, self._read_good(root_fd) & set(steps))
            self._load(root_fd, target, None)

    # ------------------------------------------------------------------------------------ sharded models

    def _save_sharded(
        self,
        engine: str,
        step: int,
        model: torch.nn.Module,
        optimizer: Stateful | None,
        scheduler: Stateful | None,
        ref_model: torch.nn.Module | None,
        rollout_buffer: Mapping[str, Any] | None,
        rng: bool,
        extra: dict[str, Any] | None,
    ) -> Path:
        """Save a sharded model (DCP, or a DeepSpeed engine's own checkpoint), every rank together."""
        if self._in_memory:
            msg = (
                "`model` is sharded (DTensor parameters or a DeepSpeed engine), which an in-memory "
                "CheckpointManager cannot hold: give it a directory every rank can read."
            )
            raise ConfigError(msg)
        if rollout_buffer is not None:
            msg = (
                "`rollout_buffer` cannot be saved with a sharded model (each rank holds its own); save it "
                "with the rank's own state, or pass rollout_buffer=None."
            )
            raise ConfigError(msg)
        if ref_model is not None and not isinstance(ref_model, torch.nn.Module):
            msg = f"`ref_model` must be a torch.nn.Module, got {type(ref_model).__name__}."
            raise LoopguardTypeError(msg)
        state: _sharded.TensorState | None = None
        if engine == _sharded.DEEPSPEED:
            _check_engine_parts(model, optimizer, ref_model)
        elif optimizer is not None and not isinstance(
            _sharded.inner_optimizer(optimizer), torch.optim.Optimizer
        ):
            kind = type(optimizer).__name__
            msg = f"`optimizer` of a sharded model must be a torch.optim.Optimizer, got {kind}."
            raise LoopguardTypeError(msg)
        ranks = _sharded.Ranks()
        if engine == _sharded.ENGINE:
            state = _sharded.capture(model, optimizer, ref_model)
            if optimizer is not None:
                check_torch_state("optimizer.state_dict() (its non-tensor part)", state.optimizer_skeleton)
        saved_scheduler = _capture_stateful("scheduler", scheduler)
        saved_rng = RngState.capture() if rng else None
        created = _now()
        root = self._disk_root()
        final = _step_name(step)
        # every rank is inside save() (none is still taking the store's lock elsewhere) before rank 0 locks it
        ranks.agree(None, f"saving step {step}")
        with contextlib.ExitStack() as stack:
            root_fd = stack.enter_context(self._open())
            temp: str | None = None
            failure: BaseException | None = None
            if ranks.main:
                try:
                    stack.enter_context(locked(root_fd, root))
                    temp, _ = self._start_save(root_fd, step)
                    os.mkdir(temp, 0o755, dir_fd=root_fd)
                except BaseException as error:
                    failure = error
            ranks.agree(failure, f"saving step {step}")
            temp = cast(str, ranks.share(temp))
            temp_path = os.path.join(root, temp)
            try:
                files = self._write_shards(
                    ranks, root_fd, temp, temp_path, model, state, saved_scheduler, saved_rng, extra
                )
                failure = None
                if ranks.main:
                    try:
                        record = {
                            "model": {
                                "kind": "sharded",
                                "class": type(getattr(model, "module", model)).__name__,
                            },
                            "ref_model": None
                            if ref_model is None
                            else {"kind": "sharded", "class": type(ref_model).__name__},
                            "optimizer": None
                            if optimizer is None
                            else {
                                "class": unwrapped_class(optimizer, "optimizer"),
                                "empty": state is not None and state.optimizer_empty,
                            },
                            "scheduler": None
                            if saved_scheduler is None
                            else {"class": saved_scheduler.class_name},
                            "rng": None if saved_rng is None else {"ranks": ranks.world},
                            "rollout_buffer": None,
                            "extra_state": None if extra is None else {"keys": len(extra)},
                        }
                        manifest = {
                            "format": FORMAT,
                            "format_version": FORMAT_VERSION,
                            "engine": engine,
                            "step": step,
                            "run": self._run,
                            "created": created,
                            "versions": _versions(),
                            "world_size": ranks.world,
                            "contents": record,
                            "files": {name: files[name] for name in sorted(files)},
                        }
                        data = _dumps(manifest, indent=2)
                        temp_fd = open_child_dir(temp, root_fd)
                        try:
                            write_file(
                                temp_fd, MANIFEST, lambda writer: _write_bytes(writer, data), temp_path
                            )
                            os.fsync(temp_fd)  # every rank's entries are durable before the rename
                        finally:
                            os.close(temp_fd)
                        replace_durably(temp, final, dir_fd=root_fd)
                    except BaseException as error:
                        failure = error
                ranks.agree(failure, f"committing step {step}")
            except BaseException as error:
                if ranks.main:
                    with contextlib.suppress(OSError, CheckpointError):  # the next save retries the clean-up
                        remove_tree(temp, root_fd)
                if isinstance(error, OSError):
                    outcome = (
                        f"step {step} was not saved and the store is unchanged; free space and save again"
                    )
                    raise disk_error(error, root, outcome) from error
                raise
            if ranks.main:
                self._prune_saved(root_fd, self._scan(root_fd), final)
        return Path(root) / final

    @staticmethod
    def _write_shards(
        ranks: _sharded.Ranks,
        root_fd: int,
        temp: str,
        temp_path: str,
        model: Any,
        state: _sharded.TensorState | None,
        scheduler: TorchState | None,
        rng: RngState | None,
        extra: dict[str, Any] | None,
    ) -> dict[str, dict[str, Any]]:
        """Every rank: the engine writes the shards, each rank writes and hashes its own files; all by name.

        ``state`` None: ``model`` is a DeepSpeed engine, which writes its partitions (parameters, optimizer)
        with its own ``save_checkpoint``, flat into the temporary directory (tag ``"."``).
        """
        from torch.distributed.checkpoint.filesystem import FileSystemWriter
        from torch.distributed.checkpoint.state_dict_saver import save

        failure: BaseException | None = None
        try:
            if state is None:
                model.save_checkpoint(temp_path, tag=DEEPSPEED_TAG, save_latest=False)
            else:
                writer = FileSystemWriter(
                    temp_path, single_file_per_rank=True, sync_files=True, thread_count=1
                )
                save(state.tensors, storage_writer=writer)
        except BaseException as error:
            failure = error
        ranks.agree(failure, "writing the shards")
        files: dict[str, dict[str, Any]] = {}
        failure = None
        try:
            temp_fd = open_child_dir(temp, root_fd)
            try:
                files.update(_sharded.hash_own_files(temp_fd, temp_path, ranks.rank))
                if rng is not None:
                    json_name, tensor_name = _sharded.rng_names(ranks.rank)
                    data = _dumps(rng.to_json())
                    files[json_name] = write_file(
                        temp_fd, json_name, lambda w: _write_bytes(w, data), temp_path
                    )
                    files[tensor_name] = write_safetensors(
                        temp_fd, tensor_name, rng.tensors(), where=temp_path
                    )
                if ranks.main:
                    for script in _sharded.DEEPSPEED_SCRIPTS:  # DeepSpeed's tools, copied beside a save
                        if state is None and entry_kind(script, temp_fd) is not None:
                            os.unlink(script, dir_fd=temp_fd)
                    if state is not None and state.optimizer_skeleton is not None:
                        skeleton = state.optimizer_skeleton
                        files["optimizer.pt"] = write_file(
                            temp_fd,
                            "optimizer.pt",
                            lambda w: torch.save(skeleton, cast(IO[bytes], w)),
                            temp_path,
                        )
                    if scheduler is not None:
                        files["scheduler.pt"] = write_file(
                            temp_fd,
                            "scheduler.pt",
                            lambda w: torch.save(scheduler.state, cast(IO[bytes], w)),
                            temp_path,
                        )
                    if extra is not None:
                        data = _dumps(extra)
                        files["extra_state.json"] = write_file(
                            temp_fd, "extra_state.json", lambda w: _write_bytes(w, data), temp_path
                        )
            finally:
                os.close(temp_fd)
        except BaseException as error:
            failure = error
        ranks.agree(failure, "writing and hashing each rank's files")
        merged: dict[str, dict[str, Any]] = {}
        for part in ranks.gather(files):
            merged.update(part)
        if ranks.main:
            temp_fd = open_child_dir(temp, root_fd)
            try:
                present = set(os.listdir(temp_fd))
            finally:
                os.close(temp_fd)
            unknown = sorted(name for name in present if not _sharded.sharded_file(name))
            if present != set(merged) or unknown:
                msg = (
                    f"the sharded checkpoint in {temp_path} holds files that no rank hashed "
                    f"({sorted(present - set(merged)) or unknown}) or misses hashed ones "
                    f"({sorted(set(merged) - present)}); it was not saved."
                )
                merged = {}
                failure = CheckpointError(msg)
        ranks.agree(failure, "listing the shards")
        return merged

    def _restore_sharded(
        self,
        engine: str,
        step: object,
        before_step: object,
        wanted: Mapping[str, bool],
        live: _Live,
        discard_newer: bool,
    ) -> RestoredCheckpoint:
        """Restore a sharded model through DCP, every rank together (see the class docs)."""
        from torch.distributed.checkpoint.filesystem import FileSystemReader
        from torch.distributed.checkpoint.state_dict_loader import load

        if self._in_memory:
            msg = (
                "`model` is sharded (DTensor parameters), which an in-memory CheckpointManager never holds: "
                "sharded checkpoints are saved on disk."
            )
            raise ConfigError(msg)
        ranks = _sharded.Ranks()
        root = self._disk_root()
        ranks.agree(None, "restoring")  # every rank is inside restore() before rank 0 locks the store
        with contextlib.ExitStack() as stack:
            root_fd = stack.enter_context(self._open())
            plan: tuple[int, bool, dict[str, Any]] | None = None
            newer: list[int] = []
            good: set[int] = set()
            failure: BaseException | None = None
            if ranks.main:
                try:
                    stack.enter_context(locked(root_fd, root))
                    steps = self._scan(root_fd)
                    good = self._read_good(root_fd) & set(steps)
                    target = self._resolve(step, before_step, steps, good)
                    dir_fd, where, data = self._open_step(root_fd, target)
                    os.close(dir_fd)
                    manifest_where = os.path.join(where, MANIFEST)
                    saved_by = _engine(data)
                    if saved_by != engine:
                        msg = (
                            f"checkpoint {where} was saved through the {_ENGINE_NAMES[saved_by]}, but "
                            f"`model` needs the {_ENGINE_NAMES[engine]}; nothing was restored."
                        )
                        raise CheckpointError(msg)
                    manifest = _parse_sharded_manifest(data, target, manifest_where)
                    self._require_own(f"checkpoint {where}", manifest.get("run"))
                    for part, asked in wanted.items():
                        if asked and manifest["contents"][part] is None:
                            msg = f"checkpoint {where} {_MISSING_PART[part]}; nothing was restored."
                            raise CheckpointError(msg)
                    newer = [other for other in steps if other > target]
                    plan = (target, target in good, manifest)
                except BaseException as error:
                    failure = error
            ranks.agree(failure, "choosing the checkpoint to restore")
            target, is_good, manifest = ranks.share(plan)
            where = os.path.join(root, _step_name(target))
            failure = None
            try:
                dir_fd = open_child_dir(_step_name(target), root_fd)
                stack.callback(os.close, dir_fd)
                present = set(os.listdir(dir_fd)) - {MANIFEST}
                if present != set(manifest["files"]):
                    msg = (
                        f"checkpoint {where} holds files its manifest does not list "
                        f"({sorted(present - set(manifest['files']))}) or misses listed ones "
                        f"({sorted(set(manifest['files']) - present)}); nothing was restored."
                    )
                    raise CheckpointError(msg)
                _sharded.verify_share(dir_fd, where, manifest["files"], ranks.rank, ranks.world)
            except BaseException as error:
                failure = error
            ranks.agree(failure, f"verifying checkpoint {where}")
            contents = manifest["contents"]
            files = manifest["files"]

            def read(name: str) -> bytes:
                entry = files[name]
                return read_verified(dir_fd, name, entry["bytes"], entry["sha256"], os.path.join(where, name))

            failure = None
            target_state: _sharded.TensorState | None = None
            skeleton: Any = None
            saved_scheduler: TorchState | None = None
            saved_rng: RngState | None = None
            extra: dict[str, Any] | None = None
            try:
                if engine == _sharded.DEEPSPEED:
                    _check_engine_parts(live.model, live.optimizer, live.ref_model)
                    if manifest["world_size"] != ranks.world:
                        msg = (
                            f"checkpoint {where} holds the ZeRO partitions of {manifest['world_size']} "
                            f"ranks, this run has {ranks.world}: a DeepSpeed engine restores its own "
                            "partitioning only; nothing was restored."
                        )
                        raise CheckpointError(msg)
                else:
                    optimizer_empty = contents["optimizer"] is not None and contents["optimizer"]["empty"]
                    target_state = _sharded.capture(
                        live.model, live.optimizer, live.ref_model, optimizer_state=not optimizer_empty
                    )
                    live_optimizer = list(_sharded.flatten(target_state.tensors.get("optimizer", {})))
                    if live.optimizer is not None and not optimizer_empty and not live_optimizer:
                        msg = (
                            f"checkpoint {where} holds optimizer state, but `optimizer` holds none and could "
                            "not be given any (its parameters still have gradients): call "
                            "optimizer.zero_grad(set_to_none=True) before restoring; nothing was restored."
                        )
                        raise CheckpointError(msg)
                    metadata = FileSystemReader(where).read_metadata()
                    _sharded.check_saved_keys(f"checkpoint {where}", target_state.tensors, metadata)
                if live.optimizer is not None and engine == _sharded.ENGINE:
                    skeleton = _torch_state(where, "optimizer.pt", read("optimizer.pt"))
                    _check_optimizer(
                        f"checkpoint {where}",
                        TorchState(contents["optimizer"]["class"], skeleton),
                        live.optimizer,
                    )
                if live.scheduler is not None:
                    saved_scheduler = TorchState(
                        contents["scheduler"]["class"],
                        _torch_state(where, "scheduler.pt", read("scheduler.pt")),
                    )
                    _check_scheduler(f"checkpoint {where}", saved_scheduler, live.scheduler)
                if live.rng:
                    if contents["rng"]["ranks"] != ranks.world:
                        msg = (
                            f"checkpoint {where} holds the RNG states of {contents['rng']['ranks']} ranks, "
                            f"this run has {ranks.world}; pass rng=False; nothing was restored."
                        )
                        raise CheckpointError(msg)
                    json_name, tensor_name = _sharded.rng_names(ranks.rank)
                    saved_rng = RngState.from_files(
                        os.path.join(where, json_name),
                        _json_file(where, json_name, read(json_name)),
                        _safetensors(where, tensor_name, read(tensor_name)),
                    )
                    saved_rng.check_compatible(f"checkpoint {where}")
                if contents["extra_state"] is not None:
                    extra = _json_file(where, "extra_state.json", read("extra_state.json"))
                    if not isinstance(extra, dict):
                        raise _fail(os.path.join(where, "extra_state.json"), "does not hold a JSON object")
            except BaseException as error:
                failure = error
            ranks.agree(failure, f"checking checkpoint {where} against the live model")
            failure = None
            try:
                if target_state is None:  # a DeepSpeed engine reads its own partitions (tag ".": flat)
                    loaded, _ = cast(Any, live.model).load_checkpoint(
                        where,
                        tag=DEEPSPEED_TAG,
                        load_optimizer_states=live.optimizer is not None,
                        load_lr_scheduler_states=False,
                    )
                    if loaded is None:
                        msg = "DeepSpeed's load_checkpoint found nothing to load"
                        raise CheckpointError(msg)
                else:
                    load(target_state.tensors, storage_reader=FileSystemReader(where))
                    _sharded.load(
                        live.model,
                        live.optimizer,
                        live.ref_model,
                        target_state,
                        skeleton,
                        skeleton_empty=bool(contents["optimizer"] and contents["optimizer"]["empty"]),
                    )
                if live.scheduler is not None and saved_scheduler is not None:
                    live.scheduler.load_state_dict(saved_scheduler.state)
                if saved_rng is not None:
                    saved_rng.apply()
            except BaseException as error:
                failure = CheckpointError(
                    f"loading checkpoint {where} failed after it was verified ({type(error).__name__}: "
                    f"{error}); the live model and optimizer may be partly restored on this rank: restore "
                    "again before training on."
                )
            ranks.agree(failure, f"loading checkpoint {where}")
            if ranks.main and discard_newer and newer:
                self._discard_newer(root_fd, where, newer, good)
        return RestoredCheckpoint(target, Path(where), is_good, str(manifest.get("created", "")), extra, None)

    # ------------------------------------------------------------------------------------ run identity

    @property
    def run(self) -> str | None:
        """The identity of the run this manager works for (:meth:`claim`), or ``None`` when unclaimed."""
        return self._run

    def claim(self, run: str, *, create: bool = True) -> None:
        """Bind this store to one run, so that it never restores weights another run saved.

        On disk the claim is ``run.json`` in the store (written atomically under the store's lock). A store
        with no claim and no checkpoint is claimed; one already claimed by ``run`` (a resumed run) is
        accepted; one claimed by another run, or holding checkpoints saved without a claim, is refused. Once
        claimed, every checkpoint saved records ``run`` in its manifest, a save refuses a store whose claim
        changed meanwhile, and :meth:`restore` / :meth:`verify` refuse a checkpoint of another run. An
        in-memory manager keeps the claim in the process: it may be claimed again by another run only while
        it holds no checkpoint.

        Args:
            run: The run identity (see ``loopguard._run``: up to 64 letters, digits, ``.``, ``_``, ``-``).
            create: Write the claim when the store has none (the main process); ``False`` only checks that
                the store is not another run's (other ranks of a data-parallel run).

        Raises:
            ConfigError: the store belongs to another run, or holds checkpoints of an unnamed run (the
                message names the directory and the two ways out), or ``run`` is malformed.
            CheckpointError: ``run.json`` is malformed, a symlink or not a regular file.
            CheckpointWriteError: the claim cannot be written.
        """
        run = check_run_id("run", run)
        create = check_bool("create", create)
        if self._in_memory:
            others = {self._memory_runs.get(step) for step in self._memory} - {run}
            if others:
                owner = next(iter(others))
                raise ConfigError(self._foreign(owner or "no run identity", run, "this in-memory store"))
            self._run = run
            return
        root = self._disk_root()
        with self._open() as root_fd, locked(root_fd, root):
            owner = self._read_run(root_fd)
            if owner is None:
                steps = self._scan(root_fd)
                if steps:
                    msg = (
                        f"`directory` {root} holds checkpoints (steps {_show_steps(steps)}) saved without a "
                        f"run identity (by a hand-written loop or an older loopguard), so run {run} cannot "
                        "claim it: loopguard never restores weights another run saved. Give this run a store "
                        f"of its own (another directory), or move or delete the checkpoints in {root}."
                    )
                    raise ConfigError(msg)
                if create:
                    document = {"format": RUN_FORMAT, "format_version": FORMAT_VERSION, "run": run}
                    write_small_atomic(root_fd, RUN_INDEX, _dumps(document), ".tmp-run-", root)
            elif owner != run:
                raise ConfigError(self._foreign(owner, run, f"`directory` {root}"))
        self._run = run

    @staticmethod
    def _foreign(owner: str, run: str, where: str) -> str:
        return (
            f"{where} holds the rollback checkpoints of another run ({owner}), not of this run ({run}): "
            "loopguard never restores another run's weights. Either resume that run (for a Trainer, "
            "trainer.train(resume_from_checkpoint=...) from one of its checkpoints keeps its identity), or "
            "give this run a store of its own (another directory, or delete the old store if its "
            "checkpoints are no longer needed)."
        )

    def _read_run(self, root_fd: int) -> str | None:
        if entry_kind(RUN_INDEX, root_fd) is None:
            return None
        where = os.path.join(self._disk_root(), RUN_INDEX)
        data = read_small(root_fd, RUN_INDEX, MAX_MANIFEST_BYTES, where)
        try:
            document = load_json(data)
        except ValueError:
            document = None
        run = document.get("run") if isinstance(document, dict) else None
        valid = (
            isinstance(document, dict)
            and document.get("format") == RUN_FORMAT
            and document.get("format_version") == FORMAT_VERSION
            and isinstance(run, str)
            and RUN_ID_PATTERN.fullmatch(run) is not None
        )
        if not valid:
            msg = f"{where} is malformed; it names the run that owns this store (restore it, or use another)."
            raise CheckpointError(msg)
        return cast(str, run)

    def _require_own(self, where: str, run: object) -> None:
        """Refuse a checkpoint that another run saved, once this manager is claimed."""
        if self._run is not None and run != self._run:
            saver = "no run identity" if run is None else f"run {run}"
            msg = (
                f"{where} was saved by {saver}, not by this run ({self._run}): refusing to load another "
                "run's weights; nothing was restored."
            )
            raise CheckpointError(msg)

    def discard_after(self, step: int) -> list[int]:
        """Delete every checkpoint saved after ``step`` (their good marks first); return their steps.

        A run resumed from its checkpoint of ``step`` calls this: what it saved after ``step`` belongs to
        the abandoned timeline and must never become a rollback target, and the steps after ``step`` are
        saved again.

        Raises:
            LoopguardTypeError, ConfigError: ``step`` is not an int >= 0.
            CheckpointWriteError, OSError: the store could not be changed (what was deleted stays deleted).
        """
        after = _check_step("step", step)
        if self._in_memory:
            newer = sorted(other for other in self._memory if other > after)
            for other in newer:
                del self._memory[other]
                self._memory_good.discard(other)
                self._memory_runs.pop(other, None)
            return newer
        with self._open() as root_fd, locked(root_fd, self._disk_root()):
            steps = self._scan(root_fd)
            newer = [other for other in steps if other > after]
            self._forget(root_fd, newer, self._read_good(root_fd) & set(steps))
        return newer

    # ------------------------------------------------------------------------------------ internals

    def _disk_root(self) -> str:
        if self._root is None:  # pragma: no cover - in-memory managers never reach the disk paths
            msg = "this CheckpointManager keeps checkpoints in memory and has no directory."
            raise ConfigError(msg)
        return self._root

    def _open(self) -> _RootHandle:
        return _RootHandle(self._disk_root())

    @staticmethod
    def _require_saved(step: int, steps: Collection[int]) -> None:
        if step not in steps:
            msg = f"`step` must be a saved checkpoint step ({_show_steps(steps)}), got {step}."
            raise ConfigError(msg)

    @staticmethod
    def _require_newer(step: int, steps: Collection[int]) -> None:
        if steps and step <= max(steps):
            msg = (
                f"`step` must be greater than the newest saved step {max(steps)}, got {step} (steps increase "
                "from save to save; to continue from an older checkpoint, restore it with "
                "discard_newer=True)."
            )
            raise ConfigError(msg)

    def _resolve(
        self, step: object, before_step: object, steps: Collection[int], good: Collection[int]
    ) -> int:
        if isinstance(step, str):
            choice = check_choice("step", step, ("last_good", "latest"))
            if before_step is not None and choice != "last_good":
                msg = f"`before_step` applies only to step='last_good', got step={choice!r}."
                raise ConfigError(msg)
            if choice == "latest":
                if not steps:
                    msg = f"no checkpoint is saved in {self._where()}; nothing to restore."
                    raise CheckpointError(msg)
                return max(steps)
            before = None if before_step is None else _check_step("before_step", before_step)
            candidates = [other for other in good if before is None or other < before]
            if not candidates:
                limit = "" if before is None else f" before step {before}"
                msg = (
                    f"no checkpoint{limit} is marked good in {self._where()} "
                    f"(saved: {_show_steps(steps)}; good: "
                    f"{_show_steps(good)}); nothing to roll back to."
                )
                raise CheckpointError(msg)
            return max(candidates)
        if before_step is not None:
            msg = f"`before_step` applies only to step='last_good', got step={describe(step)}."
            raise ConfigError(msg)
        if not isinstance(step, numbers.Integral) or isinstance(step, (bool, np.bool_)):
            msg = (
                f"`step` must be an int, 'last_good' or 'latest', got {describe(step)} "
                f"of type {type(step).__name__}."
            )
            raise LoopguardTypeError(msg)
        target = _check_step("step", step)
        self._require_saved(target, steps)
        return target

    def _where(self) -> str:
        return "memory" if self._root is None else self._root

    def _scan(self, root_fd: int) -> list[int]:
        steps = []
        for name in os.listdir(root_fd):
            step = _parse_step_name(name)
            if step is None:
                continue
            mode = entry_kind(name, root_fd)
            if mode is None:
                continue
            # A symlinked step-N is listed so that restore refuses it loudly instead of skipping it.
            complete = stat.S_ISDIR(mode) and entry_kind(f"{name}/{MANIFEST}", root_fd) is not None
            if stat.S_ISLNK(mode) or complete:
                steps.append(step)
        return sorted(steps)

    def _cleanup(self, root_fd: int) -> None:
        """Remove what dead saves, prunes and index writes left (only our own temporary names)."""
        for name in os.listdir(root_fd):
            if _TEMP.fullmatch(name) or _DELETING.fullmatch(name) or _TEMP_INDEX.fullmatch(name):
                try:
                    self._remove_entry(root_fd, name)
                except (OSError, CheckpointError) as error:  # e.g. read-only: leftovers are never listed
                    warnings.warn(
                        f"could not remove {os.path.join(self._disk_root(), name)}: {error}",
                        RuntimeWarning,
                        stacklevel=3,
                    )

    @staticmethod
    def _remove_entry(root_fd: int, name: str) -> None:
        mode = entry_kind(name, root_fd)
        if mode is None:
            return
        if stat.S_ISDIR(mode):
            remove_tree(name, root_fd)
        else:
            os.unlink(name, dir_fd=root_fd)

    def _delete(self, root_fd: int, step: int) -> None:
        doomed = f".del-{_step_name(step)}-{random_suffix()}"
        replace_durably(_step_name(step), doomed, dir_fd=root_fd)  # atomic: never a half-deleted step-N
        self._remove_entry(root_fd, doomed)

    def _prune(self, root_fd: int, steps: list[int]) -> None:
        good = self._read_good(root_fd) & set(steps)
        keep = steps_to_keep(steps, good, self._keep_last)
        doomed = [step for step in steps if step not in keep]
        if doomed:
            self._forget(root_fd, doomed, good)

    def _forget(self, root_fd: int, doomed: Collection[int], good: set[int]) -> None:
        """Delete the checkpoints ``doomed``, unmarking the good ones among them first.

        Unmarked first: a crash in between leaves an unmarked survivor, never a good mark without its
        checkpoint.
        """
        if good & set(doomed):
            self._write_good(root_fd, good - set(doomed))
        for step in doomed:
            self._delete(root_fd, step)

    def _index_path(self) -> str:
        return os.path.join(self._where(), INDEX)

    def _read_good(self, root_fd: int) -> set[int]:
        if entry_kind(INDEX, root_fd) is None:
            return set()
        where = self._index_path()
        data = read_small(root_fd, INDEX, MAX_MANIFEST_BYTES, where)
        try:
            document = load_json(data)
            good = document["good"] if isinstance(document, dict) else None
            valid = (
                isinstance(document, dict)
                and document.get("format") == INDEX_FORMAT
                and document.get("format_version") == FORMAT_VERSION
                and isinstance(good, list)
                and all(type(step) is int and 0 <= step <= MAX_STEP for step in good)
            )
        except (ValueError, KeyError):
            valid = False
        if not valid:
            msg = f"{where} is malformed; delete it to forget which checkpoints are good."
            raise CheckpointError(msg)
        return set(cast(list[int], good))

    def _write_good(self, root_fd: int, good: Collection[int]) -> None:
        document = {"format": INDEX_FORMAT, "format_version": FORMAT_VERSION, "good": sorted(good)}
        write_small_atomic(root_fd, INDEX, _dumps(document), ".tmp-good-", self._disk_root())

    def _open_step(self, root_fd: int, step: int) -> tuple[int, str, bytes]:
        """Open ``step-N`` (a real directory of regular files only) and read its manifest's bytes.

        Returns:
            ``(dir_fd, where, manifest bytes)``; the caller closes ``dir_fd``.
        """
        name = _step_name(step)
        where = os.path.join(self._disk_root(), name)
        mode = entry_kind(name, root_fd)
        if mode is None or stat.S_ISLNK(mode) or not stat.S_ISDIR(mode):
            kind = "missing" if mode is None else "a symlink" if stat.S_ISLNK(mode) else "not a directory"
            msg = f"checkpoint directory {where} is {kind}, refusing it; nothing was restored."
            raise CheckpointError(msg)
        try:
            dir_fd = open_child_dir(name, root_fd)
        except OSError as error:
            msg = f"checkpoint directory {where} could not be opened safely ({error}); nothing was restored."
            raise CheckpointError(msg) from None
        try:
            for entry in sorted(os.listdir(dir_fd)):
                entry_mode = entry_kind(entry, dir_fd)
                if entry_mode is not None and not stat.S_ISREG(entry_mode):
                    kind = "a symlink" if stat.S_ISLNK(entry_mode) else "a directory or special file"
                    path = os.path.join(where, entry)
                    msg = f"{path} is {kind}, refusing the checkpoint; nothing was restored."
                    raise CheckpointError(msg)
            data = read_small(dir_fd, MANIFEST, MAX_MANIFEST_BYTES, os.path.join(where, MANIFEST))
        except BaseException:
            os.close(dir_fd)
            raise
        return dir_fd, where, data

    def _load(self, root_fd: int, step: int, wanted: Mapping[str, bool] | None) -> Snapshot | None:
        """Read, verify and decode one checkpoint (``wanted=None``: decode every part, as :meth:`verify`).

        A sharded checkpoint is verified file by file when ``wanted`` is None (and None is returned); asked
        to load one (an unsharded model), it is refused.
        """
        dir_fd, where, data = self._open_step(root_fd, step)
        try:
            manifest_where = os.path.join(where, MANIFEST)
            if _engine(data) in _ENGINE_NAMES and _engine(data) != "files":
                sharded = _parse_sharded_manifest(data, step, manifest_where)
                self._require_own(f"checkpoint {where}", sharded.get("run"))
                if wanted is not None:
                    msg = (
                        f"checkpoint {where} is sharded (saved through the "
                        f"{_ENGINE_NAMES[sharded['engine']]} by {sharded['world_size']} rank(s)), but "
                        "`model` is not: restore it into the sharded model (FSDP2) or the DeepSpeed "
                        "engine, on every rank; nothing was restored."
                    )
                    raise CheckpointError(msg)
                _sharded.verify_share(dir_fd, where, sharded["files"], 0, 1)
                return None
            manifest = _parse_manifest(data, step, manifest_where)
            self._require_own(f"checkpoint {where}", manifest.get("run"))
            contents, files = manifest["contents"], manifest["files"]
            if wanted is not None:
                for part, asked in wanted.items():
                    if asked and contents[part] is None:
                        msg = f"checkpoint {where} {_MISSING_PART[part]}; nothing was restored."
                        raise CheckpointError(msg)
            needed = {"model", "rollout_buffer", "extra_state"}
            needed.update(
                part for part, asked in (wanted or dict.fromkeys(_PART_FILES, True)).items() if asked
            )

            def read(file_name: str, *, keep: bool = True) -> bytes:
                entry = files[file_name]
                path = os.path.join(where, file_name)
                return read_verified(dir_fd, file_name, entry["bytes"], entry["sha256"], path, keep=keep)

            # Files that are not loaded are verified (hashed in chunks) anyway; each loaded file is read
            # once, verified, decoded and dropped before the next, all before anything live is touched.
            loaded = {name for part in needed for name in _PART_FILES[part] if name in files}
            for file_name in sorted(set(files) - loaded):
                read(file_name, keep=False)
            return _decode(where, manifest, read, loaded)
        finally:
            os.close(dir_fd)


_Load = Callable[..., None]
"""``load(where, snapshot, *, clone)``: check a snapshot against the live objects of a restore and load it."""


class _RootHandle:
    """``with manager._open() as root_fd``: the root directory open for ``dir_fd`` operations."""

    def __init__(self, root: str) -> None:
        self._root = root
        self._fd = -1

    def __enter__(self) -> int:
        self._fd = open_root(self._root)
        return self._fd

    def __exit__(self, *exc_info: object) -> None:
        os.close(self._fd)


_MISSING_PART = {
    "optimizer": "has no optimizer state (saved without `optimizer`); pass optimizer=None",
    "scheduler": "has no scheduler state (saved without `scheduler`); pass scheduler=None",
    "ref_model": "has no reference model (saved without `ref_model`); pass ref_model=None",
    "rng": "has no RNG state (saved with rng=False); pass rng=False",
}


DEEPSPEED_TAG = "."
"""The tag a DeepSpeed engine saves under: ``"."`` puts its files flat into the checkpoint directory."""

_ENGINE_NAMES = {
    "files": "file engine (an unsharded model)",
    _sharded.ENGINE: "torch.distributed.checkpoint engine (DTensor parameters: FSDP2)",
    _sharded.DEEPSPEED: "DeepSpeed engine's own checkpointing (ZeRO)",
}


def refuse_unsaveable(model: object) -> None:
    """Refuse what one process cannot save: ZeRO-3 partitions without their engine, FSDP1 wrappers.

    FSDP1 keeps its parameters and optimizer state flattened and sharded per rank. A DeepSpeed engine (whose
    partitions it saves itself) and a DTensor model are saved by their own engines.
    """
    _refuse(_sharded.unsaveable(model))


def _refuse(refused: str | None) -> None:
    """Raise :func:`refuse_unsaveable`'s error for ``refused`` (:func:`_sharded.unsaveable`'s answer)."""
    if refused == "fsdp1":
        msg = (
            "`model` is wrapped in FSDP1 (FullyShardedDataParallel), whose optimizer state is flattened and "
            "sharded per rank: one process cannot save or restore it. Shard the policy with FSDP2 instead "
            "(torch.distributed.fsdp.fully_shard: DTensor parameters, which every rank saves together "
            "through torch.distributed.checkpoint), or give the Guard no rollback rung."
        )
        raise ConfigError(msg)
    if refused == "zero3":
        msg = (
            "`model`'s parameters are partitioned by DeepSpeed ZeRO-3, so no process holds them: pass the "
            "DeepSpeed engine instead (the first value deepspeed.initialize returns; a Trainer's "
            "trainer.model_wrapped), on every rank together."
        )
        raise ConfigError(msg)


def _check_engine_parts(model: Any, optimizer: Any, ref_model: Any) -> None:
    """A DeepSpeed engine saves and restores its own optimizer; only that one may be passed."""
    if optimizer is not None:
        owned, value = getattr(model, "optimizer", None), optimizer
        for _ in range(4):  # Accelerate / Trainer wrappers keep the engine's optimizer as .optimizer
            if value is owned or value is None:
                break
            value = getattr(value, "optimizer", None)
        if value is not owned or owned is None:
            msg = (
                "`optimizer` must be the DeepSpeed engine's own optimizer (engine.optimizer, which the "
                f"engine saves with its partitions), got {type(optimizer).__name__}."
            )
            raise ConfigError(msg)
    if ref_model is not None:
        msg = (
            "`ref_model` cannot be saved beside a DeepSpeed engine (a drifting reference under ZeRO is its "
            "own engine); pass ref_model=None."
        )
        raise ConfigError(msg)


@attrs.frozen(eq=False)
class _Live:
    """The live objects a sharded restore loads into."""

    model: torch.nn.Module
    optimizer: Any
    scheduler: Any
    ref_model: torch.nn.Module | None
    rng: bool


def _checked_extra(extra_state: object) -> dict[str, Any] | None:
    if extra_state is None:
        return None
    if type(extra_state) is not dict:
        msg = f"`extra_state` must be a dict (a JSON object), got {type(extra_state).__name__}."
        raise LoopguardTypeError(msg)
    check_json("extra_state", extra_state)
    return extra_state


def _engine(data: bytes) -> str:
    """Which engine wrote a manifest: ``"dcp"`` (sharded) or ``"files"`` (also manifests without the key)."""
    try:
        document = load_json(data)
    except ValueError:
        return "files"  # the full parse reports it
    engine = document.get("engine", "files") if isinstance(document, dict) else "files"
    return engine if isinstance(engine, str) else "files"


def _parse_sharded_manifest(data: bytes, step: int, where: str) -> dict[str, Any]:
    """Parse and validate a sharded checkpoint's ``manifest.json`` (as :func:`_parse_manifest`)."""
    manifest = _parse_manifest_common(data, step, where, _sharded.sharded_file, "a sharded checkpoint file")
    files, contents = manifest["files"], manifest["contents"]
    world = manifest.get("world_size")
    if type(world) is not int or world < 1:
        raise _fail(where, f"records a malformed world_size {describe(world)}")
    engine = manifest.get("engine")
    if engine not in (_sharded.ENGINE, _sharded.DEEPSPEED):
        raise _fail(where, f"records an unknown engine {describe(engine)}")
    dcp = engine == _sharded.ENGINE
    if dcp and _sharded.DCP_METADATA not in files:
        raise _fail(where, f"lists no {_sharded.DCP_METADATA!r} (DCP's plan of the shards)")
    for part in ("model", "ref_model"):
        record = contents[part]
        if (record is not None or part == "model") and not (
            isinstance(record, dict)
            and record.get("kind") == "sharded"
            and isinstance(record.get("class"), str)
        ):
            raise _fail(where, f"has a malformed contents[{part!r}] entry")
    optimizer = contents["optimizer"]
    if optimizer is not None and not (
        isinstance(optimizer, dict)
        and isinstance(optimizer.get("class"), str)
        and isinstance(optimizer.get("empty"), bool)
        and ("optimizer.pt" in files or not dcp)
    ):
        raise _fail(where, "has a malformed contents['optimizer'] entry (or no optimizer.pt)")
    scheduler = contents["scheduler"]
    if scheduler is not None and not (
        isinstance(scheduler, dict) and isinstance(scheduler.get("class"), str) and "scheduler.pt" in files
    ):
        raise _fail(where, "has a malformed contents['scheduler'] entry (or no scheduler.pt)")
    rng = contents["rng"]
    if rng is not None:
        expected = {name for rank in range(world) for name in _sharded.rng_names(rank)}
        if not (isinstance(rng, dict) and rng.get("ranks") == world and expected <= set(files)):
            raise _fail(where, "has a malformed contents['rng'] entry (or misses a rank's RNG files)")
    if contents["rollout_buffer"] is not None:
        raise _fail(where, "holds a rollout buffer, which sharded checkpoints never hold")
    if contents["extra_state"] is not None and "extra_state.json" not in files:
        raise _fail(where, "lists extra_state but no extra_state.json")
    return manifest


def _require_parts(where: str, snapshot: Snapshot, wanted: Mapping[str, bool]) -> None:
    present = {
        "optimizer": snapshot.optimizer,
        "scheduler": snapshot.scheduler,
        "ref_model": snapshot.ref_model,
        "rng": snapshot.rng,
    }
    for part, asked in wanted.items():
        if asked and present[part] is None:
            msg = f"{where} {_MISSING_PART[part]}; nothing was restored."
            raise CheckpointError(msg)


def _capture_stateful(name: str, value: Stateful | None) -> TorchState | None:
    if value is None:
        return None
    if not callable(getattr(value, "state_dict", None)) or not callable(
        getattr(value, "load_state_dict", None)
    ):
        msg = f"`{name}` must have state_dict() and load_state_dict() methods, got {type(value).__name__}."
        raise LoopguardTypeError(msg)
    state = value.state_dict()
    check_torch_state(f"{name}.state_dict()", state)
    return TorchState(unwrapped_class(value, name), state)


def _cloned_torch_state(value: TorchState | None) -> TorchState | None:
    return None if value is None else TorchState(value.class_name, clone_tree(value.state))


def _write_bytes(writer: Any, data: bytes) -> None:
    writer.write(data)


def _write_parts(dir_fd: int, snapshot: Snapshot, where: str) -> dict[str, dict[str, Any]]:
    files: dict[str, dict[str, Any]] = {}

    def torch_file(name: str, state: Any) -> None:
        files[name] = write_file(
            dir_fd, name, lambda writer: torch.save(state, cast(IO[bytes], writer)), where
        )

    def json_file(name: str, value: Any) -> None:
        data = _dumps(value)
        files[name] = write_file(dir_fd, name, lambda writer: _write_bytes(writer, data), where)

    def tensor_file(name: str, tensors: Mapping[str, torch.Tensor]) -> None:
        files[name] = write_safetensors(dir_fd, name, tensors, where=where)

    tensor_file("model.safetensors", snapshot.model.tensors)
    if snapshot.ref_model is not None:
        tensor_file("ref_model.safetensors", snapshot.ref_model.tensors)
    if snapshot.optimizer is not None:
        torch_file("optimizer.pt", snapshot.optimizer.state)
    if snapshot.scheduler is not None:
        torch_file("scheduler.pt", snapshot.scheduler.state)
    if snapshot.rng is not None:
        json_file("rng.json", snapshot.rng.to_json())
        tensor_file("rng.safetensors", snapshot.rng.tensors())
    if snapshot.rollout is not None:
        rollout = snapshot.rollout
        tensor_file("rollout_buffer.safetensors", rollout.tensors)
        json_file("rollout_buffer.json", {"order": list(rollout.order), "metadata": rollout.metadata})
    if snapshot.extra_state is not None:
        json_file("extra_state.json", snapshot.extra_state)
    return files


def _manifest(snapshot: Snapshot, files: Mapping[str, Any], run: str | None) -> dict[str, Any]:
    def torch_record(value: TorchState | None) -> dict[str, Any] | None:
        return None if value is None else {"class": value.class_name}

    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "engine": "files",
        "step": snapshot.step,
        "run": run,
        "created": snapshot.created,
        "versions": _versions(),
        "contents": {
            "model": snapshot.model.record(),
            "ref_model": None if snapshot.ref_model is None else snapshot.ref_model.record(),
            "optimizer": torch_record(snapshot.optimizer),
            "scheduler": torch_record(snapshot.scheduler),
            "rng": None if snapshot.rng is None else {"cuda_devices": len(snapshot.rng.cuda)},
            "rollout_buffer": None if snapshot.rollout is None else {"entries": len(snapshot.rollout.order)},
            "extra_state": None if snapshot.extra_state is None else {"keys": len(snapshot.extra_state)},
        },
        "files": {name: files[name] for name in sorted(files)},
    }


def _fail(where: str, problem: str) -> CheckpointError:
    return CheckpointError(f"{where} {problem}; nothing was restored.")


def _check_module_record(where: str, part: str, record: object) -> None:
    valid = (
        isinstance(record, dict)
        and record.get("kind") in ("full", "peft_adapter")
        and isinstance(record.get("class"), str)
        and isinstance(record.get("aliases"), dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in record["aliases"].items())
        and isinstance(record.get("adapters"), list)
        and all(isinstance(name, str) for name in record["adapters"])
    )
    if not valid:
        raise _fail(where, f"has a malformed contents[{part!r}] entry")


def _parse_manifest_common(
    data: bytes, step: int, where: str, known: Callable[[str], bool], kind: str
) -> dict[str, Any]:
    """Check what every manifest must hold; return it parsed.

    That is: loopguard's format and version, this step, a run identity or none, and ``files`` of ``known``
    names (no paths) with a SHA-256 and a size each, beside a ``contents`` section.
    """
    try:
        manifest = load_json(data)
    except ValueError as error:
        raise _fail(where, f"is not valid JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _fail(where, f"is not a loopguard checkpoint manifest (format must be {FORMAT!r})")
    format_version = manifest.get("format_version")
    if format_version != FORMAT_VERSION:
        raise _fail(where, f"has format_version {format_version!r}; this loopguard reads {FORMAT_VERSION}")
    if manifest.get("step") != step or type(manifest.get("step")) is not int:
        raise _fail(where, f"records step {manifest.get('step')!r}, but its directory is step {step}")
    run = manifest.get("run")
    if run is not None and (not isinstance(run, str) or RUN_ID_PATTERN.fullmatch(run) is None):
        raise _fail(where, f"records a malformed run identity {describe(run)}")
    files, contents = manifest.get("files"), manifest.get("contents")
    if not isinstance(files, dict) or not isinstance(contents, dict) or set(contents) != set(_PART_FILES):
        raise _fail(where, "lacks a valid 'files' or 'contents' section")
    for name, entry in files.items():
        if not isinstance(name, str) or not known(name):
            raise _fail(
                where, f"lists {name!r}, which is not {kind} name (paths and unknown names are refused)"
            )
        valid = (
            isinstance(entry, dict)
            and isinstance(entry.get("sha256"), str)
            and _SHA256.fullmatch(entry["sha256"]) is not None
            and type(entry.get("bytes")) is int
            and 0 <= entry["bytes"] <= 2**50
        )
        if not valid:
            raise _fail(where, f"has a malformed entry for {name!r} (needs 'sha256' hex and 'bytes')")
    return manifest


def _parse_manifest(data: bytes, step: int, where: str) -> dict[str, Any]:
    """Parse and validate ``manifest.json``: format, step, known file names only, hashes, sizes, contents."""
    manifest = _parse_manifest_common(data, step, where, _FILES.__contains__, "a checkpoint file")
    files, contents = manifest["files"], manifest["contents"]
    _check_module_record(where, "model", contents["model"])
    expected = {name for part, names in _PART_FILES.items() if contents[part] is not None for name in names}
    if set(files) != expected:
        missing, extra = sorted(expected - set(files)), sorted(set(files) - expected)
        raise _fail(
            where, f"lists files inconsistent with its contents (missing {missing}, unexpected {extra})"
        )
    if contents["ref_model"] is not None:
        _check_module_record(where, "ref_model", contents["ref_model"])
    for part in ("optimizer", "scheduler"):
        record = contents[part]
        if record is not None and not (isinstance(record, dict) and isinstance(record.get("class"), str)):
            raise _fail(where, f"has a malformed contents[{part!r}] entry")
    rng = contents["rng"]
    if rng is not None and not (isinstance(rng, dict) and type(rng.get("cuda_devices")) is int):
        raise _fail(where, "has a malformed contents['rng'] entry")
    return manifest


def _safetensors(where: str, name: str, data: bytes) -> dict[str, torch.Tensor]:
    try:
        return safetensors.torch.load(data)
    except Exception as error:
        path = os.path.join(where, name)
        msg = f"checkpoint file {path} is not a valid safetensors file ({error}); nothing was restored."
        raise CheckpointError(msg) from None


def _torch_state(where: str, name: str, data: bytes) -> Any:
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as error:
        msg = (
            f"checkpoint file {os.path.join(where, name)} could not be loaded with weights_only=True "
            f"({error}); "
            "nothing was restored."
        )
        raise CheckpointError(msg) from None


def _json_file(where: str, name: str, data: bytes) -> Any:
    try:
        return load_json(data)
    except ValueError as error:
        msg = (
            f"checkpoint file {os.path.join(where, name)} is not valid JSON ({error}); nothing was restored."
        )
        raise CheckpointError(msg) from None


def _decode(
    where: str, manifest: Mapping[str, Any], read: Callable[[str], bytes], loaded: Collection[str]
) -> Snapshot:
    contents = manifest["contents"]

    def module(part: str, file_name: str) -> ModuleState | None:
        record = contents[part]
        if record is None or file_name not in loaded:
            return None
        tensors = _safetensors(where, file_name, read(file_name))
        return ModuleState(
            record["kind"], record["class"], tensors, dict(record["aliases"]), tuple(record["adapters"])
        )

    def torch_part(part: str, file_name: str) -> TorchState | None:
        record = contents[part]
        if record is None or file_name not in loaded:
            return None
        return TorchState(record["class"], _torch_state(where, file_name, read(file_name)))

    def json_part(file_name: str) -> Any:
        return _json_file(where, file_name, read(file_name))

    model = module("model", "model.safetensors")
    if model is None:  # pragma: no cover - the manifest check guarantees a model file
        raise _fail(where, "holds no model")
    rng = None
    if contents["rng"] is not None and "rng.json" in loaded:
        rng = RngState.from_files(
            os.path.join(where, "rng.json"),
            json_part("rng.json"),
            _safetensors(where, "rng.safetensors", read("rng.safetensors")),
        )
    rollout = None
    if contents["rollout_buffer"] is not None:
        rollout = _decode_rollout(
            where,
            json_part("rollout_buffer.json"),
            _safetensors(where, "rollout_buffer.safetensors", read("rollout_buffer.safetensors")),
        )
    extra = None
    if contents["extra_state"] is not None:
        extra = json_part("extra_state.json")
        if not isinstance(extra, dict):
            raise _fail(os.path.join(where, "extra_state.json"), "does not hold a JSON object")
    return Snapshot(
        step=manifest["step"],
        created=str(manifest.get("created", "")),
        model=model,
        ref_model=module("ref_model", "ref_model.safetensors"),
        optimizer=torch_part("optimizer", "optimizer.pt"),
        scheduler=torch_part("scheduler", "scheduler.pt"),
        rng=rng,
        rollout=rollout,
        extra_state=extra,
    )


def _decode_rollout(where: str, document: Any, tensors: dict[str, torch.Tensor]) -> RolloutState:
    file_where = os.path.join(where, "rollout_buffer.json")
    if not isinstance(document, dict) or not isinstance(document.get("order"), list):
        raise _fail(file_where, "does not hold {'order': [...], 'metadata': {...}}")
    order, metadata = document["order"], document.get("metadata")
    if (
        not isinstance(metadata, dict)
        or set(order) != set(tensors) | set(metadata)
        or set(tensors) & set(metadata)
    ):
        raise _fail(file_where, "does not match rollout_buffer.safetensors (keys differ)")
    if len(order) != len(set(order)) or not all(isinstance(key, str) for key in order):
        raise _fail(file_where, "has a malformed key order")
    return RolloutState(tuple(order), tensors, metadata)
