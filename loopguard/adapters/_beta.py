"""Where beta is written into the trainer: one accessor per trainer type, and the train-start checks.

The Guard decides beta (:mod:`loopguard.control`); this module only reads and writes it:

* GRPO / RLOO (TRL 1.16): ``trainer.beta`` (copied once from ``args.beta``; changing ``args.beta`` later does
  nothing). GRPO applies it in the next loss, RLOO in the next generation's KL-penalised reward.
* Online DPO (``trl.experimental``): ``trainer._beta`` (``beta`` is a read-only property that also accepts a
  per-epoch list; loopguard replaces such a schedule with the single value it controls).
* DPO: ``trainer.beta`` (its logged ``rewards/*`` are multiplied by beta).
* Anything else: ``coefficient=(getter, setter)`` -- two callables -- or a dotted attribute path relative to
  the trainer such as ``"args.kl_coef"`` (a legacy PPO loop).

No torch import: values are plain floats.

Example:
    >>> class Loop:
    ...     kl_coef = 0.05
    >>> loop = Loop()
    >>> accessor = resolve_accessor(loop, "kl_coef")
    >>> accessor.get(), accessor.where
    (0.05, 'trainer.kl_coef')
    >>> accessor.set(0.075); loop.kl_coef
    0.075
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable
from typing import Any

import attrs

from loopguard._validation import check_text, describe
from loopguard.exceptions import ConfigError, LoopguardTypeError

__all__ = [
    "BetaAccessor",
    "Coefficient",
    "check_coefficient",
    "check_kl_term",
    "has_reference_model",
    "resolve_accessor",
]

Coefficient = tuple[Callable[[], Any], Callable[[float], Any]] | str
"""A user's coefficient spec: ``(getter, setter)`` or a dotted attribute path on the trainer."""


def _as_beta(where: str, value: object) -> float:
    if type(value) is float:  # what trainers hold (read every step): no numbers ABC checks
        result = value
    else:
        if not isinstance(value, numbers.Real) and hasattr(value, "item"):
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            msg = f"`{where}` must be a real number (the KL coefficient), got {describe(value)}."
            raise LoopguardTypeError(msg)
        result = float(value)
    if not math.isfinite(result) or result < 0:
        msg = f"`{where}` must be a finite number >= 0 (the KL coefficient), got {describe(value)}."
        raise ConfigError(msg)
    return result


@attrs.frozen
class BetaAccessor:
    """Reads and writes one trainer's KL coefficient.

    Attributes:
        where: Where beta lives, for messages (``"trainer.beta"``, ``"trainer._beta"``, ``"coefficient"``).
        getter: Returns the current coefficient.
        setter: Writes a new coefficient.
    """

    where: str
    getter: Callable[[], Any]
    setter: Callable[[float], Any]

    def get(self) -> float:
        """The current coefficient as a float >= 0.

        Raises:
            LoopguardTypeError, ConfigError: the trainer holds something that is not a finite number >= 0.
        """
        return _as_beta(self.where, self.getter())

    def set(self, value: float) -> None:
        """Write ``value`` (a finite float > 0; beta is never set to 0)."""
        if not (isinstance(value, float) and math.isfinite(value) and value > 0):
            msg = f"`beta` must be a finite float > 0, got {describe(value)}."
            raise ConfigError(msg)
        self.setter(value)


def check_coefficient(coefficient: object) -> Coefficient | None:
    """Validate a ``coefficient=`` argument: None, ``(getter, setter)`` callables, or a dotted path.

    Example:
        >>> check_coefficient((lambda: 0.1, print)) is not None
        True
        >>> check_coefficient(("kl_coef", 0.1))
        Traceback (most recent call last):
        ...
        loopguard.exceptions.LoopguardTypeError: `coefficient` must be (getter, setter) callables or a dotted attribute path such as 'args.kl_coef', got ('kl_coef', 0.1).
    """  # noqa: E501
    if coefficient is None:
        return None
    if isinstance(coefficient, str):
        path = check_text("coefficient", coefficient, max_length=256, what="attribute path")
        if not all(part.isidentifier() for part in path.split(".")):
            msg = (
                f"`coefficient` must be a dotted attribute path such as 'args.kl_coef', got {describe(path)}."
            )
            raise ConfigError(msg)
        return path
    if (
        isinstance(coefficient, tuple)
        and len(coefficient) == 2
        and callable(coefficient[0])
        and callable(coefficient[1])
    ):
        return (coefficient[0], coefficient[1])
    msg = (
        "`coefficient` must be (getter, setter) callables or a dotted attribute path such as 'args.kl_coef', "
        f"got {describe(coefficient)}."
    )
    raise LoopguardTypeError(msg)


