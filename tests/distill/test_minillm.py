"""MiniLLM pieces against naive references, MiniLLMLoss end to end, and its cross-rules."""

import math

import pytest
import torch

from loopguard.distill import (
    MiniLLMLoss,
    importance_weights,
    k3_reverse_kl,
    mixed_sampling_probs,
    normalized_returns,
    pretrain_anchor_loss,
    reverse_kl,
)
from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError


def probs(row):
    top = max(row)
    values = [math.exp(x - top) for x in row]
    return [v / sum(values) for v in values]


def case(seed=0, b=3, t=5, v=7):
    g = torch.Generator().manual_seed(seed)
    student = torch.randn(b, t, v, generator=g, dtype=torch.float64)
    teacher = torch.randn(b, t, v, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, v, (b, t), generator=g)
    mask = torch.zeros(b, t, dtype=torch.bool)
    mask[0, :5] = True
    mask[1, :3] = True
    mask[2, 1:4] = True
    return student, teacher, tokens, mask


@pytest.mark.parametrize("alpha", [0.0, 0.2, 1.0])
def test_mixed_sampling_and_importance_weights(alpha):
    student, teacher, tokens, _ = case()
    mixed = mixed_sampling_probs(student, teacher, alpha)
    weights = importance_weights(student, teacher, tokens, alpha)
    for b in range(3):
        for t in range(5):
            q, p = probs(student[b, t].tolist()), probs(teacher[b, t].tolist())
            mix = [alpha * pi + (1 - alpha) * qi for pi, qi in zip(p, q, strict=True)]
            assert mixed[b, t].tolist() == pytest.approx(mix, abs=1e-12)
            y = int(tokens[b, t])
            assert float(weights[b, t]) == pytest.approx(q[y] / mix[y], rel=1e-9)
    assert mixed.sum(-1).allclose(torch.ones(3, 5, dtype=torch.float64))


def naive_returns(rewards, mask, gamma, whiten):
    out = [[0.0] * len(row) for row in rewards]
    for b, row in enumerate(rewards):
        positions = [t for t, m in enumerate(mask[b]) if m]
        length = len(positions)
        for k, t in enumerate(positions):
            total = sum(gamma ** (j - k) * row[positions[j]] for j in range(k, length))
            out[b][t] = total / (length - k)
    if whiten:
        values = [out[b][t] for b in range(len(rewards)) for t in range(len(rewards[b])) if mask[b][t]]
        mean = sum(values) / len(values)
        var = sum((v - mean) ** 2 for v in values) / len(values)
        out = [
            [(v - mean) / math.sqrt(var + 1e-8) if mask[b][t] else 0.0 for t, v in enumerate(row)]
            for b, row in enumerate(out)
        ]
    return out


