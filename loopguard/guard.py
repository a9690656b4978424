"""The Guard: one observation of a training step in, one decision out.

:class:`Observation` carries what a trainer already computed for one step (rewards, completions, lengths,
prompt groups, KL, entropy, ensemble scores, embeddings, gold scores, the current beta). :class:`Guard` runs
the configured detectors (:mod:`loopguard.detectors`) on it, scores each against its robust warm-up baseline,
smooths and votes the scores into an OK / WARN / HACK verdict, asks the KL controller
(:mod:`loopguard.control`) for the next beta and the escalation ladder for a rollback or a stop, and returns a
:class:`Decision` with a plain-English explanation. No torch, no trainer: adapters translate trainer events
into observations and apply decisions.

The Guard's memory is a JSON value: :meth:`Guard.state_dict` / :meth:`Guard.load_state_dict` (no pickle). A
Guard loaded from a saved state makes the same decisions on the same observations as the one that saved it.

Example:
    >>> import numpy as np
    >>> from loopguard import Guard, Observation
    >>> guard = Guard(mode="kl_control", beta=0.04, warmup_steps=5)
    >>> rng = np.random.default_rng(0)
    >>> texts = lambda: [" ".join(rng.choice(list("abcdefghij"), size=12)) for _ in range(16)]
    >>> for step in range(6):
    ...     decision = guard.step(Observation(step, rng.normal(size=16), completions=texts(), group_size=4))
    >>> decision.verdict, decision.action, decision.beta_after
    ('OK', 'none', 0.04)
    >>> looping = ["x y " * 6] * 16
    >>> decisions = [
    ...     guard.step(Observation(step, rng.normal(size=16), completions=looping, group_size=4))
    ...     for step in range(6, 12)
    ... ]
    >>> [(d.verdict, d.action) for d in decisions[1:4]]  # HACK for 2 steps trips; a raise waits a step to act
    [('HACK', 'none'), ('HACK', 'raise_beta'), ('HACK', 'none')]
    >>> decisions[-1].beta_after > 0.04
    True
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, cast, get_args

import attrs
import numpy as np
from numpy.typing import NDArray

from loopguard._saved_state import Fields, as_state_error, check_state_reals, check_state_text
from loopguard._types import Action, Verdict
from loopguard._validation import (
    MAX_ENSEMBLE_MEMBERS,
    MAX_NAME_LENGTH,
    MAX_TRAJECTORIES,
    as_float_array,
    as_group_sizes,
    as_int_array,
    check_bool,
    check_choice,
    check_int,
    check_real,
    describe,
    scalar_value,
)
from loopguard.control import (
    AdaptiveKL,
    BangBang,
    ControlInput,
    ControlOutput,
    EscalationLadder,
    KLController,
    LadderOutput,
    LadderState,
    PIDLagrangian,
)
from loopguard.detectors import (
    HACK_LEVEL,
    WARN_LEVEL,
    Detector,
    Diversity,
    Length,
    Repetition,
    StepData,
    Takeover,
    as_detectors,
    band_score,
)
from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError, StateError
from loopguard.scoring import Smoother, Vote, as_smoother, as_vote
from loopguard.signals import TokenBatch, as_token_batch, mann_kendall_z, robust_baseline, series_slope
from loopguard.signals._numeric import plain_mean, plain_std, short_median
from loopguard.targeted import PriceEvidence, Target, TargetedPenalty

__all__ = ["Action", "Decision", "DecodedState", "Guard", "Mode", "Observation", "Verdict", "echo_guard"]

Mode = Literal["log_only", "kl_control", "pid_lagrangian", "adaptive_kl"]
OnError = Literal["warn", "raise"]

STATE_VERSION = 6
_READABLE_VERSIONS = (1, 2, 3, 4, 5, 6)  # 1 had no "episode" (the adapters kept the onset); 2 no reference
# sample; 3 no targeted penalty and no ceiling count; 4 no sustained evidence; 5 no pooled pricing
_PRESETS: dict[str, type[Any]] = {
    "kl_control": BangBang,
    "pid_lagrangian": PIDLagrangian,
    "adaptive_kl": AdaptiveKL,
}
_MAX_BETA_HISTORY = 100
_MAX_NOTES = 10_000
_TOKEN_TEXT_CHARS = 32  # a token's text quoted in an explanation is cut to this many characters
_STATE_KEYS = (
    "version",
    "config",
    "seen",
    "detectors",
    "vote",
    "controller",
    "ladder",
    "beta",
    "beta_history",
    "said",
    "stopped_reason",
    "episode",
    "reference_batches",
    "penalty",
    "candidates",
    "ceiling_steps",
    "pricing",
)
_KEYS_BY_VERSION = {1: 11, 2: 12, 3: 13, 4: 16, 5: 16, 6: 17}  # how many of _STATE_KEYS each version has
_CEILING_WARN_EVERY = 10  # HACK with beta at its ceiling: warn on the first such step, then every 10
_EPISODE_KEYS = ("onset", "suspect", "healthy")
_MEMORY_KEYS = ("warm", "baseline", "recent", "score", "smoothed", "memory", "reference", "evidence")
_MEMORY_KEYS_BY_VERSION = {1: 6, 2: 6, 3: 7, 4: 7, 5: 8, 6: 8}  # how many of _MEMORY_KEYS each version has
_MAX_REFERENCE_BATCHES = 64  # reference batches kept per statistic (add_reference plus the first steps)
_TREND_Z = 2.33  # Mann-Kendall z of a warm-up trend toward a hack: one-sided p < 0.01
_TREND_MIN_POINTS = 6  # fewest warm-up values a trend is tested on


# ---------------------------------------------------------------------------------------------- Observation


def _texts(name: str, value: object) -> tuple[str, ...]:
    if type(value) is tuple and (not value or set(map(type, value)) == {str}):  # what the adapters pass
        return cast("tuple[str, ...]", value)
    if isinstance(value, np.ndarray) and value.dtype.kind in "UO":  # a numpy array of strings
        if value.ndim != 1:
            shape = value.shape
            msg = f"`{name}` must be a 1-D list of strings (one per completion), got an array shaped {shape}."
            raise InputError(msg)
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        msg = f"`{name}` must be a list of strings, got {describe(value)}."
        raise LoopguardTypeError(msg)
    for index, item in enumerate(value):
        if not isinstance(item, str):
            msg = (
                f"`{name}[{index}]` must be a string, got {type(item).__name__} {describe(item)} "
                "(convert chat messages to text first)."
            )
            raise LoopguardTypeError(msg)
    return tuple(value)


def _finite(name: str, value: object, lo: float | None = None) -> float:
    """A finite real scalar: a number, or a 0-d / one-element array or tensor (any device)."""
    try:
        return check_real(name, scalar_value(name, value), lo=lo)
    except ConfigError as error:  # data, not configuration
        raise InputError(str(error)) from None


def _integer(name: str, value: object, lo: int, hi: int | None = None) -> int:
    """An integer: a Python or numpy int, or a 0-d / one-element integer array or tensor."""
    return check_int(name, scalar_value(name, value), lo=lo, hi=hi)


def _beta(value: object) -> float:
    beta = _finite("beta", value, lo=0.0)
    if beta == 0.0:
        msg = "`beta` must be > 0 (a KL coefficient of 0 removes the reference model in TRL), got 0.0."
        raise InputError(msg)
    return beta


_PER_COMPLETION = "[B] (one entry per completion; flatten a [B, 1] column with .reshape(-1))"


@attrs.frozen(eq=False, init=False)
class Observation:
    """What one training step produced, as the Guard sees it. Only ``step`` and ``rewards`` are required.

    Args:
        step: The trainer's global step (an int >= 0).
        rewards: Proxy reward per completion, ``[B]``: the reward the policy is trained on, *before* any
            shaping (see :func:`loopguard.shaping.shape_reward`), so shaping never hides a hack.
        completions: Completion texts, ``B`` strings.
        completion_ids: Completion token ids (a list of ``B`` id lists, a 2-D array, or a ``TokenBatch``).
        lengths: Completion lengths in tokens, ``[B]``; derived from ``completion_ids`` (or words of
            ``completions``) when omitted.
        group_size: Completions per prompt (GRPO's ``num_generations``), laid out group-contiguous.
        group_sizes: Sizes of consecutive prompt groups when they differ (e.g. after TRL left out
            "unscorable" completions): ints ``>= 1`` that add up to ``B``. Mutually exclusive with
            ``group_size``; groups of one completion carry no spread and are left out of group statistics.
        kl: The step's mean KL to the reference policy (required by ``mode="adaptive_kl"``).
        entropy: The step's mean token entropy.
        ensemble_scores: Reward-model ensemble scores, ``[K, B]``.
        embeddings: Response embeddings of the policy outputs, ``[N, D]``.
        reference_embeddings: Reference (SFT) response embeddings, ``[M, D]``.
        gold: Gold-judge scores for ``gold_indices`` of the batch (or for the whole batch).
        gold_indices: Batch positions that ``gold`` scores.
        prompts: Prompt text per completion, ``B`` strings (a gold judge needs them).
        beta: The trainer's current KL coefficient (> 0).

    Arrays may be lists, numpy arrays or torch tensors on any device; scalars (``step``, ``group_size``,
    ``kl``, ``entropy``, ``beta``) may also be 0-d or one-element arrays or tensors. Tensors on the ``meta``
    device and masked arrays with a masked element are refused.

    Raises:
        LoopguardTypeError, InputError: a field has the wrong type, shape, length or a non-finite value; the
            message names the field and the expected shape.

    Example:
        >>> ids = [[1, 2], [3], [4, 4], [5]]
        >>> obs = Observation(3, [1.0, 0.0, 1.0, 1.0], completion_ids=ids, group_size=2)
        >>> obs.rewards.shape, obs.group_size
        ((4,), 2)
    """

    step: int
    rewards: NDArray[np.float64]
    completions: tuple[str, ...] | None
    completion_ids: TokenBatch | None
    lengths: NDArray[np.int64] | None
    group_size: int | None
    group_sizes: tuple[int, ...] | None
    kl: float | None
    entropy: float | None
    ensemble_scores: NDArray[np.float64] | None
    embeddings: NDArray[np.float64] | None
    reference_embeddings: NDArray[np.float64] | None
    gold: NDArray[np.float64] | None
    gold_indices: NDArray[np.int64] | None
    prompts: tuple[str, ...] | None
    beta: float | None

    def __init__(
        self,
        step: int,
        rewards: object,
        *,
        completions: Sequence[str] | None = None,
        completion_ids: object = None,
        lengths: object = None,
        group_size: int | None = None,
        group_sizes: Sequence[int] | None = None,
        kl: float | None = None,
        entropy: float | None = None,
        ensemble_scores: object = None,
        embeddings: object = None,
        reference_embeddings: object = None,
        gold: object = None,
        gold_indices: object = None,
        prompts: Sequence[str] | None = None,
        beta: float | None = None,
    ) -> None:
        """Validate and convert every field (see the class docstring)."""
        self.__attrs_init__(
            step=_integer("step", step, lo=0),
            rewards=as_float_array("rewards", rewards, shape=_PER_COMPLETION),
            completions=None if completions is None else _texts("completions", completions),
            completion_ids=None
            if completion_ids is None
            else as_token_batch("completion_ids", completion_ids),
            lengths=None
            if lengths is None
            else as_int_array("lengths", lengths, lo=0, shape=_PER_COMPLETION),
            group_size=None
            if group_size is None
            else _integer("group_size", group_size, lo=2, hi=MAX_TRAJECTORIES),
            group_sizes=None
            if group_sizes is None
            else tuple(as_group_sizes("group_sizes", group_sizes).tolist()),
            kl=None if kl is None else _finite("kl", kl),
            entropy=None if entropy is None else _finite("entropy", entropy, lo=0.0),
            ensemble_scores=None
            if ensemble_scores is None
            else as_float_array(
                "ensemble_scores",
                ensemble_scores,
                ndim=2,
                max_len=MAX_ENSEMBLE_MEMBERS,
                shape="[K, B] (K reward models x B completions; wrap one model's scores as [scores])",
            ),
            embeddings=None
            if embeddings is None
            else as_float_array("embeddings", embeddings, ndim=2, shape="[N, D] (one row per response)"),
            reference_embeddings=None
            if reference_embeddings is None
            else as_float_array(
                "reference_embeddings", reference_embeddings, ndim=2, shape="[M, D] (one row per response)"
            ),
            gold=None
            if gold is None
            else as_float_array("gold", gold, shape="[G] (one score per audited completion)"),
            gold_indices=None
            if gold_indices is None
            else as_int_array("gold_indices", gold_indices, lo=0, shape="[G] (batch positions of `gold`)"),
            prompts=None if prompts is None else _texts("prompts", prompts),
            beta=None if beta is None else _beta(beta),
        )

    def __attrs_post_init__(self) -> None:
        """Cross-field checks: every per-completion field matches the batch size."""
        size = len(self.rewards)
        per_completion = {
            "completions": None if self.completions is None else len(self.completions),
            "completion_ids": None if self.completion_ids is None else self.completion_ids.n_rows,
            "lengths": None if self.lengths is None else len(self.lengths),
            "prompts": None if self.prompts is None else len(self.prompts),
            "ensemble_scores": None if self.ensemble_scores is None else self.ensemble_scores.shape[1],
        }
        for name, count in per_completion.items():
            if count is not None and count != size:
                msg = f"`{name}` must have one entry per reward ({size}), got {count}."
                raise InputError(msg)
        if self.group_size is not None and size % self.group_size:
            msg = f"`group_size` must divide the batch size ({size}), got {self.group_size}."
            raise InputError(msg)
        if self.group_sizes is not None:
            if self.group_size is not None:
                msg = (
                    "`group_sizes` must not be given together with `group_size` (pass one: `group_size` for "
                    f"equal groups, `group_sizes` for ragged ones), got group_size={self.group_size} and "
                    f"group_sizes={describe(self.group_sizes)}."
                )
                raise InputError(msg)
            as_group_sizes("group_sizes", np.asarray(self.group_sizes, dtype=np.int64), total=size)
        if (
            self.embeddings is not None
            and self.reference_embeddings is not None
            and self.embeddings.shape[1] != self.reference_embeddings.shape[1]
        ):
            msg = (
                "`embeddings` and `reference_embeddings` must have the same dimension, "
                f"got {self.embeddings.shape[1]} and {self.reference_embeddings.shape[1]}."
            )
            raise InputError(msg)
        if self.gold_indices is not None:
            if self.gold is None:
                msg = "`gold_indices` must come with `gold` scores, got gold=None."
                raise InputError(msg)
            if len(self.gold_indices) != len(self.gold):
                count = len(self.gold_indices)
                msg = f"`gold_indices` must have one index per gold score ({len(self.gold)}), got {count}."
                raise InputError(msg)
            if len(self.gold_indices) and int(self.gold_indices.max()) >= size:
                msg = f"`gold_indices` must be < the batch size ({size}), got {int(self.gold_indices.max())}."
                raise InputError(msg)
        elif self.gold is not None and len(self.gold) != size:
            msg = (
                f"`gold` must score the whole batch ({size}) unless `gold_indices` says which, "
                f"got {len(self.gold)}."
            )
            raise InputError(msg)


# ------------------------------------------------------------------------------------------------- Decision


@attrs.frozen(kw_only=True)
class Decision:
    """What the Guard decided for one step, and why.

    Attributes:
        step: The observation's step.
        verdict: ``"OK"``, ``"WARN"`` or ``"HACK"`` (the vote against ``warn_level``/``hack_level``).
        vote: The combined hack score in [0, 1].
        scores: Per-signal score in [0, 1] after smoothing (signals that ran this step).
        action: ``"none"``, ``"raise_beta"``, ``"lower_beta"``, ``"rollback"`` or ``"stop"``.
        beta_before: The KL coefficient before this step's decision (None when unknown in ``log_only``).
        beta_after: The KL coefficient to use from now on.
        explanation: Plain English with the numbers: what tripped, what was done, what the user can change.
        raw: The raw statistics measured this step, keyed ``"<signal>.<statistic>"``.
        components: The controller's and ladder's numbers behind the action.
        notes: One-time notes of this step (e.g. a default signal skipped for a missing input; the judges
            ``judge_gap`` keeps once its reference sample closes, see ``Detector.reference_note``).
        errors: What failed inside the Guard this step (a detector that raised or measured a non-finite
            statistic; it was skipped for this step). Empty on a healthy step; see ``on_error``.
        warming_up: True while the Guard is still collecting its warm-up baselines.
        onset: The step of the first non-OK verdict of the current episode (None on an OK step). On a
            rollback, the onset of the episode the rollback ends (the Guard then starts a new episode).
        restore_before: For ``"rollback"`` and ``"stop"``: the checkpoint to restore is the newest good one
            saved strictly before this step (the onset, or this step when the episode began here). None
            for the other actions.
        healthy: Whether a checkpoint saved after this step is safe: the verdict is OK and the run is not
            stopped. A checkpoint becomes *good* only once :meth:`Guard.confirms` its step.
        reanchor: On a ``"rollback"`` (with ``EscalationLadder(reanchor=True)``): make the restored policy
            the KL reference too (the adapters do it).
        penalty: The targeted penalty in force after this step (:meth:`TargetedPenalty.to_dict
            <loopguard.targeted.TargetedPenalty.to_dict>`), or None; :attr:`Guard.penalty` holds it.
    """

    step: int
    verdict: Verdict
    vote: float
    scores: dict[str, float]
    action: Action
    beta_before: float | None
    beta_after: float | None
    explanation: str
    raw: dict[str, float] = attrs.field(factory=dict)
    components: dict[str, float] = attrs.field(factory=dict)
    notes: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    warming_up: bool = False
    onset: int | None = None
    restore_before: int | None = None
    healthy: bool = True
    reanchor: bool = False
    penalty: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the decision as plain JSON types (for logs and metrics)."""
        return attrs.asdict(self, recurse=False) | {"notes": list(self.notes), "errors": list(self.errors)}


# -------------------------------------------------------------------------------------------------- Guard


@attrs.define
class _Reading:
    """What the Guard has read from one step so far (built up by :meth:`Guard.step`)."""

    observation: Observation
    beta_before: float | None
    verdict: Verdict = "OK"
    vote: float = 0.0
    scores: dict[str, float] = attrs.field(factory=dict)
    raw: dict[str, float] = attrs.field(factory=dict)
    notes: list[str] = attrs.field(factory=list)
    errors: list[str] = attrs.field(factory=list)
    warming: bool = False
    drift_held: bool = False
    in_reference: bool = False  # the step's batch completes the reference sample
    staged: dict[str, dict[str, float]] = attrs.field(factory=dict)  # warm-up values kept if the step is OK
    trends: list[str] = attrs.field(factory=list)  # warm-up trends toward a hack, in words
    sustained: dict[str, str] = attrs.field(factory=dict)  # detector -> why its sustained evidence trips
    data: StepData | None = None  # the step's inputs, converted once (for the targeted rung)


@attrs.define
class _DetectorMemory:
    warm: dict[str, list[float]] = attrs.field(factory=dict)
    baseline: dict[str, list[float]] | None = None  # metric -> [median, scale]
    recent: list[float] = attrs.field(factory=list)
    score: float = 0.0
    smoothed: float = 0.0
    memory: dict[str, Any] = attrs.field(factory=dict)
    reference: dict[str, list[float]] = attrs.field(factory=dict)  # metric -> values on reference batches
    evidence: dict[str, list[float]] = attrs.field(factory=dict)  # metric -> [CUSUM sum, steps it has run]

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self, recurse=False)


