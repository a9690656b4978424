"""TrainerCallbacks that put the Guard into a Hugging Face / TRL training run.

The line users write::

    trainer.add_callback(RewardHackMitigator(guard=Guard(...), trainer=trainer))  # or RewardHackMitigator()

Three callbacks live here; each is thin: the :class:`~loopguard.Guard` makes every decision (the verdict,
beta, rollback or stop, the hack's onset, when a checkpoint is safe and which one is good),
:mod:`loopguard.adapters._observe` turns the trainer's state into an :class:`~loopguard.Observation`,
:mod:`loopguard.adapters._beta` writes beta and :mod:`loopguard.adapters._rollback` saves and restores
rollback checkpoints, the same store :class:`~loopguard.adapters.loop.LoopGuard` uses in a raw loop:

* :class:`RewardHackMitigator` -- each optimizer step's new generation batches become one
  :class:`~loopguard.Observation`;
  the Guard's :class:`~loopguard.Decision` is applied (beta through the trainer's accessor, rollback through a
  :class:`~loopguard.checkpoint.CheckpointManager`, stop through ``control.should_training_stop``), logged to
  ``mitigation_log.jsonl`` and reported as ``loopguard/*`` metrics through ``report_to``.
* :class:`EchoTrapCallback` -- the n-gram repetition rate of each generation batch: OK / WARN / TRAP, and a
  halt on TRAP.
* :class:`RLCheckpointCallback` -- mid-epoch rollback checkpoints (policy, optimizer, scheduler, RNG, the
  reference model when TRL syncs it, and the mitigator's state).

**Binding to the trainer.** transformers never passes the trainer to a callback, so bind it explicitly:
``RewardHackMitigator(..., trainer=trainer)`` or ``.bind(trainer)`` (the primary path). As a fallback for the
bare ``trainer.add_callback(RewardHackMitigator())``, each callback finds its trainer at ``on_train_begin`` by
walking up the call stack to the ``Trainer`` whose ``callback_handler`` holds it (then the garbage
collector's referrers; see :mod:`loopguard.adapters._binding`). Either way it moves itself to the front of
the callback list so the metrics it adds in ``on_log`` reach TensorBoard / W&B / trackio.

**Resume state.** The mitigator writes its own ``loopguard_state.json`` into each ``checkpoint-N`` instead of
using transformers' ``ExportableState`` / ``stateful_callbacks``: those rebuild a callback from JSON
constructor arguments, which cannot carry a Guard with callables (``embed_fn``, ``gold_fn``, taps, beta
setters), and are restored only with ``restore_callback_states_from_checkpoint=True`` (off by default).

**Failures** (the policy, documented in ``docs/trl.md``). Anything that keeps a callback from working raises
at construction or at ``on_train_begin``, before the first step: a bad setting, a trainer it cannot observe
or control, a checkpoint store it cannot read, a resume state it cannot load (the message names the file or
setting). A failure inside loopguard while training runs does not end the training by default, but it is
loud every time: a ``RuntimeWarning`` and a logged error naming the step, ``loopguard/active`` 0 in the next
logged metrics, and (for the mitigator) an ``error`` record in the mitigation log. ``on_error="raise"``
makes such a failure fatal instead.

Requires the ``hf`` extra (``pip install 'loopguard[hf]'``).

Example:
    >>> from loopguard import EchoTrapCallback, Guard, RewardHackMitigator
    >>> mitigator = RewardHackMitigator(guard=Guard(mode="kl_control", warmup_steps=10))
    >>> mitigator.guard.mode, mitigator.trainer is None
    ('kl_control', True)
    >>> RewardHackMitigator(mode="log_only", guard=Guard())
    Traceback (most recent call last):
    ...
    loopguard.exceptions.ConfigError: `mode` must be None when a guard is given (the Guard's mode is 'kl_control'), got mode='log_only': configure the mode on the Guard.
    >>> EchoTrapCallback(threshold=0.6).warn
    0.3
    >>> trainer.add_callback(mitigator)  # doctest: +SKIP
"""  # noqa: E501

from __future__ import annotations

import logging
import math
import operator
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal, cast

from loopguard._run import check_run_id
from loopguard._saved_state import (
    as_state_error,
    decode_rollbacks,
    open_versioned_state,
    read_state_file,
    write_state_file,
)
from loopguard._validation import check_bool, check_choice, check_int, check_path, describe
from loopguard.adapters._beta import (
    BetaAccessor,
    Coefficient,
    check_coefficient,
    check_kl_term,
    resolve_accessor,
)
from loopguard.adapters._binding import checkpoint_dir, find_trainer, holds, move_first
from loopguard.adapters._console import Console, alert, takes_text
from loopguard.adapters._distributed import RankSync, synced_restore, synced_step
from loopguard.adapters._observe import (
    Batch,
    GenerationSource,
    MetricSource,
    TapSource,
    choose_source,
    token_text,
    trained_and_watched,
)
from loopguard.adapters._respond import (
    default_manager,
    penalise_rewards,
    prepare_reference_adapter,
    reanchor,
    reanchor_adapter,
    remove_reference_adapter,
)
from loopguard.adapters._rollback import Parts, RollbackStore, open_manager, require_shared, synced_reference
from loopguard.adapters._run_scope import Run, default_store_dir, resolve_run, write_run_file
from loopguard.adapters._tap import TappedReward, is_tapped
from loopguard.control import EscalationLadder
from loopguard.detectors import (
    DEFAULT_SIGNALS,
    HACK_LEVEL,
    WARN_LEVEL,
    GoldAudit,
    InfoRM,
    JudgeGap,
    Repetition,
    RMEnsemble,
    Takeover,
)
from loopguard.exceptions import (
    ConfigError,
    LoopguardError,
    LoopguardTypeError,
    MissingDependencyError,
    StateError,
)
from loopguard.guard import Decision, Guard, Mode, Observation, echo_guard
from loopguard.log import MAX_EXPLANATION_LENGTH, MitigationLog, MitigationRecord
from loopguard.signals import ngram_repetition_rate

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as _error:  # pragma: no cover - exercised only without the extra
    _msg = "RewardHackMitigator needs the `hf` extra: pip install 'loopguard[hf]'"
    raise MissingDependencyError(_msg) from _error

__all__ = [
    "ACTION_CODES",
    "STATE_FILE",
    "VERDICT_CODES",
    "EchoTrapCallback",
    "RLCheckpointCallback",
    "RewardHackMitigator",
]

logger = logging.getLogger("loopguard")

STATE_FILE = "loopguard_state.json"
"""Name of the mitigator's state file inside each ``checkpoint-N`` folder."""

STATE_KIND = "loopguard.RewardHackMitigator"
STATE_VERSION = 3

VERDICT_CODES: dict[str, float] = {"OK": 0.0, "WARN": 1.0, "HACK": 2.0}
"""``loopguard/verdict`` and ``loopguard/echo/verdict`` codes (TRAP is 2 for the echo callback)."""

ACTION_CODES: dict[str, float] = {
    "none": 0.0,
    "lower_beta": 1.0,
    "raise_beta": 2.0,
    "rollback": 3.0,
    "stop": 4.0,
}
"""``loopguard/action`` codes, ordered by severity (the worst action since the last log is reported)."""

_ECHO_CODES: dict[str, float] = {"OK": 0.0, "WARN": 1.0, "TRAP": 2.0}
_ON_ERROR = ("warn", "raise")
_TEXT_LIMIT = 100  # transformers' ProgressCallback prints no string value longer than this
OnError = Literal["warn", "raise"]
_STATE_KEYS = ("kind", "version", "mode", "beta", "guard", "rollbacks", "run")
_STATE_KEYS_V2 = ("kind", "version", "mode", "beta", "guard", "rollbacks", "onset", "run")  # the Guard's now


# -------------------------------------------------------------------------------------------- shared base


