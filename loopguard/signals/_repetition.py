"""Repetition and diversity of generated token sequences: the RAGEN "echo trap" signal.

A policy caught in the echo trap (Wang et al., 2025) collapses onto a few templated, self-repeating outputs.
Two views of the same n-gram counts are offered here:

* :func:`ngram_repetition_rate` -- per trajectory, the share of n-gram occurrences that repeat an n-gram seen
  earlier in the same trajectory (a completion that ends in a loop scores high however long its unique
  prefix), averaged over the batch;
* :func:`distinct_n` -- distinct n-grams over total n-grams (Li et al., 2016), pooled over the whole batch
  (diversity *across* completions) or per trajectory (``1 - repetition rate``).

:func:`classify_echo` turns a repetition rate into an ``OK`` / ``WARN`` / ``TRAP`` verdict.

All counting is exact (no hashing) and vectorised over the whole batch: every n-gram becomes one int64 key
that also holds its row, one sort orders them, and changes between neighbouring sorted keys are counted; the
counts are kept on the batch, so the per-row and pooled views of one batch cost one sort.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Literal, overload

import numpy as np
from numpy.typing import NDArray

from loopguard._validation import MAX_NGRAM_N, check_choice, check_int, check_real
from loopguard.exceptions import ConfigError
from loopguard.signals._sequences import TokenBatch, as_token_batch, token_range

__all__ = ["EchoVerdict", "classify_echo", "distinct_n", "ngram_repetition_rate"]

EchoVerdict = Literal["OK", "WARN", "TRAP"]
"""Verdict of :func:`classify_echo`: ``OK`` < warn <= ``WARN`` < trap <= ``TRAP``."""

_INT64_MAX = int(np.iinfo(np.int64).max)
# Batches of up to this many tokens count their n-grams in Python (a short loop beats a dozen numpy calls).
_PYTHON_TOKENS = 4096
# Token ids are relabelled through a lookup table (O(tokens + max id), no sort) only when the table is small.
_RELABEL_TABLE_MIN = 1 << 22


def _fits(key_max: int, base: int) -> bool:
    """Whether ``key * base + digit`` (``0 <= digit < base``) fits in int64 for every ``key <= key_max``.

    ``base`` itself must fit in int64 too: numpy multiplies an int64 array by it (``base`` is ``2**63`` when
    the largest token id is ``2**63 - 1``, and ``key * 2**63`` would not even convert).
    """
    return base <= _INT64_MAX and key_max * base + (base - 1) <= _INT64_MAX


def _dense_rank(high: NDArray[np.int64], low: NDArray[np.int64] | None = None) -> NDArray[np.int64]:
    """Rank values (or ``(high, low)`` pairs) densely along the last axis, in order. Exact."""
    order = np.argsort(high, axis=-1) if low is None else np.lexsort((low, high), axis=-1)
    ranked_high = np.take_along_axis(high, order, axis=-1)
    is_new = np.empty(high.shape, dtype=bool)
    is_new[..., :1] = True
    np.not_equal(ranked_high[..., 1:], ranked_high[..., :-1], out=is_new[..., 1:])
    if low is not None:
        ranked_low = np.take_along_axis(low, order, axis=-1)
        is_new[..., 1:] |= ranked_low[..., 1:] != ranked_low[..., :-1]
    ranks = np.empty(high.shape, dtype=np.int64)
    np.put_along_axis(ranks, order, np.cumsum(is_new, axis=-1, dtype=np.int64) - 1, axis=-1)
    return ranks


def _relabel(tokens: NDArray[np.int64]) -> tuple[NDArray[np.int64], int]:
    """Map token ids onto ``0..D-1`` (D = distinct ids) when a lookup table is cheap; return ids and base."""
    top = int(tokens.max())
    if top + 1 > max(_RELABEL_TABLE_MIN, 2 * tokens.size):
        return tokens, top + 1
    present = np.zeros(top + 1, dtype=bool)
    present[tokens] = True
    labels = np.cumsum(present, dtype=np.int64) - 1
    return labels[tokens], int(labels[-1]) + 1


def _ngram_keys(tokens: NDArray[np.int64], base: int, starts: NDArray[np.int64], n: int) -> NDArray[np.int64]:
    """Exact int64 keys of the n-grams at ``starts``: equal within a last-axis slice iff the n-grams match.

    Keys are packed as ``key * base + token`` while that cannot overflow int64. Otherwise the keys built so
    far are first replaced by their dense ranks along the last axis (so a 2-D ``starts`` is ranked row by
    row, which is cheap), and if even that does not fit (only for token ids too large to relabel), the pair
    ``(key, token)`` is ranked directly. No hashing: two different n-grams never share a key.
    """
    key = tokens[starts]
    key_max = base - 1
    for j in range(1, n):
        digit = tokens[starts + j]
        if not _fits(key_max, base):
            key = _dense_rank(key)
            key_max = int(key.max())
        if _fits(key_max, base):
            key *= base
            key += digit
            key_max = key_max * base + base - 1
        else:
            key = _dense_rank(key, digit)
            key_max = int(key.max())
    return key


def _packed_keys(
    tokens: NDArray[np.int64], base: int, offsets: NDArray[np.int64], n: int, shift: int
) -> tuple[NDArray[np.int64], int]:
    """``(n-gram key << shift) | row`` at every position, and how many positions hold no n-gram.

    Every position ``p`` of the flat tokens starts the n-gram ``tokens[p:p + n]`` (key ``sum tokens[p + j] *
    base^(n-1-j)``). Those that run past the end of their row (the last ``n - 1`` positions of each row, the
    whole of a row shorter than ``n``) get distinct negative keys instead of being cut out, which would copy
    the array: they sort first, and the caller skips them. The caller checks that ``(base^n - 1) << shift``
    fits.
    """
    count = len(tokens) - n + 1
    key: NDArray[np.int64] = tokens[:count].copy()
    for j in range(1, n):
        key *= base
        key += tokens[j : j + count]
    key <<= shift
    rows = len(offsets) - 1
    row_type = np.int16 if rows <= np.iinfo(np.int16).max + 1 else np.int32 if rows <= 1 << 31 else np.int64
    key |= np.repeat(np.arange(rows, dtype=row_type), np.diff(offsets))[:count]
    if n == 1:
        return key, 0
    ends = (offsets[1:, np.newaxis] - np.arange(1, n, dtype=np.int64)).ravel()
    # the positions whose n-gram leaves its row, each once and in order (a row shorter than n names some
    # twice): marked in a mask, which costs less than np.unique's sort
    leaves = np.zeros(count, dtype=bool)
    leaves[ends[(ends >= 0) & (ends < count)]] = True
    outside = np.flatnonzero(leaves)
    key[outside] = -1 - np.arange(len(outside), dtype=np.int64)
    return key, len(outside)


def _count_distinct_sorted(key: NDArray[np.int64]) -> NDArray[np.int64]:
    """Number of distinct values along the last axis of ``key``, sorted along that axis (length >= 1)."""
    changes: NDArray[np.int64] = np.count_nonzero(key[..., 1:] != key[..., :-1], axis=-1)
    return changes + 1


def _ngram_counts(batch: TokenBatch, n: int, *, per_row: bool) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Count distinct and total n-grams: per row (two ``[B]`` arrays) or pooled (two ``[1]`` arrays).

    Both views come from one pass (:func:`_ngram_stats`), kept on the batch: repetition (per row) and
    diversity (pooled) of the same batch and ``n`` sort its n-grams once.
    """
    distinct, total, pooled = _ngram_stats(batch, n)
    if per_row:
        return distinct, total
    return np.array([pooled], dtype=np.int64), np.array([int(total.sum())], dtype=np.int64)


