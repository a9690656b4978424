"""What the adapters do for the ladder's newer rungs: the targeted penalty, the re-anchor, the own store.

* :func:`penalise_rewards` wraps the trainer's trained reward function once at the start of training so the
  Guard's targeted penalty (:attr:`Guard.penalty <loopguard.Guard.penalty>`, None until the ladder switches it
  on) is subtracted from what the policy is trained on. The wrapper logs the unshaped rewards through TRL's
  ``log_extra`` as ``"<name>/unshaped"`` (what :func:`loopguard.shape_reward` does too), and the observer
  reads those: the Guard keeps seeing the raw reward.
* :func:`reanchor` copies the policy's weights into the KL reference model after a rollback (the escalation
  ladder's ``reanchor``), so a raised beta holds the policy near the restored good policy.
* :func:`prepare_reference_adapter` and :func:`reanchor_adapter` do the same for a PEFT LoRA policy of TRL's
  GRPO / RLOO, whose reference is not a model but the base with adapters disabled, or the adapter named
  ``"ref"`` when the policy has one (TRL's own rule). At train start the policy gets a ``"ref"`` adapter
  equal to that reference (``lora_B`` zero: the base model, exactly); a rollback copies the restored adapter
  into it.
* :class:`ReferenceAdapter` is the same for a LoRA policy in a hand-written or Accelerate loop: the reference
  adapter is added by the user's loop, computed under :meth:`ReferenceAdapter.active`, and re-anchored when
  it is passed as ``reference=`` to :func:`~loopguard.adapters.loop.apply_decision` or ``LoopGuard.step``.
* :func:`default_manager` picks the rollback store that ``RewardHackMitigator()`` makes for itself: in
  memory when one process trains a model whose checkpoints fit :data:`IN_MEMORY_LIMIT`, else on disk beside
  the run.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from loopguard._reward_fn import reward_name, wrap_reward

if TYPE_CHECKING:
    from loopguard.guard import Guard

__all__ = [
    "IN_MEMORY_LIMIT",
    "KEEP_LAST",
    "ReferenceAdapter",
    "checkpoint_bytes",
    "default_manager",
    "penalise_rewards",
    "prepare_reference_adapter",
    "reanchor",
    "reanchor_adapter",
    "remove_reference_adapter",
]

logger = logging.getLogger("loopguard")

IN_MEMORY_LIMIT = 2 * 1024**3
"""Bytes of rollback checkpoints (``KEEP_LAST`` of them) that ``RewardHackMitigator()`` keeps in memory."""

KEEP_LAST = 3
"""Rollback checkpoints kept by the store the mitigator makes for itself."""

_ATTRIBUTE = "__loopguard_penalised__"

REFERENCE_ADAPTER = "ref"
"""The adapter that TRL's GRPOTrainer and RLOOTrainer (1.0 on) read a PEFT policy's KL reference from."""

_ADAPTER_REFERENCE_TRAINERS = ("GRPOTrainer", "RLOOTrainer")


def checkpoint_bytes(model: Any) -> int:
    """The size of one rollback checkpoint: the weights it saves, plus two Adam moments per trainable one.

    The weights are what :class:`~loopguard.checkpoint.CheckpointManager` saves: every parameter, or only the
    adapters (the trainable parameters) of a ``peft.PeftModel``. The optimizer's state may not exist yet at
    the start of training (Adam creates it on the first step), so it is estimated as two tensors per
    trainable parameter in that parameter's dtype (``torch.optim.AdamW`` makes them with ``zeros_like``).
    """
    from loopguard.checkpoint._state import peft_module

    adapters_only = peft_module(model) is not None
    total = 0
    for parameter in model.parameters():
        size = parameter.numel() * parameter.element_size()
        if parameter.requires_grad:
            total += 3 * size
        elif not adapters_only:
            total += size
    return int(total)


def default_manager(model: Any, *, world_size: int, directory: str) -> tuple[Any, str]:
    """The CheckpointManager of ``RewardHackMitigator()``'s own rollback store, and why it was chosen.

    In memory when a single process trains and ``KEEP_LAST`` checkpoints fit :data:`IN_MEMORY_LIMIT`; on disk
    in ``directory`` otherwise (several processes must all read the checkpoint a rollback restores).
    """
    from loopguard.checkpoint import CheckpointManager

    size = checkpoint_bytes(model)
    mib = size / 1024**2
    if world_size == 1 and KEEP_LAST * size <= IN_MEMORY_LIMIT:
        why = (
            f"in memory ({KEEP_LAST} checkpoints of {mib:.1f} MiB: parameters and Adam moments, within the "
            f"{IN_MEMORY_LIMIT / 1024**3:.0f} GiB limit)"
        )
        return CheckpointManager(in_memory=True, keep_last=KEEP_LAST), why
    where = "several processes" if world_size > 1 else f"{KEEP_LAST} x {mib:.0f} MiB"
    why = f"on disk in {directory} ({where})"
    return CheckpointManager(directory, keep_last=KEEP_LAST), why


def _trained_index(trainer: Any) -> int | None:
    """The first reward function the trainer trains on (weight != 0), or None."""
    functions = getattr(trainer, "reward_funcs", None)
    if not functions:
        return None
    weights = getattr(trainer, "reward_weights", None)
    values = [1.0] * len(functions) if weights is None else [float(w) for w in weights]
    return next((i for i, w in enumerate(values) if w != 0), None)


def penalise_rewards(trainer: Any, guard: Guard) -> str | None:
    """Wrap the trainer's first trained reward function so the Guard's targeted penalty is subtracted.

    The penalty is divided by the function's weight, so the trained (weighted) reward drops by exactly the
    penalty. Idempotent. Returns the wrapped function's name, or None when the trainer has no reward
    functions to wrap (the penalty cannot reach the trained reward; the caller says so).
    """
    index = _trained_index(trainer)
    if index is None:
        return None
    functions = trainer.reward_funcs
    fn = functions[index]
    name = reward_name(fn)
    if getattr(fn, _ATTRIBUTE, False):
        return name
    weights = getattr(trainer, "reward_weights", None)
    weight = 1.0 if weights is None else float(weights[index])
    if not callable(fn) or (hasattr(fn, "config") and hasattr(fn, "forward")):
        return None  # a reward model (nn.Module): TRL calls it on tokenized inputs, not through kwargs

    already_logs = hasattr(fn, "last_call")  # loopguard.shape_reward: its unshaped values are the raw reward

    def penalised(output: Any, kwargs: dict[str, Any]) -> Any:
        penalty = guard.penalty
        ids = kwargs.get("completion_ids")
        if output is None or ids is None:
            return output
        raw = [None if value is None else float(value) for value in output]
        log_extra = kwargs.get("log_extra")
        if callable(log_extra) and not already_logs:  # a shape_reward wrapper logs its own unshaped values
            log_extra(f"{name}/unshaped", raw)
        if penalty is None:
            return output
        amounts = (penalty(ids) / weight).tolist()  # TRL's lists of ids (or tensors), read by the penalty
        pairs = zip(raw, amounts, strict=True)
        return [None if value is None else value - amount for value, amount in pairs]

    def finish(_prepared: Any, _args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        started = time.perf_counter()
        try:
            return penalised(output, kwargs)
        finally:  # loopguard's own time inside the trainer's reward step (benchmarks count it)
            wrapped.loopguard_seconds += time.perf_counter() - started

    wrapped = wrap_reward(fn, finish, copy_attributes=False, module=__name__)
    wrapped.loopguard_seconds = 0.0
    setattr(wrapped, _ATTRIBUTE, True)
    functions[index] = wrapped
    return name


def reanchor(model: Any, ref_model: Any, unwrap: Any = None) -> bool:
    """Copy the policy's weights into the reference model (in place); False when there is no reference.

    ``ref_model`` may be a :class:`ReferenceAdapter`: its trained adapter is copied into its reference
    adapter.

    ``unwrap`` (e.g. ``accelerator.unwrap_model``) strips DDP / compile wrappers from both first.
    """
    if ref_model is None:
        return False
    if isinstance(ref_model, ReferenceAdapter):  # a LoRA policy's reference: an adapter of the policy itself
        return ref_model.reanchor()
    import torch

    policy = unwrap(model) if unwrap is not None else model
    reference = unwrap(ref_model) if unwrap is not None else ref_model
    from loopguard.checkpoint._sharded import is_deepspeed, is_sharded, zero3_partitioned
    from loopguard.exceptions import ConfigError

    if is_deepspeed(policy):
        policy = policy.module
    if zero3_partitioned(reference):
        msg = (
            "the KL reference is partitioned by DeepSpeed ZeRO-3: loopguard cannot write the restored policy "
            "into it; keep the reference unpartitioned, or turn re-anchoring off (EscalationLadder(reanchor="
            "False))."
        )
        raise ConfigError(msg)
    if zero3_partitioned(policy):  # gather the restored policy's partitions on every rank, then copy
        import deepspeed  # type: ignore[import-not-found, import-untyped, unused-ignore]  # ZeRO-3 only

        with deepspeed.zero.GatheredParameters(list(policy.parameters())), torch.no_grad():
            source = policy.state_dict()
            for key, tensor in reference.state_dict().items():
                tensor.copy_(source[key].to(device=tensor.device, dtype=tensor.dtype))
        return True
    with torch.no_grad():
        source = policy.state_dict()
        target = reference.state_dict()
        gather = is_sharded(policy) and not is_sharded(reference)  # a full reference beside an FSDP2 policy
        for key, tensor in target.items():
            value = source[key].full_tensor() if gather else source[key]  # all ranks gather, in key order
            tensor.copy_(value.to(device=tensor.device, dtype=tensor.dtype))
    return True


def _adapter_policy(trainer: Any) -> tuple[Any, str] | None:
    """The PEFT LoRA policy of a TRL GRPO / RLOO trainer and its active adapter; None for anything else."""
    if not any(
        cls.__name__ in _ADAPTER_REFERENCE_TRAINERS and cls.__module__.startswith("trl.")
        for cls in type(trainer).__mro__
    ):
        return None
    from loopguard.checkpoint._sharded import is_deepspeed, is_sharded
    from loopguard.checkpoint._state import peft_module

    accelerator = getattr(trainer, "accelerator", None)
    model = trainer.model
    policy = accelerator.unwrap_model(model) if accelerator is not None else model
    peft = peft_module(policy)
    if peft is None or is_deepspeed(model) or is_sharded(policy):
        return None
    active = policy.active_adapter
    if not isinstance(active, str) or active == REFERENCE_ADAPTER:
        return None
    if not isinstance(policy.peft_config.get(active), peft.LoraConfig):
        return None
    return policy, active


def _adapter_parameters(policy: Any, adapter: str) -> dict[str, Any]:
    marker = f".{adapter}."
    return {name: parameter for name, parameter in policy.named_parameters() if marker in name}


def _add_reference(policy: Any, active: str, name: str) -> None:
    """Add ``name`` to ``policy``: a frozen copy of ``active``'s LoRA configuration with every B zero."""
    import copy

    import torch

    config = copy.deepcopy(policy.peft_config[active])
    config.init_lora_weights = True  # standard init (B = 0): PiSSA, OLoRA or LoftQ would rewrite the base
    policy.add_adapter(name, config)
    policy.set_adapter(active)  # add_adapter leaves it active; kept explicit across PEFT releases
    with torch.no_grad():
        for key, parameter in _adapter_parameters(policy, name).items():
            parameter.requires_grad_(False)
            if "lora_B" in key or "lora_embedding_B" in key:
                parameter.zero_()


