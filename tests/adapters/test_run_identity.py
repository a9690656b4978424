"""Runs cannot be mixed up (real TRL GRPO trainers on a tiny GPT-2, CPU).

Reusing an ``output_dir`` is the most common thing a TRL user does. A fresh run there must never restore the
weights an earlier run saved, never mix its log records with the earlier run's in a report, and a genuine
``resume_from_checkpoint`` must keep the run's identity while setting the abandoned timeline apart.
"""

import datetime
import hashlib
import json
import re

import pytest
import torch
from adapter_helpers import Spy, decisions, grpo_trainer, make_echo_reward

from loopguard import (
    CheckpointError,
    ConfigError,
    EscalationLadder,
    Guard,
    RewardHackMitigator,
    RLCheckpointCallback,
    read_mitigation_log,
)
from loopguard.checkpoint import CheckpointManager
from loopguard.log import split_runs
from loopguard.report import summarize


def _digest(model):
    hasher = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        hasher.update(name.encode())
        hasher.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return hasher.hexdigest()


def _run(model_dir, tokenizer, output_dir, *, hack_from, max_steps, learning_rate):
    """One guarded run with default-scoped rollback checkpoints; returns (trainer, mitigator, digests)."""
    mitigator = RewardHackMitigator(
        guard=Guard(
            mode="kl_control",
            ladder=EscalationLadder(
                rollback_patience=2, stop_patience=50, max_rollbacks=1, cooldown_steps=50
            ),
            warmup_steps=4,
        )
    )
    # default store (<output_dir>/loopguard_checkpoints); every checkpoint kept, so A's early ones stay there
    checkpoints = RLCheckpointCallback(save_every_steps=2, keep_last=50)
    trainer = grpo_trainer(
        model_dir,
        tokenizer,
        output_dir,
        [make_echo_reward(hack_from)],
        max_steps=max_steps,
        learning_rate=learning_rate,
    )
    spy = Spy(probe=lambda t, s: _digest(t.model))
    spy.trainer = trainer
    trainer.add_callback(checkpoints)
    trainer.add_callback(mitigator)
    trainer.add_callback(spy)
    trainer.train()
    return trainer, mitigator, spy.probes


def test_a_fresh_run_in_a_reused_output_dir_restores_only_its_own_weights(model_dir, tokenizer, tmp_path):
    # Run A: healthy, a different learning rate, saves rollback checkpoints at steps 2, 4, ..., 24.
    _, first, digests_a = _run(model_dir, tokenizer, tmp_path, hack_from=10**9, max_steps=24, learning_rate=1e-2)
    # Run B: fresh, same output_dir; the hack from step 8 trips, persists, and B rolls back -- to a step at
    # which A saved a good checkpoint too (a shared store would hand B A's weights).
    _, second, digests_b = _run(model_dir, tokenizer, tmp_path, hack_from=8, max_steps=30, learning_rate=3e-2)

    assert first.run_id != second.run_id
    rollback = next(r for r in decisions(tmp_path) if r["run"] == second.run_id and r["action"] == "rollback")
    restored = rollback["extra"]["adapter"]["rolled_back_to"]
    assert second.rollbacks == [{"step": rollback["step"], "restored_step": restored}]
    # B's weights right after the rollback are B's own from the restored step, not A's from that step
    assert digests_b[rollback["step"]] == digests_b[restored]
    assert digests_b[restored] != digests_a[restored]
    # each run has its own store beside the other's, and B's store holds only B's checkpoints
    store_a = CheckpointManager(tmp_path / "loopguard_checkpoints" / first.run_id)
    store_b = CheckpointManager(tmp_path / "loopguard_checkpoints" / second.run_id)
    assert store_a.steps()[-1] == 24
    assert restored in store_a.good_steps()  # A has a good checkpoint at that very step
    assert store_b.steps()[0] <= restored
    manifest = json.loads((store_b.directory / f"step-{restored:08d}" / "manifest.json").read_text())
    assert manifest["run"] == second.run_id

    # The shared log keeps the runs apart, and the report summarises each on its own.
    records = read_mitigation_log(tmp_path / "mitigation_log.jsonl")
    runs = split_runs(records)
    assert [run.run for run in runs] == [first.run_id, second.run_id]
    assert [len(run.records) for run in runs] == [24, 30]
    assert [run.events[0]["event"] for run in runs] == ["start", "start"]
    text = summarize(records)
    assert text.startswith("This log holds 2 runs; each is summarised on its own")
    assert f"Run {first.run_id}:" in text
    assert "24 steps observed (steps 1-24)" in text
    assert "30 steps observed (steps 1-30)" in text


