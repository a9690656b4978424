"""Stateless signal kernels: score one batch of RL training data for reward hacking and degeneration.

Every function here is pure (no state, no I/O, no logging), takes array-likes (lists, numpy arrays, torch
tensors on any device) and returns a float or a numpy array. Only numpy, scipy and scikit-learn are used,
scipy and scikit-learn imported inside the kernels that need them (``import loopguard.signals`` loads
neither); torch is never imported. Formulas, what each signal catches and what it misses:
``docs/signals.md``.
"""

from __future__ import annotations

from loopguard.signals._collapse import (
    entropy_trend,
    group_reward_std,
    zero_std_group_fraction,
)
from loopguard.signals._drift import (
    DriftMethod,
    DropVerdict,
    RobustBaseline,
    classify_drop,
    relative_drop,
    reward_drift,
    robust_baseline,
)
from loopguard.signals._ensemble import (
    DisagreementStatistic,
    EnsembleMethod,
    ensemble_disagreement,
    ensemble_reward,
)
from loopguard.signals._latent import (
    CovarianceShrinkage,
    LatentMetric,
    cluster_separation_index,
    mahalanobis_outlier_fraction,
    squared_mahalanobis_distances,
)
from loopguard.signals._length import (
    CorrelationMethod,
    length_stratified_gain,
    length_trend,
    reward_length_correlation,
    reward_length_slope,
)
from loopguard.signals._repetition import (
    EchoVerdict,
    classify_echo,
    distinct_n,
    ngram_repetition_rate,
)
from loopguard.signals._sequences import TokenBatch, as_token_batch
from loopguard.signals._smoothing import (
    MAX_MEDIAN_WINDOW,
    Cusum,
    CusumDirection,
    CusumResult,
    CusumState,
    cusum,
    ema,
    ema_update,
    rolling_median,
)
from loopguard.signals._trend import TrendMethod, mann_kendall_z, series_slope

__all__ = [
    "MAX_MEDIAN_WINDOW",
    "CorrelationMethod",
    "CovarianceShrinkage",
    "Cusum",
    "CusumDirection",
    "CusumResult",
    "CusumState",
    "DisagreementStatistic",
    "DriftMethod",
    "DropVerdict",
    "EchoVerdict",
    "EnsembleMethod",
    "LatentMetric",
    "RobustBaseline",
    "TokenBatch",
    "TrendMethod",
    "as_token_batch",
    "classify_drop",
    "classify_echo",
    "cluster_separation_index",
    "cusum",
    "distinct_n",
    "ema",
    "ema_update",
    "ensemble_disagreement",
    "ensemble_reward",
    "entropy_trend",
    "group_reward_std",
    "length_stratified_gain",
    "length_trend",
    "mahalanobis_outlier_fraction",
    "mann_kendall_z",
    "ngram_repetition_rate",
    "relative_drop",
    "reward_drift",
    "reward_length_correlation",
    "reward_length_slope",
    "robust_baseline",
    "rolling_median",
    "series_slope",
    "squared_mahalanobis_distances",
    "zero_std_group_fraction",
]
