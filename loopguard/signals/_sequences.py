"""Batches of variable-length token sequences in one flat array (CSR layout).

Text kernels accept what trainers hand out: a list of token-id lists (TRL's ``completion_ids``), a 2-D
integer array or tensor with no padding, or a list of strings (split on whitespace). All of them become a
:class:`TokenBatch`: one flat int64 array of tokens plus row offsets, so the kernels are vectorised over the
whole batch instead of looping in Python.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import cast

import attrs
import numpy as np
from numpy.typing import NDArray

from loopguard._validation import (
    MAX_TOKENS_PER_TRAJECTORY,
    MAX_TRAJECTORIES,
    _python_int_overflow,
    describe,
    to_numpy,
)
from loopguard.exceptions import InputError, LoopguardTypeError

_INT64_MAX = int(np.iinfo(np.int64).max)

__all__ = ["TokenBatch", "as_token_batch"]


@attrs.frozen(eq=False)
class TokenBatch:
    """Token sequences stored flat: row ``i`` is ``tokens[offsets[i]:offsets[i + 1]]``.

    Attributes:
        tokens: All tokens of all rows, int64, non-negative.
        offsets: Row boundaries, int64, length ``n_rows + 1``, starting at 0 and non-decreasing.
    """

    tokens: NDArray[np.int64]
    offsets: NDArray[np.int64]
    # per-batch results the kernels share (n-gram counts by n), kept only for a batch whose arrays loopguard
    # made and froze (:meth:`frozen`): then no one can change the tokens under the cache
    _cache: dict[object, object] = attrs.field(factory=dict, init=False, repr=False)

    def frozen(self) -> bool:
        """Whether the batch owns read-only arrays (built by :func:`as_token_batch` or :meth:`from_padded`).

        Kernels keep what they count on such a batch and share it: repetition and distinct-n of one frozen
        batch sort its n-grams once. A batch built by hand from arrays the caller still holds is recounted
        every time.
        """
        return all(array.base is None and not array.flags.writeable for array in (self.tokens, self.offsets))

    @classmethod
    def from_padded(cls, ids: object, mask: object, *, name: str = "completion_ids") -> TokenBatch:
        """The batch of a padded ``[B, L]`` id array or tensor and its ``[B, L]`` mask, with no per-row work.

        What trainers hold: TRL's GRPO/RLOO keep ``completion_ids`` and ``completion_mask`` as padded tensors.
        Row ``i`` is ``ids[i][mask[i] != 0]``, in order (right or left padding alike); the pad id is never
        read, so any value may fill the padding.

        Args:
            ids: Integer token ids, shaped ``[B, L]`` (a tensor on any device, or an array).
            mask: 1 (or True) where ``ids`` holds a token, 0 (False) at padding; the same shape as ``ids``.
            name: How messages name ``ids`` (the mask is ``<name> mask``).

        Raises:
            LoopguardTypeError: non-integer ids, or a mask that is not boolean or integer.
            InputError: not 2-D, shapes that differ, a mask value other than 0 or 1, or a negative id where
                the mask marks a token.

        Example:
            >>> batch = TokenBatch.from_padded([[5, 6, 0], [7, 0, 0]], [[1, 1, 0], [1, 0, 0]])
            >>> batch.tokens.tolist(), batch.offsets.tolist()
            ([5, 6, 7], [0, 2, 3])
        """
        array, marks = to_numpy(name, ids), to_numpy(f"{name} mask", mask)
        if array.ndim != 2 or marks.shape != array.shape:
            msg = (
                f"`{name}` and its mask must both be 2-D and of one shape [B, L], got {array.shape} and "
                f"{marks.shape}."
            )
            raise InputError(msg)
        if array.dtype.kind not in "iu":
            msg = f"`{name}` must hold integer token ids, got dtype {array.dtype}."
            raise LoopguardTypeError(msg)
        if marks.dtype.kind not in "biu":
            msg = f"`{name} mask` must be boolean or 0/1 integers, got dtype {marks.dtype}."
            raise LoopguardTypeError(msg)
        # read as unsigned, a mask of 0s and 1s has its maximum at most 1 (a -1 reads as the type's maximum)
        unsigned = marks.dtype.str.replace("i", "u")
        if marks.dtype != np.bool_ and marks.size and int(marks.view(unsigned).max()) > 1:
            low, high = int(marks.min()), int(marks.max())
            msg = f"`{name} mask` must hold only 0 and 1, got values in [{low}, {high}]."
            raise InputError(msg)
        if marks.dtype == np.bool_:
            keep = marks
        else:
            keep = marks.view(np.bool_) if marks.dtype.itemsize == 1 else marks.astype(np.bool_)
        if array.dtype == np.uint64 and array.size and int(array.max()) > np.iinfo(np.int64).max:
            msg = f"`{name}` must hold token ids that fit in int64, got {int(array.max())}."
            raise InputError(msg)
        tokens = array[keep]  # a new contiguous array, row-major: rows in order
        if tokens.dtype != np.int64:
            tokens = tokens.astype(np.int64)
        lengths = keep.sum(axis=1, dtype=np.int64)
        offsets = np.zeros(array.shape[0] + 1, dtype=np.int64)
        lengths.cumsum(out=offsets[1:])
        batch = _owned(tokens, offsets)
        if batch.frozen():  # what the checks below and the kernels read, known here: not scanned again
            batch._keep("lengths", lengths)
            if tokens.size:
                batch._cache["token_range"] = (int(tokens.min()), int(tokens.max()))
        return as_token_batch(name, batch)

    def __attrs_post_init__(self) -> None:
        """Reject a hand-built batch whose offsets do not describe its tokens."""
        for field, array in (("tokens", self.tokens), ("offsets", self.offsets)):
            if not isinstance(array, np.ndarray) or array.ndim != 1 or array.dtype != np.int64:
                msg = f"`TokenBatch.{field}` must be a 1-D int64 numpy array, got {describe(array)}."
                raise LoopguardTypeError(msg)
        offsets = self.offsets
        if (
            offsets.size == 0
            or offsets[0] != 0
            or offsets[-1] != self.tokens.size
            or (offsets.size > 1 and bool((offsets[1:] < offsets[:-1]).any()))
        ):
            msg = (
                "`TokenBatch.offsets` must start at 0, never decrease and end at len(tokens) "
                f"({self.tokens.size}), got {describe(offsets)}."
            )
            raise InputError(msg)

    @property
    def n_rows(self) -> int:
        """Number of sequences in the batch."""
        return len(self.offsets) - 1

    @property
    def lengths(self) -> NDArray[np.int64]:
        """Number of tokens in each sequence (read-only and computed once for a :meth:`frozen` batch)."""
        return self._kept("lengths", lambda: self.offsets[1:] - self.offsets[:-1])

    def row_ids(self) -> NDArray[np.int64]:
        """Row index of every token, aligned with :attr:`tokens` (read-only and computed once when frozen)."""
        return self._kept("row_ids", lambda: np.repeat(np.arange(self.n_rows, dtype=np.int64), self.lengths))

    def _kept(self, key: str, make: Callable[[], NDArray[np.int64]]) -> NDArray[np.int64]:
        """The array kept under ``key`` on a frozen batch, made once; made afresh on any other batch."""
        cached = self._cache.get(key)
        if cached is not None:
            return cached  # type: ignore[return-value]
        array = make()
        if self.frozen():
            self._keep(key, array)
        return array

    def _keep(self, key: str, array: NDArray[np.int64]) -> None:
        """Keep ``array`` (made read-only) under ``key``; only for a frozen batch."""
        array.flags.writeable = False
        self._cache[key] = array


def token_range(batch: TokenBatch) -> tuple[int, int]:
    """The smallest and largest token id of a non-empty batch, scanned once for a frozen batch.

    Validation needs the minimum (no negative ids) and the n-gram kernels the maximum (the key base); a
    batch that several kernels share would otherwise be scanned by each of them.
    """
    cached = batch._cache.get("token_range")
    if cached is not None:
        return cached  # type: ignore[return-value]
    found = (int(batch.tokens.min()), int(batch.tokens.max()))
    if batch.frozen():
        batch._cache["token_range"] = found
    return found


def _owned(tokens: NDArray[np.int64], offsets: NDArray[np.int64]) -> TokenBatch:
    """A batch of arrays made here: frozen (read-only) unless one is a view of the caller's data."""
    for array in (tokens, offsets):
        if array.base is None:
            array.flags.writeable = False
    return TokenBatch(tokens=tokens, offsets=offsets)


