"""Durable, symlink-refusing file operations for the checkpoint store (POSIX only).

Everything here works relative to an open directory file descriptor (``dir_fd``) and opens with
``O_NOFOLLOW``, so a symlink swapped in between a check and a use is refused by the kernel rather than
followed. Writes are hashed (SHA-256) as they stream out and ``fsync``-ed before the file is closed; renames
go through :func:`loopguard._saved_state.replace_durably` (an ``fsync`` of the directory follows each), so a
completed rename survives power loss on file systems that honour ``fsync``. Small files (``good.json``,
``run.json``) are replaced through :func:`loopguard._saved_state.atomic_target`, filled by the same
hashing writer.

Writers of one store serialise on an exclusive lock of ``<store>/.lock``, taken with ``filelock``'s
``lock_descriptor`` on a descriptor opened here (``O_NOFOLLOW`` through the store's directory descriptor,
then checked with ``fstat``); the kernel releases it when the process dies, so a temporary directory found
while holding it is a dead save's.

The safetensors writer streams one tensor at a time (so saving never holds a second copy of the whole
model in memory) and produces the layout the official reader expects: an 8-byte little-endian header
length, a JSON header padded with spaces to a multiple of 8 bytes, then the tensor bytes back to back,
largest element size first so every tensor is aligned to its element size. Reading always goes through the
``safetensors`` library. Hand-written because ``safetensors.torch.save_file`` needs a second copy of the
whole state in memory and cannot write relative to a directory descriptor or hash while it writes.

Hostile entries and a failing disk: whatever is read must be a regular file -- it is checked with ``lstat``
before it is opened (a FIFO, socket or device is never opened) and opened with ``O_NONBLOCK`` and checked
again with ``fstat`` (one swapped in after the check cannot block the open); a recorded size is compared
with ``fstat`` before anything is allocated; JSON nested deeper than :data:`MAX_JSON_DEPTH` levels is
refused. Every write failure (a full disk, a quota, ``RLIMIT_FSIZE``, an I/O error), whatever a producer
such as ``torch.save`` turns it into, comes out as :class:`~loopguard.exceptions.CheckpointWriteError` with
the original ``errno`` and the path.

References:
    safetensors format: https://github.com/huggingface/safetensors#format
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import stat
import struct
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from filelock import lock_descriptor

from loopguard._saved_state import atomic_target
from loopguard.exceptions import CheckpointError, CheckpointWriteError

__all__ = [
    "MAX_JSON_DEPTH",
    "SAFETENSORS_DTYPES",
    "CheckpointError",
    "CheckpointWriteError",
    "HashingWriter",
    "disk_error",
    "entry_kind",
    "hash_file",
    "load_json",
    "locked",
    "open_child_dir",
    "open_root",
    "random_suffix",
    "read_small",
    "read_verified",
    "remove_tree",
    "write_file",
    "write_safetensors",
    "write_small_atomic",
]

_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY: int = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK: int = getattr(os, "O_NONBLOCK", 0)
_NOCTTY: int = getattr(os, "O_NOCTTY", 0)
_MAX_WRITE = 1 << 30
_READ_CHUNK = 8 << 20  # Linux caps one write() at 0x7ffff000 bytes; stay well under it
_LOCK_NAME = ".lock"
_LOCK_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
_LOCK_POLL_SECONDS = 0.01  # how often a waiting writer retries (saves hold the lock for seconds)
_lock_warned = False
_MAX_TREE_DEPTH = 16  # the store never nests directories: a checkpoint directory holds only files

MAX_JSON_DEPTH = 100
"""Deepest nesting of lists and objects accepted in any JSON file of a store (``save`` writes at most 67)."""

SAFETENSORS_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}


def random_suffix() -> str:
    """Return 16 random hex characters for temporary names."""
    return secrets.token_hex(8)


def open_root(path: str) -> int:
    """Open the store's root directory (the root may be a symlink, as on clusters with linked scratch).

    Raises:
        CheckpointError: ``path`` no longer exists or is no longer a directory (a FIFO put in its place is
            refused by ``O_DIRECTORY`` without being opened).
    """
    try:
        return os.open(path, os.O_RDONLY | _DIRECTORY | _CLOEXEC | _NONBLOCK | _NOCTTY)
    except (FileNotFoundError, NotADirectoryError) as error:
        msg = (
            f"checkpoint store {path} is missing or is not a directory any more ({error.strerror}); "
            "restore the directory or create a CheckpointManager for another one."
        )
        raise CheckpointError(msg) from None


def open_child_dir(name: str, dir_fd: int) -> int:
    """Open a directory entry of ``dir_fd`` without following a symlink (``ELOOP`` if it is one)."""
    return os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=dir_fd)


def _lock_refused(root: str, kind: str) -> CheckpointError:
    path = os.path.join(root, _LOCK_NAME)
    msg = (
        f"the checkpoint store's lock file {path} is {kind}; it must be a regular file. Remove it "
        "(loopguard creates it again) and retry."
    )
    return CheckpointError(msg)


@contextlib.contextmanager
def locked(root_fd: int, root: str) -> Iterator[None]:
    """Hold an exclusive lock on ``<root>/.lock`` (``filelock``'s ``flock``: released if the process dies).

    Savers, pruners and markers of one store serialise on this lock, so a temporary directory seen while
    holding it belongs to a save that died. File systems without ``flock`` (some Lustre mounts) get a
    one-time warning and no lock: then keep to one writer per store. A store that is read-only to this
    process (the lock file cannot be created) is read without a lock. ``root`` is the store's path, for
    messages.

    Raises:
        CheckpointError: ``.lock`` is a symlink, a directory, a FIFO, a socket or a device (checked before it
            is opened, and again after: a lock that is not a regular file would not serialise anything, or
            could block); the message names the path and says to remove it.
    """
    global _lock_warned
    mode = entry_kind(_LOCK_NAME, root_fd)
    if mode is not None and not stat.S_ISREG(mode):
        raise _lock_refused(root, _describe_kind(mode))
    flags = os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC | _NONBLOCK | _NOCTTY
    try:
        fd = os.open(_LOCK_NAME, flags, 0o644, dir_fd=root_fd)
    except OSError as error:
        if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            yield  # a read-only store: reading needs no lock, and any write fails on its own
            return
        if error.errno in (errno.ELOOP, errno.EMLINK, errno.EISDIR, errno.ENXIO, errno.ENODEV):
            raise _lock_refused(root, f"not a regular file ({error.strerror})") from None  # swapped in
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _lock_refused(root, _describe_kind(mode))
        try:
            lock_descriptor(fd, poll_interval=_LOCK_POLL_SECONDS)
        except OSError as error:
            if error.errno not in _LOCK_UNSUPPORTED:
                raise
            if not _lock_warned:
                _lock_warned = True
                warnings.warn(
                    f"checkpoints: flock is not supported here ({error}); keep one writer per store.",
                    RuntimeWarning,
                    stacklevel=3,
                )
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _write_all(fd: int, data: memoryview) -> None:
    position = 0
    while position < len(data):
        position += os.write(fd, data[position : position + _MAX_WRITE])


def _reason(error: OSError) -> str:
    if error.errno is None:
        return str(error)
    return f"{os.strerror(error.errno)}, {errno.errorcode.get(error.errno, error.errno)}"


def _write_error(error: OSError, path: str, outcome: str = "") -> CheckpointWriteError:
    msg = f"could not write {path} ({_reason(error)})" + (f"; {outcome}" if outcome else "")
    return CheckpointWriteError(error.errno, msg, path)


def disk_error(error: OSError, where: str, outcome: str) -> CheckpointWriteError:
    """The :class:`CheckpointWriteError` for ``error``, a failed write into the directory ``where``.

    It keeps ``error.errno``, names the failing file (the innermost one of a :class:`CheckpointWriteError`,
    a relative name taken to be inside ``where``, or ``where`` itself) and says ``outcome``.
    """
    name = error.filename
    if isinstance(error, CheckpointWriteError) and isinstance(name, str):
        path = name  # already absolute
    else:
        path = os.path.join(where, name) if isinstance(name, str) else where
    return _write_error(error, path, outcome)


class HashingWriter:
    """A write-only file object that hashes (SHA-256) and counts what it writes to a raw descriptor.

    The first ``OSError`` a write raises is kept in :attr:`error`, so :func:`write_file` reports a failed
    write even when the producer wraps it in another exception (``torch.save`` may raise
    ``RuntimeError: ... unexpected pos``) or swallows it.
    """

    def __init__(self, fd: int) -> None:
        """Wrap the open descriptor ``fd`` (the caller closes it)."""
        self._fd = fd
        self._sha = hashlib.sha256()
        self.size = 0
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        """Write a bytes-like object completely and return its length."""
        view = memoryview(data).cast("B")
        self._sha.update(view)
        try:
            _write_all(self._fd, view)
        except OSError as error:
            if self.error is None:
                self.error = error
            raise
        self.size += len(view)
        return len(view)

    def flush(self) -> None:
        """Nothing is buffered (``fsync`` happens when the file is closed by :func:`write_file`)."""

    def hexdigest(self) -> str:
        """The SHA-256 of everything written so far."""
        return self._sha.hexdigest()


def write_file(
    dir_fd: int, name: str, produce: Callable[[HashingWriter], None], where: str | None = None
) -> dict[str, Any]:
    """Create ``name`` in ``dir_fd`` (it must not exist), let ``produce`` fill it, ``fsync`` and close it.

    ``where`` is the path of ``dir_fd``, for messages.

    Returns:
        ``{"sha256": <hex>, "bytes": <size>}`` of what was written.

    Raises:
        CheckpointWriteError: the file could not be created, written, flushed or closed (disk full, quota,
            file too large, I/O error), whatever ``produce`` made of the failed write; it keeps the errno
            and names the file. The partial file stays for the caller to remove with its directory.
    """
    path = name if where is None else os.path.join(where, name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    try:
        fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
    except OSError as error:
        raise _write_error(error, path) from error
    writer = HashingWriter(fd)
    try:
        try:
            produce(writer)
        except Exception:  # a producer may wrap the failed write (torch.save: RuntimeError)
            if writer.error is None:
                raise
            raise _write_error(writer.error, path) from writer.error
        if writer.error is not None:  # the producer swallowed a failed write: the file is incomplete
            raise _write_error(writer.error, path) from writer.error
        try:
            os.fsync(fd)  # delayed allocation, quotas and NFS may report a full disk only here
        except OSError as error:
            raise _write_error(error, path) from error
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    try:
        os.close(fd)
    except OSError as error:
        raise _write_error(error, path) from error
    return {"sha256": writer.hexdigest(), "bytes": writer.size}


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The raw little-endian bytes of one tensor, copied to CPU only if it is elsewhere."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data.cast("B")


def write_safetensors(
    dir_fd: int,
    name: str,
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str] | None = None,
    where: str | None = None,
) -> dict[str, Any]:
    """Stream ``tensors`` into a safetensors file ``name`` (see the module docstring for the layout).

    Every tensor must be dense, strided and of a dtype in :data:`SAFETENSORS_DTYPES` (checked by the caller).

    Raises:
        CheckpointWriteError: as :func:`write_file` (``where`` is the path of ``dir_fd``, for messages).
    """
    order = sorted(tensors, key=lambda key: (-tensors[key].element_size(), key))
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for key in order:
        tensor = tensors[key]
        size = tensor.numel() * tensor.element_size()
        header[key] = {
            "dtype": SAFETENSORS_DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode()
    encoded += b" " * (-len(encoded) % 8)

    def produce(writer: HashingWriter) -> None:
        writer.write(struct.pack("<Q", len(encoded)))
        writer.write(encoded)
        for key in order:
            if tensors[key].numel():
                writer.write(_tensor_bytes(tensors[key]))

    return write_file(dir_fd, name, produce, where)


def _describe_kind(mode: int) -> str:
    kinds = (
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((kind for test, kind in kinds if test(mode)), "not a regular file")


def _open_regular(dir_fd: int, name: str, where: str, tail: str) -> tuple[int, os.stat_result]:
    """Open ``name`` read-only if it is a regular file: never following a symlink, never blocking.

    The entry is checked with ``lstat`` first, so a FIFO, socket or device is never opened; the open uses
    ``O_NONBLOCK`` and ``O_NOCTTY`` (a FIFO swapped in after the check cannot block it, a terminal cannot
    become the controlling one) and ``fstat`` checks what was opened. Blocking reads are restored before
    the descriptor and its ``fstat`` are returned.

    Raises:
        FileNotFoundError: ``name`` does not exist (the caller words it).
        CheckpointError: anything but a regular file: ``"{where} is <kind>, refusing it{tail}"``.
    """
    mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    if not stat.S_ISREG(mode):
        msg = f"{where} is {_describe_kind(mode)}, refusing it{tail}"
        raise CheckpointError(msg)
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _NONBLOCK | _NOCTTY, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as error:  # replaced after the check: ELOOP (a symlink), ENXIO (a socket), ...
        msg = f"{where} could not be opened safely ({error.strerror}), refusing it{tail}"
        raise CheckpointError(msg) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            msg = f"{where} is {_describe_kind(info.st_mode)}, refusing it{tail}"
            raise CheckpointError(msg)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def _physical_memory() -> int:
    """This machine's RAM in bytes, or 0 if the system does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not POSIX, or the name is unknown
        return 0


def _size_problem(fd: int, size: int, keep: bool) -> str | None:
    """Why a regular file of ``size`` bytes (its real, fstat-ed size) cannot be a genuine checkpoint file.

    Bounds what a sparse file with a matching manifest could make the reader do: a file larger than the
    whole file system holding it cannot have been written by a save (hashing it would take hours), and a
    file to be loaded must fit in memory (reading it would raise ``MemoryError``).
    """
    try:
        info = os.fstatvfs(fd)
        capacity = info.f_blocks * info.f_frsize
    except OSError:  # pragma: no cover - a file system that does not report its size
        capacity = 0
    if capacity and size > capacity:
        return f"more than the whole file system that holds it ({capacity:,} bytes): a sparse or forged file"
    memory = _physical_memory()
    if keep and memory and size > memory:
        return f"more than this machine's memory ({memory:,} bytes), so it cannot be loaded"
    return None


def _wrong_size(where: str, length: int, size: int) -> CheckpointError:
    found = f"{length}" if length <= size else f"more than {size}"
    msg = (
        f"checkpoint file {where} has {found} bytes, but manifest.json records {size} "
        "(truncated or modified); nothing was restored."
    )
    return CheckpointError(msg)


def read_verified(dir_fd: int, name: str, size: int, sha256: str, where: str, *, keep: bool = True) -> bytes:
    """Read ``name`` completely and check its size and SHA-256 against the manifest.

    The bytes that are hashed are exactly the bytes returned (no second read). The file must be a regular
    file (see :func:`_open_regular`: a FIFO or device is refused without blocking), and its ``fstat`` size
    must equal ``size`` before anything is allocated, so an absurd recorded size is refused at once. A file
    to be loaded is read into one buffer of its real size (it must fit in this machine's memory); with
    ``keep=False`` the file is hashed in chunks of 8 MiB and ``b""`` is returned (for parts that are
    verified but not loaded). A file larger than the whole file system holding it (sparse) is refused.

    Raises:
        CheckpointError: missing, a symlink or not a regular file, the wrong size (or too large to be
            genuine), or the wrong hash; the message names ``where`` (the file's path).
    """
    try:
        fd, info = _open_regular(dir_fd, name, f"checkpoint file {where}", "; nothing was restored.")
    except FileNotFoundError:
        msg = f"checkpoint file {where} is missing (listed in manifest.json); nothing was restored."
        raise CheckpointError(msg) from None
    with os.fdopen(fd, "rb", buffering=0) as handle:
        if info.st_size != size:
            raise _wrong_size(where, info.st_size, size)
        problem = _size_problem(fd, size, keep)
        if problem is not None:
            msg = f"checkpoint file {where} has {size:,} bytes, {problem}; nothing was restored."
            raise CheckpointError(msg)
        if keep:
            data = handle.readall()  # one buffer of the fstat-ed size; loops over reads (2 GiB each at most)
            length, digest = len(data), hashlib.sha256(data).hexdigest()
        else:
            data, length, hasher = b"", 0, hashlib.sha256()
            while length <= size:
                chunk = handle.read(min(_READ_CHUNK, size + 1 - length)) or b""
                if not chunk:
                    break
                hasher.update(chunk)
                length += len(chunk)
            digest = hasher.hexdigest()
    if length != size:  # it changed while it was read
        raise _wrong_size(where, length, size)
    if digest != sha256:
        msg = (
            f"checkpoint file {where} fails its SHA-256 check (manifest {sha256[:16]}..., "
            f"file {digest[:16]}...): "
            "it was modified or corrupted; nothing was restored."
        )
        raise CheckpointError(msg)
    return data


def hash_file(dir_fd: int, name: str, where: str) -> dict[str, Any]:
    """The SHA-256 and size of a regular file another writer made (DCP's shard files), read in 8 MiB chunks.

    Returns:
        ``{"sha256": <hex>, "bytes": <size>}``, as :func:`write_file` returns for the files it writes.

    Raises:
        CheckpointError: ``name`` is missing or not a regular file.
    """
    try:
        fd, _ = _open_regular(dir_fd, name, where, "; the checkpoint was not saved.")
    except FileNotFoundError:
        msg = f"{where} vanished while the checkpoint was being saved; the checkpoint was not saved."
        raise CheckpointError(msg) from None
    hasher, size = hashlib.sha256(), 0
    with os.fdopen(fd, "rb", buffering=0) as handle:
        while chunk := handle.read(_READ_CHUNK):
            hasher.update(chunk)
            size += len(chunk)
    return {"sha256": hasher.hexdigest(), "bytes": size}


def read_small(dir_fd: int, name: str, limit: int, where: str) -> bytes:
    """Read a small regular file (manifest, index) without following symlinks, refusing over ``limit``.

    Raises:
        CheckpointError: ``name`` is missing, is not a regular file (a symlink, directory, FIFO, socket or
            device: refused at once, never opened in blocking mode), or is larger than ``limit`` bytes.
    """
    try:
        fd, info = _open_regular(dir_fd, name, where, ".")
    except FileNotFoundError:
        msg = f"{where} is missing."
        raise CheckpointError(msg) from None
    with os.fdopen(fd, "rb", buffering=0) as handle:
        if info.st_size > limit:
            msg = f"{where} is larger than {limit} bytes, refusing it."
            raise CheckpointError(msg)
        chunks: list[bytes] = []
        length = 0
        while length <= limit:
            chunk = handle.read(limit + 1 - length) or b""
            if not chunk:
                break
            chunks.append(chunk)
            length += len(chunk)
    if length > limit:  # it grew after the fstat
        msg = f"{where} is larger than {limit} bytes, refusing it."
        raise CheckpointError(msg)
    return b"".join(chunks)


def _reject_constant(name: str) -> Any:
    msg = f"{name} is not JSON"
    raise ValueError(msg)


def _nested_deeper(value: Any, limit: int) -> bool:
    """Whether lists and objects in ``value`` nest more than ``limit`` levels (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def load_json(data: bytes) -> Any:
    """Parse a JSON file of the store: no ``NaN``/``Infinity``, at most :data:`MAX_JSON_DEPTH` levels deep.

    Deep nesting makes ``json.loads`` raise ``RecursionError`` (or leaves a value that recursive code
    later trips over); both are reported here as ``ValueError``, which the callers turn into a
    :class:`CheckpointError` naming the file.

    Raises:
        ValueError: invalid JSON, a non-finite constant, or nesting deeper than :data:`MAX_JSON_DEPTH`.
    """
    deep = f"lists and objects are nested more than {MAX_JSON_DEPTH} levels deep"
    try:
        value = json.loads(data, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError(deep) from None
    if isinstance(value, (dict, list)) and _nested_deeper(value, MAX_JSON_DEPTH):
        raise ValueError(deep)
    return value


def write_small_atomic(
    dir_fd: int, name: str, data: bytes, temp_prefix: str, where: str | None = None
) -> None:
    """Replace ``name`` in ``dir_fd`` atomically (:func:`~loopguard._saved_state.atomic_target`).

    Raises:
        CheckpointWriteError: the disk failed (full, quota, I/O error); ``name`` is unchanged and the
            temporary file removed. ``where`` is the path of ``dir_fd``, for messages.
    """
    directory = "." if where is None else where

    def produce(writer: HashingWriter) -> None:
        writer.write(data)

    try:
        with atomic_target(name, dir_fd=dir_fd, temp_prefix=temp_prefix) as temp:
            write_file(dir_fd, temp, produce, where)
    except OSError as error:
        raise disk_error(error, directory, f"{os.path.join(directory, name)} is unchanged") from error


def remove_tree(name: str, dir_fd: int, _depth: int = 0) -> None:
    """Delete the directory ``name`` in ``dir_fd`` and everything in it, never following a symlink.

    Raises:
        CheckpointError: the tree nests directories more than 16 levels deep (the store never creates any;
            without this bound a deep tree would exhaust the recursion limit or the descriptors).
    """
    if _depth >= _MAX_TREE_DEPTH:
        msg = (
            f"it nests directories more than {_MAX_TREE_DEPTH} levels deep (loopguard never creates such "
            "trees); remove it yourself."
        )
        raise CheckpointError(msg)
    child = open_child_dir(name, dir_fd)
    try:
        for entry in os.listdir(child):
            info = os.stat(entry, dir_fd=child, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                remove_tree(entry, child, _depth + 1)
            else:
                os.unlink(entry, dir_fd=child)
    finally:
        os.close(child)
    os.rmdir(name, dir_fd=dir_fd)


def entry_kind(name: str, dir_fd: int) -> int | None:
    """The ``lstat`` mode of ``name`` in ``dir_fd``, or ``None`` if it does not exist."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
