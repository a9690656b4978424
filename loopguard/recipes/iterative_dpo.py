r"""Iterative (online) DPO on TRL's ``DPOTrainer``, with loopguard's safety gates between rounds.

Each round ``r`` (Xiong et al. 2023; the RLHFlow Online-RLHF recipe):

1. **sample** ``K`` completions per prompt from the current policy (batched ``generate``);
2. **score** them with the reward: a callable ``reward(prompts, completions) -> scores``, or an ``nn.Module``
   reward model (``num_labels=1``) with its tokenizer, loaded once by the caller and scored in batches;
3. **pair** them per prompt (:func:`build_pairs`: ``max_min``, ``max_random``, ``max_max`` or
   ``length_penalized``; ties dropped, margin recorded);
4. **train** DPO with the reference = the policy the round started from (the previous round's promoted
   policy: the reference is refreshed every round);
5. **audit** the trained candidate: sample ``K`` completions per prompt from it and run the safety gates
   (:func:`evaluate_gates`) against the round's starting samples. A candidate that passes is *promoted*
   (the next round starts from it and uses it as reference); one that trips a gate is not (the next round
   starts again from the last good policy and reference), the reason is written to the round's metrics, and
   after ``max_failed_rounds`` failed rounds the run stops with a plain-English explanation.

Hand-written because TRL's online DPO trains on fresh samples continuously: it has no rounds to gate.

Layout written under ``output_dir`` (see :meth:`IterativeDPOConfig.plan`)::

    initial/model/          the starting policy (only when it was given in memory)
    round-01/pairs.jsonl    one DPO pair per line: prompt, chosen, rejected, rewards, margin
    round-01/model/         the round's trained candidate (model + tokenizer, save_pretrained format)
    round-01/adapter/       with ``peft_config``: the round's adapter (``model/`` is then the merged model)
    round-01/metrics.json   samples, pairs, training loss, gates, promoted or not and why
    manifest.json           finished rounds, written atomically (loopguard._saved_state.atomic_target)

Rerunning with the same ``output_dir`` skips the rounds the manifest lists (resume); settings that change
what a round means (K, pairing, beta, ...) must match the manifest's, and ``rounds`` may grow.

torch, transformers, TRL and datasets are imported only when a run starts; :meth:`IterativeDPOConfig.plan`,
:func:`build_pairs` and :func:`evaluate_gates` need numpy only.

Example:
    >>> from loopguard.recipes.iterative_dpo import IterativeDPOConfig
    >>> plan = IterativeDPOConfig(output_dir="runs/idpo", rounds=2).plan(initial_policy="models/sft")
    >>> [(p.round, p.directory, p.reference) for p in plan.rounds]
    [(1, 'runs/idpo/round-01', 'models/sft'), (2, 'runs/idpo/round-02', 'runs/idpo/round-01/model')]

References:
    Xiong, W., Dong, H., Ye, C., et al. (2023). Iterative Preference Learning from Human Feedback: Bridging
    Theory and Practice for RLHF under KL-Constraint. arXiv:2312.11456.

    Dong, H., Xiong, W., Pang, B., et al. (2024). RLHF Workflow: From Reward Modeling to Online RLHF.
    arXiv:2405.07863.

    Rafailov, R., Sharma, A., Mitchell, E., et al. (2023). Direct Preference Optimization: Your Language
    Model is Secretly a Reward Model. arXiv:2305.18290.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import gc
import hashlib
import json
import math
import os
import shutil
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import attrs
import numpy as np
from numpy.typing import ArrayLike, NDArray

from loopguard._saved_state import atomic_target, write_atomic
from loopguard._validation import (
    MAX_ENSEMBLE_MEMBERS,
    MAX_TRAJECTORIES,
    as_float_array,
    as_int_array,
    check_choice,
    check_int,
    check_path,
    check_real,
    check_text,
    describe,
    import_extra,
    integer,
    one_of,
    path_string,
    real,
)
from loopguard.detectors import Detector, GoldAudit, Length, Repetition, RMEnsemble, StepData
from loopguard.exceptions import ConfigError, InputError, LoopguardError, LoopguardTypeError
from loopguard.guard import Observation
from loopguard.signals import (
    relative_drop,
    reward_drift,
)

__all__ = [
    "MANIFEST_SCHEMA_VERSION",
    "MAX_PAIRS_PER_ROUND",
    "MAX_PROMPT_CHARS",
    "MAX_ROUNDS",
    "PAIRING_MODES",
    "GateResult",
    "IterativeDPO",
    "IterativeDPOConfig",
    "IterativeDPOPlan",
    "IterativeDPOResult",
    "Pair",
    "PairingMode",
    "RewardFn",
    "RoundPlan",
    "SafetyGates",
    "build_pairs",
    "evaluate_gates",
]

PairingMode = Literal["max_min", "max_random", "max_max", "length_penalized"]
PAIRING_MODES: tuple[str, ...] = ("max_min", "max_random", "max_max", "length_penalized")
"""Allowed ``pairing`` names (see :func:`build_pairs`)."""

MAX_ROUNDS = 100
"""Most rounds one run may plan."""

MAX_PAIRS_PER_ROUND = 1_000_000
"""Largest accepted ``pairs_per_round``."""

MAX_PROMPT_CHARS = 1_000_000
"""Longest accepted prompt, in characters."""

MANIFEST_SCHEMA_VERSION = 1
"""Version written in ``manifest.json``; a manifest from a newer version is refused."""

RewardFn = Callable[[list[str], list[str]], Any]
"""``fn(prompts, completions) -> scores``: one finite score per completion (list, array or tensor)."""

_MANIFEST = "manifest.json"
_DPO_ARGS_WE_SET = ("output_dir", "beta")
_MAX_DPO_ARGS = 256


# --------------------------------------------------------------------------------------------------
# atomic writes


def _write_json(path: str, value: Mapping[str, Any]) -> None:
    write_atomic(path, (json.dumps(value, indent=2, allow_nan=False) + "\n").encode())


# --------------------------------------------------------------------------------------------------
# pairing


@attrs.frozen
class Pair:
    """One DPO preference pair built from a prompt's ``K`` scored completions.

    Attributes:
        prompt: The prompt text.
        chosen: The preferred completion.
        rejected: The dispreferred completion.
        chosen_reward: Reward of ``chosen``.
        rejected_reward: Reward of ``rejected``.
        margin: Pairing score of ``chosen`` minus that of ``rejected`` (the reward, or for
            ``length_penalized`` the length-penalised reward), always ``> min_margin``.
    """

    prompt: str
    chosen: str
    rejected: str
    chosen_reward: float
    rejected_reward: float
    margin: float

    def to_json(self) -> dict[str, Any]:
        """Return the pair as a JSON-ready ``dict`` (one line of ``pairs.jsonl``)."""
        return attrs.asdict(self)


def build_pairs(
    prompts: Sequence[str],
    completions: Sequence[Sequence[str]],
    rewards: object,
    lengths: object,
    *,
    mode: str = "max_min",
    length_penalty: float = 0.01,
    min_margin: float = 0.0,
    seed: int = 0,
) -> tuple[list[Pair], int]:
    r"""Build at most one DPO pair per prompt from its ``K`` scored completions.

    With pairing score :math:`s_k = r_k` (or :math:`s_k = r_k - \lambda L_k` for ``length_penalized``):

    * ``max_min``: chosen = argmax :math:`s`, rejected = argmin :math:`s` (the usual choice);
    * ``max_random``: chosen = argmax, rejected = a uniformly random completion scoring below it;
    * ``max_max``: chosen = argmax, rejected = the best completion scoring below it (the hardest pair);
    * ``length_penalized``: ``max_min`` on :math:`r_k - \lambda L_k` (penalises buying reward with length).

    Ties (every completion of a prompt within ``min_margin`` of the best) give no pair and are counted as
    dropped. The first index wins a tie for argmax/argmin, so the result is deterministic given ``seed``.

    Args:
        prompts: ``P`` prompts.
        completions: ``P`` lists of ``K >= 2`` completion texts.
        rewards: Rewards shaped ``[P, K]``, finite.
        lengths: Completion lengths in tokens shaped ``[P, K]``, integers ``>= 0``.
        mode: One of :data:`PAIRING_MODES`.
        length_penalty: :math:`\lambda \ge 0`, reward units per token (``length_penalized`` only).
        min_margin: Pairs whose score margin is ``<= min_margin`` are dropped (``>= 0``).
        seed: Seed of the ``max_random`` draw.

    Returns:
        ``(pairs, dropped)``: the pairs in prompt order and the number of prompts that gave none.

    Example:
        >>> pairs, dropped = build_pairs(
        ...     ["q1 ", "q2 "], [["a", "b b", "c"], ["d", "e", "f"]], [[0.1, 0.9, 0.5], [1.0, 1.0, 1.0]],
        ...     [[1, 2, 1], [1, 1, 1]])
        >>> [(p.chosen, p.rejected, round(p.margin, 2)) for p in pairs], dropped
        ([('b b', 'a', 0.8)], 1)
        >>> build_pairs(["q"], [["a", "b"]], [[0.0, 1.0]], [[1, 1]], mode="best_worst")
        Traceback (most recent call last):
        ...
        loopguard.exceptions.ConfigError: `mode` must be one of 'length_penalized', 'max_max', 'max_min', 'max_random', got 'best_worst'.
    """  # noqa: E501
    chosen_mode = check_choice("mode", mode, PAIRING_MODES)
    penalty = check_real("length_penalty", length_penalty, lo=0.0)
    floor = check_real("min_margin", min_margin, lo=0.0)
    reward_array = as_float_array("rewards", rewards, ndim=2)
    length_array = as_int_array("lengths", lengths, ndim=2, lo=0)
    if reward_array.shape != length_array.shape:
        msg = (
            f"`rewards` and `lengths` must have the same shape, "
            f"got {reward_array.shape} and {length_array.shape}."
        )
        raise InputError(msg)
    count, k = reward_array.shape
    if len(prompts) != count or len(completions) != count:
        msg = (
            f"`prompts`, `completions` and `rewards` must describe the same {count} prompts, "
            f"got {len(prompts)} prompts and {len(completions)} completion lists."
        )
        raise InputError(msg)
    if k < 2:
        msg = f"`rewards` must hold at least 2 completions per prompt to pair, got {k}."
        raise InputError(msg)
    scores = reward_array - penalty * length_array if chosen_mode == "length_penalized" else reward_array
    rng = np.random.default_rng(check_int("seed", seed, lo=0))
    pairs: list[Pair] = []
    dropped = 0
    for row in range(count):
        texts = completions[row]
        if len(texts) != k:
            msg = f"`completions[{row}]` must hold {k} completions, got {len(texts)}."
            raise InputError(msg)
        s = scores[row]
        best = int(np.argmax(s))
        below = np.flatnonzero(s < s[best] - floor)
        if below.size == 0:
            dropped += 1
            continue
        if chosen_mode == "max_random":
            worst = int(rng.choice(below))
        elif chosen_mode == "max_max":
            worst = int(below[np.argmax(s[below])])
        else:
            worst = int(np.argmin(s))
        pairs.append(
            Pair(
                prompt=prompts[row],
                chosen=texts[best],
                rejected=texts[worst],
                chosen_reward=float(reward_array[row, best]),
                rejected_reward=float(reward_array[row, worst]),
                margin=float(s[best] - s[worst]),
            )
        )
    return pairs, dropped


# --------------------------------------------------------------------------------------------------
# gates


def _optional_real(lo: float, hi: float | None = None, *, lo_inclusive: bool = True) -> Any:
    return real(lo=lo, hi=hi, lo_inclusive=lo_inclusive, optional=True)


@attrs.frozen
class SafetyGates:
    """Thresholds of the checks a round's trained candidate must pass to be promoted.

    Every gate compares the candidate's audit samples (``K`` completions per prompt, sampled after training)
    with the samples the round started from, measured by the detectors the Guard uses
    (:mod:`loopguard.detectors`: ``Length``'s correlation, ``Repetition``'s rate, ``GoldAudit``'s gold mean,
    ``RMEnsemble``'s disagreement) and scored against the previous round (a fall, a ratio) or on an
    absolute level; the reward-drift gate is a two-sample KS distance between the two rounds. ``None`` turns
    a gate off. Gold and ensemble gates run only when ``gold`` / ``ensemble`` scorers are given to
    :class:`IterativeDPO`.

    Attributes:
        max_length_correlation: Trip when the Spearman correlation between the candidate's rewards and its
            completion lengths exceeds this (the reward model pays for length). In ``[-1, 1]``; default 0.5.
        max_repetition: Trip when the candidate's mean ``repetition_n``-gram repetition rate exceeds this
            (echo/degeneration). In ``[0, 1]``; default 0.5.
        max_reward_drift: Trip when the two-sample Kolmogorov-Smirnov statistic between the candidate's
            rewards and the round's starting rewards exceeds this (the reward distribution jumped in one
            round). In ``[0, 1]``; default 0.9.
        max_gold_drop: Trip when the mean gold score falls by more than this fraction of its starting
            value (absolute fall when the starting mean is 0). ``> 0``; default 0.1.
        max_disagreement_ratio: Trip when the ensemble's mean variance on the candidate's samples exceeds
            this multiple of its value on the starting samples. ``>= 1``; default 2.0.
        repetition_n: N-gram length of the repetition gate, in ``[1, 32]``; default 2.

    Example:
        >>> SafetyGates(max_repetition=1.5)
        Traceback (most recent call last):
        ...
        loopguard.exceptions.ConfigError: `max_repetition` must be in [0, 1], got 1.5.
    """

    max_length_correlation: float | None = attrs.field(default=0.5, validator=_optional_real(-1.0, 1.0))
    max_repetition: float | None = attrs.field(default=0.5, validator=_optional_real(0.0, 1.0))
    max_reward_drift: float | None = attrs.field(default=0.9, validator=_optional_real(0.0, 1.0))
    max_gold_drop: float | None = attrs.field(default=0.1, validator=_optional_real(0.0, lo_inclusive=False))
    max_disagreement_ratio: float | None = attrs.field(default=2.0, validator=_optional_real(1.0))
    repetition_n: int = attrs.field(default=2, validator=integer(lo=1, hi=32))

    def to_json(self) -> dict[str, Any]:
        """Return the thresholds as a JSON-ready ``dict``."""
        return attrs.asdict(self)


@attrs.frozen
class GateResult:
    """The outcome of one safety gate for one round.

    Attributes:
        name: ``"length_correlation"``, ``"repetition"``, ``"reward_drift"``, ``"gold_drop"`` or
            ``"ensemble_disagreement"``.
        value: The measured value.
        threshold: The gate's threshold.
        tripped: Whether ``value > threshold``.
        message: A sentence with the numbers, e.g. "repetition 0.81 > max 0.50: ...".
    """

    name: str
    value: float
    threshold: float
    tripped: bool
    message: str

    def to_json(self) -> dict[str, Any]:
        """Return the result as a JSON-ready ``dict`` (infinite values become strings)."""
        value: float | str = self.value if math.isfinite(self.value) else str(self.value)
        return {
            "name": self.name,
            "value": value,
            "threshold": self.threshold,
            "tripped": self.tripped,
            "message": self.message,
        }


def _gate(name: str, value: float, threshold: float, what: str, meaning: str) -> GateResult:
    tripped = value > threshold
    relation = ">" if tripped else "<="
    message = f"{what} {value:.3f} {relation} max {threshold:.3f}"
    if tripped:
        message += f": {meaning}"
    return GateResult(name=name, value=value, threshold=threshold, tripped=tripped, message=message)


def evaluate_gates(
    *,
    rewards: ArrayLike,
    lengths: ArrayLike,
    texts: Sequence[str],
    reference_rewards: ArrayLike,
    gates: SafetyGates | None = None,
    gold: ArrayLike | None = None,
    reference_gold: ArrayLike | None = None,
    ensemble_scores: ArrayLike | None = None,
    reference_ensemble_scores: ArrayLike | None = None,
) -> tuple[GateResult, ...]:
    r"""Run the safety gates on a candidate's audit samples against the round's starting samples.

    Args:
        rewards: Rewards of the candidate's samples, ``[B]``, ``B >= 2``.
        lengths: Their lengths in tokens, ``[B]``.
        texts: Their texts (for the repetition gate).
        reference_rewards: Rewards of the samples the round started from (``[B_ref]``).
        gates: Thresholds; default :class:`SafetyGates` ().
        gold: Gold scores of the candidate's samples ``[B]``, or ``None`` (gold gate off).
        reference_gold: Gold scores of the starting samples; required with ``gold``.
        ensemble_scores: Ensemble scores of the candidate's samples ``[M, B]``, or ``None``.
        reference_ensemble_scores: Ensemble scores of the starting samples ``[M, B_ref]``.

    Returns:
        One :class:`GateResult` per active gate, in the order length correlation, repetition, reward drift,
        gold drop, ensemble disagreement.

    Example:
        >>> results = evaluate_gates(
        ...     rewards=[1.0, 2.0, 3.0, 4.0], lengths=[3, 5, 7, 9],
        ...     texts=["a b c", "a b a b a", "x y z w v u t", "a b a b a b a b a"],
        ...     reference_rewards=[0.0, 1.0, 2.0, 3.0])
        >>> [(r.name, r.tripped) for r in results]
        [('length_correlation', True), ('repetition', False), ('reward_drift', False)]
        >>> results[0].message
        'reward-length correlation 1.000 > max 0.500: the reward model pays for length'
    """
    thresholds = SafetyGates() if gates is None else gates
    if not isinstance(thresholds, SafetyGates):
        msg = (
            f"`gates` must be a SafetyGates, got {describe(thresholds)} of type {type(thresholds).__name__}."
        )
        raise LoopguardTypeError(msg)
    if gold is not None and reference_gold is None and thresholds.max_gold_drop is not None:
        msg = "`reference_gold` must be given with `gold`, got None."
        raise ConfigError(msg)
    ensemble_gate = thresholds.max_disagreement_ratio is not None
    if ensemble_scores is not None and reference_ensemble_scores is None and ensemble_gate:
        msg = "`reference_ensemble_scores` must be given with `ensemble_scores`, got None."
        raise ConfigError(msg)
    candidate = _round_sample(
        rewards, lengths=lengths, texts=texts, gold=gold, ensemble=ensemble_scores, name=""
    )
    start = _round_sample(
        reference_rewards, gold=reference_gold, ensemble=reference_ensemble_scores, name="reference_"
    )
    results: list[GateResult] = []
    for spec in _GATES:
        threshold = getattr(thresholds, spec.threshold)
        if threshold is None:
            continue
        measured = spec.measure(candidate, start, thresholds)
        if measured is not None:
            value, what = measured
            results.append(_gate(spec.name, value, threshold, what, spec.meaning))
    return tuple(results)


def _round_sample(
    rewards: ArrayLike,
    *,
    lengths: ArrayLike | None = None,
    texts: Sequence[str] | None = None,
    gold: ArrayLike | None = None,
    ensemble: ArrayLike | None = None,
    name: str,
) -> StepData:
    """One round's samples as the detectors see a training step (``name`` prefixes the argument names)."""
    try:
        observation = Observation(
            0, rewards, completions=texts, lengths=lengths, gold=gold, ensemble_scores=ensemble
        )
    except LoopguardError as error:
        text = str(error).replace("`", f"`{name}", 1) if name else str(error)
        raise type(error)(text) from None
    return StepData(observation, warmup_steps=1)


