"""uld_loss / uld_distance: the paper's formula by naive loops, TRL parity, properties, top-k bound, errors."""

import math
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loopguard.distill import uld_distance, uld_loss
from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError


def naive_softmax(row, temperature):
    top = max(row)
    exps = [math.exp((x - top) / temperature) for x in row]
    total = sum(exps)
    return [e / total for e in exps]


def naive_distance(p, q):
    """Sort descending, zero-pad to the larger vocabulary, sum of absolute differences (Boizard et al. 2024)."""
    p, q = sorted(p, reverse=True), sorted(q, reverse=True)
    size = max(len(p), len(q))
    p, q = p + [0.0] * (size - len(p)), q + [0.0] * (size - len(q))
    return sum(abs(a - b) for a, b in zip(p, q, strict=True))


def naive_uld(student, teacher, mask_s, mask_t, ts=1.0, tt=1.0, skip_eos=True):
    """Per-sequence mean over positions aligned from each answer's start, then mean over sequences."""
    per_sequence = []
    for b in range(len(student)):
        pos_s = [t for t, m in enumerate(mask_s[b]) if m]
        pos_t = [t for t, m in enumerate(mask_t[b]) if m]
        if skip_eos:
            pos_s = pos_s[:-1]
        n = min(len(pos_s), len(pos_t))
        if n == 0:
            per_sequence.append(None)
            continue
        total = 0.0
        for k in range(n):
            p = naive_softmax(student[b][pos_s[k]], ts)
            q = naive_softmax(teacher[b][pos_t[k]], tt)
            total += naive_distance(p, q)
        per_sequence.append(total / n)
    kept = [v for v in per_sequence if v is not None]
    return per_sequence, (sum(kept) / len(kept) if kept else 0.0)


