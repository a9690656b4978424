r"""MiniLLM: on-policy distillation that minimises the reverse KL from the student to the teacher.

MiniLLM (Gu et al. 2024) trains the student :math:`q_\theta` to minimise :math:`\mathrm{KL}(q_\theta \| p)`
against the teacher :math:`p` with a policy gradient. The pieces here follow the paper and its released code
(microsoft/LMOps ``minillm``):

* :func:`mixed_sampling_probs` -- sample from :math:`\tilde p = \alpha p + (1 - \alpha) q` (teacher-mixed
  sampling, ``alpha = 0.2``), and :func:`importance_weights` :math:`w_t = q(y_t) / \tilde p(y_t)`;
* :func:`normalized_returns` -- per-token rewards :math:`r_t = \log p(y_t) - \log q(y_t)`, discounted
  (``gamma = 0.95``) and divided by the number of tokens left, then whitened;
* :func:`reverse_kl` -- the single-step term, the exact per-token :math:`\mathrm{KL}(q \| p)` over the
  vocabulary;
* :func:`k3_reverse_kl` -- a cheap sampled monitor of the sequence-level reverse KL;
* :func:`pretrain_anchor_loss` -- the language-modelling anchor on pre-training data;
* :class:`MiniLLMLoss` -- the combination, PPO-clipped on ``ratio * w`` (``clip = 0.2``), with its
  cross-rules.

Teacher and student must share one vocabulary here (MiniLLM's setting); for different tokenizers distil with
:func:`loopguard.distill.uld_loss` or :func:`loopguard.distill.topk_align`.
Hand-written because no maintained library ships MiniLLM's pieces as functions (LMOps is research code).
"""

from __future__ import annotations

import math

import attrs
import torch

from loopguard._validation import boolean, check_bool, check_real, real
from loopguard.distill._common import check_floating, check_logits, check_mask, check_token_ids
from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError

__all__ = [
    "MiniLLMLoss",
    "MiniLLMOutput",
    "importance_weights",
    "k3_reverse_kl",
    "mixed_sampling_probs",
    "normalized_returns",
    "pretrain_anchor_loss",
    "reverse_kl",
]

_WHITEN_EPS = 1e-8


def _check_alpha(alpha: object) -> float:
    return check_real("alpha", alpha, lo=0.0, hi=1.0)


def _check_pair(student_logits: object, teacher_logits: object) -> tuple[torch.Tensor, torch.Tensor]:
    student = check_logits("student_logits", student_logits)
    teacher = check_logits("teacher_logits", teacher_logits)
    what = (
        "`student_logits` and `teacher_logits` must have the same shape (MiniLLM needs one shared vocabulary)"
    )
    _require_same_shape(what, student, teacher)
    return student, teacher


def _require_same_shape(what: str, first: torch.Tensor, second: torch.Tensor) -> None:
    """Raise "{what}, got {first's shape} and {second's shape}." unless the shapes are equal."""
    if first.shape != second.shape:
        raise InputError(f"{what}, got {tuple(first.shape)} and {tuple(second.shape)}.")


