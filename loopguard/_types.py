"""Names shared by the Guard, its decisions and the mitigation log (one definition of each label set)."""

from __future__ import annotations

from typing import Literal

__all__ = ["ACTIONS", "VERDICTS", "Action", "Verdict"]

Verdict = Literal["OK", "WARN", "HACK"]
"""The Guard's reading of a step: OK < WARN < HACK."""

Action = Literal["none", "raise_beta", "lower_beta", "rollback", "stop"]
"""What a decision asks the trainer to do."""

VERDICTS: tuple[str, ...] = ("OK", "WARN", "HACK")
ACTIONS: tuple[str, ...] = ("none", "raise_beta", "lower_beta", "rollback", "stop")
