"""Stateless signal kernels: score one batch of RL training data for reward hacking and degeneration.

Every function here is pure (no state, no I/O, no logging), takes array-likes (lists, numpy arrays, torch
tensors on any device) and returns a float or a numpy array. Only numpy, scipy and scikit-learn are used;
torch is never imported. Formulas, what each signal catches and what it misses: ``docs/signals.md``.
"""

from __future__ import annotations

from loopguard.signals._sequences import TokenBatch, as_token_batch

# -- end of imports --

__all__ = [
    "TokenBatch",
    "as_token_batch",
    # -- end of __all__ --
]
