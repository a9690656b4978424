"""Sharded checkpoints: what every rank writes and reads through ``torch.distributed.checkpoint`` (DCP).

A policy whose parameters are DTensors (FSDP2's ``fully_shard``, tensor parallelism) has no process that
holds it whole, so :class:`~loopguard.checkpoint.CheckpointManager` saves and restores it with every rank
together, through DCP's ``get_state_dict`` / ``set_state_dict`` and its file-system storage. A sharded
checkpoint directory is flat, like an unsharded one::

    step-00000100/
      manifest.json             written last, by rank 0, once every rank's files are written and hashed
      .metadata                 DCP's global plan (rank 0)
      __<rank>_0.distcp         each rank's shards of the model, the optimizer state and the reference model
      optimizer.pt              the optimizer's non-tensor part (param groups), torch.save (rank 0)
      scheduler.pt              the LR scheduler (rank 0)
      rng-<rank>.json, rng-<rank>.safetensors   each rank's RNG states (its own generators)
      extra_state.json          e.g. Guard.state_dict() (rank 0)

What is checked: every file is hashed (SHA-256) by the rank that wrote it, in parallel, after DCP has
``fsync``-ed it; the hashes reach rank 0, which writes the manifest and renames the directory into place, so a
``step-N`` directory exists only when every rank's shards are complete. A restore verifies every listed file
(each rank hashes its share of them, in parallel) and the saved keys, shapes and dtypes against the live
state before DCP reads anything into the live model; only then are the parameters and the optimizer state
loaded, by every rank together. Every phase ends with an agreement: a failure on one rank raises on all of
them, so no rank is left waiting in a collective and no rank restores alone.

Two things differ from an unsharded checkpoint, both DCP's design: DCP's ``.metadata`` is a pickle (it is
opened only after its hash matched the manifest, so a corrupted file is refused, but a store that someone
untrusted can write is not safe to restore from, as with any DCP checkpoint); and the bytes DCP reads are
read again after they were hashed (a file changed between the two reads is not detected). Tensors only go
through DCP: the optimizer's param groups are saved apart and loaded with ``torch.load(weights_only=True)``,
so DCP never unpickles a value.

References:
    PyTorch, ``torch.distributed.checkpoint`` (DCP) and FSDP2 (``fully_shard``) documentation.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any, cast

import attrs
import torch

from loopguard.checkpoint._io import hash_file, read_verified
from loopguard.exceptions import CheckpointError, ConfigError

__all__ = [
    "DCP_METADATA",
    "ENGINE",
    "Ranks",
    "TensorState",
    "capture",
    "check_saved_keys",
    "engine_of",
    "file_rank",
    "fsdp1_wrapped",
    "hash_own_files",
    "inner_optimizer",
    "is_deepspeed",
    "is_sharded",
    "load",
    "rng_names",
    "sharded_file",
    "unsaveable",
    "verify_share",
    "zero3_partitioned",
]

ENGINE = "dcp"
DEEPSPEED = "deepspeed"
DCP_METADATA = ".metadata"
DEEPSPEED_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")
"""DeepSpeed's recovery scripts, copied beside every ``save_checkpoint``: not part of a checkpoint."""
_DCP_FILE = re.compile(r"__(\d+)_(\d+)\.distcp")
_DS_FILE = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_(?:model|optim)_states\.pt")
_DS_MAIN_FILE = re.compile(r"mp_rank_\d+_model_states\.pt")
_RNG_FILE = re.compile(r"rng-(\d{5})\.(?:json|safetensors)")
_SHARED_FILES = frozenset({DCP_METADATA, "optimizer.pt", "scheduler.pt", "extra_state.json"})


def is_sharded(module: object) -> bool:
    """Whether ``module`` has a DTensor parameter (FSDP2, tensor parallel): its checkpoint is sharded."""
    return isinstance(module, torch.nn.Module) and _holds(_walk(module)[1], _dtensor_type())


