"""Token mapping between two vocabularies, and top-k distillation through it (``topk_align``).

Two tokenizers often share many pieces once their word-boundary markers agree: byte-level BPE (GPT-2, Llama 3,
Qwen) writes a leading space as ``"Ġ"``, SentencePiece (Llama 2, Gemma, T5) as ``"▁"``. :class:`TokenMapping`
normalises both markers to a plain space and matches pieces exactly, one to one; it reports how much of each
vocabulary it covers. :func:`topk_align` then distils the teacher's top-k probabilities onto the student's ids
where a mapping exists, and compares what is left by sorted ULD, so the known part of the correspondence is
used token by token instead of rank by rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
import torch
from numpy.typing import NDArray

from loopguard._validation import MAX_TRAJECTORIES, as_int_array, check_int, describe
from loopguard.distill._common import MAX_VOCAB_SIZE, check_logits, check_prob_rows
from loopguard.distill._uld import _sorted_l1
from loopguard.exceptions import InputError, LoopguardTypeError

__all__ = ["TokenMapping", "normalize_piece", "topk_align"]

_MARKERS = {"Ġ": " ", "▁": " "}


def normalize_piece(piece: str) -> str:
    """Replace byte-level BPE's ``"Ġ"`` and SentencePiece's ``"▁"`` word-boundary markers by a space.

    Example:
        >>> normalize_piece("Ġworld"), normalize_piece("▁world"), normalize_piece("world")
        (' world', ' world', 'world')
    """
    for marker, replacement in _MARKERS.items():
        piece = piece.replace(marker, replacement)
    return piece


def _check_vocab(name: str, vocab: object) -> dict[str, int]:
    if not isinstance(vocab, Mapping):
        kind = type(vocab).__name__
        msg = f"`{name}` must be a mapping from piece to id, got {describe(vocab)} of type {kind}."
        raise LoopguardTypeError(msg)
    if not 1 <= len(vocab) <= MAX_VOCAB_SIZE:
        msg = f"`{name}` must have between 1 and {MAX_VOCAB_SIZE} entries, got {len(vocab)}."
        raise InputError(msg)
    checked: dict[str, int] = {}
    for piece, index in vocab.items():
        if not isinstance(piece, str):
            msg = f"`{name}` must have str pieces, got {describe(piece)}."
            raise LoopguardTypeError(msg)
        checked[piece] = check_int(f"{name}[{piece!r}]", index, lo=0, hi=MAX_VOCAB_SIZE - 1)
    return checked


def _first_by_normal_form(vocab: dict[str, int]) -> tuple[dict[str, int], int]:
    """Normal form -> lowest id having it, and how many ids lost a collision."""
    result: dict[str, int] = {}
    collisions = 0
    for piece, index in sorted(vocab.items(), key=lambda item: item[1]):
        key = normalize_piece(piece)
        if key in result:
            collisions += 1
        else:
            result[key] = index
    return result, collisions


@attrs.frozen(eq=False)
class TokenMapping:
    """A one-to-one partial map from teacher token ids to student token ids, with its coverage.

    Build it with :meth:`from_vocabs` or :meth:`from_tokenizers`. Pieces match exactly after
    :func:`normalize_piece`; when several pieces of one vocabulary share a normal form, the lowest id keeps it
    (counted in ``collisions``), so no two teacher ids map to the same student id.

    Attributes:
        teacher_to_student: ``int64`` array indexed by teacher id: the student id, or -1 when unmapped.
        teacher_vocab_size: Number of teacher pieces.
        student_vocab_size: Number of student pieces.
        matched: Number of mapped pieces.
        collisions: Pieces left unmapped because a lower id of the same vocabulary had the same normal form.

    Example:
        >>> mapping = TokenMapping.from_vocabs({"▁the": 0, "▁cat": 1, "s": 2}, {"Ġthe": 5, "Ġdog": 1, "s": 0})
        >>> mapping.matched, mapping.teacher_to_student.tolist()
        (2, [2, -1, -1, -1, -1, 0])
        >>> round(mapping.teacher_coverage, 3), round(mapping.student_coverage, 3)
        (0.667, 0.667)
    """

    teacher_to_student: NDArray[np.int64]
    teacher_vocab_size: int
    student_vocab_size: int
    matched: int
    collisions: int

    @property
    def teacher_coverage(self) -> float:
        """Fraction of the teacher's pieces that have a student counterpart."""
        return self.matched / self.teacher_vocab_size

    @property
    def student_coverage(self) -> float:
        """Fraction of the student's pieces that have a teacher counterpart."""
        return self.matched / self.student_vocab_size

    @classmethod
    def from_vocabs(cls, student_vocab: Mapping[str, int], teacher_vocab: Mapping[str, int]) -> TokenMapping:
        """Build the mapping from two ``piece -> id`` dictionaries (``tokenizer.get_vocab()``)."""
        student = _check_vocab("student_vocab", student_vocab)
        teacher = _check_vocab("teacher_vocab", teacher_vocab)
        student_forms, student_collisions = _first_by_normal_form(student)
        teacher_forms, teacher_collisions = _first_by_normal_form(teacher)
        table = np.full(max(teacher.values()) + 1, -1, dtype=np.int64)
        matched = 0
        for form, teacher_id in teacher_forms.items():
            student_id = student_forms.get(form)
            if student_id is not None:
                table[teacher_id] = student_id
                matched += 1
        return cls(table, len(teacher), len(student), matched, student_collisions + teacher_collisions)

    @classmethod
    def from_tokenizers(cls, student_tokenizer: Any, teacher_tokenizer: Any) -> TokenMapping:
        """Build the mapping from two Hugging Face tokenizers (anything with ``get_vocab()``)."""
        for name, tokenizer in (
            ("student_tokenizer", student_tokenizer),
            ("teacher_tokenizer", teacher_tokenizer),
        ):
            if not callable(getattr(tokenizer, "get_vocab", None)):
                msg = f"`{name}` must have a get_vocab() method, got {describe(tokenizer)}."
                raise LoopguardTypeError(msg)
        return cls.from_vocabs(student_tokenizer.get_vocab(), teacher_tokenizer.get_vocab())

    def token_coverage(self, teacher_token_ids: object) -> float:
        """Fraction of the given teacher tokens (for example a tokenised corpus) that have a mapping.

        Example:
            >>> mapping = TokenMapping.from_vocabs({"a": 0}, {"a": 0, "b": 1})
            >>> mapping.token_coverage([0, 0, 0, 1])
            0.75
        """
        ids = as_int_array("teacher_token_ids", teacher_token_ids, lo=0, max_len=None).reshape(-1)
        if ids.size > MAX_TRAJECTORIES * 1000:
            msg = f"`teacher_token_ids` must have at most {MAX_TRAJECTORIES * 1000:,} ids, got {ids.size:,}."
            raise InputError(msg)
        inside = ids < self.teacher_to_student.shape[0]
        mapped = np.zeros(ids.shape, dtype=bool)
        mapped[inside] = self.teacher_to_student[ids[inside]] >= 0
        return float(mapped.mean())


