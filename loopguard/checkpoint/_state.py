"""What a checkpoint holds, captured from live objects and applied back to them.

:class:`Snapshot` is the in-memory form of one checkpoint, whether it came from disk (decoded from verified
files) or lives in memory (CPU clones). Capturing validates everything a later restore will need, so a save
that succeeds can always be restored: tensors dense and of a safetensors dtype, optimizer and scheduler
states made only of the plain types ``torch.load(weights_only=True)`` accepts, JSON values JSON-only.
Applying first checks that the saved state fits the live objects (keys, shapes, dtypes, classes, group
sizes, RNG states on throwaway generators) and only then touches anything.
"""

from __future__ import annotations

import collections
import itertools
import json
import math
import random
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Protocol, cast

import attrs
import numpy as np
import torch

from loopguard._validation import describe, finite_floats
from loopguard.checkpoint._io import SAFETENSORS_DTYPES, CheckpointError
from loopguard.exceptions import ConfigError, LoopguardTypeError

__all__ = [
    "MAX_ROLLOUT_ENTRIES",
    "MAX_ROLLOUT_KEY_LENGTH",
    "ModuleState",
    "RngState",
    "RolloutState",
    "Snapshot",
    "Stateful",
    "TorchState",
    "apply_module",
    "apply_snapshot",
    "capture_module",
    "check_json",
    "check_torch_state",
    "clone_tree",
    "json_copy",
    "peft_module",
    "prepare_module",
    "tensor_problem",
    "unwrapped_class",
]

MAX_ROLLOUT_ENTRIES = 10_000
MAX_ROLLOUT_KEY_LENGTH = 256
MAX_DEPTH = 64
_NUMPY_BIT_GENERATORS = ("MT19937", "PCG64", "PCG64DXSM", "Philox", "SFC64")
_TORCH_LEAVES = (str, bytes, int, float, complex, bool, type(None), torch.Size, torch.dtype, torch.device)
_TORCH_CONTAINERS = (dict, collections.OrderedDict, list, tuple, set)
_JSON_RULE = "a JSON value (dict with str keys, list, str, int, finite float, bool or None)"


class Stateful(Protocol):
    """Anything with ``state_dict()`` and ``load_state_dict()``: optimizers and LR schedulers."""

    def state_dict(self) -> Any:
        """Return the object's state."""

    def load_state_dict(self, state_dict: Any) -> Any:
        """Load a state returned by :meth:`state_dict`."""


# ------------------------------------------------------------------------------------------------ values


def tensor_problem(tensor: object) -> str | None:
    """Why ``tensor`` cannot go into a safetensors file, or ``None`` if it can."""
    if not isinstance(tensor, torch.Tensor) or type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        return f"a {type(tensor).__name__}, not a plain torch.Tensor"
    if tensor.layout != torch.strided:
        return f"a {tensor.layout} tensor (only dense tensors are saved)"
    if tensor.is_meta:
        return "a tensor on the meta device (not materialised)"
    if tensor.dtype not in SAFETENSORS_DTYPES:
        return f"a tensor of dtype {tensor.dtype} (safetensors dtypes only)"
    return None


def _plain_json(value: object, depth: int) -> bool:
    """Whether ``value`` is plainly valid for :func:`check_json` (exact types only; no paths built)."""
    kind = type(value)
    if kind is list or kind is dict:
        return depth < MAX_DEPTH and _plain_container(value, depth)
    if kind is float:
        return math.isfinite(cast(float, value))
    return value is None or kind is str or kind is int or kind is bool


def _plain_container(value: object, depth: int) -> bool:
    """:func:`_plain_json` of a list or dict, its leaves read by the interpreter's own loops where it can.

    The bulk of a Guard's state is lists (and lists of lists) of floats, its samples: their item types are
    read as one set, their finiteness by :func:`~loopguard._validation.finite_floats`.
    """
    items: Any = value
    if type(value) is dict:
        if value and set(map(type, value)) != {str}:
            return False
        items = value.values()
    kinds = set(map(type, items))
    if kinds == {list}:  # rows of a matrix: read as one list of their items, a level deeper
        rows = list(itertools.chain.from_iterable(items))
        return depth + 1 < MAX_DEPTH and _plain_container(rows, depth + 1)
    if kinds <= _JSON_LEAVES:
        return finite_floats(items, kinds)
    for item in items:
        kind = type(item)
        if kind is list or kind is dict:
            if depth + 1 >= MAX_DEPTH or not _plain_container(item, depth + 1):
                return False
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif kind not in _JSON_LEAVES:
            return False
    return True