def _walk(module: torch.nn.Module) -> tuple[list[torch.nn.Module], list[torch.Tensor]]:
    """``module`` and its submodules, and their parameters (a shared one may come twice), in one walk.

    What decides how a module is checkpointed is read from these lists, once per check: a rollback store
    checks its policy at every save, where walking the modules once per question cost more than the copy of
    a small model.
    """
    modules = list(module.modules())
    return modules, [p for child in modules for p in child._parameters.values() if p is not None]


def _holds(objects: list[Any], kind: type | None) -> bool:
    """Whether any of ``objects`` is a ``kind`` (its class or a subclass), read from their few types."""
    return kind is not None and any(issubclass(found, kind) for found in set(map(type, objects)))


@functools.cache
def _dtensor_type() -> type | None:
    if not torch.distributed.is_available():
        return None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.5: no public DTensor, so no FSDP2 either
        return None
    return DTensor


@functools.cache
def _fsdp1_type() -> type | None:
    if not torch.distributed.is_available():
        return None
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover - every torch that loopguard supports has it
        return None
    return FullyShardedDataParallel


def is_deepspeed(model: object) -> bool:
    """Whether ``model`` is a DeepSpeed engine (what ``deepspeed.initialize`` returns first)."""
    return (
        isinstance(model, torch.nn.Module)
        and callable(getattr(model, "save_checkpoint", None))
        and callable(getattr(model, "load_checkpoint", None))
        and callable(getattr(model, "zero_optimization_stage", None))
    )


def fsdp1_wrapped(module: object) -> bool:
    """Whether ``module`` is or holds an FSDP1 ``FullyShardedDataParallel`` wrapper (flat, sharded state)."""
    return isinstance(module, torch.nn.Module) and _holds(_walk(module)[0], _fsdp1_type())


def zero3_partitioned(module: object) -> bool:
    """Whether ``module``'s parameters are partitioned by DeepSpeed ZeRO-3 (each carries a ``ds_id``)."""
    return isinstance(module, torch.nn.Module) and _partitioned(_walk(module)[1])


def _partitioned(parameters: list[torch.Tensor]) -> bool:
    return any(hasattr(parameter, "ds_id") for parameter in parameters)


def unsaveable(model: object) -> str | None:
    """Why one process cannot save ``model`` (``"fsdp1"``, ``"zero3"``), or None; one walk of its modules.

    A DeepSpeed engine and a DTensor model are saved by their own engines (None).
    """
    return route(model)[1]


def engine_of(model: object) -> str | None:
    """The engine a checkpoint of ``model`` goes through: ``"deepspeed"``, ``"dcp"`` (DTensors) or None."""
    return route(model)[0]


def route(model: object) -> tuple[str | None, str | None]:
    """:func:`engine_of` and :func:`unsaveable` of ``model``, read from one walk of its modules."""
    if is_deepspeed(model):
        return DEEPSPEED, None
    if not isinstance(model, torch.nn.Module):
        return None, None
    modules, parameters = _walk(model)
    if _holds(parameters, _dtensor_type()):
        return ENGINE, None
    if _holds(modules, _fsdp1_type()):
        return None, "fsdp1"
    return None, "zero3" if _partitioned(parameters) else None


def rng_names(rank: int) -> tuple[str, str]:
    """The files holding ``rank``'s RNG states."""
    return f"rng-{rank:05d}.json", f"rng-{rank:05d}.safetensors"


def file_rank(name: str) -> int | None:
    """The rank that wrote shard file ``name``, or None for loopguard's own files.

    DCP's ``__<rank>_<n>.distcp`` and DeepSpeed's ``zero_pp_rank_<rank>_...`` belong to that rank; DCP's
    ``.metadata`` and DeepSpeed's ``mp_rank_<n>_model_states.pt`` to rank 0, which alone writes them.
    """
    for pattern in (_DCP_FILE, _DS_FILE):
        match = pattern.fullmatch(name)
        if match is not None:
            return int(match.group(1))
    return 0 if name == DCP_METADATA or _DS_MAIN_FILE.fullmatch(name) else None


