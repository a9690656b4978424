import datetime as dt
import json
import math
import multiprocessing
import os
import pathlib
import pickle
import re
import tempfile
import warnings
from collections.abc import Mapping

import attrs
import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from loopguard import ConfigError, InputError, LoopguardTypeError
from loopguard.log import (
    _SECRET,
    _SECRET_HINT,
    ACTIONS,
    LOG_SCHEMA_VERSION,
    MAX_EXPLANATION_LENGTH,
    MAX_RECORD_BYTES,
    MAX_SIGNALS,
    VERDICTS,
    MitigationLog,
    MitigationRecord,
    _may_hold_secret,
    _redact_tree,
    _utc_timestamp,
    read_mitigation_log,
    redact_secrets,
)

TS = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")
KEY_ORDER = [
    "schema",
    "ts",
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
]
HF = "hf_" + "Ab3" * 10
SK = "sk-proj-" + "x_Y-9" * 5
BEARER_TOKEN = "eyJhbGciOiJIUzI1NiJ9.e30.abc-_~+/=="


def record(step=0, **fields):
    base = {"step": step, "mode": "kl_control", "verdict": "OK"}
    base.update(fields)
    return MitigationRecord(**base)


def full_record(step=7):
    return MitigationRecord(
        step=step,
        mode="pid_lagrangian",
        verdict="HACK",
        vote=0.8125,
        signals={"repetition": 0.75, "length": None, "info_rm": 0.5},
        beta_before=0.01,
        beta_after=0.015,
        action="raise_beta",
        reward_mean=-0.25,
        reward_std=1.5,
        length_mean=312.5,
        repetition=0.625,
        explanation="raised beta 0.010 -> 0.015: repetition 0.75 >= trip 0.30 for 2 steps",
        extra={"rung": 1, "history": [0.01, 0.015], "flags": {"cooldown": False}},
    )


@pytest.fixture
def log_path(tmp_path):
    return str(tmp_path / "runs" / "mitigation.jsonl")


def raw_lines(path):
    return pathlib.Path(path).read_bytes().split(b"\n")


# ------------------------------------------------------------------------------------------------
# round trip


def test_round_trip_record_and_mapping(log_path):
    first = full_record()
    second = {"step": 8, "mode": "log_only", "verdict": "WARN", "vote": 0.5, "action": "none"}
    log = MitigationLog(log_path)
    before = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    assert log.append(first) is True
    assert log.append(second) is True
    after = dt.datetime.now(dt.timezone.utc)
    assert log.written == 2
    assert log.failures == 0
    assert log.last_error is None

    rows = read_mitigation_log(log_path)
    assert len(rows) == 2
    expected_first = {
        "schema": 2,
        "run": None,
        "event": "decision",
        "step": 7,
        "mode": "pid_lagrangian",
        "verdict": "HACK",
        "vote": 0.8125,
        "signals": {"repetition": 0.75, "length": None, "info_rm": 0.5},
        "beta_before": 0.01,
        "beta_after": 0.015,
        "action": "raise_beta",
        "reward_mean": -0.25,
        "reward_std": 1.5,
        "length_mean": 312.5,
        "repetition": 0.625,
        "explanation": "raised beta 0.010 -> 0.015: repetition 0.75 >= trip 0.30 for 2 steps",
        "extra": {"rung": 1, "history": [0.01, 0.015], "flags": {"cooldown": False}},
    }
    ts = rows[0].pop("ts")
    assert rows[0] == expected_first
    assert list(json.loads(raw_lines(log_path)[0])) == [*KEY_ORDER, "extra"]
    assert TS.fullmatch(ts)
    stamp = dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.timezone.utc)
    assert before <= stamp <= after

    expected_second = {
        "schema": 2,
        "run": None,
        "event": "decision",
        "step": 8,
        "mode": "log_only",
        "verdict": "WARN",
        "vote": 0.5,
        "signals": {},
        "beta_before": None,
        "beta_after": None,
        "action": "none",
        "reward_mean": None,
        "reward_std": None,
        "length_mean": None,
        "repetition": None,
        "explanation": "",
    }
    assert list(rows[1]) == KEY_ORDER  # no "extra" key when extra is None
    assert {k: v for k, v in rows[1].items() if k != "ts"} == expected_second
    assert MitigationRecord.from_json_dict(rows[0]) == first
    assert MitigationRecord.from_json_dict(rows[1]) == MitigationRecord(**second)


def test_creates_parent_directories_and_file_mode(tmp_path):
    path = tmp_path / "a" / "b" / "c" / "log.jsonl"
    log = MitigationLog(path)  # os.PathLike accepted
    assert log.path == str(path)
    assert log.append(record())
    assert path.is_file()
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o644 & ~umask


def test_to_json_dict_is_plain_and_detached():
    rec = record(signals={"a": np.float32(0.5)}, vote=np.float64(0.25), extra={"n": np.int64(3)})
    data = rec.to_json_dict()
    assert "ts" not in data
    assert data["schema"] == LOG_SCHEMA_VERSION == 2
    assert type(data["vote"]) is float
    assert type(data["signals"]["a"]) is float
    assert type(data["extra"]["n"]) is int
    data["signals"]["a"] = 9.0
    data["extra"]["n"] = 9
    assert rec.signals["a"] == 0.5
    assert rec.extra["n"] == 3
    json.dumps(data, allow_nan=False)


def test_the_timestamp_is_the_utc_clock_truncated_to_the_millisecond(monkeypatch):
    import time
    import types

    import loopguard.log

    # a year's last millisecond, the next year's first (a new second), within it, then a clock set back
    for now in (1767225599.9996, 1767225600.0, 1767225600.0004, 1767225600.5, 951782400.25):
        clock = types.SimpleNamespace(time=lambda now=now: now, strftime=time.strftime, gmtime=time.gmtime)
        monkeypatch.setattr(loopguard.log, "time", clock)
        moment = dt.datetime.fromtimestamp(now, dt.timezone.utc)
        assert _utc_timestamp() == moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def test_record_is_frozen_and_detached_from_inputs():
    signals = {"a": 0.5}
    extra = {"list": [1, 2]}
    rec = record(signals=signals, extra=extra)
    signals["a"] = 0.9
    extra["list"].append(3)
    assert rec.signals == {"a": 0.5}
    assert rec.extra == {"list": [1, 2]}
    with pytest.raises(TypeError):
        rec.signals["b"] = 1.0
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        rec.step = 3
    assert attrs.evolve(rec, step=4).step == 4


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="\x00"), max_size=300))
def test_any_explanation_is_one_ascii_line_and_round_trips(text):
    assume(redact_secrets(text) == text)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "log.jsonl")
        log = MitigationLog(path)
        assert log.append(record(explanation=text, extra={text: [text]}))
        assert log.append(record(step=1))
        content = pathlib.Path(path).read_bytes()
        content.decode("ascii")  # ensure_ascii: no U+2028 or other line separators on disk
        assert content.count(b"\n") == 2
        assert content.endswith(b"\n")
        rows = read_mitigation_log(path)
    assert rows[0]["explanation"] == text
    assert rows[0]["extra"] == {text: [text]}
    assert [row["step"] for row in rows] == [0, 1]


