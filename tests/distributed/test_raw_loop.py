"""loopguard.adapters.loop: apply_decision and LoopGuard for hand-written loops, and examples/raw_loop.py."""

from __future__ import annotations

import json
import pathlib
import re
import runpy

import attrs
import pytest
import torch

from loopguard import ConfigError, EscalationLadder, Guard, Observation
from loopguard.adapters.loop import Applied, LoopGuard, apply_decision
from loopguard.checkpoint import CheckpointManager

ROOT = pathlib.Path(__file__).resolve().parents[2]


def healthy(step):
    return Observation(step, [0.1 * (i % 4) for i in range(16)], completions=["a b c d"] * 16, group_size=4)


def hacked(step):
    return Observation(step, [5.0] * 16, completions=["x x x x x x x x"] * 16, group_size=4)


def test_apply_decision_sets_beta_restores_and_stops():
    model = torch.nn.Linear(2, 2)
    manager = CheckpointManager(in_memory=True)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    manager.save(3, model, rng=False)
    manager.mark_good(3)
    with torch.no_grad():
        model.weight.add_(1.0)
    decision = Guard(mode="kl_control", warmup_steps=3, beta=0.1).step(healthy(0))
    betas = []
    rollback = attrs.evolve(decision, step=9, action="rollback", beta_after=0.2)
    applied = apply_decision(rollback, set_beta=betas.append, checkpoint=manager, model=model)
    assert applied == Applied("rollback", 0.2, 3, False, rollback)
    assert betas == [0.2]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
    assert apply_decision(attrs.evolve(decision, action="stop")).stop
    with pytest.raises(ConfigError, match="a rollback needs `checkpoint`"):
        apply_decision(rollback)


def test_loop_guard_rolls_back_before_the_onset_and_persists_as_json():
    model = torch.nn.Linear(2, 2)
    manager = CheckpointManager(in_memory=True)
    ladder = EscalationLadder(rollback_patience=2, stop_patience=2, max_rollbacks=1, cooldown_steps=1)
    betas = []
    loop = LoopGuard(
        Guard(warmup_steps=3, beta=0.05, ladder=ladder), set_beta=betas.append, checkpoint=manager
    )
    actions = []
    for step in range(12):
        if step == 4:
            manager.save(step, model, rng=False)
            manager.mark_good(step)
            good = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            model.weight.add_(0.1)
        applied = loop.step(healthy(step) if step < 6 else hacked(step), model=model)
        actions.append(applied.action)
        if applied.stop:
            break
    assert "rollback" in actions
    assert actions[-1] == "stop"
    assert loop.rollbacks[0]["restored_step"] == 4
    assert applied.rolled_back_to == 4  # restored again at the stop
    assert all(torch.equal(model.state_dict()[k], v) for k, v in good.items())
    assert betas[-1] > 0.05
    state = json.loads(json.dumps(loop.state_dict()))
    twin = LoopGuard(Guard(warmup_steps=3, beta=0.05, ladder=ladder), set_beta=betas.append)
    twin.load_state_dict(state)
    assert twin.state_dict() == loop.state_dict()
    assert betas[-1] == loop.guard.beta
    with pytest.raises(ValueError, match="LoopGuard"):
        twin.load_state_dict({"kind": "other"})


def test_raw_loop_example_keeps_gold_higher_than_the_plain_loop():
    module = runpy.run_path(str(ROOT / "examples" / "raw_loop.py"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        plain, guarded = module["run"](guarded=False), module["run"](guarded=True)
    finally:
        torch.set_num_threads(threads)
    assert guarded["rollbacks"]
    assert guarded["rollbacks"][0]["restored_step"] < guarded["rollbacks"][0]["step"]
    assert max(guarded["betas"]) > guarded["betas"][0]
    assert guarded["gold"] > plain["gold"] + 0.2
    assert plain["x_share"] > 0.8


def test_a_rollback_re_anchors_the_reference_on_the_restored_policy():
    torch.manual_seed(0)
    model, reference = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    manager = CheckpointManager(in_memory=True)
    loop = LoopGuard(
        Guard(mode="kl_control", warmup_steps=3, beta=0.1, ladder=EscalationLadder(rollback_patience=2)),
        checkpoint=manager,
        checkpoint_every=100,
    )
    loop.save_start(model)  # the starting policy: good at once, the target of a flaw from step 0
    assert manager.good_steps() == (0,)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)  # training moved the policy on
    decision = Guard(mode="kl_control", warmup_steps=3, beta=0.1).step(healthy(0))
    rollback = attrs.evolve(decision, step=9, action="rollback", restore_before=5, reanchor=True)
    applied = apply_decision(rollback, checkpoint=manager, model=model, reference=reference)
    assert applied.rolled_back_to == 0
    assert applied.reanchored
    for key, value in start.items():
        assert torch.equal(model.state_dict()[key], value)
        assert torch.equal(reference.state_dict()[key], value)
    kept = attrs.evolve(rollback, reanchor=False)
    other = torch.nn.Linear(2, 2)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    assert not apply_decision(kept, checkpoint=manager, model=model, reference=other).reanchored
    assert all(torch.equal(other.state_dict()[k], v) for k, v in before.items())


def test_save_start_needs_the_store():
    with pytest.raises(ConfigError, match=re.escape("`save_start` needs the rollback store")):
        LoopGuard(Guard(mode="log_only")).save_start(torch.nn.Linear(2, 2))