def _ngram_stats(batch: TokenBatch, n: int) -> tuple[NDArray[np.int64], NDArray[np.int64], int]:
    """Distinct and total n-grams of each row, and distinct n-grams of the batch (kept on a frozen batch).

    Only n-grams that lie inside one row count. Each n-gram gets one exact key, and the row number joins it
    (``key * rows + row``): one sort of those keys counts the distinct (row, n-gram) pairs of every row and,
    with the row dropped, the distinct n-grams of the batch. When that cannot fit int64, the pooled count
    sorts the keys alone, and rows are grouped by their number of n-grams ``m`` (``m`` in
    ``(2^(b-1), 2^b]`` for group ``b``); each group is laid out as a matrix as wide as its longest row, short
    rows are padded with copies of their own last n-gram (which cannot change their distinct count), and
    each matrix is sorted row by row.
    """
    if not batch.frozen():  # arrays the caller can still change: count afresh
        return _count_ngrams(batch, n)
    cached = batch._cache.get(("ngrams", n))
    if cached is not None:
        return cached  # type: ignore[return-value]
    result = _count_ngrams(batch, n)
    batch._cache[("ngrams", n)] = result
    return result


def _count_ngrams(batch: TokenBatch, n: int) -> tuple[NDArray[np.int64], NDArray[np.int64], int]:
    if len(batch.tokens) <= _PYTHON_TOKENS:
        return _count_ngrams_in_python(batch, n)
    total = np.maximum(batch.lengths - (n - 1), 0)
    distinct = np.zeros(batch.n_rows, dtype=np.int64)
    if not total.any():
        return distinct, total, 0

    tokens, base = batch.tokens, token_range(batch)[1] + 1
    if base**n - 1 > _INT64_MAX:  # relabelling the ids may spare compressing the keys
        tokens, base = _relabel(tokens)

    rows = batch.n_rows
    shift = max(rows - 1, 1).bit_length()  # the row joins each key in its low bits
    if (base**n - 1) << shift <= _INT64_MAX:  # one sort of (n-gram, row) keys for both views
        packed, outside = _packed_keys(tokens, base, batch.offsets, n, shift)
        packed.sort()
        key = packed[outside:]  # the n-grams that lie inside a row, in order
        repeats = key[1:][key[1:] == key[:-1]]  # a (n-gram, row) seen before: a repeat within its row
        distinct += total - np.bincount(repeats & ((1 << shift) - 1), minlength=rows)
        key >>= shift  # the n-grams alone, still in order
        pooled = int(np.count_nonzero(key[1:] != key[:-1])) + 1
        return distinct, total, pooled

    bounds = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(total, out=bounds[1:])
    starts = np.arange(bounds[-1], dtype=np.int64)
    starts += np.repeat(batch.offsets[:-1] - bounds[:-1], total)
    key = _ngram_keys(tokens, base, starts, n)
    pooled = int(_count_distinct_sorted(np.sort(key)))
    group = np.frexp(total - 1)[1]  # exponent b with total - 1 < 2^b, i.e. total in (2^(b-1), 2^b]
    group[total == 0] = -1
    for b in np.unique(group[group >= 0]).tolist():
        members = np.flatnonzero(group == b)
        width = total[members]
        columns = np.minimum(np.arange(int(width.max()), dtype=np.int64), (width - 1)[:, np.newaxis])
        matrix = _ngram_keys(tokens, base, batch.offsets[members][:, np.newaxis] + columns, n)
        matrix.sort(axis=1)
        distinct[members] = _count_distinct_sorted(matrix)
    return distinct, total, pooled


