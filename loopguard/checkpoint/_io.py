"""Durable, symlink-refusing file operations for the checkpoint store (POSIX only).

Everything here works relative to an open directory file descriptor (``dir_fd``) and opens with
``O_NOFOLLOW``, so a symlink swapped in between a check and a use is refused by the kernel rather than
followed. Writes are hashed (SHA-256) as they stream out and ``fsync``-ed before the file is closed; renames
are followed by an ``fsync`` of the directory that holds them, so a completed rename survives power loss on
file systems that honour ``fsync``.

The safetensors writer streams one tensor at a time (so saving never holds a second copy of the whole
model in memory) and produces the layout the official reader expects: an 8-byte little-endian header
length, a JSON header padded with spaces to a multiple of 8 bytes, then the tensor bytes back to back,
largest element size first so every tensor is aligned to its element size. Reading always goes through the
``safetensors`` library.

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

from loopguard.exceptions import CheckpointError

try:
    import fcntl
except (
    ImportError
):  # pragma: no cover - Windows: on-disk stores are refused there, in-memory ones need no lock
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "SAFETENSORS_DTYPES",
    "CheckpointError",
    "HashingWriter",
    "entry_kind",
    "fsync_dir",
    "locked",
    "open_child_dir",
    "open_root",
    "random_suffix",
    "read_small",
    "read_verified",
    "remove_tree",
    "rename",
    "write_file",
    "write_safetensors",
    "write_small_atomic",
]

_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY: int = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)
_MAX_WRITE = 1 << 30
_READ_CHUNK = 8 << 20  # Linux caps one write() at 0x7ffff000 bytes; stay well under it
_LOCK_NAME = ".lock"
_LOCK_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
_lock_warned = False

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
    """Open the store's root directory (the root may be a symlink, as on clusters with linked scratch)."""
    return os.open(path, os.O_RDONLY | _DIRECTORY | _CLOEXEC)


def open_child_dir(name: str, dir_fd: int) -> int:
    """Open a directory entry of ``dir_fd`` without following a symlink (``ELOOP`` if it is one)."""
    return os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=dir_fd)


def fsync_dir(dir_fd: int) -> None:
    """``fsync`` a directory so the entries created or renamed in it are durable."""
    os.fsync(dir_fd)


def rename(src: str, dst: str, dir_fd: int) -> None:
    """Rename an entry inside ``dir_fd`` and make the rename durable."""
    os.rename(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    fsync_dir(dir_fd)


@contextlib.contextmanager
def locked(root_fd: int) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<root>/.lock`` (released by the kernel if the process dies).

    Savers, pruners and markers of one store serialise on this lock, so a temporary directory seen while
    holding it belongs to a save that died. File systems without ``flock`` (some Lustre mounts) get a
    one-time warning and no lock: then keep to one writer per store. A store that is read-only to this
    process (the lock file cannot be created) is read without a lock.
    """
    global _lock_warned
    try:
        fd = os.open(_LOCK_NAME, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, 0o644, dir_fd=root_fd)
    except OSError as error:
        if error.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        yield  # a read-only store: reading needs no lock, and any write fails on its own
        return
    try:
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)
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


class HashingWriter:
    """A write-only file object that hashes (SHA-256) and counts what it writes to a raw descriptor."""

    def __init__(self, fd: int) -> None:
        """Wrap the open descriptor ``fd`` (the caller closes it)."""
        self._fd = fd
        self._sha = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        """Write a bytes-like object completely and return its length."""
        view = memoryview(data).cast("B")
        self._sha.update(view)
        _write_all(self._fd, view)
        self.size += len(view)
        return len(view)

    def flush(self) -> None:
        """Nothing is buffered (``fsync`` happens when the file is closed by :func:`write_file`)."""

    def hexdigest(self) -> str:
        """The SHA-256 of everything written so far."""
        return self._sha.hexdigest()


def write_file(dir_fd: int, name: str, produce: Callable[[HashingWriter], None]) -> dict[str, Any]:
    """Create ``name`` in ``dir_fd`` (it must not exist), let ``produce`` fill it, ``fsync`` and close it.

    Returns:
        ``{"sha256": <hex>, "bytes": <size>}`` of what was written.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
    try:
        writer = HashingWriter(fd)
        produce(writer)
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"sha256": writer.hexdigest(), "bytes": writer.size}


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The raw little-endian bytes of one tensor, copied to CPU only if it is elsewhere."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data.cast("B")


