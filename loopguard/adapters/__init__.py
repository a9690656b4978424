"""Adapters: read what a trainer already computed, and apply the Guard's decisions to it.

* :class:`RewardHackMitigator`, :class:`EchoTrapCallback`, :class:`RLCheckpointCallback` -- Hugging Face /
  TRL ``TrainerCallback`` s (:mod:`loopguard.adapters.hf_trainer`; need the ``hf`` extra, imported lazily);
* :class:`LoopGuard`, :func:`apply_decision`, :class:`Applied`, :class:`ReferenceAdapter` -- hand-written
  PyTorch and Accelerate loops (:mod:`loopguard.adapters.loop`, ``docs/loops.md``);
* :func:`rank_sync`, :func:`register_state`, :func:`read_state` -- Accelerate: the reductions over the
  accelerator's processes and loopguard's JSON state in ``save_state`` / ``load_state``
  (:mod:`loopguard.adapters.accelerate_hooks`);
* :class:`RankSync` -- one decision on every rank (:mod:`loopguard.adapters.distributed` has the rest:
  ``synced_step``, ``synced_restore``);
* :func:`tap` -- records a reward function's calls for trainers that do not keep per-completion rewards
  (no heavy imports).

Everything but :func:`tap` loads on first use (PEP 562), so importing this package stays light.

Example:
    >>> from loopguard.adapters import tap
    >>> tap(lambda prompts, completions, **kw: [1.0] * len(completions)).__name__
    '<lambda>'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loopguard.adapters._tap import TappedReward, TapRecord, tap

if TYPE_CHECKING:
    from loopguard.adapters.accelerate_hooks import rank_sync, read_state, register_state
    from loopguard.adapters.distributed import RankSync
    from loopguard.adapters.hf_trainer import EchoTrapCallback, RewardHackMitigator, RLCheckpointCallback
    from loopguard.adapters.loop import Applied, LoopGuard, ReferenceAdapter, apply_decision

__all__ = [
    "Applied",
    "EchoTrapCallback",
    "LoopGuard",
    "RLCheckpointCallback",
    "RankSync",
    "ReferenceAdapter",
    "RewardHackMitigator",
    "TapRecord",
    "TappedReward",
    "apply_decision",
    "rank_sync",
    "read_state",
    "register_state",
    "tap",
]

_LAZY = {
    "Applied": "loopguard.adapters.loop",
    "EchoTrapCallback": "loopguard.adapters.hf_trainer",
    "LoopGuard": "loopguard.adapters.loop",
    "RLCheckpointCallback": "loopguard.adapters.hf_trainer",
    "RankSync": "loopguard.adapters.distributed",
    "ReferenceAdapter": "loopguard.adapters.loop",
    "RewardHackMitigator": "loopguard.adapters.hf_trainer",
    "apply_decision": "loopguard.adapters.loop",
    "rank_sync": "loopguard.adapters.accelerate_hooks",
    "read_state": "loopguard.adapters.accelerate_hooks",
    "register_state": "loopguard.adapters.accelerate_hooks",
}


def __getattr__(name: str) -> Any:
    """Import the loop, Accelerate and transformers adapters on first use (PEP 562), not at import."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