def _count_ngrams_in_python(batch: TokenBatch, n: int) -> tuple[NDArray[np.int64], NDArray[np.int64], int]:
    """:func:`_count_ngrams` of a small batch, with Python sets of n-gram tuples (the same exact counts).

    On a batch of a few thousand tokens, the sort's dozen numpy calls cost more than the counting itself.
    """
    tokens, offsets = batch.tokens.tolist(), batch.offsets.tolist()
    distinct, total = [], []
    pooled: set[tuple[int, ...]] = set()
    for start, end in itertools.pairwise(offsets):
        count = end - start - n + 1  # n-grams that lie inside the row
        if count <= 0:
            distinct.append(0)
            total.append(0)
            continue
        grams = _grams(tokens, start, count, n)
        distinct.append(len(grams))
        total.append(count)
        pooled |= grams
    return np.array(distinct, dtype=np.int64), np.array(total, dtype=np.int64), len(pooled)


def _grams(tokens: Sequence[int], start: int, count: int, n: int) -> set[tuple[int, ...]]:
    """The distinct n-grams of the ``count`` that start at ``start``, ``start + 1``, ... of ``tokens``."""
    end = start + count
    if n == 2:  # bigrams, the default: two slices, without the general case's list of them
        return set(zip(tokens[start:end], tokens[start + 1 : end + 1], strict=True))
    return set(zip(*[tokens[start + j : end + j] for j in range(n)], strict=True))


