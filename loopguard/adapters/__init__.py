"""Adapters: read what a trainer already computed, and apply the Guard's decisions to it.

* :class:`RewardHackMitigator`, :class:`EchoTrapCallback`, :class:`RLCheckpointCallback` -- Hugging Face /
  TRL ``TrainerCallback`` s (:mod:`loopguard.adapters.hf_trainer`; need the ``hf`` extra, imported lazily);
* :func:`tap` -- records a reward function's calls for trainers that do not keep per-completion rewards
  (no heavy imports).

Example:
    >>> from loopguard.adapters import tap
    >>> tap(lambda prompts, completions, **kw: [1.0] * len(completions)).__name__
    '<lambda>'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loopguard.adapters._tap import TappedReward, TapRecord, tap

if TYPE_CHECKING:
    from loopguard.adapters.hf_trainer import EchoTrapCallback, RewardHackMitigator, RLCheckpointCallback

__all__ = [
    "EchoTrapCallback",
    "RLCheckpointCallback",
    "RewardHackMitigator",
    "TapRecord",
    "TappedReward",
    "tap",
]

_LAZY = frozenset(("EchoTrapCallback", "RLCheckpointCallback", "RewardHackMitigator"))


def __getattr__(name: str) -> Any:
    """Import the transformers callbacks on first use (PEP 562), so this package stays light."""
    if name in _LAZY:
        from loopguard.adapters import hf_trainer

        return getattr(hf_trainer, name)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
