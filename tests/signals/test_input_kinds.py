"""Every public kernel against the kinds of arrays trainers hand out, and against the whole int64 id range.

* torch tensors on the ``meta`` device hold no data: a loopguard ``InputError`` naming the argument, never
  torch's raw ``NotImplementedError``;
* numpy masked arrays: a masked element is refused (numpy's ``asarray`` would silently use the value
  under the mask); a masked array with nothing masked works like its data;
* tensors with ``requires_grad``, non-contiguous views, ``bfloat16`` / ``float16`` keep working and give
  the numbers of the equivalent numpy array;
* token ids anywhere in ``[0, 2**63 - 1]`` give the exact n-gram counts of a naive pure-Python reference
  (ids used to be packed into one int64 key; a base of ``2**63`` overflowed), and ids outside the int64
  range, or negative, are refused with an ``InputError``.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from threadpoolctl import threadpool_limits

from loopguard import signals
from loopguard.exceptions import InputError, LoopguardTypeError


@pytest.fixture
def torch() -> Any:
    return pytest.importorskip("torch", reason="torch is part of the `hf` extra")


@pytest.fixture(autouse=True, scope="module")
def _single_openmp_thread():
    with threadpool_limits(limits=1):
        yield


REWARDS = np.array([0.5, 1.0, 0.25, 2.0, 1.5, 0.75, 1.0, 0.5])
LENGTHS = np.array([3, 9, 4, 12, 7, 5, 9, 2], dtype=np.int64)
SCORES = np.array([[0.5, 1.0, 0.25, 2.0], [1.0, 0.5, 0.25, 1.5], [0.75, 1.0, 0.5, 2.0]])
POLICY = np.array([[0.0, 1.0], [0.25, 1.0], [3.0, 2.0], [3.0, 2.5], [8.0, 0.5]])
REFERENCE = np.array([[0.0, 0.0], [1.0, 0.5], [0.5, 1.0], [1.5, 1.0], [0.25, 0.75], [1.0, 1.5]])
IDS = np.array([[1, 2, 1, 2, 3], [4, 4, 4, 5, 6]], dtype=np.int64)

Kernel = Callable[..., Any]

# (label, kernel, arguments): every argument here is an array the kernel converts.
CASES: list[tuple[str, Kernel, dict[str, Any]]] = [
    ("group_reward_std", signals.group_reward_std, {"rewards": REWARDS, "group_size": 4}),
    ("group_reward_std[ragged]", signals.group_reward_std, {"rewards": REWARDS, "group_size": np.array([3, 1, 4])}),
    ("zero_std_group_fraction", signals.zero_std_group_fraction, {"rewards": REWARDS, "group_size": 2}),
    ("entropy_trend", signals.entropy_trend, {"mean_entropies": REWARDS}),
    ("length_trend", signals.length_trend, {"mean_lengths": REWARDS}),
    ("mann_kendall_z", signals.mann_kendall_z, {"values": REWARDS}),
    ("series_slope", signals.series_slope, {"values": REWARDS}),
    ("reward_length_correlation", signals.reward_length_correlation, {"rewards": REWARDS, "lengths": LENGTHS}),
    ("reward_length_slope", signals.reward_length_slope, {"rewards": REWARDS, "lengths": LENGTHS}),
    (
        "length_stratified_gain",
        lambda **kw: signals.length_stratified_gain(**kw, bin_width=4, min_count=1),
        {
            "policy_rewards": REWARDS,
            "policy_lengths": LENGTHS,
            "reference_rewards": REWARDS[::-1],
            "reference_lengths": LENGTHS,
        },
    ),
    ("relative_drop", signals.relative_drop, {"value": REWARDS, "baseline": REWARDS[::-1]}),
    ("robust_baseline", signals.robust_baseline, {"values": REWARDS}),
    ("reward_drift", signals.reward_drift, {"current": REWARDS, "reference": REWARDS[::-1] * 2}),
    ("ensemble_disagreement", signals.ensemble_disagreement, {"scores": SCORES}),
    ("ensemble_reward", lambda **kw: signals.ensemble_reward(**kw, method="uwo"), {"scores": SCORES}),
    (
        "cluster_separation_index",
        lambda **kw: signals.cluster_separation_index(**kw, eps=1.0, min_samples=2),
        {"policy_emb": POLICY, "reference_emb": REFERENCE},
    ),
    (
        "mahalanobis_outlier_fraction",
        signals.mahalanobis_outlier_fraction,
        {"policy_emb": POLICY, "reference_emb": REFERENCE},
    ),
    (
        "squared_mahalanobis_distances",
        signals.squared_mahalanobis_distances,
        {"policy_emb": POLICY, "reference_emb": REFERENCE},
    ),
    ("ema", lambda **kw: signals.ema(**kw, alpha=0.3), {"values": REWARDS}),
    ("ema_update", lambda **kw: signals.ema_update(**kw, alpha=0.3), {"previous": np.array(0.5), "value": np.array(1.0)}),
    ("rolling_median", lambda **kw: signals.rolling_median(**kw, window=3), {"values": REWARDS}),
    ("cusum", lambda **kw: signals.cusum(**kw, target=1.0, scale=0.5).upper, {"values": REWARDS}),
    (
        "Cusum.update",
        lambda **kw: signals.Cusum(1.0, 0.5).update(signals.CusumState(), **kw)[1].upper,
        {"value": np.array(3.0)},
    ),
    ("ngram_repetition_rate", lambda **kw: signals.ngram_repetition_rate(**kw, reduce="none"), {"sequences": IDS}),
    ("distinct_n", signals.distinct_n, {"sequences": IDS}),
    ("as_token_batch", lambda **kw: signals.as_token_batch("sequences", **kw).tokens, {"sequences": IDS}),
]  # fmt: skip

ARGUMENTS = [(label, kernel, arguments, name) for label, kernel, arguments in CASES for name in arguments]
ARGUMENT_IDS = [f"{label}:{name}" for label, _, _, name in ARGUMENTS]


def call(kernel: Kernel, arguments: dict[str, Any], **replace: Any) -> Any:
    return kernel(**(arguments | replace))


def test_every_public_kernel_is_in_the_catalogue():
    covered = {label.split("[")[0].split(".")[0] for label, _, _ in CASES}
    kernels = {name for name in signals.__all__ if name[0].islower()} - {"classify_drop", "classify_echo"}
    assert kernels <= covered | {"cusum"}  # Cusum.update is the streaming form of cusum
    assert "Cusum" in covered


def same(a: Any, b: Any) -> None:
    if isinstance(a, (float, int, np.ndarray, np.floating)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=0.0)
    else:
        assert a == b


# ------------------------------------------------------------------------------------------ meta tensors


@pytest.mark.parametrize(("label", "kernel", "arguments", "name"), ARGUMENTS, ids=ARGUMENT_IDS)
def test_meta_tensors_are_refused_naming_the_argument(label, kernel, arguments, name, torch):
    meta = torch.as_tensor(np.array(arguments[name])).to("meta")
    message = f"`{name}` is on the meta device (it holds no data, only a shape), got a tensor of shape"
    with pytest.raises(InputError, match=re.escape(message)):
        call(kernel, arguments, **{name: meta})


def test_a_meta_tensor_inside_a_list_names_its_position(torch):
    rows = [torch.tensor([1, 2, 3]), torch.tensor([4, 5], device="meta")]
    with pytest.raises(InputError, match=re.escape("`sequences[1]` is on the meta device")):
        signals.distinct_n(rows)
    with pytest.raises(InputError, match=re.escape("`values[1]` is on the meta device")):
        signals.ema([torch.tensor(1.0), torch.tensor(2.0, device="meta")], alpha=0.5)


# ---------------------------------------------------------------------------------------- masked arrays


def _masked(value: Any, *, masked: bool) -> np.ma.MaskedArray:
    array = np.asarray(value)
    mask = np.zeros(array.shape, dtype=bool)
    if masked:
        mask.reshape(-1)[-1] = True
    return np.ma.array(array, mask=mask)


@pytest.mark.parametrize(("label", "kernel", "arguments", "name"), ARGUMENTS, ids=ARGUMENT_IDS)
def test_a_masked_element_is_refused_not_used(label, kernel, arguments, name):
    message = f"`{name}` must have no masked elements (loopguard does not guess what a masked value means)"
    with pytest.raises(InputError, match=re.escape(message)) as caught:
        call(kernel, arguments, **{name: _masked(arguments[name], masked=True)})
    assert ".compressed()" in str(caught.value)
    assert ".filled(value)" in str(caught.value)


@pytest.mark.parametrize(("label", "kernel", "arguments", "name"), ARGUMENTS, ids=ARGUMENT_IDS)
def test_a_masked_array_without_masked_elements_is_its_data(label, kernel, arguments, name):
    same(call(kernel, arguments, **{name: _masked(arguments[name], masked=False)}), call(kernel, arguments))


def test_masked_rows_inside_lists_are_checked_too():
    rows = [np.ma.array([1, 2, 3], mask=[0, 1, 0]), [4, 5]]
    with pytest.raises(InputError, match=re.escape("`sequences[0]` must have no masked elements")):
        signals.distinct_n(rows)
    matrix = [np.ma.array([0.0, 1.0], mask=[0, 1]), np.ma.array([1.0, 0.0])]
    with pytest.raises(InputError, match=re.escape("`scores[0]` must have no masked elements")):
        signals.ensemble_disagreement(matrix)
    unmasked = [np.ma.array([0.0, 1.0]), np.ma.array([1.0, 0.0])]
    assert signals.ensemble_disagreement(unmasked) == 0.25
    with pytest.raises(InputError, match=re.escape("`values` must have no masked elements")):
        signals.ema(np.ma.masked_invalid([1.0, np.nan, 2.0]), alpha=0.5)


# ------------------------------------------------------------------ tensor kinds that must keep working


def _tensor_kinds(torch: Any, value: Any) -> dict[str, Any]:
    base = torch.as_tensor(np.array(value))
    kinds = {
        "plain": base,
        "non_contiguous": torch.stack([base, base], dim=-1)[..., 0] if base.ndim else base,
    }
    if base.is_floating_point():
        kinds["requires_grad"] = base.clone().requires_grad_(True)
        kinds["bfloat16"] = base.to(torch.bfloat16)
        kinds["float16"] = base.to(torch.float16)
        kinds["expanded"] = base.reshape(-1)[:1].expand(base.shape) if base.ndim else base
    return kinds


@pytest.mark.parametrize(("label", "kernel", "arguments", "name"), ARGUMENTS, ids=ARGUMENT_IDS)
def test_tensors_with_grad_strides_and_half_precision_keep_working(label, kernel, arguments, name, torch):
    for kind, tensor in _tensor_kinds(torch, arguments[name]).items():
        expected_input = (
            tensor.detach().to(torch.float64).numpy() if tensor.is_floating_point() else tensor.numpy()
        )
        if not tensor.is_floating_point():
            expected_input = expected_input.astype(np.asarray(arguments[name]).dtype)
        try:
            expected = call(kernel, arguments, **{name: expected_input})
        except InputError:  # e.g. an expanded constant row: then the tensor must be refused the same way
            with pytest.raises(InputError):
                call(kernel, arguments, **{name: tensor})
            continue
        assert not tensor.is_contiguous() or kind != "non_contiguous" or tensor.ndim == 0
        same(call(kernel, arguments, **{name: tensor}), expected)


def test_sparse_and_complex_tensors_get_loopguard_errors(torch):
    sparse = torch.tensor([1.0, 0.0, 2.0]).to_sparse()
    with pytest.raises(InputError, match=re.escape("`values` must be a dense (strided) tensor")):
        signals.ema(sparse, alpha=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: "ComplexHalf support is experimental"
        half_complex = torch.tensor([1.0, 2.0], dtype=torch.complex32)
    with pytest.raises(LoopguardTypeError, match=re.escape("`values` must be a tensor of real numbers")):
        signals.ema(half_complex, alpha=0.5)
    with pytest.raises(
        LoopguardTypeError, match=re.escape("`values` must hold real numbers, got dtype complex")
    ):
        signals.ema(torch.tensor([1.0, 2.0], dtype=torch.complex64), alpha=0.5)


# ----------------------------------------------------------------------------------- the int64 id range


def naive_counts(rows: list[list[int]], n: int) -> tuple[list[float], float, float]:
    """Per-row repetition rates, per-row distinct-n and corpus distinct-n, by tuples in Python sets."""
    rates, distinct, pooled, total = [], [], set(), 0
    for row in rows:
        grams = [tuple(row[i : i + n]) for i in range(len(row) - n + 1)]
        pooled.update(grams)
        total += len(grams)
        rates.append(1.0 - len(set(grams)) / len(grams) if grams else 0.0)
        distinct.append(len(set(grams)) / len(grams) if grams else 1.0)
    return rates, float(np.mean(distinct)), (len(pooled) / total if total else 1.0)


INT64_MAX = 2**63 - 1
LARGE_IDS = st.one_of(
    st.integers(0, INT64_MAX),
    st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**53 + 1, 2**62, INT64_MAX - 1, INT64_MAX]),
)


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(st.lists(LARGE_IDS, max_size=9), min_size=1, max_size=5),
    n=st.integers(1, 5),
    as_arrays=st.booleans(),
)
def test_ngram_counts_are_exact_over_the_whole_int64_range(rows, n, as_arrays):
    rates, distinct_mean, corpus = naive_counts(rows, n)
    batch: Any = [np.array(row, dtype=np.int64) for row in rows] if as_arrays else rows
    np.testing.assert_allclose(
        signals.ngram_repetition_rate(batch, n, reduce="none"), rates, rtol=0, atol=1e-15
    )
    assert signals.distinct_n(batch, n, reduce="mean") == pytest.approx(distinct_mean, abs=1e-15)
    assert signals.distinct_n(batch, n) == pytest.approx(corpus, abs=1e-15)


@settings(max_examples=100, deadline=None)
@given(
    width=st.integers(1, 7),
    height=st.integers(1, 4),
    data=st.data(),
    n=st.integers(1, 4),
    dtype=st.sampled_from([np.int64, np.uint64]),
)
def test_rectangular_id_arrays_over_the_whole_int64_range(width, height, data, n, dtype):
    flat = data.draw(st.lists(LARGE_IDS, min_size=width * height, max_size=width * height))
    matrix = np.array(flat, dtype=dtype).reshape(height, width)
    rows = matrix.astype(object).tolist()
    rates, _, corpus = naive_counts(rows, n)
    np.testing.assert_allclose(
        signals.ngram_repetition_rate(matrix, n, reduce="none"), rates, rtol=0, atol=1e-15
    )
    assert signals.distinct_n(matrix, n) == pytest.approx(corpus, abs=1e-15)
    batch = signals.as_token_batch("ids", matrix)
    assert batch.tokens.tolist() == flat


def test_the_largest_id_next_to_a_repeated_one(torch):
    # the case that used to raise OverflowError: every first id equal, the largest id 2**63 - 1
    assert signals.ngram_repetition_rate([[0, INT64_MAX]], 2) == 0.0
    assert signals.ngram_repetition_rate([[INT64_MAX, INT64_MAX, INT64_MAX]], 2) == 0.5
    tensor = torch.tensor([[INT64_MAX, 0, INT64_MAX, 0]])
    assert signals.distinct_n(tensor, 2) == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("sequences", "message"),
    [
        ([[2**63, 5]], "`sequences[0]` must hold token ids that fit in int64 ([-2**63, 2**63 - 1]), got 9223372036854775808 at index (0,)."),
        ([[1], [2**63, -1]], "`sequences[1]` must hold token ids that fit in int64 ([-2**63, 2**63 - 1]), got 9223372036854775808 at index (0,)."),
        ([[2**64]], "`sequences[0]` must hold token ids that fit in int64 ([-2**63, 2**63 - 1]), got 18446744073709551616 at index (0,)."),
        ([[-(2**63) - 1]], "`sequences[0]` must hold token ids that fit in int64 ([-2**63, 2**63 - 1]), got -9223372036854775809 at index (0,)."),
        (np.array([[2**63]], dtype=np.uint64), "`sequences` must hold token ids that fit in int64, got 9223372036854775808."),
        ([np.array([2**64 - 1], dtype=np.uint64)], "`sequences[0]` must hold token ids that fit in int64, got 18446744073709551615."),
        ([[5, -100]], "`sequences` must hold token ids >= 0 (strip padding first), got -100 in row 0."),
        ([[5, -(2**63)]], "`sequences` must hold token ids >= 0 (strip padding first), got -9223372036854775808 in row 0."),
        (np.array([[1, -1]], dtype=np.int32), "`sequences` must hold token ids >= 0 (strip padding first), got -1 in row 0."),
    ],
)  # fmt: skip
def test_ids_outside_the_range_are_refused(sequences, message):
    for kernel in (signals.ngram_repetition_rate, signals.distinct_n):
        with pytest.raises(InputError, match=re.escape(message)):
            kernel(sequences)