def sharded_file(name: str) -> bool:
    """Whether ``name`` may appear in a sharded checkpoint (besides ``manifest.json``)."""
    return name in _SHARED_FILES or _RNG_FILE.fullmatch(name) is not None or file_rank(name) is not None


class Ranks:
    """The default process group, and agreement on every phase of a collective save or restore."""

    def __init__(self) -> None:
        """Read the rank and world size (a process group must be initialised)."""
        import torch.distributed as dist

        if not dist.is_initialized():
            msg = (
                "a sharded model (DTensor parameters) is saved and restored by every rank together: "
                "torch.distributed must be initialised first."
            )
            raise ConfigError(msg)
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self._dist = dist

    @property
    def main(self) -> bool:
        """Whether this is rank 0, which writes the manifest, the index and the shared files."""
        return self.rank == 0

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (picklable), in rank order, on every rank."""
        values: list[Any] = [None] * self.world
        self._dist.all_gather_object(values, value)
        return values

    def share(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        box = [value if self.main else None]
        self._dist.broadcast_object_list(box, src=0)
        return box[0]

    def agree(self, error: BaseException | None, doing: str) -> None:
        """Raise on every rank when ``doing`` failed on any: the failing rank re-raises its own error."""
        report = None if error is None else f"{type(error).__name__}: {error}"
        failed = [(rank, text) for rank, text in enumerate(self.gather(report)) if text is not None]
        if error is not None:
            raise error
        if failed:
            rank, text = failed[0]
            msg = f"{doing} failed on rank {rank} ({text}); it failed on every rank."
            raise CheckpointError(msg)


def inner_optimizer(value: Any) -> Any:
    """The torch optimizer inside a wrapper such as Accelerate's ``AcceleratedOptimizer``."""
    inner = getattr(value, "optimizer", None)
    return inner if isinstance(inner, torch.optim.Optimizer) else value


@attrs.frozen(eq=False)
class TensorState:
    """One rank's view of a sharded checkpoint's tensors, and the optimizer's non-tensor part.

    Attributes:
        tensors: ``{"model": ..., "optimizer": {"state": ...}, "ref_model": ...}``: only tensors (DTensor
            shards, or plain tensors every rank holds alike), nested as DCP saves and loads them.
        optimizer_skeleton: The optimizer's param groups and non-tensor state values (keyed by parameter
            name), or its plain ``state_dict()`` when it holds no state yet (``optimizer_empty``); None
            without an optimizer.
        optimizer_empty: The optimizer had taken no step (no state): nothing of it goes through DCP.
    """

    tensors: dict[str, Any]
    optimizer_skeleton: Any
    optimizer_empty: bool


def capture(
    model: torch.nn.Module,
    optimizer: Any,
    ref_model: torch.nn.Module | None,
    *,
    optimizer_state: bool | None = None,
) -> TensorState:
    """The live state as DCP saves it: references to the live tensors, nothing copied.

    ``optimizer_state=None`` (a save): an optimizer that has taken no step is captured by its plain
    ``state_dict()`` (DCP's ``get_optimizer_state_dict`` would give it state with a zero-gradient step, which
    changes Adam's step count in the user's run). ``True`` (a restore of saved optimizer state): DCP's
    ``get_optimizer_state_dict`` always, so the live state has the saved structure to load into (an empty
    optimizer is given state first; all of it is then overwritten). ``False``: the plain ``state_dict()``.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    tensors: dict[str, Any] = {"model": get_model_state_dict(model)}
    skeleton: Any = None
    empty = False
    if optimizer is not None:
        inner = inner_optimizer(optimizer)
        if optimizer_state is False or (optimizer_state is None and not inner.state):
            skeleton, empty = inner.state_dict(), True
        else:
            # DCP gives an optimizer without state its state only when no parameter has a gradient: set
            # them aside for that (a restore overwrites all of it), then put them back
            stashed = [(p, p.grad) for group in inner.param_groups for p in group["params"]]
            if not inner.state:
                for parameter, _ in stashed:
                    parameter.grad = None
            try:
                full = cast(dict[str, Any], get_optimizer_state_dict(model, inner))
            finally:
                for parameter, grad in stashed:
                    parameter.grad = grad
            state_tensors: dict[str, dict[str, Any]] = {}
            state_rest: dict[str, dict[str, Any]] = {}
            for name, entries in full["state"].items():
                state_tensors[name] = {k: v for k, v in entries.items() if isinstance(v, torch.Tensor)}
                state_rest[name] = {k: v for k, v in entries.items() if not isinstance(v, torch.Tensor)}
            tensors["optimizer"] = {"state": state_tensors}
            skeleton = {"state": state_rest, "param_groups": full["param_groups"]}
    if ref_model is not None:
        tensors["ref_model"] = get_model_state_dict(ref_model)
    return TensorState(tensors, skeleton, empty)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """``(key, tensor)`` with DCP's flattened keys (path parts joined by ``.``)."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from flatten(value, f"{path}.")
        else:
            yield path, value