def check_json(name: str, value: object, depth: int = 0) -> None:
    """Check that ``value`` is JSON made of dict/list/str/int/finite float/bool/None (tuples rejected).

    A state of plain types is accepted in one pass that builds no paths (the mitigator's state is checked
    at every checkpoint); anything else is walked again with paths, so that an error names where it is.

    Raises:
        LoopguardTypeError: a value of another type; the message names its path.
        ConfigError: a NaN or infinite float, or nesting deeper than 64 levels.
    """
    if depth == 0 and _plain_json(value, 0):
        return
    if depth > MAX_DEPTH:
        msg = f"`{name}` must be nested at most {MAX_DEPTH} levels deep."
        raise ConfigError(msg)
    if value is None or isinstance(value, (bool, str)) or type(value) is int:
        return
    if type(value) is float:
        if not math.isfinite(value):
            msg = f"`{name}` must be finite (JSON has no NaN or Infinity), got {value!r}."
            raise ConfigError(msg)
        return
    if type(value) is list:
        for index, item in enumerate(value):
            check_json(f"{name}[{index}]", item, depth + 1)
        return
    if type(value) is dict:
        for key, item in value.items():
            if not isinstance(key, str):
                msg = f"`{name}` must have str keys (JSON objects), got key {describe(key)}."
                raise LoopguardTypeError(msg)
            check_json(f"{name}[{key!r}]", item, depth + 1)
        return
    hint = " (use a list: JSON has no tuples)" if isinstance(value, tuple) else ""
    msg = f"`{name}` must be {_JSON_RULE}, got {type(value).__name__} {describe(value)}{hint}."
    raise LoopguardTypeError(msg)


def check_torch_state(name: str, value: object, depth: int = 0) -> None:
    """Check that ``value`` holds only what ``torch.load(weights_only=True)`` can restore.

    Allowed: dict, OrderedDict, list, tuple, set, str, bytes, int, float, complex, bool, None,
    ``torch.Size``, ``torch.dtype``, ``torch.device`` and dense tensors (exact types: subclasses such as
    named tuples would need unpickling).
    """
    _check_torch_state(value, depth, (name,))


# where an entry lies: (name,) at the top, else (the parent's path, its key or index); the text is made only
# for an error, so a restorable tree is read without formatting a name for every entry
_Path = tuple[Any, ...]


def _path_name(path: _Path) -> str:
    keys: list[object] = []
    while len(path) == 2:
        path, key = path
        keys.append(key)
    return str(path[0]) + "".join(f"[{key!r}]" for key in reversed(keys))


def _check_torch_state(value: object, depth: int, path: _Path) -> None:
    if depth > MAX_DEPTH:
        msg = f"`{_path_name(path)}` must be nested at most {MAX_DEPTH} levels deep."
        raise ConfigError(msg)
    kind = type(value)
    if kind in _TORCH_LEAVES:
        return
    if isinstance(value, torch.Tensor):
        problem = tensor_problem(value)
        if problem is not None and not problem.startswith("a tensor of dtype"):
            msg = f"`{_path_name(path)}` is {problem}; it cannot be saved."
            raise LoopguardTypeError(msg)
        return
    if isinstance(value, dict) and kind in (dict, collections.OrderedDict):
        for key, item in value.items():
            if type(key) not in _TORCH_LEAVES:
                msg = (
                    f"`{_path_name(path)}` has a key of type {type(key).__name__} {describe(key)}; it cannot "
                    "be saved."
                )
                raise LoopguardTypeError(msg)
            _check_torch_state(item, depth + 1, (path, key))
        return
    if isinstance(value, (list, tuple, set)) and kind in (list, tuple, set):
        for index, item in enumerate(value):
            _check_torch_state(item, depth + 1, (path, index))
        return
    msg = (
        f"`{_path_name(path)}` holds a {kind.__name__} ({describe(value)}), which "
        "torch.load(weights_only=True) cannot restore: checkpoints never unpickle arbitrary objects."
    )
    raise LoopguardTypeError(msg)