def _statistic(detector: Detector, sample: StepData, key: str) -> float | None:
    """The detector's statistic ``key`` on one round's samples (None when an input is missing)."""
    raw = detector.measure(sample, {})
    return None if raw is None else raw.get(key)


@attrs.frozen
class _GateSpec:
    """One safety gate: a detector's statistic on the candidate, scored against the round's start.

    ``rule`` says how: ``"value"`` (the candidate's statistic itself), ``"drop"`` (its relative fall from the
    start; the absolute fall when the start is 0) or ``"ratio"`` (candidate / start; 1 when both are 0, inf
    when only the start is 0).
    """

    name: str
    threshold: str
    detector: Callable[[SafetyGates], Detector]
    key: str
    rule: Literal["value", "drop", "ratio"]
    what: str
    meaning: str
    optional: bool = False  # a gate whose scorer was not given (gold, ensemble) is skipped, others raise

    def measure(self, candidate: StepData, start: StepData, gates: SafetyGates) -> tuple[float, str] | None:
        """The gate's value and the words that name it (None when the candidate lacks the input)."""
        detector = self.detector(gates)
        now = _statistic(detector, candidate, self.key)
        if now is None and self.optional:
            return None
        if now is None:
            msg = f"the {self.name} gate needs {detector.needs} for at least 2 samples, got none it can use."
            raise InputError(msg)
        if self.rule == "value":
            return now, self.what.format(n=gates.repetition_n)
        before = _statistic(detector, start, self.key)
        if before is None:
            return None
        if self.rule == "drop":
            value = relative_drop(now, before) if before != 0.0 else max(0.0, before - now)
            return value, self.what.format(before=f"{before:.3f}", now=f"{now:.3f}")
        value = now / before if before > 0.0 else (1.0 if now == 0.0 else math.inf)
        return value, self.what.format(before=f"{before:.3g}", now=f"{now:.3g}")


