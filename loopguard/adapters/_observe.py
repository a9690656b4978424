"""Where the adapters read what a trainer already computed: one :class:`Batch` per new generation batch.

Sources, chosen once per run by :func:`choose_source`:

* :class:`GenerationSource` -- TRL's GRPO and RLOO. After every generation ``trainer._logs`` holds the
  gathered prompts, completions and each reward function's output (deques of ``generation_batch_size``), and
  ``trainer._metrics["train"]`` one entry per micro-step or generation for ``kl``, ``entropy`` and the
  reward statistics. A new generation batch shows as a new ``trainer._buffered_inputs`` object, so a batch
  reused for ``steps_per_generation`` / ``num_iterations`` optimizer steps is read once, and
  :meth:`GenerationSource.collect` (called after every micro-step) reads each of several generation batches
  that feed one optimizer step (``steps_per_generation x num_iterations < gradient_accumulation_steps``):
  the step's batch covers all of them. The proxy reward is TRL's weighted sum of the reward functions'
  *unshaped* outputs (a :func:`~loopguard.shape_reward` wrapper logs those as the ``"<name>/unshaped"``
  column). The token ids are the trainer's own padded ``completion_ids`` and ``completion_mask``, taken
  where ``_generate_and_score_completions`` returns them (:class:`IdCapture`): TRL shuffles the rows before
  it buffers them, and they hold only this process's rows, while the logs are gathered in generation order.
  Under several processes the capture gathers the ids the same way (one padded all-gather per generation
  batch), so every rank observes the same batch. No text is re-tokenized.
* :class:`TapSource` -- reward functions wrapped with :func:`loopguard.tap` (online DPO, custom trainers):
  every call recorded since the last step forms the batch.
* :class:`MetricSource` -- trainers without rollouts. DPO: the implicit reward margins logged per
  micro-batch, divided by beta; online DPO without a tap: the mean reward score per step.

**Unscorable completions** (every reward function returned None) are left out of the batch, as TRL leaves
them out of its group baselines and its logged reward statistics: they are never scored 0. Groups that lose
members become ragged (``Batch.group_sizes``).

A source that cannot read what the trainer produced raises :class:`SourceError` naming what is wrong; the
callbacks report it loudly at that step (see ``docs/trl.md``, failure policy) rather than observing nothing.

Example:
    >>> from loopguard.adapters._tap import tap
    >>> fn = tap(lambda prompts, completions, **kw: [float(len(c)) for c in completions])
    >>> source = TapSource([fn], tokenizer=None, group_size=2)
    >>> _ = fn(prompts=["p", "p"], completions=["a b", "a"])
    >>> batch = source.poll(step=1)
    >>> batch.rewards, batch.group_size, source.poll(step=2) is None
    ((3.0, 1.0), 2, True)
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar, cast

import attrs
import numpy as np
from numpy.typing import NDArray

from loopguard._reward_fn import real_or_none
from loopguard._validation import plain_row, to_numpy
from loopguard.adapters._tap import TappedReward, TapRecord, completion_text, is_tapped, prompt_text
from loopguard.exceptions import LoopguardError
from loopguard.signals import TokenBatch


class SourceError(LoopguardError, RuntimeError):
    """What the trainer produced for a batch cannot be read (the message says what and why)."""


__all__ = [
    "Batch",
    "GenerationSource",
    "IdCapture",
    "MetricCursor",
    "MetricSource",
    "Source",
    "SourceError",
    "TapSource",
    "choose_source",
    "token_text",
    "tokenize",
]


def _finite(value: object) -> float | None:
    if type(value) is float:  # the common case (TRL logs rewards and metrics as Python floats)
        return value if math.isfinite(value) else None
    return real_or_none(value, refuse=False)


_FLOAT = frozenset((float,))


def _finite_row(values: Sequence[object]) -> tuple[float | None, ...]:
    """Each of ``values`` as :func:`_finite` reads it; a row of finite Python floats (TRL's) at once.

    ``values`` is read more than once.
    """
    if plain_row(values, _FLOAT):
        return tuple(cast("Sequence[float]", values))
    return tuple(_finite(value) for value in values)


def _first(*values: float | None) -> float | None:
    return next((value for value in values if value is not None), None)


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


@attrs.frozen
class Batch:
    """What the trainer produced since the last read, in loopguard's terms.

    Attributes:
        step: The trainer's global step.
        rewards: Proxy reward per scorable completion (unshaped, weighted like the trainer weights them).
            Unscorable completions (every reward function returned None) are left out of every field.
        functions: Each reward function's (unshaped) output per completion, by the trainer's function name.
        completions: Completion texts, or None.
        completion_ids: Completion token ids, or None: the trainer's padded ids as a ``TokenBatch`` (GRPO /
            RLOO), the ids a tapped call was given, or the texts encoded by the trainer's tokenizer.
        prompts: Prompt texts, or None.
        group_size: Completions per prompt when they are laid out group-contiguous, else None.
        group_sizes: The members of each consecutive prompt group when unscorable completions left groups
            of unequal size (then ``group_size`` is None).
        kl: Mean KL to the reference over the step(s), when the trainer reports it.
        entropy: Mean token entropy over the step(s), when the trainer reports it.
        source: ``"generation"``, ``"tap"`` or ``"metrics"``.
        notes: One-line remarks about this batch (e.g. unscorable completions).
        metrics: Other per-step numbers the trainer reported for the batch (GRPO / RLOO: ``reward_std``,
            ``frac_reward_zero_std``, ``completions/clipped_ratio``, ``completions/mean_length``), recorded in
            the mitigation log; the Guard recomputes what it scores from the rewards and completions.
    """

    step: int
    rewards: tuple[float, ...]
    functions: Mapping[str, tuple[float | None, ...]] = attrs.field(factory=dict)
    completions: tuple[str, ...] | None = None
    completion_ids: TokenBatch | tuple[tuple[int, ...], ...] | None = None
    prompts: tuple[str, ...] | None = None
    group_size: int | None = None
    group_sizes: tuple[int, ...] | None = None
    kl: float | None = None
    entropy: float | None = None
    source: str = "generation"
    notes: tuple[str, ...] = ()
    metrics: Mapping[str, float] = attrs.field(factory=dict)


class Source(Protocol):
    """Anything that turns trainer state into at most one :class:`Batch` per call."""

    kind: str

    def poll(self, step: int) -> Batch | None:
        """The batch produced since the last call, or None when there is nothing new."""


class MetricCursor:
    """Reads the entries appended to a trainer's per-step metric lists since the previous read.

    ``read`` returns the current metrics mapping (``trainer._metrics["train"]`` or online DPO's ``stats``).
    Trainers clear or replace those lists when they log, so the cursor remembers each list object and how
    much of it it has read; a new list object is read from its start.

    Example:
        >>> metrics = {"kl": [0.1, 0.2]}
        >>> cursor = MetricCursor(lambda: metrics)
        >>> cursor.new("kl"), cursor.new("kl")
        ([0.1, 0.2], [])
        >>> metrics["kl"].append(0.3); metrics["entropy"] = [2.0]
        >>> cursor.new("kl"), cursor.new("entropy")
        ([0.3], [2.0])
    """

    def __init__(self, read: Callable[[], Any]) -> None:
        """Wrap ``read``, a zero-argument function returning the metrics mapping (or None)."""
        self._read = read
        self._seen: dict[str, tuple[Any, int]] = {}

    def new(self, key: str) -> list[float]:
        """Finite values appended under ``key`` since the last call."""
        return self._new(self._read(), key)

    def mean(self, key: str) -> float | None:
        """Mean of :meth:`new`, or None when nothing new."""
        return _mean(self.new(key))

    def means(self, keys: Sequence[str]) -> dict[str, float | None]:
        """:meth:`mean` of each of ``keys``, from one read of the metrics mapping."""
        container = self._read()
        return {key: _mean(self._new(container, key)) for key in keys}

    def _new(self, container: object, key: str) -> list[float]:
        values = container.get(key) if isinstance(container, Mapping) else None
        if not isinstance(values, list):
            return []
        last, count = self._seen.get(key, (None, 0))
        start = count if values is last and len(values) >= count else 0
        self._seen[key] = (values, len(values))
        return [v for v in _finite_row(values[start:]) if v is not None]


def tokenize(processing_class: Any, texts: Sequence[str]) -> tuple[tuple[int, ...], ...] | None:
    """Token ids of ``texts`` with the trainer's tokenizer (no special tokens); None when it has none."""
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    if tokenizer is None or not callable(tokenizer) or not texts:
        return None
    encoded = tokenizer(list(texts), add_special_tokens=False)
    ids = encoded["input_ids"] if not isinstance(encoded, list) else encoded
    return tuple(tuple(map(int, row)) for row in ids)


def token_text(processing_class: Any) -> Callable[[int], object] | None:
    """A token id's text with the trainer's tokenizer (``decode([id])``); None when it has no ``decode``.

    The Guard quotes it after the ids its explanations name (``Guard(token_text=...)``).
    """
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    decode = getattr(tokenizer, "decode", None)
    if not callable(decode):
        return None
    return lambda token: decode([token])


@attrs.frozen
class Padded:
    """One generation batch's completion ids as the trainer padded them (numpy, on the host).

    Attributes:
        ids: ``[B, L]`` token ids; what lies under a False mask entry is padding and is never read.
        mask: ``[B, L]`` booleans, True where ``ids`` holds a completion token.
    """

    ids: NDArray[np.integer[Any]]
    mask: NDArray[np.bool_]

    @property
    def rows(self) -> int:
        """Number of completions."""
        return int(self.ids.shape[0])

    def take(self, rows: Sequence[int]) -> Padded:
        """The given rows, in order (no copy when that is every row)."""
        if len(rows) == self.rows and list(rows) == list(range(self.rows)):
            return self
        index = np.asarray(rows, dtype=np.intp)
        return Padded(self.ids[index], self.mask[index])

    @staticmethod
    def join(parts: Sequence[Padded]) -> Padded:
        """The parts' rows one after the other, padded to the widest part."""
        if len(parts) == 1:
            return parts[0]
        width = max(part.ids.shape[1] for part in parts)
        rows = sum(part.rows for part in parts)
        ids = np.zeros((rows, width), dtype=np.int64)
        mask = np.zeros((rows, width), dtype=np.bool_)
        start = 0
        for part in parts:
            ids[start : start + part.rows, : part.ids.shape[1]] = part.ids
            mask[start : start + part.rows, : part.mask.shape[1]] = part.mask
            start += part.rows
        return Padded(ids, mask)


_CAPTURE_ATTRIBUTE = "_loopguard_id_capture"


class IdCapture:
    """The padded completion ids of each generation batch, as a GRPO / RLOO generation step returns them.

    TRL's ``_generate_and_score_completions`` returns this process's ``completion_ids`` and
    ``completion_mask`` in generation order; TRL then shuffles the rows into ``_buffered_inputs``, so the
    buffer cannot be lined up with the gathered rewards and texts in ``_logs``. :meth:`install` wraps that
    method on the trainer instance (once per trainer, shared by every loopguard callback) and keeps what it
    returns:

    * several processes: the ids and mask are padded to the widest process and all-gathered (Accelerate's
      ``pad_across_processes`` and ``gather``, called on every rank inside the generation step, where TRL
      gathers its own texts and rewards), so each rank holds the batch in the order of ``_logs``;
    * ``mask_truncated_completions``: TRL zeroes the whole mask of a truncated completion. Such a row ends
      in a token that is neither EOS nor padding, so its tokens are restored as everything up to its last
      non-pad id: length and repetition signals see the truncated completions (the long ones a length hack
      makes) instead of empty rows.

    The generation step keeps the tensors it returned (gathered first where there are several processes);
    they are read into numpy when the batch is read (:attr:`latest`, at the end of the optimizer step, where
    the rest of the batch is converted): TRL never changes them after returning them (it shuffles copies of
    their rows into its buffer). A failure to read them is kept in :attr:`error` and reported by the source
    (the texts are then encoded with the trainer's tokenizer, and the batch says so); it never breaks the
    trainer's step.
    """

    def __init__(self, trainer: Any) -> None:
        """Capture for ``trainer``; use :meth:`install`."""
        self.trainer = trainer
        self.error: str | None = None
        self.generations = 0
        self.seconds = 0.0  # spent keeping (and gathering) the ids, inside the trainer's generation steps
        self._latest: Padded | None = None
        # the newest generation step's ids and mask, not yet read on the host, whether TRL masked its
        # truncated completions, and the pad id when the gather read it
        self._unread: tuple[Any, Any, bool, int | None] | None = None

    @classmethod
    def install(cls, trainer: Any) -> IdCapture | None:
        """The trainer's capture, installed on first use; None when it has no generation step to wrap."""
        existing = getattr(trainer, _CAPTURE_ATTRIBUTE, None)
        if isinstance(existing, IdCapture):
            return existing
        generate = getattr(trainer, "_generate_and_score_completions", None)
        if not callable(generate):
            return None
        capture = cls(trainer)

        @functools.wraps(generate)
        def generate_and_capture(*args: Any, **kwargs: Any) -> Any:
            output = generate(*args, **kwargs)
            started = time.perf_counter()
            capture.record(output)
            capture.seconds += time.perf_counter() - started
            return output

        trainer._generate_and_score_completions = generate_and_capture
        setattr(trainer, _CAPTURE_ATTRIBUTE, capture)
        return capture

    def record(self, output: object) -> None:
        """Keep the padded ids and mask of one generation step's ``output`` (see the class docs)."""
        self.generations += 1
        self._latest, self._unread, self.error = None, None, None
        ids = mask = None
        if isinstance(output, Mapping):
            ids, mask = output.get("completion_ids"), output.get("completion_mask")
        if getattr(ids, "ndim", None) != 2 or getattr(mask, "shape", None) != getattr(ids, "shape", ()):
            self.error = "the generation step returned no 2-D completion_ids and completion_mask of one shape"
            return
        try:
            accelerator: Any = getattr(self.trainer, "accelerator", None)
            gathered = accelerator is not None and getattr(accelerator, "num_processes", 1) > 1
            truncated = bool(getattr(self.trainer, "mask_truncated_completions", False))
            pad = None
            if gathered:  # every rank gathers here, inside the generation step, as TRL gathers its logs
                pad = self._pad_id()
                ids = accelerator.gather(accelerator.pad_across_processes(ids, dim=1, pad_index=pad or 0))
                mask = accelerator.gather(accelerator.pad_across_processes(mask, dim=1, pad_index=0))
            self._unread = (ids, mask, truncated, pad)
        except Exception as error:  # reported by the source on every batch; never raised into TRL's step
            self.error = f"{type(error).__name__}: {error}"

    @property
    def latest(self) -> Padded | None:
        """The newest generation step's ids and mask on the host (read on first use), or None.

        None when it returned none or they could not be read (:attr:`error` says why).
        """
        if self._unread is not None:
            ids, mask, truncated, pad = self._unread
            self._unread = None
            try:
                host_ids = to_numpy("completion_ids", ids)
                host_mask = to_numpy("completion_mask", mask) != 0
                if truncated:
                    # the tokenizer's pad id only where it is used (reading it costs a tokenizer lookup)
                    _restore_truncated(host_ids, host_mask, self._pad_id() if pad is None else pad)
                self._latest = Padded(host_ids, host_mask)
            except Exception as error:  # reported by the source; never raised into TRL's step
                self.error = f"{type(error).__name__}: {error}"
        return self._latest

    def _pad_id(self) -> int | None:
        processing = getattr(self.trainer, "processing_class", None)
        pad = getattr(getattr(processing, "tokenizer", processing), "pad_token_id", None)
        return pad if isinstance(pad, int) and not isinstance(pad, bool) else None


def _restore_truncated(ids: NDArray[np.integer[Any]], mask: NDArray[np.bool_], pad: int | None) -> None:
    """Give the rows whose mask TRL zeroed (truncated completions) their tokens back, in place."""
    empty = np.flatnonzero(~mask.any(axis=1))
    if not empty.size:
        return
    if pad is None:
        msg = "the trainer masks truncated completions, and without a pad_token_id their ends are unknown"
        raise SourceError(msg)
    real = ids[empty] != pad
    width = ids.shape[1]
    ends = np.where(real.any(axis=1), width - np.argmax(real[:, ::-1], axis=1), 0)
    mask[empty] = np.arange(width)[np.newaxis, :] < ends[:, np.newaxis]


def _generation_marker(buffer: Any) -> Any:
    """A small object that identifies one generation batch (held, so its id is never reused)."""
    first = buffer[0] if isinstance(buffer, (list, tuple)) and buffer else None
    if isinstance(first, dict):
        for key in ("advantages", "completion_mask", "completion_ids"):
            if key in first and hasattr(first[key], "shape"):
                return first[key]
        for value in first.values():
            if hasattr(value, "shape"):
                return value
    return buffer


def _group_size(value: object, size: int) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 2 and size % value == 0:
        return value
    return None


def _weights(trainer: Any, count: int) -> list[float]:
    weights: Any = getattr(trainer, "reward_weights", None)
    values = weights.tolist() if hasattr(weights, "tolist") else weights
    if isinstance(values, (list, tuple)) and len(values) == count:
        return [float(w) for w in values]
    return [1.0] * count


def trained_and_watched(trainer: Any, names: Sequence[str]) -> tuple[list[str], list[str]]:
    """The reward functions ``names`` split into those trained on (weight != 0) and watched (weight 0)."""
    weights = _weights(trainer, len(names))
    trained = [name for name, weight in zip(names, weights, strict=True) if weight != 0]
    watched = [name for name, weight in zip(names, weights, strict=True) if weight == 0]
    return trained, watched


@attrs.frozen
class _Part:
    """One generation batch (or one tapped call) as read: every row, scorable or not."""

    completions: tuple[str, ...]
    prompts: tuple[str, ...] | None
    completion_ids: Padded | tuple[tuple[int, ...], ...] | None
    columns: Mapping[str, tuple[float | None, ...]]
    weights: tuple[float, ...]
    group_size: int | None
    notes: tuple[str, ...] = ()


def _proxy(part: _Part) -> list[float | None]:
    """TRL's weighted nansum per row; None for a row that every reward function left unscored."""
    rewards: list[float | None] = []
    for row in zip(*part.columns.values(), strict=True):
        terms = [w * r for w, r in zip(part.weights, row, strict=True) if r is not None]
        rewards.append(math.fsum(terms) if terms else None)
    return rewards


_T = TypeVar("_T")


def _pick(values: Sequence[_T], keep: list[int] | None) -> Sequence[_T]:
    """The rows ``keep`` of ``values``, in order; all of them, as they are, for None."""
    return values if keep is None else [values[index] for index in keep]


def _assemble(
    step: int,
    parts: Sequence[_Part],
    *,
    tokenizer: Any,
    source: str,
    kl: float | None = None,
    entropy: float | None = None,
    metrics: Mapping[str, float] | None = None,
    notes: tuple[str, ...] = (),
) -> Batch:
    """One batch from the parts read since the last poll: unscorable rows left out, groups kept in order.

    ``kl``, ``entropy`` and ``metrics`` are the trainer's numbers for the step; ``notes`` come before the
    parts' own.
    """
    names = list(parts[0].columns)
    rewards: list[float] = []
    completions: list[str] = []
    prompts: list[str] | None = [] if all(part.prompts is not None for part in parts) else None
    padded: list[Padded] | None = [] if all(isinstance(p.completion_ids, Padded) for p in parts) else None
    ids: list[tuple[int, ...]] | None = [] if all(type(p.completion_ids) is tuple for p in parts) else None
    columns: dict[str, list[float | None]] = {name: [] for name in names}
    sizes: list[int] = []
    uniform = parts[0].group_size if all(p.group_size == parts[0].group_size for p in parts) else None
    dropped = 0
    for part in parts:
        proxy = _proxy(part)
        # None: every row scored (the common case), each field taken as it is without selecting rows
        keep = None if None not in proxy else [i for i, value in enumerate(proxy) if value is not None]
        dropped += 0 if keep is None else len(proxy) - len(keep)
        rewards.extend(float(value or 0.0) for value in _pick(proxy, keep))
        completions.extend(_pick(part.completions, keep))
        if prompts is not None and part.prompts is not None:
            prompts.extend(_pick(part.prompts, keep))
        if padded is not None and isinstance(part.completion_ids, Padded):
            padded.append(part.completion_ids if keep is None else part.completion_ids.take(keep))
        if ids is not None and isinstance(part.completion_ids, tuple):
            ids.extend(_pick(part.completion_ids, keep))
        for name in names:
            columns[name].extend(_pick(part.columns[name], keep))
        if part.group_size is None:
            uniform = None
        elif keep is None:  # every row scored: the groups as the trainer made them
            size = part.group_size
            sizes.extend(min(size, len(proxy) - start) for start in range(0, len(proxy), size))
        else:
            kept = set(keep)
            for start in range(0, len(proxy), part.group_size):
                members = sum(1 for index in range(start, start + part.group_size) if index in kept)
                if members:
                    sizes.append(members)
    if not rewards:
        msg = (
            f"none of the {dropped} completion(s) of step {step} could be scored (every reward function "
            "returned None for each of them), so there is nothing to observe"
        )
        raise SourceError(msg)
    notes += tuple(dict.fromkeys(note for part in parts for note in part.notes))
    if dropped:
        notes += (
            f"{dropped} unscorable completion(s) left out (every reward function returned None; TRL leaves "
            "them out of its baselines and reward statistics too)",
        )
    group_size = uniform if uniform is not None and not dropped else None
    group_sizes = tuple(sizes) if uniform is not None and dropped and sizes else None
    token_ids: TokenBatch | tuple[tuple[int, ...], ...] | None
    if padded is not None:
        joined = Padded.join(padded)
        token_ids = TokenBatch.from_padded(joined.ids, joined.mask, name="completion_ids")
    else:
        token_ids = tuple(ids) if ids is not None else tokenize(tokenizer, completions)
    return Batch(
        step=step,
        rewards=tuple(rewards),
        functions={name: tuple(values) for name, values in columns.items()},
        completions=tuple(completions),
        completion_ids=token_ids,
        prompts=None if prompts is None else tuple(prompts),
        group_size=group_size,
        group_sizes=group_sizes,
        kl=kl,
        entropy=entropy,
        source=source,
        notes=notes,
        metrics={} if metrics is None else dict(metrics),
    )


_TRAINER_METRICS = (
    "reward_std",
    "frac_reward_zero_std",
    "completions/clipped_ratio",
    "completions/mean_length",
)


class GenerationSource:
    """GRPO / RLOO: read each new generation batch from ``trainer._logs`` once (see the module docs)."""

    kind = "generation"

    def __init__(self, trainer: Any) -> None:
        """Read from ``trainer`` (a TRL GRPOTrainer / RLOOTrainer or a trainer with the same fields)."""
        self.trainer = trainer
        self._marker: Any = None
        self._pending: list[_Part] = []
        self._metrics = MetricCursor(lambda: getattr(trainer, "_metrics", {}).get("train"))
        self._ids = IdCapture.install(trainer)
        self._read_generations = 0

    @staticmethod
    def supports(trainer: Any) -> bool:
        """Whether ``trainer`` buffers generations and keeps per-completion logs like GRPO / RLOO."""
        logs = getattr(trainer, "_logs", None)
        return (
            hasattr(trainer, "_buffered_inputs")
            and isinstance(logs, Mapping)
            and "completion" in logs
            and "rewards" in logs
            and hasattr(trainer, "reward_func_names")
        )

    def function_names(self) -> tuple[str, ...]:
        """The trainer's reward function names, in order."""
        return tuple(str(name) for name in self.trainer.reward_func_names)

    def collect(self) -> None:
        """Read the current generation batch if it is new; call after every micro-step (it is cheap).

        Raises:
            SourceError: the trainer's logs for the new batch are inconsistent (the message says how).
        """
        buffer = getattr(self.trainer, "_buffered_inputs", None)
        if not buffer:
            return
        marker = _generation_marker(buffer)
        if marker is self._marker:
            return
        self._marker = marker
        self._pending.append(self._read())

    def _read(self) -> _Part:
        logs = self.trainer._logs
        completions = tuple(completion_text(c) for c in logs["completion"])
        prompts = tuple(prompt_text(p) for p in logs["prompt"])
        size = len(completions)
        if size == 0 or len(prompts) != size:
            msg = (
                f"{type(self.trainer).__name__}._logs holds {size} completion(s) and {len(prompts)} "
                "prompt(s) for the new generation batch; expected the same non-zero number"
            )
            raise SourceError(msg)
        names = self.function_names()
        extra = logs.get("extra") or {}
        columns: dict[str, tuple[float | None, ...]] = {}
        for name in names:
            unshaped = extra.get(f"{name}/unshaped")
            values = unshaped if unshaped is not None and len(unshaped) == size else logs["rewards"].get(name)
            if values is None or len(values) != size:
                count = "none" if values is None else len(values)
                msg = f"reward function {name!r} logged {count} reward(s) for {size} completion(s)"
                raise SourceError(msg)
            columns[name] = _finite_row(values)
        ids, notes = self._captured_ids(size)
        return _Part(
            completions=completions,
            prompts=prompts,
            completion_ids=ids,
            columns=columns,
            weights=tuple(_weights(self.trainer, len(names))),
            group_size=_group_size(getattr(self.trainer, "num_generations", None), size),
            notes=notes,
        )

    def _captured_ids(self, size: int) -> tuple[Padded | None, tuple[str, ...]]:
        """The trainer's padded ids of the batch just read, or None and why (then the texts are encoded)."""
        capture = self._ids
        if capture is None:
            return None, (
                "token ids encoded from the texts: the trainer has no generation step to read ids from",
            )
        fresh = capture.generations > self._read_generations
        self._read_generations = capture.generations
        if capture.latest is not None and fresh and capture.latest.rows == size:
            return capture.latest, ()
        if capture.error is not None:
            why = capture.error
        elif not fresh:
            why = "no generation step ran since the last batch"
        else:
            rows = capture.latest.rows if capture.latest is not None else 0
            why = f"the generation step returned {rows} rows of ids for {size} logged completions"
        return None, (f"token ids encoded from the texts: the trainer's own ids could not be read ({why})",)

    def poll(self, step: int) -> Batch | None:
        """Every generation batch read since the last poll, as one batch; None when there was none."""
        self.collect()
        if not self._pending:
            return None
        parts, self._pending = self._pending, []
        means = self._metrics.means(("kl", "entropy", *_TRAINER_METRICS))
        return _assemble(
            step,
            parts,
            tokenizer=getattr(self.trainer, "processing_class", None),
            source=self.kind,
            kl=means["kl"],
            entropy=means["entropy"],
            metrics={key: value for key in _TRAINER_METRICS if (value := means[key]) is not None},
            notes=(f"{len(parts)} generation batches fed this optimizer step; all are observed",)
            if len(parts) > 1
            else (),
        )


class TapSource:
    """Reward functions wrapped with :func:`loopguard.tap`: the calls recorded since the last poll."""

    kind = "tap"

    def __init__(
        self,
        taps: Sequence[TappedReward],
        *,
        tokenizer: Any = None,
        group_size: int | None = None,
        weights: Sequence[float] | None = None,
        metrics: MetricCursor | None = None,
    ) -> None:
        """Read ``taps``; ``weights`` scale each tap's rewards in the proxy (default 1 each)."""
        self.taps = list(taps)
        self.tokenizer = tokenizer
        self.group_size = group_size
        self.weights = list(weights) if weights is not None else [1.0] * len(self.taps)
        self.metrics = metrics
        self._after = [0] * len(self.taps)

    def function_names(self) -> tuple[str, ...]:
        """The tapped functions' names."""
        return tuple(str(fn.__name__) for fn in self.taps)

    def poll(self, step: int) -> Batch | None:
        """Every call recorded since the last poll, concatenated; None when there was none."""
        per_tap: list[list[TapRecord]] = []
        for index, fn in enumerate(self.taps):
            records = fn.records(after=self._after[index])
            if records:
                self._after[index] = records[-1].index
            per_tap.append(records)
        kl = entropy = None
        if self.metrics is not None:
            kl = _first(self.metrics.mean("kl"), self.metrics.mean("objective/kl"))
            entropy = _first(self.metrics.mean("entropy"), self.metrics.mean("objective/entropy"))
        lead = next((records for records in per_tap if records), None)
        if lead is None:
            return None
        completions = tuple(text for record in lead for text in record.completions)
        size = len(completions)
        columns: dict[str, tuple[float | None, ...]] = {}
        weights: list[float] = []
        notes: list[str] = []
        for fn, records, weight in zip(self.taps, per_tap, self.weights, strict=True):
            values = tuple(value for record in records for value in record.proxy())
            if len(values) == size:
                columns[str(fn.__name__)] = values
                weights.append(weight)
            else:
                notes.append(
                    f"tap {fn.__name__!r} recorded {len(values)} rewards for {size} completions; unused"
                )
        ids: tuple[tuple[int, ...], ...] | None = None
        if all(record.completion_ids is not None for record in lead):
            ids = tuple(row for record in lead for row in (record.completion_ids or ()))
            if len(ids) != size:
                ids = None
        prompts: tuple[str, ...] | None = None
        if all(record.prompts is not None for record in lead):
            prompts = tuple(text for record in lead for text in (record.prompts or ()))
            if len(prompts) != size:
                prompts = None
        if not columns:
            msg = f"no tapped reward function recorded one reward per completion ({'; '.join(notes)})"
            raise SourceError(msg)
        grouped = all(_group_size(self.group_size, len(record.completions)) for record in lead)
        part = _Part(
            completions=completions,
            prompts=prompts,
            completion_ids=ids,
            columns=columns,
            weights=tuple(weights),
            group_size=self.group_size if grouped else None,
        )
        return _assemble(
            step,
            [part],
            tokenizer=self.tokenizer,
            source=self.kind,
            kl=kl,
            entropy=entropy,
            notes=tuple(notes),
        )


class MetricSource:
    """Trainers without rollouts (see the module docs): per-step means from the trainer's metric lists."""

    kind = "metrics"

    def __init__(self, trainer: Any, *, reward_key: str, scale_by_beta: bool, kl_key: str, entropy_key: str):
        """Read ``reward_key`` (divided by beta when ``scale_by_beta``), ``kl_key`` and ``entropy_key``."""
        self.trainer = trainer
        self.reward_key = reward_key
        self.scale_by_beta = scale_by_beta
        self.kl_key = kl_key
        self.entropy_key = entropy_key
        self.cursor = MetricCursor(self._container)

    def _container(self) -> Any:
        metrics = getattr(self.trainer, "_metrics", None)
        if isinstance(metrics, Mapping) and isinstance(metrics.get("train"), Mapping):
            return metrics["train"]
        return getattr(self.trainer, "stats", None)

    def function_names(self) -> tuple[str, ...]:
        """No per-function rewards in this source."""
        return ()

    def poll(self, step: int) -> Batch | None:
        """The per-micro-batch reward entries since the last poll (None when there are none)."""
        rewards = self.cursor.new(self.reward_key)
        kl, entropy = self.cursor.mean(self.kl_key), self.cursor.mean(self.entropy_key)
        if not rewards:
            return None
        if self.scale_by_beta:
            beta = _finite(getattr(self.trainer, "beta", None))
            if not beta:
                return None
            rewards = [value / beta for value in rewards]
        return Batch(step=step, rewards=tuple(rewards), kl=kl, entropy=entropy, source=self.kind)


def choose_source(
    trainer: Any, *, taps: Sequence[TappedReward] | None = None, group_size: int | None = None
) -> GenerationSource | TapSource | MetricSource | None:
    """Pick how to observe ``trainer``: explicit taps, GRPO/RLOO logs, tapped reward functions, metrics.

    Returns None when the trainer exposes nothing loopguard can read (wrap its reward with
    :func:`loopguard.tap` and pass ``taps=[...]``).
    """
    tokenizer = getattr(trainer, "processing_class", None)
    metrics = getattr(trainer, "_metrics", None)
    cursor = MetricCursor(
        lambda: metrics.get("train") if isinstance(metrics, Mapping) else getattr(trainer, "stats", None)
    )
    if taps:
        return TapSource(taps, tokenizer=tokenizer, group_size=group_size, metrics=cursor)
    if GenerationSource.supports(trainer):
        return GenerationSource(trainer)
    functions = getattr(trainer, "reward_funcs", None)
    if isinstance(functions, (list, tuple)):
        tapped = [fn for fn in functions if is_tapped(fn)]
        if tapped:
            weights = _weights(trainer, len(functions))
            chosen = [w for fn, w in zip(functions, weights, strict=True) if is_tapped(fn)]
            return TapSource(
                tapped, tokenizer=tokenizer, group_size=group_size, weights=chosen, metrics=cursor
            )
    if isinstance(metrics, Mapping) and hasattr(trainer, "precompute_ref_logps") and hasattr(trainer, "beta"):
        return MetricSource(  # TRL's DPOTrainer: implicit reward margins are logged multiplied by beta
            trainer, reward_key="rewards/margins", scale_by_beta=True, kl_key="kl", entropy_key="entropy"
        )
    if isinstance(getattr(trainer, "stats", None), Mapping) and hasattr(trainer, "_beta"):
        return MetricSource(
            trainer,
            reward_key="objective/scores",
            scale_by_beta=False,
            kl_key="objective/kl",
            entropy_key="objective/entropy",
        )
    return None
