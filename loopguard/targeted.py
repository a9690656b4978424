r"""The escalation ladder's targeted rung: a penalty on exactly what the flawed reward pays for.

Raising beta pulls the whole policy toward the reference; rolling back restores a good policy, and then the
same reward pays for the same exploit again. When the signal that trips the Guard names a *feature* of the
completions (a token or phrase that took over the batch, answers that grew, repetition), the ladder can
instead take the pay out of that feature: the trained reward becomes

.. math::

    \tilde r_i = r_i - \sum_k c_k\, x_{ik}, \qquad c_k = m \cdot \max\big(0,\ \hat\beta_k\big)

where :math:`x_{ik}` is feature :math:`k` of completion :math:`i` (occurrences of a token, whether the
completion holds it at all, tokens past the reference length, the n-gram repetition rate) and
:math:`\hat\beta_k` the *premium* the proxy pays per unit of it, measured on the raw rewards of the batches of
the episode: the least-squares coefficients of reward on all
candidate features together, within each group of completions of one prompt (the comparison GRPO's
advantages make), pooled over the groups (features that always occur together share one premium: the
minimum-norm solution splits it). With the margin :math:`m` (default 2) the feature costs more than it
earns, so the exploit stops paying whatever its size, while a feature the reward does not pay for (slope
<= 0) is not touched.
While the penalty is on, each batch re-measures the premium on the *raw* rewards and a rate only grows, so a
policy that half-drops the exploit cannot make the penalty weaker. Every penalty is bounded: a feature is
bounded by the completion length, and its rate by the measured premium.

This is reward shaping that the Guard sizes and switches on itself; :func:`loopguard.shape_reward` is the
hand-configured version. In both, the Guard keeps reading the raw reward: the adapters subtract the penalty
only from what the trainer trains on.

Example:
    >>> penalty = TargetedPenalty((Target(kind="tokens", token=7, rate=0.5, source="takeover"),))
    >>> penalty([[7, 7, 1], [1, 2], [7]]).tolist()
    [1.0, 0.0, 0.5]
    >>> print(penalty.describe())
    token 7 costs 0.5 per occurrence (from takeover)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import attrs
import numpy as np
from numpy.typing import ArrayLike, NDArray

from loopguard._saved_state import Fields, as_state_error, check_state_reals, open_state
from loopguard._validation import describe, integer, real
from loopguard.exceptions import ConfigError, LoopguardTypeError, StateError
from loopguard.signals import TokenBatch, as_token_batch
from loopguard.signals._repetition import repetition_rates, row_repetition_rates
from loopguard.signals._sequences import plain_id_rows

__all__ = [
    "MARGIN",
    "MAX_TARGETS",
    "P_VALUE",
    "PriceEvidence",
    "Target",
    "TargetKind",
    "TargetedPenalty",
    "f_survival",
    "premium",
    "price",
]

TargetKind = Literal["tokens", "presence", "length", "repetition"]
"""What a target measures: occurrences of one token, whether a completion holds it, tokens past a length, or
the n-gram repetition rate."""

MARGIN = 2.0
"""How many times the measured premium a feature costs once penalised."""

MAX_TARGETS = 16
"""At most this many features are penalised at once."""

P_VALUE = 0.05
"""Candidates are priced only when they explain the reward at this significance (noise is not a premium)."""

_KINDS = ("tokens", "presence", "length", "repetition")
_STATE_KIND = "loopguard.TargetedPenalty"
_EVIDENCE_KIND = "loopguard.PriceEvidence"
_STATE_VERSION = 1


@attrs.frozen
class Target:
    """One penalised feature.

    Attributes:
        kind: ``"tokens"`` (occurrences of ``token``), ``"presence"`` (1 when the completion holds
            ``token`` at all, else 0: a reward that pays once for a keyword), ``"length"`` (tokens past
            ``threshold``) or ``"repetition"`` (the ``n``-gram repetition rate of
            :func:`loopguard.signals.ngram_repetition_rate`).
        rate: Penalty per unit of the feature, >= 0.
        source: The signal that asked for it (``"takeover"``, ``"length"``, ``"repetition"``, ...).
        token: The token id, for ``"tokens"`` and ``"presence"``.
        threshold: The length past which each token costs ``rate``, for ``"length"``.
        n: The n-gram size, for ``"repetition"``.
    """

    kind: TargetKind = attrs.field(validator=attrs.validators.in_(_KINDS))
    rate: float = attrs.field(validator=real(lo=0.0))
    source: str = attrs.field(validator=attrs.validators.instance_of(str))
    token: int | None = attrs.field(default=None, validator=attrs.validators.optional(integer(lo=0)))
    threshold: float | None = attrs.field(default=None, validator=attrs.validators.optional(real(lo=0.0)))
    n: int | None = attrs.field(default=None, validator=attrs.validators.optional(integer(lo=1, hi=16)))

    def __attrs_post_init__(self) -> None:
        """Each kind has exactly its own parameter."""
        needed = {"tokens": "token", "presence": "token", "length": "threshold", "repetition": "n"}[self.kind]
        for name in ("token", "threshold", "n"):
            if (getattr(self, name) is None) == (name == needed):
                rule = "must be set" if name == needed else "must be None"
                msg = f"`Target.{name}` {rule} for kind {self.kind!r}, got {describe(getattr(self, name))}."
                raise ConfigError(msg)

    @property
    def key(self) -> tuple[str, float]:
        """What makes two targets the same feature (their rates aside)."""
        kind = self.kind
        value = self.threshold if kind == "length" else self.n if kind == "repetition" else self.token
        return self.kind, float(value if value is not None else 0)

    def feature(self, batch: TokenBatch) -> NDArray[np.float64]:
        """This feature of every completion of ``batch``."""
        if self.kind in ("tokens", "presence"):  # the batch's row ids are kept on it for every target
            hits = batch.row_ids()[batch.tokens == self.token]
            counts = np.bincount(hits, minlength=batch.n_rows).astype(np.float64)
            return counts if self.kind == "tokens" else np.minimum(counts, 1.0)
        if self.kind == "length":
            past: NDArray[np.float64] = np.maximum(batch.lengths - float(self.threshold or 0.0), 0.0)
            return past
        # ngram_repetition_rate's per-row rates, without re-checking n (the field's validator did)
        return repetition_rates(as_token_batch("batch", batch), int(self.n or 1))

    def row_feature(self, rows: Sequence[Sequence[int]]) -> NDArray[np.float64]:
        """:meth:`feature` of the batch of ``rows`` (plain id rows, ``plain_id_rows``), read off the rows.

        The same numbers: the counts are exact, and the arithmetic after them is :meth:`feature`'s.
        """
        if self.kind in ("tokens", "presence"):
            token = self.token
            counts = np.fromiter((row.count(token) for row in rows), dtype=np.float64, count=len(rows))
            return counts if self.kind == "tokens" else np.minimum(counts, 1.0)
        if self.kind == "length":
            lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
            past: NDArray[np.float64] = np.maximum(lengths - float(self.threshold or 0.0), 0.0)
            return past
        return row_repetition_rates(rows, int(self.n or 1))

    def describe(self, names: Mapping[int, str] | None = None) -> str:
        """One plain-English phrase; ``names`` gives a token's text (quoted after its id) where it has one.

        Example:
            >>> Target(kind="presence", token=303, rate=0.25, source="takeover").describe({303: '"zz"'})
            'a completion holding token 303 "zz" costs 0.25 (from takeover)'
        """
        token = f"token {self.token}"
        if names is not None and self.token is not None and self.token in names:
            token += f" {names[self.token]}"
        if self.kind == "tokens":
            what = f"{token} costs {self.rate:.3g} per occurrence"
        elif self.kind == "presence":
            what = f"a completion holding {token} costs {self.rate:.3g}"
        elif self.kind == "length":
            what = f"each token past {self.threshold:.3g} costs {self.rate:.3g}"
        else:
            what = f"the {self.n}-gram repetition rate costs {self.rate:.3g} per unit"
        return f"{what} (from {self.source})"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON: the fields in order (what ``attrs.asdict`` gives, without its walk)."""
        return {
            "kind": self.kind,
            "rate": self.rate,
            "source": self.source,
            "token": self.token,
            "threshold": self.threshold,
            "n": self.n,
        }


