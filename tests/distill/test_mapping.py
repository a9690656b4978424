"""TokenMapping on real in-process tokenizers, and topk_align against a naive reference."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loopguard.distill import TokenMapping, normalize_piece, topk_align, uld_distance
from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError


def test_normalize_piece():
    assert normalize_piece("Ġthe") == normalize_piece("▁the") == " the"
    assert normalize_piece("▁▁") == "  "
    assert normalize_piece("the") == "the"


def test_coverage_between_byte_level_bpe_and_unigram(student_tok, teacher_tok, corpus):
    mapping = TokenMapping.from_tokenizers(student_tok, teacher_tok)
    student_vocab, teacher_vocab = student_tok.get_vocab(), teacher_tok.get_vocab()
    # independent count: pieces equal after swapping the markers for a space
    student_forms = {p.replace("▁", " ") for p in student_vocab}
    expected = sum(1 for p in teacher_vocab if p.replace("Ġ", " ") in student_forms)
    assert mapping.matched == expected
    assert mapping.teacher_vocab_size == len(teacher_vocab) == 360
    assert mapping.student_vocab_size == len(student_vocab)
    assert mapping.teacher_coverage == pytest.approx(expected / 360)
    assert mapping.student_coverage == pytest.approx(expected / len(student_vocab))
    assert mapping.collisions == 0
    # the ids really name the same text
    inverse = {i: p for p, i in student_vocab.items()}
    for piece, teacher_id in teacher_vocab.items():
        student_id = int(mapping.teacher_to_student[teacher_id])
        if student_id >= 0:
            assert inverse[student_id].replace("▁", " ") == piece.replace("Ġ", " ")
    shared = {p.replace("Ġ", " ") for p, i in teacher_vocab.items() if mapping.teacher_to_student[i] >= 0}
    assert any(
        piece.startswith(" ") and len(piece) > 2 for piece in shared
    )  # "Ġ" and "▁" pieces were matched
    # token-level coverage of the corpus as the teacher tokenizes it
    ids = [i for text in corpus for i in teacher_tok(text)["input_ids"]]
    coverage = mapping.token_coverage(ids)
    manual = sum(1 for i in ids if mapping.teacher_to_student[i] >= 0) / len(ids)
    assert coverage == pytest.approx(manual)
    assert 0.2 < coverage < 1.0  # a real, partial overlap


def test_coverage_wordlevel_without_markers(wordlevel_tok, teacher_tok):
    mapping = TokenMapping.from_tokenizers(wordlevel_tok, teacher_tok)
    # WordLevel pieces carry no space marker, so only space-less teacher pieces (single bytes, sentence-initial
    # words) can match
    teacher_vocab = teacher_tok.get_vocab()
    for piece, teacher_id in teacher_vocab.items():
        if mapping.teacher_to_student[teacher_id] >= 0:
            assert "Ġ" not in piece
    assert mapping.matched > 0
    assert (
        mapping.teacher_coverage
        < TokenMapping.from_tokenizers(wordlevel_tok, wordlevel_tok).teacher_coverage
        == 1.0
    )


def test_collisions_keep_the_lowest_id_and_stay_one_to_one():
    mapping = TokenMapping.from_vocabs({"▁a": 3, "Ġa": 1, "b": 0}, {"Ġa": 2, "▁a": 0, "b": 1})
    assert mapping.collisions == 2
    assert mapping.teacher_to_student.tolist() == [1, 0, -1]
    assert mapping.matched == 2


def test_vocab_errors():
    with pytest.raises(
        LoopguardTypeError,
        match=r"^`student_vocab` must be a mapping from piece to id, got \['a'\] of type list.$",
    ):
        TokenMapping.from_vocabs(["a"], {"a": 0})
    with pytest.raises(InputError, match=r"^`teacher_vocab` must have between 1 and 262144 entries, got 0.$"):
        TokenMapping.from_vocabs({"a": 0}, {})
    with pytest.raises(ConfigError, match=r"^`teacher_vocab\['a'\]` must be in \[0, 262143\], got -1.$"):
        TokenMapping.from_vocabs({"a": 0}, {"a": -1})
    with pytest.raises(
        LoopguardTypeError, match=r"^`student_tokenizer` must have a get_vocab\(\) method, got 3.$"
    ):
        TokenMapping.from_tokenizers(3, 4)


def naive_topk_align(p_s, p_t, table, k):
    """Loops: mapped top-k token by token, the remainder by sorted L1 with zero padding."""
    top = sorted(range(len(p_t)), key=lambda i: -p_t[i])[:k]
    pairs = [(i, table[i]) for i in top if i < len(table) and 0 <= table[i] < len(p_s)]
    direct = sum(abs(p_s[j] - p_t[i]) for i, j in pairs)
    used_t, used_s = {i for i, _ in pairs}, {j for _, j in pairs}
    rest_s = sorted((p for j, p in enumerate(p_s) if j not in used_s), reverse=True)
    rest_t = sorted((p for i, p in enumerate(p_t) if i not in used_t), reverse=True)
    size = max(len(rest_s), len(rest_t))
    rest_s += [0.0] * (size - len(rest_s))
    rest_t += [0.0] * (size - len(rest_t))
    return direct + sum(abs(a - b) for a, b in zip(rest_s, rest_t, strict=True))


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), k=st.integers(1, 12), vs=st.integers(1, 9), vt=st.integers(1, 12))
def test_topk_align_equals_naive(seed, k, vs, vt):
    g = torch.Generator().manual_seed(seed)
    p_s = torch.softmax(torch.randn(4, vs, generator=g, dtype=torch.float64), -1)
    p_t = torch.softmax(torch.randn(4, vt, generator=g, dtype=torch.float64), -1)
    student_ids = torch.randperm(max(vs, vt) + 2, generator=g).tolist()
    vocab_s = {f"s{i}": i for i in range(vs)}
    vocab_t = {f"t{i}": i for i in range(vt)}
    for i in range(vt):  # map some teacher ids to student ids, one to one (some beyond V_s are unusable)
        if student_ids[i] < vs and (i + seed) % 3:
            vocab_t[f"s{student_ids[i]}"] = vocab_t.pop(f"t{i}")
    mapping = TokenMapping.from_vocabs(vocab_s, vocab_t)
    table = mapping.teacher_to_student.tolist()
    got = topk_align(p_s, p_t, mapping, k=k)
    expected = [naive_topk_align(a, b, table, k) for a, b in zip(p_s.tolist(), p_t.tolist(), strict=True)]
    assert got.tolist() == pytest.approx(expected, abs=1e-12)


def test_topk_align_reduces_to_uld_without_mapping_and_is_zero_for_identity():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(3, 6, generator=g), -1)
    q = torch.softmax(torch.randn(3, 8, generator=g), -1)
    nothing = TokenMapping.from_vocabs({"x": 0}, {"y": 0})
    assert torch.allclose(topk_align(p, q, nothing, k=4), uld_distance(p, q))
    identity = TokenMapping.from_vocabs({str(i): i for i in range(6)}, {str(i): i for i in range(6)})
    assert torch.allclose(topk_align(p, p, identity, k=6), torch.zeros(3), atol=1e-7)
    # a permutation costs nothing under ULD but is penalised once the mapping knows the tokens
    assert float(uld_distance(p, p.flip(-1)).max()) < 1e-6
    assert float(topk_align(p, p.flip(-1), identity, k=6).min()) > 0.01


def test_topk_align_gradient_and_errors():
    mapping = TokenMapping.from_vocabs({"a": 0, "b": 1}, {"b": 0, "a": 1, "c": 2})
    logits = torch.zeros(1, 2, requires_grad=True)
    teacher = torch.tensor([[0.6, 0.3, 0.1]])
    topk_align(torch.softmax(logits, -1), teacher, mapping, k=2).sum().backward()
    assert (
        logits.grad[0, 1] < 0 < logits.grad[0, 0] or logits.grad[0, 1] < 0
    )  # push mass to "b" (student id 1)
    with pytest.raises(
        LoopguardTypeError, match=r"^`mapping` must be a TokenMapping, got \{\} of type dict.$"
    ):
        topk_align(teacher, teacher, {}, k=2)
    with pytest.raises(ConfigError, match=r"^`k` must be in \[1, 262144\], got 0.$"):
        topk_align(teacher, teacher, mapping, k=0)
    with pytest.raises(InputError, match=r"^`student_probs` must be a 2-D tensor, got shape \(3,\).$"):
        topk_align(teacher[0], teacher, mapping)
