"""loopguard: RL-safety callbacks that detect reward hacking and degeneration, and close the loop.

The package is layered in one direction of flow:

* :mod:`loopguard.signals` -- pure numpy kernels that score a batch of RL training data;
* the Guard and controllers -- turn scores into decisions (raise the KL coefficient, roll back, stop);
* adapters -- read what a trainer already computed and apply the decision: ``RewardHackMitigator``,
  ``EchoTrapCallback`` and ``RLCheckpointCallback`` for Hugging Face / TRL trainers, :class:`LoopGuard` and
  :func:`apply_decision` for hand-written PyTorch and Accelerate loops (``docs/loops.md``), :func:`tap` for
  reward functions of trainers that keep no per-completion rewards.

``import loopguard`` loads only the exceptions: every other public name loads on first access (PEP 562), so
``loopguard.Guard`` imports the Guard with numpy and the kernels, ``loopguard.RewardHackMitigator`` the
Hugging Face adapter with torch, and a command such as ``loopguard report`` imports only what it uses (no
numpy for a text summary). Neither torch, transformers, scipy.stats nor scikit-learn is imported until a name
that needs it is used (kernels import scipy and scikit-learn where they use them); ``__version__`` too is read
on first access.

Example:
    >>> import loopguard
    >>> from loopguard.signals import classify_echo, ngram_repetition_rate
    >>> classify_echo(ngram_repetition_rate(["a b a b a b a b"], n=2))
    'TRAP'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from loopguard import signals
    from loopguard.adapters._tap import tap
    from loopguard.adapters.hf_trainer import EchoTrapCallback, RewardHackMitigator, RLCheckpointCallback
    from loopguard.adapters.loop import Applied, LoopGuard, ReferenceAdapter, apply_decision
    from loopguard.checkpoint import CheckpointManager
    from loopguard.control import AdaptiveKL, BangBang, EscalationLadder, PIDLagrangian
    from loopguard.detectors import (
        Collapse,
        Diversity,
        GoldAudit,
        InfoRM,
        JudgeGap,
        Length,
        Repetition,
        RewardDrift,
        RMEnsemble,
    )
    from loopguard.guard import Decision, Guard, Observation
    from loopguard.log import MitigationLog, MitigationRecord, read_mitigation_log
    from loopguard.recipes import IterativeDPO
    from loopguard.shaping import shape_reward

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
    "JudgeGap",
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
    "ReferenceAdapter",
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

# Where each public name lives; loaded on first access (None: the name is the submodule itself).
_LAZY: dict[str, str | None] = {
    "AdaptiveKL": "loopguard.control",
    "Applied": "loopguard.adapters.loop",
    "BangBang": "loopguard.control",
    "CheckpointManager": "loopguard.checkpoint",
    "Collapse": "loopguard.detectors",
    "Decision": "loopguard.guard",
    "Diversity": "loopguard.detectors",
    "EchoTrapCallback": "loopguard.adapters.hf_trainer",
    "EscalationLadder": "loopguard.control",
    "GoldAudit": "loopguard.detectors",
    "Guard": "loopguard.guard",
    "InfoRM": "loopguard.detectors",
    "IterativeDPO": "loopguard.recipes",
    "JudgeGap": "loopguard.detectors",
    "Length": "loopguard.detectors",
    "LoopGuard": "loopguard.adapters.loop",
    "MitigationLog": "loopguard.log",
    "MitigationRecord": "loopguard.log",
    "Observation": "loopguard.guard",
    "PIDLagrangian": "loopguard.control",
    "RLCheckpointCallback": "loopguard.adapters.hf_trainer",
    "RMEnsemble": "loopguard.detectors",
    "ReferenceAdapter": "loopguard.adapters.loop",
    "Repetition": "loopguard.detectors",
    "RewardDrift": "loopguard.detectors",
    "RewardHackMitigator": "loopguard.adapters.hf_trainer",
    "apply_decision": "loopguard.adapters.loop",
    "read_mitigation_log": "loopguard.log",
    "shape_reward": "loopguard.shaping",
    "signals": None,
    "tap": "loopguard.adapters._tap",
}


def _installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("loopguard")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0.0.0+unknown"


def __getattr__(name: str) -> Any:
    """Load a public name and ``__version__`` on first use (PEP 562): ``import loopguard`` stays light."""
    if name == "__version__":
        globals()["__version__"] = version = _installed_version()
        return version
    if name in _LAZY:
        import importlib

        home = _LAZY[name]
        module = importlib.import_module(f"{__name__}.{name}" if home is None else home)
        loaded = module if home is None else getattr(module, name)
        globals()[name] = loaded  # later accesses skip __getattr__
        return loaded
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
