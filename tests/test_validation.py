import math
import pathlib
import re

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopguard import ConfigError, InputError, LoopguardError, LoopguardTypeError
from loopguard._validation import (
    MAX_NAME_LENGTH,
    MAX_PATH_LENGTH,
    as_float_array,
    as_group_sizes,
    as_int_array,
    boolean,
    check_bool,
    check_choice,
    check_int,
    check_name,
    check_path,
    check_real,
    check_same_length,
    integer,
    name_string,
    one_of,
    path_string,
    real,
    scalar_value,
    to_numpy,
)


def test_exceptions_subclass_builtins():
    assert issubclass(ConfigError, ValueError)
    assert issubclass(InputError, ValueError)
    assert issubclass(LoopguardTypeError, TypeError)
    for error in (ConfigError, InputError, LoopguardTypeError):
        assert issubclass(error, LoopguardError)


# ----------------------------------------------------------------------------------------- check_real


@pytest.mark.parametrize("value", [0, 1, 0.5, np.float32(0.25), np.int64(1)])
def test_check_real_accepts_real_numbers(value):
    result = check_real("x", value, lo=0.0, hi=1.0)
    assert isinstance(result, float)
    assert result == float(value)


@pytest.mark.parametrize("value", [True, False, np.bool_(True)])
def test_check_real_rejects_bool(value):
    with pytest.raises(LoopguardTypeError, match=re.escape("`x` must be a real number (not bool), got")):
        check_real("x", value)


@pytest.mark.parametrize("value", ["1.0", None, [1.0], 1 + 2j])
def test_check_real_rejects_non_numbers(value):
    with pytest.raises(LoopguardTypeError, match=re.escape("`x` must be a real number, got")):
        check_real("x", value)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, np.float64("nan")])
def test_check_real_rejects_non_finite(value):
    with pytest.raises(ConfigError, match=r"^`x` must be finite, got (nan|inf|-inf)\.$"):
        check_real("x", value)


@pytest.mark.parametrize(
    ("kwargs", "value", "message"),
    [
        ({"lo": 0.0, "hi": 1.0}, 1.5, "`x` must be in [0, 1], got 1.5."),
        ({"lo": 0.0, "hi": 1.0, "lo_inclusive": False}, 0.0, "`x` must be in (0, 1], got 0.0."),
        ({"lo": 0.1, "hi": 1.0, "hi_inclusive": False}, 1.0, "`x` must be in [0.1, 1), got 1.0."),
        ({"lo": 0.0}, -1e-9, "`x` must be >= 0, got -1e-09."),
        ({"lo": 1.0, "lo_inclusive": False}, 1.0, "`x` must be > 1, got 1.0."),
        ({"hi": 5.0}, 6, "`x` must be <= 5, got 6.0."),
        ({"hi": 5.0, "hi_inclusive": False}, 5, "`x` must be < 5, got 5.0."),
    ],
)
def test_check_real_range_messages(kwargs, value, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message) + "$"):
        check_real("x", value, **kwargs)


def test_check_real_bounds_are_inclusive_by_default():
    assert check_real("x", 0.0, lo=0.0, hi=1.0) == 0.0
    assert check_real("x", 1.0, lo=0.0, hi=1.0) == 1.0


