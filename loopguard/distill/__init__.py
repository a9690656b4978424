"""Distillation loss pieces: cross-tokenizer ULD and MiniLLM reverse KL (needs torch, the ``hf`` extra).

Pure functions and small objects that any trainer's ``compute_loss`` (or a raw loop) can call:

* :func:`uld_loss` -- Universal Logit Distillation between models with different vocabularies, positions
  aligned from each answer's start; :func:`uld_distance` on rows that are already aligned;
* :class:`TokenMapping` and :func:`topk_align` -- match the two vocabularies' pieces (``"Ġ"``/``"▁"``
  normalised) and distil the teacher's top-k token by token where a match exists, sorted ULD elsewhere;
* :func:`align_offsets` and :func:`merge_aligned_probs` -- align two tokenizations of the same text by
  character offsets and merge each side's probabilities per aligned group (each model reads only its own ids);
* MiniLLM: :func:`mixed_sampling_probs`, :func:`importance_weights`, :func:`normalized_returns`,
  :func:`reverse_kl`, :func:`k3_reverse_kl`, :func:`pretrain_anchor_loss`, and :class:`MiniLLMLoss`.

See ``docs/distillation.md`` for a walk-through.

Example:
    >>> import torch
    >>> from loopguard.distill import uld_loss
    >>> student = torch.randn(2, 5, 11)  # vocabulary of 11
    >>> teacher = torch.randn(2, 6, 17)  # vocabulary of 17, a different tokenizer
    >>> mask_s = torch.ones(2, 5, dtype=torch.bool)
    >>> mask_t = torch.ones(2, 6, dtype=torch.bool)
    >>> float(uld_loss(student, teacher, mask_s, mask_t)) > 0.0
    True
"""

# ruff: noqa: E402
from __future__ import annotations

from loopguard._validation import import_extra

_HINT = "loopguard.distill needs the `hf` extra: pip install 'loopguard[hf]'"
import_extra(_HINT, "torch")  # before the submodules import it (hence E402 below)

from loopguard.distill._common import MAX_VOCAB_SIZE, Reduction
from loopguard.distill._mapping import TokenMapping, normalize_piece, topk_align
from loopguard.distill._minillm import (
    MiniLLMLoss,
    MiniLLMOutput,
    importance_weights,
    k3_reverse_kl,
    mixed_sampling_probs,
    normalized_returns,
    pretrain_anchor_loss,
    reverse_kl,
)
from loopguard.distill._offsets import OffsetAlignment, align_offsets, merge_aligned_probs
from loopguard.distill._uld import uld_distance, uld_loss

__all__ = [
    "MAX_VOCAB_SIZE",
    "MiniLLMLoss",
    "MiniLLMOutput",
    "OffsetAlignment",
    "Reduction",
    "TokenMapping",
    "align_offsets",
    "importance_weights",
    "k3_reverse_kl",
    "merge_aligned_probs",
    "mixed_sampling_probs",
    "normalize_piece",
    "normalized_returns",
    "pretrain_anchor_loss",
    "reverse_kl",
    "topk_align",
    "uld_distance",
    "uld_loss",
]
