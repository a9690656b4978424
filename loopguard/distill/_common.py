"""Tensor checks shared by the distillation losses (torch is imported by the package's ``__init__``)."""

from __future__ import annotations

from typing import Literal, get_args

import torch

from loopguard._validation import MAX_TOKENS_PER_TRAJECTORY, MAX_TRAJECTORIES, check_choice, describe
from loopguard.exceptions import InputError, LoopguardTypeError

__all__ = [
    "MAX_VOCAB_SIZE",
    "Reduction",
    "check_logits",
    "check_mask",
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


def check_logits(name: str, value: object, *, ndim: int = 3) -> torch.Tensor:
    """Validate a floating tensor of logits with ``ndim`` dimensions and a last dimension in [1, 262144]."""
    if not isinstance(value, torch.Tensor):
        msg = f"`{name}` must be a torch.Tensor, got {describe(value)} of type {type(value).__name__}."
        raise LoopguardTypeError(msg)
    if not value.is_floating_point():
        msg = f"`{name}` must be a floating-point tensor, got dtype {value.dtype}."
        raise LoopguardTypeError(msg)
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
    if not isinstance(value, torch.Tensor):
        msg = f"`{name}` must be a bool torch.Tensor, got {describe(value)} of type {type(value).__name__}."
        raise LoopguardTypeError(msg)
    if value.dtype != torch.bool:
        msg = f"`{name}` must be a bool tensor (for example `labels != -100`), got dtype {value.dtype}."
        raise LoopguardTypeError(msg)
    if tuple(value.shape) != shape:
        got = tuple(value.shape)
        msg = f"`{name}` must have shape {shape} (the first dimensions of `{shape_of}`), got {got}."
        raise InputError(msg)
    return value


def check_token_ids(
    name: str, value: object, shape: tuple[int, ...], shape_of: str, vocab: int
) -> torch.Tensor:
    """Validate integer token ids of a given shape with every id in ``[0, vocab)``."""
    if not isinstance(value, torch.Tensor):
        msg = (
            f"`{name}` must be an integer torch.Tensor, got {describe(value)} of type {type(value).__name__}."
        )
        raise LoopguardTypeError(msg)
    if value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
        msg = f"`{name}` must be an integer tensor, got dtype {value.dtype}."
        raise LoopguardTypeError(msg)
    if tuple(value.shape) != shape:
        got = tuple(value.shape)
        msg = f"`{name}` must have shape {shape} (the first dimensions of `{shape_of}`), got {got}."
        raise InputError(msg)
    if value.numel() and (int(value.min()) < 0 or int(value.max()) >= vocab):
        bad = int(value.min()) if int(value.min()) < 0 else int(value.max())
        msg = f"`{name}` must hold ids in [0, {vocab}) (the vocabulary of `{shape_of}`), got {bad}."
        raise InputError(msg)
    return value.long()


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