def _same_tensors(policy: Any, first: str, second: str) -> bool:
    """Whether adapters ``first`` and ``second`` of ``policy`` hold tensors of the same names and shapes."""

    def shapes(adapter: str) -> dict[str, tuple[int, ...]]:
        parameters = _adapter_parameters(policy, adapter).items()
        return {key.replace(f".{adapter}.", "."): tuple(tensor.shape) for key, tensor in parameters}

    return shapes(first) == shapes(second)


def _copy_adapter(policy: Any, active: str, name: str) -> None:
    """Copy adapter ``active``'s tensors into adapter ``name`` of ``policy``, in place."""
    import torch

    source = _adapter_parameters(policy, active)
    target = _adapter_parameters(policy, name)
    renamed = {key.replace(f".{active}.", f".{name}."): tensor for key, tensor in source.items()}
    if not _same_tensors(policy, active, name):
        msg = (
            f"the policy's adapters {active!r} and {name!r} do not hold the same tensors "
            f"({len(source)} and {len(target)}): the reference adapter cannot take the restored policy"
        )
        raise RuntimeError(msg)
    with torch.no_grad():
        for key, tensor in renamed.items():
            target[key].copy_(tensor)


def prepare_reference_adapter(trainer: Any) -> Literal["added", "present"] | None:
    """Give a LoRA policy of TRL's GRPO / RLOO the ``"ref"`` adapter its KL reference will be read from.

    TRL computes a PEFT policy's reference log-probabilities with the adapter named ``"ref"`` when the policy
    has one (TRL made it as a copy of a pretrained adapter), else with every adapter disabled (the base
    model). Without ``"ref"``, this adds one to the policy now, at train start, before any checkpoint is
    saved: a frozen copy of the active adapter's configuration (initialised the standard way, so that no
    initialisation that rewrites the base weights runs) with every ``lora_B`` tensor zero, so the reference
    is still the base model, exactly. A rollback then re-anchors by copying the restored adapter into it
    (:func:`reanchor_adapter`). It costs one more adapter's memory and its forward in the reference pass.

    Returns:
        ``"added"`` when this made the ``"ref"`` adapter (:func:`remove_reference_adapter` takes it away at
        the end of training), ``"present"`` when TRL had made it; None for a trainer other than GRPO / RLOO,
        a policy that is not a PEFT LoRA model, or one under DeepSpeed / FSDP.
    """
    found = _adapter_policy(trainer)
    if found is None:
        return None
    policy, active = found
    if REFERENCE_ADAPTER in policy.peft_config:
        return "present"
    _add_reference(policy, active, REFERENCE_ADAPTER)
    return "added"