@settings(max_examples=100, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_check_real_never_passes_non_finite(value):
    if math.isfinite(value):
        assert check_real("x", value) == value
    else:
        with pytest.raises(ConfigError):
            check_real("x", value)


# ------------------------------------------------------------------------------------ check_int, bool


def test_check_int():
    assert check_int("n", np.int32(3), lo=1, hi=5) == 3
    with pytest.raises(LoopguardTypeError, match=re.escape("`n` must be an integer (not bool), got True.")):
        check_int("n", True)
    with pytest.raises(LoopguardTypeError, match=re.escape("`n` must be an integer, got 2.0 of type float.")):
        check_int("n", 2.0)
    with pytest.raises(ConfigError, match=re.escape("`n` must be in [1, 5], got 6.")):
        check_int("n", 6, lo=1, hi=5)


def test_check_bool():
    assert check_bool("flag", True) is True
    assert check_bool("flag", np.bool_(False)) is False
    with pytest.raises(LoopguardTypeError, match=re.escape("`flag` must be a bool, got 'yes' of type str.")):
        check_bool("flag", "yes")


# ----------------------------------------------------------------------------------- strings, choices


def test_check_choice_lists_allowed_values():
    allowed = ("mean", "median", "min")
    assert check_choice("method", "median", allowed) == "median"
    message = "`method` must be one of 'mean', 'median', 'min', got 'max'."
    with pytest.raises(ConfigError, match="^" + re.escape(message) + "$"):
        check_choice("method", "max", allowed)
    with pytest.raises(LoopguardTypeError, match=re.escape("`method` must be a name string, got 3")):
        check_choice("method", 3, allowed)


def test_names_reject_null_bytes_empty_and_long_strings():
    assert check_name("run_name", "a" * MAX_NAME_LENGTH) == "a" * MAX_NAME_LENGTH
    with pytest.raises(ConfigError, match=re.escape("`run_name` must not contain null bytes")):
        check_name("run_name", "a\x00b")
    with pytest.raises(ConfigError, match=re.escape("`run_name` must be a non-empty name string, got ''.")):
        check_name("run_name", "")
    too_long = "a" * (MAX_NAME_LENGTH + 1)
    message = f"`run_name` must be at most {MAX_NAME_LENGTH} characters, got {MAX_NAME_LENGTH + 1} characters."
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_name("run_name", too_long)


def test_paths(tmp_path):
    assert check_path("log_path", tmp_path / "log.jsonl") == str(tmp_path / "log.jsonl")
    assert check_path("log_path", "/abs/" + "d" * 4000) == "/abs/" + "d" * 4000
    with pytest.raises(ConfigError, match=re.escape(f"`log_path` must be at most {MAX_PATH_LENGTH} characters")):
        check_path("log_path", "x" * (MAX_PATH_LENGTH + 1))
    with pytest.raises(ConfigError, match="null bytes"):
        check_path("log_path", pathlib.PurePosixPath("a\x00b"))
    with pytest.raises(LoopguardTypeError, match=re.escape("`log_path` must be a str or os.PathLike path")):
        check_path("log_path", b"/tmp/x")


# --------------------------------------------------------------------------------- attrs factories


@attrs.frozen
class _Record:
    band: float = attrs.field(default=0.3, validator=real(lo=0.0, hi=1.0, lo_inclusive=False))
    patience: int = attrs.field(default=3, validator=integer(lo=1))
    halt: bool = attrs.field(default=False, validator=boolean())
    mode: str = attrs.field(default="kl_control", validator=one_of("kl_control", "log_only"))
    name: str = attrs.field(default="run", validator=name_string())
    path: str | None = attrs.field(default=None, validator=path_string(optional=True))
    ceil: float | None = attrs.field(default=None, validator=real(lo=0.0, optional=True))


def test_attrs_record_validates_every_field():
    record = _Record()
    assert record.band == 0.3
    with pytest.raises(ConfigError, match=re.escape("`band` must be in (0, 1], got 0.0.")):
        _Record(band=0.0)
    with pytest.raises(LoopguardTypeError, match=re.escape("`band` must be a real number (not bool)")):
        _Record(band=True)
    with pytest.raises(LoopguardTypeError, match=re.escape("`patience` must be an integer")):
        _Record(patience=2.5)
    with pytest.raises(LoopguardTypeError, match=re.escape("`halt` must be a bool")):
        _Record(halt=1)
    with pytest.raises(ConfigError, match=re.escape("`mode` must be one of 'kl_control', 'log_only', got 'pid'.")):
        _Record(mode="pid")
    with pytest.raises(ConfigError, match="null bytes"):
        _Record(name="a\x00")
    with pytest.raises(ConfigError, match=re.escape("`ceil` must be >= 0, got -1.0.")):
        _Record(ceil=-1.0)
    assert _Record(path=None, ceil=None).path is None
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        record.band = 0.5  # type: ignore[misc]


# ------------------------------------------------------------------------------------------- arrays


def test_as_float_array_converts_and_checks():
    out = as_float_array("rewards", [1, 2, 3])
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [1.0, 2.0, 3.0])
    with pytest.raises(InputError, match=re.escape("`rewards` must be a 1-D array, got shape (2, 2).")):
        as_float_array("rewards", [[1, 2], [3, 4]])
    with pytest.raises(InputError, match=re.escape("`rewards` must not be empty, got shape (0,).")):
        as_float_array("rewards", [])
    assert as_float_array("rewards", [], allow_empty=True).shape == (0,)
    with pytest.raises(InputError, match=re.escape("`rewards` must be finite, got inf at index (2,).")):
        as_float_array("rewards", [0.0, 1.0, np.inf])
    with pytest.raises(LoopguardTypeError, match=re.escape("`rewards` must hold numbers, got booleans")):
        as_float_array("rewards", [True, False])
    with pytest.raises(LoopguardTypeError, match=re.escape("`rewards` must hold real numbers, got dtype <U1.")):
        as_float_array("rewards", ["a"])
    with pytest.raises(LoopguardTypeError, match=re.escape("`rewards` must be an array of numbers, got 'abc'")):
        as_float_array("rewards", "abc")
    with pytest.raises(InputError, match=re.escape("`rewards` must have at most 3 rows (DoS cap), got 4.")):
        as_float_array("rewards", [1, 2, 3, 4], max_len=3)
    with pytest.raises(InputError, match=re.escape("`rewards` must be a rectangular array of numbers")):
        as_float_array("rewards", [[1, 2], [3]])