@attrs.define
class DecodedState:
    """A Guard's whole memory, decoded and validated by :meth:`Guard.decode_state`, not yet applied."""

    config: dict[str, Any]
    seen: int
    memories: dict[str, _DetectorMemory]
    vote: float
    controller_state: Any
    ladder_state: LadderState | None
    beta: float | None
    beta_history: list[list[float]]
    said: set[str]
    stopped_reason: str | None
    episode: _Episode
    reference_batches: int = 0
    penalty: TargetedPenalty | None = None
    candidates: TargetedPenalty | None = None
    ceiling_steps: int = 0
    pricing: PriceEvidence | None = None


@attrs.define
class _Episode:
    """The Guard's view of the run between decisions: the hack's onset and the checkpoint ledger."""

    onset: int | None = None  # first non-OK step of the current episode
    suspect: int | None = None  # the latest step with a non-OK verdict, a rollback or a stop
    healthy: bool = True  # the latest verdict was OK and the run is not stopped

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def _fmt(value: float | None) -> str:
    if value is None:
        return "unset"
    return f"{value:.4g}"


class Guard:
    """Turn observations of training steps into decisions: verdict, beta, rollback or stop, and why.

    Args:
        signals: Signal names or detector configs from :mod:`loopguard.detectors` (``"repetition"``,
            ``"diversity"``, ``"takeover"``, ``"length"``, ``"collapse"``, ``"drift"``, ``"rm_ensemble"``,
            ``"judge_gap"``, ``"info_rm"``, ``"gold"``). ``None`` uses the signals every trainer can feed:
            repetition, diversity, length, collapse and drift; a default signal whose input is missing in a
            step is skipped for that step (noted once). A signal named explicitly must be configurable (e.g.
            ``InfoRM`` needs an embedding source), which is checked here.
        mode: A shorthand for a controller with its defaults: ``"kl_control"`` (:class:`BangBang`; the default
            when no ``controller`` is given), ``"pid_lagrangian"`` (:class:`PIDLagrangian`), ``"adaptive_kl"``
            (:class:`AdaptiveKL`, driven by ``Observation.kl`` with ``n_steps`` = the batch size, as old TRL
            and verl do; it acts from the first step, while the hack signals are still warming up), or
            ``"log_only"`` (no controller: never acts, unless ``halt_on_hack``).
        controller: The KL controller, a configured object (``BangBang(...)``, ``PIDLagrangian(...)``,
            ``AdaptiveKL(...)`` or anything with the :class:`~loopguard.control.KLController` interface);
            it sets the mode. When ``mode`` is given too, it must name this controller.
        ladder: An :class:`EscalationLadder` adding the rollback and stop rungs; ``None`` keeps only the
            raise-beta rung. Not allowed with ``log_only``.
        halt_on_hack: Stop on the first HACK verdict, in every mode.
        smoothing: Per-signal score smoothing over steps, an object from :mod:`loopguard.scoring`:
            ``Median(window=3)`` (default), ``EMA(alpha=0.5)`` or ``NoSmoothing()``; the names ``"median"``,
            ``"ema"`` and ``"none"`` stand for them with their defaults.
        vote: How signal scores combine, an object from :mod:`loopguard.scoring`:
            ``Conservative(tolerance=0.2)`` (default: the max when the scores disagree by more than the
            tolerance, else the mean),
            ``Mean()``, ``Max()`` or ``KOfN(k=2)`` (the k-th largest); or one of their names.
        warmup_steps: Steps used to learn each signal's baseline (median and MAD) from the reference sample
            and the warm-up steps the Guard read as healthy.
        reference_steps: Batches of the *reference sample*, the evidence that precedes any exploit: the
            batches given to :meth:`add_reference` (drawn from the reference policy before training), then
            the first training steps (the first generation batch comes from a policy equal to the
            reference) until there are this many. From then on every relative statistic is also scored
            during the warm-up, against the reference median, so a flaw present from step 0 is seen while
            the warm-up would learn it as normal; a warm-up step that reads WARN or HACK, or a statistic
            that moves steadily toward a hack during the warm-up (Mann-Kendall trend, z >= 2.33, by more
            than its WARN band), is kept out of the baseline. ``0`` turns the reference off: the baseline
            is then every warm-up step, and nothing relative is scored before it exists (see
            ``docs/guard.md``, "Where baselines come from", for what that loses).
        beta: The user's starting KL coefficient; taken from the first ``Observation.beta`` when omitted.
        warn_level: Vote at which the verdict is WARN.
        hack_level: Vote at which the verdict is HACK.
        sigma_warn: Noise floor of the WARN band, in warm-up noise scales.
        sigma_hack: Noise floor of the HACK band, in warm-up noise scales.
        cusum: ``(slack, limit)`` of the *sustained evidence* rule, in HACK bands (one band is
            ``sigma_hack`` = 5 noise scales where the noise sets it), or None to turn the rule off. After
            the warm-up, each statistic of a primary signal keeps Page's (1954) one-sided CUSUM of its
            excess over the baseline, ``S = max(0, S + min(u, 1) - slack)`` each step, with ``u`` the
            step's excess in HACK bands; the step on which ``S`` reaches the limit reads HACK. The rise is
            then dated: the statistic trips again only after it has come back, by as much evidence the
            other way (``S`` restarts at ``-limit`` and climbs by ``slack - u`` to 0), so a level that
            stays raised trips once, not every few steps. A rise that stays a few noise scales above the
            baseline, too small for any single step to reach the HACK band, is dated within a few steps;
            how long HACK lasts stays with the per-step scores. Default
            ``(0.3, 1.2)``: steps more than 1.5 noise scales above the baseline add up, and 6 of them trip
            (4 steps at 3 scales, 2 at 5 or more); one step alone never does (``limit`` must exceed
            ``1 - slack``). Corroborating signals, which move with healthy learning, keep none. See
            ``docs/guard.md``, "Sustained evidence".
        drift_guard: Keep the vote from falling while the reward distribution degenerates (drift signal).
        advantage_scale: The typical size of the advantages the trainer's policy gradient multiplies, for
            sizing the first raise of beta (:class:`~loopguard.control.BangBang`): ``1.0`` when the trainer
            normalises advantages (GRPO's default ``scale_rewards``; the TRL adapter sets this itself),
            ``None`` (default) to estimate it as the rewards' mean within-group standard deviation.
        token_text: A callable giving a token id's text (``lambda i: tokenizer.decode([i])``), used only to
            quote the tokens an explanation names (a targeted penalty's, ``judge_gap``'s word), after their
            ids. ``None`` (default) uses the trainer's tokenizer where an adapter knows it (the TRL adapter
            does), else names tokens by id alone. It is tried on token 0 here: one that raises or returns
            something other than a string is refused. A later call that fails is a failure like a
            detector's (``on_error``): reported on every step it is needed (``RuntimeWarning`` and
            ``Decision.errors``) with that token named by its id, or fatal with ``on_error="raise"``.
        on_error: What a failure inside a detector does: ``"warn"`` (default: the detector is skipped for
            that step, a ``RuntimeWarning`` names the step and the error every time, and the failure is
            carried on ``Decision.errors``) or ``"raise"`` (the exception propagates: fatal).

    Raises:
        ConfigError, LoopguardTypeError: a bad argument, an unknown signal, ``halt_on_hack`` without a
            detector, a controller or ladder that the mode would silently ignore.
    """

    def __init__(
        self,
        signals: Sequence[str | Detector] | None = None,
        *,
        mode: Mode | None = None,
        controller: KLController | None = None,
        ladder: EscalationLadder | None = None,
        halt_on_hack: bool = False,
        smoothing: Smoother | str = "median",
        vote: Vote | str = "conservative",
        warmup_steps: int = 20,
        reference_steps: int = 3,
        beta: float | None = None,
        warn_level: float = WARN_LEVEL,
        hack_level: float = HACK_LEVEL,
        sigma_warn: float = 3.0,
        sigma_hack: float = 5.0,
        cusum: tuple[float, float] | None = (0.3, 1.2),
        drift_guard: bool = True,
        advantage_scale: float | None = None,
        token_text: Callable[[int], object] | None = None,
        on_error: OnError = "warn",
    ) -> None:
        """Validate the configuration eagerly (see the class docstring)."""
        self.detectors: tuple[Detector, ...] = as_detectors(signals)
        self._metrics = {d.name: d.metrics() for d in self.detectors}  # frozen configs: built once
        self._roles = {d.name: d.role for d in self.detectors}
        # the detectors with something to say about their reference sample (Detector.reference_note)
        self._noting = tuple(
            d for d in self.detectors if type(d).reference_note is not Detector.reference_note
        )
        self.halt_on_hack = check_bool("halt_on_hack", halt_on_hack)
        self.smoothing: Smoother = as_smoother(smoothing)
        self.vote: Vote = as_vote(vote)
        self.warmup_steps = check_int("warmup_steps", warmup_steps, lo=3, hi=1_000_000)
        limit = min(self.warmup_steps, _MAX_REFERENCE_BATCHES)
        self.reference_steps = check_int("reference_steps", reference_steps, lo=0, hi=limit)
        self.warn_level = check_real("warn_level", warn_level, lo=0.0, hi=1.0, lo_inclusive=False)
        self.hack_level = check_real("hack_level", hack_level, lo=0.0, hi=1.0, lo_inclusive=False)
        if self.hack_level <= self.warn_level:
            msg = f"`hack_level` must be > warn_level ({self.warn_level}), got {self.hack_level}."
            raise ConfigError(msg)
        self.sigma_warn = check_real("sigma_warn", sigma_warn, lo=0.0)
        self.sigma_hack = check_real("sigma_hack", sigma_hack, lo=0.0)
        if self.sigma_hack < self.sigma_warn:
            msg = f"`sigma_hack` must be >= sigma_warn ({self.sigma_warn}), got {self.sigma_hack}."
            raise ConfigError(msg)
        self.cusum = None if cusum is None else _check_cusum(cusum)
        self.drift_guard = check_bool("drift_guard", drift_guard)
        self.trainer_advantage_scale: float | None = None  # set by an adapter that knows the trainer
        self.advantage_scale = None
        if advantage_scale is not None:
            self.advantage_scale = check_real("advantage_scale", advantage_scale, lo=0.0, lo_inclusive=False)
        if token_text is not None and not callable(token_text):
            wanted = "a callable from a token id to its text, or None"
            msg = f"`token_text` must be {wanted}, got {describe(token_text)}."
            raise LoopguardTypeError(msg)
        self.token_text = token_text
        self.trainer_token_text: Callable[[int], object] | None = None  # set by an adapter with a tokenizer
        anchored = [d.name for d in self.detectors if d.needs_reference]
        if anchored and not self.reference_steps:
            msg = (
                f"signal(s) {anchored} measure against the reference sample: `reference_steps` must be > 0 "
                "with them, got 0."
            )
            raise ConfigError(msg)
        self.on_error: OnError = check_choice("on_error", on_error, get_args(OnError))  # type: ignore[assignment]
        if token_text is not None:  # a decoder that cannot decode at all is refused now, not at a hack
            text, why = _decode(token_text, 0)
            if text is None:
                msg = f"`token_text` must give a token id's text as a str: `token_text(0)` {why}."
                raise ConfigError(msg)
        self.base_beta = None if beta is None else _config_beta(beta)

        voters = [d for d in self.detectors if d.role != "guard"]
        if self.halt_on_hack and not any(d.role == "primary" for d in voters):
            msg = (
                "`halt_on_hack` needs at least one detector that can trip on its own "
                "(repetition, diversity, takeover, rm_ensemble, judge_gap, info_rm or gold), got signals "
                f"{[d.name for d in self.detectors]}."
            )
            raise ConfigError(msg)
        self.mode, self.controller = _resolve_controller(mode, controller)
        if self.controller is None and ladder is not None:
            msg = f"`ladder` must be None with mode='log_only' (log_only never acts), got {ladder!r}."
            raise ConfigError(msg)
        if self.controller is not None and self.base_beta is not None:
            self.controller.init(self.base_beta)  # validates the beta against the controller's bounds
        if ladder is not None and not isinstance(ladder, EscalationLadder):
            msg = f"`ladder` must be an EscalationLadder or None, got {type(ladder).__name__}."
            raise LoopguardTypeError(msg)
        self.ladder = ladder
        self._reset_state()

    # ----------------------------------------------------------------------------------------- state

    def _reset_state(self) -> None:
        self._seen = 0
        self._memories = {d.name: _DetectorMemory() for d in self.detectors}
        self._vote = 0.0
        self._controller_state: Any = None
        self._ladder_state: LadderState | None = None if self.ladder is None else self.ladder.init()
        self._beta: float | None = self.base_beta
        self._beta_history: list[list[float]] = []
        self._said: set[str] = set()
        self._stopped_reason: str | None = None
        self._episode = _Episode()
        self._reference_batches = 0
        self._penalty: TargetedPenalty | None = None
        self._candidates: TargetedPenalty | None = None  # features the current episode's batches price
        self._pricing: PriceEvidence | None = None  # the current episode's batches, pooled for pricing
        self._ceiling_steps = 0  # consecutive HACK steps with beta at the controller's ceiling
        self._anchor_cache: dict[str, tuple[tuple[tuple[str, int, int], ...], dict[str, list[float]]]] = {}

    def _fingerprint(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "signals": [d.name for d in self.detectors],
            "warmup_steps": self.warmup_steps,
            "reference_steps": self.reference_steps,
            "vote": self.vote.name,
            "smoothing": self.smoothing.name,
            "ladder": self.ladder is not None,
        }

    def state_dict(self) -> dict[str, Any]:
        """Return the Guard's memory as plain JSON types (no arrays, no pickle).

        Example:
            >>> import json
            >>> json.loads(json.dumps(Guard(mode="log_only").state_dict()))["version"]
            6
        """
        return {
            "version": STATE_VERSION,
            "config": self._fingerprint(),
            "seen": self._seen,
            "detectors": {name: memory.to_dict() for name, memory in self._memories.items()},
            "vote": self._vote,
            "controller": None if self._controller_state is None else self._controller_state.to_dict(),
            "ladder": None if self._ladder_state is None else self._ladder_state.to_dict(),
            "beta": self._beta,
            "beta_history": [list(entry) for entry in self._beta_history],
            "said": sorted(self._said),
            "stopped_reason": self._stopped_reason,
            "episode": self._episode.to_dict(),
            "reference_batches": self._reference_batches,
            "penalty": None if self._penalty is None else self._penalty.to_dict(),
            "candidates": None if self._candidates is None else self._candidates.to_dict(),
            "ceiling_steps": self._ceiling_steps,
            "pricing": None if self._pricing is None else self._pricing.to_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any] | DecodedState) -> None:
        """Restore memory saved by :meth:`state_dict` of a Guard with the same configuration: all or nothing.

        ``state`` may also be what :meth:`decode_state` returned for this Guard's configuration.

        Every field is checked before anything is applied: exact keys (unknown keys are refused), types,
        finiteness, ranges (a baseline must lie in its statistic's domain, a score in [0, 1]), and the
        invariants every reachable state satisfies (beta equals the controller's beta and fits its bounds,
        a warm-up buffer is empty once a baseline exists, a stopped ladder means a stopped Guard, ...).

        Raises:
            StateError: a malformed or unreachable state, another state version, or a state saved by a Guard
                configured differently (the message names the field). The Guard is then unchanged.

        Example:
            >>> guard = Guard(mode="kl_control", beta=0.04, warmup_steps=3)
            >>> saved = guard.state_dict()
            >>> saved["vote"] = float("nan")
            >>> guard.load_state_dict(saved)
            Traceback (most recent call last):
            ...
            loopguard.exceptions.StateError: `state['vote']` must be finite, got nan.
        """
        if isinstance(state, DecodedState):
            if state.config != self._fingerprint():
                current = self._fingerprint()
                msg = f"`state` was decoded for a Guard configured as {state.config}, not {current}."
                raise StateError(msg)
            self._apply_memory(state)
            return
        self._apply_memory(self.decode_state(state))

    def decode_state(self, state: object) -> DecodedState:
        """Validate a saved state against this Guard and return it decoded, without applying it.

        :meth:`load_state_dict` is decode then apply; adapters that restore more than the Guard decode every
        part first and pass the result to :meth:`load_state_dict`, so nothing is applied unless all is valid.

        Raises:
            StateError: see :meth:`load_state_dict`.
        """
        fields = Fields(state, "state", keys=None)
        version = fields.raw("version") if "version" in fields else None
        if isinstance(version, bool) or version not in _READABLE_VERSIONS:
            msg = f"`state['version']` must be {STATE_VERSION}, got {describe(version)}."
            raise StateError(msg)
        fields = Fields(state, "state", keys=_STATE_KEYS[: _KEYS_BY_VERSION[version]])
        saved, current = fields.sub("config", keys=None), self._fingerprint()
        if (
            version < 3
        ):  # saved before the reference sample: its memory has none, any reference_steps resumes it
            current = {key: value for key, value in current.items() if key != "reference_steps"}
        for key, value in current.items():
            if key not in saved or saved.raw(key) != value:
                msg = (
                    f"`state` was saved by a Guard with {key}={saved.raw(key) if key in saved else None!r}, "
                    f"but this Guard has {key}={value!r}."
                )
                raise StateError(msg)
        Fields(saved.payload, saved.path, keys=current)  # no unknown configuration keys either
        seen = fields.integer("seen", lo=0)
        detectors = fields.sub("detectors", keys=[d.name for d in self.detectors])
        memory_keys = _MEMORY_KEYS[: _MEMORY_KEYS_BY_VERSION[version]]
        memories = {
            d.name: self._decode_memory(d, detectors.sub(d.name, keys=memory_keys), seen)
            for d in self.detectors
        }
        vote = fields.real("vote", lo=0.0, hi=1.0)
        controller_state = self._decode_controller(fields, seen)
        ladder_state = self._decode_ladder(fields, seen)
        beta = fields.real("beta", lo=0.0, lo_inclusive=False, optional=True)
        if controller_state is not None and beta != controller_state.beta:
            msg = f"`state['beta']` must equal the controller's beta {controller_state.beta!r}, got {beta!r}."
            raise StateError(msg)
        if self.controller is not None and seen and controller_state is None:
            msg = f"`state['controller']` must hold the controller's state after {seen} step(s), got None."
            raise StateError(msg)
        history = _decode_beta_history(fields)
        said = [
            check_state_text(f"state['said'][{index}]", key, max_length=MAX_NAME_LENGTH * 4)
            for index, key in enumerate(fields.items("said", max_length=_MAX_NOTES))
        ]
        stopped_reason = fields.text("stopped_reason", optional=True)
        if ladder_state is not None and ladder_state.stopped and stopped_reason is None:
            msg = "`state['stopped_reason']` must explain the stop the ladder recorded, got None."
            raise StateError(msg)
        episode = _decode_episode(fields, stopped=stopped_reason is not None)
        reference_batches = 0
        if "reference_batches" in fields:
            reference_batches = fields.integer("reference_batches", lo=0, hi=_MAX_REFERENCE_BATCHES)
            if reference_batches and not self.reference_steps:
                msg = (
                    f"`state['reference_batches']` must be 0 with reference_steps=0, got {reference_batches}."
                )
                raise StateError(msg)
        penalty = candidates = None
        ceiling_steps = 0
        if version >= 4:
            payload = fields.raw("penalty")
            penalty = None if payload is None else TargetedPenalty.from_dict(payload, fields.name("penalty"))
            payload = fields.raw("candidates")
            if payload is not None:
                candidates = TargetedPenalty.from_dict(payload, fields.name("candidates"))
            if penalty is not None and (ladder_state is None or ladder_state.shaped_step is None):
                msg = "`state['penalty']` must be None when the ladder never switched it on, got a penalty."
                raise StateError(msg)
            ceiling_steps = fields.integer("ceiling_steps", lo=0, hi=seen)
        pricing = None
        if version >= 6 and fields.raw("pricing") is not None:
            pricing = PriceEvidence.from_dict(fields.raw("pricing"), fields.name("pricing"))
            if self.ladder is None or not self.ladder.targeted:
                msg = "`state['pricing']` must be None without a targeted ladder, got pooled batches."
                raise StateError(msg)
        return DecodedState(
            config=self._fingerprint(),
            seen=seen,
            memories=memories,
            vote=vote,
            controller_state=controller_state,
            ladder_state=ladder_state,
            beta=beta,
            beta_history=history,
            said=set(said),
            stopped_reason=stopped_reason,
            episode=episode,
            reference_batches=reference_batches,
            penalty=penalty,
            candidates=candidates,
            ceiling_steps=ceiling_steps,
            pricing=pricing,
        )

    def _decode_memory(self, detector: Detector, fields: Fields, seen: int) -> _DetectorMemory:
        metrics = {metric.key: metric for metric in self._metrics[detector.name]}
        warm_fields = fields.sub("warm", keys=None)
        warm: dict[str, list[float]] = {}
        for key in warm_fields.names():
            if key not in metrics:
                known = sorted(metrics)
                msg = f"`{warm_fields.name(key)}` is not a statistic of {detector.name!r} ({known})."
                raise StateError(msg)
            lo, hi = metrics[key].domain
            warm[key] = check_state_reals(
                warm_fields.name(key), warm_fields.raw(key), lo=lo, hi=hi, max_length=max(seen, 0)
            )
        baseline: dict[str, list[float]] | None = None
        if fields.raw("baseline") is not None:
            base_fields = fields.sub("baseline", keys=None)
            if not base_fields.names() or warm:
                msg = (
                    f"`{base_fields.path}` must hold at least one statistic, and the warm-up buffer must be "
                    f"empty once it exists, got {sorted(base_fields.names())} with warm-up {sorted(warm)}."
                )
                raise StateError(msg)
            baseline = {}
            for key in base_fields.names():
                name = base_fields.name(key)
                if key not in metrics:
                    msg = f"`{name}` is not a statistic of {detector.name!r} ({sorted(metrics)})."
                    raise StateError(msg)
                pair = check_state_reals(name, base_fields.raw(key), max_length=2)
                lo, hi = metrics[key].domain
                if (
                    len(pair) != 2
                    or pair[1] < 0.0
                    or (lo is not None and pair[0] < lo)
                    or (hi is not None and pair[0] > hi)
                ):
                    msg = (
                        f"`{name}` must be [median, scale] with the median in {metrics[key].domain} and a "
                        f"scale >= 0, got {describe(base_fields.raw(key))}."
                    )
                    raise StateError(msg)
                baseline[key] = pair
        reference = self._decode_reference(detector, fields, metrics)
        window = self.smoothing.memory
        name = fields.name("recent")
        recent = check_state_reals(name, fields.raw("recent"), lo=0.0, hi=1.0, max_length=window)
        if recent and baseline is None and not reference:
            msg = (
                f"`{name}` must be empty before the baseline or the reference sample exists, "
                f"got {describe(recent)}."
            )
            raise StateError(msg)
        return _DetectorMemory(
            warm=warm,
            baseline=baseline,
            recent=recent,
            score=fields.real("score", lo=0.0, hi=1.0),
            smoothed=fields.real("smoothed", lo=0.0, hi=1.0),
            memory=detector.check_memory(fields.raw("memory"), fields.name("memory")),
            reference=reference,
            evidence=self._decode_evidence(fields, metrics, baseline, seen),
        )

    def _decode_evidence(
        self, fields: Fields, metrics: dict[str, Any], baseline: dict[str, list[float]] | None, seen: int
    ) -> dict[str, list[float]]:
        """A detector memory's sustained evidence: ``[sum, steps]`` per baseline statistic (absent: none).

        A sum below 0 is a dated rise on its way back (``-limit`` just after the trip); steps are then 0.
        """
        if "evidence" not in fields:  # saved before the sustained-evidence rule (state version 4 or older)
            return {}
        evidence_fields = fields.sub("evidence", keys=None)
        evidence: dict[str, list[float]] = {}
        limit = math.inf if self.cusum is None else self.cusum[1]
        for key in evidence_fields.names():
            name = evidence_fields.name(key)
            if baseline is None or key not in baseline:
                known = sorted(baseline or {})
                msg = f"`{name}` must name a statistic of the baseline ({known}), got {key!r}."
                raise StateError(msg)
            pair = check_state_reals(name, evidence_fields.raw(key), max_length=2)
            whole = len(pair) == 2 and 0 <= pair[1] <= seen and pair[1] == int(pair[1])
            if not whole or pair[0] < 0 < pair[1]:
                msg = (
                    f"`{name}` must be [sum, steps] with a whole number of steps in [0, {seen}], and 0 steps "
                    f"when the sum is below 0 (a dated rise), got {describe(evidence_fields.raw(key))}."
                )
                raise StateError(msg)
            pair[0] = max(-limit, min(pair[0], limit))  # saved under another limit: clamp to this Guard's
            evidence[key] = [pair[0], float(int(pair[1]))]
        return evidence

    def _decode_reference(
        self, detector: Detector, fields: Fields, metrics: dict[str, Any]
    ) -> dict[str, list[float]]:
        """A detector memory's reference sample: baseline statistics only, in their domains (absent: none)."""
        reference: dict[str, list[float]] = {}
        if "reference" not in fields:  # saved before the reference sample (state version 2 or 1)
            return reference
        ref_fields = fields.sub("reference", keys=None)
        for key in ref_fields.names():
            if key not in metrics or not metrics[key].baseline:
                known = sorted(k for k, metric in metrics.items() if metric.baseline)
                name = ref_fields.name(key)
                msg = f"`{name}` is not a baseline statistic of {detector.name!r} ({known})."
                raise StateError(msg)
            lo, hi = metrics[key].domain
            reference[key] = check_state_reals(
                ref_fields.name(key), ref_fields.raw(key), lo=lo, hi=hi, max_length=_MAX_REFERENCE_BATCHES
            )
        if reference and not self.reference_steps:
            msg = f"`{ref_fields.path}` must be empty with reference_steps=0, got {sorted(reference)}."
            raise StateError(msg)
        return reference

    def _decode_controller(self, fields: Fields, seen: int) -> Any:
        payload = fields.raw("controller")
        if payload is None:
            return None
        if self.controller is None:
            msg = f"`state['controller']` must be None for mode={self.mode!r}, got {describe(payload)}."
            raise StateError(msg)
        state = self.controller.state_type.from_dict(payload)
        with as_state_error():
            self.controller.validate(state)
        if state.step > seen:
            msg = f"`state['controller']['step']` must be <= the steps seen ({seen}), got {state.step}."
            raise StateError(msg)
        if self.base_beta is not None and state.base_beta != self.base_beta:
            msg = (
                f"`state` was saved by a Guard with beta={state.base_beta!r}, but this Guard has "
                f"beta={self.base_beta!r}."
            )
            raise StateError(msg)
        return state

    def _decode_ladder(self, fields: Fields, seen: int) -> LadderState | None:
        payload = fields.raw("ladder")
        if (payload is None) != (self.ladder is None):
            msg = (
                f"`state['ladder']` must be {'None' if self.ladder is None else 'a LadderState'} for this "
                f"Guard, got {describe(payload)}."
            )
            raise StateError(msg)
        if payload is None or self.ladder is None:
            return None
        state = LadderState.from_dict(payload)
        with as_state_error():
            self.ladder.validate(state)
        if state.step > seen:
            msg = f"`state['ladder']['step']` must be <= the steps seen ({seen}), got {state.step}."
            raise StateError(msg)
        return state

    def _apply_memory(self, memory: DecodedState) -> None:
        self._seen, self._memories, self._vote = memory.seen, memory.memories, memory.vote
        self._controller_state, self._ladder_state = memory.controller_state, memory.ladder_state
        self._beta, self._beta_history = memory.beta, memory.beta_history
        if self.base_beta is None and memory.controller_state is not None:
            self.base_beta = memory.controller_state.base_beta
        self._said, self._stopped_reason = memory.said, memory.stopped_reason
        self._episode = memory.episode
        self._reference_batches = memory.reference_batches
        self._penalty, self._candidates = memory.penalty, memory.candidates
        self._pricing = memory.pricing
        self._ceiling_steps = memory.ceiling_steps
        self._anchor_cache = {}

    @property
    def beta(self) -> float | None:
        """The KL coefficient the Guard currently wants (None until known in ``log_only``)."""
        return self._beta

    @property
    def stopped(self) -> bool:
        """Whether the Guard has decided to stop the run (terminal)."""
        return self._stopped_reason is not None

    @property
    def onset(self) -> int | None:
        """The step of the first non-OK verdict of the current episode (None while the run reads OK)."""
        return self._episode.onset

    @property
    def healthy(self) -> bool:
        """Whether a checkpoint saved now is safe: the latest verdict was OK and the run is not stopped."""
        return self._episode.healthy and self._stopped_reason is None

    # ------------------------------------------------------------------------------- checkpoint ledger

    def rollback_target(self, step: int) -> int:
        """The step a rollback decided now would restore before: the episode's onset, else ``step``.

        Adapters ask their checkpoint store whether a good checkpoint saved strictly before it exists, and
        pass the answer to :meth:`step` as ``can_rollback``.
        """
        return self._episode.onset if self._episode.onset is not None else int(step)

    def confirms(self, step: int) -> bool:
        """Whether a checkpoint saved at ``step`` (while :attr:`healthy`) is confirmed good now.

        True when no verdict since ``step`` was non-OK and no rollback or stop happened since: the hack may
        have begun before it was detected, so a store marks its checkpoint good only at the next save
        boundary, if this holds then (a confirmation window). Any number of stores can ask about their own
        checkpoints: the Guard keeps no per-store ledger, only the latest suspect step.

        Raises:
            LoopguardTypeError, ConfigError: ``step`` is not an integer >= 0.
        """
        saved = check_int("step", step, lo=0)
        suspect = self._episode.suspect
        return self._stopped_reason is None and (suspect is None or suspect < saved)

    # ----------------------------------------------------------------------------- reference sample

    def add_reference(self, observation: Observation) -> None:
        """Measure a batch drawn from the *reference* policy, before training: evidence no exploit can teach.

        Call it before the first :meth:`step` with batches generated by the reference model (or by the
        policy before its first update) and scored by the same reward functions; they count toward
        ``reference_steps`` (the first training steps complete the sample when fewer are given; more may be
        given, up to 64). Reference batches are not steps: nothing is decided, smoothed or logged. They cost
        one generation and scoring pass each, once; the first training batches cost nothing extra.

        Raises:
            LoopguardTypeError: ``observation`` is not an :class:`Observation`.
            ConfigError: ``reference_steps=0`` (the reference is off), or the Guard has already taken a
                training step (the reference must precede the exploit).
        """
        if not isinstance(observation, Observation):
            msg = f"`observation` must be an Observation, got {type(observation).__name__}."
            raise LoopguardTypeError(msg)
        if not self.reference_steps:
            msg = "`add_reference` needs a reference sample: this Guard has reference_steps=0 (off)."
            raise ConfigError(msg)
        if self._seen:
            msg = (
                "`add_reference` must come before the first step (the reference precedes the exploit), "
                f"got it after {self._seen} step(s)."
            )
            raise ConfigError(msg)
        if self._reference_batches >= _MAX_REFERENCE_BATCHES:
            msg = f"`add_reference` takes at most {_MAX_REFERENCE_BATCHES} batches, got one more."
            raise ConfigError(msg)
        reading = _Reading(observation=observation, beta_before=self._beta)
        data = StepData(observation, warmup_steps=self.warmup_steps, reference=True)
        said = set(self._said)  # a one-time note belongs to a training step's decision: keep it for one
        for detector in self.detectors:
            raw = self._measure(detector, data, reading)
            if raw is None:
                continue
            memory = self._memories[detector.name]
            for key in self._baseline_keys(detector):
                if key in raw:
                    memory.reference.setdefault(key, []).append(raw[key])
        self._said = said
        self._reference_batches += 1

    @property
    def seen(self) -> int:
        """Training steps observed so far (the batches given to :meth:`add_reference` not counted)."""
        return self._seen

    @property
    def reference_batches(self) -> int:
        """Batches in the reference sample so far (given to :meth:`add_reference`, then the first steps)."""
        return self._reference_batches

    # ------------------------------------------------------------------------------------------ step

    def _note_once(self, key: str, message: str, notes: list[str]) -> None:
        if key not in self._said:
            self._said.add(key)
            notes.append(message)

    def _measure(self, detector: Detector, data: StepData, reading: _Reading) -> dict[str, float] | None:
        memory = self._memories[detector.name]
        step = data.observation.step
        try:
            raw = detector.measure(data, memory.memory)
        except Exception as error:  # the failure policy: loud every time, fatal with on_error="raise"
            if self.on_error == "raise":
                raise
            what = f"{type(error).__name__}: {error}"
            self._fail(reading, f"signal {detector.name!r} failed at step {step}, skipped for it: {what}")
            return None
        if raw is None:
            self._note_once(
                f"skip:{detector.name}",
                f"signal {detector.name!r} skipped: this step has no {detector.needs}",
                reading.notes,
            )
            return None
        bad = sorted(key for key, value in raw.items() if not math.isfinite(value))
        if bad:
            message = (
                f"signal {detector.name!r} measured a non-finite {', '.join(bad)} at step {step}; those "
                "statistics were skipped for it"
            )
            if self.on_error == "raise":
                raise InputError(message)
            self._fail(reading, message)
        return {key: value for key, value in raw.items() if key not in bad}

    def _reference_note(self, detector: Detector, reading: _Reading) -> None:
        """Pass on, once, what ``detector`` settled on its reference sample; warn when it reads nothing."""
        key = f"reference:{detector.name}"
        if key in self._said:
            return
        try:
            note = detector.reference_note(self._memories[detector.name].memory)
        except Exception as error:  # the failure policy: loud every time, fatal with on_error="raise"
            if self.on_error == "raise":
                raise
            what = f"{type(error).__name__}: {error}"
            self._fail(reading, f"signal {detector.name!r} could not describe its reference sample: {what}")
            return
        if note is None:
            return
        text, off = note
        self._note_once(key, text, reading.notes)
        if off:
            warnings.warn(f"loopguard: {text}", RuntimeWarning, stacklevel=3)

    def _fail(self, reading: _Reading, message: str) -> None:
        """A part of the Guard failed this step: warn (every time) and carry it on the decision."""
        reading.errors.append(message)
        text = f"loopguard: {message} (on_error='raise' makes this fatal)"
        warnings.warn(text, RuntimeWarning, stacklevel=4)

    def _score(
        self, detector: Detector, raw: dict[str, float], reading: _Reading
    ) -> tuple[float | None, bool]:
        """The detector's score this step and whether to smooth it.

        Against the baseline, or during the warm-up against the reference sample (smoothed; None while
        neither exists yet), raised to the absolute-band score where a statistic has one (bad at any
        baseline: it counts from the first step, unsmoothed until a relative score exists).
        """
        absolute = [
            score
            for metric in self._metrics[detector.name]
            if metric.key in raw and (score := metric.absolute_score(raw[metric.key])) is not None
        ]
        relative = self._relative(detector, raw, reading)
        if relative is None:
            return (max(absolute) if absolute else None), False
        return max([relative, *absolute]), True

    def _baseline_keys(self, detector: Detector) -> list[str]:
        return [metric.key for metric in self._metrics[detector.name] if metric.baseline]

    def _learn(self, detector: Detector, raw: dict[str, float], warming: bool) -> None:
        """Without a reference: fill the warm-up buffer, and once warmed up turn it into the baseline."""
        memory = self._memories[detector.name]
        keys = self._baseline_keys(detector)
        for key, value in raw.items():
            if key in keys:
                memory.warm.setdefault(key, []).append(value)
        if not warming:
            self._fix_baseline(detector)

    def _fix_baseline(self, detector: Detector) -> None:
        """The baseline (median and 1.4826 MAD) of the reference sample and the accepted warm-up values.

        Left unset while no statistic has 3 values yet (the buffers keep filling); a statistic whose warm-up
        was not trusted (non-OK steps, a trend toward a hack) has only the reference and healthy steps here.
        """
        memory = self._memories[detector.name]
        values = {
            key: memory.reference.get(key, []) + memory.warm.get(key, [])
            for key in self._baseline_keys(detector)
        }
        if max((len(v) for v in values.values()), default=0) < 3:
            return
        memory.baseline = {}
        for key, series in values.items():
            if len(series) >= 3:
                baseline = robust_baseline(series)
                memory.baseline[key] = [baseline.median, baseline.scale]
        memory.warm = {}

    def _anchors(self, detector: Detector) -> dict[str, list[float]]:
        """During the warm-up: ``[median, scale]`` of each statistic the reference sample measured.

        The median is the reference's (what the reference policy wrote); the noise scale is that of the
        reference and the healthy warm-up values so far, so it grows more reliable as the warm-up goes on.
        """
        memory = self._memories[detector.name]
        sizes = tuple(
            (key, len(values), len(memory.warm.get(key, []))) for key, values in memory.reference.items()
        )
        cached = self._anchor_cache.get(detector.name)
        if cached is not None and cached[0] == sizes:  # the buffers only grow: same sizes, same values
            return cached[1]
        anchors: dict[str, list[float]] = {}
        for key, reference in memory.reference.items():
            if not reference:
                continue
            series = reference + memory.warm.get(key, [])
            scale = robust_baseline(series).scale if len(series) >= 3 else 0.0
            median = short_median(reference)  # numpy's bits, in Python for a short sample (None: ask numpy)
            anchors[key] = [float(np.median(reference)) if median is None else median, scale]
        self._anchor_cache[detector.name] = (sizes, anchors)
        return anchors

    def _against(
        self, detector: Detector, raw: dict[str, float], baselines: dict[str, list[float]]
    ) -> float | None:
        """The detector's combined score of ``raw`` against ``baselines`` (None: nothing to compare)."""
        scores: dict[str, float] = {}
        for metric in self._metrics[detector.name]:
            if metric.key in raw and metric.key in baselines:
                median, scale = baselines[metric.key]
                scores[metric.key] = metric.score(
                    raw[metric.key], median, scale, sigma_warn=self.sigma_warn, sigma_hack=self.sigma_hack
                )
        if not scores:
            return None
        pairs = {key: (value[0], value[1]) for key, value in baselines.items()}
        return float(detector.combine(scores, raw, pairs))

    def _relative(self, detector: Detector, raw: dict[str, float], reading: _Reading) -> float | None:
        """The score against the baseline, or during the warm-up against the reference (see ``_anchors``)."""
        memory = self._memories[detector.name]
        if memory.baseline is None and not self.reference_steps:
            self._learn(detector, raw, reading.warming)
            return None
        if memory.baseline is None and not reading.warming:
            self._fix_baseline(detector)
        if memory.baseline is not None:
            return self._against(detector, raw, memory.baseline)
        anchors = {} if reading.in_reference else self._anchors(detector)  # before this step's value joins
        staged = reading.staged.setdefault(detector.name, {})
        for key in self._baseline_keys(detector):
            if key not in raw:
                continue
            if reading.in_reference:  # the first steps complete the reference sample
                memory.reference.setdefault(key, []).append(raw[key])
            else:
                staged[key] = raw[key]  # joins the warm-up buffer if the step reads OK (see _commit_warm)
        if not anchors:
            return None
        score = self._against(detector, raw, anchors)
        if detector.role == "primary":
            self._check_trend(detector, raw, anchors, reading)
        return score

    def _check_trend(
        self, detector: Detector, raw: dict[str, float], anchors: dict[str, list[float]], reading: _Reading
    ) -> None:
        """A warm-up moving steadily toward a hack is evidence, not a baseline (Mann-Kendall, Theil-Sen)."""
        memory = self._memories[detector.name]
        for metric in self._metrics[detector.name]:
            if metric.key not in raw or metric.key not in anchors:
                continue
            series = [*memory.reference[metric.key], *memory.warm.get(metric.key, []), raw[metric.key]]
            if len(series) < _TREND_MIN_POINTS:
                continue
            z = mann_kendall_z(series)
            if (z if metric.bad == "up" else -z) < _TREND_Z:
                continue
            start = anchors[metric.key][0]
            end = start + series_slope(series, method="theil_sen") * (len(series) - 1)
            if metric.excess(end, start) < metric.warn:
                continue
            verb = "rose" if metric.bad == "up" else "fell"
            reading.trends.append(
                f"{detector.name}.{metric.key} {verb} steadily through the warm-up (from "
                f"{metric.unit.format(start)} toward {metric.unit.format(end)} over {len(series)} steps, "
                f"trend z = {z:+.1f})"
            )

    def _commit_warm(self, reading: _Reading) -> None:
        """Keep this warm-up step's values for the baseline only when the step read OK (healthy)."""
        if reading.verdict != "OK":
            return
        for name, values in reading.staged.items():
            memory = self._memories[name]
            for key, value in values.items():
                memory.warm.setdefault(key, []).append(value)

    def _sustain(self, detector: Detector, raw: dict[str, float], reading: _Reading) -> float | None:
        """The primary signal's sustained-evidence score (``cusum``; None: the rule does not apply).

        Updates each statistic's CUSUM against the baseline. A statistic whose sum reaches the limit scores
        as at its HACK band (or above, as far as this step's own excess goes) on this step, and its sum
        drops to ``-limit``: the rise is dated, and the statistic must come back (steps within the slack
        of the baseline, summed as the rise was) before it can trip again, so a level that stays raised
        trips once, not every few steps. One below the limit scores nothing here: the rule only adds HACK
        verdicts, it never adds a WARN.
        """
        memory = self._memories[detector.name]
        if self.cusum is None or detector.role != "primary" or memory.baseline is None:
            return None
        slack, limit = self.cusum
        scores: dict[str, float] = {}
        tripped: list[str] = []
        for metric in self._metrics[detector.name]:
            if metric.key not in raw or metric.key not in memory.baseline:
                continue
            median, scale = memory.baseline[metric.key]
            bands = {"sigma_warn": self.sigma_warn, "sigma_hack": self.sigma_hack}
            excess = metric.evidence(raw[metric.key], median, scale, **bands)
            total, steps = memory.evidence.get(metric.key, [0.0, 0.0])
            scores[metric.key] = 0.0
            if total < 0.0:  # a dated rise (steps 0): steps back within the slack climb to 0, above push down
                total = min(0.0, max(-limit, total + slack - min(max(excess, 0.0), 1.0)))
            else:
                total = max(0.0, total + min(excess, 1.0) - slack)
                steps = steps + 1.0 if total > 0.0 else 0.0
                if total >= limit:
                    warn, hack = metric.bands(median, scale, **bands)
                    instant = band_score(metric.excess(raw[metric.key], median), warn=warn, hack=hack)
                    scores[metric.key] = max(HACK_LEVEL, instant)
                    tripped.append(f"{detector.name}.{metric.key} over {int(steps)} steps")
                    total, steps = -limit, 0.0  # the rise is dated: it must come back before it trips again
            memory.evidence[metric.key] = [total, steps]
        if not scores:
            return None
        pairs = {key: (value[0], value[1]) for key, value in memory.baseline.items()}
        score = float(detector.combine(scores, raw, pairs))
        if tripped and score >= HACK_LEVEL:
            reading.sustained[detector.name] = ", ".join(tripped)
        return score

    def _smooth(self, memory: _DetectorMemory, score: float) -> float:
        memory.score = score
        memory.recent, memory.smoothed = self.smoothing.smooth(memory.recent, score, previous=memory.smoothed)
        return memory.smoothed

    def _combine(self, scores: dict[str, float]) -> float:
        roles = self._roles
        primary = [s for name, s in scores.items() if roles[name] == "primary"]
        voting = list(primary)
        if max(primary, default=0.0) >= self.warn_level:
            voting += [s for name, s in scores.items() if roles[name] == "corroborating"]
        return self.vote.combine(voting) if voting else 0.0

    def step(self, observation: Observation, *, can_rollback: bool = True) -> Decision:
        """Observe one training step and decide.

        Args:
            observation: What the step produced.
            can_rollback: Whether a good checkpoint exists to roll back to (the ladder's rollback rung).

        Returns:
            The :class:`Decision` for this step. After a ``"stop"``, every later step returns ``"stop"``.

        Raises:
            LoopguardTypeError: ``observation`` is not an :class:`Observation`.
            InputError: a KL-changing mode has no starting beta (neither ``Guard(beta=...)`` nor
                ``Observation.beta``).
        """
        if not isinstance(observation, Observation):
            msg = f"`observation` must be an Observation, got {type(observation).__name__}."
            raise LoopguardTypeError(msg)
        can_rollback = check_bool("can_rollback", can_rollback)
        self._init_beta(observation)
        reading = _Reading(observation=observation, beta_before=self._beta)
        if self._stopped_reason is not None:
            reading.verdict, reading.vote = "HACK", self._vote
            return self._decision(reading, "stop", self._stopped_reason)

        self._seen += 1
        reading.warming = self._seen <= self.warmup_steps
        reading.in_reference = self._reference_batches < self.reference_steps
        if reading.in_reference:
            self._reference_batches += 1
        data = StepData(observation, warmup_steps=self.warmup_steps, reference=reading.in_reference)
        reading.data = data
        for detector in self.detectors:
            raw = self._measure(detector, data, reading)
            memory = self._memories[detector.name]
            if raw is None:
                if detector.holds and memory.baseline is not None and memory.recent:
                    reading.scores[detector.name] = memory.smoothed  # a periodic audit: the last score stands
                continue
            reading.raw.update({f"{detector.name}.{key}": value for key, value in raw.items()})
            score, smooth = self._score(detector, raw, reading)
            if score is not None:
                value = self._smooth(memory, score) if smooth else score
                sustained = self._sustain(detector, raw, reading)
                reading.scores[detector.name] = value if sustained is None else max(value, sustained)
        if self._seen == self.warmup_steps:
            for detector in self.detectors:
                detector.on_warmup_end(self._memories[detector.name].memory)
        for detector in self._noting:
            self._reference_note(detector, reading)

        previous_vote = self._vote
        vote = self._combine({k: v for k, v in reading.scores.items() if self._roles[k] != "guard"})
        if self.drift_guard and reading.scores.get("drift", 0.0) >= self.hack_level and vote < previous_vote:
            vote, reading.drift_held = previous_vote, True
        if reading.trends and vote < self.warn_level:
            vote = self.warn_level  # a warm-up trending toward a hack reads WARN (the reason is explained)
        self._vote = reading.vote = vote
        reading.verdict = "HACK" if vote >= self.hack_level else "WARN" if vote >= self.warn_level else "OK"
        self._commit_warm(reading)
        healthy = reading.verdict == "OK"
        for detector in self.detectors:  # recent-past evidence is kept only from steps that read OK
            detector.on_verdict(self._memories[detector.name].memory, healthy)

        acts_now = self.controller is not None and self.controller.acts_while_warming
        if reading.warming and reading.verdict == "OK" and not acts_now:
            text = f"step {observation.step}: warming up ({self._seen}/{self.warmup_steps} steps); no action."
            return self._decision(reading, "none", text)
        return self._act(reading, can_rollback)

    def _init_beta(self, observation: Observation) -> None:
        if self._beta is None and observation.beta is not None:
            self._beta = self.base_beta = observation.beta
        if self.controller is not None and self._controller_state is None:
            if self._beta is None:
                msg = (
                    f"mode={self.mode!r} needs the starting beta: pass Guard(beta=...) or "
                    "Observation(beta=...) on the first step."
                )
                raise InputError(msg)
            self._controller_state = self.controller.init(self._beta)
            self._beta_history = [[observation.step, self._beta]]

    def _act(self, reading: _Reading, can_rollback: bool) -> Decision:
        hacking = reading.verdict == "HACK"  # while warming up, only absolute bands can say HACK
        ladder_out: LadderOutput | None = None
        switched_on = False
        if self.ladder is not None and self._ladder_state is not None:
            targets = self._price(reading)
            can_shape = self._penalty is None and self._candidates is not None
            ladder_out, self._ladder_state = self.ladder.update(
                self._ladder_state, hacking=hacking, can_rollback=can_rollback, can_shape=can_shape
            )
            switched_on = self._update_penalty(targets, ladder_out)
        control_out = self._control(reading, ladder_out, forget=switched_on)
        if control_out is not None:
            self._beta = control_out.beta
            if self._beta != reading.beta_before:
                history = [*self._beta_history, [reading.observation.step, self._beta]]
                self._beta_history = history[-_MAX_BETA_HISTORY:]

        action: Action = "none"
        if self.halt_on_hack and hacking:
            action = "stop"
        elif ladder_out is not None and ladder_out.action in ("stop", "rollback"):
            action = ladder_out.action
        elif control_out is not None and control_out.direction != "hold":
            action = "raise_beta" if control_out.direction == "raise" else "lower_beta"

        components: dict[str, float] = {}
        if control_out is not None:
            components.update({f"controller.{k}": v for k, v in control_out.components.items()})
        if ladder_out is not None:
            components.update({f"ladder.{k}": v for k, v in ladder_out.components.items()})
        if action == "rollback":
            for detector in self.detectors:  # do not smooth post-rollback steps with hacked scores
                memory = self._memories[detector.name]
                memory.recent, memory.smoothed, memory.evidence = [], 0.0, {}
                detector.on_rollback(memory.memory)
            self._vote = 0.0
            after_rollback = getattr(self.controller, "after_rollback", None)
            if callable(after_rollback) and self._controller_state is not None:
                # what the controller measured on the hacked policy does not describe the restored one
                self._controller_state = after_rollback(self._controller_state)
        text = self._explain(reading, action, control_out, ladder_out)
        text += self._ceiling_warning(reading, action)
        if action == "stop":
            self._stopped_reason = text
        return self._decision(reading, action, text, components)

    # ------------------------------------------------------------------------------- the targeted rung

    @property
    def penalty(self) -> TargetedPenalty | None:
        """The targeted penalty the ladder switched on, or None.

        Subtract ``penalty(completion_ids)`` from the reward the policy is trained on (the TRL adapter does it
        itself); keep giving the Guard the raw reward.
        """
        return self._penalty

    def _named(self, reading: _Reading) -> list[Target] | None:
        """Features the signals name (unpriced); None when the batch cannot be priced (no ids, < 4 rewards).

        The signals at WARN or above name their features: ``length`` the tokens past the reference's length,
        ``repetition`` / ``diversity`` the repetition rate. ``takeover`` names the tokens of the batch's most
        over-represented n-gram whether or not it reached its own bands, each as paid per occurrence and as
        paid once for holding it (a keyword): the signal that finds a hack is often another one (an ensemble
        or the judges see the pay at once, while ``takeover`` needs two batches to confirm a spread, and the
        raised beta may stop the spread before the second). The F test on the raw rewards still decides: a
        feature is priced only when the reward pays for it beyond noise.
        """
        data, obs = reading.data, reading.observation
        if data is None or obs.completion_ids is None or len(obs.rewards) < 4:
            return None
        tripping = [name for name, score in reading.scores.items() if score >= self.warn_level]
        candidates: list[Target] = []
        for detector in self.detectors:
            if isinstance(detector, Takeover):
                ngram = detector.top_ngram(data, self._memories[detector.name].memory)
                for token in sorted(set(ngram or ())):  # paid per occurrence, or once for holding it
                    for kind in ("tokens", "presence"):
                        candidates.append(Target(kind=kind, token=token, rate=0.0, source=detector.name))
            elif detector.name not in tripping:
                continue
            elif isinstance(detector, Length):
                threshold = self._reference_length(detector)
                if threshold is not None:
                    target = Target(kind="length", threshold=threshold, rate=0.0, source=detector.name)
                    candidates.append(target)
            elif isinstance(detector, (Repetition, Diversity)):
                candidates.append(Target(kind="repetition", n=detector.n, rate=0.0, source=detector.name))
        return candidates

    def _reference_length(self, detector: Length) -> float | None:
        """The reference sample's median mean length (else the warm-up baseline's), in tokens."""
        reference = self._anchors(detector).get("mean_length")
        if reference:
            return float(np.median(reference))
        baseline = self._memories[detector.name].baseline
        return None if baseline is None else float(baseline["mean_length"][0])

    def _price(self, reading: _Reading) -> list[Target]:
        """The episode's candidates, priced on its batches pooled (none outside an episode).

        An episode runs from its first non-OK verdict to the next OK one. A feature is priced on batches
        where it varies within prompt groups: the warning steps that open an episode, while the exploit is
        still spreading, often say the most, and by the time the ladder acts the exploit may fill the whole
        batch (a keyword in every completion). So every batch of the episode adds to one pooled fit
        (:class:`~loopguard.targeted.PriceEvidence`: one F test on all of them, never the luckiest of many
        per-batch tests), and the candidates are what it prices. Once a penalty is on, the features it
        charges are candidates of every later episode too, so a hack that comes back re-prices them on the
        raw rewards (rates only grow); healthy steps price nothing, so a favourite word the reward rightly
        pays for is never added on an OK step.
        """
        if self.ladder is None or not self.ladder.targeted:
            return []
        if reading.verdict == "OK":
            self._candidates = self._pricing = None
            return []
        named = self._named(reading)
        obs = reading.observation
        batch = obs.completion_ids
        if named is None or batch is None:  # this batch cannot say: the episode's price stands
            return []
        if self._penalty is not None:  # re-price what is already penalised, on the raw rewards
            known = {target.key for target in named}
            named.extend(target for target in self._penalty.targets if target.key not in known)
        pricing = self._pricing if self._pricing is not None else PriceEvidence.of(named)
        self._pricing = pricing.add(named, batch, obs.rewards, obs.group_size)
        priced = self._pricing.price()
        self._candidates = TargetedPenalty(tuple(priced)) if priced else None
        return priced or []

    def _update_penalty(self, targets: list[Target], ladder_out: LadderOutput) -> bool:
        """Switch the penalty on (the ladder's rung) or re-price it; True when it was switched on now."""
        switched_on = self._penalty is None
        if ladder_out.shape and self._candidates is not None:
            self._penalty = self._candidates.merged(targets)
        elif self._penalty is not None and targets:
            self._penalty = self._penalty.merged(targets)  # re-priced on the raw reward: rates only grow
        return switched_on and self._penalty is not None

    def _ceiling_warning(self, reading: _Reading, action: Action) -> str:
        """A loud, repeated warning while HACK persists with beta at the controller's ceiling."""
        ceiling = None if self.controller is None else self.controller.beta_ceil
        if ceiling is None or self._beta is None or self._beta < ceiling or reading.verdict != "HACK":
            self._ceiling_steps = 0
            return ""
        self._ceiling_steps += 1
        if action in ("rollback", "stop") or (self._ceiling_steps - 1) % _CEILING_WARN_EVERY:
            return ""
        text = (
            f" Beta is at its ceiling ({_fmt(ceiling)}) and the verdict has been HACK for "
            f"{self._ceiling_steps} step(s) there: raising beta cannot do more."
        )
        if self.ladder is None or self.ladder.max_rollbacks == 0:
            text += (
                " Give the Guard an escalation ladder (rollback, targeted penalty, stop: "
                "Guard(..., ladder=EscalationLadder())) or raise beta_ceil."
            )
        warnings.warn(f"loopguard: step {reading.observation.step}:{text}", RuntimeWarning, stacklevel=4)
        return text

    def _control(
        self, reading: _Reading, ladder_out: LadderOutput | None, *, forget: bool = False
    ) -> ControlOutput | None:
        """The controller's step. ``forget``: a targeted penalty was switched on at this step.

        The penalty takes the pay out of the flaw, so after this step's update the controller forgets (when
        it can) the beta that held the flaw off and the trip in progress, whose beta was raised against the
        old pay (this step's raise too: its batch was trained on the old pay). Beta then relaxes by the gain
        once the hack is held off. Only when it is switched on: a later trip (the hack back with the penalty
        in force) shows what the penalty leaves to beta, and the beta that then holds it off is remembered
        as any other (forgetting on every step forgot those trips too, on the Goodhart benchmark's diversity
        collapse: each raise started again near the user's beta, and the run ended in a stop).
        """
        if self.controller is None:
            return None
        forgets = getattr(self.controller, "forget", None) if forget else None
        observation = reading.observation
        signal = ControlInput(
            vote=reading.vote,
            kl=observation.kl,
            batch_size=len(observation.rewards),
            advantage_scale=self._advantage_scale(observation),
        )
        allow_lower = ladder_out is None or not ladder_out.in_cooldown
        output, self._controller_state = self.controller.update(
            self._controller_state, signal, allow_lower=allow_lower
        )
        if callable(forgets):
            self._controller_state = forgets(self._controller_state)
        if output.note:
            self._note_once(f"control:{output.note}", output.note, reading.notes)
        return output

    def _advantage_scale(self, observation: Observation) -> float | None:
        """The configured advantage scale, or the rewards' mean within-group standard deviation."""
        if self.advantage_scale is not None:
            return self.advantage_scale
        if self.trainer_advantage_scale is not None:
            return self.trainer_advantage_scale
        rewards = observation.rewards
        size = observation.group_size
        if size is None or size < 2 or len(rewards) % size:
            size = len(rewards)
        if size < 2:
            return None
        spread = float(plain_mean(plain_std(rewards.reshape(-1, size), axis=1, ddof=1)))
        return spread if spread > 0 else None

    # ----------------------------------------------------------------------------------- explanation

    def _signal_phrases(self, reading: _Reading, *, limit: int = 3) -> list[str]:
        """The highest-scored signals and their statistics, each against its baseline or band."""
        phrases, raw = [], reading.raw
        for name, score in sorted(reading.scores.items(), key=lambda item: -item[1])[:limit]:
            if score < 0.05:
                continue
            detector = next(d for d in self.detectors if d.name == name)
            baseline, label = self._memories[name].baseline, "baseline"
            if baseline is None:  # while warming up: the reference sample, once complete
                baseline = self._anchors(detector) if not reading.in_reference else {}
                label = "reference"
            details = []
            for metric in self._metrics[detector.name]:
                value = raw.get(f"{name}.{metric.key}")
                if value is None or (metric.key not in baseline and metric.absolute is None):
                    continue
                held = None if metric.token is None else raw.get(f"{name}.{metric.token}")
                whose = "" if held is None else self._token_phrase(reading, int(held))
                details.append(_detail(metric, value, baseline.get(metric.key), label, whose))
            detail = f" ({'; '.join(details)})" if details else ""
            phrases.append(f"{name} {score:.2f}{detail}")
        return phrases

    def _explain(
        self,
        reading: _Reading,
        action: Action,
        control_out: ControlOutput | None,
        ladder_out: LadderOutput | None,
    ) -> str:
        verdict = reading.verdict
        level = {"HACK": self.hack_level, "WARN": self.warn_level}.get(verdict)
        head = f"step {reading.observation.step}: {verdict} (vote {reading.vote:.2f}"
        head += f" >= {level:.2f})" if level is not None else ")"
        phrases = self._signal_phrases(reading) if verdict != "OK" else []
        parts = [head + (": " + ", ".join(phrases) if phrases else "") + "."]
        if reading.trends:
            parts.append(
                "The warm-up is not trusted as a baseline: "
                + "; ".join(reading.trends)
                + ". Watching against the reference sample."
            )
        if reading.sustained and verdict == "HACK":
            slack, limit = self.cusum if self.cusum is not None else (0.0, 0.0)
            parts.append(
                "Sustained rise: "
                + "; ".join(reading.sustained.values())
                + f", each step more than {slack:g} of its HACK band above the baseline, adding up to "
                f"{limit:g} bands (CUSUM), though no single step need reach the band."
            )
        if reading.drift_held:
            parts.append(
                "The reward distribution is degenerating (drift), so the vote was held, not lowered."
            )
        if action == "stop":
            parts.append(self._give_up(verdict, ladder_out, reading.scores))
        elif action == "rollback" and ladder_out is not None:
            parts.append(f"Rolling back to the last good checkpoint: {ladder_out.reason}.")
            if self.ladder is not None and self.ladder.reanchor:
                parts.append("The restored policy becomes the KL reference.")
        if ladder_out is not None and ladder_out.shape and self._penalty is not None:
            if action != "rollback":
                parts.append(ladder_out.reason[:1].upper() + ladder_out.reason[1:] + ".")
            names = self._token_names(reading, self._penalty.tokens)
            parts.append(
                f"Targeted penalty on the trained reward (the Guard keeps reading the raw reward): "
                f"{self._penalty.describe(names)}."
            )
        # a change of beta, a hacking vote that did not raise a raised beta (receding, dwelling), or a HACK
        # verdict that left beta where it was (e.g. a sustained rise dated on one step, short of the
        # controller's streak): say why
        held = control_out is not None and (
            (verdict == "HACK" and action == "none")
            or any(control_out.components.get(key) == 1.0 for key in ("held_receding", "held_dwell"))
        )
        if control_out is not None and control_out.reason and (control_out.direction != "hold" or held):
            parts.append(control_out.reason[:1].upper() + control_out.reason[1:] + ".")
        elif action == "none" and verdict != "OK" and self.mode == "log_only":
            parts.append("log_only: no action taken.")
        return " ".join(parts)

    def _token_phrase(self, reading: _Reading, token: int) -> str:
        """``token 303 "zz"``: the id, and its quoted text where the decoder gives one."""
        text = self._token_names(reading, (token,)).get(token)
        return f"token {token}" if text is None else f"token {token} {text}"

    def _token_names(self, reading: _Reading, tokens: Sequence[int]) -> dict[int, str]:
        """Each token's text, quoted, from ``token_text`` or the trainer's tokenizer; {} without either.

        A call that fails is a failure like a detector's: with ``on_error="warn"`` it is reported (a warning
        every time, and on the decision) and leaves that token to its id; with ``"raise"`` it is fatal.
        """
        decode = self.token_text if self.token_text is not None else self.trainer_token_text
        names: dict[int, str] = {}
        if decode is None:
            return names
        for token in tokens:
            text, why = _decode(decode, token)
            if text is not None:
                names[token] = json.dumps(
                    text if len(text) <= _TOKEN_TEXT_CHARS else text[: _TOKEN_TEXT_CHARS - 3] + "...",
                    ensure_ascii=False,
                )
                continue
            message = f"`token_text({token})` {why} at step {reading.observation.step}"
            if self.on_error == "raise":
                raise InputError(message)
            self._fail(reading, f"{message}; the explanation names token {token} by its id")
        return names

    def _give_up(self, verdict: Verdict, ladder_out: LadderOutput | None, scores: dict[str, float]) -> str:
        if self.halt_on_hack and verdict == "HACK":
            why = "Stopping the run: halt_on_hack is set and the verdict is HACK."
        else:
            reason = ladder_out.reason if ladder_out else "the ladder reached its last rung"
            why = f"Stopping the run: {reason.rstrip('.')}."
        history = " -> ".join(f"{_fmt(beta)} (step {int(step)})" for step, beta in self._beta_history[-6:])
        rollbacks = ""
        if self._ladder_state is not None and self.ladder is not None:
            rollbacks = (
                f" Rollbacks tried: {self._ladder_state.total_rollbacks} of {self.ladder.max_rollbacks}."
            )
        top = [
            name
            for name, _ in sorted(scores.items(), key=lambda item: -item[1])
            if scores[name] >= self.warn_level
        ]
        advice = [next(d for d in self.detectors if d.name == name).advice for name in top[:2]]
        ceiling = None if self.controller is None else self.controller.beta_ceil
        generic = "lower the learning rate"
        if ceiling is not None:
            generic = f"raise beta_ceil (now {_fmt(ceiling)}) or the starting beta, or {generic}"
        # The ladder's reason already names the generic levers (beta_ceil, learning rate): say them once.
        fix = "; ".join(advice if "beta_ceil" in why and advice else [*advice, generic])
        beta_text = f" Beta history: {history}." if history else ""
        return f"{why}{beta_text}{rollbacks} What you can change: {fix}."

    def _close_episode(self, reading: _Reading, action: Action) -> tuple[int | None, int | None]:
        """Track the hack's onset and the checkpoint ledger; return the onset and the restore target."""
        episode, step = self._episode, reading.observation.step
        if reading.verdict == "OK":
            episode.onset = None
        elif episode.onset is None:
            episode.onset = step
        onset = episode.onset
        restore_before = (onset if onset is not None else step) if action in ("rollback", "stop") else None
        if reading.verdict != "OK" or action in ("rollback", "stop"):
            episode.suspect = step  # no checkpoint saved before now can be confirmed any more
        if action == "rollback":
            episode.onset = None  # the restored policy starts a new episode
        episode.healthy = reading.verdict == "OK" and self._stopped_reason is None
        return onset, restore_before

    def _decision(
        self, reading: _Reading, action: Action, explanation: str, components: dict[str, float] | None = None
    ) -> Decision:
        onset, restore_before = self._close_episode(reading, action)
        return Decision(
            step=reading.observation.step,
            verdict=reading.verdict,
            vote=float(reading.vote),
            scores=dict(reading.scores),
            action=action,
            beta_before=reading.beta_before,
            beta_after=self._beta,
            explanation=explanation,
            raw=dict(reading.raw),
            components=dict(components or {}),
            notes=tuple(reading.notes),
            errors=tuple(reading.errors),
            warming_up=reading.warming,
            onset=onset,
            restore_before=restore_before,
            healthy=self.healthy,
            reanchor=action == "rollback" and self.ladder is not None and self.ladder.reanchor,
            penalty=None if self._penalty is None else self._penalty.to_dict(),
        )


