"""Universal Logit Distillation: a tokenizer-agnostic distance between next-token distributions.

ULD (Boizard et al. 2024) compares a student and a teacher whose vocabularies differ by sorting each
probability vector in descending order, zero-padding the shorter one, and taking the L1 distance between the
two sorted vectors: the closed form of the 1-D Wasserstein distance between the two distributions when each
is placed on the ranks ``1, 2, ..., V``. The distance ignores *which* token carries a probability, so it
needs no shared vocabulary.

:func:`uld_loss` is the batched form over model outputs (answer positions picked by masks, aligned from each
answer's start). It runs as one custom autograd function over row chunks: no full ``[B, T, V]`` probability,
sorted or index copy is kept for the backward pass, only a one-byte sign per aligned logit.
:func:`uld_distance` is the row form over probability vectors that are already aligned (for example merged by
:func:`loopguard.distill.merge_aligned_probs`); it uses plain autograd.
Hand-written because TRL's ULD lives inside its experimental GOLD trainer, not as a loss any loop can call.
"""

from __future__ import annotations

from typing import Any

import torch

from loopguard._validation import check_bool, check_int, check_real
from loopguard.distill._common import (
    MAX_VOCAB_SIZE,
    Reduction,
    check_logits,
    check_mask,
    check_prob_rows,
    check_reduction,
    reduce_rows,
)
from loopguard.exceptions import InputError

__all__ = ["uld_distance", "uld_loss"]

_CHUNK_ELEMENTS = 1 << 22  # rows per chunk = 4M elements / vocabulary: ~16 MiB of float32 per working copy


