"""The mitigation log: one versioned JSON record per training step, written safely from inside training.

Every step a Guard decides something about can be recorded as a :class:`MitigationRecord` (what the
detectors saw, the verdict, the action, beta before and after, a plain-English explanation) and appended to
a JSON Lines file by a :class:`MitigationLog`. :func:`read_mitigation_log` reads the records back.

The writer is built to run inside a training loop that must not die because of it:

* **Line-atomic appends.** Each record is one line written with a single ``os.write`` on a descriptor
  opened with ``O_APPEND``, under an exclusive ``flock`` on that file (released if the process dies; the
  primitive ``filelock`` uses on POSIX) shared by every loopguard writer of it, so records from several
  processes never interleave and a rotation by one process is seen by the others.
* **Size rotation.** When the file would grow past ``max_bytes`` it is renamed ``path.1`` (older backups
  shift to ``path.2`` ... ``path.<backups>``; the oldest is dropped). Hand-written because
  ``logging.handlers.RotatingFileHandler`` rotates per process, so several writers of one file would
  interleave records or lose them at a rotation.
* **No writing through symlinks.** The file is opened with ``O_NOFOLLOW`` and checked with ``os.lstat``
  before it is rotated; a symlinked log file is refused (its target stays untouched).
* **Secrets redacted.** Access tokens and API keys (Hugging Face, OpenAI, Anthropic, GitHub, AWS),
  values of ``api_key=``/``token:``/``"password": "..."``-style pairs, HTTP authorization credentials, URL
  passwords and private-key blocks in any string become ``[REDACTED]`` before anything reaches the disk
  (see :func:`redact_secrets`); dictionary keys holding one are renamed ``[REDACTED]``, ``[REDACTED#2]``,
  ... so that no entry is lost. Hand-written because secret scanners (detect-secrets) report findings in
  files; none rewrites the values of a JSON tree before it is written.
* **Never raises into training.** A failure warns once per :class:`MitigationLog` and
  :meth:`MitigationLog.append` returns ``False``; later appends keep trying.

The record schema (version :data:`LOG_SCHEMA_VERSION`) is documented in ``docs/log.md`` and on
:class:`MitigationRecord`.

Example:
    >>> import os, tempfile
    >>> from loopguard.log import MitigationLog, MitigationRecord, read_mitigation_log
    >>> folder = tempfile.mkdtemp()
    >>> log = MitigationLog(os.path.join(folder, "runs", "mitigation.jsonl"))
    >>> log.append(MitigationRecord(step=0, mode="kl_control", verdict="OK"))
    True
    >>> [(r["step"], r["verdict"], r["action"]) for r in read_mitigation_log(log.path)]
    [(0, 'OK', 'none')]
"""

from __future__ import annotations

import errno
import json
import math
import numbers
import os
import re
import stat
import time
import types
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, cast

import attrs

from loopguard._run import check_run_id
from loopguard._saved_state import open_regular
from loopguard._types import ACTIONS, VERDICTS, Action, Verdict
from loopguard._validation import (
    MAX_NAME_LENGTH,
    check_bool,
    check_choice,
    check_int,
    check_name,
    check_number_type,
    check_path,
    check_text,
    describe,
    is_bool,
    name_string,
    one_of,
    plain_row,
    real,
)
from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError

if TYPE_CHECKING:
    from loopguard.guard import Decision, Guard, Observation

__all__ = [
    "ACTIONS",
    "EVENTS",
    "LOG_SCHEMA_VERSION",
    "MAX_EXPLANATION_LENGTH",
    "MAX_EXTRA_DEPTH",
    "MAX_RECORD_BYTES",
    "MAX_SIGNALS",
    "VERDICTS",
    "Action",
    "MitigationLog",
    "MitigationRecord",
    "RunLog",
    "Verdict",
    "read_mitigation_log",
    "redact_secrets",
    "split_runs",
]

LOG_SCHEMA_VERSION = 2
"""Version written in every record's ``"schema"`` key; readers refuse records from a newer version.

Version 2 added ``run`` and ``event``; version-1 records still read (as decisions of an unnamed run)."""

EVENTS: tuple[str, ...] = ("decision", "start", "resume", "error")
"""What a record is: a Guard ``decision`` for one step, or the ``start`` / ``resume`` of a training session,
or an ``error`` inside loopguard while training ran (the failure policy's durable trace)."""

MAX_EXPLANATION_LENGTH = 4096
"""Longest accepted ``explanation``, in characters."""

MAX_SIGNALS = 256
"""Most entries accepted in a record's ``signals`` mapping."""

MAX_EXTRA_DEPTH = 8
"""Deepest nesting of lists and objects accepted in a record's ``extra`` value."""

MAX_RECORD_BYTES = 2**20
"""Largest serialised record (one line, newline included) the writer accepts, in bytes."""


_MAX_BACKUPS = 100
_MIN_MAX_BYTES = 1024
_OPEN_RETRIES = 16
_POSIX = os.name == "posix"  # Windows locks are mandatory (they would block readers): appends go unlocked
if _POSIX:
    import fcntl
_NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC: int = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK: int = getattr(os, "O_NONBLOCK", 0)
# one encoder for every record (json.dumps with these options builds a new one per call). No check for
# circular references: a record's JSON is a tree loopguard built (_json_body, with ``extra`` copied by
# _json_tree, which refuses nesting deeper than MAX_EXTRA_DEPTH), so it holds no cycle, and the check's
# bookkeeping (an entry per container the encoder enters) is spared: about 1 of a record's 19 us (warm).
_ENCODER = json.JSONEncoder(ensure_ascii=True, allow_nan=False, check_circular=False, separators=(",", ":"))
_REDACTED = "[REDACTED]"
# What redact_secrets replaces. re.ASCII: the case-insensitive parts fold ASCII letters only (else "ſ" and
# the Kelvin sign would match "s" and "k", and JSON would escape them out of _SECRET_HINT's sight). Every
# alternative consumes whole runs of the characters it accepts, or ends where no match can start, so
# redacting twice gives what redacting once gives (a hypothesis test checks it).
_SECRET = re.compile(
    r"""
    # a credential given as a pair: key=value, key: value, "key": "value", 'key': 'value' (an Authorization
    # header too); the key and the separator are kept, only the value is redacted
    (?P<key>(?i:api[_-]?key|access[_-]?key|secret[_-]?key|secret|token|passw(?:or)?d|authorization)
        ["']?\s*[:=]\s*)
    (?:
        (?P<quote>["'])(?:(?!(?P=quote))[^\\]|\\[\s\S])+(?P<close>(?P=quote))?  # quoted, escapes honoured
      | (?:(?i:bearer|basic|token|digest)\s+)?                    # bare, with its auth scheme word
        (?:\[REDACTED(?:\#[0-9]+)?\]|[^\s"',;&)\]}]+)             # up to a delimiter
    )
    # the password in a URL's user info: scheme://user:password@host
  | (?P<userinfo>://[^\s/?\#@:\[\]]*:)[^\s/?\#@\[\]]+(?=@)
    # Hugging Face access tokens (and the rest of the word), never inside a word
  | (?<![A-Za-z0-9])hf_[A-Za-z0-9]{20,}[A-Za-z0-9_-]*
    # OpenAI and Anthropic keys, never inside a word ("task-oriented"): sk- and 20+ letters or digits
    # (legacy keys), or a known prefix and 20+ base64url characters (sk-proj-, sk-svcacct-, sk-admin-,
    # sk-None-, sk-ant-api03-...), or 20+ base64url characters holding upper and lower case and a digit
  | (?<![A-Za-z0-9])sk-(?:
        [A-Za-z0-9]{20,}[A-Za-z0-9_-]*
      | (?:proj|svcacct|admin|None|ant)-[A-Za-z0-9_-]{20,}
      | (?=[A-Za-z0-9_-]{0,200}?[0-9])(?=[A-Za-z0-9_-]{0,200}?[A-Z])(?=[A-Za-z0-9_-]{0,200}?[a-z])
        [A-Za-z0-9_-]{20,}
    )
    # GitHub tokens: classic (ghp_, gho_, ghu_, ghs_, ghr_) and fine-grained (github_pat_)
  | (?<![A-Za-z0-9])gh[pousr]_[A-Za-z0-9]{36,}
  | (?<![A-Za-z0-9])github_pat_[A-Za-z0-9_]{36,}
    # AWS access key ids (long-term AKIA..., temporary ASIA...): 16 more upper-case letters or digits
  | (?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])
    # HTTP bearer credentials (RFC 6750 token68), any case; the word goes with the token
  | (?i:\bbearer)\s+[A-Za-z0-9\-._~+/]+=*
    # PEM private keys, to the END line (or to the end of the text when it was cut short)
  | -----BEGIN[ A-Z0-9]*PRIVATE[ ]KEY-----[\s\S]*?(?:-----END[ A-Z0-9]*PRIVATE[ ]KEY-----|\Z)
    """,
    re.ASCII | re.VERBOSE,
)
_FIELD_ORDER = (
    "run",
    "event",
    "step",
    "mode",
    "verdict",
    "vote",
    "signals",
    "beta_before",
    "beta_after",
    "action",
    "reward_mean",
    "reward_std",
    "length_mean",
    "repetition",
    "explanation",
)
_REQUIRED_ON_DISK = {
    1: frozenset(("schema", "ts", *(name for name in _FIELD_ORDER if name not in ("run", "event")))),
    2: frozenset(("schema", "ts", *_FIELD_ORDER)),
}
# Every secret _SECRET matches contains one of these ASCII fragments, which JSON never escapes: a record
# whose serialised text has none of them needs no redaction pass (the common case, and the fast path).
# Keep it a superset when _SECRET grows: a hypothesis test checks it on strings and on their JSON text.
_SECRET_FRAGMENTS = (
    *("hf_", "sk-", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "akia", "asia", "bearer", "key"),
    *("secret", "token", "passw", "authorization", "://"),
)
_SECRET_HINT = re.compile("|".join(map(re.escape, _SECRET_FRAGMENTS)), re.ASCII | re.IGNORECASE)
_GITHUB_FRAGMENTS = tuple(fragment for fragment in _SECRET_FRAGMENTS if "gh" in fragment)
_SECRET_SCANNED = tuple(fragment for fragment in _SECRET_FRAGMENTS if "gh" not in fragment)


def _may_hold_secret(ascii_text: str) -> bool:
    """Whether :data:`_SECRET_HINT` matches ``ascii_text``, an ASCII string (JSON with ``ensure_ascii``).

    One lowercased copy and a substring test per fragment (GitHub's six behind a test for their common
    ``gh``): the same answer on ASCII text (where ``lower`` is the ASCII case folding of ``re.ASCII |
    re.IGNORECASE``) at a small fraction of the regex's cost (an alternation is tried at every position of
    a record of a kilobyte or more).
    """
    lowered = ascii_text.lower()
    if any(fragment in lowered for fragment in _SECRET_SCANNED):
        return True
    # GitHub's six prefixes all contain "gh": one scan for it, and theirs only where it occurs
    return "gh" in lowered and any(fragment in lowered for fragment in _GITHUB_FRAGMENTS)
_TS_PATTERN = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")


def redact_secrets(text: str) -> str:
    """Replace credentials in ``text`` with ``[REDACTED]``.

    Recognised (prefixes are case-sensitive unless said otherwise):

    * Hugging Face tokens: ``hf_`` and at least 20 letters or digits, redacted to the end of the word
      (``_`` and ``-`` included).
    * OpenAI and Anthropic keys, not inside a word: ``sk-`` and at least 20 letters or digits (legacy
      keys); ``sk-proj-``, ``sk-svcacct-``, ``sk-admin-``, ``sk-None-`` or ``sk-ant-`` and at least 20
      base64url characters (``sk-ant-api03-...``); or ``sk-`` and at least 20 base64url characters among
      which an upper-case letter, a lower-case letter and a digit.
    * GitHub tokens: ``ghp_``, ``gho_``, ``ghu_``, ``ghs_`` or ``ghr_`` and at least 36 letters or
      digits; fine-grained ``github_pat_`` and at least 36 of ``[A-Za-z0-9_]``.
    * AWS access key ids: ``AKIA`` or ``ASIA`` and exactly 16 upper-case letters or digits, as a word.
    * The value of a credential pair, its key and separator kept: a key ending in ``api_key``,
      ``apikey``, ``api-key``, ``access_key`` (so ``aws_secret_access_key``), ``secret_key``, ``secret``,
      ``token``, ``password``, ``passwd`` or ``authorization`` (any case), an optional closing quote,
      then ``=`` or ``:``. The value is the quoted string that follows (``"..."`` or ``'...'``, escapes
      honoured), or else a run up to whitespace, a quote, ``,;&`` or ``)]}``, with the scheme word
      before it (``Bearer``, ``Basic``, ``Token``, ``Digest``). So ``token=abc&x=1`` becomes
      ``token=[REDACTED]&x=1``, ``{"password": "a b"}`` becomes ``{"password": "[REDACTED]"}`` and
      ``Authorization: Basic dXNlcjpw`` becomes ``Authorization: [REDACTED]``.
    * HTTP bearer credentials anywhere: ``Bearer`` (any case), whitespace and an RFC 6750 token; the
      word goes with the token.
    * The password of a URL's user info: ``https://user:[REDACTED]@host``.
    * PEM private keys: ``-----BEGIN ... PRIVATE KEY-----`` to its ``END`` line.

    Not recognised: a secret with neither a telling prefix nor a key name before it (a bare password, a
    hex string, a JWT without ``Bearer``, an AWS secret key on its own), and other vendors' prefixes.
    Ordinary text such as ``task-oriented``, ``sk-learn``, ``hf_hub_download``, ``max_new_tokens=64``,
    git SHAs and UUIDs is left alone. The patterns err on the side of redacting: a false positive loses a
    few characters of a log line, a false negative leaks a credential. Redacting twice gives the same
    text as redacting once.

    Args:
        text: Any string.

    Returns:
        ``text`` with every match replaced.

    Example:
        >>> redact_secrets("pushed with hf_" + "a" * 34 + " ok")
        'pushed with [REDACTED] ok'
        >>> redact_secrets("Authorization: Bearer eyJhbGciOi.J9x-_y")
        'Authorization: [REDACTED]'
        >>> redact_secrets('{"api_key": "abc 123", "task": "task-oriented"}')
        '{"api_key": "[REDACTED]", "task": "task-oriented"}'
    """
    return _SECRET.sub(_replace_secret, text)


