"""Cross-tokenizer alignment of one text by character offsets, and merging of probabilities per group.

When the student and the teacher tokenize the same text differently, position ``k`` of one is not position
``k`` of the other. :func:`align_offsets` walks both tokenizations' character offsets (fast tokenizers'
``return_offsets_mapping=True``) and cuts the text wherever *both* have a token boundary; each cut delimits a
group of consecutive student tokens and a group of consecutive teacher tokens that spell the same characters.
:func:`merge_aligned_probs` turns each group into one probability row per side: the distribution that predicts
the group's first token, multiplied by the model's own probabilities of the group's later tokens (the chain
rule, so the row is the probability of "this group starts with token v and continues as observed"). Each
model only ever sees its own token ids.
"""

from __future__ import annotations

import attrs
import torch

from loopguard._validation import MAX_TOKENS_PER_TRAJECTORY, as_int_array, check_real
from loopguard.distill._common import check_logits, check_token_ids
from loopguard.exceptions import InputError, LoopguardTypeError

__all__ = ["OffsetAlignment", "align_offsets", "merge_aligned_probs"]


@attrs.frozen
class OffsetAlignment:
    """Groups of student and teacher tokens that cover the same characters, in text order.

    Attributes:
        student_groups: ``(start, end)`` half-open token-index ranges into the student's tokens.
        teacher_groups: The matching ranges into the teacher's tokens (same length as ``student_groups``).

    Example:
        >>> alignment = align_offsets([(0, 5), (5, 11)], [(0, 2), (2, 5), (5, 11)])  # "Hello world"
        >>> alignment.student_groups, alignment.teacher_groups
        (((0, 1), (1, 2)), ((0, 2), (2, 3)))
        >>> alignment.one_to_one
        1
    """

    student_groups: tuple[tuple[int, int], ...]
    teacher_groups: tuple[tuple[int, int], ...]

    @property
    def one_to_one(self) -> int:
        """Number of groups that are a single token on both sides (the tokenizers agree there)."""
        return sum(
            1
            for (s0, s1), (t0, t1) in zip(self.student_groups, self.teacher_groups, strict=True)
            if s1 - s0 == 1 and t1 - t0 == 1
        )


def _as_offsets(name: str, value: object) -> list[tuple[int, int, int]]:
    """Validate ``[T, 2]`` offsets; return units ``(first index, last index, end)`` of non-empty tokens.

    Consecutive tokens whose end does not move past the previous end (pieces of one multi-byte character)
    fold into one unit, since no boundary lies between them.
    """
    array = as_int_array(name, value, ndim=2, allow_empty=True, max_len=MAX_TOKENS_PER_TRAJECTORY, lo=0)
    if array.size and array.shape[1] != 2:
        msg = f"`{name}` must have shape [T, 2] (start, end character offsets), got {array.shape}."
        raise InputError(msg)
    units: list[tuple[int, int, int]] = []
    for index, (start, end) in enumerate(array.tolist()):
        if end < start:
            msg = f"`{name}` must have start <= end, got ({start}, {end}) at token {index}."
            raise InputError(msg)
        if end == start:  # special tokens (BOS, EOS, padding) cover no characters
            continue
        if units and end <= units[-1][2]:
            units[-1] = (units[-1][0], index, units[-1][2])
        else:
            units.append((index, index, end))
    return units


def align_offsets(student_offsets: object, teacher_offsets: object) -> OffsetAlignment:
    r"""Group two tokenizations of the same text at the character positions where both have a boundary.

    The walk compares token *end* offsets only, so tokenizers that attach a space to the next token
    (byte-level BPE: ``" world"``) and those that drop it (``"world"``) still agree on where ``"world"`` ends.
    Tokens with an empty span (special tokens) are skipped; tokens whose end does not move forward (byte
    pieces of one character) stay in the group of the token before them. If the two texts end at different
    characters, the tokens after the last common boundary form one final group.

    Args:
        student_offsets: ``[T_s, 2]`` character ``(start, end)`` offsets of the student's tokens (list,
            array or tensor), ``T_s <= 1,000,000``.
        teacher_offsets: ``[T_t, 2]`` offsets of the teacher's tokens of the same text.

    Returns:
        An :class:`OffsetAlignment`; token indices refer to the original sequences (special tokens included).

    Raises:
        LoopguardTypeError: non-integer offsets.
        InputError: not ``[T, 2]``, negative, or ``start > end``.

    Example:
        >>> student = [(0, 3), (3, 5), (6, 9)]  # "unfit dog" as "unf" "it" "dog"
        >>> teacher = [(0, 0), (0, 2), (2, 5), (5, 9)]  # BOS, "un", "fit", " dog"
        >>> align_offsets(student, teacher).teacher_groups
        ((1, 3), (3, 4))
    """
    student = _as_offsets("student_offsets", student_offsets)
    teacher = _as_offsets("teacher_offsets", teacher_offsets)
    student_groups: list[tuple[int, int]] = []
    teacher_groups: list[tuple[int, int]] = []
    i = j = 0
    while i < len(student) and j < len(teacher):
        i0, j0 = i, j
        while student[i][2] != teacher[j][2]:
            if student[i][2] < teacher[j][2]:
                i += 1
            else:
                j += 1
            if i == len(student) or j == len(teacher):
                break
        if i == len(student) or j == len(teacher):
            student_groups.append((student[i0][0], student[-1][1] + 1))
            teacher_groups.append((teacher[j0][0], teacher[-1][1] + 1))
            return OffsetAlignment(tuple(student_groups), tuple(teacher_groups))
        student_groups.append((student[i0][0], student[i][1] + 1))
        teacher_groups.append((teacher[j0][0], teacher[j][1] + 1))
        i += 1
        j += 1
    return OffsetAlignment(tuple(student_groups), tuple(teacher_groups))


