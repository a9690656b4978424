"""Tests for the InfoRM latent-space signals (CSI and MOP)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.spatial import distance as sp_distance
from scipy.stats import chi2
from sklearn.cluster import DBSCAN
from sklearn.covariance import OAS, EmpiricalCovariance, LedoitWolf
from sklearn.decomposition import PCA
from threadpoolctl import threadpool_limits

from loopguard._validation import MAX_EMBEDDING_DIM, MAX_TRAJECTORIES
from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError
from loopguard.signals import (
    cluster_separation_index,
    mahalanobis_outlier_fraction,
    squared_mahalanobis_distances,
)


@pytest.fixture(autouse=True, scope="module")
def _single_openmp_thread():
    # sklearn's DBSCAN/nearest-neighbour reductions (OpenMP) and BLAS run thread pools; on tiny inputs on a
    # busy machine their spin-waiting dominates (4x slower here). Results do not depend on the thread count.
    with threadpool_limits(limits=1):
        yield


# --------------------------------------------------------------------------------------------------
# naive references

_SCIPY_METRIC = {
    "euclidean": sp_distance.euclidean,
    "manhattan": sp_distance.cityblock,
    "cosine": sp_distance.cosine,
}


def naive_csi(policy, reference, eps, min_samples, metric="euclidean", include_noise=False, normalize=False):
    policy = np.asarray(policy, dtype=float)
    reference = np.asarray(reference, dtype=float)
    labels = DBSCAN(eps=eps, min_samples=min_samples, metric=metric).fit_predict(policy)
    groups: dict[object, list[int]] = {}
    for index, label in enumerate(labels):
        if label == -1:
            if include_noise:
                groups[("noise", index)] = [index]
            continue
        groups.setdefault(int(label), []).append(index)
    dist = _SCIPY_METRIC[metric]
    total = 0.0
    for members in groups.values():
        centroid = [0.0] * policy.shape[1]
        for index in members:
            for k in range(policy.shape[1]):
                centroid[k] += policy[index, k]
        centroid = np.array([value / len(members) for value in centroid])
        best = math.inf
        for point in reference:
            best = min(best, dist(centroid, point))
        total += len(members) * best
    if normalize:
        total /= len(policy)
    return total


def naive_squared_mahalanobis(policy, reference, shrinkage="ledoit_wolf", n_components=None, ridge=1e-3):
    policy = np.asarray(policy, dtype=float)
    reference = np.asarray(reference, dtype=float)
    if n_components is not None:
        pca = PCA(n_components=n_components, svd_solver="full").fit(reference)
        reference, policy = pca.transform(reference), pca.transform(policy)
    estimator = {"ledoit_wolf": LedoitWolf, "oas": OAS, "none": EmpiricalCovariance}[shrinkage]().fit(
        reference
    )
    inverse = np.linalg.inv(estimator.covariance_ + ridge * np.eye(reference.shape[1]))
    mean = reference.mean(axis=0)
    out = []
    for row in policy:
        diff = row - mean
        out.append(float(diff @ inverse @ diff))
    return np.array(out)


def naive_mop(policy, reference, alpha=0.05, **kwargs):
    squared = naive_squared_mahalanobis(policy, reference, **kwargs)
    dof = kwargs.get("n_components") or np.asarray(reference).shape[1]
    flags = [chi2.sf(value, dof) < alpha for value in squared]
    return sum(flags) / len(flags)


def blobs(rng, centers, per_cluster, scale):
    return np.concatenate(
        [center + scale * rng.normal(size=(per_cluster, len(center))) for center in centers]
    )


# --------------------------------------------------------------------------------------------------
# CSI: hand-computed cases

# Cluster A: (-1, 0), (1, 0) -> centroid (0, 0), distance 5 to (3, 4).
# Cluster B: (3, 7), (3, 8), (3, 9) -> centroid (3, 8), distance 4 to (3, 4).
# Noise: (50, 4), distance 47 to (3, 4).
HAND_POLICY = [[-1.0, 0.0], [1.0, 0.0], [3.0, 7.0], [3.0, 8.0], [3.0, 9.0], [50.0, 4.0]]
HAND_REFERENCE = [[3.0, 4.0]]


def test_csi_hand_computed_two_clusters():
    assert cluster_separation_index(HAND_POLICY, HAND_REFERENCE, eps=2.5, min_samples=2) == pytest.approx(
        2 * 5 + 3 * 4
    )


def test_csi_hand_computed_include_noise():
    value = cluster_separation_index(HAND_POLICY, HAND_REFERENCE, eps=2.5, min_samples=2, include_noise=True)
    assert value == pytest.approx(2 * 5 + 3 * 4 + 47)


def test_csi_hand_computed_normalize_both_noise_modes():
    excluded = cluster_separation_index(HAND_POLICY, HAND_REFERENCE, eps=2.5, min_samples=2, normalize=True)
    included = cluster_separation_index(
        HAND_POLICY, HAND_REFERENCE, eps=2.5, min_samples=2, include_noise=True, normalize=True
    )
    assert excluded == pytest.approx(22 / 6)
    assert included == pytest.approx(69 / 6)


def test_csi_nearest_reference_is_chosen_per_cluster():
    # Two reference points: cluster A's nearest is (0, -2) (distance 2), cluster B's is (3, 4) (distance 4).
    reference = [[3.0, 4.0], [0.0, -2.0]]
    value = cluster_separation_index(HAND_POLICY, reference, eps=2.5, min_samples=2)
    assert value == pytest.approx(2 * 2 + 3 * 4)


def test_csi_all_noise_is_zero_unless_noise_included():
    policy = [[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]]
    reference = [[0.0, 0.0]]
    assert cluster_separation_index(policy, reference, eps=1.0, min_samples=2) == 0.0
    assert cluster_separation_index(policy, reference, eps=1.0, min_samples=2, include_noise=True) == (
        pytest.approx(0.0 + 10.0 + 10.0)
    )


def test_csi_policy_on_top_of_reference_is_zero():
    points = [[1.0, 2.0], [1.0, 2.0], [1.0, 2.0]]
    assert cluster_separation_index(points, points, eps=0.5, min_samples=2) == 0.0


def test_csi_min_samples_one_makes_every_point_a_cluster():
    policy = [[0.0], [10.0], [20.0]]
    reference = [[0.0]]
    assert cluster_separation_index(policy, reference, eps=1.0, min_samples=1) == pytest.approx(30.0)


def test_csi_cosine_hand_computed():
    # Cluster along (1, 0): centroid (1.5, 0), cosine distance 1 to (0, 1).
    # Cluster along (1, 1): centroid (2, 2), cosine distance 1 - 1/sqrt(2) to (0, 1).
    policy = [[1.0, 0.0], [2.0, 0.0], [1.0, 1.0], [3.0, 3.0]]
    reference = [[0.0, 1.0]]
    value = cluster_separation_index(policy, reference, eps=0.1, min_samples=2, metric="cosine")
    assert value == pytest.approx(2 * 1.0 + 2 * (1.0 - 1.0 / math.sqrt(2.0)))


def test_csi_cosine_ignores_a_common_scale():
    # Cosine DBSCAN ignores row norms; multiplying a whole set by a constant scales its raw-space centroids by
    # that constant, which cosine distance ignores too.
    rng = np.random.default_rng(3)
    policy = blobs(rng, [np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0])], 10, 0.05)
    reference = rng.normal(size=(15, 3))
    base = cluster_separation_index(policy, reference, eps=0.05, min_samples=3, metric="cosine")
    scaled = cluster_separation_index(
        policy * 3.0, reference * 0.25, eps=0.05, min_samples=3, metric="cosine"
    )
    assert base > 0.0
    assert scaled == pytest.approx(base, rel=1e-9)


def test_csi_manhattan_hand_computed():
    policy = [[0.0, 0.0], [2.0, 0.0]]  # one cluster (eps 2.5), centroid (1, 0)
    reference = [[4.0, 4.0]]  # L1 distance 3 + 4
    assert cluster_separation_index(policy, reference, eps=2.5, min_samples=2, metric="manhattan") == (
        pytest.approx(2 * 7.0)
    )


def test_csi_returns_python_float():
    value = cluster_separation_index(HAND_POLICY, HAND_REFERENCE, eps=2.5, min_samples=2)
    assert type(value) is float


def test_csi_accepts_numpy_integer_and_float32():
    policy = np.asarray(HAND_POLICY, dtype=np.float32)
    value = cluster_separation_index(
        policy, np.asarray(HAND_REFERENCE), eps=np.float64(2.5), min_samples=np.int64(2)
    )
    assert value == pytest.approx(22.0)


# --------------------------------------------------------------------------------------------------
# CSI: against the naive reference


@pytest.mark.parametrize("metric", ["euclidean", "cosine", "manhattan"])
@pytest.mark.parametrize("include_noise", [False, True])
@pytest.mark.parametrize("normalize", [False, True])
def test_csi_matches_naive_reference_random_blobs(metric, include_noise, normalize):
    rng = np.random.default_rng(7)
    centers = [rng.normal(size=5) * 6.0 for _ in range(3)]
    policy = np.concatenate([blobs(rng, centers, 12, 0.3), rng.normal(size=(6, 5)) * 10.0])
    reference = rng.normal(size=(25, 5)) * 3.0
    eps = {"euclidean": 1.2, "manhattan": 2.5, "cosine": 0.02}[metric]
    expected = naive_csi(policy, reference, eps, 4, metric, include_noise, normalize)
    value = cluster_separation_index(
        policy,
        reference,
        eps=eps,
        min_samples=4,
        metric=metric,
        include_noise=include_noise,
        normalize=normalize,
    )
    assert expected > 0.0
    assert value == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_csi_matches_naive_reference_high_dim():
    rng = np.random.default_rng(11)
    centers = [rng.normal(size=64) * 3.0 for _ in range(4)]
    policy = blobs(rng, centers, 20, 0.1)
    reference = rng.normal(size=(50, 64))
    expected = naive_csi(policy, reference, 2.0, 5)
    assert cluster_separation_index(policy, reference, eps=2.0, min_samples=5) == pytest.approx(
        expected, rel=1e-9
    )


def test_csi_rises_when_a_cluster_moves_away():
    rng = np.random.default_rng(5)
    reference = rng.normal(size=(40, 4))
    near = blobs(rng, [np.zeros(4)], 30, 0.2)
    far = near + np.array([8.0, 0.0, 0.0, 0.0])
    kwargs = {"eps": 0.8, "min_samples": 5}
    assert cluster_separation_index(far, reference, **kwargs) > 5 * cluster_separation_index(
        near, reference, **kwargs
    )


# --------------------------------------------------------------------------------------------------
# CSI: properties

# Integer coordinates with a half-integer eps keep every pairwise distance well away from eps, so DBSCAN's
# neighbourhoods are not decided by rounding.
_small_points = st.integers(min_value=1, max_value=4).flatmap(
    lambda dim: st.tuples(
        hnp.arrays(np.float64, st.tuples(st.integers(1, 12), st.just(dim)), elements=st.integers(-5, 5)),
        hnp.arrays(np.float64, st.tuples(st.integers(1, 8), st.just(dim)), elements=st.integers(-5, 5)),
    )
)


@settings(max_examples=50, deadline=None)
@given(
    data=_small_points,
    eps_half=st.integers(0, 4),
    min_samples=st.integers(1, 4),
    include_noise=st.booleans(),
    normalize=st.booleans(),
)
def test_csi_property_nonnegative_finite_and_matches_naive(
    data, eps_half, min_samples, include_noise, normalize
):
    policy, reference = data
    eps = eps_half + 0.5
    value = cluster_separation_index(
        policy, reference, eps=eps, min_samples=min_samples, include_noise=include_noise, normalize=normalize
    )
    assert math.isfinite(value)
    assert value >= 0.0
    expected = naive_csi(policy, reference, eps, min_samples, "euclidean", include_noise, normalize)
    assert value == pytest.approx(expected, rel=1e-9, abs=1e-9)


@settings(max_examples=50, deadline=None)
@given(
    data=_small_points,
    eps_half=st.integers(0, 4),
    min_samples=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_csi_property_reference_permutation_invariant(data, eps_half, min_samples, seed):
    policy, reference = data
    permuted = reference[np.random.default_rng(seed).permutation(len(reference))]
    kwargs = {"eps": eps_half + 0.5, "min_samples": min_samples, "include_noise": True}
    assert cluster_separation_index(policy, permuted, **kwargs) == pytest.approx(
        cluster_separation_index(policy, reference, **kwargs), rel=1e-12, abs=1e-12
    )


@settings(max_examples=50, deadline=None)
@given(
    data=_small_points,
    eps_half=st.integers(0, 4),
    min_samples=st.integers(1, 2),
    seed=st.integers(0, 2**32 - 1),
)
def test_csi_property_policy_permutation_invariant_without_border_points(data, eps_half, min_samples, seed):
    # With min_samples <= 2 there are no border points (a point with any neighbour is core), so DBSCAN's
    # clusters are the connected components of the eps-graph and do not depend on row order.
    policy, reference = data
    permuted = policy[np.random.default_rng(seed).permutation(len(policy))]
    kwargs = {"eps": eps_half + 0.5, "min_samples": min_samples, "include_noise": False}
    assert cluster_separation_index(permuted, reference, **kwargs) == pytest.approx(
        cluster_separation_index(policy, reference, **kwargs), rel=1e-12, abs=1e-12
    )


@settings(max_examples=50, deadline=None)
@given(
    data=_small_points,
    eps_half=st.integers(0, 4),
    min_samples=st.integers(1, 4),
    scale=st.floats(0.01, 100.0),
    include_noise=st.booleans(),
)
def test_csi_property_scales_with_data_and_eps(data, eps_half, min_samples, scale, include_noise):
    policy, reference = data
    eps = eps_half + 0.5
    base = cluster_separation_index(
        policy, reference, eps=eps, min_samples=min_samples, include_noise=include_noise
    )
    scaled = cluster_separation_index(
        policy * scale,
        reference * scale,
        eps=eps * scale,
        min_samples=min_samples,
        include_noise=include_noise,
    )
    assert scaled == pytest.approx(scale * base, rel=1e-9, abs=1e-9)


@settings(max_examples=50, deadline=None)
@given(data=_small_points, eps_half=st.integers(0, 4), min_samples=st.integers(1, 4))
def test_csi_property_including_noise_never_lowers_csi(data, eps_half, min_samples):
    policy, reference = data
    kwargs = {"eps": eps_half + 0.5, "min_samples": min_samples}
    without = cluster_separation_index(policy, reference, **kwargs)
    with_noise = cluster_separation_index(policy, reference, include_noise=True, **kwargs)
    assert with_noise >= without - 1e-12


# --------------------------------------------------------------------------------------------------
# CSI: bad input


def test_csi_rejects_wrong_ndim():
    with pytest.raises(InputError, match=re.escape("`policy_emb` must be a 2-D array, got shape (3,).")):
        cluster_separation_index([1.0, 2.0, 3.0], [[1.0]], eps=1.0, min_samples=1)
    with pytest.raises(
        InputError, match=re.escape("`reference_emb` must be a 2-D array, got shape (1, 1, 1).")
    ):
        cluster_separation_index([[1.0]], [[[1.0]]], eps=1.0, min_samples=1)


def test_csi_rejects_dimension_mismatch():
    message = "`policy_emb` and `reference_emb` must have the same embedding dimension, got 2 and 3."
    with pytest.raises(InputError, match=re.escape(message)):
        cluster_separation_index([[1.0, 2.0]], [[1.0, 2.0, 3.0]], eps=1.0, min_samples=1)


def test_csi_rejects_empty():
    with pytest.raises(InputError, match=re.escape("`policy_emb` must not be empty, got shape (0, 2).")):
        cluster_separation_index(np.zeros((0, 2)), [[1.0, 2.0]], eps=1.0, min_samples=1)
    with pytest.raises(InputError, match=re.escape("`reference_emb` must not be empty, got shape (1, 0).")):
        cluster_separation_index([[1.0]], np.zeros((1, 0)), eps=1.0, min_samples=1)


def test_csi_rejects_nan_and_inf():
    with pytest.raises(InputError, match=re.escape("`policy_emb` must be finite, got nan at index (0, 1).")):
        cluster_separation_index([[1.0, float("nan")]], [[1.0, 2.0]], eps=1.0, min_samples=1)
    with pytest.raises(
        InputError, match=re.escape("`reference_emb` must be finite, got inf at index (1, 0).")
    ):
        cluster_separation_index([[1.0, 2.0]], [[1.0, 2.0], [float("inf"), 0.0]], eps=1.0, min_samples=1)


def test_csi_rejects_boolean_arrays():
    with pytest.raises(LoopguardTypeError, match=re.escape("`policy_emb` must hold numbers, got booleans")):
        cluster_separation_index([[True, False]], [[1.0, 2.0]], eps=1.0, min_samples=1)


def test_csi_rejects_bad_eps():
    with pytest.raises(
        LoopguardTypeError, match=re.escape("`eps` must be a real number (not bool), got True.")
    ):
        cluster_separation_index(HAND_POLICY, HAND_REFERENCE, eps=True, min_samples=2)
    with pytest.raises(ConfigError, match=re.escape("`eps` must be > 0, got 0.0.")):
        cluster_separation_index(HAND_POLICY, HAND_REFERENCE, eps=0.0, min_samples=2)
    with pytest.raises(ConfigError, match=re.escape("`eps` must be finite, got inf.")):
        cluster_separation_index(HAND_POLICY, HAND_REFERENCE, eps=float("inf"), min_samples=2)
    with pytest.raises(ConfigError, match=re.escape("`eps` must be finite, got nan.")):
        cluster_separation_index(HAND_POLICY, HAND_REFERENCE, eps=float("nan"), min_samples=2)


def test_csi_rejects_bad_min_samples():
    with pytest.raises(
        LoopguardTypeError, match=re.escape("`min_samples` must be an integer (not bool), got True.")
    ):
        cluster_separation_index(HAND_POLICY, HAND_REFERENCE, eps=1.0, min_samples=True)
    with pytest.raises(
        LoopguardTypeError, match=re.escape("`min_samples` must be an integer, got 2.0 of type float.")
    ):
        cluster_separation_index(HAND_POLICY, HAND_REFERENCE, eps=1.0, min_samples=2.0)
    with pytest.raises(ConfigError, match=re.escape("`min_samples` must be >= 1, got 0.")):
        cluster_separation_index(HAND_POLICY, HAND_REFERENCE, eps=1.0, min_samples=0)


def test_csi_rejects_unknown_metric_listing_allowed():
    message = "`metric` must be one of 'cosine', 'euclidean', 'manhattan', got 'minkowski'."
    with pytest.raises(ConfigError, match=re.escape(message)):
        cluster_separation_index(HAND_POLICY, HAND_REFERENCE, eps=1.0, min_samples=2, metric="minkowski")


def test_csi_rejects_non_bool_flags():
    with pytest.raises(
        LoopguardTypeError, match=re.escape("`include_noise` must be a bool, got 1 of type int.")
    ):
        cluster_separation_index(HAND_POLICY, HAND_REFERENCE, eps=1.0, min_samples=2, include_noise=1)
    with pytest.raises(
        LoopguardTypeError, match=re.escape("`normalize` must be a bool, got 'yes' of type str.")
    ):
        cluster_separation_index(HAND_POLICY, HAND_REFERENCE, eps=1.0, min_samples=2, normalize="yes")


def test_csi_cosine_rejects_zero_rows():
    message = "`reference_emb` must not contain all-zero rows when `metric` is 'cosine'"
    with pytest.raises(InputError, match=re.escape(message) + r".*got one at row 1\."):
        cluster_separation_index(
            [[1.0, 0.0]], [[0.0, 1.0], [0.0, 0.0]], eps=0.1, min_samples=1, metric="cosine"
        )
    # A zero row is fine for the other metrics.
    assert cluster_separation_index([[0.0, 0.0]], [[3.0, 4.0]], eps=0.1, min_samples=1) == pytest.approx(5.0)


def test_csi_rejects_over_caps():
    with pytest.raises(InputError, match=re.escape(f"at most {MAX_EMBEDDING_DIM:,} columns (DoS cap)")):
        cluster_separation_index(np.zeros((1, MAX_EMBEDDING_DIM + 1)), [[0.0]], eps=1.0, min_samples=1)
    with pytest.raises(
        InputError, match=re.escape(f"`reference_emb` must have at most {MAX_TRAJECTORIES:,} rows")
    ):
        cluster_separation_index([[0.0]], np.zeros((MAX_TRAJECTORIES + 1, 1)), eps=1.0, min_samples=1)


# --------------------------------------------------------------------------------------------------
# Mahalanobis: hand-computed cases

# Mean 0 and maximum-likelihood covariance 0.5 * I.
DIAMOND = [[-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]]


def test_squared_mahalanobis_hand_computed():
    value = squared_mahalanobis_distances(
        [[1.0, 0.0], [3.0, 4.0], [0.0, 0.0]], DIAMOND, shrinkage="none", ridge=0.0
    )
    np.testing.assert_allclose(value, [2.0, 50.0, 0.0], rtol=1e-12, atol=1e-12)
    assert value.dtype == np.float64


def test_squared_mahalanobis_hand_computed_with_ridge():
    # covariance 0.5 * I + 0.5 * I = I: d^2 is the squared Euclidean norm.
    value = squared_mahalanobis_distances([[1.0, 0.0], [3.0, 4.0]], DIAMOND, shrinkage="none", ridge=0.5)
    np.testing.assert_allclose(value, [1.0, 25.0], rtol=1e-12)


def test_mop_hand_computed():
    # d^2 = 2 (p = exp(-1) = 0.368) and 50 (p = exp(-25)) with 2 degrees of freedom.
    policy = [[1.0, 0.0], [3.0, 4.0]]
    assert mahalanobis_outlier_fraction(policy, DIAMOND, shrinkage="none", ridge=0.0) == 0.5
    assert mahalanobis_outlier_fraction(policy, DIAMOND, alpha=0.37, shrinkage="none", ridge=0.0) == 1.0
    assert mahalanobis_outlier_fraction(policy, DIAMOND, alpha=0.36, shrinkage="none", ridge=0.0) == 0.5
    # exp(-25) = 1.39e-11: flagged only once alpha exceeds it.
    assert mahalanobis_outlier_fraction(policy, DIAMOND, alpha=1e-11, shrinkage="none", ridge=0.0) == 0.0
    assert mahalanobis_outlier_fraction(policy, DIAMOND, alpha=2e-11, shrinkage="none", ridge=0.0) == 0.5


def test_mop_hand_computed_pca_one_component():
    # Reference on a line along x with spread 4 in x and 0.1 in y; first component = x axis.
    reference = [[-2.0, 0.1], [2.0, -0.1], [-2.0, -0.1], [2.0, 0.1]]
    # After PCA to 1 dim: variance 4 (MLE), so d^2 = x^2 / 4 with df = 1.
    value = squared_mahalanobis_distances(
        [[4.0, 100.0], [0.0, 0.0]], reference, shrinkage="none", n_components=1, ridge=0.0
    )
    np.testing.assert_allclose(value, [4.0, 0.0], atol=1e-12)
    # chi2.sf(4, 1) = 0.0455 < 0.05: flagged; the y-offset of 100 is invisible after the reduction.
    mop = mahalanobis_outlier_fraction([[4.0, 100.0]], reference, shrinkage="none", n_components=1, ridge=0.0)
    assert mop == 1.0


def test_mop_returns_python_float():
    value = mahalanobis_outlier_fraction([[1.0, 0.0]], DIAMOND)
    assert type(value) is float


# --------------------------------------------------------------------------------------------------
# Mahalanobis: against the naive numpy implementation


@pytest.mark.parametrize("shrinkage", ["ledoit_wolf", "oas", "none"])
@pytest.mark.parametrize("n_components", [None, 1, 3])
@pytest.mark.parametrize("ridge", [0.0, 1e-3, 0.3])
def test_squared_mahalanobis_matches_naive(shrinkage, n_components, ridge):
    rng = np.random.default_rng(17)
    mixing = rng.normal(size=(6, 6))
    reference = rng.normal(size=(60, 6)) @ mixing + 2.0
    policy = rng.normal(size=(25, 6)) @ mixing + rng.normal(size=6)
    expected = naive_squared_mahalanobis(policy, reference, shrinkage, n_components, ridge)
    value = squared_mahalanobis_distances(
        policy, reference, shrinkage=shrinkage, n_components=n_components, ridge=ridge
    )
    np.testing.assert_allclose(value, expected, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("shrinkage", ["ledoit_wolf", "oas", "none"])
@pytest.mark.parametrize("n_components", [None, 2])
@pytest.mark.parametrize("alpha", [0.01, 0.05, 0.3])
def test_mop_matches_naive(shrinkage, n_components, alpha):
    rng = np.random.default_rng(23)
    reference = rng.normal(size=(80, 5)) * np.array([1.0, 2.0, 0.5, 3.0, 1.0])
    policy = rng.normal(size=(200, 5)) * 1.6
    expected = naive_mop(policy, reference, alpha, shrinkage=shrinkage, n_components=n_components, ridge=1e-3)
    value = mahalanobis_outlier_fraction(
        policy, reference, alpha=alpha, shrinkage=shrinkage, n_components=n_components
    )
    assert value == pytest.approx(expected, abs=1e-12)


def test_mop_same_distribution_is_close_to_alpha():
    rng = np.random.default_rng(2024)
    mixing = rng.normal(size=(3, 3))
    reference = rng.normal(size=(4000, 3)) @ mixing
    policy = rng.normal(size=(4000, 3)) @ mixing
    # Binomial standard error at alpha 0.05 and N 4000 is 0.0034; estimation noise with M 4000 adds less.
    for alpha in (0.05, 0.2):
        assert mahalanobis_outlier_fraction(policy, reference, alpha=alpha) == pytest.approx(alpha, abs=0.02)


def test_mop_shifted_policy_is_close_to_one():
    rng = np.random.default_rng(99)
    reference = rng.normal(size=(500, 8))
    policy = rng.normal(size=(300, 8)) + 4.0
    assert mahalanobis_outlier_fraction(policy, reference) > 0.99
    assert mahalanobis_outlier_fraction(policy, reference, n_components=4) > 0.95


def test_mop_high_dim_with_pca_runs_and_is_bounded():
    rng = np.random.default_rng(1)
    reference = rng.normal(size=(120, 200))
    policy = rng.normal(size=(60, 200))
    assert 0.0 <= mahalanobis_outlier_fraction(policy, reference, n_components=10) <= 1.0
    # n_components may equal min(M, D); the zero-variance last component is held up by the ridge.
    value = squared_mahalanobis_distances(policy, reference, n_components=120)
    assert value.shape == (60,)
    assert np.isfinite(value).all()


# --------------------------------------------------------------------------------------------------
# Mahalanobis: properties

_mahalanobis_data = st.integers(min_value=1, max_value=4).flatmap(
    lambda dim: st.tuples(
        hnp.arrays(np.float64, st.tuples(st.integers(1, 10), st.just(dim)), elements=st.integers(-20, 20)),
        hnp.arrays(np.float64, st.tuples(st.integers(2, 12), st.just(dim)), elements=st.integers(-20, 20)),
    )
)


@settings(max_examples=50, deadline=None)
@given(
    data=_mahalanobis_data,
    alpha=st.floats(1e-6, 1.0, exclude_max=True),
    shrinkage=st.sampled_from(["ledoit_wolf", "oas", "none"]),
)
def test_mop_property_in_unit_interval_and_nonnegative_distances(data, alpha, shrinkage):
    policy, reference = data
    squared = squared_mahalanobis_distances(policy, reference, shrinkage=shrinkage)
    assert squared.shape == (len(policy),)
    assert np.isfinite(squared).all()
    assert (squared >= 0.0).all()
    value = mahalanobis_outlier_fraction(policy, reference, alpha=alpha, shrinkage=shrinkage)
    assert 0.0 <= value <= 1.0
    assert not math.isnan(value)


@settings(max_examples=50, deadline=None)
@given(data=_mahalanobis_data, low=st.floats(1e-6, 0.5), high=st.floats(0.5, 1.0, exclude_max=True))
def test_mop_property_monotone_in_alpha(data, low, high):
    policy, reference = data
    assert mahalanobis_outlier_fraction(policy, reference, alpha=low) <= mahalanobis_outlier_fraction(
        policy, reference, alpha=high
    )


@settings(max_examples=50, deadline=None)
@given(data=_mahalanobis_data, seed=st.integers(0, 2**32 - 1))
def test_squared_mahalanobis_property_policy_permutation_equivariant(data, seed):
    policy, reference = data
    order = np.random.default_rng(seed).permutation(len(policy))
    np.testing.assert_array_equal(
        squared_mahalanobis_distances(policy[order], reference),
        squared_mahalanobis_distances(policy, reference)[order],
    )


@settings(max_examples=50, deadline=None)
@given(
    data=_mahalanobis_data,
    shift=st.floats(-50.0, 50.0),
    shrinkage=st.sampled_from(["ledoit_wolf", "oas", "none"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_squared_mahalanobis_property_translation_and_reference_order_invariant(data, shift, shrinkage, seed):
    policy, reference = data
    base = squared_mahalanobis_distances(policy, reference, shrinkage=shrinkage, ridge=0.1)
    moved = squared_mahalanobis_distances(policy + shift, reference + shift, shrinkage=shrinkage, ridge=0.1)
    shuffled = reference[np.random.default_rng(seed).permutation(len(reference))]
    reordered = squared_mahalanobis_distances(policy, shuffled, shrinkage=shrinkage, ridge=0.1)
    np.testing.assert_allclose(moved, base, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(reordered, base, rtol=1e-8, atol=1e-8)


# --------------------------------------------------------------------------------------------------
# Mahalanobis: bad input


@pytest.mark.parametrize("function", [squared_mahalanobis_distances, mahalanobis_outlier_fraction])
def test_mahalanobis_rejects_bad_arrays(function):
    with pytest.raises(InputError, match=re.escape("`policy_emb` must be a 2-D array, got shape (2,).")):
        function([1.0, 2.0], DIAMOND)
    with pytest.raises(InputError, match=re.escape("must have the same embedding dimension, got 3 and 2.")):
        function([[1.0, 2.0, 3.0]], DIAMOND)
    with pytest.raises(InputError, match=re.escape("`policy_emb` must not be empty, got shape (0, 2).")):
        function(np.zeros((0, 2)), DIAMOND)
    with pytest.raises(
        InputError, match=re.escape("`reference_emb` must be finite, got nan at index (2, 0).")
    ):
        function([[1.0, 2.0]], [[0.0, 0.0], [1.0, 1.0], [float("nan"), 0.0]])
    message = "`reference_emb` must have at least 2 rows to estimate a covariance, got shape (1, 2)."
    with pytest.raises(InputError, match=re.escape(message)):
        function([[1.0, 2.0]], [[0.0, 0.0]])


@pytest.mark.parametrize("function", [squared_mahalanobis_distances, mahalanobis_outlier_fraction])
def test_mahalanobis_rejects_bad_config(function):
    message = "`shrinkage` must be one of 'ledoit_wolf', 'none', 'oas', got 'graphical_lasso'."
    with pytest.raises(ConfigError, match=re.escape(message)):
        function([[1.0, 0.0]], DIAMOND, shrinkage="graphical_lasso")
    with pytest.raises(ConfigError, match=re.escape("`n_components` must be in [1, 2], got 3.")):
        function([[1.0, 0.0]], DIAMOND, n_components=3)
    with pytest.raises(ConfigError, match=re.escape("`n_components` must be in [1, 2], got 0.")):
        function([[1.0, 0.0]], DIAMOND, n_components=0)
    with pytest.raises(
        LoopguardTypeError, match=re.escape("`n_components` must be an integer (not bool), got True.")
    ):
        function([[1.0, 0.0]], DIAMOND, n_components=True)
    with pytest.raises(ConfigError, match=re.escape("`ridge` must be >= 0, got -0.1.")):
        function([[1.0, 0.0]], DIAMOND, ridge=-0.1)
    with pytest.raises(
        LoopguardTypeError, match=re.escape("`ridge` must be a real number (not bool), got False.")
    ):
        function([[1.0, 0.0]], DIAMOND, ridge=False)


def test_mahalanobis_n_components_bounded_by_reference_rows():
    reference = np.random.default_rng(0).normal(size=(3, 5))
    with pytest.raises(ConfigError, match=re.escape("`n_components` must be in [1, 3], got 4.")):
        squared_mahalanobis_distances(np.zeros((1, 5)), reference, n_components=4)


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.5, 1.5])
def test_mop_rejects_alpha_out_of_range(alpha):
    with pytest.raises(ConfigError, match=re.escape(f"`alpha` must be in (0, 1), got {alpha!r}.")):
        mahalanobis_outlier_fraction([[1.0, 0.0]], DIAMOND, alpha=alpha)


def test_mop_rejects_bool_and_nan_alpha():
    with pytest.raises(
        LoopguardTypeError, match=re.escape("`alpha` must be a real number (not bool), got True.")
    ):
        mahalanobis_outlier_fraction([[1.0, 0.0]], DIAMOND, alpha=True)
    with pytest.raises(ConfigError, match=re.escape("`alpha` must be finite, got nan.")):
        mahalanobis_outlier_fraction([[1.0, 0.0]], DIAMOND, alpha=float("nan"))


@pytest.mark.parametrize("shrinkage", ["ledoit_wolf", "oas", "none"])
def test_mahalanobis_singular_covariance_without_ridge_is_a_clear_error(shrinkage):
    constant = np.ones((5, 3))
    with pytest.raises(InputError, match=re.escape("gives a numerically singular covariance")):
        squared_mahalanobis_distances([[1.0, 1.0, 1.0]], constant, shrinkage=shrinkage, ridge=0.0)
    # The default ridge keeps it well defined: the reference point itself is at distance 0.
    np.testing.assert_allclose(
        squared_mahalanobis_distances([[1.0, 1.0, 1.0]], constant, shrinkage=shrinkage), [0.0]
    )


def test_mahalanobis_rank_deficient_reference_without_ridge_is_a_clear_error():
    reference = np.random.default_rng(4).normal(size=(3, 6))  # 3 points span at most 2 dimensions
    with pytest.raises(InputError, match=re.escape("(3 rows in 6 dimensions, shrinkage='none', ridge=0)")):
        squared_mahalanobis_distances(np.zeros((1, 6)), reference, shrinkage="none", ridge=0.0)


def test_mahalanobis_rejects_over_embedding_cap():
    with pytest.raises(InputError, match=re.escape(f"at most {MAX_EMBEDDING_DIM:,} columns (DoS cap)")):
        squared_mahalanobis_distances(
            np.zeros((1, MAX_EMBEDDING_DIM + 1)), np.zeros((2, MAX_EMBEDDING_DIM + 1))
        )