def _as_targets(value: Sequence[Target]) -> tuple[Target, ...]:
    return tuple(value)


@attrs.frozen
class TargetedPenalty:
    """The penalties the ladder switched on: call it on completions' token ids to get each one's penalty.

    Attributes:
        targets: The penalised features (at most :data:`MAX_TARGETS`).
    """

    targets: tuple[Target, ...] = attrs.field(converter=_as_targets)

    def __attrs_post_init__(self) -> None:
        """Check the targets."""
        if len(self.targets) > MAX_TARGETS:
            msg = f"`targets` must hold at most {MAX_TARGETS} targets, got {len(self.targets)}."
            raise ConfigError(msg)
        for index, target in enumerate(self.targets):
            if not isinstance(target, Target):
                msg = f"`targets[{index}]` must be a Target, got {describe(target)}."
                raise LoopguardTypeError(msg)

    def __call__(self, completion_ids: object) -> NDArray[np.float64]:
        """The penalty of each completion (>= 0): ``sum_k rate_k * feature_k``.

        Args:
            completion_ids: The completions' token ids (a list of id sequences, or a
                :class:`~loopguard.signals.TokenBatch`).

        Raises:
            LoopguardTypeError, InputError: ids that are not a batch of non-negative integer sequences.
        """
        rows = plain_id_rows(completion_ids)
        feature: Callable[[Target], NDArray[np.float64]]
        if rows is not None:  # TRL's lists of ids, in its reward step: read as they are, no batch built
            size, feature = len(rows), lambda target: target.row_feature(rows)
        else:
            batch = (
                completion_ids
                if isinstance(completion_ids, TokenBatch)
                else as_token_batch("completion_ids", completion_ids)
            )
            size, feature = batch.n_rows, lambda target: target.feature(batch)
        total = np.zeros(size, dtype=np.float64)
        for target in self.targets:
            if target.rate > 0:
                total += target.rate * feature(target)
        return total

    def merged(self, new: Sequence[Target], *, lower: bool = False) -> TargetedPenalty:
        """These targets plus ``new`` ones; a feature already here keeps the larger rate.

        With ``lower=True`` it takes the new rate instead (prices that track the latest measurement).
        """
        by_key = {target.key: target for target in self.targets}
        for target in new:
            old = by_key.get(target.key)
            if old is None:
                if len(by_key) < MAX_TARGETS:
                    by_key[target.key] = target
            elif target.rate > old.rate or lower:
                by_key[target.key] = attrs.evolve(old, rate=target.rate)
        return TargetedPenalty(tuple(by_key.values()))

    def describe(self, names: Mapping[int, str] | None = None) -> str:
        """The targets in plain English, ``; `` separated (``names``: as :meth:`Target.describe`)."""
        return "; ".join(target.describe(names) for target in self.targets)

    @property
    def tokens(self) -> tuple[int, ...]:
        """The token ids the targets charge, in order, each once."""
        return tuple(dict.fromkeys(t.token for t in self.targets if t.token is not None))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (for the Guard's state and the mitigation log)."""
        return {
            "kind": _STATE_KIND,
            "version": _STATE_VERSION,
            "targets": [target.to_dict() for target in self.targets],
        }

    @classmethod
    def from_dict(cls, payload: object, path: str = "state") -> TargetedPenalty:
        """Rebuild from :meth:`to_dict`, checking every field.

        Raises:
            StateError: a malformed payload (the message names the field).
        """
        fields = open_state(
            payload, kind=_STATE_KIND, version=_STATE_VERSION, keys=("kind", "version", "targets"),
            owner="TargetedPenalty", path=path,
        )  # fmt: skip
        items = fields.items("targets", max_length=MAX_TARGETS)
        return cls(
            tuple(_target_from(fields.name("targets"), index, item) for index, item in enumerate(items))
        )


def _target_from(where: str, index: int, item: object) -> Target:
    target = Fields(item, f"{where}[{index}]", keys=("kind", "rate", "source", "token", "threshold", "n"))
    kind = target.text("kind")
    if kind not in _KINDS:
        msg = f"`{target.name('kind')}` must be one of {', '.join(_KINDS)}, got {describe(kind)}."
        raise StateError(msg)
    with as_state_error():
        return Target(
            kind=kind,
            rate=target.real("rate", lo=0.0),
            source=target.text("source"),
            token=target.integer("token", lo=0, optional=True),
            threshold=target.real("threshold", lo=0.0, optional=True),
            n=target.integer("n", lo=1, hi=16, optional=True),
        )


def premium(
    rewards: Sequence[float] | NDArray[np.float64], feature: ArrayLike, group_size: int | None
) -> float | None:
    r"""The proxy's pay per unit of ``feature``: the least-squares slope within prompt groups, pooled.

    Rewards and feature are centred on their group means (``group_size`` consecutive completions share a
    prompt; None: the batch is one group) and the slope is :math:`\sum \tilde x \tilde r / \sum \tilde
    x^2`. None when the feature does not vary within any group (nothing to measure).

    Example:
        >>> premium([1.0, 0.0, 2.0, 1.0], np.array([1.0, 0.0, 1.0, 0.0]), 2)
        1.0
    """
    r = np.asarray(rewards, dtype=np.float64)
    x = np.asarray(feature, dtype=np.float64)
    size = group_size if group_size and len(r) % group_size == 0 else len(r)
    r = r.reshape(-1, size)
    x = x.reshape(-1, size)
    xc = x - x.mean(axis=1, keepdims=True)
    rc = r - r.mean(axis=1, keepdims=True)
    spread = float((xc * xc).sum())
    if spread <= 1e-12:
        return None
    return float((xc * rc).sum() / spread)


def price(
    targets: Sequence[Target], batch: TokenBatch, rewards: ArrayLike, group_size: int | None
) -> list[Target] | None:
    """``targets`` priced on one batch: rate = :data:`MARGIN` x the joint within-group premium.

    Nothing is priced (``[]``) unless the candidates together explain the within-group reward variance
    beyond noise (an F test at :data:`P_VALUE`; the signal that names them already found the hack, so this
    only checks that the reward pays for them); a target whose premium is <= 0 is left out. None when the
    batch cannot say (no candidate varies within a group, too few completions). :class:`PriceEvidence`
    prices on several batches pooled, with the same arithmetic.

    Example:
        >>> batch = as_token_batch("ids", [[5, 5], [1], [5], [2], [5, 5, 5], [3]])
        >>> target = Target(kind="tokens", token=5, rate=0.0, source="x")
        >>> [(t.token, round(t.rate, 2)) for t in price([target], batch, [1.0, 0.0, 0.5, 0.0, 1.6, 0.1], 2)]
        [(5, 1.0)]
    """
    if not targets:
        return None
    return PriceEvidence.of(targets).add(targets, batch, rewards, group_size).price()


def _unpriced(target: Target) -> Target:
    return target if target.rate == 0.0 else attrs.evolve(target, rate=0.0)


def _matrix(value: object) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(x) for x in row) for row in value)  # type: ignore[attr-defined]


