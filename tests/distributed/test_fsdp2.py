"""Rollback of an FSDP2-sharded policy on 2 processes (gloo, CPU): checkpoints through DCP, one decision.

The worker (``fsdp2_rank_worker.py``) records SHA-256 digests of the full parameters and optimizer state,
gathered from both ranks, after every step: the digest after a restore must equal the digest recorded when
the restored checkpoint was saved, on both ranks.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from launch_helpers import launch, run_workers

from loopguard.checkpoint import CheckpointError, CheckpointManager

pytest.importorskip("torch.distributed.fsdp")


def test_a_sharded_policy_rolls_back_on_every_rank_to_the_checkpoints_state(tmp_path):
    zero, one = launch("fsdp2_rank_worker.py", tmp_path, "train", timeout=240)
    assert zero["world"] == one["world"] == 2
    assert zero["steps"] == one["steps"], "ranks took different actions or hold different betas"
    assert zero["digests"] == one["digests"], "the ranks' gathered states differ"
    actions = [entry["action"] for entry in zero["steps"].values()]
    assert "rollback" in actions
    assert actions[-1] == "stop"
    assert zero["rollbacks"] == one["rollbacks"]
    (rollback,) = zero["rollbacks"]
    restored = rollback["restored_step"]
    assert restored < rollback["step"]
    digests = zero["digests"]
    # training moved the state after the checkpoint; the rollback (and the restore at the stop) bring back
    # exactly the parameters and optimizer state saved at the restored step
    assert digests[str(rollback["step"] - 1)] != digests[str(restored)]
    assert zero["after_restore"] == one["after_restore"]
    assert set(zero["after_restore"]) == {str(rollback["step"]), max(zero["steps"], key=int)}
    for entry in zero["after_restore"].values():
        assert entry["digest"] == digests[str(entry["restored"])]
    assert zero["lr"] == one["lr"]

    # the store, read by one process: every checkpoint is sharded (DCP) and verifies
    store = CheckpointManager(tmp_path / "checkpoints")
    assert list(store.steps()) == zero["saved"]
    step = store.steps()[-1]
    folder = tmp_path / "checkpoints" / f"step-{step:08d}"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["engine"] == "dcp"
    assert manifest["world_size"] == 2
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "optimizer.pt", "scheduler.pt"} <= set(
        manifest["files"]
    )
    store.verify(step)
    with pytest.raises(CheckpointError, match=r"is sharded .* restore it into the sharded model"):
        store.restore(step, torch.nn.Linear(16, 8), rng=False)
    shard = folder / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"__1_0\.distcp fails its SHA-256 check"):
        store.verify(step)


def test_restores_of_an_empty_optimizer_and_of_rng_states_and_a_corrupted_shard(tmp_path):
    zero, one = launch("fsdp2_rank_worker.py", tmp_path, "tamper", timeout=240)
    # first, the clean restores: to the step-0 checkpoint (no optimizer state yet: the state is emptied) and
    # to step 2 with each rank's own RNG states (the next draws repeat the ones made right after the save)
    assert zero["back_to_start"]
    assert one["back_to_start"]
    assert zero["restored"]
    assert one["restored"]
    assert zero["lr"] == one["lr"]
    assert "__1_0.distcp fails its SHA-256 check" in zero["error"]
    assert "failed on rank 0" in one["error"]
    assert zero["unchanged"]
    assert one["unchanged"]
    # under several processes an in-memory store is refused at once (each rank would hold its own)
    for record in (zero, one):
        assert "in-memory CheckpointManager, but 2 processes train" in record["in_memory"]
        assert "wrapped in FSDP1" in record["fsdp1"]
        assert "Shard the policy with FSDP2" in record["fsdp1"]


def test_a_rank_killed_mid_save_leaves_no_checkpoint_that_claims_to_be_complete(tmp_path):
    done = run_workers("fsdp2_rank_worker.py", tmp_path, "kill", timeout=240)
    assert done.returncode != 0
    assert "SIGKILL" in done.stderr + done.stdout, done.stderr[-3000:]
    folder = tmp_path / "checkpoints"
    assert not (folder / "step-00000004").exists()
    store = CheckpointManager(folder)  # clears whatever the dead save left behind
    assert store.steps() == (2,)
    assert store.good_steps() == (2,)
    store.verify(2)
    assert not [name for name in os.listdir(folder) if name.startswith(".tmp-")]