def _replace_secret(match: re.Match[str]) -> str:
    """Replace one :data:`_SECRET` match, keeping a pair's key (and quotes) or a URL's user name."""
    key = match.group("key")
    if key is not None:
        return f"{key}{match.group('quote') or ''}{_REDACTED}{match.group('close') or ''}"
    userinfo = match.group("userinfo")
    if userinfo is not None:
        return f"{userinfo}{_REDACTED}"
    return _REDACTED


def _redact_text(text: str) -> str:
    """Redact one string of a record without pushing it past a length limit of the record schema.

    ``[REDACTED]`` can be longer than what it replaces (``token=1``), and a record must stay readable: a
    string of at most ``MAX_NAME_LENGTH`` (64) characters (a mode, a name) or of at most
    :data:`MAX_EXPLANATION_LENGTH` characters that redaction would make longer than that limit becomes
    ``[REDACTED]`` as a whole.
    """
    redacted = redact_secrets(text)
    if len(redacted) > len(text):
        for limit in (MAX_NAME_LENGTH, MAX_EXPLANATION_LENGTH):
            if len(text) <= limit < len(redacted):
                return _REDACTED
    return redacted


def _redacted_name(number: int) -> str:
    return _REDACTED if number == 1 else f"[REDACTED#{number}]"


def _redact_tree(value: Any) -> Any:
    """Redact every string in a JSON tree, dictionary keys included (returns a new tree).

    A key that holds a secret is replaced as a whole, in key order, by the first free name among
    ``[REDACTED]``, ``[REDACTED#2]``, ``[REDACTED#3]``, ...: never a key of the same mapping that stays as
    it is, nor a name given before, so no two entries collapse into one and no value is lost. Keys keep
    their order, the same tree always gives the same result, and redacting that result changes nothing.

    Example:
        >>> token = "hf_" + "a" * 30
        >>> _redact_tree({token + "1": 1, "[REDACTED]": 2, token + "2": [f"token={token}"]})
        {'[REDACTED#2]': 1, '[REDACTED]': 2, '[REDACTED#3]': ['token=[REDACTED]']}
    """
    if isinstance(value, str):
        return _redact_text(value)
    if isinstance(value, dict):
        secret = {key: redact_secrets(key) != key for key in value}
        taken = {key for key, holds in secret.items() if not holds}
        result: dict[str, Any] = {}
        number = 0
        for key, item in value.items():
            name = key
            if secret[key]:
                number += 1
                while _redacted_name(number) in taken:
                    number += 1
                name = _redacted_name(number)
                taken.add(name)
            result[name] = _redact_tree(item)
        return result
    if isinstance(value, list):
        return [_redact_tree(item) for item in value]
    return value


# --------------------------------------------------------------------------------------------------
# the record


def _finite_or_none(name: str, value: object) -> float | None:
    """A real number as ``float``; NaN and +-Inf become ``None``; bools and non-numbers are rejected."""
    if value is None:
        return None
    if type(value) is float:  # the common case, without the numbers.Real ABC check
        return value if math.isfinite(value) else None
    check_number_type(name, value, numbers.Real, "a real number or None")
    result = float(cast(numbers.Real, value))
    return result if math.isfinite(result) else None


def _convert_signals(value: object) -> Mapping[str, float | None]:
    """Copy ``signals`` into a read-only ``{name: float | None}`` mapping (non-finite values -> None)."""
    if not isinstance(value, Mapping):
        msg = f"`signals` must be a mapping of name -> float or None, got {describe(value)}."
        raise LoopguardTypeError(msg)
    if len(value) > MAX_SIGNALS:
        msg = f"`signals` must have at most {MAX_SIGNALS} entries, got {len(value)}."
        raise ConfigError(msg)
    if plain_row(value.values(), _FLOAT_OR_NONE) and _plain_names(value.keys()):
        return types.MappingProxyType(dict(value))  # what a Guard's decision holds: names, finite floats
    result: dict[str, float | None] = {}
    for key, item in value.items():
        name = check_name("signals key", key)
        if type(item) is float:  # the common case, without building the name of a value that is fine
            result[name] = item if math.isfinite(item) else None
        else:
            result[name] = _finite_or_none(f"signals[{name!r}]", item)
    return types.MappingProxyType(result)


def _plain_names(keys: Any) -> bool:
    """Whether every key passes :func:`check_name` (exact ``str``), read at once."""
    if not keys:
        return True
    return (
        set(map(type, keys)) == {str}
        and all(keys)
        and max(map(len, keys)) <= MAX_NAME_LENGTH
        and "\x00" not in "".join(keys)
    )


def _plain_leaf(value: object) -> bool:
    """A leaf that :func:`_json_tree` keeps as it is: None, or a str, int or finite float (exact types)."""
    kind = type(value)
    if kind is float:
        return math.isfinite(cast(float, value))
    return value is None or kind is str or kind is int


_PLAIN_LEAF_TYPES: frozenset[type] = frozenset((type(None), str, int, float))
_FLOAT_OR_NONE: frozenset[type] = frozenset((float, type(None)))


def _json_tree(name: str, value: object, depth: int) -> Any:
    """Copy ``value`` into plain JSON types (tuples -> lists, numpy scalars -> Python, non-finite -> None)."""
    if value is None or isinstance(value, str):
        return value
    kind = type(value)
    # a dict or list (what loopguard builds) is no number: the container branch without the numbers ABC checks
    if kind is not dict and kind is not list:
        if is_bool(value):
            return bool(value)
        if isinstance(value, numbers.Integral):
            return int(value)
        if isinstance(value, numbers.Real):
            return _finite_or_none(name, value)
    if isinstance(value, (Mapping, list, tuple)):
        if depth >= MAX_EXTRA_DEPTH:
            msg = f"`{name}` must be nested at most {MAX_EXTRA_DEPTH} levels deep, got deeper."
            raise ConfigError(msg)
        if isinstance(value, Mapping):
            if plain_row(value.values(), _PLAIN_LEAF_TYPES) and set(map(type, value)) <= {str}:
                return dict(value)
            tree: dict[str, Any] = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    msg = f"`{name}` keys must be strings, got {describe(key)} of type {type(key).__name__}."
                    raise LoopguardTypeError(msg)
                tree[key] = item if _plain_leaf(item) else _json_tree(f"{name}[{key!r}]", item, depth + 1)
            return tree
        if plain_row(value, _PLAIN_LEAF_TYPES):
            return list(value)
        return [
            item if _plain_leaf(item) else _json_tree(f"{name}[{index}]", item, depth + 1)
            for index, item in enumerate(value)
        ]
    msg = (
        f"`{name}` must hold only None, bool, int, float, str, lists and string-keyed mappings, "
        f"got {describe(value)} of type {type(value).__name__}."
    )
    raise LoopguardTypeError(msg)