@attrs.frozen
class _DriftGate:
    """The reward-drift gate: a two-sample distance between rounds, which no per-step detector measures."""

    name: str = "reward_drift"
    threshold: str = "max_reward_drift"
    meaning: str = "the reward distribution jumped in one round"

    def measure(self, candidate: StepData, start: StepData, gates: SafetyGates) -> tuple[float, str]:
        """The two-sample KS distance between the candidate's and the start's rewards."""
        drift = reward_drift(candidate.observation.rewards, start.observation.rewards, "ks")
        return drift, "reward drift (KS) from the round's starting policy"


_GATES: tuple[_GateSpec | _DriftGate, ...] = (
    _GateSpec(
        "length_correlation",
        "max_length_correlation",
        lambda gates: Length(),
        "correlation",
        "value",
        "reward-length correlation",
        "the reward model pays for length",
    ),
    _GateSpec(
        "repetition",
        "max_repetition",
        lambda gates: Repetition(n=gates.repetition_n),
        "rate",
        "value",
        "{n}-gram repetition",
        "completions repeat themselves (echo or degeneration)",
    ),
    _DriftGate(),
    _GateSpec(
        "gold_drop",
        "max_gold_drop",
        lambda gates: GoldAudit(),
        "gold",
        "drop",
        "gold score drop ({before} -> {now})",
        "the proxy reward rose while the gold audit fell (reward hacking)",
        optional=True,
    ),
    _GateSpec(
        "ensemble_disagreement",
        "max_disagreement_ratio",
        lambda gates: RMEnsemble(),
        "disagreement",
        "ratio",
        "ensemble disagreement ratio ({before} -> {now})",
        "the reward models disagree on the new policy's outputs (out-of-distribution exploitation)",
        optional=True,
    ),
)


# --------------------------------------------------------------------------------------------------
# configuration and plan


def _optional_int(lo: int, hi: int) -> Any:
    return integer(lo=lo, hi=hi, optional=True)


def _gates_validator(_instance: Any, _attribute: Any, value: Any) -> None:
    if not isinstance(value, SafetyGates):
        msg = f"`gates` must be a SafetyGates, got {describe(value)} of type {type(value).__name__}."
        raise LoopguardTypeError(msg)


def _output_dir(value: object) -> str:
    return check_path("output_dir", value)


