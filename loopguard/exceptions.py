"""Exceptions raised by loopguard.

Every exception loopguard raises on bad input subclasses both :class:`LoopguardError` and the builtin a
caller would expect (:class:`ValueError` or :class:`TypeError`), so ``except ValueError`` keeps working and
``except LoopguardError`` catches only loopguard's own complaints. Messages follow one shape:
"`name` must be <rule>, got <value>."

Example:
    >>> from loopguard.exceptions import ConfigError, LoopguardError
    >>> issubclass(ConfigError, ValueError) and issubclass(ConfigError, LoopguardError)
    True
"""

from __future__ import annotations

__all__ = [
    "CheckpointError",
    "CheckpointWriteError",
    "ConfigError",
    "InputError",
    "LoopguardError",
    "LoopguardTypeError",
    "MissingDependencyError",
    "StateError",
]


class LoopguardError(Exception):
    """Base class of every exception loopguard raises on purpose."""


class ConfigError(LoopguardError, ValueError):
    """A configuration value is out of range, not finite, or not one of the allowed names."""


class InputError(LoopguardError, ValueError):
    """An array or sequence input has the wrong shape, length, size, or non-finite values."""


class StateError(ConfigError):
    """A saved state cannot be loaded: malformed, truncated, unreachable, or from another version or config.

    Unreachable means a state no run could have produced: a NaN baseline, a beta outside the controller's
    bounds, counters that contradict each other. Subclasses :class:`ConfigError`. Whenever a
    ``load_state_dict`` or ``from_dict`` raises it, the object it was called on is unchanged: states load all
    or nothing.
    """


class LoopguardTypeError(LoopguardError, TypeError):
    """An argument has the wrong type (for example ``True`` where a number is expected)."""


class MissingDependencyError(LoopguardError, ImportError):
    """An optional dependency is not installed; the message names the extra that provides it."""


class CheckpointError(InputError):
    """A checkpoint cannot be restored: tampered, truncated, symlinked, malformed, or not matching.

    Subclasses :class:`InputError` (a ``ValueError``). The message names the checkpoint
    file and what is wrong with it; whenever it is raised by ``restore``, nothing live was modified.
    """


class CheckpointWriteError(LoopguardError, OSError):
    """Writing to a checkpoint store failed at the disk: full, over quota, file too large, or an I/O error.

    Subclasses :class:`OSError` (``except OSError`` keeps working) with the failing call's ``errno``
    (``errno.ENOSPC`` for a full disk, ``errno.EFBIG`` over a file-size limit) and ``filename`` (the path
    that could not be written). The message says what was not written and that the store is unchanged:
    earlier checkpoints and ``good.json`` stay intact, and a later save succeeds once space is back.

    Example:
        >>> import errno
        >>> error = CheckpointWriteError(errno.ENOSPC, "could not write /store/good.json", "/store/good.json")
        >>> isinstance(error, OSError), error.errno == errno.ENOSPC, str(error)
        (True, True, 'could not write /store/good.json')
    """

    def __str__(self) -> str:
        """The message alone (``OSError`` would prefix the errno and append the file name)."""
        return str(self.strerror)