def echo_guard(
    threshold: float = 0.6,
    warn: float | None = None,
    *,
    n: int = 2,
    halt: bool = True,
    on_error: OnError = "warn",
) -> Guard:
    """The echo-trap preset: a log-only Guard of one :class:`~loopguard.detectors.Repetition` on fixed bands.

    Each batch's mean ``n``-gram repetition rate reads OK below ``warn``, WARN from ``warn`` and HACK (an echo
    TRAP) from ``threshold``, from the first batch on (no warm-up, no smoothing); with ``halt`` the Guard
    stops at the first HACK. :class:`~loopguard.adapters.hf_trainer.EchoTrapCallback` is this Guard.

    Args:
        threshold: TRAP from this rate, in (0, 1]. Default 0.6.
        warn: WARN from this rate, in (0, threshold). Default ``threshold / 2``.
        n: n-gram size, in [1, 32]. Default 2.
        halt: Stop at the first TRAP. Default True.
        on_error: The Guard's failure policy.

    Example:
        >>> from loopguard import Observation
        >>> guard = echo_guard(0.6)
        >>> guard.step(Observation(0, [0.0] * 2, completions=["x y x y x y x y"] * 2)).action
        'stop'
    """
    trap = check_real("threshold", threshold, lo=0.0, hi=1.0, lo_inclusive=False)
    low = (
        trap / 2
        if warn is None
        else check_real("warn", warn, lo=0.0, hi=trap, lo_inclusive=False, hi_inclusive=False)
    )
    detector = Repetition(n=n, echo=(low, trap), against_baseline=False)
    halt = check_bool("halt", halt)
    return Guard(
        [detector], mode="log_only", halt_on_hack=halt, smoothing="none", warmup_steps=3, on_error=on_error
    )