# ------------------------------------------------------------------------------------------------
# record validation


INVALID_FIELDS = [
    ({"step": True}, LoopguardTypeError, "`step` must be an integer (not bool), got True."),
    ({"step": -1}, ConfigError, "`step` must be >= 0, got -1."),
    ({"step": 1.0}, LoopguardTypeError, "`step` must be an integer, got 1.0 of type float."),
    ({"mode": ""}, ConfigError, "`mode` must be a non-empty name string, got ''."),
    ({"mode": 3}, LoopguardTypeError, "`mode` must be a name string, got 3 of type int."),
    ({"mode": "m" * 65}, ConfigError, "`mode` must be at most 64 characters, got 65 characters."),
    ({"verdict": "BAD"}, ConfigError, "`verdict` must be one of 'HACK', 'OK', 'WARN', got 'BAD'."),
    ({"verdict": None}, ConfigError, "`verdict` must be given for a decision record and only for one, got verdict=None with event='decision'."),
    (
        {"action": "explode"},
        ConfigError,
        "`action` must be one of 'lower_beta', 'none', 'raise_beta', 'rollback', 'stop', got 'explode'.",
    ),
    ({"vote": 1.5}, ConfigError, "`vote` must be in [0, 1], got 1.5."),
    ({"vote": -0.1}, ConfigError, "`vote` must be in [0, 1], got -0.1."),
    ({"vote": math.nan}, ConfigError, "`vote` must be finite, got nan."),
    ({"vote": True}, LoopguardTypeError, "`vote` must be a real number (not bool), got True."),
    ({"vote": "0.5"}, LoopguardTypeError, "`vote` must be a real number, got '0.5' of type str."),
    ({"beta_before": -0.1}, ConfigError, "`beta_before` must be >= 0, got -0.1."),
    ({"beta_after": math.inf}, ConfigError, "`beta_after` must be finite, got inf."),
    ({"reward_mean": math.nan}, ConfigError, "`reward_mean` must be finite, got nan."),
    ({"reward_std": -1.0}, ConfigError, "`reward_std` must be >= 0, got -1.0."),
    ({"length_mean": -1.0}, ConfigError, "`length_mean` must be >= 0, got -1.0."),
    ({"repetition": 1.01}, ConfigError, "`repetition` must be in [0, 1], got 1.01."),
    ({"explanation": 5}, LoopguardTypeError, "`explanation` must be a string, got 5 of type int."),
    ({"explanation": "a\x00b"}, ConfigError, "`explanation` must not contain null bytes, got 'a\\x00b'."),
    (
        {"explanation": "x" * 4097},
        ConfigError,
        "`explanation` must be at most 4096 characters, got 4097 characters.",
    ),
    ({"signals": [1]}, LoopguardTypeError, "`signals` must be a mapping of name -> float or None, got [1]."),
    ({"signals": {1: 0.5}}, LoopguardTypeError, "`signals key` must be a name string, got 1 of type int."),
    ({"signals": {"": 0.5}}, ConfigError, "`signals key` must be a non-empty name string, got ''."),
    (
        {"signals": {"a": True}},
        LoopguardTypeError,
        "`signals['a']` must be a real number or None (not bool), got True.",
    ),
    (
        {"signals": {"a": "x"}},
        LoopguardTypeError,
        "`signals['a']` must be a real number or None, got 'x' of type str.",
    ),
    (
        {"signals": {f"s{i}": 0.0 for i in range(257)}},
        ConfigError,
        "`signals` must have at most 256 entries, got 257.",
    ),
    ({"extra": [1]}, LoopguardTypeError, "`extra` must be a mapping or None, got [1] of type list."),
    ({"extra": {1: 2}}, LoopguardTypeError, "`extra` keys must be strings, got 1 of type int."),
    ({"extra": {"a": {2: 1}}}, LoopguardTypeError, "`extra['a']` keys must be strings, got 2 of type int."),
    (
        {"extra": {"a": [b"x"]}},
        LoopguardTypeError,
        "`extra['a'][0]` must hold only None, bool, int, float, str, lists and string-keyed mappings, "
        "got b'x' of type bytes.",
    ),
]


@pytest.mark.parametrize(("fields", "error", "message"), INVALID_FIELDS)
def test_invalid_fields_rejected_with_exact_message(fields, error, message):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        record(**fields)


def test_boundary_values_accepted():
    rec = record(
        step=0,
        vote=1.0,
        beta_before=0.0,
        beta_after=1e9,
        reward_std=0.0,
        length_mean=0.0,
        repetition=0.0,
        explanation="x" * MAX_EXPLANATION_LENGTH,
        signals={f"s{i}": float(i) for i in range(MAX_SIGNALS)},
        mode="m" * 64,
    )
    assert rec.vote == 1.0
    assert len(rec.signals) == MAX_SIGNALS
    assert VERDICTS == ("OK", "WARN", "HACK")
    assert ACTIONS == ("none", "raise_beta", "lower_beta", "rollback", "stop")
    for verdict in VERDICTS:
        for action in ACTIONS:
            assert record(verdict=verdict, action=action).action == action


def test_extra_depth_cap():
    def nest(levels):
        value = 1
        for _ in range(levels):
            value = [value]
        return value

    record(extra={"a": nest(7)})  # the top-level mapping plus 7 lists: 8 levels
    with pytest.raises(ConfigError, match=re.escape("must be nested at most 8 levels deep, got deeper.")):
        record(extra={"a": nest(8)})


def test_non_finite_floats_become_null(log_path):
    rec = record(
        signals={"nan": math.nan, "inf": math.inf, "ninf": -math.inf, "np": np.float32("nan"), "ok": 0.5},
        extra={"x": math.nan, "nested": [math.inf, {"y": -math.inf}], "t": (1, 2.5), "b": np.bool_(True)},
    )
    assert dict(rec.signals) == {"nan": None, "inf": None, "ninf": None, "np": None, "ok": 0.5}
    assert MitigationLog(log_path).append(rec)
    line = raw_lines(log_path)[0].decode()
    for token in ("NaN", "Infinity"):
        assert token not in line
    assert '"signals":{"nan":null,"inf":null,"ninf":null,"np":null,"ok":0.5}' in line
    assert '"extra":{"x":null,"nested":[null,{"y":null}],"t":[1,2.5],"b":true}' in line
    json.loads(line, parse_constant=lambda token: pytest.fail(f"non-finite token {token}"))