def _path_accessor(trainer: Any, path: str) -> BetaAccessor:
    *parents, leaf = path.split(".")
    owner = trainer
    for part in parents:
        if not hasattr(owner, part):
            msg = f"`coefficient` must name an attribute of the trainer, got {path!r} ({part!r} is missing)."
            raise ConfigError(msg)
        owner = getattr(owner, part)
    if not hasattr(owner, leaf):
        msg = f"`coefficient` must name an attribute of the trainer, got {path!r} ({leaf!r} is missing)."
        raise ConfigError(msg)
    final_owner = owner
    return BetaAccessor(
        where=f"trainer.{path}",
        getter=lambda: getattr(final_owner, leaf),
        setter=lambda value: setattr(final_owner, leaf, value),
    )


def resolve_accessor(trainer: Any, coefficient: Coefficient | None = None) -> BetaAccessor | None:
    """Find where ``trainer`` keeps its KL coefficient; None when there is no such place.

    ``coefficient`` wins when given. Otherwise a read-only ``beta`` property backed by ``_beta`` (TRL's
    online DPO) resolves to ``_beta``, and a numeric ``beta`` attribute (GRPO, RLOO, DPO) to ``beta``.

    Raises:
        ConfigError: a ``coefficient`` path that does not exist on the trainer.
    """
    if isinstance(coefficient, str):
        return _path_accessor(trainer, coefficient)
    if coefficient is not None:
        getter, setter = coefficient
        return BetaAccessor(where="coefficient", getter=getter, setter=setter)
    prop = inspect.getattr_static(type(trainer), "beta", None)
    if isinstance(prop, property) and prop.fset is None and hasattr(trainer, "_beta"):
        return BetaAccessor(
            where="trainer._beta",
            getter=lambda: trainer.beta,  # resolves a per-epoch schedule to this epoch's value
            setter=lambda value: setattr(trainer, "_beta", value),
        )
    value = getattr(trainer, "beta", None)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return BetaAccessor(
            where="trainer.beta",
            getter=lambda: trainer.beta,
            setter=lambda value: setattr(trainer, "beta", value),
        )
    return None


def has_reference_model(trainer: Any) -> bool | None:
    """Whether ``trainer`` can compute a KL term: True, False, or None when it cannot be told.

    A reference model exists when ``trainer.ref_model`` is set, when the policy is a PEFT model (the adapter
    is disabled to get the reference), or when DPO precomputed the reference log-probabilities.

    Example:
        >>> class T:
        ...     ref_model = None
        >>> has_reference_model(T()), has_reference_model(object())
        (False, None)
    """
    if not hasattr(trainer, "ref_model"):
        return None
    if trainer.ref_model is not None:
        return True
    model = getattr(trainer, "model", None)
    return hasattr(model, "peft_config") or bool(getattr(trainer, "precompute_ref_logps", False))


def check_kl_term(trainer: Any, accessor: BetaAccessor | None, mode: str) -> float:
    """Train-start check for a KL-changing mode: beta is readable and > 0. Returns the current beta.

    Raises:
        ConfigError: no accessor, or beta is 0 (the message says to start with a small beta such as 1e-3).
    """
    name = type(trainer).__name__
    if accessor is None:
        msg = (
            f"RewardHackMitigator(mode={mode!r}) must find the KL coefficient to control, but {name} has no "
            "`beta` attribute: pass coefficient=(getter, setter) or coefficient='args.kl_coef' (a dotted "
            "attribute path on the trainer), or use mode='log_only'."
        )
        raise ConfigError(msg)
    beta = accessor.get()
    if beta > 0:
        return beta
    reference = has_reference_model(trainer)
    why = (
        f"{name} has no reference model (TRL builds none when beta == 0), so a KL penalty cannot be switched "
        "on mid-run"
        if reference is False
        else "loopguard never raises beta from 0 (TRL drops the KL term and its reference log-probabilities "
        "when beta == 0)"
    )
    msg = (
        f"RewardHackMitigator(mode={mode!r}) needs a KL term to control, but {accessor.where} is 0.0 and "
        f"{why}. "
        "Start with a small beta such as 1e-3 (for GRPO: GRPOConfig(beta=1e-3)), or use mode='log_only'."
    )
    raise ConfigError(msg)