def _check_values(name: str, value: object, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        msg = f"`{name}` must be a torch.Tensor, got an object of type {type(value).__name__}."
        raise LoopguardTypeError(msg)
    check_floating(name, value)
    if value.dim() != 2 or (shape is not None and tuple(value.shape) != shape):
        expected = f"shape {shape}" if shape is not None else "a 2-D [B, T] shape"
        msg = f"`{name}` must have {expected}, got {tuple(value.shape)}."
        raise InputError(msg)
    return value


def _check_finite_at(name: str, values: torch.Tensor, mask: torch.Tensor) -> None:
    bad = mask & ~torch.isfinite(values)
    if bool(bad.any()):
        b, t = (int(i) for i in bad.nonzero()[0])
        msg = f"`{name}` must be finite at the masked tokens, got {float(values[b, t])} at ({b}, {t})."
        raise InputError(msg)


def _token_log_probs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    log_probs = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
    return log_probs.gather(-1, tokens[..., None]).squeeze(-1)


def mixed_sampling_probs(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, alpha: float
) -> torch.Tensor:
    r"""The teacher-mixed sampling distribution :math:`\tilde p = \alpha\, p + (1 - \alpha)\, q` (detached).

    Sample the next token from these probabilities (``torch.multinomial``) instead of from the student alone:
    a share ``alpha`` of the teacher keeps low-quality student samples from dominating early training.

    Args:
        student_logits: ``[B, T, V]`` student logits (:math:`q`).
        teacher_logits: ``[B, T, V]`` teacher logits (:math:`p`), same shape.
        alpha: Teacher share, in [0, 1] (0.2 in the authors' scripts).

    Returns:
        ``[B, T, V]`` probabilities, float32 or wider, without gradient.

    Example:
        >>> import torch
        >>> student = torch.tensor([[[0.0, 0.0]]])
        >>> teacher = torch.tensor([[[0.0, -math.inf]]])
        >>> mixed_sampling_probs(student, teacher, 0.2)
        tensor([[[0.6000, 0.4000]]])

    References:
        Gu, Y., Dong, L., Wei, F., and Huang, M. (2024). MiniLLM: Knowledge Distillation of Large Language
        Models. ICLR 2024. arXiv:2306.08543.
    """
    student, teacher = _check_pair(student_logits, teacher_logits)
    share = _check_alpha(alpha)
    with torch.no_grad():
        dtype = torch.promote_types(student.dtype, torch.float32)
        return share * torch.softmax(teacher.to(dtype), -1) + (1.0 - share) * torch.softmax(
            student.to(dtype), -1
        )


def importance_weights(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, tokens: torch.Tensor, alpha: float
) -> torch.Tensor:
    r"""Importance weights :math:`w_t = q(y_t) / (\alpha\, p(y_t) + (1 - \alpha)\, q(y_t))` (detached).

    They correct for sampling from the teacher-mixed distribution (single-token approximation, as in the
    paper). Computed in log space; ``alpha = 0`` gives exactly 1.

    Args:
        student_logits: ``[B, T, V]`` student logits at the sampling steps.
        teacher_logits: ``[B, T, V]`` teacher logits, same shape.
        tokens: ``[B, T]`` sampled token ids (the token drawn at each step).
        alpha: Teacher share used for sampling, in [0, 1].

    Returns:
        ``[B, T]`` weights in :math:`[0, 1/(1-\alpha)]`, without gradient.

    Example:
        >>> import torch
        >>> student = torch.tensor([[[0.0, 0.0]]]).log_softmax(-1)  # q = (.5, .5)
        >>> teacher = torch.tensor([[[0.9, 0.1]]]).log()  # p = (.9, .1)
        >>> importance_weights(student, teacher, torch.tensor([[1]]), 0.2)  # .5 / (.2 * .1 + .8 * .5)
        tensor([[1.1905]])

    References:
        Gu, Y., Dong, L., Wei, F., and Huang, M. (2024). MiniLLM: Knowledge Distillation of Large Language
        Models. ICLR 2024. arXiv:2306.08543.
    """
    student, teacher = _check_pair(student_logits, teacher_logits)
    ids = check_token_ids("tokens", tokens, tuple(student.shape[:2]), "student_logits", student.shape[2])
    share = _check_alpha(alpha)
    with torch.no_grad():
        log_q = _token_log_probs(student, ids)
        if share == 0.0:
            return torch.ones_like(log_q)
        log_p = _token_log_probs(teacher, ids)
        if share == 1.0:
            return torch.exp(log_q - log_p)
        log_mix = torch.logaddexp(math.log(share) + log_p, math.log1p(-share) + log_q)
        return torch.exp(log_q - log_mix)


def _check_contiguous(mask: torch.Tensor) -> None:
    starts = mask[:, :1].long() + (mask[:, 1:] & ~mask[:, :-1]).long().sum(1, keepdim=True)
    if bool((starts > 1).any()):
        row = int((starts > 1).nonzero()[0, 0])
        msg = (
            f"`mask` must mark one contiguous run of tokens per sequence, got several runs in sequence {row}."
        )
        raise InputError(msg)


def normalized_returns(
    rewards: torch.Tensor, mask: torch.Tensor, *, gamma: float = 0.95, whiten: bool = True
) -> torch.Tensor:
    r"""Discounted per-token returns over the number of tokens left, then whitened (MiniLLM's advantage).

    For a sequence of :math:`L` generated tokens and per-token rewards :math:`r_t` (usually
    :math:`\log p(y_t) - \log q(y_t)`), with :math:`t = 0, \dots, L-1`:

    .. math::

        A_t = \frac{1}{L - t} \sum_{t'=t}^{L-1} \gamma^{\,t'-t}\, r_{t'}

    Then, when ``whiten``, :math:`A \leftarrow (A - \bar A) / \sqrt{\operatorname{var}(A) + 10^{-8}}` over all
    masked tokens of the batch. Positions outside the mask are 0.

    Args:
        rewards: ``[B, T]`` floating per-token rewards (finite at masked positions; treated as constants).
        mask: ``[B, T]`` bool, each sequence's generated tokens as one contiguous run.
        gamma: Discount in [0, 1] (0.95 in the authors' code).
        whiten: Standardise over the batch's masked tokens (default ``True``).

    Returns:
        ``[B, T]`` advantages, without gradient.

    Example:
        >>> import torch
        >>> rewards = torch.tensor([[1.0, 1.0, 0.0]])
        >>> mask = torch.tensor([[True, True, False]])
        >>> normalized_returns(rewards, mask, gamma=0.5, whiten=False)  # (1 + .5) / 2, 1 / 1
        tensor([[0.7500, 1.0000, 0.0000]])

    References:
        Gu, Y., Dong, L., Wei, F., and Huang, M. (2024). MiniLLM: Knowledge Distillation of Large Language
        Models. ICLR 2024. arXiv:2306.08543.
    """
    values = _check_values("rewards", rewards)
    mask = check_mask("mask", mask, tuple(values.shape), "rewards")
    discount = check_real("gamma", gamma, lo=0.0, hi=1.0)
    whiten = check_bool("whiten", whiten)
    _check_finite_at("rewards", values, mask)
    _check_contiguous(mask)
    with torch.no_grad():
        r = torch.where(mask, values.to(torch.promote_types(values.dtype, torch.float32)), 0.0)
        returns = torch.zeros_like(r)
        running = torch.zeros_like(r[:, 0])
        for t in range(r.shape[1] - 1, -1, -1):
            running = r[:, t] + discount * running * mask[:, t]
            returns[:, t] = running
        remaining = mask.flip(1).long().cumsum(1).flip(1)  # tokens left, this one included
        advantages = torch.where(mask, returns / remaining.clamp_min(1), 0.0)
        if whiten and bool(mask.any()):
            selected = advantages[mask]
            mean = selected.mean()
            var = ((selected - mean) ** 2).mean()
            advantages = torch.where(mask, (advantages - mean) * torch.rsqrt(var + _WHITEN_EPS), 0.0)
        return advantages


def reverse_kl(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    r"""Single-step reverse KL over the full vocabulary, averaged over the masked positions.

    .. math::

        \mathrm{KL}(q \,\|\, p)_t = \sum_{v} q_t(v)\, \big(\log q_t(v) - \log p_t(v)\big)

    Exact (no sampling, no importance weight); gradients flow into the student. Zero when there is no masked
    position.

    Args:
        student_logits: ``[B, T, V]`` student logits (:math:`q`).
        teacher_logits: ``[B, T, V]`` teacher logits (:math:`p`), same shape.
        mask: ``[B, T]`` bool, the positions to average over.

    Returns:
        A scalar tensor >= 0.

    Example:
        >>> import torch
        >>> student = torch.tensor([[[0.5, 0.5]]]).log()
        >>> teacher = torch.tensor([[[0.25, 0.75]]]).log()
        >>> reverse_kl(student, teacher, torch.tensor([[True]]))  # .5 ln 2 + .5 ln(2/3)
        tensor(0.1438)

    References:
        Gu, Y., Dong, L., Wei, F., and Huang, M. (2024). MiniLLM: Knowledge Distillation of Large Language
        Models. ICLR 2024. arXiv:2306.08543.
    """
    student, teacher = _check_pair(student_logits, teacher_logits)
    mask = check_mask("mask", mask, tuple(student.shape[:2]), "student_logits")
    dtype = torch.promote_types(student.dtype, torch.float32)
    log_q = torch.log_softmax(student.to(dtype), -1)
    log_p = torch.log_softmax(teacher.to(dtype), -1)
    # 0 * log 0 = 0: where q is 0 the term vanishes even if p is 0 too
    per_token = torch.where(log_q.exp() > 0, log_q.exp() * (log_q - log_p), 0.0).sum(-1)
    _check_finite_at("student_logits and teacher_logits (per-token KL)", per_token.detach(), mask)
    count = int(mask.sum())
    if count == 0:
        return per_token.sum() * 0.0
    return (per_token * mask).sum() / count


def k3_reverse_kl(
    student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    r"""Per-sequence k3 estimate of the reverse KL from sampled tokens, divided by length (a monitor).

    With :math:`\delta_t = \log p(y_t) - \log q(y_t)` at tokens sampled from :math:`q`:

    .. math::

        \widehat{\mathrm{KL}} = \frac{1}{L} \sum_{t} \big(e^{\delta_t} - 1 - \delta_t\big) \;\ge 0

    Unbiased for :math:`\mathrm{KL}(q\|p)` per token and never negative. Sequences with no masked token get 0.

    Args:
        student_logprobs: ``[B, T]`` log-probabilities of the sampled tokens under the student.
        teacher_logprobs: ``[B, T]`` log-probabilities of the same tokens under the teacher.
        mask: ``[B, T]`` bool, the generated tokens.

    Returns:
        ``[B]`` estimates, without gradient.

    Example:
        >>> import torch
        >>> lq = torch.tensor([[-1.0, -1.0]])
        >>> k3_reverse_kl(lq, lq, torch.tensor([[True, True]]))
        tensor([0.])

    References:
        Gu, Y., Dong, L., Wei, F., and Huang, M. (2024). MiniLLM: Knowledge Distillation of Large Language
        Models. ICLR 2024. arXiv:2306.08543.

        Schulman, J. (2020). Approximating KL Divergence. http://joschu.net/blog/kl-approx.html
    """
    log_q = _check_values("student_logprobs", student_logprobs)
    log_p = _check_values("teacher_logprobs", teacher_logprobs, tuple(log_q.shape))
    mask = check_mask("mask", mask, tuple(log_q.shape), "student_logprobs")
    _check_finite_at("student_logprobs", log_q, mask)
    _check_finite_at("teacher_logprobs", log_p, mask)
    with torch.no_grad():
        delta = torch.where(mask, (log_p - log_q).to(torch.promote_types(log_q.dtype, torch.float32)), 0.0)
        per_token = torch.where(mask, torch.expm1(delta) - delta, 0.0)
        return per_token.sum(1) / mask.sum(1).clamp_min(1)


def pretrain_anchor_loss(
    student_logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    teacher_logits: torch.Tensor | None = None,
    kd_ratio: float = 0.0,
) -> torch.Tensor:
    r"""The pre-training anchor: language-modelling cross-entropy, optionally mixed with forward KD.

    .. math::

        \mathcal{L}_{PT} = (1 - \kappa)\, \mathrm{CE}(q, y) + \kappa \Big(-\sum_v p(v) \log q(v)\Big)

    averaged over tokens whose label is not -100. ``logits[:, t]`` must predict ``labels[:, t]`` (shift
    before calling). ``kd_ratio`` :math:`\kappa > 0` needs ``teacher_logits``.

    Args:
        student_logits: ``[B, T, V]`` student logits on pre-training data.
        labels: ``[B, T]`` integer targets, -100 where ignored.
        teacher_logits: ``[B, T, V]`` teacher logits on the same data, or ``None``.
        kd_ratio: Share of forward KD, in [0, 1] (default 0.0: plain LM loss).

    Returns:
        A scalar tensor (0.0, attached to the graph, when every label is -100).

    Raises:
        ConfigError: ``kd_ratio`` out of range, or > 0 without ``teacher_logits``.

    Example:
        >>> import torch
        >>> pretrain_anchor_loss(torch.zeros(1, 2, 4), torch.tensor([[3, -100]]))  # ln 4
        tensor(1.3863)

    References:
        Gu, Y., Dong, L., Wei, F., and Huang, M. (2024). MiniLLM: Knowledge Distillation of Large Language
        Models. ICLR 2024. arXiv:2306.08543.
    """
    student = check_logits("student_logits", student_logits)
    if not isinstance(labels, torch.Tensor) or labels.dtype == torch.bool or labels.is_floating_point():
        got = getattr(labels, "dtype", type(labels).__name__)
        msg = f"`labels` must be an integer torch.Tensor, got {got}."
        raise LoopguardTypeError(msg)
    keep = labels != -100
    check_token_ids(
        "labels", torch.where(keep, labels, 0), tuple(student.shape[:2]), "student_logits", student.shape[2]
    )
    ratio = check_real("kd_ratio", kd_ratio, lo=0.0, hi=1.0)
    if ratio > 0.0 and teacher_logits is None:
        msg = f"`kd_ratio` must be 0 when no `teacher_logits` are given (KD needs a teacher), got {ratio}."
        raise ConfigError(msg)
    log_q = torch.log_softmax(student.to(torch.promote_types(student.dtype, torch.float32)), -1)
    count = int(keep.sum())
    if count == 0:
        return log_q.sum() * 0.0
    nll = -log_q.gather(-1, torch.where(keep, labels, 0).long()[..., None]).squeeze(-1)
    loss = (nll * keep).sum() / count
    if ratio > 0.0 and teacher_logits is not None:
        teacher = check_logits("teacher_logits", teacher_logits)
        _require_same_shape("`teacher_logits` must have the shape of `student_logits`", teacher, student)
        p = torch.softmax(teacher.to(log_q.dtype), -1).detach()
        soft = -(torch.where(p > 0, p * log_q, 0.0)).sum(-1)
        loss = (1.0 - ratio) * loss + ratio * (soft * keep).sum() / count
    return loss


@attrs.frozen(eq=False)
class MiniLLMOutput:
    """What :class:`MiniLLMLoss` computed for one batch.

    Attributes:
        loss: The total to back-propagate: ``rl_loss + single_step_weight * single_step_loss``
            (+ ``anchor_weight * anchor_loss``).
        rl_loss: PPO-clipped policy-gradient loss on the normalised returns.
        single_step_loss: Exact per-token reverse KL (:func:`reverse_kl`).
        anchor_loss: Pre-training anchor (:func:`pretrain_anchor_loss`), or ``None`` without anchor data.
        reverse_kl_k3: Mean per-sequence k3 reverse-KL monitor (a float, no gradient).
        mean_importance_weight: Mean of :math:`w_t` over the generated tokens (1.0 when ``alpha`` is 0).
    """

    loss: torch.Tensor
    rl_loss: torch.Tensor
    single_step_loss: torch.Tensor
    anchor_loss: torch.Tensor | None
    reverse_kl_k3: float
    mean_importance_weight: float


@attrs.frozen
class MiniLLMLoss:
    r"""MiniLLM's training loss for one batch of sampled responses, with its configuration validated.

    .. math::

        \rho_t = \frac{q_\theta(y_t)}{q_{old}(y_t)}\, w_t, \qquad
        \mathcal{L}_{RL} = \operatorname{mean}_t \max\!\big(-A_t \rho_t,\;
        -A_t \operatorname{clip}(\rho_t, 1 - \epsilon, 1 + \epsilon)\big)

    .. math::

        \mathcal{L} = \mathcal{L}_{RL} + \lambda_{SS}\, \mathrm{KL}(q \| p)
        + \lambda_{PT}\, \mathcal{L}_{PT}

    with :math:`A_t` from :func:`normalized_returns` on :math:`r_t = \log p(y_t) - \log q(y_t)`,
    :math:`w_t` from :func:`importance_weights`, and the single-step KL from :func:`reverse_kl`.

    Cross-rules (checked at construction): ``alpha`` in [0, 1]; ``offline=True`` (responses not sampled from
    the current student, for example a fixed data set) with ``alpha == 0`` is rejected, since nothing then
    comes from the teacher; ``anchor_weight`` set means every call must pass anchor data, and anchor data
    without ``anchor_weight`` is rejected at the call rather than silently ignored.

    Attributes:
        alpha: Teacher share of the sampling distribution, in [0, 1] (default 0.2).
        gamma: Return discount, in [0, 1] (default 0.95).
        clip_eps: PPO clip range, in (0, 1) (default 0.2).
        single_step_weight: Weight of the single-step reverse KL, >= 0 (default 1.0).
        anchor_weight: Weight of the pre-training anchor, > 0, or ``None`` for no anchor (default).
        offline: Whether responses come from a fixed set rather than the current sampler (default ``False``).
        whiten: Whiten the advantages over the batch (default ``True``).

    Example:
        >>> import torch
        >>> torch.manual_seed(0)
        <torch._C.Generator object at ...>
        >>> student = torch.randn(2, 3, 5, requires_grad=True)
        >>> teacher = torch.randn(2, 3, 5)
        >>> tokens = torch.randint(0, 5, (2, 3))
        >>> mask = torch.ones(2, 3, dtype=torch.bool)
        >>> out = MiniLLMLoss()(student, teacher, tokens, mask)
        >>> out.loss.backward()
        >>> out.reverse_kl_k3 >= 0.0, student.grad is not None
        (True, True)
        >>> MiniLLMLoss(alpha=0.0, offline=True)
        Traceback (most recent call last):
        ...
        loopguard.exceptions.ConfigError: `alpha` must be > 0 when `offline` is True ...

    References:
        Gu, Y., Dong, L., Wei, F., and Huang, M. (2024). MiniLLM: Knowledge Distillation of Large Language
        Models. ICLR 2024. arXiv:2306.08543.
    """

    alpha: float = attrs.field(default=0.2, validator=real(lo=0.0, hi=1.0))
    gamma: float = attrs.field(default=0.95, validator=real(lo=0.0, hi=1.0))
    clip_eps: float = attrs.field(
        default=0.2, validator=real(lo=0.0, hi=1.0, lo_inclusive=False, hi_inclusive=False)
    )
    single_step_weight: float = attrs.field(default=1.0, validator=real(lo=0.0))
    anchor_weight: float | None = attrs.field(
        default=None, validator=real(lo=0.0, lo_inclusive=False, optional=True)
    )
    offline: bool = attrs.field(default=False, validator=boolean())
    whiten: bool = attrs.field(default=True, validator=boolean())

    def __attrs_post_init__(self) -> None:
        """Reject the offline configuration that has no teacher signal."""
        if self.offline and self.alpha == 0.0:
            msg = (
                "`alpha` must be > 0 when `offline` is True (an offline run with mix ratio 0 samples nothing "
                f"from the teacher, so it has no teacher signal), got {self.alpha}."
            )
            raise ConfigError(msg)

    def __call__(
        self,
        student_logits: torch.Tensor,
        teacher_logits: torch.Tensor,
        tokens: torch.Tensor,
        mask: torch.Tensor,
        *,
        old_logprobs: torch.Tensor | None = None,
        anchor_logits: torch.Tensor | None = None,
        anchor_labels: torch.Tensor | None = None,
    ) -> MiniLLMOutput:
        """Compute the loss for one batch.

        Args:
            student_logits: ``[B, T, V]`` student logits; ``student_logits[:, t]`` is the distribution that
                ``tokens[:, t]`` was sampled from (shift before calling). Carries the gradient.
            teacher_logits: ``[B, T, V]`` teacher logits at the same steps (no gradient is taken).
            tokens: ``[B, T]`` sampled token ids.
            mask: ``[B, T]`` bool, each response's tokens as one contiguous run.
            old_logprobs: ``[B, T]`` log-probabilities of ``tokens`` under the sampling-time student, or
                ``None`` (on-policy: the current student, detached).
            anchor_logits: ``[B', T', V]`` student logits on pre-training data (needs ``anchor_weight``).
            anchor_labels: ``[B', T']`` their labels, -100 where ignored (needs ``anchor_weight``).

        Returns:
            A :class:`MiniLLMOutput`.

        Raises:
            ConfigError: anchor data given without ``anchor_weight``, or ``anchor_weight`` set without it.
            LoopguardTypeError, InputError: bad tensor types, shapes, ids or non-finite values.
        """
        has_anchor_data = anchor_logits is not None or anchor_labels is not None
        if self.anchor_weight is None and has_anchor_data:
            msg = (
                "`anchor_weight` must be set when anchor data is passed (it would be ignored), got None; "
                "pass MiniLLMLoss(anchor_weight=1.0) or drop `anchor_logits`/`anchor_labels`."
            )
            raise ConfigError(msg)
        if self.anchor_weight is not None and (anchor_logits is None or anchor_labels is None):
            msg = (
                f"`anchor_logits` and `anchor_labels` must both be passed when `anchor_weight` is set, got "
                f"anchor_weight={self.anchor_weight} with anchor_logits "
                f"{'missing' if anchor_logits is None else 'given'} and anchor_labels "
                f"{'missing' if anchor_labels is None else 'given'}."
            )
            raise ConfigError(msg)
        student, teacher = _check_pair(student_logits, teacher_logits)
        ids = check_token_ids("tokens", tokens, tuple(student.shape[:2]), "student_logits", student.shape[2])
        mask = check_mask("mask", mask, tuple(student.shape[:2]), "student_logits")
        log_q = _token_log_probs(student, ids)
        with torch.no_grad():
            log_p = _token_log_probs(teacher, ids)
        _check_finite_at("student_logits (log-probability of the sampled tokens)", log_q.detach(), mask)
        _check_finite_at("teacher_logits (log-probability of the sampled tokens)", log_p, mask)
        if old_logprobs is None:
            old = log_q.detach()
        else:
            old = _check_values("old_logprobs", old_logprobs, tuple(log_q.shape)).detach()
            _check_finite_at("old_logprobs", old, mask)
        advantages = normalized_returns(log_p - log_q.detach(), mask, gamma=self.gamma, whiten=self.whiten)
        weights = importance_weights(student, teacher, ids, self.alpha)
        ratio = torch.exp(torch.where(mask, log_q - old, 0.0)) * weights
        clipped = ratio.clamp(1.0 - self.clip_eps, 1.0 + self.clip_eps)
        per_token = torch.maximum(-advantages * ratio, -advantages * clipped)
        count = max(int(mask.sum()), 1)
        rl_loss = (per_token * mask).sum() / count
        single = reverse_kl(student, teacher, mask)
        loss = rl_loss + self.single_step_weight * single
        anchor = None
        if self.anchor_weight is not None and anchor_logits is not None and anchor_labels is not None:
            anchor = pretrain_anchor_loss(anchor_logits, anchor_labels)
            loss = loss + self.anchor_weight * anchor
        monitor = k3_reverse_kl(log_q.detach(), log_p, mask)
        has_tokens = mask.any(1)
        k3 = float(monitor[has_tokens].mean()) if bool(has_tokens.any()) else 0.0
        mean_weight = float(weights[mask].mean()) if bool(mask.any()) else 1.0
        return MiniLLMOutput(loss, rl_loss, single, anchor, k3, mean_weight)