def _from_rectangular(name: str, array: NDArray[np.generic]) -> TokenBatch:
    if array.dtype.kind not in "iu":
        msg = f"`{name}` must hold integer token ids, got dtype {array.dtype}."
        raise LoopguardTypeError(msg)
    if array.dtype == np.uint64 and array.size and int(array.max()) > np.iinfo(np.int64).max:
        msg = f"`{name}` must hold token ids that fit in int64, got {int(array.max())}."
        raise InputError(msg)
    rows, width = array.shape
    tokens = np.empty(rows * width, dtype=np.int64)  # a copy of its own: the caller may change the array
    tokens.reshape(rows, width)[...] = array
    offsets = np.arange(rows + 1, dtype=np.int64) * width
    return _owned(tokens, offsets)


def _from_strings(sequences: Sequence[str]) -> TokenBatch:
    vocabulary: dict[str, int] = {}
    lookup = vocabulary.setdefault
    words_per_row = [text.split() for text in sequences]
    flat = [lookup(word, len(vocabulary)) for word in itertools.chain.from_iterable(words_per_row)]
    lengths = np.fromiter((len(words) for words in words_per_row), dtype=np.int64, count=len(sequences))
    offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
    lengths.cumsum(out=offsets[1:])
    return _owned(np.asarray(flat, dtype=np.int64), offsets)