def clone_tree(value: Any) -> Any:
    """Deep-copy a torch-state tree, cloning tensors to CPU (leaves are immutable and shared)."""
    if isinstance(value, torch.Tensor):
        # a state_dict's tensors are already detached: one copy, without a detached view made first
        tensor = value.detach() if value.requires_grad else value
        return tensor.clone() if tensor.is_cpu else tensor.to("cpu", copy=True)  # clone: the same, cheaper
    if isinstance(value, dict):
        return type(value)((key, clone_tree(item)) for key, item in value.items())
    if isinstance(value, list):
        return [clone_tree(item) for item in value]
    if isinstance(value, tuple):
        return tuple(clone_tree(item) for item in value)
    if isinstance(value, set):
        return {clone_tree(item) for item in value}
    return value


_JSON_LEAVES = frozenset((str, int, float, bool, type(None)))


def json_copy(value: Any) -> Any:
    """A deep copy of a JSON value that :func:`check_json` accepted (no aliasing with the caller).

    Containers are rebuilt and the immutable leaves shared, in one walk: the mitigator's state (tens of
    kilobytes) is copied at every rollback checkpoint, where a text round trip cost several times more.
    Anything else takes that round trip (tuples become lists, as in JSON).
    """
    kind = type(value)
    if kind is dict:
        if set(map(type, value.values())) <= _JSON_LEAVES:
            return dict(value)
        return {key: item if type(item) in _JSON_LEAVES else json_copy(item) for key, item in value.items()}
    if kind is list:
        if set(map(type, value)) <= _JSON_LEAVES:
            return list(value)
        return [item if type(item) in _JSON_LEAVES else json_copy(item) for item in value]
    if kind in _JSON_LEAVES:
        return value
    return json.loads(json.dumps(value))


def unwrapped_class(value: object, attribute: str) -> str:
    """The class name of ``value``, looking through wrappers such as accelerate's ``AcceleratedOptimizer``."""
    inner = getattr(value, attribute, None)
    if inner is not None and hasattr(inner, "state_dict") and hasattr(inner, "load_state_dict"):
        return type(inner).__name__
    return type(value).__name__


# ------------------------------------------------------------------------------------------------ modules


def peft_module(model: object) -> Any | None:
    """The ``peft`` package if ``model`` is a ``peft.PeftModel`` (never imports peft), else ``None``."""
    peft = sys.modules.get("peft")
    peft_model = getattr(peft, "PeftModel", None)
    if isinstance(peft_model, type) and isinstance(model, peft_model):
        return peft
    return None


@attrs.frozen
class ModuleState:
    """A module's saved tensors: the full ``state_dict`` or, for a PEFT model, only its adapters.

    ``tensors`` holds one entry per distinct tensor; ``aliases`` maps a tied name (``lm_head.weight``) to the
    name it shares storage with, so tied weights are stored once. For a PEFT model the keys are
    ``"<adapter index>:<peft key>"`` with the adapter names in ``adapters``.
    """

    kind: str
    class_name: str
    tensors: dict[str, torch.Tensor]
    aliases: dict[str, str]
    adapters: tuple[str, ...]

    def record(self) -> dict[str, Any]:
        """The manifest entry (everything but the tensors)."""
        return {
            "kind": self.kind,
            "class": self.class_name,
            "aliases": dict(sorted(self.aliases.items())),
            "adapters": list(self.adapters),
        }

    def cloned(self) -> ModuleState:
        """A copy with every tensor cloned to CPU."""
        return attrs.evolve(self, tensors={key: clone_tree(value) for key, value in self.tensors.items()})