def random_case(seed, batch=3, ls=7, lt=9, vs=11, vt=17, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    student = torch.randn(batch, ls, vs, generator=g, dtype=torch.float64) * scale
    teacher = torch.randn(batch, lt, vt, generator=g, dtype=torch.float64) * scale
    mask_s = torch.zeros(batch, ls, dtype=torch.bool)
    mask_t = torch.zeros(batch, lt, dtype=torch.bool)
    for b in range(batch):  # one contiguous answer per sequence, different starts and lengths
        start_s, start_t = (
            int(torch.randint(0, 3, (1,), generator=g)),
            int(torch.randint(0, 4, (1,), generator=g)),
        )
        mask_s[b, start_s : start_s + int(torch.randint(2, ls - start_s + 1, (1,), generator=g))] = True
        mask_t[b, start_t : start_t + int(torch.randint(2, lt - start_t + 1, (1,), generator=g))] = True
    return student, teacher, mask_s, mask_t


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(("ts", "tt", "skip"), [(1.0, 1.0, True), (0.7, 2.0, False), (1.5, 0.5, True)])
def test_equals_naive_formula(seed, ts, tt, skip):
    student, teacher, mask_s, mask_t = random_case(seed)
    per_seq, mean = naive_uld(
        student.tolist(), teacher.tolist(), mask_s.tolist(), mask_t.tolist(), ts, tt, skip
    )
    kwargs = {"student_temperature": ts, "teacher_temperature": tt, "skip_student_eos": skip}
    got = uld_loss(student, teacher, mask_s, mask_t, **kwargs)
    assert float(got) == pytest.approx(mean, abs=1e-6)
    got_none = uld_loss(student, teacher, mask_s, mask_t, reduction="none", **kwargs)
    assert got_none.tolist() == pytest.approx([v or 0.0 for v in per_seq], abs=1e-6)
    got_sum = uld_loss(student, teacher, mask_s, mask_t, reduction="sum", **kwargs)
    assert float(got_sum) == pytest.approx(sum(v or 0.0 for v in per_seq), abs=1e-6)


def test_float32_equals_naive_formula_and_holes_in_masks():
    student, teacher, mask_s, mask_t = random_case(11)
    mask_s[:, 1] = False  # positions are matched by their rank among marked positions, holes included
    _, mean = naive_uld(student.tolist(), teacher.tolist(), mask_s.tolist(), mask_t.tolist())
    assert float(uld_loss(student.float(), teacher.float(), mask_s, mask_t)) == pytest.approx(mean, abs=1e-6)


def test_uld_distance_equals_naive():
    g = torch.Generator().manual_seed(3)
    p = torch.rand(6, 5, generator=g, dtype=torch.float64)
    q = torch.rand(6, 9, generator=g, dtype=torch.float64)
    expected = [naive_distance(a, b) for a, b in zip(p.tolist(), q.tolist(), strict=True)]
    assert uld_distance(p, q).tolist() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("top_k", [None, 1, 4, 40])
def test_gradients_match_finite_differences(top_k):
    student, teacher, mask_s, mask_t = random_case(7, batch=2, ls=4, lt=5, vs=6, vt=8, scale=1.0)
    student.requires_grad_(True)
    teacher.requires_grad_(True)

    def loss(s, t):
        return uld_loss(s, t, mask_s, mask_t, student_temperature=1.3, teacher_temperature=0.8, top_k=top_k)

    assert torch.autograd.gradcheck(loss, (student, teacher), eps=1e-6, atol=1e-6)


def test_gradient_matches_plain_autograd_and_bf16_runs():
    student, teacher, mask_s, mask_t = random_case(8, batch=2, ls=5, lt=6, vs=50, vt=70)
    s1 = student.clone().requires_grad_(True)
    uld_loss(s1, teacher, mask_s, mask_t).backward()
    s2 = student.clone().requires_grad_(True)
    per_seq = []
    for b in range(2):
        pos_s = mask_s[b].nonzero().squeeze(1)[:-1]
        pos_t = mask_t[b].nonzero().squeeze(1)
        n = min(len(pos_s), len(pos_t))
        rows = uld_distance(torch.softmax(s2[b, pos_s[:n]], -1), torch.softmax(teacher[b, pos_t[:n]], -1))
        per_seq.append(rows.mean())
    torch.stack(per_seq).mean().backward()
    assert torch.allclose(s1.grad, s2.grad, atol=1e-10)
    bf = student.to(torch.bfloat16).requires_grad_(True)
    value = uld_loss(bf, teacher.to(torch.bfloat16), mask_s, mask_t)
    value.backward()
    assert bf.grad.dtype == torch.bfloat16
    assert float(value.detach()) == pytest.approx(float(uld_loss(student, teacher, mask_s, mask_t)), abs=2e-2)


def _trl_uld(skip_student_eos, ts=1.0, tt=1.0):
    try:
        from trl.experimental.gold.gold_trainer import ULDLoss
    except ImportError as error:  # pragma: no cover - depends on the installed TRL
        pytest.skip(f"TRL's experimental GOLD ULDLoss cannot be imported: {error}")
    config = types.SimpleNamespace(
        uld_crossentropy_weight=0.0,
        uld_distillation_weight=1.0,
        uld_student_temperature=ts,
        uld_teacher_temperature=tt,
        uld_skip_student_eos=skip_student_eos,
        uld_skip_teacher_eos=False,
        use_extended_uld=False,
        uld_token_merge_strategy="observed",
        uld_use_hybrid_loss=False,
    )
    return ULDLoss(config)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("skip", "ts", "tt"), [(True, 1.0, 1.0), (False, 2.0, 0.5)])
def test_parity_with_trl_uld_loss_value_and_gradient(seed, skip, ts, tt):
    student, teacher, mask_s, mask_t = random_case(seed, batch=4, ls=8, lt=10, vs=32, vt=48)
    student, teacher = student.float(), teacher.float()
    trl_loss = _trl_uld(skip, ts, tt)
    labels_s = torch.where(mask_s, 1, -100)
    labels_t = torch.where(mask_t, 1, -100)
    s1 = student.clone().requires_grad_(True)
    reference = trl_loss(s1, teacher, labels_s, labels_t, labels_s.clamp_min(0), labels_t.clamp_min(0))
    reference.backward()
    s2 = student.clone().requires_grad_(True)
    ours = uld_loss(
        s2, teacher, mask_s, mask_t, student_temperature=ts, teacher_temperature=tt, skip_student_eos=skip
    )
    ours.backward()
    assert float(ours.detach()) == pytest.approx(float(reference.detach()), abs=1e-6)
    assert torch.allclose(s1.grad, s2.grad, atol=1e-7)


probability_rows = st.integers(1, 12).flatmap(
    lambda v: st.lists(st.lists(st.floats(-8, 8), min_size=v, max_size=v), min_size=1, max_size=4)
)


