"""Tensor checks shared by the distillation losses (torch is imported by the package's ``__init__``)."""

from __future__ import annotations

from typing import Literal, get_args

import torch

from loopguard._validation import MAX_TOKENS_PER_TRAJECTORY, MAX_TRAJECTORIES, check_choice, describe
from loopguard.exceptions import InputError, LoopguardTypeError

__all__ = [
    "MAX_VOCAB_SIZE",
    "Reduction",
    "check_floating",
    "check_logits",
    "check_mask",
    "check_prob_rows",
    "check_reduction",
    "check_token_ids",
    "reduce_rows",
]

MAX_VOCAB_SIZE = 262_144
"""Largest vocabulary (last logit dimension) the distillation losses accept (a DoS cap)."""

Reduction = Literal["mean", "sum", "none"]
"""How a loss reduces its per-sequence values (a closed allowlist)."""

_REDUCTIONS: tuple[str, ...] = get_args(Reduction)


def check_reduction(value: object) -> str:
    """Validate ``reduction`` against the allowlist ``'mean'``, ``'none'``, ``'sum'``."""
    return check_choice("reduction", value, _REDUCTIONS)


def _tensor(name: str, value: object, what: str) -> torch.Tensor:
    """``value`` if it is a tensor; else "`{name}` must be {what}, got ..." (``what``: "a torch.Tensor")."""
    if not isinstance(value, torch.Tensor):
        msg = f"`{name}` must be {what}, got {describe(value)} of type {type(value).__name__}."
        raise LoopguardTypeError(msg)
    return value


def check_floating(name: str, value: torch.Tensor) -> torch.Tensor:
    """Refuse a tensor that is not floating-point."""
    if not value.is_floating_point():
        msg = f"`{name}` must be a floating-point tensor, got dtype {value.dtype}."
        raise LoopguardTypeError(msg)
    return value


def _check_leading_shape(name: str, value: torch.Tensor, shape: tuple[int, ...], shape_of: str) -> None:
    if tuple(value.shape) != shape:
        got = tuple(value.shape)
        msg = f"`{name}` must have shape {shape} (the first dimensions of `{shape_of}`), got {got}."
        raise InputError(msg)


def check_logits(name: str, value: object, *, ndim: int = 3) -> torch.Tensor:
    """Validate a floating tensor of logits with ``ndim`` dimensions and a last dimension in [1, 262144]."""
    value = check_floating(name, _tensor(name, value, "a torch.Tensor"))
    if value.dim() != ndim:
        msg = f"`{name}` must be a {ndim}-D tensor, got shape {tuple(value.shape)}."
        raise InputError(msg)
    vocab = value.shape[-1]
    if not 1 <= vocab <= MAX_VOCAB_SIZE:
        msg = f"`{name}` must have a vocabulary (last) dimension in [1, {MAX_VOCAB_SIZE}], got {vocab}."
        raise InputError(msg)
    if ndim == 3 and value.shape[0] > MAX_TRAJECTORIES:
        msg = f"`{name}` must have at most {MAX_TRAJECTORIES:,} sequences (DoS cap), got {value.shape[0]:,}."
        raise InputError(msg)
    if ndim == 3 and value.shape[1] > MAX_TOKENS_PER_TRAJECTORY:
        msg = (
            f"`{name}` must have at most {MAX_TOKENS_PER_TRAJECTORY:,} positions (DoS cap), "
            f"got {value.shape[1]:,}."
        )
        raise InputError(msg)
    return value


def check_mask(name: str, value: object, shape: tuple[int, ...], shape_of: str) -> torch.Tensor:
    """Validate a bool mask whose shape equals ``shape`` (the leading dimensions of ``shape_of``)."""
    value = _tensor(name, value, "a bool torch.Tensor")
    if value.dtype != torch.bool:
        msg = f"`{name}` must be a bool tensor (for example `labels != -100`), got dtype {value.dtype}."
        raise LoopguardTypeError(msg)
    _check_leading_shape(name, value, shape, shape_of)
    return value


def check_token_ids(
    name: str, value: object, shape: tuple[int, ...], shape_of: str, vocab: int
) -> torch.Tensor:
    """Validate integer token ids of a given shape with every id in ``[0, vocab)``."""
    value = _tensor(name, value, "an integer torch.Tensor")
    if value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
        msg = f"`{name}` must be an integer tensor, got dtype {value.dtype}."
        raise LoopguardTypeError(msg)
    _check_leading_shape(name, value, shape, shape_of)
    if value.numel() and (int(value.min()) < 0 or int(value.max()) >= vocab):
        bad = int(value.min()) if int(value.min()) < 0 else int(value.max())
        msg = f"`{name}` must hold ids in [0, {vocab}) (the vocabulary of `{shape_of}`), got {bad}."
        raise InputError(msg)
    return value.long()


def check_prob_rows(student_probs: torch.Tensor, teacher_probs: torch.Tensor) -> None:
    """Require as many rows in ``student_probs`` as in ``teacher_probs``, and finite values in both."""
    if student_probs.shape[0] != teacher_probs.shape[0]:
        msg = (
            "`student_probs` and `teacher_probs` must have the same number of rows, "
            f"got {student_probs.shape[0]} and {teacher_probs.shape[0]}."
        )
        raise InputError(msg)
    for name, probs in (("student_probs", student_probs), ("teacher_probs", teacher_probs)):
        if probs.numel() and not bool(torch.isfinite(probs).all()):
            msg = f"`{name}` must be finite, got a NaN or infinite value."
            raise InputError(msg)


def reduce_rows(per_sequence: torch.Tensor, has_rows: torch.Tensor, reduction: str) -> torch.Tensor:
    """Reduce per-sequence values: mean over sequences that have aligned positions, sum, or none."""
    if reduction == "none":
        return per_sequence
    if reduction == "sum":
        return per_sequence.sum()
    count = int(has_rows.sum())
    if count == 0:
        return per_sequence.sum() * 0.0
    return per_sequence.sum() / count