def _from_int_rows(sequences: Sequence[object]) -> TokenBatch | None:
    """Rows that are lists or tuples of Python ints, in one conversion; None for anything else.

    What trainers hand out (TRL's ``completion_ids``, a tokenizer's ``input_ids``). Anything else (arrays,
    tensors, numpy ints, floats, bools, ids beyond int64) takes the row-by-row path, whose errors name the
    row.
    """
    flat = _int_rows_flat(sequences)
    if flat is None:
        return None
    rows = cast("Sequence[Sequence[int]]", sequences)
    tokens = np.asarray(flat) if flat else np.zeros(0, np.int64)
    if tokens.dtype != np.int64:  # an id beyond int64 (an object array): explained row by row
        return None
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    lengths.cumsum(out=offsets[1:])
    batch = _owned(tokens, offsets)
    if batch.frozen():  # known here: the cap check and the kernels read the lengths without a diff
        batch._keep("lengths", lengths)
    return batch


def _int_rows_flat(rows: Sequence[object]) -> list[int] | None:
    """Every id of ``rows``, in order, when the rows are lists or tuples of exact Python ints; else None."""
    if not all(type(row) is list or type(row) is tuple for row in rows):
        return None
    flat = list(itertools.chain.from_iterable(cast("Sequence[Sequence[object]]", rows)))
    return cast("list[int]", flat) if set(map(type, flat)) <= {int} else None


def plain_id_rows(sequences: object) -> Sequence[Sequence[int]] | None:
    """``sequences`` itself when :func:`as_token_batch` takes it with its default caps and no conversion.

    That is: a non-empty list or tuple of at most :data:`MAX_TRAJECTORIES` rows, each a list or tuple of at
    most :data:`MAX_TOKENS_PER_TRAJECTORY` Python ints in ``[0, 2**63)`` (TRL's ``completion_ids``). None
    for anything else, which :func:`as_token_batch` converts or explains. A kernel that reads a few numbers
    per row (the targeted penalty, in the trainer's reward step) reads such rows without building a batch.
    """
    if type(sequences) is not list and type(sequences) is not tuple:
        return None
    rows = cast("Sequence[object]", sequences)
    if not rows or len(rows) > MAX_TRAJECTORIES:
        return None
    ids = _int_rows_flat(rows)
    if ids is None:
        return None
    lists = cast("Sequence[Sequence[int]]", rows)
    if max(map(len, lists)) > MAX_TOKENS_PER_TRAJECTORY:
        return None
    if ids and not (min(ids) >= 0 and max(ids) <= _INT64_MAX):
        return None
    return lists


