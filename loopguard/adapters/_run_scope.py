"""Run identity for the TRL callbacks: one identity per training run, kept across a genuine resume.

Users reuse ``output_dir`` all the time, so nothing of an earlier run may leak into a new one: not its
rollback checkpoints (a "rollback" would load another run's weights), not its mitigation-log records (the
report would mix two runs), not its state. The callbacks therefore give every run an identity
(:func:`loopguard._run.new_run_id`) when it starts fresh, write it into every ``checkpoint-N`` folder the
Trainer saves (``loopguard_run.json``), and read it back on ``resume_from_checkpoint``: the resumed run is the
same run. The identity scopes:

* the rollback store: by default ``<output_dir>/loopguard_checkpoints/<run>/``, so a fresh run starts clean
  beside the stores of earlier runs (they are left as they are); a store the user names is *claimed* by the
  run (:meth:`~loopguard.checkpoint.CheckpointManager.claim`), and one that holds another run's checkpoints is
  refused at the start of training with a message naming the directory and the two ways out. Every
  checkpoint's manifest records the run, and a restore refuses a checkpoint of another run.
* the mitigation log: every record carries ``run``, and ``loopguard report`` separates runs.
* the resume point: after ``resume_from_checkpoint`` from step ``s``, the run's rollback checkpoints saved
  after ``s`` (an abandoned timeline) are discarded, and a ``resume`` record in the log marks the records
  after ``s`` written before it as abandoned.

All loopguard callbacks of one trainer share the identity of the training session (cached on the trainer
for the ``TrainerState`` of that ``train()`` call); under data parallelism the main process decides and
broadcasts it, so every rank scopes the same store.
"""

from __future__ import annotations

import os
from typing import Any

from loopguard._run import check_run_id, new_run_id
from loopguard._saved_state import Fields, as_state_error, read_state_file, write_state_file
from loopguard.adapters._binding import checkpoint_dir
from loopguard.adapters._distributed import RankSync
from loopguard.exceptions import ConfigError, LoopguardError

__all__ = ["RUN_FILE", "Run", "default_store_dir", "resolve_run", "write_run_file"]

RUN_FILE = "loopguard_run.json"
"""Name of the run-identity file inside each ``checkpoint-N`` folder."""

RUN_FORMAT = "loopguard-run"
STORE_FOLDER = "loopguard_checkpoints"
_CACHE = "_loopguard_run"


class Run:
    """The identity of one training session: ``id``, and the step it resumed from (None when fresh).

    Attributes:
        id: The run identity.
        resumed_from: The global step the session resumed at, or None for a fresh start.
        folder: The ``checkpoint-N`` folder it resumed from, or None.
        inherited: Whether the identity was read from that folder (a genuine resume of a loopguard run);
            False for a fresh start, and for a resume from a checkpoint without loopguard's run file.
    """

    def __init__(self, run_id: str, resumed_from: int | None, folder: str | None, inherited: bool) -> None:
        """Hold the identity."""
        self.id = run_id
        self.resumed_from = resumed_from
        self.folder = folder
        self.inherited = inherited

    def __repr__(self) -> str:
        """Show the identity and where it resumed."""
        return f"Run({self.id!r}, resumed_from={self.resumed_from}, inherited={self.inherited})"


def _read_run_file(path: str) -> str:
    try:
        fields = Fields(read_state_file(path), path, keys=("format", "version", "run"))
        if fields.raw("format") != RUN_FORMAT or fields.raw("version") != 1:
            msg = f"{path} is not a loopguard run file (format {RUN_FORMAT!r}, version 1)."
            raise ConfigError(msg)
        with as_state_error():
            return check_run_id(f"{path}: run", fields.raw("run"))
    except (OSError, LoopguardError) as error:
        msg = (
            f"loopguard cannot read the run identity of the checkpoint it resumes from ({error}). Restore "
            f"{path} from a backup, or delete it to resume under a new run identity (loopguard's rollback "
            "store and log records then start afresh)."
        )
        raise ConfigError(msg) from None


def resolve_run(
    trainer: Any, args: Any, state: Any, resume_from: str | None, sync: RankSync | None = None
) -> Run:
    """The identity of the training session that is starting (call at ``on_train_begin``).

    A session that starts at global step 0 is a fresh run with a new identity. One that starts later resumes
    from a checkpoint: its identity is read from ``loopguard_run.json`` there (a resume from a checkpoint
    written without loopguard starts a new identity). The result is cached on the trainer for this
    ``TrainerState``, so every loopguard callback of the session gets the same one (and a second ``train()``
    on the same trainer, which makes a new ``TrainerState``, gets a new one).

    Raises:
        ConfigError: the checkpoint's run file exists but cannot be read or is malformed.
    """
    cached = getattr(trainer, _CACHE, None)
    if isinstance(cached, tuple) and len(cached) == 2 and cached[0] is state:
        return cached[1]  # type: ignore[no-any-return]
    sync = RankSync() if sync is None else sync
    step = int(state.global_step)
    folder = (resume_from or checkpoint_dir(args, state)) if step > 0 else None
    decided: dict[str, Any] = {}
    if sync.is_main or not sync.active:  # the other ranks wait for this answer: a failure travels with it
        try:
            decided = {"run": new_run_id(), "inherited": False}
            path = None if folder is None else os.path.join(folder, RUN_FILE)
            if path is not None and os.path.lexists(path):
                decided = {"run": _read_run_file(path), "inherited": True}
        except ConfigError as error:
            decided = {"error": str(error)}
    if sync.active:
        decided = sync.broadcast_json(decided, src=0)
    if "error" in decided:
        raise ConfigError(decided["error"])
    run = Run(str(decided["run"]), step if step > 0 else None, folder, bool(decided["inherited"]))
    setattr(trainer, _CACHE, (state, run))
    return run


def write_run_file(folder: str, run: Run) -> None:
    """Write the run identity into a ``checkpoint-N`` folder the Trainer has just saved (main process).

    Raises:
        FileNotFoundError: the folder does not exist.
        OSError: the file cannot be written.
    """
    if not os.path.isdir(folder):
        msg = f"no checkpoint folder {folder} to write {RUN_FILE} into"
        raise FileNotFoundError(msg)
    write_state_file(os.path.join(folder, RUN_FILE), {"format": RUN_FORMAT, "version": 1, "run": run.id})


def default_store_dir(args: Any, run: Run) -> str:
    """``<output_dir>/loopguard_checkpoints/<run>``: a fresh run's own rollback store, beside earlier ones."""
    return os.path.join(str(args.output_dir), STORE_FOLDER, run.id)