def _merged_rows(
    logits: torch.Tensor, token_ids: torch.Tensor, groups: list[tuple[int, int]], temperature: float
) -> torch.Tensor:
    log_probs = torch.log_softmax(
        logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature, -1
    )
    # log-probability of each observed token under the row that predicts it (token i is predicted by row i-1)
    observed = torch.zeros(token_ids.shape[0], dtype=log_probs.dtype, device=log_probs.device)
    if token_ids.shape[0] > 1:
        observed[1:] = log_probs[:-1].gather(1, token_ids[1:, None]).squeeze(1)
    prefix = torch.cat([observed.new_zeros(1), observed.cumsum(0)])
    starts = torch.tensor([start for start, _ in groups], dtype=torch.long, device=log_probs.device)
    ends = torch.tensor([end for _, end in groups], dtype=torch.long, device=log_probs.device)
    continuation = prefix[ends] - prefix[starts + 1]  # sum of log p over the group's later tokens
    return torch.exp(log_probs[starts - 1] + continuation[:, None])


def merge_aligned_probs(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    student_ids: torch.Tensor,
    teacher_ids: torch.Tensor,
    alignment: OffsetAlignment,
    *,
    student_temperature: float = 1.0,
    teacher_temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""One probability row per aligned group and side, each model reading only its own tokens.

    For a group of tokens :math:`y_a, \dots, y_{b-1}` of one side, the row is

    .. math::

        r(v) = p(v \mid y_{<a}) \prod_{i=a+1}^{b-1} p(y_i \mid y_{<i})

    (the "observed" merge: the distribution over the group's first token times the probability of the
    continuation that was actually observed). A single-token group is just the distribution that predicts it.
    Rows of causal-LM logits predict the *next* token, so token ``a`` is predicted by row ``a - 1``; groups
    that start at token 0 on either side have no predicting row and are dropped on both sides.

    Args:
        student_logits: ``[T_s, V_s]`` logits of one sequence (the student's own tokenization).
        teacher_logits: ``[T_t, V_t]`` logits of the same text under the teacher's tokenization.
        student_ids: ``[T_s]`` the student's token ids of the text.
        teacher_ids: ``[T_t]`` the teacher's token ids of the text.
        alignment: From :func:`align_offsets` on the two tokenizations' offsets.
        student_temperature: Softmax temperature of the student, finite and > 0 (default 1.0).
        teacher_temperature: Softmax temperature of the teacher, finite and > 0 (default 1.0).

    Returns:
        ``(student_rows [G, V_s], teacher_rows [G, V_t])``, ready for :func:`loopguard.distill.uld_distance`
        or :func:`loopguard.distill.topk_align`; the student rows carry gradients.

    Raises:
        LoopguardTypeError: wrong tensor types or dtypes, an ``alignment`` that is not an
            :class:`OffsetAlignment`.
        InputError: shapes that do not match, ids outside the vocabulary, or groups past the sequence end.

    Example:
        >>> import torch
        >>> alignment = align_offsets([(0, 1), (1, 3)], [(0, 1), (1, 2), (2, 3)])  # "abc": a|bc vs a|b|c
        >>> student_rows, teacher_rows = merge_aligned_probs(
        ...     torch.zeros(2, 4), torch.zeros(3, 3), torch.tensor([0, 1]), torch.tensor([0, 1, 2]), alignment
        ... )
        >>> student_rows  # uniform over 4 tokens
        tensor([[0.2500, 0.2500, 0.2500, 0.2500]])
        >>> teacher_rows  # uniform over 3, times p("c" | "ab") = 1/3
        tensor([[0.1111, 0.1111, 0.1111]])
    """
    student_logits = check_logits("student_logits", student_logits, ndim=2)
    teacher_logits = check_logits("teacher_logits", teacher_logits, ndim=2)
    student_ids = check_token_ids(
        "student_ids", student_ids, (student_logits.shape[0],), "student_logits", student_logits.shape[1]
    )
    teacher_ids = check_token_ids(
        "teacher_ids", teacher_ids, (teacher_logits.shape[0],), "teacher_logits", teacher_logits.shape[1]
    )
    if not isinstance(alignment, OffsetAlignment):
        msg = f"`alignment` must be an OffsetAlignment, got an object of type {type(alignment).__name__}."
        raise LoopguardTypeError(msg)
    temp_s = check_real("student_temperature", student_temperature, lo=0.0, lo_inclusive=False)
    temp_t = check_real("teacher_temperature", teacher_temperature, lo=0.0, lo_inclusive=False)
    pairs = [
        (s, t)
        for s, t in zip(alignment.student_groups, alignment.teacher_groups, strict=True)
        if s[0] and t[0]
    ]
    for side, length, groups in (
        ("student", student_ids.shape[0], [s for s, _ in pairs]),
        ("teacher", teacher_ids.shape[0], [t for _, t in pairs]),
    ):
        if groups and groups[-1][1] > length:
            msg = (
                f"`alignment` must fit the {side}'s {length} tokens, got a group ending at {groups[-1][1]} "
                "(were the offsets from the same tokenization?)."
            )
            raise InputError(msg)
    if not pairs:
        return student_logits.new_zeros(0, student_logits.shape[1]), teacher_logits.new_zeros(
            0, teacher_logits.shape[1]
        )
    student_rows = _merged_rows(student_logits, student_ids, [s for s, _ in pairs], temp_s)
    teacher_rows = _merged_rows(teacher_logits, teacher_ids, [t for _, t in pairs], temp_t)
    return student_rows, teacher_rows