def check_saved_keys(where: str, tensors: Mapping[str, Any], metadata: Any) -> None:
    """Refuse a checkpoint whose DCP metadata lacks a live key or saved it with another shape or dtype.

    Raises:
        CheckpointError: naming the first few mismatches (nothing live has been modified yet).
    """
    saved = metadata.state_dict_metadata
    problems = []
    for key, tensor in flatten(tensors):
        entry = saved.get(key)
        size = getattr(entry, "size", None)
        dtype = getattr(getattr(entry, "properties", None), "dtype", None)
        if entry is None:
            problems.append(f"{key!r} is not saved")
        elif size is None or tuple(size) != tuple(tensor.shape):
            problems.append(f"{key!r} has shape {list(size or ())}, the live one {list(tensor.shape)}")
        elif dtype != tensor.dtype:
            problems.append(f"{key!r} has dtype {dtype}, the live one {tensor.dtype}")
    if problems:
        shown = "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
        msg = f"{where} does not fit the live model or optimizer: {shown}; nothing was restored."
        raise CheckpointError(msg)


def load(
    model: torch.nn.Module,
    optimizer: Any,
    ref_model: torch.nn.Module | None,
    target: TensorState,
    skeleton: Any,
    *,
    skeleton_empty: bool,
) -> None:
    """Hand the tensors DCP has read into ``target`` (and the saved ``skeleton``) to the live objects."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    set_model_state_dict(model, target.tensors["model"])
    if ref_model is not None:
        set_model_state_dict(ref_model, target.tensors["ref_model"])
    if optimizer is None:
        return
    inner = inner_optimizer(optimizer)
    if skeleton_empty:
        inner.load_state_dict(skeleton)  # no step taken when saved: the state is emptied, the groups restored
        return
    state = {
        name: {**skeleton["state"].get(name, {}), **entries}
        for name, entries in target.tensors["optimizer"]["state"].items()
    }
    full: Any = {"state": state, "param_groups": skeleton["param_groups"]}
    set_optimizer_state_dict(model, inner, full)


def hash_own_files(dir_fd: int, where: str, rank: int) -> dict[str, dict[str, Any]]:
    """Hash the files ``rank`` wrote into a sharded checkpoint: its shards (rank 0: also the shared plan)."""
    names = sorted(name for name in os.listdir(dir_fd) if file_rank(name) == rank)
    return {name: hash_file(dir_fd, name, os.path.join(where, name)) for name in names}


def verify_share(
    dir_fd: int, where: str, files: Mapping[str, Mapping[str, Any]], rank: int, world: int
) -> None:
    """Verify this rank's share of a checkpoint's files (every ``world``-th by name), alongside the others.

    Raises:
        CheckpointError: a file is missing, not regular, of the wrong size or hash.
    """
    for index, name in enumerate(sorted(files)):
        if index % world == rank:
            entry = files[name]
            read_verified(
                dir_fd, name, entry["bytes"], entry["sha256"], os.path.join(where, name), keep=False
            )
