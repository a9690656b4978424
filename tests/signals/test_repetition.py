"""Tests for the echo-trap kernels: ngram_repetition_rate, distinct_n, classify_echo."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError
from loopguard.signals import (
    TokenBatch,
    _repetition,
    as_token_batch,
    classify_echo,
    distinct_n,
    ngram_repetition_rate,
)

# --------------------------------------------------------------------------------------------------
# independent reference: a plain Python loop over positions with a set of seen n-grams


def naive_row(row: list[int] | list[str], n: int) -> tuple[int, int, set[tuple[object, ...]]]:
    """Return (repeats, total, distinct set) for one trajectory."""
    seen: set[tuple[object, ...]] = set()
    repeats = total = 0
    for k in range(len(row) - n + 1):
        gram = tuple(row[k : k + n])
        total += 1
        if gram in seen:
            repeats += 1
        else:
            seen.add(gram)
    return repeats, total, seen


def naive_rates(rows: list[list[int]] | list[list[str]], n: int) -> list[float]:
    out = []
    for row in rows:
        repeats, total, _ = naive_row(row, n)
        out.append(repeats / total if total else 0.0)
    return out


def naive_distinct(rows: list[list[int]] | list[list[str]], n: int) -> list[float]:
    out = []
    for row in rows:
        _, total, seen = naive_row(row, n)
        out.append(len(seen) / total if total else 1.0)
    return out


def naive_corpus_distinct(rows: list[list[int]] | list[list[str]], n: int) -> float:
    pooled: set[tuple[object, ...]] = set()
    grand_total = 0
    for row in rows:
        _, total, seen = naive_row(row, n)
        pooled |= seen
        grand_total += total
    return len(pooled) / grand_total if grand_total else 1.0


id_batches = st.lists(st.lists(st.integers(0, 5), max_size=14), min_size=1, max_size=8)
text_batches = st.lists(st.text(alphabet="ab c\t\n", max_size=24), min_size=1, max_size=6)
ngram_sizes = st.integers(1, 4)

LOOP = "a b a b a b a b"
PREFIX_THEN_LOOP = " ".join(f"w{i}" for i in range(200)) + " x y" * 100

# --------------------------------------------------------------------------------------------------
# exact values computed by hand


@pytest.mark.parametrize(
    ("texts", "n", "expected"),
    [
        (["a b a b"], 1, 2 / 4),  # a, b, a(rep), b(rep)
        (["a b a b"], 2, 1 / 3),  # ab, ba, ab(rep)
        (["a b a b"], 3, 0.0),  # aba, bab
        (["a b a b"], 4, 0.0),  # one 4-gram
        (["a b a b"], 5, 0.0),  # shorter than n: no n-grams, rate 0
        (["a a a a"], 1, 3 / 4),
        (["a a a a"], 2, 2 / 3),
        ([LOOP], 2, 5 / 7),  # 7 bigrams, 2 distinct (ab, ba)
        ([LOOP], 3, 4 / 6),  # 6 trigrams, 2 distinct (aba, bab)
        # 400 words, 399 bigrams: 199 in the prefix + (w199, x) + 2 in the loop (xy, yx) are distinct.
        ([PREFIX_THEN_LOOP], 2, 197 / 399),
        # 200 unique words + x + y: 202 distinct of 400 unigrams.
        ([PREFIX_THEN_LOOP], 1, 198 / 400),
        (["a b a b", "c d e", ""], 2, (1 / 3 + 0.0 + 0.0) / 3),  # batch mean counts rows without n-grams
    ],
)
def test_repetition_rate_hand_values(texts: list[str], n: int, expected: float) -> None:
    assert ngram_repetition_rate(texts, n) == pytest.approx(expected, rel=1e-12, abs=0)


def test_loop_after_long_unique_prefix_is_not_diluted() -> None:
    # Counting repeated n-gram *types* gives 2 / 202 ~ 0.0099 here; occurrences give 197 / 399.
    rate = ngram_repetition_rate([PREFIX_THEN_LOOP])
    assert rate == pytest.approx(197 / 399, rel=1e-12)
    assert classify_echo(rate) == "WARN"
    assert classify_echo(ngram_repetition_rate([LOOP])) == "TRAP"


def test_repetition_rate_none_hand_values() -> None:
    got = ngram_repetition_rate([[7, 8, 7, 8, 7], [1, 2, 3], [5], []], n=2, reduce="none")
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, [2 / 4, 0.0, 0.0, 0.0])


@pytest.mark.parametrize(
    ("texts", "n", "reduce", "expected"),
    [
        (["the cat sat", "the cat ran"], 2, "corpus", 3 / 4),  # the-cat twice, cat-sat, cat-ran
        (["the cat sat", "the cat ran"], 1, "corpus", 4 / 6),  # the, cat, sat, ran of 6 words
        (["the cat sat", "the cat ran"], 2, "mean", 1.0),
        (["a b a b"], 2, "corpus", 2 / 3),
        (["a b a b", "a"], 2, "mean", (2 / 3 + 1.0) / 2),  # a row without n-grams has distinct 1.0
        (["a", "b"], 2, "corpus", 1.0),  # no n-gram anywhere: 1.0 (no evidence of repetition)
        ([LOOP, LOOP], 2, "corpus", 2 / 14),
    ],
)
def test_distinct_n_hand_values(texts: list[str], n: int, reduce: str, expected: float) -> None:
    assert distinct_n(texts, n, reduce=reduce) == pytest.approx(expected, rel=1e-12, abs=0)  # type: ignore[call-overload]


def test_distinct_n_none_hand_values() -> None:
    np.testing.assert_array_equal(distinct_n(["a b a b", "x", "p q r"], 2, reduce="none"), [2 / 3, 1.0, 1.0])


def test_scalar_outputs_are_python_floats() -> None:
    assert type(ngram_repetition_rate(["a b a"])) is float
    assert type(distinct_n(["a b a"])) is float
    assert type(distinct_n(["a b a"], reduce="mean")) is float


# --------------------------------------------------------------------------------------------------
# against the naive reference on random batches


@settings(max_examples=50, deadline=None)
@given(rows=id_batches, n=ngram_sizes)
def test_matches_naive_on_random_id_batches(rows: list[list[int]], n: int) -> None:
    expected_rates = naive_rates(rows, n)
    np.testing.assert_allclose(ngram_repetition_rate(rows, n, reduce="none"), expected_rates, rtol=1e-12)
    assert ngram_repetition_rate(rows, n) == pytest.approx(
        float(np.mean(expected_rates)), rel=1e-12, abs=1e-15
    )
    expected_distinct = naive_distinct(rows, n)
    np.testing.assert_allclose(distinct_n(rows, n, reduce="none"), expected_distinct, rtol=1e-12)
    assert distinct_n(rows, n, reduce="mean") == pytest.approx(float(np.mean(expected_distinct)), rel=1e-12)
    assert distinct_n(rows, n) == pytest.approx(naive_corpus_distinct(rows, n), rel=1e-12)


@settings(max_examples=50, deadline=None)
@given(texts=text_batches, n=ngram_sizes)
def test_matches_naive_on_random_strings(texts: list[str], n: int) -> None:
    words = [text.split() for text in texts]
    np.testing.assert_allclose(
        ngram_repetition_rate(texts, n, reduce="none"), naive_rates(words, n), rtol=1e-12
    )
    assert distinct_n(texts, n) == pytest.approx(naive_corpus_distinct(words, n), rel=1e-12)
    # the same batch as token ids, mapped by hand
    vocabulary: dict[str, int] = {}
    ids = [[vocabulary.setdefault(word, len(vocabulary) * 3 + 1) for word in row] for row in words]
    np.testing.assert_array_equal(
        ngram_repetition_rate(ids, n, reduce="none"), ngram_repetition_rate(texts, n, reduce="none")
    )
    assert distinct_n(ids, n) == distinct_n(texts, n)


def test_larger_ragged_batch_matches_naive() -> None:
    # Lengths from 0 to 300 put rows in many different width groups.
    rng = np.random.default_rng(7)
    rows = [rng.integers(0, 12, size=int(length)).tolist() for length in rng.integers(0, 300, size=120)]
    rows.append([3] * 300)
    for n in (1, 2, 3):
        np.testing.assert_allclose(
            ngram_repetition_rate(rows, n, reduce="none"), naive_rates(rows, n), rtol=1e-12
        )
        assert distinct_n(rows, n) == pytest.approx(naive_corpus_distinct(rows, n), rel=1e-12)


@pytest.fixture(params=["python", "numpy"])
def counting(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Count every batch in Python (small batches) or with numpy's sort (large ones), whatever its size."""
    monkeypatch.setattr(_repetition, "_PYTHON_TOKENS", 1 << 40 if request.param == "python" else -1)
    return str(request.param)