def test_a_float64_array_is_taken_as_it_is_with_the_same_checks():
    values = np.array([0.5, 1.5])
    assert as_float_array("rewards", values) is values  # nothing to convert: no copy
    with pytest.raises(InputError, match=re.escape("`rewards` must be a 1-D array, got shape (1, 2).")):
        as_float_array("rewards", values[np.newaxis])
    with pytest.raises(InputError, match=re.escape("`rewards` must not be empty, got shape (0,).")):
        as_float_array("rewards", np.zeros(0))
    with pytest.raises(InputError, match=re.escape("`rewards` must have at most 1 rows (DoS cap), got 2.")):
        as_float_array("rewards", values, max_len=1)
    with pytest.raises(InputError, match=re.escape("`rewards` must be finite, got nan at index (1,).")):
        as_float_array("rewards", np.array([0.5, np.nan]))
    assert as_float_array("rewards", np.array([0.5, np.inf]), finite=False)[1] == np.inf
    swapped = np.array([0.5, 1.5], dtype=">f8")  # float64 in the other byte order: converted, not kept
    out = as_float_array("rewards", swapped)
    assert out.dtype == np.float64
    assert out is not swapped
    np.testing.assert_array_equal(out, [0.5, 1.5])


def test_as_float_array_accepts_torch_tensors_without_torch_import_cost():
    torch = pytest.importorskip("torch", reason="torch is part of the `hf` extra")
    tensor = torch.tensor([1.0, 2.0], dtype=torch.bfloat16, requires_grad=True)
    np.testing.assert_array_equal(as_float_array("rewards", tensor), [1.0, 2.0])


def test_as_int_array():
    np.testing.assert_array_equal(as_int_array("lengths", np.array([1, 2], dtype=np.uint8)), [1, 2])
    with pytest.raises(LoopguardTypeError, match=re.escape("`lengths` must hold integers, got dtype float64.")):
        as_int_array("lengths", [1.0, 2.0])
    with pytest.raises(LoopguardTypeError, match=re.escape("`lengths` must hold integers, got booleans.")):
        as_int_array("lengths", [True])
    with pytest.raises(InputError, match=re.escape("`lengths` must be >= 0, got -3 at index (1,).")):
        as_int_array("lengths", [1, -3], lo=0)
    with pytest.raises(InputError, match=re.escape("`lengths` must fit in int64")):
        as_int_array("lengths", np.array([2**63], dtype=np.uint64))


def test_check_same_length():
    assert check_same_length(a=np.zeros(3), b=np.zeros(3), c=[1, 2, 3]) == 3
    with pytest.raises(InputError, match=re.escape("`a` and `c` must have the same length, got 3 and 2.")):
        check_same_length(a=np.zeros(3), b=np.zeros(3), c=[1, 2])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=1, max_size=20))
def test_as_float_array_never_returns_non_finite(values):
    if all(math.isfinite(v) for v in values):
        np.testing.assert_array_equal(as_float_array("x", values), np.array(values))
    else:
        with pytest.raises(InputError, match="must be finite"):
            as_float_array("x", values)


# ----------------------------------------------------------------- inputs numpy or torch would mishandle


def test_to_numpy_refuses_tensors_without_data():
    torch = pytest.importorskip("torch", reason="torch is part of the `hf` extra")
    message = "`rewards` is on the meta device (it holds no data, only a shape), got a tensor of shape (2, 3) on 'meta'"
    with pytest.raises(InputError, match=re.escape(message)):
        to_numpy("rewards", torch.empty(2, 3, device="meta"))
    with pytest.raises(InputError, match=re.escape("`rewards[1]` is on the meta device")):
        as_float_array("rewards", [torch.tensor(1.0), torch.tensor(2.0, device="meta")])
    with pytest.raises(InputError, match=re.escape("`rewards` must be a dense (strided) tensor, got a torch.sparse_coo tensor")):
        as_float_array("rewards", torch.tensor([1.0, 0.0]).to_sparse())