@settings(max_examples=40, deadline=None)
@given(student=probability_rows, teacher=probability_rows)
def test_property_non_negative_bounded_and_symmetric(student, teacher):
    n = min(len(student), len(teacher))
    s = torch.tensor(student[:n], dtype=torch.float64)[None]
    t = torch.tensor(teacher[:n], dtype=torch.float64)[None]
    ms = torch.ones(1, n, dtype=torch.bool)
    mt = torch.ones(1, n, dtype=torch.bool)
    forward = float(uld_loss(s, t, ms, mt, skip_student_eos=False))
    backward = float(uld_loss(t, s, mt, ms, skip_student_eos=False))
    assert -1e-12 <= forward <= 2.0 + 1e-9
    assert forward == pytest.approx(backward, abs=1e-12)  # symmetric with equal temperatures and no EOS skip


@settings(max_examples=40, deadline=None)
@given(rows=probability_rows, seed=st.integers(0, 2**16))
def test_property_zero_for_identical_and_invariant_to_vocabulary_permutation(rows, seed):
    logits = torch.tensor(rows, dtype=torch.float64)[None]
    mask = torch.ones(1, logits.shape[1], dtype=torch.bool)
    assert float(uld_loss(logits, logits, mask, mask, skip_student_eos=False)) == pytest.approx(
        0.0, abs=1e-12
    )
    perm = torch.randperm(logits.shape[-1], generator=torch.Generator().manual_seed(seed))
    assert float(uld_loss(logits, logits[..., perm], mask, mask, skip_student_eos=False)) == pytest.approx(
        0.0, abs=1e-12
    )
    other = torch.randn(logits.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    base = float(uld_loss(other, logits, mask, mask, skip_student_eos=False))
    assert float(uld_loss(other, logits[..., perm], mask, mask, skip_student_eos=False)) == pytest.approx(
        base, abs=1e-12
    )


@pytest.mark.parametrize("k", [1, 3, 10, 30])
def test_top_k_is_a_lower_bound_within_the_documented_error(k):
    student, teacher, mask_s, mask_t = random_case(5, vs=40, vt=60, scale=2.0)
    exact = uld_loss(student, teacher, mask_s, mask_t, reduction="none", skip_student_eos=False)
    approx = uld_loss(student, teacher, mask_s, mask_t, reduction="none", skip_student_eos=False, top_k=k)
    bound = torch.zeros(student.shape[0], dtype=torch.float64)
    for b in range(student.shape[0]):
        pos_s, pos_t = mask_s[b].nonzero().squeeze(1), mask_t[b].nonzero().squeeze(1)
        n = min(len(pos_s), len(pos_t))
        ps = torch.softmax(student[b, pos_s[:n]], -1).sort(-1, descending=True).values
        pt = torch.softmax(teacher[b, pos_t[:n]], -1).sort(-1, descending=True).values
        a, c = 1 - ps[:, :k].sum(-1), 1 - pt[:, :k].sum(-1)
        bound[b] = (2 * torch.minimum(a, c)).mean()
    assert torch.all(approx <= exact + 1e-12)
    assert torch.all(exact - approx <= bound + 1e-12)
    if k >= 60:
        assert torch.allclose(approx, exact)


def test_vocabulary_of_one_and_no_compared_positions():
    student = torch.zeros(2, 3, 1, requires_grad=True)
    teacher = torch.zeros(2, 3, 5)
    mask_s = torch.tensor(
        [[True, True, True], [True, False, False]]
    )  # second: only the EOS -> nothing compared
    mask_t = torch.ones(2, 3, dtype=torch.bool)
    assert uld_loss(student, teacher, mask_s, mask_t, reduction="none").detach().tolist() == pytest.approx(
        [1.6, 0.0]
    )
    assert float(uld_loss(student, teacher, mask_s, mask_t).detach()) == pytest.approx(
        1.6
    )  # mean over compared sequences
    empty = uld_loss(student, teacher, torch.zeros(2, 3, dtype=torch.bool), mask_t)
    assert float(empty.detach()) == 0.0
    empty.backward()
    assert student.grad is not None


def test_uses_chunks_for_large_vocabularies(monkeypatch):
    import loopguard.distill._uld as module

    monkeypatch.setattr(module, "_CHUNK_ELEMENTS", 64)  # several chunks even for this small case
    student, teacher, mask_s, mask_t = random_case(2, vs=30, vt=20)
    _, mean = naive_uld(student.tolist(), teacher.tolist(), mask_s.tolist(), mask_t.tolist())
    s = student.clone().requires_grad_(True)
    value = uld_loss(s, teacher, mask_s, mask_t)
    value.backward()
    assert float(value.detach()) == pytest.approx(mean, abs=1e-9)
    monkeypatch.setattr(module, "_CHUNK_ELEMENTS", 1 << 22)
    s2 = student.clone().requires_grad_(True)
    uld_loss(s2, teacher, mask_s, mask_t).backward()
    assert torch.allclose(s.grad, s2.grad)


def _case():
    return (
        torch.zeros(2, 3, 4),
        torch.zeros(2, 5, 6),
        torch.ones(2, 3, dtype=torch.bool),
        torch.ones(2, 5, dtype=torch.bool),
    )


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (
            {"student_temperature": True},
            LoopguardTypeError,
            "`student_temperature` must be a real number (not bool), got True.",
        ),
        ({"teacher_temperature": 0.0}, ConfigError, "`teacher_temperature` must be > 0, got 0.0."),
        (
            {"teacher_temperature": float("nan")},
            ConfigError,
            "`teacher_temperature` must be finite, got nan.",
        ),
        (
            {"skip_student_eos": 1},
            LoopguardTypeError,
            "`skip_student_eos` must be a bool, got 1 of type int.",
        ),
        ({"reduction": "max"}, ConfigError, "`reduction` must be one of 'mean', 'none', 'sum', got 'max'."),
        ({"top_k": 0}, ConfigError, "`top_k` must be in [1, 262144], got 0."),
        ({"top_k": True}, LoopguardTypeError, "`top_k` must be an integer (not bool), got True."),
    ],
)
def test_option_errors(change, error, message):
    with pytest.raises(error) as info:
        uld_loss(*_case(), **change)
    assert str(info.value) == message