def test_larger_ragged_batch_matches_naive_on_both_paths(counting: str) -> None:
    rng = np.random.default_rng(11)
    rows = [rng.integers(0, 9, size=int(length)).tolist() for length in rng.integers(0, 90, size=40)]
    for n in (1, 2, 5):
        np.testing.assert_allclose(
            ngram_repetition_rate(rows, n, reduce="none"), naive_rates(rows, n), rtol=1e-12
        )
        assert distinct_n(rows, n) == pytest.approx(naive_corpus_distinct(rows, n), rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.lists(st.sampled_from([0, 1, 2, 7, (1 << 40) + 3, (1 << 63) - 1]), max_size=12),
        min_size=1,
        max_size=9,
    ),
    n=st.integers(1, 6),
)
def test_python_and_numpy_counts_are_identical(rows: list[list[int]], n: int) -> None:
    # the two ways of counting a batch's n-grams give the same integers, so the rates have the same bits
    batch = as_token_batch("ids", rows)
    in_python = _repetition._count_ngrams_in_python(batch, n)
    saved = _repetition._PYTHON_TOKENS
    _repetition._PYTHON_TOKENS = -1
    try:
        with_numpy = _repetition._count_ngrams(batch, n)
    finally:
        _repetition._PYTHON_TOKENS = saved
    assert in_python[0].dtype == with_numpy[0].dtype == np.int64
    assert in_python[0].tolist() == with_numpy[0].tolist()
    assert in_python[1].tolist() == with_numpy[1].tolist()
    assert in_python[2] == with_numpy[2]


