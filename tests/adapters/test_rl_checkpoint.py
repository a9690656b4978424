"""RLCheckpointCallback: mid-epoch checkpoints with the Guard state and the synced reference model, and the
rollback source for RewardHackMitigator."""

import torch
from adapter_helpers import Spy, decisions, fresh_model, grpo_trainer, make_echo_reward

from loopguard import EscalationLadder, Guard, RewardHackMitigator, RLCheckpointCallback
from loopguard.checkpoint import CheckpointManager


def test_mid_epoch_checkpoints_with_the_guard_state_and_the_synced_reference(model_dir, tokenizer, tmp_path):
    store = tmp_path / "store"
    checkpoints = RLCheckpointCallback(save_every_steps=3, keep_last=2, directory=store)
    mitigator = RewardHackMitigator(guard=Guard(mode="kl_control", warmup_steps=3))
    trainer = grpo_trainer(
        model_dir,
        tokenizer,
        tmp_path,
        [make_echo_reward(10**9)],
        max_steps=9,
        sync_ref_model=True,
        ref_model_sync_steps=2,
    )
    trainer.add_callback(checkpoints)
    trainer.add_callback(mitigator)
    trainer.train()

    assert trainer.state.epoch < 1  # mid-epoch
    manager = CheckpointManager(store)
    # keep_last=2 keeps 6 and 9, and the newest good checkpoint older than those (3); each checkpoint is marked
    # good at the next save, once the mitigator's verdicts stayed OK (9 awaits its confirmation window)
    assert manager.steps() == (3, 6, 9)
    assert manager.good_steps() == (3, 6)
    model, ref = fresh_model(model_dir), fresh_model(model_dir)
    restored = manager.restore(6, model, ref_model=ref, rng=False)  # fails if the reference was not saved
    assert restored.extra_state["guard"]["seen"] == 6
    assert restored.extra_state["kind"] == "loopguard.RewardHackMitigator"
    assert checkpoints.manager.directory == store.resolve()


def test_rollback_through_an_rl_checkpoint_callback(model_dir, tokenizer, tmp_path):
    def weights(trainer, state):
        return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}

    mitigator = RewardHackMitigator(
        guard=Guard(
            mode="kl_control",
            ladder=EscalationLadder(rollback_patience=2, stop_patience=50, max_rollbacks=1, cooldown_steps=5),
            warmup_steps=4,
        )
    )
    checkpoints = RLCheckpointCallback(save_every_steps=2, directory=tmp_path / "store")
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(8)], max_steps=40)
    spy = Spy(probe=weights)
    spy.trainer = trainer
    trainer.add_callback(checkpoints)
    trainer.add_callback(mitigator)
    trainer.add_callback(spy)
    trainer.train()

    rollback = next(
        r for r in decisions(tmp_path) if r["action"] == "rollback"
    )
    restored = rollback["extra"]["adapter"]["rolled_back_to"]
    assert mitigator.checkpoints is checkpoints.manager
    assert all(torch.equal(spy.probes[rollback["step"]][k], v) for k, v in spy.probes[restored].items())
    first_warn = next(
        r["step"] for r in decisions(tmp_path) if r["verdict"] != "OK"
    )
    assert restored < first_warn  # the last good checkpoint before the hack's onset