@pytest.mark.parametrize(("gamma", "whiten"), [(0.95, True), (0.5, False), (1.0, False), (0.0, True)])
def test_normalized_returns_equal_naive(gamma, whiten):
    _, _, _, mask = case()
    rewards = torch.randn(3, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    rewards[~mask] = float("nan")  # outside the mask values are ignored
    got = normalized_returns(rewards, mask, gamma=gamma, whiten=whiten)
    expected = naive_returns(rewards.tolist(), mask.tolist(), gamma, whiten)
    assert got.reshape(-1).tolist() == pytest.approx([v for row in expected for v in row], abs=1e-9)


def test_reverse_kl_and_k3_equal_naive():
    student, teacher, tokens, mask = case(2)
    student.requires_grad_(True)
    value = reverse_kl(student, teacher, mask)
    total, count = 0.0, 0
    for b in range(3):
        for t in range(5):
            if mask[b, t]:
                q, p = probs(student[b, t].tolist()), probs(teacher[b, t].tolist())
                total += sum(qi * (math.log(qi) - math.log(pi)) for qi, pi in zip(q, p, strict=True))
                count += 1
    assert float(value.detach()) == pytest.approx(total / count, abs=1e-12)
    value.backward()
    assert student.grad.abs().sum() > 0
    log_q = torch.log_softmax(student.detach(), -1).gather(-1, tokens[..., None]).squeeze(-1)
    log_p = torch.log_softmax(teacher, -1).gather(-1, tokens[..., None]).squeeze(-1)
    monitor = k3_reverse_kl(log_q, log_p, mask)
    for b in range(3):
        deltas = [float(log_p[b, t] - log_q[b, t]) for t in range(5) if mask[b, t]]
        assert float(monitor[b]) == pytest.approx(
            sum(math.exp(d) - 1 - d for d in deltas) / len(deltas), abs=1e-12
        )
    assert torch.all(monitor >= 0)
    assert float(reverse_kl(student, student.detach(), mask).detach()) == pytest.approx(0.0, abs=1e-12)


def test_pretrain_anchor_loss_equals_naive():
    student, teacher, tokens, mask = case(3)
    labels = torch.where(mask, tokens, -100)
    ce = pretrain_anchor_loss(student, labels)
    expected = [
        -math.log(probs(student[b, t].tolist())[int(labels[b, t])])
        for b in range(3)
        for t in range(5)
        if mask[b, t]
    ]
    assert float(ce) == pytest.approx(sum(expected) / len(expected), abs=1e-12)
    mixed = pretrain_anchor_loss(student, labels, teacher_logits=teacher, kd_ratio=0.25)
    soft = [
        -sum(
            p * math.log(q)
            for p, q in zip(probs(teacher[b, t].tolist()), probs(student[b, t].tolist()), strict=True)
        )
        for b in range(3)
        for t in range(5)
        if mask[b, t]
    ]
    assert float(mixed) == pytest.approx(
        0.75 * sum(expected) / len(expected) + 0.25 * sum(soft) / len(soft), abs=1e-12
    )
    with pytest.raises(
        ConfigError,
        match=r"^`kd_ratio` must be 0 when no `teacher_logits` are given \(KD needs a teacher\), got 0.5.$",
    ):
        pretrain_anchor_loss(student, labels, kd_ratio=0.5)


def test_minillm_loss_matches_its_pieces_and_trains():
    student, teacher, tokens, mask = case(4)
    student.requires_grad_(True)
    loss_fn = MiniLLMLoss(alpha=0.2, anchor_weight=0.5)
    labels = torch.where(mask, tokens, -100)
    out = loss_fn(student, teacher, tokens, mask, anchor_logits=student, anchor_labels=labels)
    # manual recomposition (on-policy: ratio = 1, so the clipped objective is -A * w where w is inside the clip)
    log_q = torch.log_softmax(student.detach(), -1).gather(-1, tokens[..., None]).squeeze(-1)
    log_p = torch.log_softmax(teacher, -1).gather(-1, tokens[..., None]).squeeze(-1)
    advantages = normalized_returns(log_p - log_q, mask, gamma=0.95)
    w = importance_weights(student, teacher, tokens, 0.2)
    ratio = w
    per_token = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.2))
    rl = float((per_token * mask).sum() / mask.sum())
    assert float(out.rl_loss.detach()) == pytest.approx(rl, abs=1e-12)
    assert float(out.single_step_loss.detach()) == pytest.approx(
        float(reverse_kl(student, teacher, mask).detach()), abs=1e-12
    )
    assert float(out.anchor_loss.detach()) == pytest.approx(
        float(pretrain_anchor_loss(student, labels).detach()), abs=1e-12
    )
    assert float(out.loss.detach()) == pytest.approx(
        rl + float(out.single_step_loss.detach()) + 0.5 * float(out.anchor_loss.detach()), abs=1e-12
    )
    assert out.reverse_kl_k3 == pytest.approx(float(k3_reverse_kl(log_q, log_p, mask).mean()), abs=1e-12)
    assert out.mean_importance_weight == pytest.approx(float(w[mask].mean()), abs=1e-12)
    out.loss.backward()
    assert student.grad.abs().sum() > 0
    # plain gradient descent on the loss lowers the reverse KL to the teacher
    logits = torch.zeros(2, 4, 6, dtype=torch.float64, requires_grad=True)
    target = torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(9), dtype=torch.float64) * 2
    full = torch.ones(2, 4, dtype=torch.bool)
    start = float(reverse_kl(logits, target, full).detach())
    optimizer = torch.optim.SGD([logits], lr=0.5)
    loss_fn = MiniLLMLoss()
    for _ in range(60):
        with torch.no_grad():
            sample = torch.multinomial(mixed_sampling_probs(logits, target, 0.2).reshape(-1, 6), 1).reshape(
                2, 4
            )
        optimizer.zero_grad()
        loss_fn(logits, target, sample, full).loss.backward()
        optimizer.step()
    assert float(reverse_kl(logits, target, full).detach()) < 0.3 * start