def row_repetition_rates(rows: Sequence[Sequence[int]], n: int) -> NDArray[np.float64]:
    """:func:`repetition_rates` of the batch of ``rows`` (checked by ``plain_id_rows``), read off the rows.

    The same exact counts as a batch's Python path (:func:`_count_ngrams_in_python`) and the same division.
    """
    distinct = np.zeros(len(rows), dtype=np.int64)
    total = np.zeros(len(rows), dtype=np.int64)
    for index, row in enumerate(rows):
        count = len(row) - n + 1  # n-grams that lie inside the row
        if count > 0:
            distinct[index] = len(_grams(row, 0, count, n))
            total[index] = count
    return _fraction(distinct, total, repeated=True)


def corpus_distinct(batch: TokenBatch, n: int) -> float:
    """:func:`distinct_n` of a validated batch and ``n``, ``reduce="corpus"`` (1.0 without n-grams)."""
    distinct, total = _ngram_counts(batch, n, per_row=False)
    return float(distinct[0] / total[0]) if total[0] else 1.0


def repetition_rates(batch: TokenBatch, n: int) -> NDArray[np.float64]:
    """:func:`ngram_repetition_rate` of a validated batch and ``n``, ``reduce="none"``."""
    return _per_row_fraction(batch, n, repeated=True)


def _per_row_fraction(batch: TokenBatch, n: int, *, repeated: bool) -> NDArray[np.float64]:
    """Per-row share of repeated (``repeated=True``, 0.0 without n-grams) or distinct (1.0) n-grams."""
    distinct, total = _ngram_counts(batch, n, per_row=True)
    return _fraction(distinct, total, repeated=repeated)


def _fraction(
    distinct: NDArray[np.int64], total: NDArray[np.int64], *, repeated: bool
) -> NDArray[np.float64]:
    """Each row's share of repeated (0.0 without n-grams) or distinct (1.0) n-grams from its counts."""
    fraction = np.empty(len(total))
    fraction.fill(0.0 if repeated else 1.0)
    np.divide(total - distinct if repeated else distinct, total, out=fraction, where=total > 0)
    return fraction


@overload
def ngram_repetition_rate(sequences: object, n: int = 2, *, reduce: Literal["mean"] = "mean") -> float: ...
@overload
def ngram_repetition_rate(
    sequences: object, n: int = 2, *, reduce: Literal["none"]
) -> NDArray[np.float64]: ...