def _decode(decode: Callable[[int], object], token: int) -> tuple[str | None, str]:
    """``decode(token)`` as a str and ``""``; or None and what went wrong (a user's decoder: any error)."""
    try:
        text = decode(token)
    except Exception as error:  # reported by the caller: refused at construction, else loud or fatal
        return None, f"raised {type(error).__name__}: {error}"
    if not isinstance(text, str):
        return None, f"must return a str, got {describe(text)}"
    return text, ""


def _detail(
    metric: Any, value: float, baseline: list[float] | None, label: str = "baseline", whose: str = ""
) -> str:
    """``"rate 0.700 vs baseline 0.100"`` (or ``vs reference``), else against the absolute band.

    ``whose`` names what the value belongs to (a token, ``token 303 "zz"``), in brackets after it.
    """
    shown = metric.unit.format(value) + (f" ({whose})" if whose else "")
    if baseline is not None:
        return f"{metric.key} {shown} vs {label} {metric.unit.format(baseline[0])}"
    warn, hack = metric.absolute
    level = hack if value >= hack else warn
    relation = ">=" if value >= warn else "<"
    return f"{metric.key} {shown} {relation} absolute band {metric.unit.format(level)}"


def _check_cusum(value: object) -> tuple[float, float]:
    """``Guard(cusum=...)``: ``(slack, limit)`` with ``0 < slack < 1`` and ``limit > 1 - slack``."""
    if not isinstance(value, tuple) or len(value) != 2:
        msg = f"`cusum` must be a (slack, limit) pair of HACK-band multiples or None, got {describe(value)}."
        raise LoopguardTypeError(msg)
    slack = check_real("cusum[0]", value[0], lo=0.0, hi=1.0, lo_inclusive=False, hi_inclusive=False)
    limit = check_real("cusum[1]", value[1], lo=0.0, lo_inclusive=False)
    if limit <= 1.0 - slack:
        msg = (
            f"`cusum` must have limit > 1 - slack ({1.0 - slack:g}): one step alone must not trip it, "
            f"got {value!r}."
        )
        raise ConfigError(msg)
    return slack, limit


