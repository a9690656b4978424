"""Training recipes built on loopguard's signals: iterative DPO with safety gates between rounds.

``import loopguard.recipes`` is light (no torch): torch, transformers and TRL are imported only when a recipe
runs. See ``docs/iterative_dpo.md``. The names are the recipe module's own public names (its ``__all__``).
"""

from __future__ import annotations

from loopguard.recipes import iterative_dpo
from loopguard.recipes.iterative_dpo import *  # noqa: F403 - listed once, in iterative_dpo.__all__

__all__: list[str] = []
__all__ += iterative_dpo.__all__