def _split_aliases(tensors: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[Any, ...], str] = {}
    for name, tensor in tensors.items():
        pointer = tensor.untyped_storage().data_ptr()
        key = (
            tensor.device,
            pointer,
            tensor.storage_offset(),
            tuple(tensor.shape),
            tensor.stride(),
            tensor.dtype,
        )
        if pointer != 0 and tensor.numel() and key in seen:
            aliases[name] = seen[key]
        else:
            seen[key] = name
            unique[name] = tensor
    return unique, aliases


def capture_module(argument: str, model: object) -> ModuleState:
    """Capture ``model``'s weights (adapters only for a PEFT model) without copying them.

    Raises:
        LoopguardTypeError: ``model`` is not a ``torch.nn.Module`` or holds a tensor that cannot be saved.
    """
    if not isinstance(model, torch.nn.Module):
        msg = f"`{argument}` must be a torch.nn.Module, got {type(model).__name__}."
        raise LoopguardTypeError(msg)
    peft = peft_module(model)
    tensors: dict[str, torch.Tensor] = {}
    adapters: tuple[str, ...] = ()
    if peft is not None:
        config: Any = model.peft_config
        adapters = tuple(str(name) for name in config)
        for index, adapter in enumerate(adapters):
            for key, value in peft.get_peft_model_state_dict(model, adapter_name=adapter).items():
                tensors[f"{index}:{key}"] = value
    else:
        tensors = dict(model.state_dict())
    for key, value in tensors.items():
        problem = tensor_problem(value)
        if problem is not None:
            msg = f"`{argument}` has {problem} at {key!r}; it cannot be saved."
            raise LoopguardTypeError(msg)
    unique, aliases = _split_aliases(tensors)
    kind = "full" if peft is None else "peft_adapter"
    return ModuleState(kind, type(model).__name__, unique, aliases, adapters)


def _names(names: list[str]) -> str:
    shown = ", ".join(repr(name) for name in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _compare(where: str, argument: str, saved: Mapping[str, torch.Tensor], live: Mapping[str, Any]) -> None:
    missing = sorted(set(live) - set(saved))
    unexpected = sorted(set(saved) - set(live))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"`{argument}` has {_names(missing)} that the checkpoint lacks")
        if unexpected:
            parts.append(f"the checkpoint has {_names(unexpected)} that `{argument}` lacks")
        msg = f"{where} does not match `{argument}`: {'; '.join(parts)}; nothing was restored."
        raise CheckpointError(msg)
    for key, target in live.items():  # the live model's order: the first mismatch a reader would look for
        tensor = saved[key]
        if tuple(tensor.shape) != tuple(target.shape) or tensor.dtype != target.dtype:
            msg = (
                f"{where} does not match `{argument}` at {key!r}: "
                f"saved {tuple(tensor.shape)} {tensor.dtype}, "
                f"live {tuple(target.shape)} {target.dtype}; nothing was restored."
            )
            raise CheckpointError(msg)


