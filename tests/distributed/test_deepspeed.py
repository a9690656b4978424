"""Rollback of a DeepSpeed ZeRO-3 policy on 2 processes (DeepSpeed's CPU accelerator, gloo).

CheckpointManager saves the engine through DeepSpeed's own ``save_checkpoint`` (each rank its partitions)
under loopguard's manifest, hashes and atomic commit. The worker (``deepspeed_rank_worker.py``) records
digests of the gathered parameters and of every rank's fp32 partitions and Adam state after every step; after
a restore they must equal the ones recorded when the restored checkpoint was saved.
"""

from __future__ import annotations

import json

import pytest
import torch
from launch_helpers import launch

from loopguard.checkpoint import CheckpointError, CheckpointManager


def test_a_zero3_policy_rolls_back_on_every_rank_to_the_checkpoints_partitions(tmp_path):
    zero, one = launch("deepspeed_rank_worker.py", tmp_path, timeout=300)
    assert zero["world"] == one["world"] == 2
    assert zero["steps"] == one["steps"], "ranks took different actions or hold different betas"
    assert zero["digests"] == one["digests"]
    actions = [entry["action"] for entry in zero["steps"].values()]
    assert "rollback" in actions
    assert actions[-1] == "stop"
    (rollback,) = zero["rollbacks"]
    restored = rollback["restored_step"]
    digests = zero["digests"]
    assert digests[str(rollback["step"] - 1)] != digests[str(restored)]
    assert set(zero["after_restore"]) == {str(rollback["step"]), max(zero["steps"], key=int)}
    for entry in zero["after_restore"].values():
        assert entry["digest"] == digests[str(entry["restored"])]
    # the unpartitioned KL reference now holds the restored policy (gathered from both ranks' partitions)
    assert zero["anchored"] == one["anchored"] == {str(rollback["step"]): True}

    for record in (zero, one):  # the module alone, without its engine: refused, with the way out
        assert "partitioned by DeepSpeed ZeRO-3" in record["refused"]
        assert "pass the DeepSpeed engine" in record["refused"]

    store = CheckpointManager(tmp_path / "checkpoints")
    step = store.steps()[-1]
    folder = tmp_path / "checkpoints" / f"step-{step:08d}"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["engine"] == "deepspeed"
    assert manifest["world_size"] == 2
    names = set(manifest["files"])
    assert {f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in (0, 1)} <= names
    assert not names & {"zero_to_fp32.py", "zero_to_torch.py"}  # DeepSpeed's tools are not kept
    store.verify(step)
    with pytest.raises(CheckpointError, match=r"is sharded \(saved through the DeepSpeed engine"):
        store.restore(step, torch.nn.Linear(2, 2), rng=False)
