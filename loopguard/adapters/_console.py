"""What a training run shows of loopguard: its lines, the progress bar's postfix, trackers' text and alerts.

The callbacks speak through the ``loopguard`` Python logger. While a trainer trains, :class:`Console` makes
that logger follow the trainer's own conventions (transformers ``Trainer`` and TRL's trainers):

* **Level.** ``TrainingArguments.get_process_log_level()`` decides, as it does for transformers' own logger:
  ``log_level`` on the main process, ``log_level_replica`` on the others. Left at ``"passive"`` on the main
  process, loopguard's status lines (warm-up done, verdict changes, the end-of-run summary) are shown, at
  INFO, like the trainer's own progress output; an explicit level is obeyed (``"warning"`` keeps the WARN /
  HACK lines, rollbacks, stops and failures; ``"error"`` keeps failures only). The level is restored when
  training ends.
* **Where the lines go.** When nothing would print a ``loopguard`` record (no handler on the logger or its
  ancestors: a script that never configured ``logging``), a handler is added for the run that writes to
  stderr through ``tqdm.write`` while the trainer's progress bar is open, so the bar is not torn. A
  ``logging`` configuration of the user's own is left alone: its handlers get the records.
* **Status lines come from the main process only**: every rank takes the same decision (see
  ``adapters/_distributed.py``), so one line per event is enough. Failures are reported on every rank.
* **Progress bar.** The verdict and beta go into the postfix of the trainer's ``tqdm`` bar
  (``ProgressCallback``; none with ``disable_tqdm=True``).
* **Trackers.** W&B and trackio get an alert (``alert(title, text, level)``) on the first HACK of an
  episode, a rollback and a stop, unless the callback was made with ``alerts=False``. (Verdicts and
  actions as text go through the trainer's logs, see ``RewardHackMitigator``.)
"""

from __future__ import annotations

import logging
import sys
from typing import Any

__all__ = ["Console", "alert", "progress_bar", "takes_text"]

logger = logging.getLogger("loopguard")

_PASSIVE_LEVEL = logging.INFO
_TRACKERS = ("_wandb", "_trackio")  # attributes of transformers' WandbCallback / TrackioCallback


def _process_level(args: Any) -> int:
    """The level of the ``loopguard`` logger in this process, from the trainer's arguments."""
    main = bool(getattr(args, "should_log", True))
    chosen = getattr(args, "log_level" if main else "log_level_replica", "passive")
    if main and chosen == "passive":
        return _PASSIVE_LEVEL
    getter = getattr(args, "get_process_log_level", None)
    return int(getter()) if callable(getter) else logging.WARNING


def progress_bar(trainer: Any) -> Any:
    """The trainer's open ``tqdm`` training bar (transformers' ``ProgressCallback``), or None."""
    handler = getattr(trainer, "callback_handler", None)
    for callback in getattr(handler, "callbacks", ()):
        bar = getattr(callback, "training_bar", None)
        if bar is not None and hasattr(bar, "set_postfix_str"):
            return bar
    return None


class _BarHandler(logging.Handler):
    """Write records to stderr, through ``tqdm.write`` while a progress bar is open (the bar stays whole)."""

    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            bar = progress_bar(self.console.trainer)
            if bar is not None:
                bar.write(text, file=sys.stderr)
            else:
                sys.stderr.write(text + "\n")
                sys.stderr.flush()
        except Exception:  # logging's own policy: report the broken handler, never raise into training
            self.handleError(record)


class Console:
    """The ``loopguard`` logger's level and handler for one training run (see the module docs).

    Several callbacks of one run share it: the first :meth:`open` sets it up, the last :meth:`close`
    restores the logger.
    """

    _opened = 0
    _saved_level = logging.NOTSET
    _handler: _BarHandler | None = None

    def __init__(self) -> None:
        self.trainer: Any = None
        self.main = True
        self._open = False

    def open(self, trainer: Any, args: Any, state: Any) -> None:
        """Follow ``trainer``'s log level and progress bar until :meth:`close` (idempotent)."""
        self.trainer = trainer
        self.main = bool(getattr(state, "is_world_process_zero", True))
        if self._open:
            return
        self._open = True
        if Console._opened == 0:
            Console._saved_level = logger.level
        Console._opened += 1
        logger.setLevel(_process_level(args))
        if Console._handler is None and not logger.hasHandlers():
            Console._handler = _BarHandler(self)
            logger.addHandler(Console._handler)

    def close(self) -> None:
        """Give the logger back as it was before the first :meth:`open` of the run."""
        if not self._open:
            return
        self._open = False
        Console._opened -= 1
        if Console._opened == 0:
            logger.setLevel(Console._saved_level)
            if Console._handler is not None:
                logger.removeHandler(Console._handler)
                Console._handler = None

    def status(self, level: int, text: str) -> None:
        """One status line (main process only: every rank decides the same)."""
        if self.main:
            logger.log(level, text)

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


_TEXT_TRACKERS = ("TensorBoardCallback", "WandbCallback", "TrackioCallback")


def takes_text(trainer: Any) -> bool:
    """Whether ``trainer`` reports to a tracker that records text in its logs (TensorBoard, W&B, trackio).

    Other trackers (MLflow, for one) warn about a value that is not a number, so loopguard's text goes into
    the logs only when one of these is among the trainer's callbacks.
    """
    handler = getattr(trainer, "callback_handler", None)
    return any(type(callback).__name__ in _TEXT_TRACKERS for callback in getattr(handler, "callbacks", ()))