def write_safetensors(
    dir_fd: int, name: str, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Stream ``tensors`` into a safetensors file ``name`` (see the module docstring for the layout).

    Every tensor must be dense, strided and of a dtype in :data:`SAFETENSORS_DTYPES` (checked by the caller).
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

    return write_file(dir_fd, name, produce)


def _describe_kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def read_verified(dir_fd: int, name: str, size: int, sha256: str, where: str, *, keep: bool = True) -> bytes:
    """Read ``name`` completely and check its size and SHA-256 against the manifest.

    The bytes that are hashed are exactly the bytes returned (no second read), and the file is opened with
    ``O_NOFOLLOW`` and checked to be a regular file. With ``keep=False`` the file is hashed in chunks and
    ``b""`` is returned (for parts that are verified but not loaded).

    Raises:
        CheckpointError: missing, a symlink or not a regular file, the wrong size, or the wrong hash; the
            message names ``where`` (the file's path).
    """
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        msg = f"checkpoint file {where} is missing (listed in manifest.json); nothing was restored."
        raise CheckpointError(msg) from None
    if not stat.S_ISREG(info.st_mode):
        msg = f"checkpoint file {where} is {_describe_kind(info.st_mode)}, refusing it; nothing was restored."
        raise CheckpointError(msg)
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC, dir_fd=dir_fd)
    except OSError as error:  # swapped for a symlink after the check: ELOOP
        msg = f"checkpoint file {where} could not be opened safely ({error}); nothing was restored."
        raise CheckpointError(msg) from None
    with os.fdopen(fd, "rb", buffering=0) as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            msg = f"checkpoint file {where} is not a regular file, refusing it; nothing was restored."
            raise CheckpointError(msg)
        if keep:
            data = handle.read(size + 1) or b""
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
    if length != size:
        found = f"{length}" if length <= size else f"more than {size}"
        msg = (
            f"checkpoint file {where} has {found} bytes, but manifest.json records {size} "
            "(truncated or modified); nothing was restored."
        )
        raise CheckpointError(msg)
    if digest != sha256:
        msg = (
            f"checkpoint file {where} fails its SHA-256 check (manifest {sha256[:16]}..., "
            f"file {digest[:16]}...): "
            "it was modified or corrupted; nothing was restored."
        )
        raise CheckpointError(msg)
    return data


def read_small(dir_fd: int, name: str, limit: int, where: str) -> bytes:
    """Read a small regular file (manifest, index) without following symlinks, refusing over ``limit``."""
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC, dir_fd=dir_fd)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.EMLINK):
            msg = f"{where} is a symlink, refusing it."
            raise CheckpointError(msg) from None
        raise
    with os.fdopen(fd, "rb", buffering=0) as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            msg = f"{where} is not a regular file, refusing it."
            raise CheckpointError(msg)
        data = handle.read(limit + 1) or b""
    if len(data) > limit:
        msg = f"{where} is larger than {limit} bytes, refusing it."
        raise CheckpointError(msg)
    return data


def write_small_atomic(dir_fd: int, name: str, data: bytes, temp_prefix: str) -> None:
    """Replace ``name`` in ``dir_fd`` atomically: write a temporary sibling, fsync, rename, fsync the dir."""
    temp = f"{temp_prefix}{random_suffix()}"

    def produce(writer: HashingWriter) -> None:
        writer.write(data)

    try:
        write_file(dir_fd, temp, produce)
        rename(temp, name, dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise


def remove_tree(name: str, dir_fd: int) -> None:
    """Delete the directory ``name`` in ``dir_fd`` and everything in it, never following a symlink."""
    child = open_child_dir(name, dir_fd)
    try:
        for entry in os.listdir(child):
            info = os.stat(entry, dir_fd=child, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                remove_tree(entry, child)
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
