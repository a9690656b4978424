"""Reading saved states (JSON trees) field by field, all or nothing, with errors that name the path.

Every ``load_state_dict`` in loopguard reads a JSON value that came from disk, from another rank or from a
user, so each field is checked the same way before anything is applied: its type, finiteness and range, the
exact set of keys (unknown keys are refused, never ignored), and list lengths against a cap. A failure raises
:class:`~loopguard.exceptions.StateError` naming the path of the bad field, e.g.
"`state['guard']['vote']` must be in [0, 1], got nan." Callers decode everything into fresh values first and
assign only when all of it passed, so a refused state leaves the object as it was.

Writing: :func:`atomic_target` is loopguard's one atomic replace -- a temporary sibling the caller fills
and ``fsync``-s, a rename over the target, an ``fsync`` of the directory -- used by :func:`write_atomic`,
:func:`write_state_file` (the adapters' state files), the checkpoint store's index and run claim (relative
to an open directory) and the iterative-DPO recipe (manifest, pairs, saved policies).
Hand-written because no maintained library replaces a file relative to a directory descriptor (``dir_fd``).

Example:
    >>> fields = Fields({"kind": "x", "seen": 3, "vote": 0.5}, keys=("kind", "seen", "vote"))
    >>> fields.integer("seen", lo=0), fields.real("vote", lo=0.0, hi=1.0)
    (3, 0.5)
    >>> Fields({"seen": 3}, keys=("seen", "vote"))
    Traceback (most recent call last):
    ...
    loopguard.exceptions.StateError: `state` must have exactly the keys ['seen', 'vote'], got missing ['vote'], unexpected [].
"""  # noqa: E501

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, BinaryIO

from loopguard._validation import check_bool, check_int, check_real, describe
from loopguard.exceptions import InputError, LoopguardError, StateError

__all__ = [
    "MAX_STATE_FILE_BYTES",
    "MAX_STATE_LIST",
    "MAX_STATE_TEXT",
    "Fields",
    "as_state_error",
    "atomic_target",
    "check_state_list",
    "check_state_reals",
    "check_state_text",
    "decode_rollbacks",
    "fsync_dir",
    "open_regular",
    "open_state",
    "open_versioned_state",
    "parse_state_json",
    "read_state_file",
    "refuse_symlink",
    "replace_durably",
    "write_atomic",
    "write_state_file",
]

MAX_STATE_LIST = 1_000_000
"""Longest list accepted anywhere in a saved state (a reference sample, a warm-up buffer)."""

MAX_STATE_TEXT = 65_536
"""Longest string accepted anywhere in a saved state (an explanation kept for a stopped run)."""

MAX_STATE_FILE_BYTES = 256 * 2**20
"""Largest state file read (a Guard with an InfoRM reference pool of 1,024 embeddings stays far below)."""

_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK: int = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)


@contextmanager
def as_state_error() -> Iterator[None]:
    """Re-raise any loopguard error met while reading a saved state as a :class:`StateError`."""
    try:
        yield
    except StateError:
        raise
    except LoopguardError as error:
        raise StateError(str(error)) from None


def _reject_constant(token: str) -> Any:
    msg = f"{token} is not JSON"
    raise ValueError(msg)


def parse_state_json(text: str | bytes, where: str) -> Any:
    """Parse a saved state strictly: no ``NaN``/``Infinity`` tokens, no unbounded nesting.

    Raises:
        StateError: not valid JSON (the message names ``where``, e.g. the file).
    """
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as error:
        msg = f"{where} is not a valid saved state: {type(error).__name__}: {error}"
        raise StateError(msg) from None


def open_regular(path: str, refuse: Callable[[str], Exception]) -> tuple[BinaryIO, os.stat_result]:
    """Open ``path`` to read if it is a regular file: never through a symlink, never blocking on a FIFO.

    Returns the open file and its ``fstat``. A symlink raises ``refuse("a symlink")`` (chained to the
    ``OSError`` of the refused open), anything else that is not a regular file ``refuse("irregular")``.

    Raises:
        OSError: the file cannot be opened (missing, permissions).
    """
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)  # a FIFO opens without a writer
    except OSError as error:
        if os.path.islink(path):
            raise refuse("a symlink") from error
        raise
    handle = os.fdopen(fd, "rb")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise refuse("irregular")
    except BaseException:
        handle.close()
        raise
    return handle, info