def _convert_extra(value: object) -> Mapping[str, Any] | None:
    """Copy ``extra`` into a read-only mapping of plain JSON values, or keep ``None``."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        msg = f"`extra` must be a mapping or None, got {describe(value)} of type {type(value).__name__}."
        raise LoopguardTypeError(msg)
    tree = _json_tree("extra", value, 0)
    return types.MappingProxyType(tree)


def _check_mapping(value: object) -> None:
    if not isinstance(value, Mapping):
        msg = f"`record` must be a MitigationRecord or a mapping, got {describe(value)} of type "
        msg += f"{type(value).__name__}."
        raise LoopguardTypeError(msg)


def _check_explanation(_instance: Any, _attribute: Any, value: Any) -> None:
    check_text("explanation", value, max_length=MAX_EXPLANATION_LENGTH, allow_empty=True)


def _check_step(_instance: Any, _attribute: Any, value: Any) -> None:
    check_int("step", value, lo=0)


def _check_run(_instance: Any, _attribute: Any, value: Any) -> None:
    if value is not None:
        check_run_id("run", value)


@attrs.frozen
class MitigationRecord:
    """One record of the mitigation log (schema version :data:`LOG_SCHEMA_VERSION`): a decision, or an event.

    On disk a record is one JSON object on one line, keys in this order: ``schema`` (int), ``ts`` (ISO-8601
    UTC time with milliseconds, e.g. ``"2026-05-09T07:35:25.123Z"``, written by :class:`MitigationLog` when
    it appends: the record itself carries no time, since controllers never read the clock), then the
    attributes below, then ``extra`` when it is not ``None``. Optional numbers are written as ``null``
    when absent.

    Attributes:
        step: Training step, an int >= 0 (for ``start``/``resume``: the step the session starts at).
        mode: The Guard mode (``"log_only"``, ``"kl_control"``, ...): a non-empty name of at most 64
            characters.
        verdict: ``"OK"``, ``"WARN"`` or ``"HACK"``; required for a decision, ``None`` for other events.
        vote: The combined hack score in [0, 1], or ``None`` (e.g. during warm-up).
        signals: Per-signal scores, name -> float or ``None``; at most :data:`MAX_SIGNALS` entries.
            Non-finite values (NaN, +-Inf) are stored as ``None`` (JSON ``null``), never as invalid JSON.
        beta_before: KL coefficient before this step's decision (>= 0), or ``None``.
        beta_after: KL coefficient after it (>= 0), or ``None``.
        action: ``"none"``, ``"raise_beta"``, ``"lower_beta"``, ``"rollback"`` or ``"stop"``.
        reward_mean: Mean reward of the batch, or ``None``.
        reward_std: Standard deviation of the batch's rewards (>= 0), or ``None``.
        length_mean: Mean completion length (>= 0), or ``None``.
        repetition: Repetition rate of the batch in [0, 1], or ``None``.
        explanation: Plain-English reason for the verdict and action; at most
            :data:`MAX_EXPLANATION_LENGTH` characters, no null bytes; may be empty.
        extra: Optional free-form mapping of JSON values (string keys, nested at most
            :data:`MAX_EXTRA_DEPTH` levels); tuples become lists, numpy scalars become Python numbers and
            non-finite floats become ``None``.
        run: The identity of the training run that wrote the record (see ``docs/trl.md``, run identity), or
            ``None`` when unknown; :func:`split_runs` keeps the runs of a shared log apart.
        event: ``"decision"`` (default: the Guard's decision for ``step``), ``"start"`` (a session started
            fresh at ``step``), ``"resume"`` (a session resumed the run from its checkpoint of ``step``: the
            run's records after ``step`` written before this one belong to an abandoned timeline) or
            ``"error"`` (loopguard failed at ``step``; the explanation says what, and training went on).

    Raises:
        LoopguardTypeError: a field has the wrong type (``True`` for a number, a list for ``signals``).
        ConfigError: a field is out of range, non-finite (except inside ``signals``/``extra``), not in its
            allowlist, or too long.

    Example:
        >>> record = MitigationRecord(
        ...     step=12, mode="kl_control", verdict="HACK", vote=0.71, signals={"repetition": float("nan")},
        ...     beta_before=0.01, beta_after=0.015, action="raise_beta",
        ...     explanation="raised beta 0.010 -> 0.015: vote 0.71 >= trip 0.30 for 2 steps")
        >>> record.signals["repetition"] is None
        True
        >>> MitigationRecord(step=-1, mode="kl_control", verdict="OK")
        Traceback (most recent call last):
        ...
        loopguard.exceptions.ConfigError: `step` must be >= 0, got -1.
    """

    step: int = attrs.field(validator=_check_step)
    mode: str = attrs.field(validator=name_string())
    verdict: Verdict | None = attrs.field(default=None, validator=one_of(*VERDICTS, optional=True))
    vote: float | None = attrs.field(default=None, validator=real(lo=0.0, hi=1.0, optional=True))
    signals: Mapping[str, float | None] = attrs.field(factory=dict, converter=_convert_signals)
    beta_before: float | None = attrs.field(default=None, validator=real(lo=0.0, optional=True))
    beta_after: float | None = attrs.field(default=None, validator=real(lo=0.0, optional=True))
    action: Action = attrs.field(default="none", validator=one_of(*ACTIONS))
    reward_mean: float | None = attrs.field(default=None, validator=real(optional=True))
    reward_std: float | None = attrs.field(default=None, validator=real(lo=0.0, optional=True))
    length_mean: float | None = attrs.field(default=None, validator=real(lo=0.0, optional=True))
    repetition: float | None = attrs.field(default=None, validator=real(lo=0.0, hi=1.0, optional=True))
    explanation: str = attrs.field(default="", validator=_check_explanation)
    extra: Mapping[str, Any] | None = attrs.field(default=None, converter=_convert_extra)
    run: str | None = attrs.field(default=None, validator=_check_run)
    event: str = attrs.field(default="decision", validator=one_of(*EVENTS))

    def __attrs_post_init__(self) -> None:
        """A decision has a verdict; an event has none."""
        if (self.event == "decision") != (self.verdict is not None):
            msg = (
                f"`verdict` must be given for a decision record and only for one, got verdict="
                f"{self.verdict!r} with event={self.event!r}."
            )
            raise ConfigError(msg)

    def to_json_dict(self) -> dict[str, Any]:
        """Return the record as plain JSON values: ``schema`` first, then the fields in schema order.

        The ``ts`` key is not included (the log adds it, right after ``schema``, when it appends);
        ``extra`` is included only when it is not ``None``. Numbers are Python ``int``/``float``
        (always finite) or ``None``. Secrets are not redacted here: :class:`MitigationLog` does that.

        Returns:
            A new ``dict``; mutating it does not change the record.

        Example:
            >>> MitigationRecord(step=3, mode="log_only", verdict="WARN", vote=0.4).to_json_dict()["vote"]
            0.4
        """
        data = self._json_body(None)
        if self.extra is not None:
            data["extra"] = _json_tree("extra", self.extra, 0)
        return data

    def _json_body(self, ts: str | None) -> dict[str, Any]:
        """:meth:`to_json_dict` for serialising at once: ``extra``'s nested values are shared, not copied.

        ``extra`` was converted into plain JSON values, in containers of the record's own, when the record
        was built; ``json.dumps`` only reads them, so the log writes them without a second copy. ``ts``,
        when given, follows ``schema`` (the line the log writes).
        """
        data: dict[str, Any] = {"schema": LOG_SCHEMA_VERSION}
        if ts is not None:
            data["ts"] = ts
        for name in _FIELD_ORDER:
            value = getattr(self, name)
            if name == "signals":
                value = dict(value)
            elif isinstance(value, float):
                value = float(value)  # a float subclass (numpy scalar) becomes a plain float
            data[name] = value
        data["step"] = int(self.step)
        if self.extra is not None:
            data["extra"] = dict(self.extra)
        return data

    @classmethod
    def from_decision(
        cls,
        decision: Decision,
        *,
        mode: str,
        observation: Observation | None = None,
        guard: Guard | None = None,
        run: str | None = None,
        adapter: Mapping[str, Any] | None = None,
    ) -> MitigationRecord:
        """Build the record of one Guard step from its decision (and the observation, for batch statistics).

        ``signals`` holds each signal's score under its name and each raw statistic as
        ``"<signal>.<statistic>"``; ``extra`` holds the controller's and ladder's components, the notes and
        the errors of the step, and, when ``guard`` (the Guard that decided) is given, its ``warn_level``,
        ``hack_level`` and ``warmup_steps``, so that a reader such as ``loopguard report`` draws the right
        bands. ``run`` is the identity of the run the decision belongs to; ``adapter``, what the adapter that
        stepped the Guard adds (its source, the beta it wrote, a rollback's outcome), goes to
        ``extra["adapter"]``.

        Example:
            >>> from loopguard import Guard, Observation
            >>> guard = Guard(mode="log_only")
            >>> obs = Observation(0, [1.0, 0.0], completions=["a b a b", "c d"])
            >>> record = MitigationRecord.from_decision(guard.step(obs), mode=guard.mode, observation=obs)
            >>> record.verdict, record.reward_mean, record.length_mean  # 2 completions of 4 and 2 words
            ('OK', 0.5, 3.0)
            >>> round(record.signals["repetition.rate"], 4)  # mean of 1/3 ("a b" repeats) and 0
            0.1667
        """
        reward_mean = reward_std = length_mean = None
        if observation is not None:
            # here: reading a log (`loopguard report`) needs neither numpy nor the kernels
            import numpy as np

            from loopguard.detectors import StepData
            from loopguard.signals._numeric import plain_mean, plain_std

            reward_mean = float(plain_mean(observation.rewards))
            reward_std = float(plain_std(observation.rewards))
            lengths = StepData(observation, warmup_steps=1).lengths
            # np.mean's arithmetic (a float64 sum of the int64 lengths, over their count) without its wrappers
            if lengths is not None and len(lengths):
                length_mean = float(np.add.reduce(lengths, dtype=np.float64)) / len(lengths)
        extra: dict[str, Any] = {}
        if decision.components:
            extra["components"] = dict(decision.components)
        if decision.notes:
            extra["notes"] = list(decision.notes)
        if decision.errors:
            extra["errors"] = list(decision.errors)
        if guard is not None:
            extra.update(
                warn_level=guard.warn_level, hack_level=guard.hack_level, warmup_steps=guard.warmup_steps
            )
        if adapter is not None:
            extra["adapter"] = dict(adapter)
        return cls(
            step=decision.step,
            mode=mode,
            verdict=decision.verdict,
            vote=decision.vote,
            signals={**decision.scores, **decision.raw},
            beta_before=decision.beta_before,
            beta_after=decision.beta_after,
            action=decision.action,
            reward_mean=reward_mean,
            reward_std=reward_std,
            length_mean=length_mean,
            repetition=decision.raw.get("repetition.rate"),
            explanation=decision.explanation,
            extra=extra or None,
            run=run,
        )

    @classmethod
    def from_json_dict(cls, data: Mapping[str, Any]) -> MitigationRecord:
        """Build a record from a mapping with the schema's keys (as written to, or read from, the log).

        ``ts`` is ignored; ``schema``, when present, must be 1 or :data:`LOG_SCHEMA_VERSION`. Keys other
        than the schema's are rejected, so a misspelt field is never dropped silently. Fields that are
        absent take their defaults (only ``step`` and ``mode`` are required, and ``verdict`` for a
        decision).

        Args:
            data: A mapping such as one element of :func:`read_mitigation_log`'s result.

        Returns:
            The validated record.

        Raises:
            LoopguardTypeError: ``data`` is not a mapping, or a field has the wrong type.
            ConfigError: unknown or missing keys, a wrong schema version, or an invalid field value.

        Example:
            >>> row = {"schema": 1, "ts": "2026-01-01T00:00:00.000Z", "step": 0, "mode": "log_only",
            ...        "verdict": "OK"}
            >>> MitigationRecord.from_json_dict(row).action
            'none'
        """
        _check_mapping(data)
        fields = {key: value for key, value in data.items() if key not in ("schema", "ts")}
        if "schema" in data:
            schema = data["schema"]
            if isinstance(schema, bool) or schema not in _REQUIRED_ON_DISK:
                msg = f"`schema` must be one of {sorted(_REQUIRED_ON_DISK)}, got {describe(schema)}."
                raise ConfigError(msg)
        allowed = (*_FIELD_ORDER, "extra")
        unknown = sorted(str(key) for key in fields if key not in allowed)
        if unknown:
            names = ", ".join(repr(key) for key in unknown)
            msg = f"`record` has unknown keys {names}; allowed: {', '.join(allowed)}."
            raise ConfigError(msg)
        missing = [key for key in ("step", "mode") if key not in fields]
        if missing:
            msg = f"`record` must have the keys 'step' and 'mode', missing {', '.join(missing)}."
            raise ConfigError(msg)
        return cls(**fields)


# --------------------------------------------------------------------------------------------------
# the writer


class _SymlinkRefusedError(OSError):
    """The log path (or a file to be rotated) is a symbolic link."""


# the last whole second stamped and its text up to the seconds: one immutable pair, read and replaced whole,
# so that threads stamping at once never mix two seconds
_STAMPED: tuple[int, str] = (-1, "")


def _utc_timestamp() -> str:
    """The current UTC time as ``YYYY-MM-DDTHH:MM:SS.mmmZ`` (milliseconds truncated, as ``isoformat`` does).

    The text up to the seconds is made once per second: every record is stamped, most within the second of
    the one before.
    """
    global _STAMPED
    now = time.time()
    second = math.floor(now)
    stamped = _STAMPED
    if stamped[0] != second:
        stamped = _STAMPED = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    return f"{stamped[1]}.{min(int((now - second) * 1000), 999):03d}Z"


def _refuse_symlink(path: str) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        msg = f"refusing to write through a symlink: {path!r}"
        raise _SymlinkRefusedError(errno.ELOOP, msg)


def _lock(fd: int) -> None:
    """Wait for the exclusive ``flock`` on ``fd`` (dropped if the process dies; POSIX only).

    A blocking ``flock``: an interrupted wait runs the signal's handler (a ``KeyboardInterrupt`` propagates)
    and otherwise resumes (PEP 475).
    """
    fcntl.flock(fd, fcntl.LOCK_EX)


class MitigationLog:
    """Append :class:`MitigationRecord` s to a JSON Lines file, rotating it by size; never raises.

    Each :meth:`append` opens the file (``O_RDWR | O_APPEND | O_CREAT | O_NOFOLLOW``, mode ``0o644``,
    parent directories created), locks it (an exclusive ``flock``), rotates if needed, writes the whole
    record line with one ``os.write`` and closes it. Holding no descriptor between appends keeps the
    object picklable (it can be handed to worker processes), lets rotation by another process or by
    ``logrotate`` take effect at the next record, and makes ``close()`` unnecessary. The cost is a few
    system calls per record; a training step is many orders of magnitude slower. Nothing is ``fsync``-ed:
    a record survives a crash of the process, not of the machine.

    Rotation: if the file is not empty and its size plus the new line would exceed ``max_bytes``,
    ``path.<backups-1>`` ... ``path.1`` are renamed one number up (``os.replace``, so ``path.<backups>``,
    the oldest, is dropped), ``path`` becomes ``path.1`` and the line starts a new ``path``. With
    ``backups=0`` the old file is deleted instead. A single line longer than ``max_bytes`` gets a file to
    itself. Several processes may append to the same file: the lock serialises them and a writer
    whose file was rotated away reopens ``path`` (POSIX only; on Windows appends are not coordinated, and
    NFS does not honour ``O_APPEND`` atomically).

    If the file does not end with a newline (a previous writer died mid-record), the next record starts
    with a newline, so that record stays intact; the cut record remains as a corrupt line, which
    :func:`read_mitigation_log` reports unless asked to skip it.

    Failures (an ``OSError``, a symlinked log file, a record that does not validate or serialise, a value
    that is neither a record nor a mapping) never propagate: the first one emits a single
    ``RuntimeWarning`` naming the path and the error, each makes :meth:`append` return ``False`` and is
    counted in :attr:`failures` (:attr:`last_error` keeps the latest message), and every later append tries
    again. ``KeyboardInterrupt`` and ``SystemExit`` do propagate.

    Args:
        path: Log file path (``str`` or ``os.PathLike``); the file's own name must not be a symlink
            (symlinked *directories* above it are fine, as on clusters with linked scratch space).
        max_bytes: Rotate before the file would exceed this many bytes; an int >= 1024. Default 10 MiB.
        backups: Rotated files to keep, an int in [0, 100]. Default 3.

    Raises:
        LoopguardTypeError: an argument has the wrong type (bool, float, bytes path).
        ConfigError: an argument is out of range, or the path is empty, too long or has a null byte.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "log.jsonl")
        >>> log = MitigationLog(path, max_bytes=4096, backups=2)
        >>> log.append({"step": 0, "mode": "log_only", "verdict": "OK",
        ...             "explanation": "token hf_" + "x" * 30 + " seen"})
        True
        >>> read_mitigation_log(path)[0]["explanation"]
        'token [REDACTED] seen'
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     log.append({"step": -1, "mode": "log_only", "verdict": "OK"})
        False
        >>> log.failures, len(caught), caught[0].category.__name__
        (1, 1, 'RuntimeWarning')
    """

    def __init__(
        self, path: str | os.PathLike[str], *, max_bytes: int = 10 * 2**20, backups: int = 3
    ) -> None:
        """Validate the arguments; nothing is opened or created until the first append."""
        self._path = check_path("path", path)
        self._max_bytes = check_int("max_bytes", max_bytes, lo=_MIN_MAX_BYTES)
        self._backups = check_int("backups", backups, lo=0, hi=_MAX_BACKUPS)
        self._warned = False
        self._written = 0
        self._failures = 0
        self._last_error: str | None = None
        # where this writer's last line ended: ((device, inode), size) of the file just after it
        self._end: tuple[tuple[int, int], int] | None = None

    @property
    def path(self) -> str:
        """The log file path, as given."""
        return self._path

    @property
    def max_bytes(self) -> int:
        """Size limit that triggers rotation."""
        return self._max_bytes

    @property
    def backups(self) -> int:
        """Number of rotated files kept."""
        return self._backups

    @property
    def written(self) -> int:
        """Records this object has written."""
        return self._written

    @property
    def failures(self) -> int:
        """Appends of this object that failed (each returned ``False``)."""
        return self._failures

    @property
    def last_error(self) -> str | None:
        """Message of the latest failure, or ``None`` if none happened."""
        return self._last_error

    def __repr__(self) -> str:
        """Show the path and the rotation settings."""
        return f"MitigationLog({self._path!r}, max_bytes={self._max_bytes}, backups={self._backups})"

    def append(self, record: MitigationRecord | Mapping[str, Any]) -> bool:
        """Append one record as one JSON line, stamped with the current UTC time and redacted.

        Args:
            record: A :class:`MitigationRecord`, or a mapping accepted by
                :meth:`MitigationRecord.from_json_dict` (validated the same way; a ``ts`` key is ignored,
                since the log stamps the time itself).

        Returns:
            ``True`` if the whole line was written, ``False`` if anything failed (see the class docstring;
            the first failure of this object also emits a ``RuntimeWarning``).

        Example:
            >>> import os, tempfile
            >>> log = MitigationLog(os.path.join(tempfile.mkdtemp(), "a.jsonl"))
            >>> log.append(MitigationRecord(step=1, mode="log_only", verdict="OK")), log.written
            (True, 1)
        """
        try:
            line = self._serialise(record)
            self._write_line(line)
        except Exception as error:  # a log failure must never stop training
            self._fail(error)
            return False
        self._written += 1
        return True

    # -- internals -----------------------------------------------------------------------------------

    def _serialise(self, record: object) -> bytes:
        if not isinstance(record, MitigationRecord):
            _check_mapping(record)
            record = MitigationRecord.from_json_dict(record)  # type: ignore[arg-type]
        data = record._json_body(_utc_timestamp())
        text = _ENCODER.encode(data)
        if _may_hold_secret(text):
            text = _ENCODER.encode(_redact_tree(data))
        line = (text + "\n").encode("ascii")
        if len(line) > MAX_RECORD_BYTES:
            msg = (
                f"record for step {record.step} is {len(line):,} bytes, "
                f"over the {MAX_RECORD_BYTES:,}-byte cap"
            )
            raise ConfigError(msg)
        return line

    def _open_locked(self) -> tuple[int, int, tuple[int, int]]:
        """Open ``path`` for appending and lock it; retry if another writer rotated it meanwhile.

        Returns the descriptor, the file's size under the lock (read from the ``lstat`` that checks the path
        still names the file, so it costs no second system call) and the file's ``(device, inode)``.
        """
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _CLOEXEC
        for _ in range(_OPEN_RETRIES):
            if not _NOFOLLOW:  # pragma: no cover - no O_NOFOLLOW: check first (racy, better than none)
                _refuse_symlink(self._path)
            try:
                fd = self._open(flags)
            except FileNotFoundError:
                parent = os.path.dirname(self._path)
                if not parent:
                    raise
                os.makedirs(parent, exist_ok=True)
                fd = self._open(flags)
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode):
                    msg = f"not a regular file: {self._path!r}"
                    raise OSError(errno.EINVAL, msg)
                file = (info.st_dev, info.st_ino)
                if not _POSIX:  # pragma: no cover - Windows
                    return fd, info.st_size, file
                _lock(fd)
                try:
                    current = os.lstat(self._path)
                except FileNotFoundError:
                    current = None
                if current is not None and (current.st_dev, current.st_ino) == file:
                    return fd, current.st_size, file
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # rotated away (or replaced) between open and lock: open the new file
        msg = f"{self._path!r} kept being replaced while opening it ({_OPEN_RETRIES} tries)"
        raise OSError(errno.EAGAIN, msg)

    def _open(self, flags: int) -> int:
        try:
            return os.open(self._path, flags, 0o644)
        except FileNotFoundError:
            raise
        except OSError as error:
            if os.path.islink(self._path):
                msg = f"refusing to write through a symlink: {self._path!r}"
                raise _SymlinkRefusedError(errno.ELOOP, msg) from error
            raise

    def _rotate(self) -> None:
        """Shift ``path`` -> ``path.1`` -> ... -> ``path.<backups>`` (caller holds the lock on ``path``)."""
        _refuse_symlink(self._path)
        if self._backups == 0:
            os.unlink(self._path)
            return
        for index in range(self._backups - 1, 0, -1):
            source = f"{self._path}.{index}"
            if os.path.lexists(source):
                os.replace(source, f"{self._path}.{index + 1}")
        os.replace(self._path, f"{self._path}.1")

    def _write_line(self, line: bytes) -> None:
        for _ in range(_OPEN_RETRIES):
            fd, size, file = self._open_locked()
            try:
                if size > 0 and size + len(line) > self._max_bytes:
                    self._rotate()
                    continue  # closing releases the lock; waiting writers see the inode change and reopen
                # a file that still ends where this writer's last line did ends with that line's newline;
                # any other end is read: a torn record there gets ours on a line of its own
                if size > 0 and (file, size) != self._end and os.pread(fd, 1, size - 1) != b"\n":
                    line = b"\n" + line
                written = os.write(fd, line)
                while written < len(line):  # only on a failing device; finish the line if the OS lets us
                    more = os.write(fd, line[written:])
                    if more <= 0:
                        msg = f"short write to {self._path!r}: {written} of {len(line)} bytes"
                        raise OSError(errno.EIO, msg)
                    written += more
                self._end = (file, size + written)
                return
            finally:
                os.close(fd)
        msg = f"{self._path!r} kept being rotated by other writers ({_OPEN_RETRIES} tries)"
        raise OSError(errno.EAGAIN, msg)

    def _fail(self, error: Exception) -> None:
        message = redact_secrets(f"{type(error).__name__}: {error}")
        self._failures += 1
        self._last_error = message
        if self._warned:
            return
        self._warned = True
        warnings.warn(
            f"loopguard could not write the mitigation log {self._path!r} ({message}); training continues, "
            "later records are still attempted, and this warning is not repeated for this log.",
            RuntimeWarning,
            stacklevel=3,
        )


# --------------------------------------------------------------------------------------------------
# the reader


def _rotated_paths(path: str) -> list[str]:
    """Existing ``path.1``, ``path.2``, ... (consecutive, at most 100), oldest (highest number) first."""
    found = []
    for index in range(1, _MAX_BACKUPS + 1):
        candidate = f"{path}.{index}"
        if not os.path.lexists(candidate):
            break
        found.append(candidate)
    return found[::-1]


def _read_bytes(path: str) -> bytes:
    def refuse(kind: str) -> Exception:
        if kind == "a symlink":
            return InputError(f"`path` must not be a symlink, got {path!r}.")
        return InputError(f"`path` must be a regular file, got {path!r}.")

    handle, _ = open_regular(path, refuse)
    with handle:
        return handle.read()


class _NewerSchemaError(Exception):
    """A record's schema version is newer than this module reads."""

    def __init__(self, schema: int) -> None:
        super().__init__(schema)
        self.schema = schema