def ngram_repetition_rate(
    sequences: object, n: int = 2, *, reduce: str = "mean"
) -> float | NDArray[np.float64]:
    r"""Share of n-gram occurrences that repeat an n-gram seen earlier in the same trajectory.

    Trajectory :math:`i` with :math:`L_i` tokens has :math:`M_i = \max(L_i - n + 1, 0)` n-grams
    :math:`g_{i,1}, \dots, g_{i,M_i}`. Its rate counts every occurrence after the first of each n-gram, so a
    completion that ends in a loop scores high however long its unique prefix (counting repeated n-gram
    *types* instead would score "200 unique words, then 'x y' 100 times" at about 0.01; this scores
    197/399 = 0.49). A trajectory with fewer than ``n`` tokens has no n-grams and rate 0.0. The batch value
    is the plain mean over all trajectories, those without n-grams included.

    .. math::

        r_i = \frac{\#\{k : g_{i,k} \in \{g_{i,1}, \dots, g_{i,k-1}\}\}}{M_i}
            = 1 - \frac{|\{g_{i,1}, \dots, g_{i,M_i}\}|}{M_i},
        \qquad r = \frac{1}{B} \sum_{i=1}^{B} r_i

    ``ngram_repetition_rate(s, n, reduce="none") == 1 - distinct_n(s, n, reduce="none")`` (up to rounding).
    Counting is exact (no hashing) and vectorised over the batch.

    Args:
        sequences: A batch of ``B`` trajectories: a list of strings (whitespace-separated words), a list of
            token-id sequences (lists, 1-D arrays or tensors; lengths may differ), or a 2-D integer
            array/tensor with no padding. At most ``MAX_TRAJECTORIES`` (100,000) trajectories of at most
            ``MAX_TOKENS_PER_TRAJECTORY`` (1,000,000) tokens each.
        n: N-gram length, in ``[1, MAX_NGRAM_N]`` (32). Default 2 (bigrams) catches word- and phrase-level
            loops without flagging the natural reuse of single tokens.
        reduce: ``"mean"`` for the batch mean (a float) or ``"none"`` for the ``[B]`` per-trajectory rates.

    Returns:
        The batch-mean rate in ``[0, 1]``, or a float64 array of shape ``[B]`` of per-trajectory rates.

    Raises:
        LoopguardTypeError: ``n`` is a bool or not an integer; ``sequences`` is a single string, not a
            batch, or holds non-integer token ids.
        ConfigError: ``n`` out of range, or ``reduce`` not ``"mean"`` / ``"none"``.
        InputError: empty batch, negative token ids (unstripped padding), wrong ndim, or a DoS cap exceeded.

    Example:
        >>> ngram_repetition_rate(["a b a b"], n=2)  # bigrams ab, ba, ab: one repeat of three
        0.333...
        >>> ngram_repetition_rate([[7, 8, 7, 8, 7, 8, 7, 8], [1, 2, 3], [5]], n=2, reduce="none")
        array([0.714..., 0. , 0. ])

    References:
        Zihan Wang, Kangrui Wang, Qineng Wang, et al. (2025). "RAGEN: Understanding Self-Evolution in LLM
        Agents via Multi-Turn Reinforcement Learning." arXiv:2504.20073.
    """
    n = check_int("n", n, lo=1, hi=MAX_NGRAM_N)
    reduce = check_choice("reduce", reduce, ("mean", "none"))
    rates = repetition_rates(as_token_batch("sequences", sequences), n)
    if reduce == "none":
        return rates
    return float(rates.mean())


@overload
def distinct_n(sequences: object, n: int = 2, *, reduce: Literal["corpus", "mean"] = "corpus") -> float: ...
@overload
def distinct_n(sequences: object, n: int = 2, *, reduce: Literal["none"]) -> NDArray[np.float64]: ...


def distinct_n(sequences: object, n: int = 2, *, reduce: str = "corpus") -> float | NDArray[np.float64]:
    r"""Distinct-n: the number of distinct n-grams divided by the number of n-grams.

    ``reduce="corpus"`` (the default, Li et al.'s batch-level diversity) pools the n-grams of all
    trajectories, so it also falls when different completions say the same thing (mode collapse across the
    batch), which the per-trajectory view cannot see. ``"none"`` returns each trajectory's own distinct-n,
    ``"mean"`` their mean. With :math:`G_i` the multiset of trajectory :math:`i`'s n-grams
    (:math:`|G_i| = \max(L_i - n + 1, 0)`):

    .. math::

        d_{\mathrm{corpus}} = \frac{|\bigcup_i \mathrm{set}(G_i)|}{\sum_i |G_i|}, \qquad
        d_i = \frac{|\mathrm{set}(G_i)|}{|G_i|}, \qquad d_{\mathrm{mean}} = \frac{1}{B}\sum_i d_i

    No n-grams means no evidence of repetition: a trajectory shorter than ``n`` tokens has :math:`d_i = 1.0`
    and a batch without any n-gram has :math:`d_{\mathrm{corpus}} = 1.0`, so that
    ``distinct_n(s, n, reduce="none") == 1 - ngram_repetition_rate(s, n, reduce="none")`` holds for every
    trajectory. Li et al. scale the count by the number of generated tokens; dividing by the number of
    n-grams (as here) makes the value exactly 1.0 when no n-gram repeats. Counting is exact.

    Args:
        sequences: A batch of ``B`` trajectories, as in :func:`ngram_repetition_rate` (list of strings, list
            of token-id sequences, or a 2-D integer array; caps ``MAX_TRAJECTORIES`` = 100,000 trajectories
            of ``MAX_TOKENS_PER_TRAJECTORY`` = 1,000,000 tokens).
        n: N-gram length, in ``[1, MAX_NGRAM_N]`` (32). Default 2 (distinct-2).
        reduce: ``"corpus"`` (pooled over the batch, float), ``"mean"`` (mean of per-trajectory values,
            float) or ``"none"`` (``[B]`` per-trajectory values).

    Returns:
        A float in ``(0, 1]``, or a float64 array of shape ``[B]`` for ``reduce="none"``.

    Raises:
        LoopguardTypeError: ``n`` is a bool or not an integer; ``sequences`` is a single string, not a
            batch, or holds non-integer token ids.
        ConfigError: ``n`` out of range, or ``reduce`` not one of ``"corpus"``, ``"mean"``, ``"none"``.
        InputError: empty batch, negative token ids (unstripped padding), wrong ndim, or a DoS cap exceeded.

    Example:
        >>> distinct_n(["the cat sat", "the cat ran"], n=2)  # the-cat, cat-sat, cat-ran of 4 bigrams
        0.75
        >>> distinct_n(["the cat sat", "the cat ran"], n=2, reduce="none")
        array([1., 1.])

    References:
        Jiwei Li, Michel Galley, Chris Brockett, Jianfeng Gao, Bill Dolan (2016). "A Diversity-Promoting
        Objective Function for Neural Conversation Models." NAACL. arXiv:1510.03055.
    """
    n = check_int("n", n, lo=1, hi=MAX_NGRAM_N)
    reduce = check_choice("reduce", reduce, ("corpus", "mean", "none"))
    batch = as_token_batch("sequences", sequences)
    if reduce == "corpus":
        return corpus_distinct(batch, n)
    fractions = _per_row_fraction(batch, n, repeated=False)
    if reduce == "none":
        return fractions
    return float(fractions.mean())


