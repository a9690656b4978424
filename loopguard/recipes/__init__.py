"""Training recipes built on loopguard's signals: iterative DPO with safety gates between rounds.

``import loopguard.recipes`` is light (no torch): torch, transformers and TRL are imported only when a recipe
runs. See ``docs/iterative_dpo.md``.
"""

from __future__ import annotations

from loopguard.recipes.iterative_dpo import (
    PAIRING_MODES,
    GateResult,
    IterativeDPO,
    IterativeDPOConfig,
    IterativeDPOPlan,
    IterativeDPOResult,
    Pair,
    RoundPlan,
    SafetyGates,
    build_pairs,
    evaluate_gates,
)

__all__ = [
    "PAIRING_MODES",
    "GateResult",
    "IterativeDPO",
    "IterativeDPOConfig",
    "IterativeDPOPlan",
    "IterativeDPOResult",
    "Pair",
    "RoundPlan",
    "SafetyGates",
    "build_pairs",
    "evaluate_gates",
]