def remove_reference_adapter(trainer: Any) -> bool:
    """Delete the ``"ref"`` adapter that :func:`prepare_reference_adapter` added; False without one.

    Called at the end of training, so that the policy a user saves holds their own adapters only.
    """
    found = _adapter_policy(trainer)
    if found is None or REFERENCE_ADAPTER not in found[0].peft_config:
        return False
    found[0].delete_adapter(REFERENCE_ADAPTER)
    return True


def reanchor_adapter(trainer: Any) -> bool:
    """Copy the policy's active (restored) adapter into its ``"ref"`` adapter, in place; False without one."""
    found = _adapter_policy(trainer)
    if found is None or REFERENCE_ADAPTER not in found[0].peft_config:
        return False
    _copy_adapter(found[0], found[1], REFERENCE_ADAPTER)
    return True


class ReferenceAdapter:
    """The KL reference of a LoRA policy in a hand-written or Accelerate loop, as an adapter of the policy.

    A LoRA policy's reference is usually the base model (``with model.disable_adapter(): ...``), which a
    rollback cannot move: after it, a raised beta still pulls the restored policy back toward the initial
    model. This adds a frozen adapter (``name``, default ``"ref"``) with the trained adapter's LoRA
    configuration and every ``lora_B`` zero, so the reference is still the base model, exactly, until a
    rollback copies the restored adapter into it (the escalation ladder's ``reanchor``, through
    :func:`~loopguard.adapters.loop.apply_decision` / :meth:`LoopGuard.step
    <loopguard.adapters.loop.LoopGuard.step>` with ``reference=`` this object). It costs one more adapter's
    memory and its forward in the reference pass; no copy of the base model.

    Make it before the first checkpoint (before :meth:`LoopGuard.save_start
    <loopguard.adapters.loop.LoopGuard.save_start>`; a checkpoint holds every adapter of the policy) and, in
    Accelerate, before ``accelerator.prepare`` (pass the PEFT model, not the DDP wrapper). Compute the
    reference log-probabilities under :meth:`active`. :meth:`remove` deletes the adapter when training ends,
    so the saved policy holds your adapters only. An adapter named ``name`` that the policy already has (TRL
    makes ``"ref"`` from a pretrained adapter) is used as it is, and :meth:`remove` leaves it.

    Args:
        model: A ``peft.PeftModel`` with a LoRA adapter (DDP's ``.module`` is looked through).
        adapter: The adapter being trained (default: the policy's active adapter).
        name: The reference adapter's name (default ``"ref"``, the name TRL reads its reference from).

    Raises:
        LoopguardTypeError: ``model`` is not a ``peft.PeftModel``.
        ConfigError: ``adapter`` is not a LoRA adapter of the policy, ``name`` is ``adapter``, an existing
            ``name`` adapter does not have ``adapter``'s tensors, or the policy is sharded by DeepSpeed or
            FSDP (re-anchor through ``reference=`` a separate reference model there).

    Example (``policy`` a ``peft.PeftModel``; docs/loops.md has the whole loop)::

        reference = ReferenceAdapter(policy)
        with reference.active():
            ref_logits = policy(input_ids).logits
        loop.step(observation, model=policy, optimizer=optimizer, reference=reference)
    """

    def __init__(self, model: Any, *, adapter: str | None = None, name: str = REFERENCE_ADAPTER) -> None:
        """Find the policy's trained adapter and add the frozen reference adapter beside it."""
        from loopguard._validation import check_name, describe
        from loopguard.checkpoint._sharded import is_deepspeed, is_sharded
        from loopguard.checkpoint._state import peft_module
        from loopguard.exceptions import ConfigError, LoopguardTypeError

        policy = getattr(model, "module", model) if peft_module(model) is None else model
        peft = peft_module(policy)
        if peft is None:
            msg = (
                f"`model` must be a peft.PeftModel with a LoRA adapter, got {describe(model)} of type "
                f"{type(model).__name__}; give another policy its reference as a separate model "
                "(reference=ref_model)."
            )
            raise LoopguardTypeError(msg)
        if is_deepspeed(model) or is_sharded(policy):
            msg = (
                "`model` is sharded by DeepSpeed or FSDP: its adapters cannot be copied in place; keep a "
                "separate reference model and pass it as reference= instead."
            )
            raise ConfigError(msg)
        self.name = check_name("name", name)
        active = policy.active_adapter if adapter is None else check_name("adapter", adapter)
        config = policy.peft_config.get(active) if isinstance(active, str) else None
        if not isinstance(config, peft.LoraConfig):
            msg = (
                f"`adapter` must name a LoRA adapter of the policy (it has {sorted(policy.peft_config)}), "
                f"got {active!r}."
            )
            raise ConfigError(msg)
        if self.name == active:
            msg = f"`name` must differ from the trained adapter {active!r}, got {name!r}."
            raise ConfigError(msg)
        self.model, self.adapter = policy, str(active)
        self.added = self.name not in policy.peft_config
        if self.added:
            _add_reference(policy, self.adapter, self.name)
            return
        if not _same_tensors(policy, self.adapter, self.name):
            mine, theirs = _adapter_parameters(policy, self.adapter), _adapter_parameters(policy, self.name)
            msg = (
                f"the policy's adapter {self.name!r} must hold the same tensors as {self.adapter!r} to be "
                f"its reference, got {len(theirs)} and {len(mine)} tensors of other shapes; pass another "
                "`name`."
            )
            raise ConfigError(msg)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Run the policy as its KL reference inside this block (no gradients), then switch back.

        The reference adapter is active, and autograd off, inside the block; on leaving it the trained
        adapter is active again, trainable as before, and the reference adapter frozen.
        """
        import torch

        trainable = {key: p.requires_grad for key, p in _adapter_parameters(self.model, self.adapter).items()}
        self.model.set_adapter(self.name)
        try:
            with torch.no_grad():
                yield
        finally:
            self.model.set_adapter(self.adapter)
            for parameter in _adapter_parameters(self.model, self.name).values():
                parameter.requires_grad_(False)
            for key, parameter in _adapter_parameters(self.model, self.adapter).items():
                parameter.requires_grad_(trainable.get(key, parameter.requires_grad))

    def reanchor(self) -> bool:
        """Copy the trained (restored) adapter into the reference adapter, in place. Returns True."""
        _copy_adapter(self.model, self.adapter, self.name)
        return True

    def remove(self) -> bool:
        """Delete the reference adapter if this object added it (True), else leave it (False)."""
        if not self.added or self.name not in self.model.peft_config:
            return False
        self.model.delete_adapter(self.name)
        if self.model.active_adapter != self.adapter:
            self.model.set_adapter(self.adapter)
        return True

    def __repr__(self) -> str:
        """Name both adapters."""
        return f"ReferenceAdapter(adapter={self.adapter!r}, name={self.name!r}, added={self.added})"
