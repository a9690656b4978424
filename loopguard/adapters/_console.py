"""What a training run shows of loopguard: its lines, the progress bar's postfix, trackers' text and alerts.

The callbacks speak through the ``loopguard`` Python logger, following the trainer's own conventions
(transformers ``Trainer`` and TRL's trainers), without changing any logger's configuration:

* **Level.** ``TrainingArguments.get_process_log_level()`` decides, as it does for transformers' own logger:
  ``log_level`` on the main process, ``log_level_replica`` on the others. Left at ``"passive"`` on the main
  process (transformers' verbosity, WARNING unless the script set it), loopguard's status lines (warm-up
  done, verdict changes, the end-of-run summary) are shown, at INFO, like the trainer's own progress
  output, unless the verbosity was set above WARNING; an explicit level is obeyed (``"warning"`` keeps the
  WARN / HACK lines, rollbacks, stops and failures; ``"error"`` keeps failures only). A level set on the
  ``loopguard`` logger itself (``logging.getLogger("loopguard").setLevel(...)``) is obeyed too.
* **Where the lines go.** A line that passes becomes a record of the ``loopguard`` logger, handed to the
  handlers of a ``logging`` configuration of the user's own (a handler on that logger or an ancestor). When
  there is none (a script that never configured ``logging``), it is written to stderr, through
  ``tqdm.write`` while the trainer's progress bar is open, so the bar is not torn.
* **Status lines come from the main process only**: every rank takes the same decision (see
  ``adapters/_distributed.py``), so one line per event is enough. Failures are reported on every rank.
* **Progress bar.** The verdict and beta go into the postfix of the trainer's ``tqdm`` bar
  (``ProgressCallback``; none with ``disable_tqdm=True``).
* **Trackers.** W&B and trackio get an alert (``alert(title, text, level)``) on the first HACK of an
  episode, a rollback and a stop, unless the callback was made with ``alerts=False``. (Verdicts and
  actions as text go through the trainer's logs, see ``RewardHackMitigator``.)

Nothing here is global: a run that crashes leaves no level or handler behind.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

__all__ = ["Console", "alert", "progress_bar", "takes_text"]

logger = logging.getLogger("loopguard")

_PASSIVE_LEVEL = logging.INFO
_TRACKERS = ("_wandb", "_trackio")  # attributes of transformers' WandbCallback / TrackioCallback
_TEXT_TRACKERS = ("TensorBoardCallback", "WandbCallback", "TrackioCallback")


def _process_level(args: Any) -> int:
    """The level of loopguard's lines in this process, from the trainer's arguments.

    ``get_process_log_level()`` is transformers' rule; ``"passive"`` on the main process reads transformers'
    verbosity there, WARNING unless the script changed it: loopguard shows its status lines (INFO) then,
    and follows a verbosity set higher (``transformers.logging.set_verbosity_error()`` silences them).
    """
    getter = getattr(args, "get_process_log_level", None)
    level = int(getter()) if callable(getter) else logging.WARNING
    main = bool(getattr(args, "should_log", True))
    if main and getattr(args, "log_level", "passive") == "passive" and level <= logging.WARNING:
        return min(level, _PASSIVE_LEVEL)
    return level


def progress_bar(trainer: Any) -> Any:
    """The trainer's open ``tqdm`` training bar (transformers' ``ProgressCallback``), or None."""
    handler = getattr(trainer, "callback_handler", None)
    for callback in getattr(handler, "callbacks", ()):
        bar = getattr(callback, "training_bar", None)
        if bar is not None and hasattr(bar, "set_postfix_str"):
            return bar
    return None


class Console:
    """Where one callback's lines go in a training run (see the module docs).

    Before :meth:`open` (outside training) every line at INFO or above passes, on the logger's terms.
    """

    def __init__(self) -> None:
        self.trainer: Any = None
        self.main = True
        self.level = logging.INFO

    def open(self, trainer: Any, args: Any, state: Any) -> None:
        """Follow ``trainer``'s log level and progress bar from now on."""
        self.trainer = trainer
        self.main = bool(getattr(state, "is_world_process_zero", True))
        self.level = _process_level(args)

    def emit(self, level: int, text: str, *, everywhere: bool = False) -> bool:
        """One line at ``level`` (main process only unless ``everywhere``); returns whether it went out."""
        if (not everywhere and not self.main) or level < self.level or logger.disabled:
            return False
        if logger.level != logging.NOTSET and level < logger.level:
            return False
        if logger.hasHandlers():
            record = logger.makeRecord(logger.name, level, "loopguard", 0, text, (), None)
            logger.handle(record)  # the user's handlers (their levels and filters apply)
            return True
        bar = progress_bar(self.trainer)
        if bar is not None:
            bar.write(text, file=sys.stderr)
        else:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
        return True

    def status(self, level: int, text: str) -> bool:
        """A status line (main process only: every rank decides the same)."""
        return self.emit(level, text)

    def postfix(self, text: str) -> None:
        """Show ``text`` in the progress bar's postfix (main process; no bar, nothing)."""
        if not self.main:
            return
        bar = progress_bar(self.trainer)
        if bar is not None:
            bar.set_postfix_str(text, refresh=False)


def alert(trainer: Any, title: str, text: str) -> list[str]:
    """Raise a WARN alert on every active tracker of ``trainer`` that has alerts (W&B, trackio).

    Returns the attributes of the trackers alerted (``"_wandb"``, ``"_trackio"``). A tracker that is
    installed but has no run yet (it starts at its first log) is skipped.
    """
    handler = getattr(trainer, "callback_handler", None)
    done: list[str] = []
    for callback in getattr(handler, "callbacks", ()):
        for attribute in _TRACKERS:
            module = getattr(callback, attribute, None)
            send = getattr(module, "alert", None)
            if not callable(send) or attribute in done:
                continue
            if attribute == "_wandb" and getattr(module, "run", None) is None:
                continue
            levels = getattr(module, "AlertLevel", None)
            level = getattr(levels, "WARN", "WARN")
            send(title=title, text=text, level=level)
            done.append(attribute)
    return done


def takes_text(trainer: Any) -> bool:
    """Whether ``trainer`` reports to a tracker that records text in its logs (TensorBoard, W&B, trackio).

    Other trackers (MLflow, for one) warn about a value that is not a number, so loopguard's text goes into
    the logs only when one of these is among the trainer's callbacks.
    """
    handler = getattr(trainer, "callback_handler", None)
    return any(type(callback).__name__ in _TEXT_TRACKERS for callback in getattr(handler, "callbacks", ()))
