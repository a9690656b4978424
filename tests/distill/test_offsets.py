"""Offset alignment on real tokenizations with multi-token words, and merged probabilities vs a naive chain."""

import math

import pytest
import torch

from loopguard.distill import OffsetAlignment, align_offsets, merge_aligned_probs
from loopguard.exceptions import InputError, LoopguardTypeError

TEXTS = [
    "our neighbour remembered the yellow bicycle with great enthusiasm",
    "the children jumped over the old tree quietly",
    "extraordinary neighbours remembered nothing",  # words outside the corpus split into many pieces
]


def spans(text, offsets, groups):
    return [text[offsets[a][0] : offsets[b - 1][1]].strip() for a, b in groups]


@pytest.mark.parametrize("text", TEXTS)
def test_groups_spell_the_same_text_on_both_sides(student_tok, teacher_tok, text):
    s = student_tok(text, return_offsets_mapping=True)
    t = teacher_tok(text, return_offsets_mapping=True)
    alignment = align_offsets(s["offset_mapping"], t["offset_mapping"])
    assert spans(text, s["offset_mapping"], alignment.student_groups) == spans(
        text, t["offset_mapping"], alignment.teacher_groups
    )
    # groups tile both token sequences in order
    assert [a for a, _ in alignment.student_groups][1:] == [b for _, b in alignment.student_groups][:-1]
    assert [a for a, _ in alignment.teacher_groups][1:] == [b for _, b in alignment.teacher_groups][:-1]
    assert alignment.student_groups[-1][1] == len(s["input_ids"])
    assert alignment.teacher_groups[-1][1] == len(t["input_ids"])
    # the tokenizers really disagree somewhere: some group holds several tokens on one side
    multi = [
        (sg, tg)
        for sg, tg in zip(alignment.student_groups, alignment.teacher_groups, strict=True)
        if sg[1] - sg[0] != tg[1] - tg[0]
    ]
    assert multi
    assert alignment.one_to_one < len(alignment.student_groups)


def test_multi_token_word_example():
    # "neighbour" as "neigh"+"bour" (student) vs one token (teacher); spaces attached differently
    text = "our neighbour sat"
    student = [(0, 3), (4, 9), (9, 13), (14, 17)]
    teacher = [(0, 3), (3, 13), (13, 17)]
    alignment = align_offsets(student, teacher)
    assert alignment == OffsetAlignment(((0, 1), (1, 3), (3, 4)), ((0, 1), (1, 2), (2, 3)))
    assert spans(text, student, alignment.student_groups) == ["our", "neighbour", "sat"]
    assert alignment.one_to_one == 2


def test_special_tokens_and_byte_pieces():
    student = [
        (0, 0),
        (0, 2),
        (2, 3),
        (2, 3),
        (3, 5),
        (5, 5),
    ]  # BOS, "ab", two byte pieces of one char, "de", EOS
    teacher = [(0, 3), (3, 5)]
    alignment = align_offsets(student, teacher)
    assert alignment.student_groups == ((1, 4), (4, 5))
    assert alignment.teacher_groups == ((0, 1), (1, 2))


def test_ragged_end_forms_one_final_group():
    alignment = align_offsets([(0, 2), (2, 4)], [(0, 2), (2, 3)])
    assert alignment.student_groups == ((0, 1), (1, 2))
    assert alignment.teacher_groups == ((0, 1), (1, 2))


def naive_merge(logits, ids, start, end, temperature=1.0):
    def probs(row):
        values = [math.exp(x / temperature) for x in row]
        return [v / sum(values) for v in values]

    base = probs(logits[start - 1])
    factor = 1.0
    for i in range(start + 1, end):
        factor *= probs(logits[i - 1])[ids[i]]
    return [p * factor for p in base]


def test_merge_equals_naive_chain_rule(student_tok, teacher_tok):
    text = TEXTS[0]
    s = student_tok(text, return_offsets_mapping=True)
    t = teacher_tok(text, return_offsets_mapping=True)
    alignment = align_offsets(s["offset_mapping"], t["offset_mapping"])
    g = torch.Generator().manual_seed(0)
    ls, lt = len(s["input_ids"]), len(t["input_ids"])
    student_logits = torch.randn(ls, len(student_tok), generator=g, dtype=torch.float64, requires_grad=True)
    teacher_logits = torch.randn(lt, len(teacher_tok), generator=g, dtype=torch.float64)
    rows_s, rows_t = merge_aligned_probs(
        student_logits,
        teacher_logits,
        torch.tensor(s["input_ids"]),
        torch.tensor(t["input_ids"]),
        alignment,
        teacher_temperature=2.0,
    )
    kept = [
        (sg, tg)
        for sg, tg in zip(alignment.student_groups, alignment.teacher_groups, strict=True)
        if sg[0] and tg[0]
    ]
    assert rows_s.shape == (len(kept), len(student_tok))
    assert rows_t.shape == (len(kept), len(teacher_tok))
    for row, (sg, tg) in enumerate(kept):
        assert rows_s[row].tolist() == pytest.approx(
            naive_merge(student_logits.tolist(), s["input_ids"], *sg), abs=1e-12
        )
        assert rows_t[row].tolist() == pytest.approx(
            naive_merge(teacher_logits.tolist(), t["input_ids"], *tg, 2.0), abs=1e-12
        )
    rows_s.sum().backward()
    assert student_logits.grad is not None


def test_offset_and_merge_errors():
    with pytest.raises(
        InputError, match=r"^`student_offsets` must have start <= end, got \(3, 2\) at token 0.$"
    ):
        align_offsets([(3, 2)], [(0, 1)])
    with pytest.raises(
        InputError,
        match=r"^`teacher_offsets` must have shape \[T, 2\] \(start, end character offsets\), got \(1, 3\).$",
    ):
        align_offsets([(0, 1)], [(0, 1, 2)])
    with pytest.raises(
        LoopguardTypeError, match=r"^`student_offsets` must hold integers, got dtype float64.$"
    ):
        align_offsets([(0.0, 1.0)], [(0, 1)])
    alignment = align_offsets([(0, 1), (1, 2)], [(0, 1), (1, 2)])
    logits = torch.zeros(2, 3)
    with pytest.raises(
        InputError,
        match=r"^`teacher_ids` must hold ids in \[0, 3\) \(the vocabulary of `teacher_logits`\), got 7.$",
    ):
        merge_aligned_probs(logits, logits, torch.tensor([0, 1]), torch.tensor([0, 7]), alignment)
    with pytest.raises(
        LoopguardTypeError, match=r"^`alignment` must be an OffsetAlignment, got an object of type tuple.$"
    ):
        merge_aligned_probs(logits, logits, torch.tensor([0, 1]), torch.tensor([0, 1]), ((0, 1),))
    long = align_offsets([(0, 1), (1, 2), (2, 3)], [(0, 1), (1, 2), (2, 3)])
    with pytest.raises(
        InputError, match=r"^`alignment` must fit the student's 2 tokens, got a group ending at 3"
    ):
        merge_aligned_probs(logits, torch.zeros(3, 3), torch.tensor([0, 1]), torch.tensor([0, 1, 2]), long)