def _refuse_state(path: str) -> Callable[[str], Exception]:
    def refuse(kind: str) -> Exception:
        if kind == "a symlink":
            return StateError(f"{path} is a symlink; refusing to read a state through it.")
        return StateError(f"{path} is not a regular file (a FIFO, device or directory); refusing to read it.")

    return refuse


def read_state_file(path: str, *, limit: int = MAX_STATE_FILE_BYTES) -> Any:
    """Read and parse a JSON state file: a regular file (not a link, FIFO or device: never blocks), bounded.

    Raises:
        StateError: not a regular file, larger than ``limit``, or not strict JSON (the message names it).
        OSError: the file cannot be opened (missing, permissions).
    """
    handle, info = open_regular(path, _refuse_state(path))
    with handle:
        if info.st_size > limit:
            msg = f"{path} has {info.st_size:,} bytes, more than the {limit:,} a saved state may have."
            raise StateError(msg)
        data = handle.read(limit + 1)
    if len(data) > limit:
        msg = f"{path} grew past {limit:,} bytes while it was read."
        raise StateError(msg)
    return parse_state_json(data, path)


def fsync_dir(path: str) -> None:
    """``fsync`` a directory so a rename in it is durable (a file system that cannot do it is skipped)."""
    with contextlib.suppress(OSError):  # the rename still happened
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def refuse_symlink(path: str, dir_fd: int | None = None) -> None:
    """Raise :class:`InputError` if ``path`` (in ``dir_fd``, if given) is a symlink: never written through."""
    try:
        is_link = stat.S_ISLNK(os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return
    if is_link:
        msg = f"`{path}` must not be a symlink (loopguard never writes through one), got a symlink."
        raise InputError(msg)


def replace_durably(temp: str, path: str, *, dir_fd: int | None = None) -> None:
    """Rename ``temp`` over ``path`` (atomic), then ``fsync`` the directory so the rename survives a crash.

    With ``dir_fd`` both are names in that open directory (POSIX) and a failed directory ``fsync`` raises;
    without it the directory is opened by path and one that cannot be ``fsync``-ed is skipped.
    """
    if dir_fd is None:
        os.replace(temp, path)
        fsync_dir(os.path.dirname(path) or ".")
    else:
        os.rename(temp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # POSIX: replaces like os.replace
        os.fsync(dir_fd)


def _discard(temp: str, dir_fd: int | None) -> None:
    """Remove what a failed write left at ``temp`` (a file, or a folder in path mode); never raises."""
    if dir_fd is None and os.path.isdir(temp) and not os.path.islink(temp):
        import shutil  # here: shutil loads the compression modules, and `import loopguard` stays light

        shutil.rmtree(temp, ignore_errors=True)
        return
    with contextlib.suppress(OSError):
        os.unlink(temp, dir_fd=dir_fd)


@contextmanager
def atomic_target(path: str, *, dir_fd: int | None = None, temp_prefix: str | None = None) -> Iterator[str]:
    """Yield a fresh temporary sibling of ``path`` to fill; on success rename it over ``path`` durably.

    The one place loopguard replaces a file (or a saved folder) atomically: the caller creates and
    ``fsync``-s ``temp`` inside the ``with`` block; :func:`replace_durably` then renames it into place.
    A reader sees the old ``path`` or the new one, never a part of either; if anything fails, ``temp``
    is removed and ``path`` is untouched. With ``dir_fd`` the names are relative to that open directory.

    Args:
        path: The file (or folder) to replace; it must not be a symlink.
        dir_fd: An open directory that ``path`` is a name in, or ``None`` for a path.
        temp_prefix: The temporary name's prefix (16 random hex characters follow); default
            ``.<name>.tmp-``.

    Raises:
        InputError: ``path`` is a symlink.
        OSError: the rename failed (or the directory ``fsync``, with ``dir_fd``).
    """
    refuse_symlink(path, dir_fd)
    folder, name = os.path.split(path)
    prefix = f".{name}.tmp-" if temp_prefix is None else temp_prefix
    temp = os.path.join(folder, f"{prefix}{secrets.token_hex(8)}")
    try:
        yield temp
        replace_durably(temp, path, dir_fd=dir_fd)
    except BaseException:
        _discard(temp, dir_fd)
        raise


def write_atomic(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically: a temporary sibling, ``fsync``, rename, ``fsync`` the dir.

    A reader sees the old file or the new one, never a part of either; ``path`` is never written through a
    symlink.

    Raises:
        InputError: ``path`` is a symlink.
        OSError: the file cannot be written; ``path`` is then untouched.
    """
    with atomic_target(path) as temp:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())


def write_state_file(path: str, value: Any) -> None:
    """Write ``value`` as strict JSON to ``path`` atomically (see :func:`write_atomic`).

    Raises:
        ValueError: ``value`` holds a non-finite float (it would not read back).
        InputError: ``path`` is a symlink.
        OSError: the file cannot be written; ``path`` is then untouched.
    """
    write_atomic(path, json.dumps(value, allow_nan=False).encode("utf-8"))


class Fields:
    """One mapping of a saved state, read key by key (see the module docs).

    Args:
        payload: The mapping to read.
        path: How messages name it, e.g. ``"state['guard']"``.
        keys: The exact keys it must have (``None``: any string keys).
    """

    def __init__(self, payload: object, path: str = "state", *, keys: Collection[str] | None) -> None:
        """Check ``payload`` is a mapping with exactly ``keys``."""
        if not isinstance(payload, Mapping):
            msg = f"`{path}` must be a JSON object, got {describe(payload)} of type {type(payload).__name__}."
            raise StateError(msg)
        for key in payload:
            if not isinstance(key, str):
                msg = f"`{path}` must have string keys, got {describe(key)}."
                raise StateError(msg)
        if keys is not None:
            missing = sorted(set(keys) - set(payload))
            unexpected = sorted(set(payload) - set(keys))
            if missing or unexpected:
                msg = (
                    f"`{path}` must have exactly the keys {sorted(keys)}, got missing {missing}, "
                    f"unexpected {unexpected}."
                )
                raise StateError(msg)
        self.payload: Mapping[str, Any] = payload
        self.path = path

    def name(self, key: str) -> str:
        """The path of ``key``, for messages."""
        return f"{self.path}[{key!r}]"

    def __contains__(self, key: str) -> bool:
        """Whether the mapping has ``key``."""
        return key in self.payload

    def raw(self, key: str) -> Any:
        """The value under ``key``, unchecked."""
        return self.payload[key]

    def names(self) -> list[str]:
        """The mapping's keys, in order."""
        return list(self.payload)

    def integer(
        self, key: str, *, lo: int | None = None, hi: int | None = None, optional: bool = False
    ) -> Any:
        """An int in ``[lo, hi]`` (or None when ``optional``)."""
        value = self.payload[key]
        if optional and value is None:
            return None
        with as_state_error():
            return check_int(self.name(key), value, lo=lo, hi=hi)

    def real(
        self,
        key: str,
        *,
        lo: float | None = None,
        hi: float | None = None,
        lo_inclusive: bool = True,
        optional: bool = False,
    ) -> Any:
        """A finite real in the range (or None when ``optional``); ints are accepted as reals."""
        value = self.payload[key]
        if optional and value is None:
            return None
        with as_state_error():
            return check_real(self.name(key), value, lo=lo, hi=hi, lo_inclusive=lo_inclusive)

    def flag(self, key: str) -> bool:
        """A JSON bool."""
        with as_state_error():
            return check_bool(self.name(key), self.payload[key])

    def text(self, key: str, *, optional: bool = False, max_length: int = MAX_STATE_TEXT) -> Any:
        """A string of at most ``max_length`` characters without null bytes (or None when ``optional``)."""
        value = self.payload[key]
        if optional and value is None:
            return None
        return check_state_text(self.name(key), value, max_length=max_length)

    def items(self, key: str, *, max_length: int = MAX_STATE_LIST) -> list[Any]:
        """A JSON list of at most ``max_length`` items (items unchecked)."""
        return check_state_list(self.name(key), self.payload[key], max_length=max_length)

    def sub(self, key: str, *, keys: Collection[str] | None) -> Fields:
        """The mapping under ``key``, itself read field by field."""
        return Fields(self.payload[key], self.name(key), keys=keys)


def open_state(
    payload: object, *, kind: str, version: int, keys: Collection[str], owner: str, path: str = "state"
) -> Fields:
    """Check a saved state's ``kind`` and ``version`` (first: the likeliest mix-ups), then its exact keys.

    Raises:
        StateError: not a JSON object, another ``kind`` (``owner`` names what would have written the right
            one), another ``version``, or missing or unknown keys.
    """
    fields = Fields(payload, path, keys=None)
    found = fields.raw("kind") if "kind" in fields else None
    if found != kind:
        msg = f"`{fields.name('kind')}` must be {kind!r} (from {owner}.state_dict()), got {describe(found)}."
        raise StateError(msg)
    found = fields.raw("version") if "version" in fields else None
    if isinstance(found, bool) or found != version:
        msg = f"`{fields.name('version')}` must be {version} (this loopguard's), got {describe(found)}."
        raise StateError(msg)
    return Fields(payload, path, keys=keys)


def open_versioned_state(
    payload: object, *, kind: str, versions: Mapping[int, Collection[str]], owner: str
) -> tuple[Fields, int]:
    """:func:`open_state` for a state that still reads older versions: ``versions`` maps each to its keys.

    The newest version in ``versions`` is the current one (named in the error for any other version).

    Returns:
        The fields and the version found.
    """
    found = payload.get("version") if isinstance(payload, Mapping) else None
    version = found if isinstance(found, int) and not isinstance(found, bool) and found in versions else None
    chosen = max(versions) if version is None else version
    return open_state(payload, kind=kind, version=chosen, keys=versions[chosen], owner=owner), chosen


def check_state_text(name: str, value: object, *, max_length: int = MAX_STATE_TEXT) -> str:
    """A string of at most ``max_length`` characters without null bytes."""
    if not isinstance(value, str):
        msg = f"`{name}` must be a string, got {describe(value)} of type {type(value).__name__}."
        raise StateError(msg)
    if len(value) > max_length or "\x00" in value:
        msg = f"`{name}` must be a string of at most {max_length:,} characters without null bytes, got "
        msg += f"{describe(value)}."
        raise StateError(msg)
    return value


def check_state_list(name: str, value: object, *, max_length: int = MAX_STATE_LIST) -> list[Any]:
    """A JSON list of at most ``max_length`` items."""
    if not isinstance(value, list):
        msg = f"`{name}` must be a list, got {describe(value)} of type {type(value).__name__}."
        raise StateError(msg)
    if len(value) > max_length:
        msg = f"`{name}` must have at most {max_length:,} items, got {len(value):,}."
        raise StateError(msg)
    return value


def check_state_reals(
    name: str,
    value: object,
    *,
    lo: float | None = None,
    hi: float | None = None,
    max_length: int = MAX_STATE_LIST,
) -> list[float]:
    """A list of finite reals in ``[lo, hi]``."""
    items = check_state_list(name, value, max_length=max_length)
    with as_state_error():
        return [check_real(f"{name}[{index}]", item, lo=lo, hi=hi) for index, item in enumerate(items)]


def decode_rollbacks(fields: Fields, key: str = "rollbacks") -> list[dict[str, int]]:
    """An adapter's rollback history: ``[{"step": s, "restored_step": r}, ...]`` with ``0 <= r < s``."""
    out = []
    for index, entry in enumerate(fields.items(key, max_length=MAX_STATE_LIST)):
        item = Fields(entry, f"{fields.name(key)}[{index}]", keys=("step", "restored_step"))
        step, restored = item.integer("step", lo=0), item.integer("restored_step", lo=0)
        if restored >= step:
            msg = f"`{item.name('restored_step')}` must be < the rollback's step ({step}), got {restored}."
            raise StateError(msg)
        out.append({"step": step, "restored_step": restored})
    return out
