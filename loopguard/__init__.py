"""loopguard: RL-safety callbacks that detect reward hacking and degeneration, and close the loop.

The package is layered in one direction of flow:

* :mod:`loopguard.signals` -- pure numpy kernels that score a batch of RL training data;
* the Guard and controllers -- turn scores into decisions (raise the KL coefficient, roll back, stop);
* adapters -- read what a trainer already computed and apply the decision.

``import loopguard`` imports neither torch nor transformers; the adapters that need them load lazily.

Example:
    >>> import loopguard
    >>> from loopguard.signals import classify_echo, ngram_repetition_rate
    >>> classify_echo(ngram_repetition_rate(["a b a b a b a b"], n=2))
    'TRAP'
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from loopguard import signals
from loopguard.control import AdaptiveKL, BangBang, EscalationLadder, PIDLagrangian
from loopguard.detectors import (
    Collapse,
    Diversity,
    GoldAudit,
    InfoRM,
    Length,
    Repetition,
    RewardDrift,
    RMEnsemble,
)
from loopguard.exceptions import (
    ConfigError,
    InputError,
    LoopguardError,
    LoopguardTypeError,
    MissingDependencyError,
)
from loopguard.guard import Decision, Guard, Observation
from loopguard.log import MitigationLog, MitigationRecord, read_mitigation_log
from loopguard.shaping import shape_reward

try:
    __version__ = version("loopguard")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "AdaptiveKL",
    "BangBang",
    "Collapse",
    "ConfigError",
    "Decision",
    "Diversity",
    "EscalationLadder",
    "GoldAudit",
    "Guard",
    "InfoRM",
    "InputError",
    "Length",
    "LoopguardError",
    "LoopguardTypeError",
    "MissingDependencyError",
    "MitigationLog",
    "MitigationRecord",
    "Observation",
    "PIDLagrangian",
    "RMEnsemble",
    "Repetition",
    "RewardDrift",
    "__version__",
    "read_mitigation_log",
    "shape_reward",
    "signals",
]