class _Bound(TrainerCallback):
    """Trainer binding, train-start attachment and the run-time failure policy shared by the callbacks."""

    _name = "callback"
    _metric_prefix = "loopguard"

    def __init__(self, trainer: Any = None, on_error: OnError = "warn") -> None:
        self._ready = False  # set by _start once the callback works
        self._trainer: Any = None
        self._warned: set[str] = set()
        self._resume_from: str | None = None
        self.on_error: OnError = check_choice("on_error", on_error, _ON_ERROR)  # type: ignore[assignment]
        self.errors = 0
        self._failed_since_log = False
        self._console = Console()
        if trainer is not None:
            self.bind(trainer)

    @property
    def trainer(self) -> Any:
        """The trainer this callback is bound to (None before ``bind`` / the start of training)."""
        return self._trainer

    def bind(self, trainer: Any) -> Any:
        """Bind to ``trainer`` explicitly instead of finding it at the start of training; returns ``self``.

        Raises:
            LoopguardTypeError: ``trainer`` has no ``callback_handler`` (not a transformers ``Trainer``).
        """
        if not hasattr(trainer, "callback_handler"):
            msg = (
                f"`trainer` must be a transformers Trainer (with a callback_handler), got "
                f"{type(trainer).__name__}."
            )
            raise LoopguardTypeError(msg)
        self._trainer = trainer
        return self

    def _warn_once(self, key: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)

    def _failed(self, event: str, error: BaseException, step: int) -> None:
        """A failure inside loopguard while training runs: fatal with ``on_error="raise"``, else loud."""
        if self.on_error == "raise":
            raise error
        self.errors += 1
        self._failed_since_log = True
        message = (
            f"loopguard: {type(self).__name__}.{event} failed at step {step} ({self.errors} failure(s) so "
            f"far; training continues, on_error='raise' makes this fatal): {type(error).__name__}: {error}"
        )
        self._console.emit(logging.ERROR, message, everywhere=True)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        self._record_failure(event, error, step, message)

    def _record_failure(self, event: str, error: BaseException, step: int, message: str) -> None:
        """Hook: keep a durable record of a failure (the mitigator writes one to its log)."""

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Act on the end of an optimizer step (:meth:`_on_step`), under the failure policy."""
        if not self._ready:
            return
        try:
            self._on_step(args, state, control)
        except Exception as error:  # the failure policy (module docs)
            self._failed("on_step_end", error, int(state.global_step))

    def _on_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl) -> None:
        """What the callback does at the end of an optimizer step (subclasses)."""

    def _start(self, args: TrainingArguments, state: TrainerState) -> None:
        """Set the callback up at the start of training (subclasses)."""

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Set up; anything that keeps the callback from working stops the run here, before the first step."""
        self._console.open(self._trainer, args, state)  # the trainer's log level from here on
        try:
            self._start(args, state)
        except LoopguardError:
            raise
        except Exception as error:  # never silently off: a callback that cannot start stops the run
            msg = (
                f"{type(self).__name__} could not start, so training does not start without it: "
                f"{type(error).__name__}: {error}"
            )
            raise ConfigError(msg) from error
        self._console.trainer = self._trainer

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Say how the run went (:meth:`_end`)."""
        if not self._ready:
            return
        try:
            self._end(args, state)
        except Exception as error:  # the failure policy (module docs)
            self._failed("on_train_end", error, int(state.global_step))

    def _end(self, args: TrainingArguments, state: TrainerState) -> None:
        """What the callback says when training ends (subclasses)."""

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Add this callback's ``loopguard/*`` metrics to a training log, before the reporters see it."""
        if not self._ready or logs is None or _is_eval_log(logs):
            return
        try:
            _inject(state, logs, self._log_metrics())
            text = self._log_text()
            if text and takes_text(self._trainer):
                _inject(state, logs, text)
        except Exception as error:  # the failure policy (module docs)
            self._failed("on_log", error, int(state.global_step))

    def _log_metrics(self) -> dict[str, float]:
        """The metrics of one training log (default: ``<prefix>/active`` and ``<prefix>/errors``)."""
        return self._active_metrics(self._metric_prefix)

    def _log_text(self) -> dict[str, str]:
        """Text for the trackers that take it (none by default)."""
        return {}

    def _active_metrics(self, prefix: str) -> dict[str, float]:
        """``<prefix>/active`` (0 after a failure since the last log) and ``<prefix>/errors`` (a count)."""
        active = 0.0 if self._failed_since_log else 1.0
        out = {f"{prefix}/active": active, f"{prefix}/errors": float(self.errors)}
        self._failed_since_log = False
        return out

    def _attach(self) -> Any:
        """Find (or check) the trainer at ``on_train_begin`` and move this callback first."""
        found, resume = find_trainer(self)
        self._resume_from = resume
        trainer = self._trainer if self._trainer is not None else found
        if trainer is None:
            msg = (
                f"{type(self).__name__} could not find the trainer it was added to (no object holding it "
                "was on the call stack or among its referrers): pass trainer=... or call .bind(trainer)."
            )
            raise ConfigError(msg)
        if not holds(trainer, self):
            msg = (
                f"{type(self).__name__} is bound to a {type(trainer).__name__} whose callbacks do not "
                "include it: add it with trainer.add_callback(...) on the trainer it is bound to."
            )
            raise ConfigError(msg)
        self._trainer = trainer
        move_first(trainer, self)
        return trainer