def prepare_module(where: str, argument: str, saved: ModuleState, model: object) -> dict[str, dict[str, Any]]:
    """Check ``saved`` against the live ``model`` and return what :func:`apply_module` loads.

    Returns:
        ``{"": full_state_dict}`` for a plain module, ``{adapter: adapter_state_dict}`` for a PEFT model.

    Raises:
        CheckpointError: another kind of model, different keys, shapes or dtypes.
    """
    if not isinstance(model, torch.nn.Module):
        msg = f"`{argument}` must be a torch.nn.Module, got {type(model).__name__}."
        raise LoopguardTypeError(msg)
    for alias, target in saved.aliases.items():
        if target not in saved.tensors:
            msg = f"{where} is malformed: tied tensor {alias!r} points at missing {target!r}."
            raise CheckpointError(msg)
    full = dict(saved.tensors)
    full.update({alias: saved.tensors[target] for alias, target in saved.aliases.items()})
    peft = peft_module(model)
    live_kind = "full" if peft is None else "peft_adapter"
    if saved.kind != live_kind:
        described = {"full": "a full model", "peft_adapter": "PEFT adapter weights"}
        msg = (
            f"{where} holds {described.get(saved.kind, saved.kind)}, but `{argument}` is "
            f"{'a PEFT model' if peft is not None else 'not a PEFT model'}; nothing was restored."
        )
        raise CheckpointError(msg)
    if peft is None:
        _compare(where, argument, full, model.state_dict())
        return {"": full}
    config: Any = model.peft_config
    live_adapters = tuple(str(name) for name in config)
    if live_adapters != saved.adapters:
        msg = f"{where} holds adapters {list(saved.adapters)}, `{argument}` has {list(live_adapters)}."
        raise CheckpointError(msg)
    prepared: dict[str, dict[str, Any]] = {}
    for index, adapter in enumerate(saved.adapters):
        prefix = f"{index}:"
        state = {key[len(prefix) :]: value for key, value in full.items() if key.startswith(prefix)}
        _compare(where, argument, state, peft.get_peft_model_state_dict(model, adapter_name=adapter))
        prepared[adapter] = state
    unknown = [key for key in full if not key.split(":", 1)[0].isdigit()]
    if unknown or sum(len(state) for state in prepared.values()) != len(full):
        msg = f"{where} holds tensors of no adapter: {_names(sorted(unknown) or sorted(full))}."
        raise CheckpointError(msg)
    return prepared


def apply_module(prepared: Mapping[str, Mapping[str, Any]], model: torch.nn.Module) -> None:
    """Copy prepared (already checked) tensors into ``model``."""
    peft = peft_module(model)
    if peft is None:
        model.load_state_dict(prepared[""], strict=True)
        return
    for adapter, state in prepared.items():
        peft.set_peft_model_state_dict(model, dict(state), adapter_name=adapter)


# ------------------------------------------------------------------------------------------------ RNG


@attrs.frozen(eq=False)
class RngState:
    """Python ``random``, numpy's global, torch's CPU generator and each CUDA device's generator."""

    python: tuple[Any, ...]
    numpy: dict[str, Any]
    torch_cpu: torch.Tensor
    cuda: tuple[torch.Tensor, ...]

    @classmethod
    def capture(cls) -> RngState:
        """Read the global generators (CUDA only when it is already initialised in this process)."""
        cuda: tuple[torch.Tensor, ...] = ()
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            cuda = tuple(state.clone() for state in torch.cuda.get_rng_state_all())
        numpy_state: dict[str, Any] = np.random.get_state(legacy=False)  # noqa: NPY002
        return cls(random.getstate(), _copy_numpy_state(numpy_state), torch.get_rng_state(), cuda)

    def to_json(self) -> dict[str, Any]:
        """The python and numpy states as JSON (torch states go to safetensors)."""
        version, internal, gauss_next = self.python
        return {
            "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
            "numpy": _numpy_to_json(self.numpy),
            "cuda_devices": len(self.cuda),
        }

    def tensors(self) -> dict[str, torch.Tensor]:
        """The torch generator states, keyed ``torch_cpu`` and ``cuda_<index>``."""
        tensors = {"torch_cpu": self.torch_cpu}
        tensors.update({f"cuda_{index}": state for index, state in enumerate(self.cuda)})
        return tensors

    def cloned(self) -> RngState:
        """A copy that shares nothing mutable with this one."""
        return RngState(
            self.python,
            _copy_numpy_state(self.numpy),
            self.torch_cpu.clone(),
            tuple(state.clone() for state in self.cuda),
        )

    @classmethod
    def from_files(cls, where: str, document: Any, tensors: Mapping[str, torch.Tensor]) -> RngState:
        """Decode and check saved RNG states by loading them into throwaway generators.

        Raises:
            CheckpointError: a malformed state.
        """
        try:
            python = document["python"]
            state = (python["version"], tuple(python["internal"]), python["gauss_next"])
            random.Random().setstate(state)
            numpy_state = _numpy_from_json(document["numpy"])
            name = numpy_state["bit_generator"]
            if name not in _NUMPY_BIT_GENERATORS:
                msg = f"unknown numpy bit generator {name!r}"
                raise ValueError(msg)
            np.random.RandomState(getattr(np.random, name)()).set_state(numpy_state)
            torch.Generator().set_state(tensors["torch_cpu"].clone())
            count = document["cuda_devices"]
            cuda = tuple(tensors[f"cuda_{index}"] for index in range(count))
            if set(tensors) != {"torch_cpu", *(f"cuda_{index}" for index in range(count))}:
                msg = f"unexpected tensors {sorted(tensors)}"
                raise ValueError(msg)
        except (KeyError, TypeError, ValueError, RuntimeError, OverflowError) as error:
            msg = f"{where} holds a malformed RNG state ({error}); nothing was restored."
            raise CheckpointError(msg) from None
        return cls(state, numpy_state, tensors["torch_cpu"], cuda)

    def check_compatible(self, where: str) -> None:
        """Refuse a numpy state of another bit generator than the live global one (before any change)."""
        live: dict[str, Any] = np.random.get_state(legacy=False)  # noqa: NPY002
        if live["bit_generator"] != self.numpy["bit_generator"]:
            msg = (
                f"{where} holds a numpy {self.numpy['bit_generator']} state, but numpy's global generator is "
                f"{live['bit_generator']}; nothing was restored."
            )
            raise CheckpointError(msg)

    def apply(self) -> None:
        """Set every global generator to this state (warns if CUDA states cannot all be set)."""
        random.setstate(self.python)
        np.random.set_state(_copy_numpy_state(self.numpy))  # noqa: NPY002
        torch.set_rng_state(self.torch_cpu.clone())
        if not self.cuda:
            return
        if not torch.cuda.is_available():
            warnings.warn(
                f"the checkpoint holds {len(self.cuda)} CUDA RNG state(s) but CUDA is not available here; "
                "they were not restored.",
                RuntimeWarning,
                stacklevel=3,
            )
            return
        count = torch.cuda.device_count()
        if count != len(self.cuda):
            warnings.warn(
                f"the checkpoint holds {len(self.cuda)} CUDA RNG state(s) but {count} device(s) are visible; "
                f"restored the first {min(count, len(self.cuda))}.",
                RuntimeWarning,
                stacklevel=3,
            )
        for index in range(min(count, len(self.cuda))):
            torch.cuda.set_rng_state(self.cuda[index].clone(), index)


