import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopguard import InputError, LoopguardTypeError
from loopguard.signals import TokenBatch, as_token_batch
from loopguard.signals._sequences import token_range


def _rows(batch: TokenBatch) -> list[list[int]]:
    return [batch.tokens[a:b].tolist() for a, b in zip(batch.offsets[:-1], batch.offsets[1:], strict=True)]


def test_list_of_id_lists_round_trips():
    batch = as_token_batch("ids", [[1, 2, 3], [], [7]])
    assert _rows(batch) == [[1, 2, 3], [], [7]]
    assert batch.n_rows == 3
    assert batch.lengths.tolist() == [3, 0, 1]
    assert batch.row_ids().tolist() == [0, 0, 0, 2]


def test_two_d_array_and_numpy_rows():
    array = np.arange(6).reshape(2, 3)
    assert _rows(as_token_batch("ids", array)) == [[0, 1, 2], [3, 4, 5]]
    assert _rows(as_token_batch("ids", [np.array([4, 5]), np.array([], dtype=np.int64)])) == [[4, 5], []]


def test_torch_inputs():
    torch = pytest.importorskip("torch", reason="torch is part of the `hf` extra")
    assert _rows(as_token_batch("ids", torch.tensor([[1, 2], [3, 4]]))) == [[1, 2], [3, 4]]
    assert _rows(as_token_batch("ids", [torch.tensor([9]), torch.tensor([8, 8])])) == [[9], [8, 8]]


def test_strings_map_words_to_batch_ids_in_order_of_first_use():
    batch = as_token_batch("texts", ["the cat  the", "", "dog\tcat"])
    assert _rows(batch) == [[0, 1, 0], [], [2, 1]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 50), max_size=12), min_size=1, max_size=12))
def test_rows_preserved_for_any_ragged_batch(rows):
    assert _rows(as_token_batch("ids", rows)) == rows


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (
            "a b c",
            LoopguardTypeError,
            "`ids` must be a batch of sequences (a list of strings or of token-id lists)",
        ),
        (
            ["a b", [1, 2]],
            LoopguardTypeError,
            "`ids` must be all strings or all token-id sequences, not a mix.",
        ),
        ([], InputError, "`ids` must not be empty, got 0 sequences."),
        ([[1.0, 2.0]], LoopguardTypeError, "`ids[0]` must hold integer token ids, got dtype float64."),
        ([[1], [True]], LoopguardTypeError, "`ids[1]` must hold integer token ids, got booleans."),
        ([[1], [[1, 2]]], InputError, "`ids[1]` must be a 1-D sequence of token ids, got shape (1, 2)."),
        (
            [[5, 6], [1, -100]],
            InputError,
            "`ids` must hold token ids >= 0 (strip padding first), got -100 in row 1.",
        ),
        (np.zeros(3, dtype=int), InputError, "`ids` must be a 2-D array of token ids or a list of sequences"),
        (np.zeros((2, 2)), LoopguardTypeError, "`ids` must hold integer token ids, got dtype float64."),
        (42, LoopguardTypeError, "`ids` must be a list of sequences, got 42 of type int."),
    ],
)
def test_bad_inputs(value, error, message):
    with pytest.raises(error, match=re.escape(message)):
        as_token_batch("ids", value)


def test_caps():
    with pytest.raises(InputError, match=re.escape("`ids` must have at most 2 sequences (DoS cap), got 3.")):
        as_token_batch("ids", [[1], [2], [3]], max_trajectories=2)
    message = "`ids` must have at most 3 tokens per sequence (DoS cap), got 4 in row 1."
    with pytest.raises(InputError, match=re.escape(message)):
        as_token_batch("ids", [[1], [1, 2, 3, 4]], max_tokens=3)


def test_token_batch_passes_through_and_is_validated():
    batch = as_token_batch("ids", [[1, 2], [3]])
    assert as_token_batch("ids", batch) is batch
    with pytest.raises(InputError, match=re.escape("`ids` must have at most 1 sequences (DoS cap), got 2.")):
        as_token_batch("ids", batch, max_trajectories=1)
    tokens = np.array([1, 2, 3], dtype=np.int64)
    with pytest.raises(InputError, match=re.escape("`TokenBatch.offsets` must start at 0, never decrease")):
        TokenBatch(tokens=tokens, offsets=np.array([0, 2, 1, 3], dtype=np.int64))
    with pytest.raises(InputError, match=re.escape("end at len(tokens) (3)")):
        TokenBatch(tokens=tokens, offsets=np.array([0, 2], dtype=np.int64))
    with pytest.raises(
        LoopguardTypeError, match=re.escape("`TokenBatch.tokens` must be a 1-D int64 numpy array")
    ):
        TokenBatch(tokens=[1, 2, 3], offsets=np.array([0, 3], dtype=np.int64))


