"""loopguard: RL-safety callbacks that detect reward hacking and degeneration, and close the loop.

The package is layered in one direction of flow:

* :mod:`loopguard.signals` -- pure numpy kernels that score a batch of RL training data;
* the Guard and controllers -- turn scores into decisions (raise the KL coefficient, roll back, stop);
* adapters -- read what a trainer already computed and apply the decision: ``RewardHackMitigator``,
  ``EchoTrapCallback`` and ``RLCheckpointCallback`` for Hugging Face / TRL trainers, :class:`LoopGuard` and
  :func:`apply_decision` for hand-written PyTorch and Accelerate loops (``docs/loops.md``), :func:`tap` for
  reward functions of trainers that keep no per-completion rewards.

``import loopguard`` imports neither torch, transformers, scipy.stats nor scikit-learn (kernels import scipy
and scikit-learn where they use them); the adapters load lazily (PEP 562), on first access to
``loopguard.RewardHackMitigator``, ``loopguard.LoopGuard`` and friends, and so does ``__version__``.

Example:
    >>> import loopguard
    >>> from loopguard.signals import classify_echo, ngram_repetition_rate
    >>> classify_echo(ngram_repetition_rate(["a b a b a b a b"], n=2))
    'TRAP'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loopguard import signals
from loopguard.adapters._tap import tap
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
    CheckpointError,
    CheckpointWriteError,
    ConfigError,
    InputError,
    LoopguardError,
    LoopguardTypeError,
    MissingDependencyError,
    StateError,
)
from loopguard.guard import Decision, Guard, Observation
from loopguard.log import MitigationLog, MitigationRecord, read_mitigation_log
from loopguard.shaping import shape_reward

if TYPE_CHECKING:
    from loopguard.adapters.hf_trainer import EchoTrapCallback, RewardHackMitigator, RLCheckpointCallback
    from loopguard.adapters.loop import Applied, LoopGuard, apply_decision
    from loopguard.checkpoint import CheckpointManager
    from loopguard.recipes import IterativeDPO

__version__: str  # read from the installed metadata on first access (importlib.metadata costs ~10 ms)

__all__ = [
    "AdaptiveKL",
    "Applied",
    "BangBang",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointWriteError",
    "Collapse",
    "ConfigError",
    "Decision",
    "Diversity",
    "EchoTrapCallback",
    "EscalationLadder",
    "GoldAudit",
    "Guard",
    "InfoRM",
    "InputError",
    "IterativeDPO",
    "Length",
    "LoopGuard",
    "LoopguardError",
    "LoopguardTypeError",
    "MissingDependencyError",
    "MitigationLog",
    "MitigationRecord",
    "Observation",
    "PIDLagrangian",
    "RLCheckpointCallback",
    "RMEnsemble",
    "Repetition",
    "RewardDrift",
    "RewardHackMitigator",
    "StateError",
    "__version__",
    "apply_decision",
    "read_mitigation_log",
    "shape_reward",
    "signals",
    "tap",
]

_LAZY = {
    "Applied": "loopguard.adapters.loop",
    "CheckpointManager": "loopguard.checkpoint",
    "EchoTrapCallback": "loopguard.adapters.hf_trainer",
    "IterativeDPO": "loopguard.recipes",
    "LoopGuard": "loopguard.adapters.loop",
    "RLCheckpointCallback": "loopguard.adapters.hf_trainer",
    "RewardHackMitigator": "loopguard.adapters.hf_trainer",
    "apply_decision": "loopguard.adapters.loop",
}


def _installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("loopguard")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0+unknown"


def __getattr__(name: str) -> Any:
    """Load the adapters and ``__version__`` on first use (PEP 562): ``import loopguard`` stays light."""
    if name == "__version__":
        globals()["__version__"] = value = _installed_version()
        return value
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
