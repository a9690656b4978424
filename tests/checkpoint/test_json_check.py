"""The JSON check and copy of checkpoint state: the fast reading agrees with a plain recursive rule."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopguard import ConfigError, LoopguardTypeError
from loopguard.checkpoint._state import MAX_DEPTH, _plain_json, check_json, json_copy


def _valid(value, depth=0):
    """The rule, written plainly: exact JSON types, finite floats, str keys, containers at most 64 deep."""
    kind = type(value)
    if kind is float:
        return math.isfinite(value)
    if value is None or kind in (str, int, bool):
        return True
    if kind is list:
        return depth < MAX_DEPTH and all(_valid(item, depth + 1) for item in value)
    if kind is dict:
        return depth < MAX_DEPTH and all(type(k) is str and _valid(v, depth + 1) for k, v in value.items())
    return False


class _Float(float):
    pass


_json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.text(max_size=3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 0.5, math.inf, math.nan]),  # sums that overflow; non-finite terms
)
_odd_leaves = st.sampled_from([(1.0,), np.float64(1.0), _Float(2.0), b"x", 3j])  # not JSON: exact types only


def _trees(leaves, keys):
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.lists(inner, max_size=5),
            st.lists(st.lists(inner, max_size=4), max_size=4),  # rows, as a Guard's samples hold them
            st.dictionaries(keys, inner, max_size=4),
        ),
        max_leaves=40,
    )


_json_trees = _trees(_json_leaves, st.text(max_size=2))
_odd_trees = _trees(
    st.one_of(_json_leaves, _odd_leaves), st.one_of(st.text(max_size=2), st.sampled_from([1, None]))
)


@settings(max_examples=300)
@given(st.one_of(_json_trees, _odd_trees))
def test_the_fast_reading_agrees_with_the_rule(value):
    assert _plain_json(value, 0) is _valid(value)
    if _valid(value):
        check_json("state", value)
        copy = json_copy(value)
        assert copy == value
        assert _no_shared_containers(copy, value)
    else:
        with pytest.raises((ConfigError, LoopguardTypeError)):
            check_json("state", value)


def _no_shared_containers(a, b):
    if type(a) in (list, dict):
        if a is b:
            return False
        pairs = zip(a.values(), b.values(), strict=True) if type(a) is dict else zip(a, b, strict=True)
        return all(_no_shared_containers(x, y) for x, y in pairs)
    return True


def _nested(levels, leaf):
    value = [leaf]
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize("leaf", [1.0, [1.0, 2.0]])
def test_depth_limit_holds_through_rows(leaf):
    """Lists of lists are read as one flat list a level deeper; the depth they may reach is unchanged."""
    assert _plain_json(_nested(MAX_DEPTH - 1, leaf), 0) is _valid(_nested(MAX_DEPTH - 1, leaf))
    assert _plain_json(_nested(MAX_DEPTH + 1, leaf), 0) is False
    with pytest.raises(ConfigError, match="nested at most 64 levels deep"):
        check_json("state", {"deep": _nested(MAX_DEPTH + 1, leaf)})


def test_an_infinite_float_deep_in_rows_is_named():
    rows = [[0.5] * 16 for _ in range(5)]
    rows[3][7] = float("inf")
    with pytest.raises(ConfigError, match=r"`state\['history'\]\[1\]\[3\]\[7\]` must be finite"):
        check_json("state", {"history": [[[1.0]], rows]})


def test_finite_terms_whose_sum_overflows_pass():
    check_json("state", {"rows": [[1e308, 1e308], [-1e308, -1e308]], "mixed": [1e308, "a", 1e308, 2]})