def test_small_batches_are_counted_in_python_and_large_ones_with_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    counted = _repetition._count_ngrams_in_python

    def spy(batch: TokenBatch, n: int) -> object:
        calls.append(len(batch.tokens))
        return counted(batch, n)

    monkeypatch.setattr(_repetition, "_count_ngrams_in_python", spy)
    limit = _repetition._PYTHON_TOKENS
    small, large = [[1, 2] * (limit // 2)], [[1, 2] * (limit // 2), [3]]
    assert ngram_repetition_rate(small, 2) == naive_rates(small, 2)[0]
    assert calls == [limit]  # as many tokens as the limit: Python
    calls.clear()
    rate = ngram_repetition_rate(large, 2, reduce="none")
    assert calls == []  # one token over the limit: numpy's sort
    assert rate.tolist() == naive_rates(large, 2)


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 25, 32])
@pytest.mark.parametrize("scale", [1, 1 << 20, 1 << 59])
def test_exact_for_long_ngrams_and_huge_token_ids(n: int, scale: int, counting: str) -> None:
    # Long n-grams over small and huge ids overflow int64 packing: the keys must be compressed, exactly.
    rng = np.random.default_rng(n)
    small = [rng.integers(0, 3, size=int(length)) for length in rng.integers(0, 70, size=12)]
    small.append(np.tile(np.arange(3), 24))
    rows = [row.astype(np.int64) * scale + 5 for row in small]
    reference = [row.tolist() for row in small]
    np.testing.assert_allclose(
        ngram_repetition_rate(rows, n, reduce="none"), naive_rates(reference, n), rtol=1e-12
    )
    assert distinct_n(rows, n) == pytest.approx(naive_corpus_distinct(reference, n), rel=1e-12)


# --------------------------------------------------------------------------------------------------
# input forms and identities