def _from_id_sequences(name: str, sequences: Sequence[object]) -> TokenBatch:
    """Rows of ids one by one (arrays, tensors, numpy ints): what :func:`_from_int_rows` does not take."""
    arrays = [to_numpy(f"{name}[{i}]", row) for i, row in enumerate(sequences)]
    for i, row in enumerate(arrays):
        if row.ndim != 1:
            msg = f"`{name}[{i}]` must be a 1-D sequence of token ids, got shape {row.shape}."
            raise InputError(msg)
        if row.size and row.dtype.kind not in "iu":
            _python_int_overflow(f"{name}[{i}]", sequences[i], row, "token ids")  # e.g. [2**63, 5] or [2**64]
            kind = "booleans" if row.dtype.kind == "b" else f"dtype {row.dtype}"
            msg = f"`{name}[{i}]` must hold integer token ids, got {kind}."
            raise LoopguardTypeError(msg)
        if row.dtype == np.uint64 and row.size and int(row.max()) > np.iinfo(np.int64).max:
            msg = f"`{name}[{i}]` must hold token ids that fit in int64, got {int(row.max())}."
            raise InputError(msg)
    lengths = np.fromiter((row.size for row in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    lengths.cumsum(out=offsets[1:])
    # Empty rows convert to float64 arrays; leave them out so ids are never routed through float64.
    non_empty = [row for row in arrays if row.size]
    tokens = np.concatenate(non_empty, dtype=np.int64) if non_empty else np.zeros(0, np.int64)
    return _owned(tokens, offsets)


def as_token_batch(
    name: str,
    sequences: object,
    *,
    max_trajectories: int = MAX_TRAJECTORIES,
    max_tokens: int = MAX_TOKENS_PER_TRAJECTORY,
) -> TokenBatch:
    """Validate a batch of token sequences and return it as a :class:`TokenBatch`.

    Args:
        name: Argument name used in error messages.
        sequences: One of: a list of strings (tokens are whitespace-separated words; ids are assigned per
            batch), a list of token-id sequences (lists, tuples, 1-D arrays or tensors), a 2-D integer
            array/tensor whose every entry is a token (strip padding first), or a :class:`TokenBatch`
            (returned as is after the cap checks, so several kernels can share one conversion).
        max_trajectories: Cap on the number of sequences (DoS cap).
        max_tokens: Cap on the tokens in one sequence (DoS cap).

    Returns:
        The batch in flat form. Empty sequences are allowed; an empty batch is not.

    Raises:
        LoopguardTypeError: a bare string, mixed strings and ids, or non-integer ids.
        InputError: empty batch, caps exceeded, or negative ids (typically unstripped padding such as -100).

    Example:
        >>> batch = as_token_batch("completions", ["a b a", "c"])
        >>> batch.tokens.tolist(), batch.offsets.tolist()
        ([0, 1, 0, 2], [0, 3, 4])
        >>> as_token_batch("completion_ids", [[5, 6], [-100]])
        Traceback (most recent call last):
        ...
        loopguard.exceptions.InputError: `completion_ids` must hold token ids >= 0 (strip padding first), got -100 in row 1.
    """  # noqa: E501
    caps = (max_trajectories, max_tokens)
    if isinstance(sequences, TokenBatch):
        if sequences._cache.get("caps") == caps:  # a frozen batch checked against these caps: unchanged since
            return sequences
        batch = sequences
    elif isinstance(sequences, (str, bytes)):
        msg = (
            f"`{name}` must be a batch of sequences (a list of strings or of token-id lists), "
            f"got a single {type(sequences).__name__} {describe(sequences)}."
        )
        raise LoopguardTypeError(msg)
    elif hasattr(sequences, "ndim") or isinstance(sequences, np.ndarray):
        array = to_numpy(name, sequences)
        if array.ndim != 2:
            msg = (
                f"`{name}` must be a 2-D array of token ids or a list of sequences (shaped [B, L]), "
                f"got shape {array.shape}."
            )
            raise InputError(msg)
        batch = _from_rectangular(name, array)
    elif isinstance(sequences, Sequence):
        items: Sequence[object] = sequences
        fast = _from_int_rows(items)  # lists of Python ints, what trainers hand out: no scan for strings
        if fast is not None:
            batch = fast
        elif len(items) and all(isinstance(item, str) for item in items):
            batch = _from_strings(items)  # type: ignore[arg-type]
        elif any(isinstance(item, (str, bytes)) for item in items):
            msg = f"`{name}` must be all strings or all token-id sequences, not a mix."
            raise LoopguardTypeError(msg)
        else:
            batch = _from_id_sequences(name, items)
    else:
        kind = type(sequences).__name__
        msg = f"`{name}` must be a list of sequences, got {describe(sequences)} of type {kind}."
        raise LoopguardTypeError(msg)

    if batch.n_rows == 0:
        msg = f"`{name}` must not be empty, got 0 sequences."
        raise InputError(msg)
    if batch.n_rows > max_trajectories:
        msg = f"`{name}` must have at most {max_trajectories:,} sequences (DoS cap), got {batch.n_rows:,}."
        raise InputError(msg)
    lengths = batch.lengths
    if lengths.size and int(lengths.max()) > max_tokens:
        row = int(np.argmax(lengths))
        msg = (
            f"`{name}` must have at most {max_tokens:,} tokens per sequence (DoS cap), "
            f"got {int(lengths[row]):,} in row {row}."
        )
        raise InputError(msg)
    if batch.tokens.size and token_range(batch)[0] < 0:
        position = int(np.argmax(batch.tokens < 0))
        row = int(np.searchsorted(batch.offsets, position, side="right") - 1)
        msg = (
            f"`{name}` must hold token ids >= 0 (strip padding first), "
            f"got {int(batch.tokens[position])} in row {row}."
        )
        raise InputError(msg)
    if batch.frozen():
        batch._cache["caps"] = caps
    return batch