def test_a_named_store_of_another_run_is_refused_at_the_start(model_dir, tokenizer, tmp_path):
    store = tmp_path / "store"

    def guarded():
        return RewardHackMitigator(
            guard=Guard(mode="kl_control", ladder=EscalationLadder(), warmup_steps=3),
            checkpoint=store,
            checkpoint_every=2,
        )

    first = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(10**9)], max_steps=4)
    mitigator = guarded()
    first.add_callback(mitigator)
    first.train()
    assert CheckpointManager(store).steps() == (0, 2, 4)  # 0: the starting policy

    second = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(10**9)], max_steps=4)
    second.add_callback(guarded())
    with pytest.raises(ConfigError) as info:
        second.train()
    message = str(info.value)
    assert f"`directory` {store} holds the rollback checkpoints of another run ({mitigator.run_id})" in message
    assert "resume_from_checkpoint" in message
    assert "give this run a store of its own" in message
    assert second.state.global_step == 0


def test_a_restore_never_loads_a_checkpoint_of_another_run(model_dir, tokenizer, tmp_path):
    model = torch.nn.Linear(3, 2)
    ours = CheckpointManager(tmp_path / "ours")
    ours.claim("run-a")
    ours.save(2, model)
    ours.mark_good(2)
    # a checkpoint of another run copied into the store by hand keeps its manifest's run
    theirs = CheckpointManager(tmp_path / "theirs")
    theirs.claim("run-b")
    theirs.save(4, model)
    (tmp_path / "theirs" / "step-00000004").rename(tmp_path / "ours" / "step-00000004")
    ours.mark_good(4)
    with pytest.raises(CheckpointError, match=re.escape("was saved by run run-b, not by this run (run-a)")):
        ours.restore("last_good", model, rng=False)


def test_resume_keeps_the_identity_and_sets_the_abandoned_timeline_apart(model_dir, tokenizer, tmp_path):
    def mitigator():
        return RewardHackMitigator(
            guard=Guard(mode="kl_control", ladder=EscalationLadder(), warmup_steps=3), checkpoint_every=2
        )

    checkpoints = RLCheckpointCallback(save_every_steps=2)
    first = grpo_trainer(
        model_dir, tokenizer, tmp_path, [make_echo_reward(10)], max_steps=20, save_strategy="steps", save_steps=10
    )
    original = mitigator()
    first.add_callback(checkpoints)
    first.add_callback(original)
    first.train()
    assert any(r["action"] == "raise_beta" for r in decisions(tmp_path) if r["step"] > 10)
    abandoned_saves = [step for step in checkpoints.manager.steps() if step > 10]
    assert abandoned_saves  # the first timeline saved rollback checkpoints after step 10
    resumed_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")

    resumed = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(10)], max_steps=20)
    again = mitigator()
    checkpoints_again = RLCheckpointCallback(save_every_steps=2)
    resumed.add_callback(checkpoints_again)
    resumed.add_callback(again)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-10"))

    assert again.run_id == original.run_id  # a genuine resume is the same run
    assert checkpoints_again.manager.directory == checkpoints.manager.directory
    records = read_mitigation_log(tmp_path / "mitigation_log.jsonl")
    assert [r["step"] for r in records if r["event"] == "decision"] == [*range(1, 21), *range(11, 21)]
    (run,) = split_runs(records)
    assert [r["step"] for r in run.records] == list(range(1, 21))  # the live timeline: 20 steps, not 30
    assert [r["step"] for r in run.abandoned] == list(range(11, 21))
    assert [(e["event"], e["step"]) for e in run.events] == [("start", 0), ("resume", 10)]
    text = summarize(records)
    assert "20 steps observed (steps 1-20)" in text
    assert "Resumed 1 time(s), at step(s) 10; 10 record(s) of abandoned timelines (over steps 11-20)" in text
    assert "30 steps" not in text
    # the store dropped the abandoned timeline's checkpoints on resume: every one after step 10 is new
    store = checkpoints_again.manager
    for step in store.steps():
        manifest = json.loads((store.directory / f"step-{step:08d}" / "manifest.json").read_text())
        assert manifest["run"] == original.run_id
        if step > 10:
            assert manifest["created"].replace("Z", "+00:00") > resumed_at, step