@settings(max_examples=50, deadline=None)
@given(
    array=st.integers(1, 6).flatmap(
        lambda width: st.lists(
            st.lists(st.integers(0, 4), min_size=width, max_size=width), min_size=1, max_size=6
        )
    ),
    n=ngram_sizes,
)
def test_2d_array_equals_list_input(array: list[list[int]], n: int) -> None:
    matrix = np.array(array, dtype=np.int64)
    from_list = ngram_repetition_rate(array, n, reduce="none")
    np.testing.assert_array_equal(ngram_repetition_rate(matrix, n, reduce="none"), from_list)
    np.testing.assert_array_equal(ngram_repetition_rate(list(matrix), n, reduce="none"), from_list)
    np.testing.assert_array_equal(ngram_repetition_rate(matrix.astype(np.int32), n, reduce="none"), from_list)
    assert distinct_n(matrix, n) == distinct_n(array, n)


@settings(max_examples=50, deadline=None)
@given(rows=id_batches, n=ngram_sizes)
def test_rate_is_one_minus_distinct_per_trajectory(rows: list[list[int]], n: int) -> None:
    rates = ngram_repetition_rate(rows, n, reduce="none")
    np.testing.assert_allclose(rates, 1.0 - distinct_n(rows, n, reduce="none"), rtol=0, atol=1e-15)
    assert ngram_repetition_rate(rows, n) == pytest.approx(
        1.0 - distinct_n(rows, n, reduce="mean"), abs=1e-12
    )


# --------------------------------------------------------------------------------------------------
# properties


@settings(max_examples=50, deadline=None)
@given(rows=id_batches, n=ngram_sizes)
def test_values_in_unit_interval_and_finite(rows: list[list[int]], n: int) -> None:
    for values in (ngram_repetition_rate(rows, n, reduce="none"), distinct_n(rows, n, reduce="none")):
        assert values.shape == (len(rows),)
        assert np.all(np.isfinite(values))
        assert np.all((values >= 0.0) & (values <= 1.0))
    corpus = distinct_n(rows, n)
    assert 0.0 < corpus <= 1.0


@settings(max_examples=50, deadline=None)
@given(rows=id_batches, n=ngram_sizes, seed=st.integers(0, 2**32 - 1))
def test_permuting_trajectories_permutes_output(rows: list[list[int]], n: int, seed: int) -> None:
    permutation = np.random.default_rng(seed).permutation(len(rows))
    shuffled = [rows[i] for i in permutation]
    original = ngram_repetition_rate(rows, n, reduce="none")
    np.testing.assert_array_equal(ngram_repetition_rate(shuffled, n, reduce="none"), original[permutation])
    assert ngram_repetition_rate(shuffled, n) == pytest.approx(ngram_repetition_rate(rows, n), abs=1e-12)
    assert distinct_n(shuffled, n) == distinct_n(rows, n)


@settings(max_examples=50, deadline=None)
@given(
    rows=id_batches,
    n=st.integers(1, 6),
    targets=st.lists(st.integers(0, 2**62), min_size=6, max_size=6, unique=True),
)
def test_relabelling_token_ids_changes_nothing(rows: list[list[int]], n: int, targets: list[int]) -> None:
    relabelled = [np.array([targets[token] for token in row], dtype=np.int64) for row in rows]
    np.testing.assert_array_equal(
        ngram_repetition_rate(relabelled, n, reduce="none"), ngram_repetition_rate(rows, n, reduce="none")
    )
    assert distinct_n(relabelled, n) == distinct_n(rows, n)


@settings(max_examples=50, deadline=None)
@given(row=st.lists(st.integers(0, 5), min_size=1, max_size=14), n=ngram_sizes)
def test_appending_a_repeat_of_the_last_ngram_never_lowers_repeats(row: list[int], n: int) -> None:
    if len(row) < n:
        row = row * n
    extended = row + row[-n:]
    rates = ngram_repetition_rate([row, extended], n, reduce="none")
    totals = np.array([len(row) - n + 1, len(extended) - n + 1])
    repeats = np.rint(rates * totals)
    assert repeats[1] >= repeats[0] + 1  # the appended n-gram is itself a repeat