def _reject_constant(token: str) -> Any:
    msg = f"non-finite number {token}"
    raise ValueError(msg)


def _parse_line(raw: bytes) -> dict[str, Any]:
    """Parse and validate one record line; raise ``ValueError``/``TypeError`` describing what is wrong."""
    data = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    if not isinstance(data, dict):
        msg = f"a JSON {type(data).__name__}, not an object"
        raise TypeError(msg)
    schema = data.get("schema")
    if isinstance(schema, bool) or not isinstance(schema, int) or schema < 1:
        msg = f"'schema' must be a positive int, got {describe(schema)}"
        raise ValueError(msg)
    if schema > LOG_SCHEMA_VERSION:
        raise _NewerSchemaError(schema)
    missing = sorted(_REQUIRED_ON_DISK[schema] - data.keys())
    if missing:
        msg = f"missing keys {', '.join(missing)}"
        raise ValueError(msg)
    ts = data["ts"]
    if not isinstance(ts, str) or not _TS_PATTERN.fullmatch(ts):
        msg = f"'ts' must be an ISO-8601 UTC time like 2026-01-31T12:00:00.000Z, got {describe(ts)}"
        raise ValueError(msg)
    MitigationRecord.from_json_dict(data)
    return data


def read_mitigation_log(
    path: str | os.PathLike[str],
    *,
    include_rotated: bool = False,
    on_corrupt: Literal["raise", "skip"] = "raise",
) -> list[dict[str, Any]]:
    """Read a mitigation log written by :class:`MitigationLog`, one ``dict`` per record, oldest first.

    Every line is parsed as strict JSON (no ``NaN``/``Infinity`` tokens) and validated against the
    schema: all keys present, ``ts`` well formed, field values as :class:`MitigationRecord` requires.

    A last line without its newline is a record cut short by a crash: if it still parses as a valid
    record it is returned, otherwise it is skipped with a ``RuntimeWarning``. Any other line that is not
    a valid record raises :class:`~loopguard.exceptions.InputError` naming the file and the line number,
    unless ``on_corrupt="skip"``, which skips such lines with one ``RuntimeWarning`` per file listing
    them (needed after a writer died mid-record and a later run appended to the same file). Blank lines
    are ignored. A record whose ``schema`` is newer than :data:`LOG_SCHEMA_VERSION` always raises.

    Args:
        path: The log file (not a symlink; it must exist).
        include_rotated: Also read the rotated files ``path.N`` ... ``path.1`` (consecutive numbers from 1),
            oldest first, before ``path``.
        on_corrupt: ``"raise"`` (default) or ``"skip"``.

    Returns:
        The records as parsed from JSON (``schema`` and ``ts`` included), in file order.

    Raises:
        LoopguardTypeError: ``path`` or ``include_rotated`` has the wrong type.
        ConfigError: ``on_corrupt`` is not ``"raise"`` or ``"skip"``; ``path`` is empty or has null bytes.
        InputError: a file is a symlink or not a regular file, a corrupt line (when ``on_corrupt="raise"``),
            or a record from a newer schema version.
        FileNotFoundError: ``path`` does not exist.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "log.jsonl")
        >>> log = MitigationLog(path)
        >>> for step in range(3):
        ...     _ = log.append({"step": step, "mode": "log_only", "verdict": "OK", "vote": 0.1 * step})
        >>> with open(path, "ab") as handle:  # a writer dies mid-record
        ...     _ = handle.write(b'{"schema":1,"ts":"2026-')
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     [record["step"] for record in read_mitigation_log(path)]
        [0, 1, 2]
    """
    text_path = check_path("path", path)
    rotated = check_bool("include_rotated", include_rotated)
    policy = check_choice("on_corrupt", on_corrupt, ("raise", "skip"))
    if os.path.islink(text_path):
        msg = f"`path` must not be a symlink, got {text_path!r}."
        raise InputError(msg)
    files = [*_rotated_paths(text_path), text_path] if rotated else [text_path]
    records: list[dict[str, Any]] = []
    for file in files:
        records.extend(_read_file(file, policy))
    return records