def _signals_rule(mapping):
    """The signals' rule, written plainly: names checked, floats kept when finite, else None."""
    result = {}
    for key, value in mapping.items():
        if type(key) is not str:
            raise LoopguardTypeError(key)
        if not key or "\x00" in key or len(key) > 64:
            raise ConfigError(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float, np.floating))):
            raise LoopguardTypeError(value)
        result[key] = None if value is None or not math.isfinite(float(value)) else float(value)
    return result


def _extra_rule(value, depth=0):
    """The extra's rule, written plainly: JSON types, tuples as lists, numpy scalars as Python, non-finite None."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if depth >= 8:
        raise ConfigError(value)
    if isinstance(value, dict):
        if any(not isinstance(key, str) for key in value):
            raise LoopguardTypeError(value)
        return {key: _extra_rule(item, depth + 1) for key, item in value.items()}
    return [_extra_rule(item, depth + 1) for item in value]


_names = st.text(alphabet=st.characters(codec="ascii", exclude_characters="\x00"), min_size=1, max_size=3)
_floats = st.one_of(st.floats(allow_nan=False), st.floats(), st.just(1e308))  # finite terms that overflow a sum
_signal_values = st.one_of(_floats, _floats, st.none(), st.sampled_from([1, np.float32(0.5), True, "x"]))
_signal_keys = st.one_of(_names, _names, _names, st.sampled_from(["", "a\x00", "n" * 65, "n" * 64, 3]))
_extra_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=2), _floats, _floats,
    st.sampled_from([np.float32(1.5), np.int64(2), np.bool_(False)]),
)  # fmt: skip
_extra_trees = st.recursive(
    _extra_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.one_of(_names, _names, st.just(1)), inner, max_size=4),
    ),
    max_leaves=30,
)


def _same_or_raises_alike(rule, value, convert):
    """``convert(value)`` gives what ``rule(value)`` gives (types of the leaves included), or its error."""
    try:
        want = rule(value)
    except (ConfigError, LoopguardTypeError) as error:
        with pytest.raises(type(error)):
            convert(value)
        return
    got = convert(value)
    assert got == want
    assert repr(got) == repr(want)  # 1 is not 1.0, nor np.float32(1.5) 1.5


@settings(max_examples=300)
@given(st.dictionaries(_signal_keys, _signal_values, max_size=8))
def test_signals_are_converted_by_their_rule(signals):
    """Whole rows of names and floats are taken at once; the record holds what the plain rule gives."""
    _same_or_raises_alike(_signals_rule, signals, lambda value: dict(record(signals=value).signals))


@settings(max_examples=300)
@given(st.dictionaries(_names, _extra_trees, max_size=4))
def test_extra_is_converted_by_its_rule(extra):
    _same_or_raises_alike(_extra_rule, extra, lambda value: _plain(record(extra=value).extra))


def _plain(value):
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    return [_plain(item) for item in value] if isinstance(value, list) else value


def test_batch_statistics_are_numpys():
    """A record's reward mean and std are np.mean's and np.std's floats, bit for bit."""
    from loopguard import Guard, Observation

    rng = np.random.default_rng(3)
    guard = Guard(mode="log_only")
    for step in range(40):
        rewards = rng.normal(rng.uniform(-1e3, 1e3), 10.0 ** rng.uniform(-6, 6), int(rng.integers(1, 300)))
        observation = Observation(step, rewards)
        rec = MitigationRecord.from_decision(guard.step(observation), mode="log_only", observation=observation)
        assert (rec.reward_mean, rec.reward_std) == (float(np.mean(rewards)), float(np.std(rewards)))


def test_from_json_dict_errors():
    base = {"step": 0, "mode": "log_only", "verdict": "OK"}
    with pytest.raises(ConfigError, match=re.escape("`record` has unknown keys 'stepp'; allowed: run, event, step, mode,")):
        MitigationRecord.from_json_dict({**base, "stepp": 1})
    message = "`record` must have the keys 'step' and 'mode', missing mode."
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        MitigationRecord.from_json_dict({"step": 0, "verdict": "OK"})
    message = "`verdict` must be given for a decision record and only for one, got verdict=None with event='decision'."
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        MitigationRecord.from_json_dict({"step": 0, "mode": "log_only"})
    with pytest.raises(ConfigError, match=f"^{re.escape('`schema` must be one of [1, 2], got 3.')}$"):
        MitigationRecord.from_json_dict({**base, "schema": 3})
    with pytest.raises(ConfigError, match=re.escape("`schema` must be one of [1, 2], got True.")):
        MitigationRecord.from_json_dict({**base, "schema": True})
    assert MitigationRecord.from_json_dict({**base, "schema": 1}).event == "decision"  # version 1 still reads
    with pytest.raises(
        LoopguardTypeError,
        match=f"^{re.escape('`record` must be a MitigationRecord or a mapping, got [1] of type list.')}$",
    ):
        MitigationRecord.from_json_dict([1])
    assert MitigationRecord.from_json_dict({**base, "schema": 1, "ts": "ignored"}) == MitigationRecord(**base)


# ------------------------------------------------------------------------------------------------
# writer arguments


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"path": True}, LoopguardTypeError, "`path` must be a path string, got True of type bool."),
        ({"path": None}, LoopguardTypeError, "`path` must be a path string, got None of type NoneType."),
        ({"path": b"log"}, LoopguardTypeError, "`path` must be a str or os.PathLike path, got bytes b'log'."),
        ({"path": ""}, ConfigError, "`path` must be a non-empty path string, got ''."),
        ({"path": "a\x00b"}, ConfigError, "`path` must not contain null bytes, got 'a\\x00b'."),
        ({"max_bytes": 1023}, ConfigError, "`max_bytes` must be >= 1024, got 1023."),
        ({"max_bytes": True}, LoopguardTypeError, "`max_bytes` must be an integer (not bool), got True."),
        ({"max_bytes": 2048.0}, LoopguardTypeError, "`max_bytes` must be an integer, got 2048.0 of type float."),
        ({"backups": -1}, ConfigError, "`backups` must be in [0, 100], got -1."),
        ({"backups": 101}, ConfigError, "`backups` must be in [0, 100], got 101."),
        ({"backups": False}, LoopguardTypeError, "`backups` must be an integer (not bool), got False."),
    ],
)
def test_log_arguments_validated(kwargs, error, message):
    arguments = {"path": "log.jsonl", **kwargs}
    path = arguments.pop("path")
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        MitigationLog(path, **arguments)


def test_log_accessors_repr_and_pickle(log_path):
    log = MitigationLog(log_path, max_bytes=1024, backups=0)
    assert (log.path, log.max_bytes, log.backups) == (log_path, 1024, 0)
    assert repr(log) == f"MitigationLog({log_path!r}, max_bytes=1024, backups=0)"
    assert not os.path.exists(log_path)  # nothing created before the first append
    clone = pickle.loads(pickle.dumps(log))
    assert clone.append(record())
    assert read_mitigation_log(log_path)[0]["step"] == 0