def test_cross_rules_and_errors():
    student, teacher, tokens, mask = case()
    with pytest.raises(ConfigError) as info:
        MiniLLMLoss(alpha=0.0, offline=True)
    assert str(info.value) == (
        "`alpha` must be > 0 when `offline` is True (an offline run with mix ratio 0 samples nothing from the "
        "teacher, so it has no teacher signal), got 0.0."
    )
    MiniLLMLoss(alpha=0.0)  # online with alpha 0 still learns from the teacher's rewards
    with pytest.raises(ConfigError, match=r"^`alpha` must be in \[0, 1\], got 1.5.$"):
        MiniLLMLoss(alpha=1.5)
    with pytest.raises(LoopguardTypeError, match=r"^`alpha` must be a real number \(not bool\), got True.$"):
        MiniLLMLoss(alpha=True)
    with pytest.raises(ConfigError, match=r"^`gamma` must be finite, got nan.$"):
        MiniLLMLoss(gamma=float("nan"))
    with pytest.raises(ConfigError, match=r"^`anchor_weight` must be > 0, got 0.0.$"):
        MiniLLMLoss(anchor_weight=0.0)
    with pytest.raises(LoopguardTypeError, match=r"^`offline` must be a bool, got 1 of type int.$"):
        MiniLLMLoss(offline=1)
    with pytest.raises(
        ConfigError,
        match=r"^`anchor_weight` must be set when anchor data is passed \(it would be ignored\), got None",
    ):
        MiniLLMLoss()(student, teacher, tokens, mask, anchor_labels=tokens)
    with pytest.raises(ConfigError) as info:
        MiniLLMLoss(anchor_weight=1.0)(student, teacher, tokens, mask, anchor_logits=student)
    assert str(info.value) == (
        "`anchor_logits` and `anchor_labels` must both be passed when `anchor_weight` is set, got "
        "anchor_weight=1.0 with anchor_logits given and anchor_labels missing."
    )
    with pytest.raises(
        InputError,
        match=r"^`student_logits` and `teacher_logits` must have the same shape \(MiniLLM needs one shared vocabulary\), got \(3, 5, 7\) and \(3, 5, 8\).$",
    ):
        MiniLLMLoss()(student, torch.zeros(3, 5, 8), tokens, mask)
    with pytest.raises(
        LoopguardTypeError,
        match=r"^`mask` must be a bool tensor \(for example `labels != -100`\), got dtype torch.float32.$",
    ):
        MiniLLMLoss()(student, teacher, tokens, mask.float())
    with pytest.raises(
        LoopguardTypeError, match=r"^`tokens` must be an integer tensor, got dtype torch.bool.$"
    ):
        MiniLLMLoss()(student, teacher, mask, mask)
    bad = teacher.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(
        InputError,
        match=r"^`teacher_logits \(log-probability of the sampled tokens\)` must be finite at the masked tokens, got nan at \(1, 2\).$",
    ):
        MiniLLMLoss()(student, bad, tokens, mask)
    holes = mask.clone()
    holes[0, 2] = False
    with pytest.raises(
        InputError,
        match=r"^`mask` must mark one contiguous run of tokens per sequence, got several runs in sequence 0.$",
    ):
        normalized_returns(torch.zeros(3, 5), holes)
    with pytest.raises(ConfigError, match=r"^`alpha` must be in \[0, 1\], got -0.1.$"):
        importance_weights(student, teacher, tokens, -0.1)
    with pytest.raises(InputError, match=r"^`teacher_logprobs` must have shape \(3, 5\), got \(3, 4\).$"):
        k3_reverse_kl(torch.zeros(3, 5), torch.zeros(3, 4), mask)