def _newer_schema(file: str, number: int, error: _NewerSchemaError) -> InputError:
    msg = (
        f"mitigation log {file!r}, line {number}: record has schema version {error.schema}, newer than "
        f"this loopguard reads ({LOG_SCHEMA_VERSION}); upgrade loopguard to read it."
    )
    return InputError(msg)


_PARSE_ERRORS = (ValueError, TypeError, RecursionError)


def _read_file(file: str, policy: str) -> list[dict[str, Any]]:
    content = _read_bytes(file)
    lines = content.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline; otherwise a line cut short
    records: list[dict[str, Any]] = []
    skipped: list[int] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            records.append(_parse_line(raw))
        except _NewerSchemaError as error:
            raise _newer_schema(file, number, error) from None
        except _PARSE_ERRORS as error:
            if policy == "skip":
                skipped.append(number)
                continue
            msg = (
                f"mitigation log {file!r}, line {number} is not a valid record ({error}); only a "
                "truncated last line is tolerated (pass on_corrupt='skip' to skip corrupt lines)."
            )
            raise InputError(msg) from error
    if tail.strip():
        number = len(lines) + 1
        try:
            records.append(_parse_line(tail))
        except _NewerSchemaError as error:
            raise _newer_schema(file, number, error) from None
        except _PARSE_ERRORS:
            warnings.warn(
                f"mitigation log {file!r}: skipped a truncated last line (line {number}), "
                "a record cut short when its writer stopped.",
                RuntimeWarning,
                stacklevel=3,
            )
    if skipped:
        shown = ", ".join(str(n) for n in skipped[:20]) + (" ..." if len(skipped) > 20 else "")
        warnings.warn(
            f"mitigation log {file!r}: skipped {len(skipped)} corrupt line(s): {shown}.",
            RuntimeWarning,
            stacklevel=3,
        )
    return records