def classify_echo(rate: float, *, warn: float = 0.30, trap: float = 0.60) -> EchoVerdict:
    r"""Classify a repetition rate into ``OK``, ``WARN`` or ``TRAP``.

    ``OK`` below ``warn``, ``WARN`` from ``warn`` up to (not including) ``trap``, ``TRAP`` from ``trap`` on:

    .. math::

        \mathrm{verdict}(r) = \begin{cases} \mathrm{OK} & r < w \\ \mathrm{WARN} & w \le r < t \\
        \mathrm{TRAP} & r \ge t \end{cases}

    RAGEN gives no numeric thresholds. The defaults 0.30 / 0.60 are loopguard's bands for the batch-mean
    bigram repetition rate of :func:`ngram_repetition_rate`, not values from the paper: calibrate them on a
    healthy run of your own task (templated outputs such as code or JSON repeat more n-grams than prose).

    Args:
        rate: A repetition rate in ``[0, 1]`` (typically from :func:`ngram_repetition_rate`).
        warn: Lower edge of ``WARN``, in ``(0, 1)``.
        trap: Lower edge of ``TRAP``, in ``(0, 1]`` and greater than ``warn``.

    Returns:
        ``"OK"``, ``"WARN"`` or ``"TRAP"``.

    Raises:
        LoopguardTypeError: an argument is a bool or not a real number.
        ConfigError: an argument is NaN/infinite or out of range, or ``warn >= trap``.

    Example:
        >>> classify_echo(0.1), classify_echo(0.3), classify_echo(0.6)
        ('OK', 'WARN', 'TRAP')
        >>> classify_echo(0.5, warn=0.2, trap=0.5)
        'TRAP'

    References:
        Zihan Wang, Kangrui Wang, Qineng Wang, et al. (2025). "RAGEN: Understanding Self-Evolution in LLM
        Agents via Multi-Turn Reinforcement Learning." arXiv:2504.20073.
    """
    rate = check_real("rate", rate, lo=0.0, hi=1.0)
    warn = check_real("warn", warn, lo=0.0, hi=1.0, lo_inclusive=False, hi_inclusive=False)
    trap = check_real("trap", trap, lo=0.0, hi=1.0, lo_inclusive=False)
    if warn >= trap:
        msg = f"`warn` must be < `trap` ({trap:g}), got {warn:g}."
        raise ConfigError(msg)
    if rate >= trap:
        return "TRAP"
    if rate >= warn:
        return "WARN"
    return "OK"
