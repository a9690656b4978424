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

from typing import Literal, get_args

import numpy as np
import scipy.linalg
from numpy.typing import NDArray
from scipy.stats import chi2
from sklearn.cluster import DBSCAN
from sklearn.covariance import OAS, EmpiricalCovariance, LedoitWolf
from sklearn.decomposition import PCA
from sklearn.metrics import pairwise_distances_argmin

from loopguard._validation import (
    MAX_EMBEDDING_DIM,
    MAX_TRAJECTORIES,
    as_float_array,
    check_bool,
    check_choice,
    check_int,
    check_real,
)
from loopguard.exceptions import InputError

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


def _as_embeddings(name: str, value: object) -> NDArray[np.float64]:
    """Validate one ``[rows, dim]`` batch of finite embeddings within the DoS caps."""
    array = as_float_array(name, value, ndim=2, max_len=MAX_TRAJECTORIES)
    if array.shape[1] > MAX_EMBEDDING_DIM:
        msg = f"`{name}` must have at most {MAX_EMBEDDING_DIM:,} columns (DoS cap), got {array.shape[1]:,}."
        raise InputError(msg)
    return array


def _as_embedding_pair(
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


def _reject_zero_rows(name: str, array: NDArray[np.float64]) -> None:
    """Cosine distance is undefined for a zero vector: refuse such rows with their index."""
    zero = ~np.any(array != 0.0, axis=1)
    if zero.any():
        row = int(np.argmax(zero))
        msg = (
            f"`{name}` must not contain all-zero rows when `metric` is 'cosine' "
            f"(cosine distance is undefined for a zero vector), got one at row {row}."
        )
        raise InputError(msg)


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
    policy, reference = _as_embedding_pair(policy_emb, reference_emb)
    eps_value = check_real("eps", eps, lo=0.0, lo_inclusive=False)
    min_samples_value = check_int("min_samples", min_samples, lo=1)
    metric_name = check_choice("metric", metric, _CSI_METRICS)
    include_noise_flag = check_bool("include_noise", include_noise)
    normalize_flag = check_bool("normalize", normalize)
    if metric_name == "cosine":
        _reject_zero_rows("policy_emb", policy)
        _reject_zero_rows("reference_emb", reference)

    labels = DBSCAN(eps=eps_value, min_samples=min_samples_value, metric=metric_name).fit_predict(policy)
    labels = np.asarray(labels, dtype=np.int64)
    noise = labels < 0
    if include_noise_flag and noise.any():
        # Every noise point becomes its own cluster, numbered after DBSCAN's clusters.
        labels = labels.copy()
        labels[noise] = labels.max(initial=-1) + 1 + np.arange(int(noise.sum()), dtype=np.int64)
        noise = labels < 0
    members = policy[~noise]
    member_labels = labels[~noise]
    if member_labels.size == 0:
        return 0.0

    # Cluster sums in one pass: sort members by label, then add up each contiguous run.
    counts = np.bincount(member_labels)  # DBSCAN numbers clusters 0..n-1, none empty
    order = np.argsort(member_labels, kind="stable")
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    centroids = np.add.reduceat(members[order], starts, axis=0) / counts[:, None]

    # Nearest reference point per centroid (chunked, memory-bounded), then the exact distance to it.
    nearest = pairwise_distances_argmin(centroids, reference, metric=metric_name)
    distances = _paired_distances(centroids, reference[nearest], metric_name)
    total = float(np.dot(counts.astype(np.float64), distances))
    if normalize_flag:
        total /= policy.shape[0]
    return total


def _validated_mahalanobis_inputs(
    policy_emb: object, reference_emb: object, shrinkage: object, n_components: object, ridge: object
) -> tuple[NDArray[np.float64], NDArray[np.float64], str, int | None, float]:
    """Validate the arguments shared by the Mahalanobis functions."""
    policy, reference = _as_embedding_pair(policy_emb, reference_emb)
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


def _squared_mahalanobis(
    policy: NDArray[np.float64],
    reference: NDArray[np.float64],
    shrinkage: str,
    n_components: int | None,
    ridge: float,
) -> NDArray[np.float64]:
    """Squared Mahalanobis distances of policy rows under a Gaussian fitted to the reference rows."""
    if n_components is not None:
        pca = PCA(n_components=n_components, svd_solver="full").fit(reference)
        reference = np.asarray(pca.transform(reference), dtype=np.float64)
        policy = np.asarray(pca.transform(policy), dtype=np.float64)
    estimator = {"ledoit_wolf": LedoitWolf, "oas": OAS, "none": EmpiricalCovariance}[shrinkage]()
    estimator.fit(reference)
    dim = reference.shape[1]
    covariance = np.asarray(estimator.covariance_, dtype=np.float64) + ridge * np.eye(dim)
    location = np.asarray(estimator.location_, dtype=np.float64)
    singular_msg = (
        f"`reference_emb` gives a numerically singular covariance ({reference.shape[0]} rows in {dim} "
        f"dimensions, shrinkage={shrinkage!r}, ridge={ridge:g}); set `ridge` > 0, use shrinkage='oas' or "
        "'ledoit_wolf', or reduce the dimension with `n_components`."
    )
    try:
        factor, lower = scipy.linalg.cho_factor(covariance, lower=True, check_finite=False)
    except np.linalg.LinAlgError as error:
        raise InputError(singular_msg) from error
    pivots = np.square(np.diag(factor))
    if pivots.min() <= pivots.max() * dim * np.finfo(np.float64).eps:
        raise InputError(singular_msg)
    # d^2 = ||L^{-1} (x - mu)||^2: a sum of squares, so never negative (unlike diff . cho_solve(diff)).
    whitened = scipy.linalg.solve_triangular(factor, (policy - location).T, lower=lower, check_finite=False)
    return np.asarray(np.einsum("ij,ij->j", whitened, whitened), dtype=np.float64)


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
    return _squared_mahalanobis(policy, reference, shrinkage_name, components, ridge_value)


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
    p_values = chi2.sf(squared, df=dof)
    return float(np.mean(p_values < alpha_value))