# ------------------------------------------------------------------------------------------------
# rotation


def write_steps(log, steps):
    for step in steps:
        assert log.append(record(step=step, explanation="e" * 150))


def steps_in(path):
    return [row["step"] for row in read_mitigation_log(path)]


def line_length(tmp_path):
    probe = str(tmp_path / "probe.jsonl")
    MitigationLog(probe).append(record(step=100, explanation="e" * 150))
    return len(raw_lines(probe)[0]) + 1


def test_rotation_names_order_and_oldest_dropped(tmp_path, log_path):
    length = line_length(tmp_path)
    per_file = 1024 // length  # whole records that fit under max_bytes
    assert per_file >= 2
    n = 4 * per_file + 1
    steps = list(range(100, 100 + n))  # three digits: every line has the same length
    log = MitigationLog(log_path, max_bytes=1024, backups=2)
    write_steps(log, steps)

    assert steps_in(log_path) == steps[-1:]
    assert steps_in(log_path + ".1") == steps[-1 - per_file : -1]
    assert steps_in(log_path + ".2") == steps[-1 - 2 * per_file : -1 - per_file]
    assert not os.path.exists(log_path + ".3")
    assert sorted(os.listdir(os.path.dirname(log_path))) == [
        "mitigation.jsonl",
        "mitigation.jsonl.1",
        "mitigation.jsonl.2",
    ]
    for suffix in ("", ".1", ".2"):
        assert os.path.getsize(log_path + suffix) <= 1024
    everything = read_mitigation_log(log_path, include_rotated=True)
    assert [row["step"] for row in everything] == steps[-1 - 2 * per_file :]


def test_rotation_with_zero_backups_starts_a_new_file(tmp_path, log_path):
    length = line_length(tmp_path)
    per_file = 1024 // length
    n = 3 * per_file + 2
    steps = list(range(100, 100 + n))
    log = MitigationLog(log_path, max_bytes=1024, backups=0)
    write_steps(log, steps)
    kept = (n - 1) % per_file + 1
    assert steps_in(log_path) == steps[-kept:]
    assert os.listdir(os.path.dirname(log_path)) == ["mitigation.jsonl"]
    assert [row["step"] for row in read_mitigation_log(log_path, include_rotated=True)] == steps[-kept:]


def test_oversized_record_gets_a_file_of_its_own(log_path):
    log = MitigationLog(log_path, max_bytes=1024, backups=2)
    assert log.append(record(step=0))
    assert log.append(record(step=1, explanation="x" * 2000))
    assert log.append(record(step=2))
    assert steps_in(log_path + ".2") == [0]
    assert steps_in(log_path + ".1") == [1]
    assert steps_in(log_path) == [2]
    assert os.path.getsize(log_path + ".1") > 1024


def test_rotation_replaces_a_symlinked_backup_without_touching_its_target(tmp_path, log_path):
    os.makedirs(os.path.dirname(log_path))
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious\n")
    os.symlink(victim, log_path + ".1")
    log = MitigationLog(log_path, max_bytes=1024, backups=1)
    write_steps(log, range(100, 110))
    assert victim.read_bytes() == b"precious\n"
    assert not os.path.islink(log_path + ".1")
    rows = read_mitigation_log(log_path, include_rotated=True)
    assert [row["step"] for row in rows] == list(range(100, 110))[-len(rows) :]


# ------------------------------------------------------------------------------------------------
# symlinks


