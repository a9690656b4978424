"""How a callback added with ``trainer.add_callback(...)`` finds its trainer, and its place among callbacks.

transformers passes a callback the model, tokenizer, optimizer, scheduler and dataloaders, never the trainer.
At ``on_train_begin`` the trainer is on the call stack: ``Trainer._inner_training_loop`` calls
``self.callback_handler.on_train_begin(...)``, which calls each callback. :func:`find_trainer` walks up the
stack (at most :data:`MAX_FRAMES` frames) for a frame whose ``self`` has a ``callback_handler`` holding this
very callback object; the same walk reads the ``resume_from_checkpoint`` argument of that training loop.
If no frame matches (an unusual launcher), the garbage collector's referrers are followed from the callback
to the handler's ``callbacks`` list, to the handler, to the object holding the handler. Either way the
candidate must hold the callback itself (identity), so a trainer is never guessed.

A trainer that cannot be found is a configuration error: pass ``trainer=`` or call ``.bind(trainer)``, the
primary path; this search is the fallback for a bare ``trainer.add_callback(...)``. Hand-written because
transformers has no API that hands a callback its trainer.

Example:
    >>> class Handler:
    ...     def __init__(self, callbacks):
    ...         self.callbacks = callbacks
    >>> class Trainer:
    ...     def __init__(self, callback):
    ...         self.callback_handler = Handler([object(), callback])
    ...     def train(self, resume_from_checkpoint=None):
    ...         return find_trainer(callback)
    >>> callback = object()
    >>> trainer = Trainer(callback)
    >>> found, resume = trainer.train("out/checkpoint-8")
    >>> found is trainer, resume
    (True, 'out/checkpoint-8')
    >>> move_first(trainer, callback); trainer.callback_handler.callbacks[0] is callback
    True
"""

from __future__ import annotations

import gc
import inspect
import os
from typing import Any

__all__ = ["MAX_FRAMES", "checkpoint_dir", "find_trainer", "holds", "move_first"]

MAX_FRAMES = 40
"""How many stack frames :func:`find_trainer` inspects."""


def holds(candidate: object, callback: object) -> bool:
    """Whether ``candidate`` has a ``callback_handler`` whose ``callbacks`` include ``callback`` itself."""
    handler = getattr(candidate, "callback_handler", None)
    callbacks = getattr(handler, "callbacks", None)
    return isinstance(callbacks, list) and any(item is callback for item in callbacks)


def _from_frames(callback: object) -> tuple[Any, str | None]:
    trainer: Any = None
    resume: str | None = None
    frame = inspect.currentframe()
    try:
        depth = 0
        while frame is not None and depth < MAX_FRAMES:
            local = frame.f_locals
            candidate = local.get("self")
            if candidate is not None and candidate is not callback and holds(candidate, callback):
                trainer = trainer if trainer is not None else candidate
                value = local.get("resume_from_checkpoint")
                if candidate is trainer and isinstance(value, (str, os.PathLike)) and resume is None:
                    resume = os.fspath(value)
            frame = frame.f_back
            depth += 1
    finally:
        del frame
    return trainer, resume


def _from_referrers(callback: object) -> Any:
    for holder in gc.get_referrers(callback):
        if not isinstance(holder, list):
            continue
        for handler in gc.get_referrers(holder):
            if getattr(handler, "callbacks", None) is not holder:
                continue
            for owner in gc.get_referrers(handler):
                candidates = [owner]
                if isinstance(owner, dict):  # an instance __dict__: find the instance
                    candidates = [
                        obj for obj in gc.get_referrers(owner) if getattr(obj, "__dict__", None) is owner
                    ]
                for candidate in candidates:
                    if holds(candidate, callback):
                        return candidate
    return None


def find_trainer(callback: object) -> tuple[Any, str | None]:
    """Return ``(trainer, resume_from_checkpoint)`` for a callback being called by a trainer.

    Call it from inside a callback event (``on_train_begin``). ``trainer`` is None when no object holding the
    callback is found; ``resume_from_checkpoint`` is the path the training loop was given, or None.
    """
    trainer, resume = _from_frames(callback)
    if trainer is None:
        trainer = _from_referrers(callback)
    return trainer, resume


def move_first(trainer: Any, callback: object) -> None:
    """Put ``callback`` first among the trainer's callbacks, so its ``on_log`` runs before the reporters.

    The loop in ``CallbackHandler.call_event`` keeps working when this runs inside an event: the callbacks
    before ``callback`` shift by one place, so none is skipped or called twice.
    """
    callbacks = trainer.callback_handler.callbacks
    if callbacks and callbacks[0] is callback:
        return
    for index, item in enumerate(callbacks):
        if item is callback:
            del callbacks[index]
            break
    callbacks.insert(0, callback)


def checkpoint_dir(args: Any, state: Any) -> str:
    """The ``checkpoint-<global_step>`` folder the Trainer has just saved (``on_save``)."""
    return os.path.join(str(args.output_dir), f"checkpoint-{state.global_step}")
