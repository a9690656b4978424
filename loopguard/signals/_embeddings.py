"""Embedding batches for the latent-space signals: validation and float64-safe rescaling.

The latent signals (:mod:`loopguard.signals._latent`) take ``[rows, dim]`` batches of user-supplied
embeddings. This module validates them (finite, 2-D, within the DoS caps, a shared dimension) and brings
batches of extreme magnitude into :data:`SAFE_RANGE` by exact power-of-two scaling (and translation where
distances allow), so distances, squares and covariance estimates can neither overflow nor underflow. Data
already inside the range is returned as given: the kernels then compute exactly the plain formulas.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from loopguard._validation import MAX_EMBEDDING_DIM, MAX_TRAJECTORIES, as_float_array
from loopguard.exceptions import InputError
from loopguard.signals._numeric import pow2_exponent

__all__ = [
    "SAFE_RANGE",
    "as_embedding_pair",
    "outside_safe_range",
    "reject_zero_rows",
    "to_reference_scale",
    "to_safe_range",
    "unit_rows",
]

SAFE_RANGE = (2.0**-200, 2.0**200)
"""Largest magnitudes for which distances, squares and covariance estimates of embeddings (Ledoit-Wolf uses
fourth powers) cannot overflow or underflow to nothing: ``2**800`` times 65,536 dimensions times 100,000
rows is still far below 1.8e308. Data inside it is used as given, so the results are exactly those of the
plain formulas; data outside it is rescaled by a power of two (and translated where distances allow)."""


def _as_embeddings(name: str, value: object) -> NDArray[np.float64]:
    """Validate one ``[rows, dim]`` batch of finite embeddings within the DoS caps."""
    array = as_float_array(name, value, ndim=2, max_len=MAX_TRAJECTORIES)
    if array.shape[1] > MAX_EMBEDDING_DIM:
        msg = f"`{name}` must have at most {MAX_EMBEDDING_DIM:,} columns (DoS cap), got {array.shape[1]:,}."
        raise InputError(msg)
    return array


def as_embedding_pair(
    policy_emb: object, reference_emb: object
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Validate the policy and reference batches and check that they share the embedding dimension."""
    policy = _as_embeddings("policy_emb", policy_emb)
    reference = _as_embeddings("reference_emb", reference_emb)
    if policy.shape[1] != reference.shape[1]:
        msg = (
            "`policy_emb` and `reference_emb` must have the same embedding dimension, "
            f"got {policy.shape[1]} and {reference.shape[1]}."
        )
        raise InputError(msg)
    return policy, reference


def reject_zero_rows(name: str, array: NDArray[np.float64]) -> None:
    """Cosine distance is undefined for a zero vector: refuse such rows with their index."""
    zero = ~np.any(array != 0.0, axis=1)
    if zero.any():
        row = int(np.argmax(zero))
        msg = (
            f"`{name}` must not contain all-zero rows when `metric` is 'cosine' "
            f"(cosine distance is undefined for a zero vector), got one at row {row}."
        )
        raise InputError(msg)


def outside_safe_range(*arrays: NDArray[np.float64]) -> bool:
    """Whether the largest magnitude over ``arrays`` is non-zero and outside :data:`SAFE_RANGE`."""
    largest = max(float(np.max(np.abs(array))) for array in arrays)
    return largest != 0.0 and not SAFE_RANGE[0] <= largest <= SAFE_RANGE[1]


def to_safe_range(
    policy: NDArray[np.float64], reference: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.float64], int]:
    """Bring both batches into :data:`SAFE_RANGE` when they are outside it; distances become ``d / 2**e``.

    Returns the batches unchanged with ``e = 0`` when they are inside it.

    Translation to the middle of the joint bounding box cannot overflow (``min/2 + max/2``) and keeps
    small differences between huge coordinates; the power-of-two scaling is exact.
    """
    if not outside_safe_range(policy, reference):
        return policy, reference, 0
    low = np.minimum(policy.min(axis=0), reference.min(axis=0))
    high = np.maximum(policy.max(axis=0), reference.max(axis=0))
    center = low / 2.0 + high / 2.0
    policy = policy - center  # |x - center| <= (high - low) / 2 <= 1.8e308
    reference = reference - center
    exponent = pow2_exponent(max(float(np.max(np.abs(policy))), float(np.max(np.abs(reference)))))
    return np.ldexp(policy, -exponent), np.ldexp(reference, -exponent), exponent


def to_reference_scale(
    policy: NDArray[np.float64], reference: NDArray[np.float64]
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64] | None, int]:
    """Bring the reference into :data:`SAFE_RANGE` (translate to its centre, divide by ``2**e``).

    Mahalanobis distances do not change when both batches move together and are scaled together (the
    ridge then scales by ``4**-e``). Returns ``(policy, reference, halves, e)``: policy rows that do not
    fit in float64 after scaling (rows astronomically far from the reference) come back as inf, and
    ``halves`` holds ``(x - centre) / 2`` in the original units for every row (finite). When no rescaling
    is needed, everything is returned as given, with ``halves = None`` and ``e = 0``.
    """
    if not outside_safe_range(policy, reference):
        return policy, reference, None, 0
    center = reference.min(axis=0) / 2.0 + reference.max(axis=0) / 2.0
    reference = reference - center
    exponent = pow2_exponent(float(np.max(np.abs(reference))))
    halves = policy / 2.0 - center / 2.0  # (x - centre) / 2 cannot overflow
    with np.errstate(over="ignore"):
        policy = np.ldexp(halves, 1 - exponent)
    return policy, np.ldexp(reference, -exponent), halves, exponent


def unit_rows(rows: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """``(v, k)`` with ``rows = v * 2**k`` row by row and every ``|v| < 1`` (exact; a zero row stays zero)."""
    exponents = np.frexp(np.max(np.abs(rows), axis=1))[1].astype(np.int64)
    return np.asarray(np.ldexp(rows, -exponents[:, None]), dtype=np.float64), exponents