def test_symlinked_log_file_is_refused_and_target_untouched(tmp_path, log_path):
    os.makedirs(os.path.dirname(log_path))
    target = tmp_path / "target.txt"
    target.write_bytes(b"precious\n")
    os.symlink(target, log_path)
    log = MitigationLog(log_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert log.append(record(step=0)) is False
        assert log.append(record(step=1)) is False
    assert len(caught) == 1
    assert caught[0].category is RuntimeWarning
    message = str(caught[0].message)
    assert log_path in message
    assert "refusing to write through a symlink" in message
    assert caught[0].filename == __file__  # points at the caller, not at loopguard
    assert target.read_bytes() == b"precious\n"
    assert os.path.islink(log_path)
    assert (log.written, log.failures) == (0, 2)
    assert "symlink" in log.last_error


def test_dangling_symlink_is_refused_and_not_created(tmp_path, log_path):
    os.makedirs(os.path.dirname(log_path))
    target = tmp_path / "nowhere.txt"
    os.symlink(target, log_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert MitigationLog(log_path).append(record()) is False
    assert len(caught) == 1
    assert not target.exists()


def test_symlinked_parent_directory_is_allowed(tmp_path):
    real = tmp_path / "scratch"
    real.mkdir()
    os.symlink(real, tmp_path / "linked")
    path = tmp_path / "linked" / "log.jsonl"
    assert MitigationLog(path).append(record())
    assert steps_in(real / "log.jsonl") == [0]


def test_reader_refuses_symlinks(tmp_path, log_path):
    MitigationLog(log_path).append(record())
    link = str(tmp_path / "link.jsonl")
    os.symlink(log_path, link)
    with pytest.raises(InputError, match=f"^{re.escape(f'`path` must not be a symlink, got {link!r}.')}$"):
        read_mitigation_log(link)
    os.symlink(log_path, log_path + ".1")
    with pytest.raises(InputError, match=re.escape(f"must not be a symlink, got {log_path + '.1'!r}.")):
        read_mitigation_log(log_path, include_rotated=True)


def test_directory_as_log_path_fails_softly(log_path):
    os.makedirs(log_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert MitigationLog(log_path).append(record()) is False
    assert len(caught) == 1


# ------------------------------------------------------------------------------------------------
# redaction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"token {HF} used", "token [REDACTED] used"),
        (f"key={SK}.", "key=[REDACTED]."),
        ("sk-" + "a" * 20, "[REDACTED]"),
        (f"Authorization: Bearer {BEARER_TOKEN}", "Authorization: [REDACTED]"),
        ("authorization: bearer\tabc", "authorization: [REDACTED]"),
        ("BEARER  x1", "[REDACTED]"),
        ("hf_" + "a" * 19, "hf_" + "a" * 19),  # too short to be a token
        ("sk-" + "a" * 19, "sk-" + "a" * 19),
        ("hf_" + "a" * 19 + "!" + "b" * 30, "hf_" + "a" * 19 + "!" + "b" * 30),
        ("no secrets here", "no secrets here"),
        (f"{HF}{HF}", "[REDACTED]"),
        (f"{HF} and {SK}", "[REDACTED] and [REDACTED]"),
    ],
)
def test_redact_secrets(text, expected):
    assert redact_secrets(text) == expected


def test_secrets_redacted_in_nested_values_and_keys(log_path):
    rec = record(
        mode="kl_control",
        signals={SK: 0.5, "clean": 0.25},
        explanation=f"pushed with {HF}",
        extra={
            "auth": {"headers": [f"Bearer {BEARER_TOKEN}", "ok"]},
            HF: "key",
            "deep": [[{"x": f"see {SK} here"}]],
        },
    )
    assert MitigationLog(log_path).append(rec)
    content = pathlib.Path(log_path).read_text()
    for secret in (HF, SK, BEARER_TOKEN):
        assert secret not in content
    row = read_mitigation_log(log_path)[0]
    assert row["explanation"] == "pushed with [REDACTED]"
    assert row["signals"] == {"[REDACTED]": 0.5, "clean": 0.25}
    assert row["extra"] == {
        "auth": {"headers": ["[REDACTED]", "ok"]},
        "[REDACTED]": "key",
        "deep": [[{"x": "see [REDACTED] here"}]],
    }


def test_secret_after_escaped_whitespace_is_redacted(log_path):
    # JSON writes the newline as the two characters "\n": redaction must happen before serialisation.
    assert MitigationLog(log_path).append(record(explanation="Bearer\nsecret-token-value"))
    content = pathlib.Path(log_path).read_text()
    assert "secret-token-value" not in content
    assert read_mitigation_log(log_path)[0]["explanation"] == "[REDACTED]"


# a secret of each shape (none is a real credential)
GHP = "ghp_" + "aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI3kM5"  # 36 base62 characters after the prefix
GITHUB_PAT = (
    "github_pat_11ABCDEFG0123456789abc_" + "dEf456GhI789jKl012MnO345pQr678StU901vWx234yZa567bCd890eFg12"
)
OPENAI_LEGACY = "sk-" + "T3BlbkFJ" + "a1B2c3D4e5F6g7H8i9J0" * 2
OPENAI_PROJECT = "sk-proj-" + "Ab_9-xYz" * 20
ANTHROPIC = "sk-ant-api03-" + "Zx9_Yw8-Vu7T" * 8 + "AA"
AWS_ID = "AKIAIOSFODNN7EXAMPLE"  # the example id of the AWS documentation
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SHA = "3f786850e387550fdab836ed7e6dc881de23001b"
UUID = "123e4567-e89b-12d3-a456-426614174000"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Hugging Face
        (f"HF_TOKEN {HF} set", "HF_TOKEN [REDACTED] set"),
        # OpenAI and Anthropic
        (f"key {OPENAI_LEGACY}.", "key [REDACTED]."),
        (f"({OPENAI_PROJECT})", "([REDACTED])"),
        ("sk-svcacct-" + "a-b_" * 6, "[REDACTED]"),
        (f"client = Anthropic({ANTHROPIC!r})", "client = Anthropic('[REDACTED]')"),
        ("sk-" + "Ab-1" * 6, "[REDACTED]"),  # no known prefix: mixed case and digits, any base64url
        # GitHub
        *[
            (f"push with {prefix}{GHP[4:]} done", "push with [REDACTED] done")
            for prefix in ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")
        ],
        (f"remote: {GITHUB_PAT}", "remote: [REDACTED]"),
        # AWS
        (f"id {AWS_ID} in us-east-1", "id [REDACTED] in us-east-1"),
        ("ASIA" + "Z2Y3X4W5V6U7T8S9", "[REDACTED]"),
        (f"aws_secret_access_key={AWS_SECRET}", "aws_secret_access_key=[REDACTED]"),
        (f"AWS_SECRET_ACCESS_KEY: {AWS_SECRET}", "AWS_SECRET_ACCESS_KEY: [REDACTED]"),
        (f'{{"aws_secret_access_key": "{AWS_SECRET}"}}', '{"aws_secret_access_key": "[REDACTED]"}'),
        # generic pairs: the key stays, the value goes
        ("api_key=abc123", "api_key=[REDACTED]"),
        ("apikey: abc123", "apikey: [REDACTED]"),
        ("X-Api-Key: abc123", "X-Api-Key: [REDACTED]"),
        ("OPENAI_API_KEY=abc123", "OPENAI_API_KEY=[REDACTED]"),
        ("https://host/x?token=abc123&page=2", "https://host/x?token=[REDACTED]&page=2"),
        ("secret = s3cr3t, next", "secret = [REDACTED], next"),
        ("SECRET_KEY='django-insecure-1'", "SECRET_KEY='[REDACTED]'"),
        ("password: hunter2", "password: [REDACTED]"),
        ("db_passwd=hunter2;", "db_passwd=[REDACTED];"),
        ('{"password": "correct horse battery", "user": "ann"}', '{"password": "[REDACTED]", "user": "ann"}'),
        ('{"token" : "a\\"b"}', '{"token" : "[REDACTED]"}'),  # an escaped quote inside the value
        ("{'client_secret': 'abc', 'n': 1}", "{'client_secret': '[REDACTED]', 'n': 1}"),
        ('password="unterminated', 'password="[REDACTED]'),
        # HTTP authorization headers and URL credentials
        ("Authorization: Basic dXNlcjpwYXNz", "Authorization: [REDACTED]"),
        ('{"Authorization": "Basic dXNlcjpwYXNz"}', '{"Authorization": "[REDACTED]"}'),
        ("authorization=token abc123 rest", "authorization=[REDACTED] rest"),
        ("token: Bearer abc.def", "token: [REDACTED]"),
        ("GET https://ann:pa55w0rd@example.com/x", "GET https://ann:[REDACTED]@example.com/x"),
        # private keys
        (
            "key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nAAAA\n-----END RSA PRIVATE KEY-----\nok",
            "key:\n[REDACTED]\nok",
        ),
        ("-----BEGIN PRIVATE KEY-----\nMIIEv (cut short", "[REDACTED]"),
    ],
)
def test_redact_secrets_covers_common_token_shapes(text, expected):
    assert redact_secrets(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "task-oriented dialogue",
        "task-oriented-dialogue-benchmark-v2",  # 'sk-' inside a word is not a key
        "risk-assessment_framework_2024_final",
        "sk-learn",
        "sk-learn-compatible-estimator-api",
        "SK-" + "A" * 30,  # keys start with a lower-case sk-
        "hf_hub_download",
        "hf_token",
        "export HF_HUB_ENABLE_HF_TRANSFER=1",
        "hf_transfer_enabled",
        f"commit {SHA}",
        f"sha={SHA}",
        f"run_id: {UUID}",
        f"checkpoint-{UUID}/weights",
        "ghp_" + "a" * 35,  # one character short
        "ghx_" + "a" * 40,
        "github_pat_expiry_days",
        "AKIA" + "A" * 15,
        "AKIA" + "A" * 17,  # part of a longer upper-case word
        "akiaiosfodnn7example",
        "max_new_tokens=64",
        "num_tokens: 128",
        "tokens=3",
        "token_count: 5",
        "secretary: Ann",
        "the password was rotated yesterday",
        'password: "" (empty)',
        "basic usage: fine",
        "https://example.com:8080/path",
        "raised beta 0.010 -> 0.015: repetition 0.71 >= trip 0.30 for 2 steps",
        "ſk-" + "a" * 30,  # non-ASCII look-alikes are not the ASCII prefixes
        "hf_" + "a" * 19 + "-" + "b" * 30,
    ],
)
def test_redact_secrets_leaves_ordinary_text_alone(text):
    assert redact_secrets(text) == text


