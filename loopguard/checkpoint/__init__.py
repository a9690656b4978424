"""Mid-epoch RL checkpoints that survive crashes, and rollback to the last checkpoint known to be good.

:class:`CheckpointManager` saves a training run's full state (model weights -- only the adapter for a PEFT
model --, optimizer, LR scheduler, RNG states, an optional reference model and rollout buffer, and a JSON
``extra_state`` such as :meth:`loopguard.Guard.state_dict`) atomically, verifies every byte before it
restores, and never unpickles arbitrary objects. :meth:`CheckpointManager.mark_good` and
:meth:`CheckpointManager.last_good` implement "roll back to the newest checkpoint that was saved before the
hack began". ``in_memory=True`` keeps CPU copies instead, for small or LoRA models where a rollback should
cost milliseconds. See ``docs/checkpoints.md`` for the on-disk layout and the exact guarantees.

Needs torch and safetensors (the ``hf`` extra); nothing else from Hugging Face.

Example:
    >>> import tempfile
    >>> import torch
    >>> from loopguard.checkpoint import CheckpointManager
    >>> model = torch.nn.Linear(4, 2)
    >>> optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    >>> store = tempfile.TemporaryDirectory()
    >>> manager = CheckpointManager(store.name, keep_last=2)
    >>> manager.save(10, model, optimizer, extra_state={"beta": 0.04}).name
    'step-00000010'
    >>> manager.mark_good(10)  # the run stayed healthy for a confirmation window after step 10
    >>> with torch.no_grad():
    ...     _ = model.weight.add_(1.0)  # training goes on, and goes wrong
    >>> restored = manager.restore("last_good", model, optimizer, before_step=25)
    >>> restored.step, restored.extra_state
    (10, {'beta': 0.04})
    >>> store.cleanup()
"""

# ruff: noqa: E402
from __future__ import annotations

from loopguard._validation import import_extra

_HINT = "CheckpointManager needs the `hf` extra: pip install 'loopguard[hf]'"
import_extra(_HINT, "safetensors.torch", "torch")  # before the submodules import them (hence E402 below)

from loopguard.checkpoint._io import CheckpointError, CheckpointWriteError
from loopguard.checkpoint._manager import (
    FORMAT_VERSION,
    CheckpointManager,
    RestoredCheckpoint,
    steps_to_keep,
)

__all__ = [
    "FORMAT_VERSION",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointWriteError",
    "RestoredCheckpoint",
    "steps_to_keep",
]
