"""Names shared by the Guard, its decisions and the mitigation log (one definition of each label set).

The WARN and HACK levels live here, not in :mod:`loopguard.detectors` (which exports them), so that a reader
of the log such as ``loopguard report`` gets them without importing numpy and the kernels.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["ACTIONS", "HACK_LEVEL", "VERDICTS", "WARN_LEVEL", "Action", "Verdict"]

Verdict = Literal["OK", "WARN", "HACK"]
"""The Guard's reading of a step: OK < WARN < HACK."""

Action = Literal["none", "raise_beta", "lower_beta", "rollback", "stop"]
"""What a decision asks the trainer to do."""

VERDICTS: tuple[str, ...] = ("OK", "WARN", "HACK")
ACTIONS: tuple[str, ...] = ("none", "raise_beta", "lower_beta", "rollback", "stop")

WARN_LEVEL = 0.10
"""Score at which a detector (and the vote) reads WARN."""

HACK_LEVEL = 0.30
"""Score at which a detector (and the vote) reads HACK; also the default trip band of ``BangBang``."""