def test_tensor_errors():
    s, t, ms, mt = _case()
    with pytest.raises(
        LoopguardTypeError, match=r"^`student_logits` must be a torch.Tensor, got \[1.0\] of type list.$"
    ):
        uld_loss([1.0], t, ms, mt)
    with pytest.raises(
        LoopguardTypeError,
        match=r"^`teacher_logits` must be a floating-point tensor, got dtype torch.int64.$",
    ):
        uld_loss(s, t.long(), ms, mt)
    with pytest.raises(InputError, match=r"^`student_logits` must be a 3-D tensor, got shape \(3, 4\).$"):
        uld_loss(s[0], t, ms, mt)
    with pytest.raises(
        InputError,
        match=r"^`student_logits` and `teacher_logits` must have the same batch size, got 2 and 1.$",
    ):
        uld_loss(s, t[:1], ms, mt[:1])
    with pytest.raises(
        LoopguardTypeError,
        match=r"^`student_mask` must be a bool tensor \(for example `labels != -100`\), got dtype torch.int64.$",
    ):
        uld_loss(s, t, ms.long(), mt)
    with pytest.raises(
        InputError,
        match=r"^`teacher_mask` must have shape \(2, 5\) \(the first dimensions of `teacher_logits`\), got \(2, 4\).$",
    ):
        uld_loss(s, t, ms, mt[:, :4])
    with pytest.raises(
        InputError,
        match=r"^`student_logits` must have a vocabulary \(last\) dimension in \[1, 262144\], got 0.$",
    ):
        uld_loss(torch.zeros(2, 3, 0), t, ms, mt)
    bad = t.clone()
    bad[1, 1, 3] = float("nan")
    with pytest.raises(
        InputError,
        match=r"^`teacher_logits` must be finite \(no NaN or \+inf\) at the compared positions, got a non-finite value at sequence 1, position 1.$",
    ):
        uld_loss(s, bad, ms, mt)
    masked_vocab = t.clone()
    masked_vocab[..., 0] = float("-inf")  # -inf masks a vocabulary entry: allowed
    assert float(uld_loss(s, masked_vocab, ms, mt)) > 0
    with pytest.raises(
        InputError,
        match=r"^`student_probs` and `teacher_probs` must have the same number of rows, got 1 and 2.$",
    ):
        uld_distance(torch.ones(1, 3), torch.ones(2, 3))
    with pytest.raises(InputError, match=r"^`teacher_probs` must be finite, got a NaN or infinite value.$"):
        uld_distance(torch.ones(1, 3), torch.tensor([[float("nan")]]))
