"""The trainer's padded completion ids as the GRPO / RLOO source reads them (hand-built values).

End-to-end reads through real TRL trainers are in test_grpo.py (one process, truncated completions masked)
and tests/distributed/test_rank_sync.py (two processes, ids all-gathered).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from loopguard.adapters._observe import (
    IdCapture,
    Padded,
    SourceError,
    _finite,
    _finite_row,
    _restore_truncated,
)
from loopguard.signals import TokenBatch


def _rows(padded: Padded) -> list[list[int]]:
    return [row[mask].tolist() for row, mask in zip(padded.ids, padded.mask, strict=True)]


def test_rows_are_taken_in_order_and_parts_joined_at_the_widest():
    first = Padded(
        np.array([[1, 2, 0], [3, 0, 0], [4, 5, 6]]), np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1]], bool)
    )
    second = Padded(np.array([[7, 8, 9, 9, 0]]), np.array([[1, 1, 1, 1, 0]], bool))
    assert first.take([0, 1, 2]) is first  # every row: no copy
    assert _rows(first.take([2, 0])) == [[4, 5, 6], [1, 2]]
    joined = Padded.join([first.take([0, 2]), second])
    assert joined.ids.shape == (3, 5)
    assert _rows(joined) == [[1, 2], [4, 5, 6], [7, 8, 9, 9]]
    batch = TokenBatch.from_padded(joined.ids, joined.mask)
    assert batch.tokens.tolist() == [1, 2, 4, 5, 6, 7, 8, 9, 9]


def test_truncated_rows_get_their_tokens_back_up_to_the_last_non_pad_id():
    pad = 0
    ids = np.array([[5, 0, 6, 7], [8, 9, 0, 0], [4, 4, 0, 0], [0, 0, 0, 0]])
    # row 0: truncated at full width (a pad id inside it stays); row 1: truncated at 2 of 4 (padded by
    # another process's wider rows); row 2: ended (its mask untouched); row 3: nothing but padding
    mask = np.array([[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]], bool)
    _restore_truncated(ids, mask, pad)
    assert mask.sum(axis=1).tolist() == [4, 2, 3, 0]
    with pytest.raises(SourceError, match="without a pad_token_id their ends are unknown"):
        _restore_truncated(ids, np.zeros_like(mask), None)


class _Trainer:
    processing_class = None
    mask_truncated_completions = False

    def _generate_and_score_completions(self, inputs):
        return inputs


def test_the_capture_is_installed_once_and_reports_what_it_cannot_read():
    trainer = _Trainer()
    capture = IdCapture.install(trainer)
    assert capture is not None
    assert IdCapture.install(trainer) is capture
    ids, mask = np.array([[3, 4, 0]]), np.array([[1, 1, 0]])
    output = {"completion_ids": ids, "completion_mask": mask}
    assert trainer._generate_and_score_completions(output) is output  # the trainer's result, untouched
    assert capture.generations == 1
    assert capture.error is None
    assert capture.latest is not None
    assert _rows(capture.latest) == [[3, 4]]
    trainer._generate_and_score_completions({"completion_ids": ids})  # no mask: nothing read, and why
    assert capture.latest is None
    assert (
        capture.error == "the generation step returned no 2-D completion_ids and completion_mask of one shape"
    )
    assert IdCapture.install(object()) is None  # nothing to wrap


def test_ids_that_cannot_be_read_on_the_host_are_reported_when_the_batch_is_read():
    import torch

    trainer = _Trainer()
    capture = IdCapture.install(trainer)
    assert capture is not None
    meta = torch.empty((2, 3), dtype=torch.int64, device="meta")  # a shape, and no data to read
    trainer._generate_and_score_completions({"completion_ids": meta, "completion_mask": meta})
    assert capture.error is None  # the generation step only kept them
    assert capture.latest is None
    assert capture.error is not None
    assert "completion_ids" in capture.error
    assert "meta" in capture.error


class _CountingTokenizer:
    """A tokenizer whose pad id says how often it was read."""

    def __init__(self) -> None:
        self.reads = 0

    @property
    def pad_token_id(self) -> int:
        self.reads += 1
        return 0


def test_the_pad_id_is_read_only_where_truncated_completions_need_it():
    tokenizer = _CountingTokenizer()
    trainer = _Trainer()
    trainer.processing_class = tokenizer
    capture = IdCapture.install(trainer)
    ids, mask = np.array([[3, 4, 5], [6, 0, 0]]), np.array([[0, 0, 0], [1, 0, 0]])  # row 0 was truncated
    trainer._generate_and_score_completions({"completion_ids": ids, "completion_mask": mask})
    assert tokenizer.reads == 0  # a generation step per optimizer step: no tokenizer lookup when unused
    assert _rows(capture.latest) == [[], [6]]
    trainer.mask_truncated_completions = True
    trainer._generate_and_score_completions({"completion_ids": ids, "completion_mask": mask})
    assert _rows(capture.latest) == [[3, 4, 5], [6]]  # read when the batch is read, the pad id with it
    assert tokenizer.reads == 1


_LOGGED = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 0.0, -0.0]),  # finite terms whose sum overflows
    st.integers(-5, 5),
    st.booleans(),
    st.none(),
    st.text(max_size=2),
    st.builds(np.float64, st.floats(allow_nan=True, allow_infinity=True)),
)


@given(st.lists(_LOGGED, max_size=12))
@example([1e308, 1e308, 5.0])
@example([0.5, float("nan")])
@example([1.0, float("-inf"), float("inf")])
@settings(max_examples=300, deadline=None)
def test_a_logged_row_reads_as_each_value_does(values):
    """The whole-row reading of logged rewards and metrics gives what reading each value gives."""
    row = _finite_row(values)
    assert row == tuple(_finite(value) for value in values)
    assert [type(v) for v in row] == [type(_finite(value)) for value in values]