def _decode_beta_history(fields: Fields) -> list[list[float]]:
    """``state['beta_history']``: ``[step, beta]`` pairs with an integer step >= 0 and beta > 0."""
    history: list[list[float]] = []
    for index, entry in enumerate(fields.items("beta_history", max_length=_MAX_BETA_HISTORY)):
        name = f"state['beta_history'][{index}]"
        pair = check_state_reals(name, entry, lo=0.0, max_length=2)
        if len(pair) != 2 or not float(pair[0]).is_integer() or pair[1] <= 0.0:
            rule = "[step, beta] with an integer step >= 0 and beta > 0"
            msg = f"`{name}` must be {rule}, got {describe(entry)}."
            raise StateError(msg)
        history.append([int(pair[0]), pair[1]])
    return history


def _decode_episode(fields: Fields, *, stopped: bool) -> _Episode:
    """The episode of a saved state (a version-1 state has none: a fresh one)."""
    if "episode" not in fields:
        return _Episode(healthy=not stopped)
    episode = fields.sub("episode", keys=_EPISODE_KEYS)
    healthy = episode.raw("healthy")
    if not isinstance(healthy, bool) or (healthy and stopped):
        msg = f"`{episode.name('healthy')}` must be a bool, False once stopped, got {describe(healthy)}."
        raise StateError(msg)
    return _Episode(
        onset=episode.integer("onset", lo=0, optional=True),
        suspect=episode.integer("suspect", lo=0, optional=True),
        healthy=healthy,
    )