@attrs.frozen
class IterativeDPOConfig:
    """The scalar settings of an iterative DPO run (validated eagerly; no model needed).

    Attributes:
        output_dir: Folder of the run (``round-NN/``, ``manifest.json``).
        rounds: Number of rounds, in ``[1, 100]``.
        samples_per_prompt: ``K`` completions sampled per prompt each round, in ``[2, 256]``; default 4.
        pairs_per_round: Cap on DPO pairs per round, in ``[1, 1,000,000]`` (the largest margins are kept), or
            ``None`` (default) for one pair per prompt that has no tie.
        prompts_per_round: Prompts used per round, taken in order and wrapping around (fresh prompts each
            round), in ``[1, 100,000]``, or ``None`` (default) for every prompt every round.
        pairing: One of :data:`PAIRING_MODES`; default ``"max_min"``.
        length_penalty: lambda of ``length_penalized`` pairing (reward per token, ``>= 0``).
        min_margin: Pairs with a score margin ``<= min_margin`` are dropped as ties (``>= 0``); default 0.
        beta: DPO beta (``> 0``); default 0.1. Written into each round's ``DPOConfig``.
        max_new_tokens: Longest sampled completion, in ``[1, 1,000,000]``; default 64.
        temperature: Sampling temperature (``> 0``); default 1.0. Sampling is pure temperature / nucleus
            sampling (``top_k`` is off).
        top_p: Nucleus sampling mass in ``(0, 1]``; default 1.0.
        generation_batch_size: Prompts per ``generate`` call, ``>= 1``; default 16.
        reward_batch_size: Completions per reward-model forward pass, ``>= 1``; default 32.
        max_failed_rounds: Stop after this many rounds failed their gates, in ``[1, 100]``; default 2.
        seed: Base seed (round ``r`` samples with ``seed + r``), ``>= 0``; default 0.
        gates: :class:`SafetyGates` thresholds.

    Example:
        >>> IterativeDPOConfig(output_dir="runs/x", rounds=0)
        Traceback (most recent call last):
        ...
        loopguard.exceptions.ConfigError: `rounds` must be in [1, 100], got 0.
        >>> IterativeDPOConfig(output_dir="runs/x", rounds=2, samples_per_prompt=1)
        Traceback (most recent call last):
        ...
        loopguard.exceptions.ConfigError: `samples_per_prompt` must be in [2, 256], got 1.
    """

    output_dir: str = attrs.field(converter=_output_dir, validator=path_string())
    rounds: int = attrs.field(validator=integer(lo=1, hi=MAX_ROUNDS))
    samples_per_prompt: int = attrs.field(default=4, validator=integer(lo=2, hi=256))
    pairs_per_round: int | None = attrs.field(default=None, validator=_optional_int(1, MAX_PAIRS_PER_ROUND))
    prompts_per_round: int | None = attrs.field(default=None, validator=_optional_int(1, MAX_TRAJECTORIES))
    pairing: str = attrs.field(default="max_min", validator=one_of(*PAIRING_MODES))
    length_penalty: float = attrs.field(default=0.01, validator=real(lo=0.0))
    min_margin: float = attrs.field(default=0.0, validator=real(lo=0.0))
    beta: float = attrs.field(default=0.1, validator=real(lo=0.0, lo_inclusive=False))
    max_new_tokens: int = attrs.field(default=64, validator=integer(lo=1, hi=1_000_000))
    temperature: float = attrs.field(default=1.0, validator=real(lo=0.0, lo_inclusive=False))
    top_p: float = attrs.field(default=1.0, validator=real(lo=0.0, hi=1.0, lo_inclusive=False))
    generation_batch_size: int = attrs.field(default=16, validator=integer(lo=1, hi=MAX_TRAJECTORIES))
    reward_batch_size: int = attrs.field(default=32, validator=integer(lo=1, hi=MAX_TRAJECTORIES))
    max_failed_rounds: int = attrs.field(default=2, validator=integer(lo=1, hi=MAX_ROUNDS))
    seed: int = attrs.field(default=0, validator=integer(lo=0, hi=2**31 - 1))
    gates: SafetyGates = attrs.field(factory=SafetyGates, validator=_gates_validator)

    def settings(self) -> dict[str, Any]:
        """Return the settings that define a round (recorded in the manifest, checked on resume)."""
        values = attrs.asdict(self, recurse=True)
        for key in (
            "output_dir",
            "rounds",
            "max_failed_rounds",
            "generation_batch_size",
            "reward_batch_size",
        ):
            values.pop(key)
        return values

    def plan(
        self,
        initial_policy: str | os.PathLike[str] | None = None,
        num_prompts: int | None = None,
    ) -> IterativeDPOPlan:
        """Return the frozen plan of the run: per-round folders and files, without writing anything.

        Args:
            initial_policy: Folder of the starting policy, or ``None`` when it is given in memory (it is then
                saved to ``<output_dir>/initial/model`` when the run starts).
            num_prompts: Number of prompts, to show which prompts each round uses; ``None`` if unknown.

        Returns:
            An :class:`IterativeDPOPlan`. The paths ``policy_from`` / ``reference`` of round ``r`` assume
            every earlier round is promoted; a blocked round leaves the next on the last good policy.
            Rounds already listed in an existing ``manifest.json`` (read, never written) are in
            ``finished_rounds``.
        """
        start = (
            os.path.join(self.output_dir, "initial", "model")
            if initial_policy is None
            else check_path("initial_policy", initial_policy)
        )
        total = (
            None if num_prompts is None else check_int("num_prompts", num_prompts, lo=1, hi=MAX_TRAJECTORIES)
        )
        per_round = total if self.prompts_per_round is None else self.prompts_per_round
        rounds: list[RoundPlan] = []
        previous = start
        for index in range(1, self.rounds + 1):
            folder = os.path.join(self.output_dir, f"round-{index:02d}")
            first = (
                0
                if self.prompts_per_round is None or total is None
                else (index - 1) * self.prompts_per_round % total
            )
            rounds.append(
                RoundPlan(
                    round=index,
                    directory=folder,
                    pairs_path=os.path.join(folder, "pairs.jsonl"),
                    model_path=os.path.join(folder, "model"),
                    metrics_path=os.path.join(folder, "metrics.json"),
                    policy_from=previous,
                    reference=previous,
                    first_prompt=first,
                    num_prompts=per_round,
                )
            )
            previous = os.path.join(folder, "model")
        manifest_path = os.path.join(self.output_dir, _MANIFEST)
        finished = tuple(record["round"] for record in _read_manifest(manifest_path, None)["rounds"])
        return IterativeDPOPlan(
            config=self,
            initial_policy=start,
            manifest_path=manifest_path,
            rounds=tuple(rounds),
            finished_rounds=finished,
        )


@attrs.frozen
class RoundPlan:
    """Where one round reads and writes (all paths under the run's ``output_dir``).

    Attributes:
        round: Round number, from 1.
        directory: ``<output_dir>/round-NN``.
        pairs_path: The round's DPO pairs (JSON lines).
        model_path: The round's trained candidate.
        metrics_path: The round's metrics and gate results.
        policy_from: The policy the round samples from and trains (if every earlier round is promoted).
        reference: The DPO reference: the same policy, i.e. the previous round's promoted one.
        first_prompt: Index of the round's first prompt (prompts wrap around).
        num_prompts: Prompts the round uses, or ``None`` when the prompt count is unknown.
    """

    round: int
    directory: str
    pairs_path: str
    model_path: str
    metrics_path: str
    policy_from: str
    reference: str
    first_prompt: int
    num_prompts: int | None


@attrs.frozen
class IterativeDPOPlan:
    """The frozen plan of an iterative DPO run (see :meth:`IterativeDPOConfig.plan`).

    Attributes:
        config: The run's settings.
        initial_policy: The starting policy's folder.
        manifest_path: ``<output_dir>/manifest.json``.
        rounds: One :class:`RoundPlan` per round.
        finished_rounds: Rounds an existing manifest lists as finished (they are skipped on rerun).
    """

    config: IterativeDPOConfig
    initial_policy: str
    manifest_path: str
    rounds: tuple[RoundPlan, ...]
    finished_rounds: tuple[int, ...]

    def to_text(self) -> str:
        """Return the plan as the human-readable text ``loopguard iterative-dpo --plan-only`` prints.

        Example:
            >>> plan = IterativeDPOConfig(output_dir="out", rounds=1).plan(initial_policy="sft")
            >>> print(plan.to_text())
            iterative DPO plan: 1 round(s) in out
              K=4 samples per prompt, pairing max_min, pairs per round: one per prompt, DPO beta 0.1
              gates: length_correlation <= 0.5, repetition <= 0.5, reward_drift <= 0.9; with gold/ensemble
                scorers: gold_drop <= 0.1, ensemble_ratio <= 2
              stop after 2 failed round(s); manifest out/manifest.json (finished rounds: none)
              round 01: policy sft, prompts all
                reference sft
                pairs out/round-01/pairs.jsonl, model out/round-01/model, metrics out/round-01/metrics.json
        """
        c = self.config
        g = c.gates
        pairs = "one per prompt" if c.pairs_per_round is None else f"at most {c.pairs_per_round:,}"

        def listed(items: list[tuple[str, float | None]]) -> str:
            return ", ".join(f"{name} <= {value:g}" for name, value in items if value is not None) or "none"

        always = [
            ("length_correlation", g.max_length_correlation),
            ("repetition", g.max_repetition),
            ("reward_drift", g.max_reward_drift),
        ]
        optional = [("gold_drop", g.max_gold_drop), ("ensemble_ratio", g.max_disagreement_ratio)]
        finished = ", ".join(str(r) for r in self.finished_rounds) or "none"
        lines = [
            f"iterative DPO plan: {c.rounds} round(s) in {c.output_dir}",
            f"  K={c.samples_per_prompt} samples per prompt, pairing {c.pairing}, pairs per round: {pairs}, "
            f"DPO beta {c.beta:g}",
            f"  gates: {listed(always)}; with gold/ensemble scorers: {listed(optional)}",
            f"  stop after {c.max_failed_rounds} failed round(s); manifest {self.manifest_path} "
            f"(finished rounds: {finished})",
        ]
        for step in self.rounds:
            prompts = "all" if step.num_prompts is None else f"{step.num_prompts} from #{step.first_prompt}"
            lines.append(f"  round {step.round:02d}: policy {step.policy_from}, prompts {prompts}")
            lines.append(f"    reference {step.reference}")
            lines.append(f"    pairs {step.pairs_path}, model {step.model_path}, metrics {step.metrics_path}")
        return "\n".join(lines)


