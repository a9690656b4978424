"""GuardedKLController against the KL-controller interface verl / OpenRLHF / older TRL PPO loops call."""

from __future__ import annotations

import inspect
import json

import pytest

from loopguard import EscalationLadder, Guard, Observation
from loopguard.exceptions import ConfigError, LoopguardTypeError
from loopguard.integrations import GuardedKLController


class FixedKLController:
    """verl's / TRL's fixed controller: the interface the engines were written against."""

    def __init__(self, kl_coef):
        self.value = kl_coef

    def update(self, current_kl, n_steps):
        pass


def apply_kl_penalty(scores, kld, kl_ctrl):
    """What verl's apply_kl_penalty does with the controller: read .value, then .update(current_kl, n_steps)."""
    beta = kl_ctrl.value
    rewards = [s - beta * k for s, k in zip(scores, kld, strict=True)]
    kl_ctrl.update(current_kl=sum(kld) / len(kld), n_steps=len(scores))
    return rewards, beta


def healthy(step):
    return [0.1 * (i % 4) for i in range(16)], {"completions": ["a b c d"] * 16, "group_size": 4}


def hacked(step):
    return [5.0] * 16, {"completions": ["x x x x x x x x"] * 16, "group_size": 4}


def test_same_interface_as_the_engines_controllers():
    ours, theirs = GuardedKLController(init_kl_coef=0.05), FixedKLController(0.05)
    assert ours.value == theirs.value == ours.kl_coef
    assert list(inspect.signature(ours.update).parameters) == list(
        inspect.signature(theirs.update).parameters
    )
    assert ours.update(current_kl=0.1, n_steps=8) is None
    assert ours.value == 0.05  # update records the KL; only the Guard moves the coefficient
    assert ours.last_kl == 0.1
    assert ours.n_steps == 8


def test_openrlhfs_call_positional_update_and_value_reads():
    # OpenRLHF 0.11.2 cannot be installed here (it pins flash-attn 2.8.3, a CUDA build). Its PPO trainer
    # (openrlhf/trainer/ppo_trainer.py) calls ``self.kl_ctl.update(status["kl"], batch_size * n_samples)``
    # positionally and hands ``self.kl_ctl.value`` to the actors; its controllers name the first argument
    # ``current``, not ``current_kl``, so only a positional call works on both.
    controller = GuardedKLController(init_kl_coef=0.02)
    assert controller.update(0.3, 64) is None
    assert controller.last_kl == 0.3
    assert controller.n_steps == 64
    assert controller.value == 0.02
    assert [p.kind for p in inspect.signature(controller.update).parameters.values()] == [
        inspect.Parameter.POSITIONAL_OR_KEYWORD
    ] * 2


def test_drives_an_engine_loop_raises_beta_then_asks_to_roll_back_and_stop():
    ladder = EscalationLadder(rollback_patience=2, stop_patience=2, max_rollbacks=1, cooldown_steps=1)
    controller = GuardedKLController(
        Guard(mode="kl_control", warmup_steps=3, ladder=ladder), init_kl_coef=0.05
    )
    betas, rollbacks, targets = [], [], []
    for step in range(20):
        rewards, fields = healthy(step) if step < 6 else hacked(step)
        _, beta = apply_kl_penalty(rewards, [0.01 * step] * 16, controller)
        betas.append(beta)
        controller.observe(rewards, step=step, can_rollback=True, **fields)
        rollbacks.append(controller.rollback_requested)
        targets.append(controller.restore_before)
        if controller.should_stop:
            break
    assert controller.should_stop
    assert any(rollbacks)
    first_bad = 6  # the hack starts at step 6; the Guard's restore target is its onset, not the rollback step
    rollback_step = rollbacks.index(True)
    assert rollback_step > first_bad
    assert first_bad <= targets[rollback_step] < rollback_step
    assert all(
        target is None for target, asked in zip(targets[:rollback_step], rollbacks, strict=False) if not asked
    )
    assert betas[:6] == [0.05] * 6
    assert max(betas) > 0.05
    assert controller.value >= max(betas)
    assert controller.last_decision.action == "stop"


def test_kl_from_update_reaches_the_guard_and_state_round_trips():
    controller = GuardedKLController(Guard(mode="adaptive_kl", warmup_steps=3), init_kl_coef=0.1)
    for step in range(8):
        controller.update(current_kl=0.5, n_steps=16)  # far above the adaptive controller's target
        rewards, fields = healthy(step)
        controller.observe(rewards, **fields)
    assert controller.value != 0.1  # adaptive_kl moved beta from the KL the engine reported
    state = json.loads(json.dumps(controller.state_dict()))
    twin = GuardedKLController(Guard(mode="adaptive_kl", warmup_steps=3), init_kl_coef=0.1)
    twin.load_state_dict(state)
    assert twin.state_dict() == controller.state_dict()
    assert twin.value == controller.value
    decision = twin.observe(Observation(8, healthy(8)[0], kl=0.5, beta=twin.value))
    assert decision.step == 8


def test_bad_arguments_are_refused():
    with pytest.raises(ConfigError, match="control the coefficient"):
        GuardedKLController(Guard(mode="log_only"))
    with pytest.raises(LoopguardTypeError, match="Guard"):
        GuardedKLController(object())
    with pytest.raises(ConfigError):
        GuardedKLController(init_kl_coef=0.0)
    controller = GuardedKLController()
    with pytest.raises(LoopguardTypeError, match="not both"):
        controller.observe(Observation(0, [1.0]), step=3)
    with pytest.raises(ConfigError, match="state_dict"):
        controller.load_state_dict({"kind": "x"})