def _resolve_controller(mode: object, controller: object) -> tuple[Mode, KLController | None]:
    """The mode and the controller object from the ``mode`` shorthand and/or a ``controller``."""
    if mode is not None:
        mode = check_choice("mode", mode, get_args(Mode))
    if mode == "log_only":
        if controller is not None:
            msg = f"`controller` must be None with mode='log_only' (log_only never acts), got {controller!r}."
            raise ConfigError(msg)
        return "log_only", None
    if controller is None:
        return (mode or "kl_control"), _PRESETS[mode or "kl_control"]()  # type: ignore[return-value]
    name = getattr(type(controller), "name", None)
    methods = ("init", "update", "validate")
    complete = all(callable(getattr(controller, method, None)) for method in methods)
    complete = complete and callable(getattr(getattr(controller, "state_type", None), "from_dict", None))
    if not complete or not isinstance(name, str) or not name:
        msg = (
            "`controller` must be a KL controller (BangBang, PIDLagrangian, AdaptiveKL or an object with "
            f"their name/state_type/init/update/validate interface), got {describe(controller)}."
        )
        raise LoopguardTypeError(msg)
    if mode is not None and name != mode:
        expected = _PRESETS[mode].__name__
        msg = f"`controller` must be a {expected} for mode={mode!r}, got {type(controller).__name__}."
        raise LoopguardTypeError(msg)
    return name, controller  # type: ignore[return-value]


def _config_beta(value: object) -> float:
    beta = check_real("beta", value, lo=0.0, lo_inclusive=False)
    return beta