@attrs.frozen
class IterativeDPOResult:
    """What a run did (also readable from ``manifest.json``).

    Attributes:
        rounds: One record per finished round (the manifest's entries): ``round``, ``promoted``,
            ``policy_from``, ``reference``, ``candidate``, ``metrics``, ``reasons``.
        policy: Folder of the last promoted policy (the initial one if no round was promoted).
        stopped: Whether the run stopped early because too many rounds failed their gates.
        explanation: Plain-English summary (why it stopped, or how many rounds were promoted).
        manifest_path: ``<output_dir>/manifest.json``.
    """

    rounds: tuple[dict[str, Any], ...]
    policy: str
    stopped: bool
    explanation: str
    manifest_path: str


# --------------------------------------------------------------------------------------------------
# manifest


def _read_manifest(path: str, settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """Read ``manifest.json`` (an empty one if absent) and, when ``settings`` is given, check they match."""
    if not os.path.exists(path):
        return {"schema": MANIFEST_SCHEMA_VERSION, "settings": None, "rounds": [], "stopped": False}
    if os.path.islink(path) or not os.path.isfile(path):
        msg = f"`{path}` must be a regular file (not a symlink or folder), got something else."
        raise InputError(msg)
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (OSError, ValueError) as error:
        msg = f"`{path}` must be a readable JSON manifest, got an unreadable file ({error})."
        raise InputError(msg) from error
    if not isinstance(manifest, dict) or not isinstance(manifest.get("rounds"), list):
        msg = f"`{path}` must hold a JSON object with a `rounds` list, got {describe(manifest)}."
        raise InputError(msg)
    schema = manifest.get("schema")
    if not isinstance(schema, int) or schema > MANIFEST_SCHEMA_VERSION:
        msg = f"`{path}` must have schema <= {MANIFEST_SCHEMA_VERSION}, got {describe(schema)}."
        raise InputError(msg)
    for position, record in enumerate(manifest["rounds"], start=1):
        if not isinstance(record, dict) or record.get("round") != position:
            msg = f"`{path}` must list rounds 1, 2, ... in order, got {describe(record)} at {position}."
            raise InputError(msg)
    if settings is not None and manifest.get("settings") not in (None, dict(settings)):
        changed = sorted(
            key
            for key in set(settings) | set(manifest["settings"])
            if settings.get(key) != manifest["settings"].get(key)
        )
        msg = (
            f"`output_dir` must hold a run made with the same settings to resume, got a manifest whose "
            f"{', '.join(changed)} differ; use a new output_dir or the recorded settings."
        )
        raise ConfigError(msg)
    return manifest


# --------------------------------------------------------------------------------------------------
# the recipe


def _import_stack() -> tuple[Any, Any, Any, Any]:
    hint = "IterativeDPO needs the `hf` extra: pip install 'loopguard[hf]' ({error})."
    datasets, torch, transformers, trl = import_extra(hint, "datasets", "torch", "transformers", "trl")
    return torch, transformers, trl, datasets


def _plain(value: Any) -> Any:
    """A ``DPOConfig`` value as JSON: enums by value, containers item by item, anything else as text."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    return str(value)


def _round_dpo_config(
    trl: Any, dpo_args: Mapping[str, Any], config: IterativeDPOConfig, round_number: int, directory: str
) -> Any:
    """The ``DPOConfig`` of one round: the recipe's defaults, then ``dpo_args``, then what the recipe sets."""
    values: dict[str, Any] = {
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "seed": config.seed + round_number,
    }
    names = {field.name for field in dataclasses.fields(trl.DPOConfig)}
    checkpointing = ("activation_checkpointing", "gradient_checkpointing")
    if not any(key in dpo_args for key in checkpointing):  # TRL turns it on by default
        values[next(key for key in checkpointing if key in names)] = False
    values.update(dpo_args)
    values["output_dir"] = os.path.join(directory, "trainer")
    values["beta"] = config.beta
    return trl.DPOConfig(**values)


def _check_dpo_config(
    trl: Any, dpo_args: Mapping[str, Any], config: IterativeDPOConfig, *, name: str, given: str
) -> None:
    """Build round 1's ``DPOConfig`` (writing nothing), so that what TRL refuses fails before a model loads.

    ``name`` and ``given`` say in the message where the fields came from (``dpo_args``, or the command line).

    Raises:
        ConfigError: ``trl.DPOConfig`` refused the values (``ValueError`` or ``TypeError`` from its checks).
    """
    directory = os.path.join(config.output_dir, "round-01")
    try:
        _round_dpo_config(trl, dpo_args, config, 1, directory)
    except (ValueError, TypeError) as error:
        msg = f"{name} must make a trl.DPOConfig that TRL accepts, got {given}, which it refuses: {error}"
        raise ConfigError(msg) from error


def _fingerprint(model: Any) -> str:
    """A cheap weights fingerprint: SHA-256 over each tensor's name, shape, sum and sum of squares."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        values = tensor.detach().double()
        digest.update(name.encode())
        digest.update(str(tuple(values.shape)).encode())
        digest.update(struct.pack("<dd", float(values.sum()), float((values * values).sum())))
    return digest.hexdigest()


def _summary(values: NDArray[np.float64]) -> dict[str, float]:
    return {
        "mean": float(values.mean()),
        "std": float(values.std()),
        "min": float(values.min()),
        "max": float(values.max()),
    }


def _check_prompts(prompts: object) -> list[str]:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
        msg = f"`prompts` must be a sequence of strings, got {type(prompts).__name__} {describe(prompts)}."
        raise LoopguardTypeError(msg)
    if not 1 <= len(prompts) <= MAX_TRAJECTORIES:
        msg = f"`prompts` must hold 1 to {MAX_TRAJECTORIES:,} prompts, got {len(prompts):,}."
        raise InputError(msg)
    return [check_text(f"prompts[{i}]", text, max_length=MAX_PROMPT_CHARS) for i, text in enumerate(prompts)]


def _check_policy(transformers: Any, policy: object) -> tuple[Any, str | None]:
    """``(model, None)`` for a model in memory, ``(None, folder)`` for the folder of a saved one."""
    if isinstance(policy, transformers.PreTrainedModel):
        return policy, None
    if isinstance(policy, (str, os.PathLike)):
        initial = check_path("policy", policy)
        if not os.path.isdir(initial):
            msg = f"`policy` must be a model or the folder of a saved one, got {describe(initial)}."
            raise ConfigError(msg)
        return None, initial
    msg = f"`policy` must be a transformers PreTrainedModel or a folder, got {type(policy).__name__}."
    raise LoopguardTypeError(msg)


def _check_reward(torch: Any, transformers: Any, reward: object, reward_tokenizer: Any) -> None:
    if isinstance(reward, torch.nn.Module):
        if not isinstance(reward_tokenizer, transformers.PreTrainedTokenizerBase):
            msg = (
                "`reward_tokenizer` must be the reward model's transformers tokenizer when `reward` is "
                f"an nn.Module, got {type(reward_tokenizer).__name__}."
            )
            raise LoopguardTypeError(msg)
        if reward_tokenizer.pad_token is None:
            msg = "`reward_tokenizer` must define a pad_token to score in batches, got None."
            raise ConfigError(msg)
    elif not callable(reward):
        msg = f"`reward` must be a callable or an nn.Module reward model, got {type(reward).__name__}."
        raise LoopguardTypeError(msg)


def _check_ensemble(ensemble: Sequence[RewardFn] | None) -> list[RewardFn]:
    members = list(ensemble) if ensemble is not None else []
    if ensemble is not None and not 2 <= len(members) <= MAX_ENSEMBLE_MEMBERS:
        msg = f"`ensemble` must hold 2 to {MAX_ENSEMBLE_MEMBERS} scorers, got {len(members)}."
        raise ConfigError(msg)
    for i, member in enumerate(members):
        if not callable(member):
            msg = f"`ensemble[{i}]` must be a callable scorer, got {type(member).__name__}."
            raise LoopguardTypeError(msg)
    return members


class IterativeDPO:
    """Iterative DPO: sample, score, pair, train, gate, promote; ``rounds`` times, resumable.

    Args:
        policy: The starting policy: a ``transformers`` causal LM in memory (saved once to
            ``<output_dir>/initial/model``) or the folder of one saved with ``save_pretrained``.
        tokenizer: The policy's tokenizer (``processing_class`` of ``DPOTrainer``); completions are appended
            to prompts as text, so prompts should end where a completion can start (for word-level
            tokenizers, with a space).
        prompts: The prompt texts (1 to 100,000).
        reward: ``reward(prompts, completions) -> scores`` or an ``nn.Module`` reward model whose output
            ``logits`` has one column (e.g. ``AutoModelForSequenceClassification`` with ``num_labels=1``).
        rounds: Number of rounds, in ``[1, 100]``.
        samples_per_prompt: ``K >= 2`` completions per prompt per round; default 4.
        pairs_per_round: Cap on pairs per round in ``[1, 1,000,000]``, or ``None`` (one per prompt).
        pairing: One of :data:`PAIRING_MODES`; default ``"max_min"``.
        output_dir: Folder of the run.
        dpo_args: Extra ``DPOConfig`` fields (e.g. ``learning_rate``, ``max_steps``, ``use_cpu``);
            ``output_dir`` and ``beta`` are set by the recipe. Defaults used unless given:
            ``report_to=[]``, ``save_strategy="no"``, ``logging_steps=1``, ``disable_tqdm=True``,
            activation (gradient) checkpointing off, ``seed=seed + round``.
        reward_tokenizer: Tokenizer of an ``nn.Module`` reward (required then; ignored for a callable).
        gold: Optional gold scorer ``fn(prompts, completions) -> scores`` for the gold-audit gate.
        ensemble: Optional 2 to 32 scorers ``fn(prompts, completions) -> scores`` for the disagreement gate.
        peft_config: Optional ``peft.PeftConfig`` (e.g. ``LoraConfig``): each round trains a fresh adapter on
            the round's starting policy (TRL's reference is then that policy with the adapter disabled), saves
            it to ``round-NN/adapter`` and the merged model to ``round-NN/model``, which the next round starts
            from. Needs the ``peft`` package.
        **settings: The other :class:`IterativeDPOConfig` fields (``beta``, ``gates``, ``max_new_tokens``,
            ``temperature``, ``max_failed_rounds``, ``seed``, ...).

    Example:
        See ``examples/iterative_dpo.py`` and ``docs/iterative_dpo.md``; :meth:`IterativeDPOConfig.plan`
        shows the layout without a model.
    """

    def __init__(
        self,
        policy: Any,
        tokenizer: Any,
        prompts: Sequence[str],
        reward: Any,
        *,
        rounds: int,
        samples_per_prompt: int = 4,
        pairs_per_round: int | None = None,
        pairing: str = "max_min",
        output_dir: str | os.PathLike[str],
        dpo_args: Mapping[str, Any] | None = None,
        reward_tokenizer: Any = None,
        gold: RewardFn | None = None,
        ensemble: Sequence[RewardFn] | None = None,
        peft_config: Any = None,
        **settings: Any,
    ) -> None:
        """Validate every argument (see the class docstring); nothing is loaded or written."""
        unknown = sorted(set(settings) - {f.name for f in attrs.fields(IterativeDPOConfig)})
        if unknown:
            msg = f"IterativeDPO got unknown setting(s) {', '.join(unknown)}; see IterativeDPOConfig."
            raise LoopguardTypeError(msg)
        self._config = IterativeDPOConfig(
            output_dir=output_dir,
            rounds=rounds,
            samples_per_prompt=samples_per_prompt,
            pairs_per_round=pairs_per_round,
            pairing=pairing,
            **settings,
        )
        self._prompts = _check_prompts(prompts)
        torch, transformers, trl, _ = _import_stack()
        self._policy_model, self._initial = _check_policy(transformers, policy)
        if not isinstance(tokenizer, transformers.PreTrainedTokenizerBase):
            msg = f"`tokenizer` must be a transformers tokenizer, got {type(tokenizer).__name__}."
            raise LoopguardTypeError(msg)
        if tokenizer.eos_token is None:
            msg = "`tokenizer` must define an eos_token (DPO appends it to every completion), got None."
            raise ConfigError(msg)
        self._tokenizer = tokenizer
        _check_reward(torch, transformers, reward, reward_tokenizer)
        self._reward = reward
        self._reward_tokenizer = reward_tokenizer
        if gold is not None and not callable(gold):
            msg = f"`gold` must be a callable fn(prompts, completions) -> scores, got {type(gold).__name__}."
            raise LoopguardTypeError(msg)
        self._gold = gold
        self._ensemble = _check_ensemble(ensemble)
        self._dpo_args = self._check_dpo_args(trl, dpo_args)
        self._peft_config = self._check_peft(peft_config)

    @staticmethod
    def _check_peft(peft_config: Any) -> Any:
        if peft_config is None:
            return None
        (peft,) = import_extra("`peft_config` needs the `peft` package: pip install peft ({error}).", "peft")
        if not isinstance(peft_config, peft.PeftConfig):
            msg = (
                "`peft_config` must be a peft.PeftConfig (LoraConfig, ...), "
                f"got {type(peft_config).__name__}."
            )
            raise LoopguardTypeError(msg)
        return peft_config

    def _settings(self) -> dict[str, Any]:
        settings = self._config.settings()
        settings["peft"] = None
        if self._peft_config is not None:

            def plain(value: Any) -> Any:
                return sorted(value, key=str) if isinstance(value, (set, frozenset)) else str(value)

            values = json.loads(json.dumps(self._peft_config.to_dict(), default=plain))
            values.pop("base_model_name_or_path", None)  # set by PEFT to each round's folder
            settings["peft"] = values
        return settings

    @staticmethod
    def _check_dpo_args(trl: Any, dpo_args: Mapping[str, Any] | None) -> dict[str, Any]:
        if dpo_args is None:
            return {}
        if not isinstance(dpo_args, Mapping):
            msg = f"`dpo_args` must be a mapping of DPOConfig fields, got {type(dpo_args).__name__}."
            raise LoopguardTypeError(msg)
        if len(dpo_args) > _MAX_DPO_ARGS:
            msg = f"`dpo_args` must hold at most {_MAX_DPO_ARGS} fields, got {len(dpo_args)}."
            raise ConfigError(msg)
        fields = {field.name for field in dataclasses.fields(trl.DPOConfig)}
        for key in dpo_args:
            if key in _DPO_ARGS_WE_SET:
                msg = (
                    f"`dpo_args` must not set {key!r} (the recipe sets it: pass beta= / output_dir= to "
                    f"IterativeDPO), got {key!r}."
                )
                raise ConfigError(msg)
            if key not in fields:
                msg = f"`dpo_args` must name DPOConfig fields, got {describe(key)}."
                raise ConfigError(msg)
        return dict(dpo_args)

    @property
    def config(self) -> IterativeDPOConfig:
        """The validated settings."""
        return self._config

    def plan(self) -> IterativeDPOPlan:
        """Return the frozen plan (per-round paths); writes nothing. See :meth:`IterativeDPOConfig.plan`."""
        return self._config.plan(initial_policy=self._initial, num_prompts=len(self._prompts))

    # ----------------------------------------------------------------------------------------------
    # run

    def run(self) -> IterativeDPOResult:
        """Run the rounds the manifest does not list yet, and return what the whole run did.

        Returns:
            An :class:`IterativeDPOResult`; ``stopped`` is ``True`` when ``max_failed_rounds`` rounds failed
            their gates (the ``explanation`` says which and why).
        """
        config = self._config
        plan = self.plan()
        os.makedirs(config.output_dir, exist_ok=True)
        manifest = _read_manifest(plan.manifest_path, self._settings())
        manifest["settings"] = self._settings()
        initial = self._ensure_initial(plan.initial_policy, overwrite=not manifest["rounds"])
        source = {"initial_policy": self._relative(initial)}
        if self._policy_model is not None:
            source["initial_fingerprint"] = _fingerprint(self._policy_model)
        for key, value in source.items():
            if manifest["rounds"] and manifest.get(key) not in (None, value):
                msg = (
                    f"`policy` must be the policy this run started from to resume, got a different {key} "
                    f"(manifest: {describe(manifest.get(key))}, now: {describe(value)}); "
                    "use a new output_dir."
                )
                raise ConfigError(msg)
        manifest.update(source)
        records: list[dict[str, Any]] = manifest["rounds"]
        current = initial
        for record in records:
            if record["promoted"]:
                current = self._path(record["candidate"])
        failed = [record for record in records if not record["promoted"]]
        if not manifest.get("stopped"):
            for step in plan.rounds[len(records) :]:
                record = self._run_round(step, current)
                records.append(record)
                if record["promoted"]:
                    current = self._path(record["candidate"])
                else:
                    failed.append(record)
                stopped = len(failed) >= config.max_failed_rounds
                manifest["stopped"] = stopped
                manifest["policy"] = self._relative(current)
                manifest["explanation"] = self._explain(records, failed, current, stopped)
                _write_json(plan.manifest_path, manifest)
                if stopped:
                    break
        explanation = manifest.get("explanation") or self._explain(records, failed, current, False)
        return IterativeDPOResult(
            rounds=tuple(records),
            policy=current,
            stopped=bool(manifest.get("stopped")),
            explanation=explanation,
            manifest_path=plan.manifest_path,
        )

    def _explain(
        self, records: list[dict[str, Any]], failed: list[dict[str, Any]], current: str, stopped: bool
    ) -> str:
        promoted = sum(1 for record in records if record["promoted"])
        if not stopped:
            text = f"{len(records)} round(s) finished, {promoted} promoted; the current policy is {current}."
            if failed:
                text += " Blocked. " + " ".join(
                    f"Round {r['round']}: {' '.join(r['reasons'])}" for r in failed
                )
            return text
        why = " ".join(f"Round {r['round']}: {' '.join(r['reasons'])}" for r in failed)
        return (
            f"Stopped after round {records[-1]['round']}: {len(failed)} round(s) failed their safety gates "
            f"(max_failed_rounds={self._config.max_failed_rounds}). {why} The last policy that passed is "
            f"{current}; it stays the result. Fix the reward (or add a gold/ensemble check), lower the "
            "learning rate or raise beta, or loosen a gate if its trips are false alarms, then rerun with "
            "a new output_dir."
        )

    def _path(self, stored: str) -> str:
        return os.path.join(self._config.output_dir, stored)

    def _relative(self, path: str) -> str:
        root = self._config.output_dir
        if os.path.commonpath([os.path.abspath(path), os.path.abspath(root)]) == os.path.abspath(root):
            return os.path.relpath(path, root)
        return path

    def _ensure_initial(self, target: str, *, overwrite: bool) -> str:
        """Save an in-memory starting policy once (again if no round finished: it may be a new policy)."""
        if self._policy_model is None:
            return target
        if overwrite or not os.path.isdir(target):
            self._save_model(self._policy_model, target)
        return target

    def _save_model(self, model: Any, target: str) -> None:
        """Save model + tokenizer to ``target`` atomically (a temp folder renamed into place)."""
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with atomic_target(target) as temp:
            model.save_pretrained(temp)
            self._tokenizer.save_pretrained(temp)
            if os.path.isdir(target):  # a stale folder from a round that died before the manifest listed it
                shutil.rmtree(target)

    def _round_prompts(self, step: RoundPlan) -> list[str]:
        count = len(self._prompts) if step.num_prompts is None else step.num_prompts
        return [self._prompts[(step.first_prompt + i) % len(self._prompts)] for i in range(count)]

    @contextlib.contextmanager
    def _left_padding(self) -> Iterator[None]:
        side = self._tokenizer.padding_side
        self._tokenizer.padding_side = "left"
        try:
            yield
        finally:
            self._tokenizer.padding_side = side

    def _generate(self, model: Any, prompts: list[str], seed: int) -> tuple[list[list[str]], list[list[int]]]:
        """Sample ``K`` completions per prompt in batches of ``generation_batch_size`` prompts."""
        torch, _, _, _ = _import_stack()
        config = self._config
        tokenizer = self._tokenizer
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        k = config.samples_per_prompt
        device = next(model.parameters()).device
        torch.manual_seed(seed)
        texts: list[list[str]] = []
        lengths: list[list[int]] = []
        model.eval()
        with self._left_padding(), torch.no_grad():
            for start in range(0, len(prompts), config.generation_batch_size):
                batch = prompts[start : start + config.generation_batch_size]
                encoded = tokenizer(batch, return_tensors="pt", padding=True).to(device)
                output = model.generate(
                    **encoded,
                    do_sample=True,
                    temperature=config.temperature,
                    top_p=config.top_p,
                    top_k=0,
                    max_new_tokens=config.max_new_tokens,
                    num_return_sequences=k,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id,
                )
                generated = output[:, encoded["input_ids"].shape[1] :].tolist()
                for row in range(len(batch)):
                    row_texts: list[str] = []
                    row_lengths: list[int] = []
                    for ids in generated[row * k : (row + 1) * k]:
                        end = ids.index(tokenizer.eos_token_id) if tokenizer.eos_token_id in ids else len(ids)
                        kept = [t for t in ids[:end] if t != tokenizer.pad_token_id]
                        row_texts.append(tokenizer.decode(kept, skip_special_tokens=True))
                        row_lengths.append(len(kept))
                    texts.append(row_texts)
                    lengths.append(row_lengths)
        return texts, lengths

    def _score_with(
        self, scorer: Any, name: str, prompts: list[str], completions: list[str]
    ) -> NDArray[np.float64]:
        torch, _, _, _ = _import_stack()
        if isinstance(scorer, torch.nn.Module):
            values: list[float] = []
            device = next(scorer.parameters()).device
            scorer.eval()
            batch_size = self._config.reward_batch_size
            with torch.no_grad():
                for start in range(0, len(prompts), batch_size):
                    texts = [
                        p + c
                        for p, c in zip(
                            prompts[start : start + batch_size],
                            completions[start : start + batch_size],
                            strict=True,
                        )
                    ]
                    encoded = self._reward_tokenizer(
                        texts, return_tensors="pt", padding=True, truncation=True
                    ).to(device)
                    logits = scorer(**encoded).logits
                    if logits.ndim != 2 or logits.shape[-1] != 1:
                        msg = (
                            f"`{name}` model must output logits shaped [batch, 1], got {tuple(logits.shape)}."
                        )
                        raise InputError(msg)
                    values.extend(logits[:, 0].float().cpu().tolist())
            scores = as_float_array(name, values)
        else:
            scores = as_float_array(name, scorer(list(prompts), list(completions)))
        if len(scores) != len(completions):
            msg = f"`{name}` must return one score per completion ({len(completions)}), got {len(scores)}."
            raise InputError(msg)
        return scores

    def _score_all(self, prompts: list[str], texts: list[list[str]]) -> dict[str, Any]:
        k = self._config.samples_per_prompt
        flat_prompts = [p for p in prompts for _ in range(k)]
        flat = [t for row in texts for t in row]
        scores: dict[str, Any] = {"reward": self._score_with(self._reward, "reward", flat_prompts, flat)}
        if self._gold is not None:
            scores["gold"] = self._score_with(self._gold, "gold", flat_prompts, flat)
        if self._ensemble:
            scores["ensemble"] = np.stack(
                [
                    self._score_with(m, f"ensemble[{i}]", flat_prompts, flat)
                    for i, m in enumerate(self._ensemble)
                ]
            )
        return scores

    def _dpo_config(self, trl: Any, step: RoundPlan) -> Any:
        return _round_dpo_config(trl, self._dpo_args, self._config, step.round, step.directory)

    def _run_round(self, step: RoundPlan, start: str) -> dict[str, Any]:
        """Sample, score and pair with the policy at ``start``; train, audit and gate the candidate."""
        torch, transformers, _, _ = _import_stack()
        config = self._config
        os.makedirs(step.directory, exist_ok=True)
        prompts = self._round_prompts(step)
        seed = config.seed + step.round
        policy = transformers.AutoModelForCausalLM.from_pretrained(start)
        use_cpu = bool(self._dpo_args.get("use_cpu", False)) or not torch.cuda.is_available()
        policy.to("cpu" if use_cpu else "cuda")
        texts, lengths = self._generate(policy, prompts, seed)
        before = self._score_all(prompts, texts)
        pairs, metrics = self._pair(step, start, prompts, texts, lengths, before["reward"])
        if not pairs:
            reasons = [
                f"round {step.round} produced no pairs: every prompt's {config.samples_per_prompt} "
                f"completions tied within min_margin={config.min_margin:g}; nothing to train on."
            ]
            metrics["candidate"] = None  # nothing was trained
            return self._finish(step, metrics, promoted=False, reasons=reasons, gates=())
        candidate = self._train(step, start, policy, pairs, metrics)
        gates = self._audit(candidate, prompts, seed, before, metrics)
        del policy, candidate
        gc.collect()
        tripped = [gate for gate in gates if gate.tripped]
        reasons = [f"{gate.message}." for gate in tripped]
        return self._finish(step, metrics, promoted=not tripped, reasons=reasons, gates=gates)

    def _pair(
        self,
        step: RoundPlan,
        start: str,
        prompts: list[str],
        texts: list[list[str]],
        lengths: list[list[int]],
        scores: NDArray[np.float64],
    ) -> tuple[list[Pair], dict[str, Any]]:
        """Build the round's pairs (at most ``pairs_per_round``), write them; return them and the metrics."""
        config = self._config
        pairs, dropped = build_pairs(
            prompts,
            texts,
            scores.reshape(len(prompts), config.samples_per_prompt),
            lengths,
            mode=config.pairing,
            length_penalty=config.length_penalty,
            min_margin=config.min_margin,
            seed=config.seed + step.round,
        )
        capped = 0
        if config.pairs_per_round is not None and len(pairs) > config.pairs_per_round:
            order = sorted(range(len(pairs)), key=lambda i: -pairs[i].margin)[: config.pairs_per_round]
            capped = len(pairs) - config.pairs_per_round
            pairs = [pairs[i] for i in sorted(order)]
        lines = "".join(json.dumps(pair.to_json(), allow_nan=False) + "\n" for pair in pairs)
        write_atomic(step.pairs_path, lines.encode())
        flat_lengths = np.asarray([n for row in lengths for n in row], dtype=np.int64)
        metrics: dict[str, Any] = {
            "round": step.round,
            "policy_from": self._relative(start),
            "reference": self._relative(start),
            "candidate": self._relative(step.model_path),
            "prompts": len(prompts),
            "samples": {
                "count": int(flat_lengths.size),
                "reward": _summary(scores),
                "length_mean": float(flat_lengths.mean()),
            },
            "pairs": {
                "count": len(pairs),
                "dropped_ties": dropped,
                "dropped_over_cap": capped,
                "mean_margin": float(np.mean([p.margin for p in pairs])) if pairs else None,
                "pairing": config.pairing,
            },
            "beta": config.beta,
        }
        return pairs, metrics

    def _train(
        self, step: RoundPlan, start: str, policy: Any, pairs: list[Pair], metrics: dict[str, Any]
    ) -> Any:
        """Train ``policy`` with DPO on ``pairs``, save the candidate (and adapter); return the candidate."""
        _, transformers, trl, datasets = _import_stack()
        dataset = datasets.Dataset.from_dict(
            {
                "prompt": [p.prompt for p in pairs],
                "chosen": [p.chosen for p in pairs],
                "rejected": [p.rejected for p in pairs],
            }
        )
        reference: Any = None
        if self._peft_config is None:
            reference = transformers.AutoModelForCausalLM.from_pretrained(start)
            reference_fingerprint = ""
        else:  # the reference is the policy with the adapter disabled: these (frozen) base weights
            reference_fingerprint = _fingerprint(policy)
        trainer = trl.DPOTrainer(
            model=policy,
            ref_model=reference,
            args=self._dpo_config(trl, step),
            train_dataset=dataset,
            processing_class=self._tokenizer,
            peft_config=copy.deepcopy(self._peft_config),  # PEFT writes the base model's path into it
        )
        if trainer.args.disable_tqdm:  # keep a library run quiet: the losses go to metrics.json instead
            trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
        output = trainer.train()
        candidate = trainer.accelerator.unwrap_model(trainer.model)
        if self._peft_config is not None:
            self._save_model(candidate, os.path.join(step.directory, "adapter"))
            candidate = candidate.merge_and_unload()
            metrics["adapter"] = self._relative(os.path.join(step.directory, "adapter"))
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        metrics["train"] = {
            "steps": int(trainer.state.global_step),
            "loss_first": float(losses[0]) if losses else None,
            "loss_last": float(losses[-1]) if losses else None,
            "train_loss": float(output.training_loss),
        }
        given = sorted({*self._dpo_args, "beta", "seed"})  # what the round was told, as DPOConfig holds it
        metrics["dpo_config"] = {key: _plain(getattr(trainer.args, key)) for key in given}
        metrics["weights"] = {
            "reference_fingerprint": reference_fingerprint or _fingerprint(trainer.ref_model),
            "candidate_fingerprint": _fingerprint(candidate),
        }
        self._save_model(candidate, step.model_path)
        return candidate

    def _audit(
        self,
        candidate: Any,
        prompts: list[str],
        seed: int,
        before: dict[str, Any],
        metrics: dict[str, Any],
    ) -> tuple[GateResult, ...]:
        """Sample and score the candidate afresh, and evaluate the safety gates against ``before``."""
        audit_texts, audit_lengths = self._generate(candidate, prompts, seed + 1_000_003)
        after = self._score_all(prompts, audit_texts)
        flat_audit = [t for row in audit_texts for t in row]
        flat_audit_lengths = np.asarray([n for row in audit_lengths for n in row], dtype=np.int64)
        metrics["audit"] = {
            "count": len(flat_audit),
            "reward": _summary(after["reward"]),
            "length_mean": float(flat_audit_lengths.mean()),
        }
        if "gold" in after:
            metrics["audit"]["gold_mean"] = float(after["gold"].mean())
            metrics["samples"]["gold_mean"] = float(before["gold"].mean())
        return evaluate_gates(
            rewards=after["reward"],
            lengths=flat_audit_lengths,
            texts=flat_audit,
            reference_rewards=before["reward"],
            gates=self._config.gates,
            gold=after.get("gold"),
            reference_gold=before.get("gold"),
            ensemble_scores=after.get("ensemble"),
            reference_ensemble_scores=before.get("ensemble"),
        )

    def _finish(
        self,
        step: RoundPlan,
        metrics: dict[str, Any],
        *,
        promoted: bool,
        reasons: list[str],
        gates: Sequence[GateResult],
    ) -> dict[str, Any]:
        metrics["gates"] = [gate.to_json() for gate in gates]
        metrics["promoted"] = promoted
        metrics["reasons"] = reasons
        if promoted:
            metrics["explanation"] = f"round {step.round} passed every gate; its model is promoted."
        else:
            metrics["explanation"] = (
                f"round {step.round} was not promoted: {' '.join(reasons)} The next round starts again from "
                f"{metrics['policy_from']} (policy and reference)."
            )
        _write_json(step.metrics_path, metrics)
        return {
            "round": step.round,
            "promoted": promoted,
            "policy_from": metrics["policy_from"],
            "reference": metrics["reference"],
            "candidate": metrics["candidate"],
            "metrics": self._relative(step.metrics_path),
            "reasons": reasons,
        }
