"""Run identity: the name that keeps one training run's checkpoints, log records and state apart from another's.

A run identity is made once, when a run starts fresh, and kept across a genuine ``resume_from_checkpoint``
(the adapters write it into every checkpoint they touch). It is a short printable string: the UTC start time
and 8 random hex digits, e.g. ``"20261201T161406Z-3f9a2c1b"``, so two runs started in the same second never
share one and a person reading a directory listing or a log can tell them apart. Any string matching
:data:`RUN_ID_PATTERN` is accepted as an identity (a user may choose their own).

Example:
    >>> run = new_run_id()
    >>> check_run_id("run", run) == run
    True
    >>> check_run_id("run", "../other")
    Traceback (most recent call last):
    ...
    loopguard.exceptions.ConfigError: `run` must be 1-64 characters of letters, digits, '.', '_' or '-', starting with a letter or digit, got '../other'.
"""  # noqa: E501

from __future__ import annotations

import datetime as dt
import re
import secrets

from loopguard._validation import describe
from loopguard.exceptions import ConfigError, LoopguardTypeError

__all__ = ["RUN_ID_PATTERN", "check_run_id", "new_run_id"]

RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""What a run identity may look like: safe as a file name, a JSON string and a log field."""


def new_run_id() -> str:
    """A fresh run identity: the UTC time now and 8 random hex digits."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(4)}"


def check_run_id(name: str, value: object) -> str:
    """Validate a run identity (see :data:`RUN_ID_PATTERN`).

    Raises:
        LoopguardTypeError: ``value`` is not a string.
        ConfigError: ``value`` does not match the pattern.
    """
    if not isinstance(value, str):
        msg = f"`{name}` must be a run identity string, got {describe(value)} of type {type(value).__name__}."
        raise LoopguardTypeError(msg)
    if RUN_ID_PATTERN.fullmatch(value) is None:
        msg = (
            f"`{name}` must be 1-64 characters of letters, digits, '.', '_' or '-', starting with a letter "
            f"or digit, got {describe(value)}."
        )
        raise ConfigError(msg)
    return value