def topk_align(
    student_probs: torch.Tensor, teacher_probs: torch.Tensor, mapping: TokenMapping, *, k: int = 32
) -> torch.Tensor:
    r"""Distil the teacher's top-k probabilities onto mapped student ids; sorted ULD for the remainder.

    For each aligned row, let :math:`K` be the teacher's ``k`` most probable ids that :math:`\phi` (the
    mapping) sends to a student id. Those are compared token by token, and everything else (the teacher's
    other ids, the student's ids outside :math:`\phi(K)`) by sorted ULD:

    .. math::

        d = \sum_{i \in K} \big| p_s(\phi(i)) - p_t(i) \big|
            + \sum_{r} \big| \tilde p^{\downarrow}_s(r) - \tilde p^{\downarrow}_t(r) \big|

    where :math:`\tilde p_s` is :math:`p_s` with the entries :math:`\phi(K)` set to zero and
    :math:`\tilde p_t` is :math:`p_t` with the entries :math:`K` set to zero. With no mapped token in the
    top-k it equals :func:`loopguard.distill.uld_distance`; unlike it, it is zero only when the mapped tokens
    carry the same probabilities, so the student learns *which* token the teacher prefers, not just the shape.

    Args:
        student_probs: ``[N, V_s]`` aligned student probabilities (rows of a softmax, or merged rows).
        teacher_probs: ``[N, V_t]`` aligned teacher probabilities, same ``N``.
        mapping: A :class:`TokenMapping` from the teacher's vocabulary to the student's.
        k: How many of the teacher's most probable tokens to map, in [1, 262144] (default 32).

    Returns:
        ``[N]`` distances, each in [0, 2] for normalised rows.

    Raises:
        LoopguardTypeError: non-tensor inputs, a ``mapping`` that is not a :class:`TokenMapping`, a bool
            ``k``.
        ConfigError: ``k`` out of range.
        InputError: not 2-D, different row counts, or non-finite values.

    Example:
        >>> import torch
        >>> mapping = TokenMapping.from_vocabs({"▁b": 0, "▁a": 1}, {"Ġa": 0, "Ġb": 1, "Ġc": 2})
        >>> teacher = torch.tensor([[0.7, 0.2, 0.1]])
        >>> topk_align(torch.tensor([[0.2, 0.8]]), teacher, mapping, k=2)  # .1 + 0 + (0 vs .1)
        tensor([0.2000])
        >>> topk_align(torch.tensor([[0.8, 0.2]]), teacher, mapping, k=2)  # right shape, wrong tokens
        tensor([1.2000])

    References:
        Boizard, N., El Haddad, K., Hudelot, C., and Colombo, P. (2024). Towards Cross-Tokenizer Distillation:
        the Universal Logit Distillation Loss for LLMs. arXiv:2402.12030.
    """
    student_probs = check_logits("student_probs", student_probs, ndim=2)
    teacher_probs = check_logits("teacher_probs", teacher_probs, ndim=2)
    if not isinstance(mapping, TokenMapping):
        msg = f"`mapping` must be a TokenMapping, got {describe(mapping)} of type {type(mapping).__name__}."
        raise LoopguardTypeError(msg)
    count = check_int("k", k, lo=1, hi=MAX_VOCAB_SIZE)
    check_prob_rows(student_probs, teacher_probs)
    vocab_s = student_probs.shape[-1]
    top = teacher_probs.topk(min(count, teacher_probs.shape[-1]), dim=-1)
    table = torch.as_tensor(mapping.teacher_to_student, device=teacher_probs.device)
    inside = top.indices < table.shape[0]
    mapped = torch.where(inside, table[top.indices.clamp(max=table.shape[0] - 1)], -1)
    valid = (mapped >= 0) & (mapped < vocab_s)
    student_ids = mapped.clamp(min=0)
    direct = ((student_probs.gather(1, student_ids) - top.values).abs() * valid).sum(-1)
    hits_s = torch.zeros(student_probs.shape, dtype=torch.long, device=student_probs.device)
    hits_s.scatter_add_(1, student_ids, valid.long())
    hits_t = torch.zeros(teacher_probs.shape, dtype=torch.long, device=teacher_probs.device)
    hits_t.scatter_add_(1, top.indices, valid.long())
    remainder = _sorted_l1(
        student_probs.masked_fill(hits_s > 0, 0.0), teacher_probs.masked_fill(hits_t > 0, 0.0)
    )
    return direct + remainder