def _sorted_values(probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest entries of every row, descending, with their indices (a full sort when k == V)."""
    if k >= probs.shape[-1]:
        values, indices = probs.sort(dim=-1, descending=True)
    else:
        values, indices = probs.topk(k, dim=-1, largest=True, sorted=True)
    return values, indices


def _chunk_distance(
    ps: torch.Tensor, pt: torch.Tensor, top_k: int | None, need_s: bool, need_t: bool
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Sorted L1 of probability rows, plus the loss's signs w.r.t. each input in original vocabulary order."""
    vocab_s, vocab_t = ps.shape[-1], pt.shape[-1]
    ks = vocab_s if top_k is None else min(top_k, vocab_s)
    kt = vocab_t if top_k is None else min(top_k, vocab_t)
    vs, idx_s = _sorted_values(ps, ks)
    vt, idx_t = _sorted_values(pt, kt)
    m = min(ks, kt)
    diff = vs[:, :m] - vt[:, :m]
    rows = diff.abs().sum(-1) + vs[:, m:].sum(-1) + vt[:, m:].sum(-1)
    truncated = ks < vocab_s or kt < vocab_t
    mass_sign = None
    if truncated:  # the mass left out of the top-k: |a - b| is a lower bound on the tail's contribution
        a = (1.0 - vs.sum(-1)).clamp_min(0.0)
        b = (1.0 - vt.sum(-1)).clamp_min(0.0)
        rows = rows + (a - b).abs()
        mass_sign = torch.sign(a - b)[:, None]
    sign_s = sign_t = None
    if need_s:
        sorted_sign = torch.cat([torch.sign(diff), torch.sign(vs[:, m:])], dim=-1)
        if mass_sign is not None:
            sorted_sign = sorted_sign - mass_sign
        sign_s = torch.zeros(ps.shape, dtype=torch.int8, device=ps.device)
        sign_s.scatter_(1, idx_s, sorted_sign.to(torch.int8))
    if need_t:
        sorted_sign = torch.cat([-torch.sign(diff), torch.sign(vt[:, m:])], dim=-1)
        if mass_sign is not None:
            sorted_sign = sorted_sign + mass_sign
        sign_t = torch.zeros(pt.shape, dtype=torch.int8, device=pt.device)
        sign_t.scatter_(1, idx_t, sorted_sign.to(torch.int8))
    return rows, sign_s, sign_t


def _softmax_rows(flat: torch.Tensor, rows: torch.Tensor, temperature: float) -> torch.Tensor:
    picked = flat[rows]  # advanced indexing: index_select takes a slow path for large rows on CPU
    return torch.softmax(picked.to(torch.promote_types(picked.dtype, torch.float32)) / temperature, dim=-1)


def _check_finite_rows(name: str, probs: torch.Tensor, rows: torch.Tensor, length: int) -> None:
    bad = ~torch.isfinite(probs.sum(-1))
    if bool(bad.any()):
        row = int(rows[int(bad.nonzero()[0, 0])])
        msg = (
            f"`{name}` must be finite (no NaN or +inf) at the compared positions, got a non-finite value "
            f"at sequence {row // length}, position {row % length}."
        )
        raise InputError(msg)


class _SortedL1(torch.autograd.Function):
    """Per-row sorted L1 between softmax(student rows / T_s) and softmax(teacher rows / T_t)."""

    @staticmethod
    def forward(
        ctx: Any,
        s_flat: torch.Tensor,
        t_flat: torch.Tensor,
        rows_s: torch.Tensor,
        rows_t: torch.Tensor,
        temperatures: tuple[float, float],
        top_k: int | None,
        lengths: tuple[int, int],
    ) -> torch.Tensor:
        need_s, need_t = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
        chunk = max(1, _CHUNK_ELEMENTS // max(s_flat.shape[-1], t_flat.shape[-1]))
        dtype = torch.promote_types(torch.promote_types(s_flat.dtype, t_flat.dtype), torch.float32)
        out = torch.zeros(rows_s.shape[0], dtype=dtype, device=s_flat.device)
        signs_s: list[torch.Tensor] = []
        signs_t: list[torch.Tensor] = []
        for start in range(0, rows_s.shape[0], chunk):
            rs, rt = rows_s[start : start + chunk], rows_t[start : start + chunk]
            ps = _softmax_rows(s_flat, rs, temperatures[0])
            pt = _softmax_rows(t_flat, rt, temperatures[1])
            _check_finite_rows("student_logits", ps, rs, lengths[0])
            _check_finite_rows("teacher_logits", pt, rt, lengths[1])
            values, sign_s, sign_t = _chunk_distance(ps, pt, top_k, need_s, need_t)
            out[start : start + chunk] = values
            if sign_s is not None:
                signs_s.append(sign_s)
            if sign_t is not None:
                signs_t.append(sign_t)
        ctx.save_for_backward(s_flat, t_flat, rows_s, rows_t)
        ctx.signs = (signs_s, signs_t)
        ctx.temperatures = temperatures
        ctx.chunk = chunk
        return out

    @staticmethod
    def backward(ctx: Any, grad_rows: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        s_flat, t_flat, rows_s, rows_t = ctx.saved_tensors
        signs_s, signs_t = ctx.signs
        grads: list[torch.Tensor | None] = [None, None]
        for side, (flat, rows, signs) in enumerate(((s_flat, rows_s, signs_s), (t_flat, rows_t, signs_t))):
            if not ctx.needs_input_grad[side]:
                continue
            grad = torch.zeros_like(flat)
            for number, start in enumerate(range(0, rows.shape[0], ctx.chunk)):
                chunk_rows = rows[start : start + ctx.chunk]
                probs = _softmax_rows(flat, chunk_rows, ctx.temperatures[side])
                upstream = signs[number].to(probs.dtype) * grad_rows[start : start + ctx.chunk, None].to(
                    probs.dtype
                )
                # softmax backward: dL/dx = p * (g - <g, p>) / T
                local = probs * (upstream - (upstream * probs).sum(-1, keepdim=True)) / ctx.temperatures[side]
                grad.index_add_(0, chunk_rows, local.to(grad.dtype))
            grads[side] = grad
        return grads[0], grads[1], None, None, None, None, None


def _aligned_rows(
    student_mask: torch.Tensor, teacher_mask: torch.Tensor, skip_student_eos: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flat row indices of the compared student/teacher positions and the number compared per sequence."""
    length_s = student_mask.sum(1) - int(skip_student_eos)
    count = torch.minimum(length_s, teacher_mask.sum(1)).clamp_min(0)
    keep_s = student_mask & (student_mask.long().cumsum(1) <= count[:, None])
    keep_t = teacher_mask & (teacher_mask.long().cumsum(1) <= count[:, None])
    rows_s = keep_s.reshape(-1).nonzero().squeeze(1)
    rows_t = keep_t.reshape(-1).nonzero().squeeze(1)
    return rows_s, rows_t, count


def uld_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    student_mask: torch.Tensor,
    teacher_mask: torch.Tensor,
    *,
    student_temperature: float = 1.0,
    teacher_temperature: float = 1.0,
    skip_student_eos: bool = True,
    reduction: Reduction = "mean",
    top_k: int | None = None,
) -> torch.Tensor:
    r"""Universal Logit Distillation loss between a student and a teacher with different vocabularies.

    At every compared position the student's and the teacher's next-token distributions (softmax of the logits
    divided by the temperature) are sorted in descending order, the shorter one is zero-padded to
    :math:`V = \max(V_s, V_t)`, and the distance is the sum of absolute differences:

    .. math::

        d = \sum_{i=1}^{V} \big| p^{\downarrow}_s(i) - p^{\downarrow}_t(i) \big|, \qquad
        \mathcal{L}_b = \frac{1}{n_b} \sum_{k=1}^{n_b} d(\text{student pos. } k,\ \text{teacher pos. } k)

    **Alignment.** ``student_mask`` and ``teacher_mask`` mark each sequence's answer positions (usually
    ``labels != -100``, or the logit rows that predict the answer tokens). The k-th marked student position is
    compared with the k-th marked teacher position, so positions are aligned from each answer's start, up to
    ``n_b = min(n_s - skip, n_t)`` where ``skip`` is 1 when ``skip_student_eos`` (the student's last answer
    position, its EOS, is left out, as in the paper). To skip the teacher's EOS too, unmark its last position.
    Positional alignment is only meaningful when both tokenizations split the answer alike; for different
    tokenizers of the same text use :func:`loopguard.distill.align_offsets` and
    :func:`loopguard.distill.merge_aligned_probs` first.

    **Reduction.** ``"none"`` returns the per-sequence means :math:`\mathcal{L}_b` (``[B]``, 0.0 where
    nothing is compared); ``"sum"`` their sum; ``"mean"`` their mean over the sequences that have at least one
    compared position (0.0, still attached to the graph, when none has). With every sequence compared this
    equals TRL's GOLD ``ULDLoss`` (non-extended mode, ``uld_skip_teacher_eos=False``, distillation weight 1).

    **Memory.** Rows are processed in chunks of about 4M elements; the backward pass recomputes the softmax
    and keeps one ``int8`` sign per compared logit instead of probability, sorted-value and sort-index copies.

    **Top-k truncation.** With ``top_k=k`` only the ``k`` largest probabilities of each side are compared and
    the mass left out, :math:`a = 1 - \sum_{i \le k} p^{\downarrow}_s(i)` and :math:`b` for the teacher, adds
    :math:`|a - b|`. The result is a lower bound of the exact distance, short of it by at most
    :math:`2 \min(a, b)` per position (the exact tail lies between :math:`|a - b|` and :math:`a + b`).

    Args:
        student_logits: ``[B, T_s, V_s]`` floating logits, ``1 <= V_s <= 262144``.
        teacher_logits: ``[B, T_t, V_t]`` floating logits, same ``B``, ``1 <= V_t <= 262144``. Gradients flow
            into the teacher too if it requires them.
        student_mask: ``[B, T_s]`` bool, the student's answer positions.
        teacher_mask: ``[B, T_t]`` bool, the teacher's answer positions.
        student_temperature: Softmax temperature of the student, finite and > 0 (default 1.0).
        teacher_temperature: Softmax temperature of the teacher, finite and > 0 (default 1.0).
        skip_student_eos: Leave out each sequence's last student answer position (default ``True``).
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.
        top_k: Compare only the top-k probabilities (see above), an integer in [1, 262144], or ``None``
            (default: exact).

    Returns:
        A scalar (``"mean"``, ``"sum"``) or ``[B]`` tensor (``"none"``), float32 (float64 for float64
        logits), in [0, 2] per sequence.

    Raises:
        LoopguardTypeError: non-tensor or non-floating logits, non-bool masks or flags, bool temperatures.
        ConfigError: temperatures not finite or <= 0, ``reduction`` not allowed, ``top_k`` out of range.
        InputError: wrong dimensionality, a vocabulary outside [1, 262144], different batch sizes, a mask
            whose shape is not the logits' ``[B, T]``, or NaN / +inf logits at a compared position.

    Example:
        >>> import torch
        >>> student = torch.tensor([[[0.75, 0.25], [0.5, 0.5]]]).log()  # V_s = 2, two answer positions
        >>> teacher = torch.tensor([[[0.25, 0.5, 0.25], [0.2, 0.3, 0.5]]]).log()  # V_t = 3
        >>> mask = torch.tensor([[True, True]])
        >>> uld_loss(student, teacher, mask, mask)  # |.75-.5| + |.25-.25| + |0-.25|; the EOS row is skipped
        tensor(0.5000)
        >>> uld_loss(student, student.flip(-1), mask, mask)  # a permuted vocabulary costs nothing
        tensor(0.)

    References:
        Boizard, N., El Haddad, K., Hudelot, C., and Colombo, P. (2024). Towards Cross-Tokenizer Distillation:
        the Universal Logit Distillation Loss for LLMs. arXiv:2402.12030.
    """
    student_logits = check_logits("student_logits", student_logits)
    teacher_logits = check_logits("teacher_logits", teacher_logits)
    if student_logits.shape[0] != teacher_logits.shape[0]:
        msg = (
            "`student_logits` and `teacher_logits` must have the same batch size, "
            f"got {student_logits.shape[0]} and {teacher_logits.shape[0]}."
        )
        raise InputError(msg)
    student_mask = check_mask("student_mask", student_mask, tuple(student_logits.shape[:2]), "student_logits")
    teacher_mask = check_mask("teacher_mask", teacher_mask, tuple(teacher_logits.shape[:2]), "teacher_logits")
    temp_s = check_real("student_temperature", student_temperature, lo=0.0, lo_inclusive=False)
    temp_t = check_real("teacher_temperature", teacher_temperature, lo=0.0, lo_inclusive=False)
    skip = check_bool("skip_student_eos", skip_student_eos)
    mode = check_reduction(reduction)
    k = None if top_k is None else check_int("top_k", top_k, lo=1, hi=MAX_VOCAB_SIZE)

    batch, length_s, vocab_s = student_logits.shape
    length_t, vocab_t = teacher_logits.shape[1], teacher_logits.shape[2]
    device = student_logits.device
    rows_s, rows_t, count = _aligned_rows(student_mask.to(device), teacher_mask.to(device), skip)
    rows_t = rows_t.to(teacher_logits.device)
    per_row: torch.Tensor = _SortedL1.apply(  # type: ignore[no-untyped-call]
        student_logits.reshape(-1, vocab_s),
        teacher_logits.reshape(-1, vocab_t),
        rows_s,
        rows_t,
        (temp_s, temp_t),
        k,
        (length_s, length_t),
    )
    sequence = rows_s // length_s
    totals = torch.zeros(batch, dtype=per_row.dtype, device=per_row.device).index_add(0, sequence, per_row)
    count = count.to(per_row.device)
    per_sequence = totals / count.clamp_min(1)
    return reduce_rows(per_sequence, count > 0, mode)


def uld_distance(student_probs: torch.Tensor, teacher_probs: torch.Tensor) -> torch.Tensor:
    r"""Sorted L1 (ULD) distance between aligned rows of probabilities, one value per row.

    .. math::

        d_n = \sum_{i=1}^{\max(V_s, V_t)} \big| p^{\downarrow}_{s,n}(i) - p^{\downarrow}_{t,n}(i) \big|

    with each row sorted descending and the shorter one zero-padded. Rows need not sum to 1 (merged
    multi-token probabilities do not). Plain autograd; memory is a few copies of the ``[N, V]`` inputs.

    Args:
        student_probs: ``[N, V_s]`` non-negative floating tensor.
        teacher_probs: ``[N, V_t]`` non-negative floating tensor with the same ``N``.

    Returns:
        ``[N]`` distances.

    Raises:
        LoopguardTypeError: non-tensor or non-floating inputs.
        InputError: not 2-D, different row counts, a vocabulary outside [1, 262144], or non-finite values.

    Example:
        >>> import torch
        >>> uld_distance(torch.tensor([[0.75, 0.25]]), torch.tensor([[0.25, 0.5, 0.25]]))
        tensor([0.5000])

    References:
        Boizard, N., El Haddad, K., Hudelot, C., and Colombo, P. (2024). Towards Cross-Tokenizer Distillation:
        the Universal Logit Distillation Loss for LLMs. arXiv:2402.12030.
    """
    student_probs = check_logits("student_probs", student_probs, ndim=2)
    teacher_probs = check_logits("teacher_probs", teacher_probs, ndim=2)
    check_prob_rows(student_probs, teacher_probs)
    return _sorted_l1(student_probs, teacher_probs)


def _sorted_l1(student_probs: torch.Tensor, teacher_probs: torch.Tensor) -> torch.Tensor:
    """Unchecked sorted L1 per row (plain autograd), without materialising zero padding."""
    vs = student_probs.sort(dim=-1, descending=True).values
    vt = teacher_probs.sort(dim=-1, descending=True).values
    m = min(vs.shape[-1], vt.shape[-1])
    return (vs[:, :m] - vt[:, :m]).abs().sum(-1) + vs[:, m:].sum(-1) + vt[:, m:].sum(-1)
