"""Latent-space outlier signals from InfoRM: is the policy leaving the reference in embedding space?

InfoRM (Miao et al. 2024) observed that reward-hacked responses show up as *outliers in a latent space*: the
reward model's information-bottleneck latent of RL (policy) responses moves away from the cloud of latents of
the SFT (reference) responses to the same prompts. This module turns that observation into two batch
statistics over user-supplied embeddings:

* :func:`cluster_separation_index` (CSI, the conference paper): DBSCAN-cluster the policy latents and add up,
  over clusters, cluster size times the distance from the cluster centroid to the nearest reference latent.
* :func:`mahalanobis_outlier_fraction` (MOP, the journal version): the fraction of policy latents that a
  Gaussian fitted to the reference latents calls outliers at level ``alpha``, via the squared Mahalanobis
  distances of :func:`squared_mahalanobis_distances`.

The embeddings are whatever the user supplies: an InfoRM latent, a reward model's hidden state at the EOS
token, or a sentence encoder's embedding of the response. Both statistics are about where responses sit in
that space; neither looks at scalar rewards.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, NamedTuple, get_args

import numpy as np
from numpy.typing import NDArray

from loopguard._validation import check_bool, check_choice, check_int, check_real
from loopguard.exceptions import InputError
from loopguard.signals._embeddings import (
    as_embedding_pair,
    reject_zero_rows,
    to_reference_scale,
    to_safe_range,
    unit_rows,
)

__all__ = [
    "CovarianceShrinkage",
    "LatentMetric",
    "cluster_separation_index",
    "mahalanobis_outlier_fraction",
    "squared_mahalanobis_distances",
]

LatentMetric = Literal["euclidean", "cosine", "manhattan"]
"""Distance metrics :func:`cluster_separation_index` accepts (a closed allowlist)."""

CovarianceShrinkage = Literal["ledoit_wolf", "oas", "none"]
"""Covariance estimators the Mahalanobis functions accept (a closed allowlist)."""

_CSI_METRICS: tuple[str, ...] = get_args(LatentMetric)
_SHRINKAGES: tuple[str, ...] = get_args(CovarianceShrinkage)


_SMALLEST_EPS = float(np.nextafter(0.0, 1.0))
_LARGEST_EPS = 1e12  # far beyond any distance between rows of magnitude < 4 in <= 65,536 dimensions


def _paired_distances(a: NDArray[np.float64], b: NDArray[np.float64], metric: str) -> NDArray[np.float64]:
    """Distance between ``a[i]`` and ``b[i]`` for every row, computed directly (no expansion tricks)."""
    if metric == "euclidean":
        return np.asarray(np.linalg.norm(a - b, axis=1), dtype=np.float64)
    if metric == "manhattan":
        return np.asarray(np.abs(a - b).sum(axis=1), dtype=np.float64)
    # cosine: 1 - cos(a, b) = ||a/|a| - b/|b|||^2 / 2, which keeps precision for nearly parallel vectors.
    # A zero-norm centroid (possible only when a cluster's members cancel out) is orthogonal to everything,
    # distance 1, the convention of sklearn.metrics.pairwise.cosine_distances.
    norm_a = np.linalg.norm(a, axis=1)
    norm_b = np.linalg.norm(b, axis=1)
    degenerate = (norm_a == 0.0) | (norm_b == 0.0)
    unit_a = a / np.where(norm_a == 0.0, 1.0, norm_a)[:, None]
    unit_b = b / np.where(norm_b == 0.0, 1.0, norm_b)[:, None]
    half_chord = 0.5 * np.square(unit_a - unit_b).sum(axis=1)
    return np.asarray(np.where(degenerate, 1.0, np.clip(half_chord, 0.0, 2.0)), dtype=np.float64)


def cluster_separation_index(
    policy_emb: object,
    reference_emb: object,
    *,
    eps: float,
    min_samples: int,
    metric: LatentMetric = "euclidean",
    include_noise: bool = False,
    normalize: bool = False,
) -> float:
    r"""InfoRM's Cluster Separation Index: how far clusters of policy latents sit from the reference latents.

    DBSCAN (:class:`sklearn.cluster.DBSCAN`, with ``eps``, ``min_samples`` and ``metric``) clusters the
    policy latents ``R``. For each cluster ``C_i`` the centroid ``c_i`` is the mean of its members in the raw
    embedding space, and ``d_i`` is the distance (same ``metric``) from ``c_i`` to the *nearest* reference
    latent. CSI adds the ``d_i`` up weighted by cluster size. A sharp rise over training means that groups of
    policy responses have moved into a region of latent space the reference (SFT) responses never visit,
    which InfoRM found to accompany reward hacking.

    The embeddings are whatever you supply: an InfoRM information-bottleneck latent, a reward model's hidden
    state at the EOS token, or a sentence encoder's embedding of each response. CSI measures outliers in that
    latent space; it never looks at scalar rewards.

    .. math::

        c_i = \frac{1}{|C_i|} \sum_{r \in C_i} r, \qquad
        d_i = \min_{s \in S} \operatorname{dist}(c_i, s), \qquad
        \mathrm{CSI} = \sum_{i=1}^{n} |C_i| \, d_i \quad \Big(\text{divided by } |R|
        \text{ when } \texttt{normalize}\Big)

    **Noise points.** DBSCAN labels points that are in no dense region as noise (label ``-1``). By default
    (``include_noise=False``) noise is left out, as in the paper's clusters. Consequently, **if every policy
    point is noise, CSI is exactly 0.0**. That can hide a hack whose responses are *scattered* far from the
    reference without forming a dense group: pass ``include_noise=True`` (each noise point then counts as a
    singleton cluster at its own position) or watch :func:`mahalanobis_outlier_fraction` as well.

    **Choosing eps.** Neither the paper nor its code fixes ``eps``/``min_samples``; they depend on the scale
    of your embeddings. A common start is the median distance from each reference latent to its
    ``min_samples``-th nearest reference neighbour. CSI is not scale-free: compare it with its own warm-up
    values, not with a universal threshold.

    Cost: DBSCAN's neighbour search is brute force for high-dimensional data (``O(N^2 D)`` time, and memory
    proportional to the number of neighbour pairs within ``eps``, which is quadratic in the worst case); the
    nearest-reference search is chunked (``O(n M D)`` time, bounded memory). 512 x 768-d against 512 x 768-d
    takes a few tens of milliseconds.

    Args:
        policy_emb: ``[N, D]`` latents of the policy's responses (array, list or tensor). ``1 <= N <=
            MAX_TRAJECTORIES`` (100,000) and ``1 <= D <= MAX_EMBEDDING_DIM`` (65,536) (DoS caps); finite.
        reference_emb: ``[M, D]`` latents of reference (SFT) responses, same ``D``, same caps.
        eps: DBSCAN neighbourhood radius, in units of ``metric``; finite and > 0.
        min_samples: DBSCAN's number of points (the point itself included) within ``eps`` that make a core
            point; integer >= 1. ``min_samples=1`` makes every point core, so no point is noise.
        metric: ``"euclidean"`` (default, as in the paper), ``"cosine"`` (``1 - cos``; all-zero rows are
            rejected) or ``"manhattan"``. Used both for DBSCAN and for the centroid-to-reference distance.
        include_noise: Count each DBSCAN noise point as a singleton cluster (default ``False``: ignore noise).
        normalize: Divide by ``N`` (all policy points, noise included) so that values are comparable across
            batch sizes (default ``False``: the paper's unnormalised sum).

    Returns:
        CSI as a python ``float``, always finite and >= 0 (0.0 when there is no cluster to score).

    Raises:
        LoopguardTypeError: bool or non-numeric ``eps``/``min_samples``, non-bool flags, non-numeric arrays.
        ConfigError: ``eps`` not finite or <= 0, ``min_samples`` < 1, ``metric`` not in the allowlist.
        InputError: arrays not 2-D, empty, non-finite, over a DoS cap, of different ``D``, or (cosine) with an
            all-zero row.

    Example:
        >>> policy = [[-1.0, 0.0], [1.0, 0.0], [3.0, 7.0], [3.0, 8.0], [3.0, 9.0], [50.0, 4.0]]
        >>> reference = [[3.0, 4.0]]
        >>> cluster_separation_index(policy, reference, eps=2.5, min_samples=2)  # 2 * 5 + 3 * 4
        22.0
        >>> cluster_separation_index(policy, reference, eps=2.5, min_samples=2, include_noise=True)
        69.0
        >>> cluster_separation_index(policy, reference, eps=2.5, min_samples=2, normalize=True)  # 22 / 6
        3.666...

    References:
        Miao, Y., Zhang, S., Ding, L., Bao, R., Zhang, L., and Tao, D. (2024). InfoRM: Mitigating Reward
        Hacking in RLHF via Information-Theoretic Reward Modeling. NeurIPS 2024. arXiv:2402.09345.

        Ester, M., Kriegel, H.-P., Sander, J., and Xu, X. (1996). A Density-Based Algorithm for Discovering
        Clusters in Large Spatial Databases with Noise. KDD 1996.
    """
    policy, reference = as_embedding_pair(policy_emb, reference_emb)
    eps_value = check_real("eps", eps, lo=0.0, lo_inclusive=False)
    min_samples_value = check_int("min_samples", min_samples, lo=1)
    metric_name = check_choice("metric", metric, _CSI_METRICS)
    include_noise_flag = check_bool("include_noise", include_noise)
    normalize_flag = check_bool("normalize", normalize)
    space = _clustering_space(policy, reference, metric_name, eps_value)
    labels = _cluster_labels(space, min_samples_value, include_noise=include_noise_flag)
    in_cluster = labels >= 0
    if not in_cluster.any():
        return 0.0
    counts, centroids = _cluster_centroids(space.members[in_cluster], labels[in_cluster], metric_name)
    from sklearn.metrics import pairwise_distances_argmin

    # Nearest reference point per centroid (chunked, memory-bounded), then the exact distance to it.
    nearest = pairwise_distances_argmin(centroids, space.reference, metric=metric_name)
    distances = _paired_distances(centroids, space.reference[nearest], metric_name)
    total = float(np.dot(counts.astype(np.float64), distances))
    if normalize_flag:
        total /= policy.shape[0]
    return _csi_in_original_units(total, space.exponent)


class _ClusteringSpace(NamedTuple):
    """Where CSI clusters: the rows DBSCAN sees, the reference, and the eps and metric that go with them."""

    members: NDArray[np.float64]  # the policy rows whose cluster means are the centroids
    clustered: NDArray[np.float64]
    reference: NDArray[np.float64]
    eps: float
    metric: str
    exponent: int  # distances here are the original ones divided by 2**exponent


def _clustering_space(
    policy: NDArray[np.float64], reference: NDArray[np.float64], metric: str, eps: float
) -> _ClusteringSpace:
    """Rows to cluster and the reference to measure against, scaled so no distance overflows.

    Cosine ignores each row's length: rows are scaled to a magnitude in [0.5, 1) (exact), so no norm can
    overflow or underflow and the distances are unchanged (centroids use the rows as given). The other
    metrics bring both batches into the safe range together; distances then shrink by ``2**exponent`` and
    so does ``eps`` (clamped to what float64 can hold).
    """
    if metric == "cosine":
        reject_zero_rows("policy_emb", policy)
        reject_zero_rows("reference_emb", reference)
        return _ClusteringSpace(policy, unit_rows(policy)[0], unit_rows(reference)[0], eps, metric, 0)
    policy, reference, exponent = to_safe_range(policy, reference)
    if exponent:
        with np.errstate(over="ignore", under="ignore"):
            eps = float(np.ldexp(eps, -exponent))
        eps = min(max(eps, _SMALLEST_EPS), _LARGEST_EPS)
    return _ClusteringSpace(policy, policy, reference, eps, metric, exponent)


def _cluster_labels(space: _ClusteringSpace, min_samples: int, *, include_noise: bool) -> NDArray[np.int64]:
    """DBSCAN labels of the clustered rows (``-1``: noise), or each noise point as its own cluster."""
    from sklearn.cluster import DBSCAN

    found = DBSCAN(eps=space.eps, min_samples=min_samples, metric=space.metric).fit_predict(space.clustered)
    labels = np.asarray(found, dtype=np.int64)
    noise = labels < 0
    if include_noise and noise.any():
        # Every noise point becomes its own cluster, numbered after DBSCAN's clusters.
        labels = labels.copy()
        labels[noise] = labels.max(initial=-1) + 1 + np.arange(int(noise.sum()), dtype=np.int64)
    return labels


def _cluster_centroids(
    members: NDArray[np.float64], labels: NDArray[np.int64], metric: str
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """``(sizes, centroids)`` of the clusters ``0..n-1`` (none empty), in one pass over the members.

    The members are sorted by label and each contiguous run is added up. For cosine only the centroid's
    direction matters: each cluster's rows are scaled by a power of two near the cluster's largest row
    (exact), so the sum cannot overflow when rows are near 1e308.
    """
    counts = np.bincount(labels)
    order = np.argsort(labels, kind="stable")
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    ordered = members[order]
    if metric == "cosine":
        row_exponents = np.frexp(np.max(np.abs(ordered), axis=1))[1]
        cluster_exponents = np.maximum.reduceat(row_exponents, starts)
        ordered = np.ldexp(ordered, -np.repeat(cluster_exponents, counts)[:, None])
    centroids = np.add.reduceat(ordered, starts, axis=0) / counts[:, None]
    if metric == "cosine":
        centroids = unit_rows(centroids)[0]
    return counts, centroids


def _csi_in_original_units(total: float, exponent: int) -> float:
    """Scale a CSI computed on rescaled rows back by ``2**exponent``, refusing a result beyond float64."""
    if not exponent:
        return total
    with np.errstate(over="ignore"):
        total = float(np.ldexp(total, exponent))
    if not math.isfinite(total):
        msg = (
            "`policy_emb` and `reference_emb` must give a CSI representable in float64, got one beyond "
            "~1.8e308 (the clusters sit that far from the reference; rescale the embeddings)."
        )
        raise InputError(msg)
    return total


def _validated_mahalanobis_inputs(
    policy_emb: object, reference_emb: object, shrinkage: object, n_components: object, ridge: object
) -> tuple[NDArray[np.float64], NDArray[np.float64], str, int | None, float]:
    """Validate the arguments shared by the Mahalanobis functions."""
    policy, reference = as_embedding_pair(policy_emb, reference_emb)
    shrinkage_name = check_choice("shrinkage", shrinkage, _SHRINKAGES)
    ridge_value = check_real("ridge", ridge, lo=0.0)
    rows, dim = reference.shape
    if rows < 2:
        msg = (
            "`reference_emb` must have at least 2 rows to estimate a covariance, "
            f"got shape {reference.shape}."
        )
        raise InputError(msg)
    components: int | None = None
    if n_components is not None:
        components = check_int("n_components", n_components, lo=1, hi=min(rows, dim))
    return policy, reference, shrinkage_name, components, ridge_value


class _FarRows(NamedTuple):
    """Policy rows whose difference from the reference mean overflows float64, as ``unit * 2**exponents``."""

    rows: NDArray[np.int64]
    unit: NDArray[np.float64]
    exponents: NDArray[np.int64]


def _far_rows(policy: NDArray[np.float64], halves: NDArray[np.float64] | None, exponent: int) -> _FarRows:
    """The rows :func:`to_reference_scale` could not scale (inf), rebuilt exactly from ``halves``."""
    far = np.flatnonzero(~np.isfinite(policy).all(axis=1))
    if far.size and halves is not None:  # difference = 2 * halves / 2**e; the mean (|mu| <= 2) is negligible
        unit, exponents = unit_rows(halves[far])
        return _FarRows(far, unit, exponents + (1 - exponent))
    return _FarRows(far, np.zeros((0, policy.shape[1])), np.zeros(0, dtype=np.int64))


def _project_on_components(
    policy: NDArray[np.float64], reference: NDArray[np.float64], n_components: int, far: _FarRows
) -> tuple[NDArray[np.float64], NDArray[np.float64], _FarRows]:
    """Project both batches on the reference's top ``n_components`` principal components (exact SVD).

    The projection is linear: far rows are projected as unit rows and scaled back where that fits in
    float64; the others stay far, in the projected space.
    """
    from sklearn.decomposition import PCA

    with np.errstate(divide="ignore", invalid="ignore"):  # variance ratios of a constant reference
        pca = PCA(n_components=n_components, svd_solver="full").fit(reference)
    reference = np.asarray(pca.transform(reference), dtype=np.float64)
    near_rows = np.setdiff1d(np.arange(policy.shape[0]), far.rows)
    projected = np.zeros((policy.shape[0], n_components), dtype=np.float64)
    if near_rows.size:
        projected[near_rows] = pca.transform(policy[near_rows])
    if not far.rows.size:
        return projected, reference, _FarRows(far.rows, np.zeros((0, n_components)), far.exponents)
    components = np.asarray(pca.components_, dtype=np.float64)
    far_projected = far.unit @ components.T
    with np.errstate(over="ignore", invalid="ignore"):
        back = np.ldexp(far_projected, far.exponents[:, None]) - np.asarray(pca.mean_) @ components.T
    fits = np.isfinite(back).all(axis=1)
    projected[far.rows[fits]] = back[fits]
    unit, extra = unit_rows(far_projected[~fits])
    return projected, reference, _FarRows(far.rows[~fits], unit, far.exponents[~fits] + extra)


def _fit_gaussian(
    reference: NDArray[np.float64], shrinkage: str
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``(mean, covariance)`` of the reference rows with the chosen shrinkage estimator."""
    from sklearn.covariance import OAS, EmpiricalCovariance, LedoitWolf

    estimator = {"ledoit_wolf": LedoitWolf, "oas": OAS, "none": EmpiricalCovariance}[shrinkage]()
    estimator.fit(reference)
    location = np.asarray(estimator.location_, dtype=np.float64)
    return location, np.asarray(estimator.covariance_, dtype=np.float64)


def _norms_over_ridge(
    differences: NDArray[np.float64], far: _FarRows, ridge: float, exponent: int
) -> NDArray[np.float64]:
    """``||x - mu||^2 / ridge`` for the near rows' ``differences`` and then the far rows, as ``v * 2**k``.

    Used when the reference is tiny and the ridge huge: the covariance is then ``ridge * I`` to float64
    precision (its own entries are <= 4 after scaling).
    """
    mantissa, ridge_exponent = math.frexp(ridge)
    near_unit, near_exponents = unit_rows(differences)
    units = np.concatenate([near_unit, far.unit])
    exponents = np.concatenate([near_exponents, far.exponents]) * 2 + 2 * exponent - ridge_exponent
    norms = np.einsum("ij,ij->i", units, units) / mantissa
    with np.errstate(over="ignore", under="ignore"):
        return np.asarray(np.ldexp(norms, exponents), dtype=np.float64)


def _whitener(
    covariance: NDArray[np.float64], rows: int, shrinkage: str, ridge: float
) -> Callable[[NDArray[np.float64]], NDArray[np.float64]]:
    """Cholesky-factor the covariance; return ``d -> ||L^{-1} d||^2`` for the columns of ``d.T``.

    A sum of squares is never negative (unlike ``d . cho_solve(d)``). A numerically singular covariance
    (a pivot ratio at rounding level) is refused with advice.
    """
    import scipy.linalg

    dim = covariance.shape[0]
    singular_msg = (
        f"`reference_emb` gives a numerically singular covariance ({rows} rows in {dim} "
        f"dimensions, shrinkage={shrinkage!r}, ridge={ridge:g}); set `ridge` > 0, use shrinkage='oas' or "
        "'ledoit_wolf', or reduce the dimension with `n_components`."
    )
    try:
        factor, lower = scipy.linalg.cho_factor(covariance, lower=True, check_finite=False)
    except np.linalg.LinAlgError as error:
        raise InputError(singular_msg) from error
    pivots = np.square(np.diag(factor))
    if pivots.min() / pivots.max() <= dim * np.finfo(np.float64).eps:  # a ratio: a huge ridge cannot overflow
        raise InputError(singular_msg)

    def whitened_norms(differences: NDArray[np.float64]) -> NDArray[np.float64]:
        whitened = scipy.linalg.solve_triangular(factor, differences.T, lower=lower, check_finite=False)
        return np.asarray(np.einsum("ij,ij->j", whitened, whitened), dtype=np.float64)

    return whitened_norms


def _squared_mahalanobis(
    policy: NDArray[np.float64],
    reference: NDArray[np.float64],
    shrinkage: str,
    n_components: int | None,
    ridge: float,
) -> NDArray[np.float64]:
    """Squared Mahalanobis distances of policy rows under a Gaussian fitted to the reference rows.

    Data inside :data:`~loopguard.signals._embeddings.SAFE_RANGE` goes through the plain formulas.
    Otherwise the computation runs on rescaled data, and a row whose difference from the mean does not fit
    in float64 is carried as ``v * 2**k`` (a "far" row). Entries beyond float64's range are ``+inf``.
    """
    policy, reference, halves, exponent = to_reference_scale(policy, reference)
    far = _far_rows(policy, halves, exponent)
    if n_components is not None:
        policy, reference, far = _project_on_components(policy, reference, n_components, far)
    near = np.setdiff1d(np.arange(policy.shape[0]), far.rows)
    squared = np.full(policy.shape[0], np.inf)
    location, covariance = _fit_gaussian(reference, shrinkage)
    with np.errstate(over="ignore", under="ignore"):
        scaled_ridge = float(np.ldexp(ridge, -2 * exponent))
    if not math.isfinite(scaled_ridge):
        squared[np.concatenate([near, far.rows])] = _norms_over_ridge(
            policy[near] - location, far, ridge, exponent
        )
        return squared
    covariance = covariance + scaled_ridge * np.eye(reference.shape[1])
    whitened_norms = _whitener(covariance, reference.shape[0], shrinkage, ridge)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        squared[near] = whitened_norms(policy[near] - location)
        redo = near[~np.isfinite(squared[near])]
        if redo.size:  # an intermediate overflowed: whiten each such row as v * 2**k
            unit, unit_exponents = unit_rows(policy[redo] - location)
            squared[redo] = np.ldexp(whitened_norms(unit), 2 * unit_exponents)
        if far.rows.size:
            squared[far.rows] = np.ldexp(whitened_norms(far.unit), 2 * far.exponents)
    return squared


def squared_mahalanobis_distances(
    policy_emb: object,
    reference_emb: object,
    *,
    shrinkage: CovarianceShrinkage = "ledoit_wolf",
    n_components: int | None = None,
    ridge: float = 1e-3,
) -> NDArray[np.float64]:
    r"""Squared Mahalanobis distance of each policy latent from a Gaussian fitted to the reference latents.

    The building block of :func:`mahalanobis_outlier_fraction` (InfoRM, journal version). Optionally both
    sets are first projected onto the top ``n_components`` principal components of the *reference*
    latents (:class:`sklearn.decomposition.PCA`, exact SVD). The authors reduce to 75 dimensions with UMAP;
    loopguard offers PCA instead so that no extra dependency is needed (PCA is linear: it keeps Mahalanobis
    geometry within the retained subspace but drops everything orthogonal to it). Then the mean ``mu`` and
    covariance are estimated on the reference, a ridge ``lambda * I`` is added, and the distance is computed
    through a Cholesky factorisation (never an explicit inverse).

    .. math::

        \Sigma = \hat\Sigma_{\text{shrinkage}}(S) + \lambda I, \qquad
        d^2(x) = (x - \mu)^\top \Sigma^{-1} (x - \mu) = \lVert L^{-1}(x - \mu) \rVert_2^2,
        \quad \Sigma = L L^\top

    The ridge is absolute, in the squared units of your embeddings: with the default ``1e-3`` it is
    negligible for latents whose per-coordinate variance is ~1 but dominates for, e.g., unit-normalised
    768-d sentence embeddings (per-coordinate variance ~1/768); scale it to your data.

    Args:
        policy_emb: ``[N, D]`` policy latents; ``1 <= N <= MAX_TRAJECTORIES`` (100,000), ``D <=
            MAX_EMBEDDING_DIM`` (65,536) (DoS caps); finite.
        reference_emb: ``[M, D]`` reference (SFT) latents; ``M >= 2``, same ``D``, same caps.
        shrinkage: Covariance estimator fitted on the reference: ``"ledoit_wolf"`` (default, as in the
            paper; :class:`sklearn.covariance.LedoitWolf`), ``"oas"`` (:class:`sklearn.covariance.OAS`) or
            ``"none"`` (maximum-likelihood :class:`sklearn.covariance.EmpiricalCovariance`, divides by ``M``).
        n_components: ``None`` (default: no reduction) or an integer in ``[1, min(M, D)]``. Components past
            the ``M - 1``-th carry no reference variance, so only the ridge keeps them invertible.
        ridge: ``lambda >= 0`` added to the covariance diagonal (default ``1e-3``, as in the paper).

    Returns:
        ``[N]`` float64 array of squared distances, finite and >= 0.

    Raises:
        LoopguardTypeError: bool or non-numeric scalars, non-numeric arrays.
        ConfigError: unknown ``shrinkage``, ``n_components`` out of range, ``ridge`` negative or not finite.
        InputError: arrays not 2-D, empty, non-finite, over a DoS cap, of different ``D``; fewer than 2
            reference rows; a numerically singular covariance (only possible with ``ridge=0``, e.g. a
            constant reference or ``M <= D`` without shrinkage).

    Example:
        >>> reference = [[-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]]  # mean 0, covariance 0.5 * I
        >>> squared_mahalanobis_distances([[1.0, 0.0], [3.0, 4.0]], reference, shrinkage="none", ridge=0.0)
        array([ 2., 50.])

    References:
        Miao, Y., Ding, L., Zhang, S., Bao, R., Zhang, L., and Tao, D. (2025). Information-Theoretic Reward
        Modeling for Stable RLHF: Detecting and Mitigating Reward Hacking. arXiv:2510.13694 (journal
        version of InfoRM, Miao et al. 2024, arXiv:2402.09345).

        Ledoit, O., and Wolf, M. (2004). A well-conditioned estimator for large-dimensional covariance
        matrices. Journal of Multivariate Analysis 88(2).

        Chen, Y., Wiesel, A., Eldar, Y. C., and Hero, A. O. (2010). Shrinkage Algorithms for MMSE Covariance
        Estimation. IEEE Transactions on Signal Processing 58(10).
    """
    policy, reference, shrinkage_name, components, ridge_value = _validated_mahalanobis_inputs(
        policy_emb, reference_emb, shrinkage, n_components, ridge
    )
    squared = _squared_mahalanobis(policy, reference, shrinkage_name, components, ridge_value)
    if not np.isfinite(squared).all():
        row = int(np.argmax(~np.isfinite(squared)))
        msg = (
            f"`policy_emb` must lie within float64's reach of `reference_emb`, got row {row} whose squared "
            "Mahalanobis distance is beyond ~1.8e308 (mahalanobis_outlier_fraction counts such rows as "
            "outliers)."
        )
        raise InputError(msg)
    return squared


def mahalanobis_outlier_fraction(
    policy_emb: object,
    reference_emb: object,
    *,
    alpha: float = 0.05,
    shrinkage: CovarianceShrinkage = "ledoit_wolf",
    n_components: int | None = None,
    ridge: float = 1e-3,
) -> float:
    r"""Mahalanobis Outlier Probability (MOP): share of policy latents that are outliers w.r.t. the reference.

    The InfoRM journal version's measure of reward-hacking severity. A Gaussian is fitted to the reference
    (SFT) latents; each policy latent gets its squared Mahalanobis distance ``d^2`` (see
    :func:`squared_mahalanobis_distances`, which this function uses), a p-value from the chi-square
    distribution with ``D'`` degrees of freedom (``D' = n_components`` or ``D``), and MOP is the fraction of
    policy latents with ``p < alpha``. It rises as policy responses leave the region the reference occupies.

    The embeddings are whatever you supply (InfoRM latent, reward-model hidden state at EOS, sentence
    encoder); MOP is about outliers in that latent space, never about scalar rewards.

    .. math::

        p_j = 1 - F_{\chi^2_{D'}}\big(d^2(r_j)\big), \qquad
        \mathrm{MOP} = \frac{1}{N} \sum_{j=1}^{N} \mathbf{1}[p_j < \alpha]

    **Calibration.** ``MOP ~ alpha`` for an unchanged policy holds only if the latents are roughly Gaussian
    and ``M`` is much larger than ``D'``. With ``M`` comparable to ``D'`` the estimated covariance is noisy,
    out-of-sample distances are inflated (a Hotelling-type effect) and MOP exceeds ``alpha`` even with no
    hack; shrinkage and the ridge move it the other way. Reduce with ``n_components`` (the authors use 75
    dimensions) and compare MOP with its own warm-up level rather than with ``alpha``.

    Args:
        policy_emb: ``[N, D]`` policy latents; ``1 <= N <= MAX_TRAJECTORIES`` (100,000), ``D <=
            MAX_EMBEDDING_DIM`` (65,536) (DoS caps); finite.
        reference_emb: ``[M, D]`` reference (SFT) latents; ``M >= 2``, same ``D``, same caps.
        alpha: Outlier level, in (0, 1) (default 0.05; the paper does not publish its value).
        shrinkage: ``"ledoit_wolf"`` (default), ``"oas"`` or ``"none"``; see
            :func:`squared_mahalanobis_distances`.
        n_components: ``None`` (default) or the number of reference principal components to keep, in
            ``[1, min(M, D)]``.
        ridge: ``lambda >= 0`` added to the covariance diagonal (default ``1e-3``, as in the paper).

    Returns:
        MOP as a python ``float`` in ``[0, 1]``.

    Raises:
        LoopguardTypeError: bool or non-numeric scalars, non-numeric arrays.
        ConfigError: ``alpha`` outside (0, 1), unknown ``shrinkage``, ``n_components`` out of range, bad
            ``ridge``.
        InputError: as :func:`squared_mahalanobis_distances`.

    Example:
        >>> reference = [[-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]]
        >>> policy = [[1.0, 0.0], [3.0, 4.0]]  # d^2 = 2 (p = e^-1) and 50 (p = e^-25)
        >>> mahalanobis_outlier_fraction(policy, reference, shrinkage="none", ridge=0.0)
        0.5

    References:
        Miao, Y., Ding, L., Zhang, S., Bao, R., Zhang, L., and Tao, D. (2025). Information-Theoretic Reward
        Modeling for Stable RLHF: Detecting and Mitigating Reward Hacking. arXiv:2510.13694 (journal
        version of InfoRM, Miao et al. 2024, arXiv:2402.09345).
    """
    policy, reference, shrinkage_name, components, ridge_value = _validated_mahalanobis_inputs(
        policy_emb, reference_emb, shrinkage, n_components, ridge
    )
    alpha_value = check_real("alpha", alpha, lo=0.0, hi=1.0, lo_inclusive=False, hi_inclusive=False)
    squared = _squared_mahalanobis(policy, reference, shrinkage_name, components, ridge_value)
    dof = components if components is not None else reference.shape[1]
    from scipy.stats import chi2

    p_values = chi2.sf(squared, df=dof)
    return float(np.mean(p_values < alpha_value))