def test_to_numpy_reads_tensors_numpy_cannot_take_directly():
    torch = pytest.importorskip("torch", reason="torch is part of the `hf` extra")
    # np.asarray raises on a list of tensors that require grad; each item is converted instead
    items = [torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([3.0, 4.0], requires_grad=True)]
    np.testing.assert_array_equal(as_float_array("scores", items, ndim=2), [[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(as_float_array("x", torch.arange(6.0).reshape(2, 3).t()[0]), [0.0, 3.0])
    np.testing.assert_array_equal(as_float_array("x", torch.tensor([1.0, -2.0]).neg()), [-1.0, 2.0])
    with pytest.raises(InputError, match=re.escape("`x` must be a rectangular array of numbers, got items of different shapes")):
        as_float_array("x", [torch.tensor([1.0], requires_grad=True), torch.tensor([1.0, 2.0], requires_grad=True)])


def test_masked_arrays_are_refused_or_unwrapped():
    with pytest.raises(InputError, match=re.escape("`x` must have no masked elements")) as caught:
        as_float_array("x", np.ma.masked_array([1.0, 2.0, 3.0], mask=[False, True, True]))
    assert "2 masked of 3 (first at index (1,))" in str(caught.value)
    assert ".compressed()" in str(caught.value)
    assert ".filled(value)" in str(caught.value)
    np.testing.assert_array_equal(as_float_array("x", np.ma.masked_array([1.0, 2.0])), [1.0, 2.0])
    with pytest.raises(InputError, match=re.escape("`x[1]` must have no masked elements")):
        as_float_array("x", [[1.0, 2.0], np.ma.masked_array([1.0, 2.0], mask=[True, False])], ndim=2)
    with pytest.raises(InputError, match=re.escape("`x` must have no masked elements")):
        as_int_array("x", np.ma.masked_array([1, 2], mask=[True, False]))


def test_python_ints_beyond_int64_are_named():
    message = "`ids` must hold integers that fit in int64 ([-2**63, 2**63 - 1]), got 9223372036854775808 at index (0, 1)."
    with pytest.raises(InputError, match=re.escape(message)):
        as_int_array("ids", [[1, 2**63], [-1, 2]], ndim=2)
    with pytest.raises(InputError, match=re.escape("got -9223372036854775809 at index (0,).")):
        as_int_array("ids", [-(2**63) - 1])
    np.testing.assert_array_equal(as_int_array("ids", [2**63 - 1, -(2**63)]), [2**63 - 1, -(2**63)])
    with pytest.raises(InputError, match=re.escape("`ids` must not be empty, got shape (0,).")):
        as_int_array("ids", [])  # an empty list is typed float64 by numpy: not a dtype error


def test_lists_of_floats_and_huge_ints_are_floats():
    np.testing.assert_array_equal(as_float_array("x", [1.5, 2**70]), [1.5, 2.0**70])
    with pytest.raises(InputError, match=re.escape("`x` must hold numbers representable in float64")):
        as_float_array("x", [1.5, 2**1100])
    with pytest.raises(LoopguardTypeError, match=re.escape("`x` must hold real numbers, got dtype object.")):
        as_float_array("x", [1.5, None])


def test_scalar_value():
    torch = pytest.importorskip("torch", reason="torch is part of the `hf` extra")
    assert scalar_value("kl", torch.tensor([[0.5]])) == 0.5
    assert scalar_value("step", torch.tensor(3)) == 3
    assert isinstance(scalar_value("step", torch.tensor(3)), int)
    assert scalar_value("kl", 0.5) == 0.5
    assert scalar_value("kl", "x") == "x"
    assert scalar_value("kl", [1]) == [1]
    with pytest.raises(InputError, match=re.escape("`kl` must be a single number (a 0-d or one-element array or tensor), got shape (0,).")):
        scalar_value("kl", np.array([]))
    with pytest.raises(InputError, match=re.escape("`kl` is on the meta device")):
        scalar_value("kl", torch.tensor(0.5, device="meta"))


def test_as_group_sizes():
    np.testing.assert_array_equal(as_group_sizes("sizes", (2, 1, 3), total=6), [2, 1, 3])
    np.testing.assert_array_equal(as_group_sizes("sizes", [2**62, 2**62]), [2**62, 2**62])  # no total: no sum
    with pytest.raises(InputError, match=re.escape("`sizes` must add up to the number of rewards (6), got a group of 4611686018427387904.")):
        as_group_sizes("sizes", [2**62] * 4, total=6)  # the int64 sum would wrap around to 0
    with pytest.raises(InputError, match=re.escape("`sizes` must be >= 1, got 0 at index (0,).")):
        as_group_sizes("sizes", [0, 6], total=6)