def test_redacted_keys_are_unique_and_lose_no_value(log_path):
    hf_other = "hf_" + "Zz9" * 10
    rec = record(
        signals={HF: 0.1, "[REDACTED]": 0.2, hf_other: 0.3, "clean": 0.4},
        extra={"nested": {SK: "a", f"Bearer {BEARER_TOKEN}": "b", "[REDACTED#2]": "c", HF: "d"}},
    )
    assert MitigationLog(log_path).append(rec)
    content = pathlib.Path(log_path).read_text()
    for secret in (HF, hf_other, SK, BEARER_TOKEN):
        assert secret not in content
    row = read_mitigation_log(log_path)[0]
    # keys that were no secret keep their names; redacted ones are numbered in key order around them
    assert list(row["signals"].items()) == [
        ("[REDACTED#2]", 0.1),
        ("[REDACTED]", 0.2),
        ("[REDACTED#3]", 0.3),
        ("clean", 0.4),
    ]
    assert list(row["extra"]["nested"].items()) == [
        ("[REDACTED]", "a"),
        ("[REDACTED#3]", "b"),
        ("[REDACTED#2]", "c"),
        ("[REDACTED#4]", "d"),
    ]


def test_redact_tree_is_deterministic_and_idempotent():
    tree = {"b " + HF: 1, "a " + HF: 2, "x": [{SK: 3, "y": f"token={HF}"}]}
    once = _redact_tree(tree)
    assert once == {"[REDACTED]": 1, "[REDACTED#2]": 2, "x": [{"[REDACTED]": 3, "y": "token=[REDACTED]"}]}
    assert list(once) == ["[REDACTED]", "[REDACTED#2]", "x"]
    assert _redact_tree(tree) == once
    assert _redact_tree(once) == once


def test_redaction_never_makes_a_record_unreadable(log_path):
    # "[REDACTED]" can be longer than the secret it replaces; a field at its length cap must stay valid
    mode = "m" * 55 + " Bearer x"  # 64 characters, the most a mode may have
    explanation = "password=1 " * (MAX_EXPLANATION_LENGTH // 11)
    signal = "s" * 54 + "token=abc"
    assert MitigationLog(log_path).append(record(mode=mode, explanation=explanation, signals={signal: 0.5}))
    row = read_mitigation_log(log_path)[0]
    assert row["mode"] == "[REDACTED]"
    assert row["explanation"] == "[REDACTED]"
    assert row["signals"] == {"[REDACTED]": 0.5}
    assert "password=1" not in pathlib.Path(log_path).read_text()


def test_json_forms_in_a_record_are_redacted_but_readable(log_path):
    why = 'upload failed: {"api_key": "abc123", "user": "ann"}; retry with token=xyz789&x=1'
    assert MitigationLog(log_path).append(record(explanation=why))
    row = read_mitigation_log(log_path)[0]
    assert row["explanation"] == (
        'upload failed: {"api_key": "[REDACTED]", "user": "ann"}; retry with token=[REDACTED]&x=1'
    )


# fragments that make up the secrets the patterns know, and near misses, so that random strings hit them
# fmt: off
_FRAGMENTS = [
    "hf_", "sk-", "proj-", "ant-", "ghp_", "gho_", "ghs_", "github_pat_", "AKIA", "ASIA", "Bearer", "basic",
    "token", "api_key", "apikey", "secret", "password", "passwd", "authorization", "aws_secret_access_key",
    "-----BEGIN RSA PRIVATE KEY-----", "-----END RSA PRIVATE KEY-----", "://", "user:", "@", "=", ":", " ",
    "\n", '"', "'", "\\", ",", "&", "]", "-", "_", "[REDACTED]", "[REDACTED#2]", "aB3", "Z9", "x" * 7,
    "A1b2C3d4E5f6G7h8", "ſ", "K", "ı", "İ", "\u00a0", "é", "\x00", "\ud800",
]
# fmt: on
_SECRET_TEXT = st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=4)), max_size=40).map("".join)


@settings(max_examples=2000, deadline=None)
@given(_SECRET_TEXT)
@example("ſk-" + "a" * 30)  # matched 'sk-' case-insensitively before; its JSON text holds '\\u017fk-'
@example("Bearer\u00a0x")
def test_secret_hint_matches_whatever_the_secret_pattern_matches(text):
    # The writer skips redaction when the hint finds nothing in the record's JSON text (ensure_ascii): the
    # hint must match that text, not only the string itself, whenever the pattern finds a secret in it.
    for match in _SECRET.finditer(text):
        found = match.group(0)
        assert _SECRET_HINT.search(found), found
        assert _SECRET_HINT.search(json.dumps(found, ensure_ascii=True)), found
    if redact_secrets(text) != text:
        assert _SECRET_HINT.search(json.dumps(text, ensure_ascii=True))
        assert _SECRET_HINT.search(json.dumps({text: [text]}, ensure_ascii=True))


@settings(max_examples=2000, deadline=None)
@given(_SECRET_TEXT)
@example("GHU_x BEARER :// Key")
@example("a high ghost ghp")  # "gh" without a GitHub prefix: scanned for them, none found
@example("thigh ghs_")
def test_the_writers_secret_check_answers_like_the_hint(text):
    # the writer tests the JSON text (ASCII) with _may_hold_secret, a substring test per fragment
    for ascii_text in (json.dumps(text, ensure_ascii=True), json.dumps({text: [text]}, ensure_ascii=True)):
        assert _may_hold_secret(ascii_text) == bool(_SECRET_HINT.search(ascii_text)), ascii_text


@settings(max_examples=2000, deadline=None)
@given(_SECRET_TEXT)
def test_redaction_is_idempotent_and_never_raises(text):
    once = redact_secrets(text)
    assert redact_secrets(once) == once
    tree = {text: [text, {text + "x": text}], "[REDACTED]": text, "k": {"hf_" + "a" * 20: 1, text: 2}}
    redacted = _redact_tree(tree)
    assert _redact_tree(redacted) == redacted
    assert _size(redacted) == _size(tree)  # no key collapsed into another: no value lost