def test_a_checked_batch_is_checked_again_against_other_caps_and_while_its_arrays_can_change():
    batch = as_token_batch("ids", [[1, 2], [3]])
    assert as_token_batch("ids", batch) is batch  # checked twice against the default caps
    message = "`ids` must have at most 1 tokens per sequence (DoS cap), got 2 in row 0."
    with pytest.raises(InputError, match=re.escape(message)):
        as_token_batch("ids", batch, max_tokens=1)
    tokens = np.array([1, 2, 3], dtype=np.int64)  # arrays the caller still holds: never taken as checked
    held = TokenBatch(tokens=tokens, offsets=np.array([0, 2, 3], dtype=np.int64))
    assert as_token_batch("ids", held) is held
    tokens[1] = -100
    with pytest.raises(InputError, match=re.escape("`ids` must hold token ids >= 0 (strip padding first)")):
        as_token_batch("ids", held)


def test_large_ids_survive_empty_rows_exactly():
    big = 2**62 + 1
    batch = as_token_batch("ids", [[big, big + 2], []])
    assert batch.tokens.tolist() == [big, big + 2]
    with pytest.raises(InputError, match=re.escape("`ids` must hold token ids that fit in int64")):
        as_token_batch("ids", np.array([[2**63]], dtype=np.uint64))
    with pytest.raises(InputError, match=re.escape("`ids[0]` must hold token ids that fit in int64")):
        as_token_batch("ids", [np.array([2**63], dtype=np.uint64)])


@settings(max_examples=50, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(0, 50_000), max_size=9), min_size=1, max_size=6),
    left=st.booleans(),
    mask_type=st.sampled_from([np.bool_, np.int8, np.uint8, np.int32, np.int64]),
    pad=st.integers(-100, 50_000),
)
def test_a_padded_batch_and_its_mask_give_the_rows(rows, left, mask_type, pad):
    width = max(len(row) for row in rows) + 1
    ids = np.full((len(rows), width), pad, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=mask_type)
    for i, row in enumerate(rows):
        start = width - len(row) if left else 0
        ids[i, start : start + len(row)] = row
        mask[i, start : start + len(row)] = 1
    batch = TokenBatch.from_padded(ids, mask)
    assert _rows(batch) == rows  # the pad id, even a negative one, is never read
    # what from_padded hands the kernels ready-made is what they would compute
    assert batch.frozen()
    assert batch.lengths.tolist() == np.diff(batch.offsets).tolist()
    assert not batch.lengths.flags.writeable
    flat = [token for row in rows for token in row]
    if flat:
        assert token_range(batch) == (min(flat), max(flat))
    import torch

    assert _rows(TokenBatch.from_padded(torch.from_numpy(ids), torch.from_numpy(mask))) == rows


@pytest.mark.parametrize(
    ("ids", "mask", "error", "message"),
    [
        (
            [[1, 2]],
            [[1, 1, 0]],
            InputError,
            "`completion_ids` and its mask must both be 2-D and of one shape",
        ),
        ([1, 2], [1, 1], InputError, "must both be 2-D"),
        (
            [[1.0, 2.0]],
            [[1, 1]],
            LoopguardTypeError,
            "`completion_ids` must hold integer token ids, got dtype float",
        ),
        ([[1, 2]], [[0.5, 1.0]], LoopguardTypeError, "`completion_ids mask` must be boolean or 0/1 integers"),
        (
            [[1, 2]],
            [[2, 1]],
            InputError,
            "`completion_ids mask` must hold only 0 and 1, got values in [1, 2].",
        ),
        (
            [[1, -100]],
            [[1, 1]],
            InputError,
            "must hold token ids >= 0 (strip padding first), got -100 in row 0",
        ),
    ],
)
def test_a_padded_batch_is_validated(ids, mask, error, message):
    with pytest.raises(error, match=re.escape(message)):
        TokenBatch.from_padded(np.asarray(ids), np.asarray(mask))


@pytest.mark.parametrize("mask_type", [np.int8, np.int16, np.int32, np.int64])
@pytest.mark.parametrize("bad", [-1, 2, -128])
def test_a_signed_mask_outside_0_and_1_is_refused(mask_type, bad):
    mask = np.array([[1, bad, 0]], dtype=mask_type)
    with pytest.raises(InputError, match=re.escape(f"must hold only 0 and 1, got values in [{min(bad, 0)}, ")):
        TokenBatch.from_padded(np.array([[5, 6, 7]]), mask)


def test_a_frozen_batch_keeps_its_row_ids_read_only_and_a_callers_batch_recounts_them():
    batch = as_token_batch("ids", [[4, 5], [], [6, 6, 6]])
    rows = batch.row_ids()
    assert rows.tolist() == [0, 0, 2, 2, 2]
    assert batch.row_ids() is rows  # every penalty target of the step reads the same array
    with pytest.raises(ValueError, match="read-only"):
        rows[0] = 1
    offsets = batch.offsets.copy()  # arrays the caller still holds: derived afresh every time
    mine = TokenBatch(tokens=batch.tokens.copy(), offsets=offsets)
    assert mine.row_ids() is not mine.row_ids()
    offsets[1] = 1
    assert mine.row_ids().tolist() == [0, 1, 2, 2, 2]  # rows of 1, 1 and 3 tokens now