def _vector(value: object) -> tuple[float, ...]:
    return tuple(float(x) for x in value)  # type: ignore[attr-defined]


@attrs.frozen
class PriceEvidence:
    r"""What the batches of one episode say about what the reward pays for: within-group sums, pooled.

    Each batch adds its within-group cross-products of the candidate features and the raw reward (every
    feature and reward centred on its prompt group's mean, as GRPO's advantages compare), so the premium
    and its F test are those of one least-squares fit on all the episode's completions together:

    .. math::

        \hat\beta = (X^\top X)^{+} X^\top r, \qquad
        F = \frac{\hat\beta^\top X^\top r / k}{(r^\top r - \hat\beta^\top X^\top r)/(n - g - k)}

    over the features that vary within some group (``k`` their rank, ``n`` completions in ``g`` groups; the
    pseudo-inverse gives the minimum-norm premium, so features that always occur together share it). One
    test on the pooled batches, not one per batch: an exploit that fills the whole batch by the time the
    ladder acts is priced on the batches where it was still spreading, and a reward that pays nothing is
    not priced by one batch's chance fit among many.

    A batch naming a candidate the evidence does not hold starts the evidence again on the union (the new
    feature was not measured on the earlier batches).

    Attributes:
        targets: The candidate features (their rates are not used), at most :data:`MAX_TARGETS`.
        xx: :math:`X^\top X`, one row per target.
        xr: :math:`X^\top r`.
        rr: :math:`r^\top r`.
        rows: Completions pooled.
        groups: Prompt groups pooled.
        batches: Batches pooled.
    """

    targets: tuple[Target, ...] = attrs.field(converter=_as_targets)
    xx: tuple[tuple[float, ...], ...] = attrs.field(converter=_matrix)
    xr: tuple[float, ...] = attrs.field(converter=_vector)
    rr: float = attrs.field(default=0.0, validator=real(lo=0.0))
    rows: int = attrs.field(default=0, validator=integer(lo=0))
    groups: int = attrs.field(default=0, validator=integer(lo=0))
    batches: int = attrs.field(default=0, validator=integer(lo=0))

    def __attrs_post_init__(self) -> None:
        """At most :data:`MAX_TARGETS` distinct targets, sums of their shape, no more groups than rows."""
        count = len(self.targets)
        if count > MAX_TARGETS or len({target.key for target in self.targets}) != count:
            msg = f"`targets` must hold at most {MAX_TARGETS} distinct features, got {count}."
            raise ConfigError(msg)
        if len(self.xr) != count or len(self.xx) != count or any(len(row) != count for row in self.xx):
            msg = f"`xx` and `xr` must have one row (and column) per target ({count})."
            raise ConfigError(msg)
        if not all(math.isfinite(v) for v in (*self.xr, *(x for row in self.xx for x in row))):
            msg = "`xx` and `xr` must be finite."
            raise ConfigError(msg)
        if self.groups > self.rows or (self.rows > 0) != (self.batches > 0):
            msg = (
                f"`groups` must be at most `rows`, and `batches` > 0 exactly when `rows` > 0, got groups="
                f"{self.groups}, rows={self.rows}, batches={self.batches}."
            )
            raise ConfigError(msg)

    @classmethod
    def of(cls, targets: Sequence[Target]) -> PriceEvidence:
        """No batch yet, for ``targets`` (distinct features; at most :data:`MAX_TARGETS` are kept)."""
        kept: dict[tuple[str, float], Target] = {}
        for target in targets:
            if target.key not in kept and len(kept) < MAX_TARGETS:
                kept[target.key] = _unpriced(target)
        count = len(kept)
        return cls(tuple(kept.values()), ((0.0,) * count,) * count, (0.0,) * count)

    def add(
        self, named: Sequence[Target], batch: TokenBatch, rewards: ArrayLike, group_size: int | None
    ) -> PriceEvidence:
        """Pool one more batch, whose signals name ``named`` (a new candidate starts the evidence again)."""
        known = {target.key for target in self.targets}
        evidence = self
        if len(known) < MAX_TARGETS and any(target.key not in known for target in named):
            evidence = PriceEvidence.of([*self.targets, *named])
        r = np.asarray(rewards, dtype=np.float64)
        if not evidence.targets or len(r) < 2:
            return evidence
        x = np.stack([target.feature(batch) for target in evidence.targets], axis=1)
        size = group_size if group_size and len(r) % group_size == 0 else len(r)
        xc = (
            x.reshape(-1, size, x.shape[1]) - x.reshape(-1, size, x.shape[1]).mean(axis=1, keepdims=True)
        ).reshape(x.shape)
        rc = (r.reshape(-1, size) - r.reshape(-1, size).mean(axis=1, keepdims=True)).reshape(-1)
        return attrs.evolve(
            evidence,
            xx=np.asarray(evidence.xx, dtype=np.float64).reshape(x.shape[1], x.shape[1]) + xc.T @ xc,
            xr=np.asarray(evidence.xr, dtype=np.float64) + xc.T @ rc,
            rr=evidence.rr + float(rc @ rc),
            rows=evidence.rows + len(r),
            groups=evidence.groups + len(r) // size,
            batches=evidence.batches + 1,
        )

    def price(self) -> list[Target] | None:
        """The targets the pooled batches price (rate = :data:`MARGIN` x premium), as :func:`price` does.

        ``[]``: the candidates do not explain the reward beyond noise (F test at :data:`P_VALUE`), or none
        is paid for. None: the evidence cannot say (no candidate varies within a group, too few
        completions).
        """
        if not self.targets:
            return None
        xx = np.asarray(self.xx, dtype=np.float64).reshape(len(self.targets), len(self.targets))
        xr = np.asarray(self.xr, dtype=np.float64)
        varies = np.diag(xx) > 1e-12
        if not varies.any():
            return None
        used = xx[np.ix_(varies, varies)]
        # the pseudo-inverse's own cut-off, on the normal equations: the minimum-norm least-squares fit
        fit = np.linalg.pinv(used, hermitian=True) @ xr[varies]
        rank = int(np.linalg.matrix_rank(used, hermitian=True))
        dof = self.rows - self.groups - rank
        if dof < 1 or rank == 0:
            return None
        explained = float(fit @ xr[varies])
        residual = max(self.rr - explained, 0.0)
        if explained <= 0:
            return []
        statistic = (explained / rank) / max(residual / dof, 1e-300)
        if f_survival(statistic, rank, dof) >= P_VALUE:
            return []
        coef = np.zeros(len(self.targets))
        coef[varies] = fit
        return [
            attrs.evolve(target, rate=MARGIN * float(paid))
            for target, paid in zip(self.targets, coef, strict=True)
            if paid > 0
        ]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (for the Guard's state)."""
        return {
            "kind": _EVIDENCE_KIND,
            "version": _STATE_VERSION,
            "targets": [target.to_dict() for target in self.targets],
            "xx": [list(row) for row in self.xx],
            "xr": list(self.xr),
            "rr": self.rr,
            "rows": self.rows,
            "groups": self.groups,
            "batches": self.batches,
        }

    @classmethod
    def from_dict(cls, payload: object, path: str = "state") -> PriceEvidence:
        """Rebuild from :meth:`to_dict`, checking every field.

        Raises:
            StateError: a malformed payload (the message names the field).
        """
        keys = ("kind", "version", "targets", "xx", "xr", "rr", "rows", "groups", "batches")
        fields = open_state(
            payload, kind=_EVIDENCE_KIND, version=_STATE_VERSION, keys=keys, owner="PriceEvidence", path=path
        )
        items = fields.items("targets", max_length=MAX_TARGETS)
        targets = tuple(_target_from(fields.name("targets"), index, item) for index, item in enumerate(items))
        count = len(targets)
        xx = [
            check_state_reals(f"{fields.name('xx')}[{i}]", row, max_length=count)
            for i, row in enumerate(fields.items("xx", max_length=count))
        ]
        xr = check_state_reals(fields.name("xr"), fields.raw("xr"), max_length=count)
        with as_state_error():
            return cls(
                targets,
                xx,
                xr,
                rr=fields.real("rr", lo=0.0),
                rows=fields.integer("rows", lo=0),
                groups=fields.integer("groups", lo=0),
                batches=fields.integer("batches", lo=0),
            )


def f_survival(x: float, d1: int, d2: int) -> float:
    r"""P(F > x) for Snedecor's F with ``d1`` and ``d2`` degrees of freedom (no scipy: this runs mid-step).

    :math:`P(F > x) = I_{d_2/(d_2 + d_1 x)}(d_2/2,\ d_1/2)`, the regularized incomplete beta function,
    evaluated by its continued fraction (modified Lentz; Press et al., *Numerical Recipes*, 6.4).

    Example:
        >>> round(f_survival(4.0, 2, 10), 6)  # scipy.stats.f.sf(4.0, 2, 10)
        0.052922
    """
    if x <= 0:
        return 1.0
    return _incomplete_beta(d2 / (d2 + d1 * x), d2 / 2.0, d1 / 2.0)


def _incomplete_beta(x: float, a: float, b: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(x, a, b) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(1.0 - x, b, a) / b


def _beta_fraction(x: float, a: float, b: float) -> float:
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h