def _size(tree):
    """Number of entries and items in a JSON tree, at every depth."""
    if isinstance(tree, dict):
        return len(tree) + sum(_size(item) for item in tree.values())
    if isinstance(tree, list):
        return len(tree) + sum(_size(item) for item in tree)
    return 0


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_redaction_of_any_text_is_idempotent(text):
    once = redact_secrets(text)
    assert redact_secrets(once) == once


# ------------------------------------------------------------------------------------------------
# failures never raise, warn once


def test_failures_warn_once_and_later_appends_retry(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory should be")
    path = blocker / "log.jsonl"
    log = MitigationLog(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert log.append(record(step=0)) is False
        assert log.append(record(step=1)) is False
        assert len(caught) == 1
        assert caught[0].category is RuntimeWarning
        assert str(path) in str(caught[0].message)
        assert "NotADirectoryError" in str(caught[0].message)
        blocker.unlink()
        assert log.append(record(step=2)) is True
        assert len(caught) == 1
    assert (log.written, log.failures) == (1, 2)
    assert steps_in(path) == [2]


def test_each_log_instance_warns_once(tmp_path):
    path = tmp_path / "dir_not_file"
    path.mkdir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for log in (MitigationLog(path), MitigationLog(path)):
            assert log.append(record()) is False
            assert log.append(record()) is False
    assert len(caught) == 2


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        (None, "LoopguardTypeError: `record` must be a MitigationRecord or a mapping, got None"),
        ([1, 2], "LoopguardTypeError: `record` must be a MitigationRecord or a mapping, got [1, 2]"),
        ({"step": -1, "mode": "log_only", "verdict": "OK"}, "ConfigError: `step` must be >= 0, got -1."),
        ({"step": 0, "mode": "log_only"}, "`verdict` must be given for a decision record"),
        ({"step": 0, "mode": "log_only", "verdict": "OK", "bogus": 1}, "unknown keys 'bogus'"),
        (
            {"step": 0, "mode": "log_only", "verdict": "OK", "extra": {"blob": "x" * MAX_RECORD_BYTES}},
            "bytes, over the 1,048,576-byte cap",
        ),
    ],
)
def test_bad_records_warn_and_return_false(log_path, bad, fragment):
    log = MitigationLog(log_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert log.append(bad) is False
    assert len(caught) == 1
    assert fragment in str(caught[0].message)
    assert fragment in log.last_error
    assert not os.path.exists(log_path)


# ------------------------------------------------------------------------------------------------
# reading


def write_three(log_path):
    log = MitigationLog(log_path)
    for step in range(3):
        assert log.append(record(step=step, vote=0.25))
    return log


def test_truncated_last_line_is_skipped_with_a_warning(log_path):
    write_three(log_path)
    with open(log_path, "ab") as handle:
        handle.write(b'{"schema":1,"ts":"2026-01-01T00:00:00.000Z","step":3,"mo')
    with pytest.warns(RuntimeWarning, match=re.escape("skipped a truncated last line (line 4)")):
        rows = read_mitigation_log(log_path)
    assert [row["step"] for row in rows] == [0, 1, 2]


def test_complete_last_line_without_newline_is_kept(log_path):
    write_three(log_path)
    content = pathlib.Path(log_path).read_bytes()
    pathlib.Path(log_path).write_bytes(content.rstrip(b"\n"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert steps_in(log_path) == [0, 1, 2]


def test_append_after_a_torn_record_keeps_the_new_record_intact(log_path):
    log = write_three(log_path)
    with open(log_path, "ab") as handle:
        handle.write(b'{"schema":1,"ts":"20')
    assert log.append(record(step=3))
    lines = raw_lines(log_path)
    assert lines[3] == b'{"schema":1,"ts":"20'
    assert json.loads(lines[4])["step"] == 3
    with pytest.raises(InputError, match=re.escape(f"mitigation log {log_path!r}, line 4 is not a valid record")):
        read_mitigation_log(log_path)
    with pytest.warns(RuntimeWarning, match=re.escape("skipped 1 corrupt line(s): 4.")):
        rows = read_mitigation_log(log_path, on_corrupt="skip")
    assert [row["step"] for row in rows] == [0, 1, 2, 3]


def test_a_writer_reads_the_end_of_a_file_it_did_not_write_last(log_path):
    log = write_three(log_path)
    other = MitigationLog(log_path)
    assert other.append(record(step=3))
    with open(log_path, "ab") as handle:  # a third writer dies mid-record after both
        handle.write(b'{"schema":1,"ts":"20')
    assert log.append(record(step=4))
    assert other.append(record(step=5))
    lines = raw_lines(log_path)
    assert lines[4] == b'{"schema":1,"ts":"20'
    assert [json.loads(line)["step"] for line in lines[5:7]] == [4, 5]
    pathlib.Path(log_path).write_bytes(b"".join(line + b"\n" for line in lines[:3])[:-1])  # truncated, torn
    assert log.append(record(step=6))
    assert [json.loads(line)["step"] for line in raw_lines(log_path)[2:4]] == [2, 6]


@pytest.mark.skipif(os.name != "posix", reason="appends are locked on POSIX only (see MitigationLog)")
def test_an_append_waits_while_another_writer_holds_the_lock(log_path):
    import fcntl
    import threading
    import time

    log = write_three(log_path)
    holder = os.open(log_path, os.O_RDWR)  # another open file: its flock excludes the log's own
    fcntl.flock(holder, fcntl.LOCK_EX)
    release = threading.Timer(0.3, os.close, args=(holder,))
    started = time.monotonic()
    release.start()
    assert log.append(record(step=3))
    assert time.monotonic() - started >= 0.25
    release.join()
    assert [json.loads(line)["step"] for line in raw_lines(log_path)[:-1]] == [0, 1, 2, 3]


def test_torn_record_rotated_away_stays_last_in_its_file(log_path):
    log = MitigationLog(log_path, max_bytes=1024, backups=1)
    assert log.append(record(step=0))
    with open(log_path, "ab") as handle:
        handle.write(b'{"schema":1,"ts":"20')
    assert log.append(record(step=1, explanation="x" * 900))  # does not fit: rotates first
    assert raw_lines(log_path + ".1")[-1] == b'{"schema":1,"ts":"20'
    with pytest.warns(RuntimeWarning, match="truncated last line"):
        rows = read_mitigation_log(log_path, include_rotated=True)
    assert [row["step"] for row in rows] == [0, 1]


def corrupt_line_two(log_path, replacement):
    write_three(log_path)
    lines = raw_lines(log_path)
    lines[1] = replacement(lines[1])
    pathlib.Path(log_path).write_bytes(b"\n".join(lines))


@pytest.mark.parametrize(
    ("replacement", "reason"),
    [
        (lambda line: b"garbage", "Expecting value"),
        (lambda line: line.replace(b'"vote":0.25', b'"vote":NaN'), "non-finite number NaN"),
        (lambda line: b"[1, 2]", "a JSON list, not an object"),
        (lambda line: b'{"schema":1}', "missing keys action, beta_after"),
        (lambda line: line.replace(b'"schema":2', b'"schema":"2"'), "'schema' must be a positive int"),
        (lambda line: re.sub(rb'"ts":"[^"]*"', b'"ts":"today"', line), "'ts' must be an ISO-8601 UTC time"),
        (lambda line: line.replace(b'"verdict":"OK"', b'"verdict":"MAYBE"'), "`verdict` must be one of"),
        (lambda line: line.replace(b'"step":1', b'"step":-1'), "`step` must be >= 0, got -1."),
        (lambda line: b"\xff\xfe{}", "codec can't decode"),
        (lambda line: b"[" * 100_000, "recursion"),
    ],
)
def test_corrupt_middle_line_raises_with_line_number(log_path, replacement, reason):
    corrupt_line_two(log_path, replacement)
    prefix = f"mitigation log {log_path!r}, line 2 is not a valid record ("
    with pytest.raises(InputError, match=re.escape(prefix)) as info:
        read_mitigation_log(log_path)
    assert reason in str(info.value)
    assert str(info.value).endswith(
        "only a truncated last line is tolerated (pass on_corrupt='skip' to skip corrupt lines)."
    )


def test_newer_schema_raises_even_on_the_last_line(log_path):
    write_three(log_path)
    lines = raw_lines(log_path)
    for index in (1, 2):
        changed = list(lines)
        changed[index] = changed[index].replace(b'"schema":2', b'"schema":3')
        pathlib.Path(log_path).write_bytes(b"\n".join(changed))
        message = (
            f"mitigation log {log_path!r}, line {index + 1}: record has schema version 3, newer than this "
            "loopguard reads (2); upgrade loopguard to read it."
        )
        with pytest.raises(InputError, match=f"^{re.escape(message)}$"):
            read_mitigation_log(log_path, on_corrupt="skip")


def test_blank_lines_are_ignored(log_path):
    write_three(log_path)
    content = pathlib.Path(log_path).read_bytes()
    pathlib.Path(log_path).write_bytes(b"\n" + content.replace(b"\n", b"\n  \n", 1))
    assert steps_in(log_path) == [0, 1, 2]


def test_reader_arguments(log_path):
    write_three(log_path)
    message = "`include_rotated` must be a bool, got 1 of type int."
    with pytest.raises(LoopguardTypeError, match=f"^{re.escape(message)}$"):
        read_mitigation_log(log_path, include_rotated=1)
    message = "`on_corrupt` must be one of 'raise', 'skip', got 'ignore'."
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        read_mitigation_log(log_path, on_corrupt="ignore")
    with pytest.raises(FileNotFoundError):
        read_mitigation_log(log_path + ".missing")
    os.mkfifo(log_path + ".fifo")
    with pytest.raises(InputError, match=re.escape("`path` must be a regular file")):
        read_mitigation_log(log_path + ".fifo")


def test_include_rotated_without_rotated_files(log_path):
    write_three(log_path)
    assert [row["step"] for row in read_mitigation_log(log_path, include_rotated=True)] == [0, 1, 2]


# ------------------------------------------------------------------------------------------------
# concurrency


def append_many(path, writer, count, max_bytes, backups, start):
    log = MitigationLog(path, max_bytes=max_bytes, backups=backups)
    start.wait(timeout=60)  # both writers begin together, so their appends contend
    for step in range(count):
        fields = {"step": step, "mode": "log_only", "verdict": "OK", "explanation": writer * 50}
        ok = log.append({**fields, "extra": {"w": writer}})
        if not ok:
            raise SystemExit(f"append {step} failed: {log.last_error}")


@pytest.mark.parametrize(
    ("max_bytes", "backups"), [(10 * 2**20, 3), (8192, 100)], ids=["no-rotation", "rotation"]
)
def test_two_processes_append_intact_lines(log_path, max_bytes, backups):
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    start = context.Event()
    arguments = [(log_path, writer, 500, max_bytes, backups, start) for writer in "ab"]
    workers = [context.Process(target=append_many, args=args) for args in arguments]
    for worker in workers:
        worker.start()
    start.set()
    for worker in workers:
        worker.join(timeout=60)
    assert [worker.exitcode for worker in workers] == [0, 0]

    rotated = [f"{log_path}.{i}" for i in range(1, backups + 1)]
    files = [log_path, *(file for file in rotated if os.path.exists(file))]
    total_lines = 0
    for file in files:
        content = pathlib.Path(file).read_bytes()
        assert content.endswith(b"\n")
        for line in content.split(b"\n")[:-1]:
            json.loads(line)  # every line is one intact record
            total_lines += 1
        assert os.path.getsize(file) <= max_bytes
    assert total_lines == 1000
    rows = read_mitigation_log(log_path, include_rotated=True)
    assert len(rows) == 1000
    for writer in "ab":
        mine = [row for row in rows if row["extra"]["w"] == writer]
        assert [row["step"] for row in mine] == list(range(500))
        assert all(row["explanation"] == writer * 50 for row in mine)
    if backups == 100:
        assert len(files) > 10  # rotation really happened, and no record was lost to it


def test_guard_decisions_round_trip_through_the_log(tmp_path):
    import numpy as np

    from loopguard import Guard, Observation

    rng = np.random.default_rng(0)
    guard = Guard(beta=0.01, warmup_steps=5)
    log = MitigationLog(tmp_path / "mitigation.jsonl")
    expected = []
    for step in range(12):
        texts = [" ".join(rng.choice(list("abcdefghij"), size=10)) for _ in range(8)]
        if step >= 8:
            texts = ["x y " * 5] * 8
        obs = Observation(step, rng.normal(size=8), completions=texts, group_size=4)
        decision = guard.step(obs)
        assert log.append(MitigationRecord.from_decision(decision, mode=guard.mode, observation=obs))
        expected.append((decision, obs))
    rows = read_mitigation_log(tmp_path / "mitigation.jsonl")
    assert len(rows) == 12
    for row, (decision, obs) in zip(rows, expected, strict=True):
        assert row["step"] == decision.step
        assert row["verdict"] == decision.verdict
        assert row["action"] == decision.action
        assert row["beta_after"] == decision.beta_after
        assert row["explanation"] == decision.explanation
        assert row["reward_mean"] == pytest.approx(float(np.mean(obs.rewards)))
        assert row["length_mean"] == pytest.approx(float(np.mean([len(t.split()) for t in obs.completions])))
        assert row["repetition"] == decision.raw["repetition.rate"]
    assert rows[-1]["verdict"] == "HACK"
    assert rows[-1]["signals"]["repetition"] >= 0.3