@settings(max_examples=50, deadline=None)
@given(rate=st.floats(0.0, 1.0), warn=st.floats(0.01, 0.98), gap=st.floats(0.001, 1.0))
def test_classify_echo_matches_band_definition(rate: float, warn: float, gap: float) -> None:
    trap = min(warn + gap, 1.0)
    expected = "TRAP" if rate >= trap else "WARN" if rate >= warn else "OK"
    assert classify_echo(rate, warn=warn, trap=trap) == expected


@settings(max_examples=50, deadline=None)
@given(low=st.floats(0.0, 1.0), high=st.floats(0.0, 1.0))
def test_classify_echo_is_monotone_in_rate(low: float, high: float) -> None:
    low, high = min(low, high), max(low, high)
    order = {"OK": 0, "WARN": 1, "TRAP": 2}
    assert order[classify_echo(low)] <= order[classify_echo(high)]


@pytest.mark.parametrize(
    ("rate", "expected"),
    [
        (0.0, "OK"),
        (float(np.nextafter(0.3, 0.0)), "OK"),
        (0.3, "WARN"),
        (float(np.nextafter(0.6, 0.0)), "WARN"),
        (0.6, "TRAP"),
        (1.0, "TRAP"),
        (np.float64(0.45), "WARN"),
    ],
)
def test_classify_echo_band_edges(rate: float, expected: str) -> None:
    assert classify_echo(rate) == expected


# --------------------------------------------------------------------------------------------------
# bad input

FUNCTIONS = [ngram_repetition_rate, distinct_n]


@pytest.mark.parametrize("function", FUNCTIONS)
@pytest.mark.parametrize(
    ("n", "error", "message"),
    [
        (0, ConfigError, "`n` must be in [1, 32], got 0."),
        (33, ConfigError, "`n` must be in [1, 32], got 33."),
        (True, LoopguardTypeError, "`n` must be an integer (not bool), got True."),
        (2.0, LoopguardTypeError, "`n` must be an integer, got 2.0 of type float."),
    ],
)
def test_bad_n(function: object, n: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        function(["a b a b"], n)  # type: ignore[operator]


def test_unknown_reduce_lists_allowed_values() -> None:
    with pytest.raises(ConfigError, match=re.escape("`reduce` must be one of 'mean', 'none', got 'corpus'.")):
        ngram_repetition_rate(["a b"], reduce="corpus")  # type: ignore[call-overload]
    with pytest.raises(
        ConfigError, match=re.escape("`reduce` must be one of 'corpus', 'mean', 'none', got 'sum'.")
    ):
        distinct_n(["a b"], reduce="sum")  # type: ignore[call-overload]


@pytest.mark.parametrize("function", FUNCTIONS)
@pytest.mark.parametrize(
    ("sequences", "error", "message"),
    [
        ("a b a b", LoopguardTypeError, "`sequences` must be a batch of sequences"),
        ([], InputError, "`sequences` must not be empty, got 0 sequences."),
        (np.zeros((0, 4), dtype=np.int64), InputError, "`sequences` must not be empty, got 0 sequences."),
        (
            [[5, 6], [-100]],
            InputError,
            "`sequences` must hold token ids >= 0 (strip padding first), got -100 in row 1.",
        ),
        ([[1.0, 2.0]], LoopguardTypeError, "`sequences[0]` must hold integer token ids, got dtype float64."),
        (np.ones((2, 3)), LoopguardTypeError, "`sequences` must hold integer token ids, got dtype float64."),
        ([[True, False]], LoopguardTypeError, "`sequences[0]` must hold integer token ids, got booleans."),
        (np.zeros((1, 2, 3), dtype=np.int64), InputError, "`sequences` must be a 2-D array of token ids"),
        (["a b", [1, 2]], LoopguardTypeError, "`sequences` must be all strings or all token-id sequences"),
        (42, LoopguardTypeError, "`sequences` must be a list of sequences, got 42 of type int."),
        (
            np.zeros((100_001, 0), dtype=np.int64),
            InputError,
            "`sequences` must have at most 100,000 sequences (DoS cap), got 100,001.",
        ),
    ],
)
def test_bad_sequences(function: object, sequences: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        function(sequences)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"rate": float("nan")}, ConfigError, "`rate` must be finite, got nan."),
        ({"rate": 1.5}, ConfigError, "`rate` must be in [0, 1], got 1.5."),
        ({"rate": -0.1}, ConfigError, "`rate` must be in [0, 1], got -0.1."),
        ({"rate": True}, LoopguardTypeError, "`rate` must be a real number (not bool), got True."),
        ({"rate": "0.5"}, LoopguardTypeError, "`rate` must be a real number, got '0.5' of type str."),
        ({"rate": 0.5, "warn": 0.6, "trap": 0.6}, ConfigError, "`warn` must be < `trap` (0.6), got 0.6."),
        ({"rate": 0.5, "warn": 0.7}, ConfigError, "`warn` must be < `trap` (0.6), got 0.7."),
        ({"rate": 0.5, "warn": 0.0}, ConfigError, "`warn` must be in (0, 1), got 0.0."),
        ({"rate": 0.5, "trap": 1.5}, ConfigError, "`trap` must be in (0, 1], got 1.5."),
        ({"rate": 0.5, "trap": float("inf")}, ConfigError, "`trap` must be finite, got inf."),
        (
            {"rate": 0.5, "warn": False},
            LoopguardTypeError,
            "`warn` must be a real number (not bool), got False.",
        ),
    ],
)
def test_classify_echo_bad_input(kwargs: dict[str, object], error: type[Exception], message: str) -> None:
    rate = kwargs.pop("rate")
    with pytest.raises(error, match=re.escape(message)):
        classify_echo(rate, **kwargs)  # type: ignore[arg-type]