def _map_numpy_state(state: Mapping[str, Any], leaf: Callable[[Any], Any]) -> dict[str, Any]:
    """Copy a nested numpy RNG state with ``leaf`` applied to every value that is not a nested mapping.

    ``leaf`` sees (and may transform) an encoded array ``{"__ndarray__": ..., "values": ...}`` whole.
    """
    return {
        key: _map_numpy_state(value, leaf)
        if isinstance(value, Mapping) and "__ndarray__" not in value
        else leaf(value)
        for key, value in state.items()
    }


def _copy_leaf(value: Any) -> Any:
    return value.copy() if isinstance(value, np.ndarray) else value


def _leaf_to_json(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return {"__ndarray__": str(value.dtype), "values": value.tolist()}
    return value.item() if isinstance(value, np.generic) else value


def _leaf_from_json(value: Any) -> Any:
    if not (isinstance(value, Mapping) and "__ndarray__" in value):
        return value
    dtype = np.dtype(value["__ndarray__"])
    if dtype.kind not in "iu":
        msg = f"numpy state array of dtype {dtype}"
        raise ValueError(msg)
    return np.asarray(value["values"], dtype=dtype)


def _copy_numpy_state(state: Mapping[str, Any]) -> dict[str, Any]:
    return _map_numpy_state(state, _copy_leaf)


def _numpy_to_json(state: Mapping[str, Any]) -> dict[str, Any]:
    return _map_numpy_state(state, _leaf_to_json)


def _numpy_from_json(document: Mapping[str, Any]) -> dict[str, Any]:
    return _map_numpy_state(document, _leaf_from_json)


# ------------------------------------------------------------------------------------------------ buffers


@attrs.frozen(eq=False)
class RolloutState:
    """A rollout / replay buffer: tensors (as safetensors) and JSON metadata, in the caller's key order."""

    order: tuple[str, ...]
    tensors: dict[str, torch.Tensor]
    metadata: dict[str, Any]

    @classmethod
    def capture(cls, buffer: object) -> RolloutState:
        """Validate a rollout buffer and split it (no copies).

        Accepted: a mapping of at most 10,000 entries whose keys are non-empty ``str`` names of at most 256
        characters without null bytes (``"__metadata__"`` is reserved by safetensors), and whose values are
        either dense ``torch.Tensor`` objects of a safetensors dtype (any device; restored on CPU) or JSON
        values (see :func:`check_json`).
        """
        if not isinstance(buffer, Mapping):
            msg = (
                "`rollout_buffer` must be a mapping of names to tensors or JSON values, "
                f"got {type(buffer).__name__}."
            )
            raise LoopguardTypeError(msg)
        if len(buffer) > MAX_ROLLOUT_ENTRIES:
            msg = f"`rollout_buffer` must have at most {MAX_ROLLOUT_ENTRIES:,} entries, got {len(buffer):,}."
            raise ConfigError(msg)
        tensors: dict[str, torch.Tensor] = {}
        metadata: dict[str, Any] = {}
        for key, value in buffer.items():
            _check_buffer_key(key)
            if isinstance(value, torch.Tensor):
                problem = tensor_problem(value)
                if problem is not None:
                    msg = f"`rollout_buffer[{key!r}]` is {problem}; it cannot be saved."
                    raise LoopguardTypeError(msg)
                tensors[key] = value
            else:
                check_json(f"rollout_buffer[{key!r}]", value)
                metadata[key] = value
        return cls(tuple(buffer), tensors, metadata)

    def cloned(self) -> RolloutState:
        """A copy with tensors cloned to CPU and metadata deep-copied."""
        return RolloutState(
            self.order,
            {key: clone_tree(value) for key, value in self.tensors.items()},
            json_copy(self.metadata),
        )

    def as_dict(self) -> dict[str, Any]:
        """The buffer as the caller passed it (tensors on CPU), in the original key order."""
        return {key: self.tensors[key] if key in self.tensors else self.metadata[key] for key in self.order}


def _check_buffer_key(key: object) -> None:
    if not isinstance(key, str):
        msg = f"`rollout_buffer` keys must be str, got {type(key).__name__} {describe(key)}."
        raise LoopguardTypeError(msg)
    if not key or "\x00" in key or len(key) > MAX_ROLLOUT_KEY_LENGTH or key == "__metadata__":
        msg = (
            f"`rollout_buffer` keys must be non-empty names of at most {MAX_ROLLOUT_KEY_LENGTH} characters, "
            f"without null bytes, other than '__metadata__', got {describe(key)}."
        )
        raise ConfigError(msg)


# ------------------------------------------------------------------------------------------------ snapshot


@attrs.frozen(eq=False)
class TorchState:
    """An optimizer's or scheduler's ``state_dict`` and the class that produced it."""

    class_name: str
    state: Any


@attrs.frozen(eq=False)
class Snapshot:
    """Everything one checkpoint holds, decoded (disk) or cloned (memory)."""

    step: int
    created: str
    model: ModuleState
    ref_model: ModuleState | None
    optimizer: TorchState | None
    scheduler: TorchState | None
    rng: RngState | None
    rollout: RolloutState | None
    extra_state: dict[str, Any] | None


def _check_class(where: str, saved: TorchState, live: Stateful, name: str) -> None:
    """Refuse a saved ``name`` state (optimizer, scheduler) that another class produced."""
    live_class = unwrapped_class(live, name)
    if saved.class_name != live_class:
        msg = f"{where} holds {saved.class_name} {name} state, but `{name}` is {live_class}."
        raise CheckpointError(msg)


def _check_optimizer(where: str, saved: TorchState, optimizer: Stateful) -> None:
    _check_class(where, saved, optimizer, "optimizer")
    live = optimizer.state_dict()
    state = saved.state
    if not isinstance(state, dict) or not isinstance(live, dict):
        return
    live_groups, saved_groups = live.get("param_groups"), state.get("param_groups")
    if live_groups is None:
        return
    if not isinstance(saved_groups, list) or not isinstance(state.get("state"), dict):
        msg = f"{where} holds a malformed optimizer state (no 'state' or 'param_groups')."
        raise CheckpointError(msg)
    if len(saved_groups) != len(live_groups):
        msg = (
            f"{where} holds {len(saved_groups)} parameter group(s), `optimizer` has {len(live_groups)}; "
            "nothing was restored."
        )
        raise CheckpointError(msg)
    for index, (saved_group, live_group) in enumerate(zip(saved_groups, live_groups, strict=True)):
        saved_params = saved_group.get("params") if isinstance(saved_group, dict) else None
        if not isinstance(saved_params, list) or len(saved_params) != len(live_group["params"]):
            count = len(saved_params) if isinstance(saved_params, list) else "no"
            msg = (
                f"{where} holds {count} parameter(s) in group {index}, `optimizer` has "
                f"{len(live_group['params'])}; nothing was restored."
            )
            raise CheckpointError(msg)


def _check_scheduler(where: str, saved: TorchState, scheduler: Stateful) -> None:
    _check_class(where, saved, scheduler, "scheduler")
    live = scheduler.state_dict()
    if isinstance(live, dict) and (not isinstance(saved.state, dict) or set(saved.state) != set(live)):
        keys = sorted(saved.state) if isinstance(saved.state, dict) else type(saved.state).__name__
        msg = f"{where} holds scheduler state with keys {keys}, `scheduler` has {sorted(live)}."
        raise CheckpointError(msg)


def _need(where: str, value: Any, part: str) -> Any:
    if value is None:
        msg = f"{where} holds no {part}; nothing was restored."
        raise CheckpointError(msg)
    return value


def apply_snapshot(
    where: str,
    snapshot: Snapshot,
    *,
    model: torch.nn.Module,
    optimizer: Stateful | None,
    scheduler: Stateful | None,
    ref_model: torch.nn.Module | None,
    rng: bool,
    clone: bool,
) -> None:
    """Check that ``snapshot`` fits the live objects, then load it into them.

    Everything that can be checked is checked before the first live object changes; the optimizer (whose
    own ``load_state_dict`` validates before it mutates) is loaded first, then the scheduler, the model, the
    reference model and the RNG states. ``clone`` copies the tensors handed to ``load_state_dict`` so an
    in-memory snapshot never aliases live optimizer state.
    """
    prepared_model = prepare_module(where, "model", snapshot.model, model)
    prepared_ref = None
    if ref_model is not None:
        prepared_ref = prepare_module(
            where, "ref_model", _need(where, snapshot.ref_model, "reference model"), ref_model
        )
    saved_optimizer: TorchState | None = None
    if optimizer is not None:
        saved_optimizer = _need(where, snapshot.optimizer, "optimizer state")
        _check_optimizer(where, saved_optimizer, optimizer)
    saved_scheduler: TorchState | None = None
    if scheduler is not None:
        saved_scheduler = _need(where, snapshot.scheduler, "scheduler state")
        _check_scheduler(where, saved_scheduler, scheduler)
    saved_rng: RngState | None = None
    if rng:
        saved_rng = _need(where, snapshot.rng, "RNG state")
        saved_rng.check_compatible(where)

    if optimizer is not None and saved_optimizer is not None:
        state = clone_tree(saved_optimizer.state) if clone else saved_optimizer.state
        try:
            optimizer.load_state_dict(state)
        except (KeyError, TypeError, ValueError, RuntimeError) as error:
            msg = f"{where}: `optimizer` refused the saved state ({error}); nothing was restored."
            raise CheckpointError(msg) from error
    if scheduler is not None and saved_scheduler is not None:
        scheduler.load_state_dict(clone_tree(saved_scheduler.state) if clone else saved_scheduler.state)
    apply_module(prepared_model, model)
    if ref_model is not None and prepared_ref is not None:
        apply_module(prepared_ref, ref_model)
    if saved_rng is not None:
        saved_rng.apply()