# --------------------------------------------------------------------------------------------------
# runs and timelines


@attrs.frozen
class RunLog:
    """The records of one run in a mitigation log, with its abandoned timelines set apart.

    Attributes:
        run: The run identity, or ``None`` for records that carry none (schema 1, or a writer without one).
        records: The run's decisions on its live timeline, in file order: what a report counts.
        abandoned: Decisions that a later ``resume`` record abandoned (written after the step the run resumed
            from, before the resume): the steps the resumed run re-trained.
        events: The run's ``start``, ``resume`` and ``error`` records, in file order.
    """

    run: str | None
    records: tuple[dict[str, Any], ...]
    abandoned: tuple[dict[str, Any], ...]
    events: tuple[dict[str, Any], ...]


def split_runs(records: list[dict[str, Any]]) -> list[RunLog]:
    """Separate the runs of a (shared) mitigation log and drop each run's abandoned timelines.

    Runs are told apart by their ``run`` identity (records without one form one unnamed run) and listed in
    the order their first record appears. Within a run, a ``resume`` record at step ``s`` abandons the
    run's decisions with a step after ``s`` written before it: the run went back to its checkpoint of step
    ``s`` and trained those steps again. Resuming twice from the same checkpoint abandons twice; records of
    other runs in between are never touched.

    Args:
        records: Records as returned by :func:`read_mitigation_log` (file order).

    Returns:
        One :class:`RunLog` per run.

    Example:
        >>> def rec(step, event="decision", run="a"):
        ...     return {"step": step, "event": event, "run": run}
        >>> log = [rec(0, "start"), rec(1), rec(2), rec(3), rec(4), rec(2, "resume"), rec(3)]
        >>> log.append(rec(0, "start", run="b"))
        >>> runs = split_runs(log)
        >>> [(r.run, [x["step"] for x in r.records], [x["step"] for x in r.abandoned]) for r in runs]
        [('a', [1, 2, 3], [3, 4]), ('b', [], [])]
    """
    order: list[str | None] = []
    live: dict[str | None, list[dict[str, Any]]] = {}
    abandoned: dict[str | None, list[dict[str, Any]]] = {}
    events: dict[str | None, list[dict[str, Any]]] = {}
    for record in records:
        run = record.get("run")
        if run not in live:
            order.append(run)
            live[run], abandoned[run], events[run] = [], [], []
        event = record.get("event", "decision")
        if event == "decision":
            live[run].append(record)
            continue
        events[run].append(record)
        if event == "resume":
            step = record.get("step")
            keep = [r for r in live[run] if not isinstance(step, int) or r["step"] <= step]
            abandoned[run].extend(r for r in live[run] if isinstance(step, int) and r["step"] > step)
            live[run] = keep
    return [RunLog(run, tuple(live[run]), tuple(abandoned[run]), tuple(events[run])) for run in order]