def test_one_batch_counts_its_ngrams_once_for_both_views() -> None:
    rng = np.random.default_rng(0)
    rows = [rng.integers(0, 30, size=rng.integers(0, 40)).tolist() for _ in range(50)]
    pooled_first, per_row_first = as_token_batch("ids", rows), as_token_batch("ids", rows)
    pooled = distinct_n(pooled_first, n=2)
    # (the lengths and the caps the batch was checked against are kept too)
    counted = [key for key in pooled_first._cache if key not in ("lengths", "caps")]
    assert counted == ["token_range", ("ngrams", 2)]  # the counts are kept on the batch...
    per_row = ngram_repetition_rate(per_row_first, n=2, reduce="none")
    # ...and each view read from them equals the other view counted first
    assert ngram_repetition_rate(pooled_first, n=2, reduce="none").tolist() == per_row.tolist()
    assert distinct_n(per_row_first, n=2) == pooled
    assert distinct_n(pooled_first, n=3) == distinct_n(rows, n=3)  # another n is counted apart
    assert set(pooled_first._cache) - {"lengths", "caps"} == {"token_range", ("ngrams", 2), ("ngrams", 3)}
    with pytest.raises(ValueError, match="read-only"):  # no one can change the tokens under the counts
        pooled_first.tokens[0] = 7
    # a batch of arrays the caller still holds is counted afresh every time
    tokens, offsets = pooled_first.tokens.copy(), pooled_first.offsets.copy()
    mine = TokenBatch(tokens=tokens, offsets=offsets)
    before = distinct_n(mine, n=2)
    tokens[:] = 0
    assert not mine.frozen()
    assert not mine._cache
    assert distinct_n(mine, n=2) < before


def test_a_frozen_batch_computes_its_lengths_once_read_only() -> None:
    batch = as_token_batch("ids", [[1, 2, 3], [], [4, 5]])
    lengths = batch.lengths
    assert lengths.tolist() == [3, 0, 2]
    assert batch.lengths is lengths  # every kernel of the step reads the same array
    with pytest.raises(ValueError, match="read-only"):
        lengths[0] = 9
    # a batch of the caller's arrays derives them afresh (its offsets may change under it)
    offsets = batch.offsets.copy()
    mine = TokenBatch(tokens=batch.tokens.copy(), offsets=offsets)
    assert mine.lengths is not mine.lengths
    offsets[1] = 1
    assert mine.lengths.tolist() == [1, 2, 2]