class _Observer(_Bound):
    """A callback that reads what the trainer generated: every generation batch of a step, each once."""

    _source: GenerationSource | TapSource | MetricSource | None = None
    _sync: RankSync

    def on_substep_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Read a generation batch made inside a gradient-accumulation micro-step (several feed a step)."""
        if not self._ready or not isinstance(self._source, GenerationSource):
            return
        try:
            self._source.collect()
        except Exception as error:  # the failure policy (module docs)
            self._failed("on_substep_end", error, int(state.global_step))


def _start_store(store: RollbackStore, run: Run, state: TrainerState) -> None:
    """Scope a rollback store to the run of this training session (claim it; trim an abandoned timeline)."""
    discarded = store.start(run, main=bool(state.is_world_process_zero))
    if discarded:
        logger.warning(
            "loopguard: resumed run %s at step %d; discarded its rollback checkpoints of the abandoned "
            "timeline (steps %s) from %s",
            run.id,
            run.resumed_from,
            ", ".join(map(str, discarded)),
            store.manager.directory,
        )


def _check_raw_rewards_logged(trainer: Any) -> None:
    """A ``shape_reward`` wrapper that keeps its raw reward out of TRL's logs would hide it from the Guard.

    Read from TRL's per-completion logs, the Guard scores a shaped function's raw reward only through the
    ``"<name>/unshaped"`` column the wrapper logs; with ``log_to_trainer=False`` it would score the shaped
    reward, which the penalty pushes down exactly when the hack pushes the raw one up.
    """
    for fn in getattr(trainer, "reward_funcs", None) or ():
        config = getattr(fn, "shaping", None)
        if config is not None and getattr(config, "log_to_trainer", True) is False:
            name = getattr(fn, "__name__", type(fn).__name__)
            msg = (
                f"reward function {name!r} is a shape_reward(..., log_to_trainer=False) wrapper: its raw "
                "reward never reaches TRL's logs, so loopguard would score the shaped reward (which the "
                "penalty lowers exactly when a hack raises the raw one). Pass log_to_trainer=True, or wrap "
                "it with loopguard.tap(...) and pass taps=[...] (a tap records the raw reward)."
            )
            raise ConfigError(msg)


def _normalises_advantages(args: Any) -> bool:
    """Whether the trainer divides advantages by their spread (GRPO's ``scale_rewards``, RLOO's option)."""
    scale = getattr(args, "scale_rewards", None)
    if scale is not None:
        return scale not in ("none", False)
    return bool(getattr(args, "normalize_advantages", False))


_EVAL_KEY = operator.methodcaller("startswith", ("eval_", "test_"))


def _is_eval_log(logs: Mapping[str, Any]) -> bool:
    return any(map(_EVAL_KEY, map(str, logs)))


def _inject(state: TrainerState, logs: dict[str, Any], metrics: Mapping[str, Any]) -> None:
    """Put ``metrics`` into the ``logs`` every later callback sees, and into the log history entry."""
    logs.update(metrics)
    history = getattr(state, "log_history", None)
    entry = history[-1] if history else None
    if (
        isinstance(entry, dict)
        and entry.get("step") == state.global_step
        and entry.keys() >= logs.keys() - metrics.keys()  # every key of the log but ours
    ):
        entry.update(metrics)


def _status(decision: Decision, previous: str) -> str:
    """``OK -> HACK (vote 0.62: takeover 0.91, repetition 0.44); raised beta 0.001 -> 0.21``."""
    top = sorted(decision.scores.items(), key=lambda item: -item[1])[:3]
    signals = ", ".join(f"{name} {score:.2f}" for name, score in top if score >= WARN_LEVEL)
    verdict = decision.verdict if previous == decision.verdict else f"{previous} -> {decision.verdict}"
    text = f"{verdict} (vote {decision.vote:.2f}{': ' + signals if signals else ''})"
    before, after = decision.beta_before, decision.beta_after
    if decision.action in ("raise_beta", "lower_beta") and before is not None and after is not None:
        verb = "raised" if decision.action == "raise_beta" else "lowered"
        text += f"; {verb} beta {before:.3g} -> {after:.3g}"
    elif decision.action == "rollback":
        text += "; rolling back"
    elif decision.action == "stop":
        text += "; stopping the run"
    return text


def _joined(events: Sequence[str], kept: Sequence[str]) -> str:
    """The ``kept`` newest of ``events`` in one line, with how many earlier ones were left out."""
    dropped = len(events) - len(kept)
    return (f"(+{dropped} earlier) " if dropped else "") + "; ".join(kept)


def _worse(current: float | None, new: float) -> float:
    return new if current is None else max(current, new)


def _guard_of(
    mode: object,
    guard: object,
    on_error: OnError,
    rollback: bool | None,
    signals: Sequence[str | JudgeGap] | None = None,
    *,
    names: bool = True,
) -> Guard:
    """The mitigator's Guard: the one given, or the ``mode`` preset (default ``"kl_control"``).

    A preset that changes beta gets the default :class:`EscalationLadder` (rollback, targeted penalty, stop)
    unless ``rollback=False``, and with it an unscored ``takeover`` (``Takeover(scored=False)``: it never
    votes, it names the n-gram spreading through the batch for the targeted rung to price) unless
    ``names=False``; ``signals`` (a preset only) replaces the default signals.
    """
    if guard is None:
        chosen = mode or "kl_control"
        ladder = EscalationLadder() if rollback is not False and chosen != "log_only" else None
        detectors: list[Any] = list(DEFAULT_SIGNALS if signals is None else signals)
        if names and ladder is not None and ladder.targeted:
            detectors.append(Takeover(scored=False))
        return Guard(detectors, mode=chosen, ladder=ladder, on_error=on_error)  # type: ignore[arg-type]
    if rollback is not None:
        msg = (
            f"`rollback` must be None when a guard is given (its ladder decides: Guard(..., "
            f"ladder=EscalationLadder()) or ladder=None), got rollback={rollback!r}."
        )
        raise ConfigError(msg)
    if mode is not None:
        current = getattr(guard, "mode", None)
        msg = (
            f"`mode` must be None when a guard is given (the Guard's mode is {current!r}), got "
            f"mode={mode!r}: configure the mode on the Guard."
        )
        raise ConfigError(msg)
    if not isinstance(guard, Guard):
        msg = f"`guard` must be a loopguard.Guard, got {describe(guard)}."
        raise LoopguardTypeError(msg)
    return guard


def _parts(trainer: Any, args: Any, *, scheduler: bool = True) -> Parts:
    """The trainer's policy, optimizer, scheduler and (when TRL syncs it) reference model.

    Under DeepSpeed the policy is the engine (``trainer.model_wrapped``): it checkpoints its own partitions.
    """
    from loopguard.checkpoint._sharded import is_deepspeed

    wrapped = getattr(trainer, "model_wrapped", None)
    return Parts(
        wrapped if is_deepspeed(wrapped) else trainer.model,
        trainer.optimizer,
        trainer.lr_scheduler if scheduler else None,
        synced_reference(trainer, args),
    )


# -------------------------------------------------------------------------------------------- the mitigator


class RewardHackMitigator(_Observer):
    """Watch a TRL / transformers training run for reward hacking and close the loop.

    ``trainer.add_callback(RewardHackMitigator(mode="kl_control"))``. The generation batches of each optimizer
    step (each read once, however many steps reuse it; several when they feed one step) become one
    :class:`~loopguard.Observation`: the proxy reward (TRL's weighted sum of the reward functions' *unshaped*
    outputs; unscorable completions left out, as TRL leaves them out), completions and their token ids (the
    trainer's tokenizer), prompts, ``num_generations`` as the group size, the step's mean ``kl`` and
    ``entropy``. The :class:`~loopguard.Guard` decides; the mitigator applies the decision:

    * **beta** through the trainer's accessor: GRPO / RLOO / DPO ``trainer.beta``, online DPO
      ``trainer._beta``, or ``coefficient=`` for anything else. Beta stays > 0.
    * **rollback** through a :class:`~loopguard.checkpoint.CheckpointManager`: restore the newest good
      checkpoint saved before the hack's onset (weights, optimizer, the synced reference model; the LR
      scheduler only with ``restore_scheduler=True``; RNG streams keep going), then drop the buffered
      generations so the next batch comes from the restored policy. ``global_step`` does not rewind.
    * **stop** through ``control.should_training_stop`` (the explanation is logged and warned), after
      restoring the last good checkpoint when there is a store (``restore_on_stop``).

    Every decision goes to ``mitigation_log.jsonl`` (main process) and, at each logging step, ``loopguard/*``
    metrics go into the trainer's logs: ``beta``, ``verdict`` (0 OK, 1 WARN, 2 HACK: the worst since the last
    logging step), ``vote``, ``action`` (0 none, 1 lower_beta, 2 raise_beta, 3 rollback, 4 stop: the worst
    since the last logging step), ``score/<signal>`` (absent while the signal has measured nothing: warm-up,
    or no input), ``warming_up``, ``rollbacks``, ``active`` (0 after a failure since the last log) and
    ``errors``; and ``loopguard/status``, the status lines since the last log as text, when the trainer
    reports to TensorBoard, W&B or trackio. While training runs, the ``loopguard`` logger follows the
    trainer's ``log_level`` (status lines at the end of the warm-up, at each verdict change and action, an
    end-of-run summary; see ``adapters/_console.py``), the progress bar shows the verdict and beta, and W&B /
    trackio get an alert at the first HACK of an episode, a rollback and a stop (``alerts=False``: none). The
    state is written to ``loopguard_state.json`` in each ``checkpoint-N`` and read back on
    ``resume_from_checkpoint``, with the run identity (``run_id``; ``loopguard_run.json``) that scopes the
    rollback store and the log records (see ``docs/trl.md``).

    Args:
        mode: A shorthand for ``guard=Guard(mode=mode, ladder=EscalationLadder())`` with every default:
            ``"kl_control"`` (bang-bang, the default when neither is given), ``"pid_lagrangian"``,
            ``"adaptive_kl"`` or ``"log_only"`` (observe and log, never change anything; no ladder). So the
            one-liner ``RewardHackMitigator()`` raises beta, then switches on a targeted penalty and rolls
            back (re-anchoring the KL reference on the restored policy), and stops only when nothing else
            worked (see ``docs/controllers.md``).
        guard: The :class:`~loopguard.Guard` that decides: its signals, controller, escalation ladder (the
            rollback and stop rungs; rollbacks need a checkpoint source), warm-up, smoothing and vote.
            ``RMEnsemble(members=("rm_a", "rm_b"))`` names the trainer's reward functions that form the
            ensemble (a member may have weight 0 in ``reward_weights``: watched, not trained on);
            ``"rm_ensemble"`` alone uses every reward function. ``InfoRM(embed_fn=...)`` (reference latents
            from the first half of the warm-up, or ``reference_embeddings=``) and ``GoldAudit(gold_fn=...)``
            need their callables: the trainer has no embeddings or gold scores to offer.
        checkpoint: A :class:`~loopguard.checkpoint.CheckpointManager` or a directory: the mitigator saves
            rollback checkpoints there every ``checkpoint_every`` steps. None: use an attached
            :class:`RLCheckpointCallback`'s store, or else (when the ladder rolls back) a store of its own,
            scoped to the run: in memory when one process trains and 3 checkpoints (parameters plus two
            Adam moments per trainable parameter) fit in 2 GiB, otherwise on disk in
            ``<output_dir>/loopguard_checkpoints/<run>``. Its own store also keeps the starting policy as
            step 0, the rollback target of a flaw that pays from the first step.
        checkpoint_every: Steps between rollback checkpoints, >= 1. Default 10.
        restore_scheduler: Restore the LR scheduler on rollback (the LR moves back with the weights) instead
            of keeping it on the global-step schedule. Default False.
        restore_on_stop: When the Guard stops the run and a checkpoint store exists, restore the newest good
            checkpoint saved before the hack's onset first, so the trainer ends with (and ``save_model``
            saves) the last good policy, not the hacked one. Default True.
        coefficient: ``(getter, setter)`` callables, or a dotted attribute path on the trainer such as
            ``"args.kl_coef"``, for trainers without a ``beta`` attribute.
        taps: Reward functions wrapped with :func:`loopguard.tap` to read rewards from (default: tapped
            functions among ``trainer.reward_funcs`` when the trainer keeps no per-completion logs).
        group_size: Completions per prompt for tapped rewards (GRPO / RLOO use ``num_generations``).
        log_path: The JSONL mitigation log; default ``<output_dir>/mitigation_log.jsonl``.
        on_error: What a failure inside loopguard while training runs does: ``"warn"`` (default: a warning
            and a logged error naming the step, every time; ``loopguard/active`` 0; an ``error`` record in
            the mitigation log; training goes on) or ``"raise"`` (fatal). With ``mode=``, passed to the
            Guard as well (a Guard you pass keeps its own ``on_error``).
        trainer: The trainer to bind to now (the primary path: ``RewardHackMitigator(trainer=trainer)``, or
            ``.bind(trainer)``); otherwise it is searched for at the start of training (see the module docs).
        rollback: With ``mode`` (or neither): ``False`` for beta-only control (no ladder: no rollback, no
            targeted penalty, no stop); None (default) keeps the ladder. Must be None with ``guard``, whose
            ladder decides.
        alerts: Raise an alert on the run's W&B or trackio tracker (``alert(title, text, level)``) at the
            first HACK of an episode, at a rollback and at a stop. Default True; False: no alerts.

    Raises:
        ConfigError, LoopguardTypeError: at construction for a bad argument, both ``mode`` and ``guard``, an
            ``info_rm`` without ``embed_fn``, a ``gold`` signal without ``gold_fn``, a bool for a number,
            ``checkpoint`` without a Guard ladder that rolls back, ``rollback`` with ``guard``; at the start
            of training for a trainer whose beta is 0 (or not found) in a KL-changing mode, unknown ensemble
            members, a trainer with nothing to observe, a rollback store that cannot be read
            or belongs to another run, a resume state or run file that does not load, or any other exception
            while starting (raised as a ``ConfigError``).

    Example:
        >>> mitigator = RewardHackMitigator(guard=Guard(["repetition", "diversity"], mode="log_only"))
        >>> [detector.name for detector in mitigator.guard.detectors]
        ['repetition', 'diversity']
        >>> RewardHackMitigator(checkpoint_every=True)
        Traceback (most recent call last):
        ...
        loopguard.exceptions.LoopguardTypeError: `checkpoint_every` must be an integer (not bool), got True.
    """

    _name = "RewardHackMitigator"

    def __init__(
        self,
        mode: Mode | None = None,
        *,
        guard: Guard | None = None,
        checkpoint: Any = None,
        checkpoint_every: int = 10,
        restore_scheduler: bool = False,
        restore_on_stop: bool = True,
        coefficient: Coefficient | None = None,
        taps: Sequence[TappedReward] | None = None,
        group_size: int | None = None,
        log_path: str | os.PathLike[str] | None = None,
        on_error: OnError = "warn",
        trainer: Any = None,
        rollback: bool | None = None,
        alerts: bool = True,
    ) -> None:
        """Validate the configuration (see the class docstring)."""
        on_error = check_choice("on_error", on_error, _ON_ERROR)  # type: ignore[assignment]
        self.alerts = check_bool("alerts", alerts)
        if rollback is not None:
            rollback = check_bool("rollback", rollback)
        self.guard = _guard_of(mode, guard, on_error, rollback)
        # the preset's arguments: at the start of training it may add the trainer's watched reward functions
        self._preset = None if guard is not None else (mode, on_error, rollback)
        ladder = self.guard.ladder
        for detector in self.guard.detectors:
            if isinstance(detector, InfoRM) and detector.embed_fn is None:
                msg = (
                    "signal 'info_rm' needs embeddings, and a trainer has none to put in observations: pass "
                    "InfoRM(embed_fn=...) (a function from completion texts to an [N, D] array)."
                )
                raise ConfigError(msg)
            if isinstance(detector, GoldAudit) and detector.gold_fn is None:
                msg = (
                    "signal 'gold' needs gold scores, and a trainer has none to put in observations: pass "
                    "GoldAudit(gold_fn=...) (a judge scoring (prompts, completions))."
                )
                raise ConfigError(msg)
        self.checkpoint_every = check_int("checkpoint_every", checkpoint_every, lo=1)
        self.restore_scheduler = check_bool("restore_scheduler", restore_scheduler)
        self.restore_on_stop = check_bool("restore_on_stop", restore_on_stop)
        self._manager = None if checkpoint is None else open_manager(checkpoint)
        if self._manager is not None and (ladder is None or ladder.max_rollbacks == 0):
            msg = (
                "`checkpoint` is only used for rollbacks: give the Guard an EscalationLadder with "
                f"max_rollbacks >= 1 too (Guard(..., ladder=EscalationLadder())), got ladder={ladder!r}."
            )
            raise ConfigError(msg)
        self._coefficient = check_coefficient(coefficient)
        self._taps: list[TappedReward] | None = None
        if taps is not None:
            if isinstance(taps, (str, bytes)) or not isinstance(taps, Sequence) or not taps:
                msg = (
                    f"`taps` must be a non-empty list of loopguard.tap(...) functions, got {describe(taps)}."
                )
                raise LoopguardTypeError(msg)
            for index, fn in enumerate(taps):
                if not is_tapped(fn):
                    msg = f"`taps[{index}]` must be wrapped with loopguard.tap(...), got {describe(fn)}."
                    raise LoopguardTypeError(msg)
            self._taps = list(taps)
        self.group_size = None if group_size is None else check_int("group_size", group_size, lo=2)
        self.log_path = None if log_path is None else check_path("log_path", log_path)
        self._accessor: BetaAccessor | None = None
        self._source: GenerationSource | TapSource | MetricSource | None = None
        self._store: RollbackStore | None = None
        self._own_store = False
        self._penalised: str | None = None
        self._ref_model: Any = None
        self._ref_adapter = False  # a PEFT policy's "ref" adapter stands for the reference model
        self._ref_adapter_added = False  # ...and this callback added it (removed at the end of training)
        self._members: tuple[str, ...] | None = None
        self._log: MitigationLog | None = None
        self.rollbacks: list[dict[str, int]] = []
        self.last_decision: Decision | None = None
        self._since_log: dict[str, float] = {}
        self._shown = "OK"  # the verdict of the last status line
        self._warmed = False  # the warm-up-done line was shown
        self._last_action = "none"
        self._events: list[str] = []  # status lines since the last log, for trackers that take text
        self._sync = RankSync()
        self.run_id: str | None = None
        self._run: Run | None = None
        super().__init__(trainer, on_error)

    # ------------------------------------------------------------------------------------------- helpers

    @property
    def beta(self) -> float | None:
        """The trainer's KL coefficient now (None when the trainer has none or is not bound yet)."""
        if self._accessor is None:
            return None
        try:
            return self._accessor.get()
        except LoopguardError:
            return None

    @property
    def checkpoints(self) -> Any:
        """The CheckpointManager used for rollbacks (None when there is none)."""
        return None if self._store is None else self._store.manager

    def state_dict(self) -> dict[str, Any]:
        """The mitigator's state as plain JSON (the Guard's state, beta, rollbacks, the run)."""
        return {
            "kind": STATE_KIND,
            "version": STATE_VERSION,
            "mode": self.guard.mode,
            "beta": self.beta,
            "guard": self.guard.state_dict(),
            "rollbacks": [dict(entry) for entry in self.rollbacks],
            "run": self.run_id,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (and write its beta into a bound trainer): all or nothing.

        Every field is checked before anything changes: the kind and version, the exact keys, each value's
        type and range, the Guard's state against this Guard's configuration, and the run: a state saved
        by another run is refused once this mitigator has a run identity. A version-2 state (which kept the
        hack's onset here, not in the Guard) still loads.

        Raises:
            StateError: a malformed, truncated or unreachable state, another kind or version, a Guard
                configured differently, or another run's state. The mitigator (and the trainer's beta) is then
                unchanged.
        """
        versions = {2: _STATE_KEYS_V2, STATE_VERSION: _STATE_KEYS}
        fields, version = open_versioned_state(
            state, kind=STATE_KIND, versions=versions, owner="RewardHackMitigator"
        )
        old = version == 2
        mode = fields.raw("mode")
        if mode != self.guard.mode:
            msg = f"`state['mode']` must be this mitigator's mode {self.guard.mode!r}, got {describe(mode)}."
            raise StateError(msg)
        fields.real("beta", lo=0.0, lo_inclusive=False, optional=True)
        guard = self.guard.decode_state(fields.raw("guard"))
        if old:
            guard.episode.onset = fields.integer("onset", lo=0, optional=True)
            guard.episode.healthy = guard.episode.healthy and guard.episode.onset is None
        rollbacks = decode_rollbacks(fields)
        run = fields.raw("run")
        if run is not None:
            with as_state_error():
                run = check_run_id("state['run']", run)
        if self.run_id is not None and run != self.run_id:
            msg = (
                f"`state['run']` must be this run's identity {self.run_id!r}, got {describe(run)}: the state "
                "belongs to another run."
            )
            raise StateError(msg)
        self.guard.load_state_dict(guard)
        self.rollbacks, self.run_id = rollbacks, run
        beta = self.guard.beta
        if self._accessor is not None and self.guard.mode != "log_only" and beta is not None:
            self._accessor.set(float(beta))

    # ------------------------------------------------------------------------------------------- events

    def _start(self, args: TrainingArguments, state: TrainerState) -> None:
        """Find the trainer, check the configuration against it, restore the state on resume (fail fast)."""
        self._ready = False
        trainer = self._attach()
        mode = self.guard.mode
        self._accessor = resolve_accessor(trainer, self._coefficient)
        if mode != "log_only":
            check_kl_term(trainer, self._accessor, mode)
            if getattr(trainer, "_beta", None) is not None and isinstance(trainer._beta, list):
                self._warn_once(
                    "schedule",
                    "loopguard replaces online DPO's per-epoch beta schedule with the one beta it controls.",
                )
        self._source = choose_source(trainer, taps=self._taps, group_size=self.group_size)
        if self._source is None:
            msg = (
                f"RewardHackMitigator cannot read rewards from {type(trainer).__name__}: wrap the reward "
                "function with loopguard.tap(...) and pass taps=[...] (or add the tapped function to the "
                "trainer's reward_funcs)."
            )
            raise ConfigError(msg)
        self._fit_preset(trainer, args, state)
        self._members = self._ensemble_members(trainer)
        if isinstance(self._source, GenerationSource):
            _check_raw_rewards_logged(trainer)
        if mode != "log_only" and isinstance(self._source, MetricSource):
            self._warn_no_vote(trainer)
        run = resolve_run(trainer, args, state, self._resume_from, self._sync)
        self._run, self.run_id = run, run.id
        self._setup_reference(trainer)  # before the store saves step 0: a "ref" adapter is part of the policy
        self._setup_store(trainer, args, state, run)
        self._setup_response(trainer, args, state)
        self._log = None
        if state.is_world_process_zero:
            path = self.log_path or os.path.join(str(args.output_dir), "mitigation_log.jsonl")
            self._log = MitigationLog(path)
        self._resume(args, state)
        self._log_session(state, run)
        self._ready = True
        names = ", ".join(detector.name for detector in self.guard.detectors)
        beta = "" if self.beta is None else f", beta {self.beta:g}"
        self._console.status(
            logging.INFO,
            f"loopguard: watching {names} (mode {mode}{beta}); warm-up {self.guard.warmup_steps} steps.",
        )

    def _warn_no_vote(self, trainer: Any) -> None:
        """A KL-changing mode on a trainer that shows loopguard only its logged metrics: nothing can vote."""
        voters = [d.name for d in self.guard.detectors if d.role == "primary"]
        message = (
            f"loopguard: {type(trainer).__name__} shows loopguard only its logged metrics (the reward, KL "
            f"and entropy; no completions), and no signal of this Guard that can vote reads those "
            f"(voting signals: {', '.join(voters) or 'none'}), so mode={self.guard.mode!r} will never "
            "change beta: the loopguard/* metrics are logged, nothing else. Offline DPO trains on fixed "
            "pairs and has no rollouts to watch. To control beta, train on rollouts that loopguard reads: "
            "GRPO / RLOO, or online DPO with its judge or reward model wrapped in loopguard.tap(...) "
            "(taps=[...]), scored by a GoldAudit(gold_fn=...) judge or an RMEnsemble of reward models. "
            "Pass mode='log_only' to only log."
        )
        self._console.emit(logging.WARNING, message)
        self._warn_once("no_vote", message)

    def _log_session(self, state: TrainerState, run: Run) -> None:
        """A ``start`` or ``resume`` record: where this session begins on the run's timeline."""
        if self._log is None:
            return
        step = int(state.global_step)
        if run.inherited:
            text = (
                f"run {run.id} resumed from {run.folder} at step {step}: its records after step {step} "
                "written before this one belong to an abandoned timeline."
            )
        elif run.resumed_from is not None:
            text = (
                f"run {run.id} started at step {step}, resuming a checkpoint ({run.folder}) that has no "
                "loopguard run identity: a new loopguard run."
            )
        else:
            text = f"run {run.id} started fresh at step {step}."
        record = MitigationRecord(
            step=step,
            mode=self.guard.mode,
            event="resume" if run.inherited else "start",
            run=run.id,
            explanation=text,
            beta_before=self.beta,
            beta_after=self.beta,
        )
        if not self._log.append(record):
            self._warn_once("log", f"loopguard: could not write the mitigation log {self._log.path}.")

    def _record_failure(self, event: str, error: BaseException, step: int, message: str) -> None:
        """An ``error`` record in the mitigation log (main process)."""
        if self._log is None:
            return
        limit = MAX_EXPLANATION_LENGTH
        text = message if len(message) <= limit else message[: limit - 3] + "..."
        record = MitigationRecord(
            step=max(0, step),
            mode=self.guard.mode,
            event="error",
            run=self.run_id,
            explanation=text,
            extra={"callback_event": event, "error": type(error).__name__},
        )
        self._log.append(record)

    def _fit_preset(self, trainer: Any, args: TrainingArguments, state: TrainerState) -> None:
        """Fit the preset Guard to the trainer's watched reward functions and to the state it resumes.

        A reward function that a TRL trainer scores with weight 0 is logged, not trained on: the user's
        second opinion on the completions. With exactly one trained function, the preset Guard gains the
        ``judge_gap`` signal over it and the watched ones (:class:`~loopguard.detectors.JudgeGap`: the
        trained reward rising beyond what its judges confirm; a watched function whose reference scores
        correlate with the trained one's below 0.5 is left out: it measures something else). A Guard given
        by the user, a Guard that has already stepped, or several trained functions (which one a judge
        judges is not known) get none; the last is said at the start. A run resumed from a state saved
        without judges, or without the preset's unscored ``takeover`` (an earlier loopguard's), resumes as
        it was saved (said at the start).
        """
        if self._preset is None or self._source is None or self.guard.reference_batches or self.guard.seen:
            return
        saved = self._saved_signals(args, state)
        preset_names = any(isinstance(detector, Takeover) for detector in self.guard.detectors)
        names = saved is None or Takeover.name in saved or not preset_names
        if not names:
            self._console.status(
                logging.INFO,
                "loopguard: the state being resumed was saved without the unscored takeover that names what "
                "the targeted penalty prices, so this run goes on as it was saved, without it.",
            )
        judges = self._judges(trainer, self._source.function_names(), saved)
        if judges is None and names:
            return
        mode, on_error, rollback = self._preset
        signals: list[str | JudgeGap] = [*DEFAULT_SIGNALS]
        if judges is not None:
            signals.append(judges)
        self.guard = _guard_of(mode, None, on_error, rollback, signals=signals, names=names)

    def _judges(self, trainer: Any, functions: Sequence[str], saved: list[Any] | None) -> JudgeGap | None:
        """The trainer's watched reward functions as judges of its one trained function (see above)."""
        trained, watched = trained_and_watched(trainer, functions)
        if not watched:
            return None
        listed = ", ".join(watched)
        if len(trained) != 1:
            self._console.status(
                logging.INFO,
                f"loopguard: the watched reward functions ({listed}; weight 0) are not read as judges: the "
                f"trainer trains on {len(trained)} reward functions, and which one they judge is not known "
                "(name them: guard=Guard([..., JudgeGap(members=(trained, *watched))])).",
            )
            return None
        if saved is not None and JudgeGap.name not in saved:
            self._console.status(
                logging.INFO,
                f"loopguard: the state being resumed was saved without judges, so this run goes on as it was "
                f"saved: the watched reward functions ({listed}) are not read as judges.",
            )
            return None
        judges = JudgeGap(members=(trained[0], *watched))
        self._console.status(
            logging.INFO,
            f"loopguard: reading the watched reward functions {listed} (weight 0) as judges of {trained[0]} "
            f"(signal judge_gap; a judge whose reference scores correlate with {trained[0]}'s below "
            f"{judges.min_agreement:g} is left out). To choose the signals yourself: guard=Guard([...]).",
        )
        return judges

    def _state_path(self, args: TrainingArguments, state: TrainerState) -> str:
        """The loopguard state file of the checkpoint this run resumes from."""
        return os.path.join(self._resume_from or checkpoint_dir(args, state), STATE_FILE)

    def _saved_signals(self, args: TrainingArguments, state: TrainerState) -> list[Any] | None:
        """The signals of the Guard state this run resumes from (None: a fresh run, or none readable).

        A state that cannot be read is left to :meth:`_resume`, which refuses it loudly.
        """
        if state.global_step <= 0:
            return None
        path = self._state_path(args, state)
        try:
            signals = read_state_file(path)["guard"]["config"]["signals"]
        except (OSError, LoopguardError, KeyError, TypeError):
            return None
        return signals if isinstance(signals, list) else None

    def _ensemble_members(self, trainer: Any) -> tuple[str, ...] | None:
        readers = [d for d in self.guard.detectors if isinstance(d, (RMEnsemble, JudgeGap))]
        if not readers or self._source is None:
            return None
        detector = readers[0]
        if len(readers) > 1 and readers[1].members != detector.members:
            msg = (
                "`RMEnsemble(members=...)` and `JudgeGap(members=...)` must name the same reward functions "
                f"(one ensemble is read each step), got {detector.members!r} and {readers[1].members!r}."
            )
            raise ConfigError(msg)
        names = self._source.function_names()
        members, kind = detector.members, type(detector).__name__
        if members is None or (isinstance(members, int) and members == len(names)):
            chosen = names
        elif isinstance(members, tuple):
            missing = [name for name in members if name not in names]
            if missing:
                msg = (
                    f"`{kind}(members=...)` must name reward functions of the trainer "
                    f"({', '.join(names)}), "
                    f"got unknown {', '.join(repr(name) for name in missing)}."
                )
                raise ConfigError(msg)
            chosen = members
        else:
            msg = (
                f"`{kind}(members={members})` must name the trainer's reward functions to use (it has "
                f"{len(names)}: {', '.join(names)}), got a count that does not match."
            )
            raise ConfigError(msg)
        if len(chosen) < 2:
            msg = (
                f"signal {detector.name!r} needs at least 2 reward functions to compare, got "
                f"{len(chosen)} ({', '.join(chosen) or 'none'}): add watched members with weight 0."
            )
            raise ConfigError(msg)
        return tuple(chosen)

    def _setup_store(self, trainer: Any, args: TrainingArguments, state: TrainerState, run: Run) -> None:
        ladder = self.guard.ladder
        wants = ladder is not None and ladder.max_rollbacks > 0
        if self._manager is not None:
            require_shared(self._manager, int(getattr(args, "world_size", 1) or 1))
            if self._store is None or self._store.manager is not self._manager:
                self._store = RollbackStore(self._manager, self.checkpoint_every, guard=self.guard)
            self._own_store = True
            _start_store(self._store, run, state)
        else:
            attached = next(
                (cb for cb in trainer.callback_handler.callbacks if isinstance(cb, RLCheckpointCallback)),
                None,
            )
            self._store = None if attached is None else attached._store_for(args, state, run)
            self._own_store = False
        if wants and self._store is None:  # the one-liner protects: a run-scoped store of its own
            world = int(getattr(args, "world_size", 1) or 1)
            folder = default_store_dir(args, run)
            manager, why = default_manager(trainer.model, world_size=world, directory=folder)
            # in memory, nothing outlives the process to resume from: keep what a rollback restores
            self._store = RollbackStore(
                manager, self.checkpoint_every, guard=self.guard, resumable=not manager.in_memory
            )
            self._own_store = True
            _start_store(self._store, run, state)
            self._console.status(
                logging.INFO, f"loopguard: rollback checkpoints every {self.checkpoint_every} steps, {why}"
            )
        if self._own_store and self._store is not None and int(state.global_step) == 0:
            # the policy training starts from is good by definition: the rollback target of a flaw that pays
            # from the first step, before any later checkpoint could be confirmed
            main = bool(state.is_world_process_zero)
            self._store.save_initial(_parts(trainer, args), main=main, extra_state=self.state_dict)

    def _setup_response(self, trainer: Any, args: TrainingArguments, state: TrainerState) -> None:
        """What the ladder's newer rungs need from the trainer: the advantage scale, the penalty, the ref."""
        ladder = self.guard.ladder
        if self.guard.trainer_advantage_scale is None and _normalises_advantages(args):
            self.guard.trainer_advantage_scale = 1.0
        # the explanations quote the tokens they name (a targeted penalty's, the word reading's) as the
        # trainer's tokenizer writes them
        self.guard.trainer_token_text = token_text(getattr(trainer, "processing_class", None))
        self._penalised = None
        if ladder is not None and ladder.targeted:
            self._penalised = penalise_rewards(trainer, self.guard)
            if self._penalised is None:
                self._warn_once(
                    "penalty",
                    f"loopguard: {type(trainer).__name__} has no reward function to add the targeted penalty "
                    "to (a reward model, or rewards from a tap): the ladder's targeted rung cannot act "
                    "(EscalationLadder(targeted=False) silences this).",
                )
        if self._reanchors() and self._ref_model is None and not self._ref_adapter:
            self._warn_once(
                "reanchor",
                f"loopguard: {type(trainer).__name__} has no separate reference model, and its reference "
                "cannot be moved either (re-anchoring a PEFT policy needs a LoRA adapter under TRL's GRPO "
                "or RLOO, without DeepSpeed or FSDP): after a rollback the KL reference stays the initial "
                "model, not the restored policy (EscalationLadder(reanchor=False) silences this).",
            )

    def _reanchors(self) -> bool:
        ladder = self.guard.ladder
        return (
            ladder is not None
            and ladder.reanchor
            and ladder.max_rollbacks > 0
            and self.guard.mode != "log_only"
        )

    def _setup_reference(self, trainer: Any) -> None:
        """What a rollback re-anchors: TRL's ``ref_model``, or a PEFT LoRA policy's ``"ref"`` adapter."""
        self._ref_model = getattr(trainer, "ref_model", None)
        adapter = None
        if self._reanchors() and self._ref_model is None:
            adapter = prepare_reference_adapter(trainer)
        self._ref_adapter, self._ref_adapter_added = adapter is not None, adapter == "added"

    def _resume(self, args: TrainingArguments, state: TrainerState) -> None:
        if state.global_step <= 0:
            return
        path = self._state_path(args, state)
        if not os.path.lexists(path):
            self._warn_once(
                "resume",
                f"loopguard: resuming at step {state.global_step} without {path}; the Guard starts fresh "
                "(new warm-up and baselines).",
            )
            return
        how = (
            f"delete {path} to start the Guard fresh (new warm-up and baselines), or resume from a "
            "checkpoint whose loopguard state is intact."
        )
        try:
            self.load_state_dict(read_state_file(path))
        except (OSError, LoopguardError) as error:
            msg = f"loopguard cannot resume from {path}: {error} To go on: {how}"
            raise ConfigError(msg) from None
        self._console.status(
            logging.INFO, f"loopguard: restored the mitigator state from {path} (beta {self.beta})"
        )

    def _on_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl) -> None:
        """Observe the step's generation batches (each once), decide, apply, log; save a checkpoint if due."""
        if self._source is None:
            return
        batch = self._source.poll(int(state.global_step))
        if batch is not None or self._sync.active:  # every rank takes part, with or without a batch
            observation = None if batch is None else self._observation(batch)
            target = self.guard.rollback_target(int(state.global_step))
            can_rollback = self._store is not None and self._store.can_rollback(target)
            # one decision on every rank (no collective in a single process): see adapters/distributed.py
            decision = synced_step(self.guard, observation, can_rollback=can_rollback, sync=self._sync)
            if decision is not None:
                self._apply(decision, observation, batch, args, state, control)
        if self._own_store and self._store is not None and self._store.due(int(state.global_step)):
            main = bool(state.is_world_process_zero)
            parts = _parts(self._trainer, args)
            self._store.save(int(state.global_step), parts, main=main, extra_state=self.state_dict)

    def _observation(self, batch: Batch) -> Observation:
        ensemble = None
        if self._members is not None:
            rows = [batch.functions.get(name) for name in self._members]
            if all(row is not None and None not in row for row in rows):
                ensemble = [list(row or ()) for row in rows]
        beta = self.beta
        return Observation(  # the batch's tuples as they are: Observation converts them once
            batch.step,
            batch.rewards,
            completions=batch.completions,
            completion_ids=batch.completion_ids,
            group_size=batch.group_size,
            group_sizes=batch.group_sizes,
            kl=batch.kl,
            entropy=None if batch.entropy is None else max(0.0, batch.entropy),
            ensemble_scores=ensemble,
            prompts=batch.prompts,
            beta=beta if beta is not None and beta > 0 else None,
        )

    def _apply(
        self,
        decision: Decision,
        observation: Observation | None,
        batch: Batch | None,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
    ) -> None:
        extra: dict[str, Any] = {"source": "another rank" if batch is None else batch.source}
        if batch is not None and batch.metrics:
            extra["trainer_metrics"] = dict(batch.metrics)
        if batch is not None and batch.notes:
            extra["batch_notes"] = list(batch.notes)
        if decision.errors:  # a detector failed inside the Guard: counted like any run-time failure
            self.errors += len(decision.errors)
            self._failed_since_log = True
        accessor = self._accessor if self.guard.mode != "log_only" else None
        if accessor is not None and decision.beta_after is not None and decision.beta_after != self.beta:
            accessor.set(float(decision.beta_after))
            extra["beta_applied"] = decision.beta_after
        if decision.action == "rollback":
            extra.update(self._rollback(decision, args, state))
        if decision.action == "stop" and not control.should_training_stop:
            control.should_training_stop = True
            if self.restore_on_stop and self._store is not None:
                extra.update(self._restore_at_stop(decision, args, state))
            self._console.status(logging.WARNING, f"loopguard stopped training: {decision.explanation}")
        elif decision.action == "rollback":
            self._console.status(logging.WARNING, f"loopguard: {decision.explanation}")
        elif decision.action != "none":
            self._console.status(logging.DEBUG, f"loopguard: {decision.explanation}")
        self._announce(decision)
        self.last_decision = decision
        self._since_log["verdict"] = _worse(self._since_log.get("verdict"), VERDICT_CODES[decision.verdict])
        self._since_log["action"] = _worse(self._since_log.get("action"), ACTION_CODES[decision.action])
        if self._log is not None:
            record = MitigationRecord.from_decision(
                decision,
                mode=self.guard.mode,
                observation=observation,
                guard=self.guard,
                run=self.run_id,
                adapter=extra,
            )
            self._log.append(record)

    def _announce(self, decision: Decision) -> None:
        """Status lines (warm-up done, a verdict change), the progress bar's postfix, trackers' alerts."""
        for note in decision.notes:  # one-time notes: a signal skipped, the judges a reference sample settled
            line = f"step {decision.step}: {note.rstrip('.')}."
            self._console.status(logging.INFO, f"loopguard: {line}")
            self._events.append(line)
        beta = decision.beta_after
        shown = f" beta={beta:.3g}" if beta is not None else ""
        verdict, previous, action = decision.verdict, self._shown, decision.action
        if decision.warming_up and verdict == "OK" and action == "none":
            self._console.postfix(f"loopguard warming up{shown}")
            return
        if not decision.warming_up and not self._warmed:  # (absolute evidence may trip during it)
            self._warmed = True
            line = f"loopguard: warm-up done, judging from step {decision.step}: {verdict}."
            self._console.status(logging.INFO, line)
            self._events.append(f"step {decision.step}: warm-up done, {verdict}")
        # a line when the verdict changes, or an action begins (a run of raises or lowers: its first step)
        if verdict != previous or (action != "none" and action != self._last_action):
            line = f"loopguard: step {decision.step}: {_status(decision, previous)}"
            level = logging.WARNING if verdict != "OK" or action in ("rollback", "stop") else logging.INFO
            self._console.status(level, line)
            self._events.append(line.removeprefix("loopguard: "))
        self._shown = verdict
        if action != "none":  # a hold between two raises (bang-bang waiting for one to act) continues the run
            self._last_action = action
        self._console.postfix(f"loopguard {verdict}{shown}")
        hack_began = verdict == "HACK" and previous != "HACK"
        if self.alerts and (hack_began or decision.action in ("rollback", "stop")):
            what = decision.action if decision.action in ("rollback", "stop") else "HACK"
            title = f"loopguard: {what} at step {decision.step}"
            try:
                alert(self._trainer, title, decision.explanation)
            except Exception as error:  # the failure policy (module docs): loud every time
                self._failed("alert", error, int(decision.step))

    def _end(self, args: TrainingArguments, state: TrainerState) -> None:
        """The end-of-run summary: the run's mitigation log in plain English (``loopguard report``).

        On every rank first: the ``"ref"`` adapter this callback added to a PEFT policy is deleted, so the
        model the user saves holds their adapters only.
        """
        if self._ref_adapter_added:
            self._ref_adapter = self._ref_adapter_added = False
            remove_reference_adapter(self._trainer)
        if self._log is None or self.last_decision is None:
            return
        from loopguard.log import read_mitigation_log
        from loopguard.report import summarize

        records = read_mitigation_log(self._log.path, include_rotated=True, on_corrupt="skip")
        text = summarize(records, run=self.run_id)
        hacked = any(r.get("verdict") == "HACK" for r in records if r.get("run") == self.run_id)
        self._console.status(logging.WARNING if hacked else logging.INFO, f"loopguard summary:\n{text}")

    def _synced_restore(
        self, store: RollbackStore, args: TrainingArguments, state: TrainerState, before: int
    ) -> int:
        """Restore the last good checkpoint before ``before`` on every rank (see ``synced_restore``)."""
        parts = _parts(self._trainer, args, scheduler=self.restore_scheduler)
        restored = synced_restore(
            self._sync,
            lambda discard: store.rollback(parts, before_step=before, discard_newer=discard),
            main=bool(state.is_world_process_zero),
            collective=parts.sharded,
        )
        if hasattr(self._trainer, "_buffered_inputs"):
            self._trainer._buffered_inputs = None  # GRPO / RLOO: the next batch is the restored policy's
        return restored

    def _rollback(self, decision: Decision, args: TrainingArguments, state: TrainerState) -> dict[str, Any]:
        if self._store is None:
            return {"rollback_error": "no checkpoint store"}
        before = decision.restore_before if decision.restore_before is not None else decision.step
        try:
            restored = self._synced_restore(self._store, args, state, before)
        except Exception as error:
            self._failed("rollback", error, int(decision.step))
            return {"rollback_error": f"{type(error).__name__}: {error}"}
        entry = {"step": int(decision.step), "restored_step": restored}
        self.rollbacks.append(entry)
        line = f"loopguard: rolled back to the checkpoint of step {restored} at step {decision.step}"
        self._console.status(logging.WARNING, line)
        out: dict[str, Any] = {"rolled_back_to": restored}
        if decision.reanchor:
            try:
                unwrap = getattr(getattr(self._trainer, "accelerator", None), "unwrap_model", None)
                if self._ref_adapter:
                    out["reanchored"] = reanchor_adapter(self._trainer)
                else:
                    out["reanchored"] = reanchor(self._trainer.model, self._ref_model, unwrap)
            except Exception as error:  # the failure policy (module docs): loud every time
                self._failed("reanchor", error, int(decision.step))
                out["reanchor_error"] = f"{type(error).__name__}: {error}"
        return out

    def _restore_at_stop(
        self, decision: Decision, args: TrainingArguments, state: TrainerState
    ) -> dict[str, Any]:
        if self._store is None:
            return {}
        before = decision.restore_before if decision.restore_before is not None else decision.step
        if not self._sync.all(self._store.can_rollback(before)):  # the same answer on every rank
            return {"restored_at_stop": None}
        try:
            restored = self._synced_restore(self._store, args, state, before)
        except Exception as error:
            self._failed("restore_on_stop", error, int(decision.step))
            return {"restore_error": f"{type(error).__name__}: {error}"}
        line = f"loopguard: stopped at step {decision.step} with the weights of step {restored} restored"
        self._console.status(logging.WARNING, line)
        return {"restored_at_stop": restored}

    def metrics(self) -> dict[str, float]:
        """The ``loopguard/*`` values for the next log (see the class docstring for the codes)."""
        out: dict[str, float] = {}
        beta = self.beta
        if beta is not None:
            out["loopguard/beta"] = beta
        decision = self.last_decision
        latest = 0.0 if decision is None else VERDICT_CODES[decision.verdict]
        out["loopguard/verdict"] = self._since_log.get("verdict", latest)
        out["loopguard/vote"] = 0.0 if decision is None else float(decision.vote)
        out["loopguard/action"] = self._since_log.get("action", 0.0)
        scores = {} if decision is None else decision.scores
        for detector in self.guard.detectors:  # absent while warming up or when the signal had no input
            score = scores.get(detector.name)
            if score is not None and math.isfinite(score):
                out[f"loopguard/score/{detector.name}"] = float(score)
        out["loopguard/warming_up"] = 1.0 if decision is None or decision.warming_up else 0.0
        out["loopguard/rollbacks"] = float(len(self.rollbacks))
        out.update(self._active_metrics(self._metric_prefix))
        return out

    def _log_metrics(self) -> dict[str, float]:
        """The ``loopguard/*`` metrics for this log; the worst-since-last-log trackers start over."""
        out = self.metrics()
        self._since_log = {}
        return out

    def _log_text(self) -> dict[str, str]:
        """``loopguard/status``: the newest status lines since the last log, for trackers that take text.

        At most ``_TEXT_LIMIT`` characters (transformers' console printer shows no longer value), the newest
        lines first kept; ``"(+N earlier) "`` says how many were left out.
        """
        events, self._events = self._events, []
        if not events:
            return {}
        kept = [events[-1]]
        for event in reversed(events[:-1]):
            if len(_joined(events, [event, *kept])) > _TEXT_LIMIT:
                break
            kept.insert(0, event)
        text = _joined(events, kept)
        return {"loopguard/status": text if len(text) <= _TEXT_LIMIT else text[: _TEXT_LIMIT - 3] + "..."}

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Write ``loopguard_state.json`` into the ``checkpoint-N`` folder just saved (main process)."""
        if not self._ready or not state.is_world_process_zero:
            return
        try:
            folder = checkpoint_dir(args, state)
            if self._run is not None:
                write_run_file(folder, self._run)
            write_state_file(os.path.join(folder, STATE_FILE), self.state_dict())
        except Exception as error:  # the failure policy (module docs)
            self._failed("on_save", error, int(state.global_step))


# -------------------------------------------------------------------------------------------- echo traps


class EchoTrapCallback(_Observer):
    """Flag echo traps: the n-gram repetition rate of each generation batch, OK / WARN / TRAP, halt on TRAP.

    A preset, not a second mechanism: the callback runs :func:`~loopguard.guard.echo_guard`, a log-only
    :class:`~loopguard.Guard` of one :class:`~loopguard.detectors.Repetition` detector on absolute bands,
    exactly as :class:`RewardHackMitigator` runs its Guard (the same decision on every rank). Reads each new
    generation batch once (GRPO / RLOO logs, or :func:`loopguard.tap` records). Repetition is measured on
    token ids -- those the tapped reward function received, or the completions tokenised with the trainer's
    tokenizer -- and on whitespace-separated words only when there is no tokenizer. The batch-mean rate reads
    OK below ``warn``, WARN from ``warn``, TRAP (the Guard's HACK) from ``threshold``, from the first batch.
    Logged as ``loopguard/echo/repetition`` and ``loopguard/echo/verdict`` (0 OK, 1 WARN, 2 TRAP: the worst
    since the last logging step).

    Args:
        threshold: TRAP from this batch-mean repetition rate, in (0, 1]. Default 0.6.
        halt: Stop training (``control.should_training_stop``) on TRAP. Default True.
        n: n-gram size, in [1, 32]. Default 2.
        warn: WARN from this rate, in (0, threshold). Default ``threshold / 2``.
        on_error: ``"warn"`` (default) or ``"raise"``: what a failure while training runs does (see the
            module docs; ``loopguard/echo/active`` drops to 0 in the next log after one).
        trainer: Bind to this trainer now instead of finding it at the start of training.

    Raises:
        ConfigError, LoopguardTypeError: a bad argument (at construction), or a trainer that exposes no
            completions (at the start of training).

    Example:
        >>> callback = EchoTrapCallback(threshold=0.5, halt=False)
        >>> callback.classify(["x y x y x y x y"] * 4)  # 5 of the 7 bigrams repeat an earlier one
        (0.714286, 'TRAP')
        >>> EchoTrapCallback(threshold=1.5)
        Traceback (most recent call last):
        ...
        loopguard.exceptions.ConfigError: `threshold` must be in (0, 1], got 1.5.
    """

    _name = "EchoTrapCallback"
    _metric_prefix = "loopguard/echo"

    def __init__(
        self,
        threshold: float = 0.6,
        halt: bool = True,
        n: int = 2,
        *,
        warn: float | None = None,
        on_error: OnError = "warn",
        trainer: Any = None,
    ) -> None:
        """Validate the bands and build the echo Guard (see the class docstring)."""
        on_error = check_choice("on_error", on_error, _ON_ERROR)  # type: ignore[assignment]
        self.n = check_int("n", n, lo=1, hi=32)
        self.guard = echo_guard(threshold, warn, n=self.n, halt=halt, on_error=on_error)
        self.halt = self.guard.halt_on_hack
        detector = cast("Repetition", self.guard.detectors[0])  # echo_guard's one detector, with echo bands
        self.warn, self.threshold = cast("tuple[float, float]", detector.echo)
        self._rate = detector.metrics()[0]
        self._source: GenerationSource | TapSource | MetricSource | None = None
        self._sync = RankSync()
        self.last: tuple[int, float, str] | None = None
        self._worst: float | None = None
        super().__init__(trainer, on_error)

    def classify(self, completions: Sequence[Any]) -> tuple[float, str]:
        """Batch-mean repetition rate of ``completions`` (texts or token-id lists) and its verdict."""
        rate = float(ngram_repetition_rate(list(completions), n=self.n))
        return round(rate, 6), self._verdict(rate)

    def _verdict(self, rate: float) -> str:
        score = self._rate.absolute_score(rate) or 0.0
        return "TRAP" if score >= HACK_LEVEL else "WARN" if score >= WARN_LEVEL else "OK"

    def _start(self, args: TrainingArguments, state: TrainerState) -> None:
        """Find the trainer and its completions (fail fast when it has none)."""
        trainer = self._attach()
        source = choose_source(trainer)
        if source is None or isinstance(source, MetricSource):
            msg = (
                f"EchoTrapCallback needs completions, and {type(trainer).__name__} exposes none: wrap its "
                "reward function with loopguard.tap(...)."
            )
            raise ConfigError(msg)
        self._source = source
        self._ready = True

    def _on_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl) -> None:
        """Classify the step's generation batches (each once) with the echo Guard; halt on TRAP."""
        if self._source is None:
            return
        batch = self._source.poll(int(state.global_step))
        if batch is not None and not batch.completions:
            batch = None
        if batch is None and not self._sync.active:
            return
        observation = None if batch is None else _echo_observation(batch)
        decision = synced_step(self.guard, observation, can_rollback=False, sync=self._sync)
        if decision is not None:
            self._report(decision, batch, control)

    def _report(self, decision: Decision, batch: Batch | None, control: TrainerControl) -> None:
        rate = decision.raw["repetition.rate"]
        verdict = {"OK": "OK", "WARN": "WARN", "HACK": "TRAP"}[decision.verdict]
        previous = "OK" if self.last is None else self.last[2]
        self.last = (decision.step, round(rate, 6), verdict)
        self._worst = _worse(self._worst, _ECHO_CODES[verdict])
        stop = decision.action == "stop"
        if stop:
            control.should_training_stop = True
        if verdict == previous and not stop:  # a status line when the verdict changes, not every step
            return
        if verdict == "OK":
            message = (
                f"loopguard echo OK at step {decision.step}: mean {self.n}-gram repetition "
                f"{round(rate, 6):.3f} < {self.warn:g}"
            )
            self._console.status(logging.INFO, message)
            return
        example = "" if batch is None else f"; e.g. {max(batch.completions or (), key=len)[:80]!r}"
        band = self.threshold if verdict == "TRAP" else self.warn
        message = (
            f"loopguard echo {verdict} at step {decision.step}: mean {self.n}-gram repetition "
            f"{round(rate, 6):.3f} >= {band:g}{example}"
        )
        if stop:
            message += "; stopping training (halt=True)"
        self._console.status(logging.WARNING, message)

    def _log_metrics(self) -> dict[str, float]:
        """``loopguard/echo/*`` for this log: the latest rate, the worst verdict since the last log."""
        metrics = self._active_metrics(self._metric_prefix)
        if self.last is not None:
            metrics["loopguard/echo/repetition"] = self.last[1]
            metrics["loopguard/echo/verdict"] = self._worst or 0.0
        self._worst = None
        return metrics


def _echo_observation(batch: Batch) -> Observation:
    """The echo Guard's view of a batch: its rewards, texts and (when known) token ids."""
    return Observation(
        batch.step,
        list(batch.rewards),
        completions=list(batch.completions or ()),
        completion_ids=batch.completion_ids,
    )


# -------------------------------------------------------------------------------------------- checkpoints


class RLCheckpointCallback(_Bound):
    """Mid-epoch RL checkpoints through a :class:`~loopguard.checkpoint.CheckpointManager`.

    Every ``save_every_steps`` optimizer steps it saves the policy, the optimizer, the LR scheduler, the RNG
    states, the reference model when TRL keeps it in sync (``sync_ref_model=True``; a fixed reference needs
    no copy) and, when a :class:`RewardHackMitigator` is attached, the mitigator's state as ``extra_state``.
    It is the rollback source for a mitigator given no ``checkpoint=``: a checkpoint is marked good once the
    mitigator's verdicts stayed OK until the next save (immediately when no mitigator is attached), and the
    mitigator skips saving while a hack is suspected. Saves happen on the main process; rotation keeps the
    ``keep_last`` newest checkpoints plus the newest good one.

    Args:
        save_every_steps: Optimizer steps between saves, >= 1.
        keep_last: Newest checkpoints to keep, >= 1. Default 3.
        directory: The store's folder; default ``<output_dir>/loopguard_checkpoints``.
        manager: Use this CheckpointManager instead of creating one (``directory`` must then be None).
        on_error: ``"warn"`` (default) or ``"raise"``: what a failed save does while training runs (see
            the module docs; ``loopguard/checkpoint/active`` drops to 0 in the next log after one).
        trainer: Bind to this trainer now instead of finding it at the start of training.

    Example:
        >>> import tempfile
        >>> callback = RLCheckpointCallback(save_every_steps=50, directory=tempfile.mkdtemp())
        >>> callback.save_every_steps, callback.keep_last
        (50, 3)
    """

    _name = "RLCheckpointCallback"
    _metric_prefix = "loopguard/checkpoint"

    def __init__(
        self,
        save_every_steps: int,
        keep_last: int = 3,
        *,
        directory: str | os.PathLike[str] | None = None,
        manager: Any = None,
        on_error: OnError = "warn",
        trainer: Any = None,
    ) -> None:
        """Validate the settings (see the class docstring)."""
        self.save_every_steps = check_int("save_every_steps", save_every_steps, lo=1)
        self.keep_last = check_int("keep_last", keep_last, lo=1)
        if manager is not None and directory is not None:
            msg = f"`directory` must be None when a manager is given, got {describe(os.fspath(directory))}."
            raise ConfigError(msg)
        self.directory = None if directory is None else check_path("directory", directory)
        self._manager = None if manager is None else open_manager(manager)
        self._store: RollbackStore | None = None
        self._mitigator: RewardHackMitigator | None = None
        self._run: Run | None = None
        self._sync = RankSync()
        super().__init__(trainer, on_error)

    @property
    def manager(self) -> Any:
        """The CheckpointManager (created at the start of training when only a directory was given)."""
        return None if self._store is None else self._store.manager

    def _store_for(self, args: Any, state: Any, run: Run) -> RollbackStore:
        """The store of this training session, scoped to ``run`` (created, claimed, trimmed on resume)."""
        manager = self._manager
        if manager is None:
            folder = os.path.abspath(self.directory or default_store_dir(args, run))
            current = None if self._store is None else self._store.manager
            same = current is not None and str(current.directory) == folder
            manager = current if same else open_manager(folder, keep_last=self.keep_last)
        if self._store is None or self._store.manager is not manager:
            self._store = RollbackStore(manager, self.save_every_steps, guard=None)
        _start_store(self._store, run, state)
        return self._store

    def _start(self, args: TrainingArguments, state: TrainerState) -> None:
        """Find the trainer and an attached mitigator; open the store (fail fast when it cannot be used)."""
        self._ready = False
        trainer = self._trainer
        if trainer is None or not holds(trainer, self):
            found, _ = find_trainer(self)
            trainer = trainer if trainer is not None else found
            if trainer is None:
                msg = "RLCheckpointCallback could not find its trainer: pass trainer=... or .bind(trainer)."
                raise ConfigError(msg)
        self._trainer = trainer
        self._mitigator = next(
            (cb for cb in trainer.callback_handler.callbacks if isinstance(cb, RewardHackMitigator)), None
        )
        _, resume = find_trainer(self)
        self._run = resolve_run(trainer, args, state, resume, self._sync)
        store = self._store_for(args, state, self._run)
        store.guard = None if self._mitigator is None else self._mitigator.guard
        self._ready = True

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Write the run identity into the ``checkpoint-N`` folder just saved (main process)."""
        if not self._ready or self._run is None or not state.is_world_process_zero:
            return
        try:
            write_run_file(checkpoint_dir(args, state), self._run)
        except Exception as error:  # the failure policy (module docs)
            self._failed("on_save", error, int(state.global_step))

    def _on_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl) -> None:
        """Save a checkpoint when due (after the mitigator's decision for this step)."""
        if self._store is None:
            return
        mitigator = self._mitigator
        extra = None if mitigator is None else mitigator.state_dict
        main = bool(state.is_world_process_zero)
        self._store.save(int(state.global_step), _parts(self._trainer, args), main=main, extra_state=extra)
