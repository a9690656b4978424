"""One rank of the 2-process DeepSpeed ZeRO-3 test: a policy partitioned by DeepSpeed, guarded by LoopGuard.

Usage: ``python -m torch.distributed.run --standalone --nproc_per_node 2 deepspeed_rank_worker.py OUT``.

REINFORCE with a KL penalty on DeepSpeed's CPU accelerator (gloo); from ``BUG_STEP`` the reward pays for the
word ``x`` in rank 1's data only. LoopGuard saves the engine through CheckpointManager (DeepSpeed's own
``save_checkpoint`` under loopguard's manifest), rolls back on a decision taken alike on both ranks, and
re-anchors an unpartitioned KL reference on the restored policy. Each rank writes ``rank<R>.json``: per-step
actions, and digests of the full (gathered) parameters and of every rank's fp32 partitions and Adam state.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys


def main():
    """Run one rank (imports here: pytest's doctest collection imports this file without running it)."""
    import torch

    torch.set_num_threads(1)
    import deepspeed
    import torch.distributed as dist
    from sharded_helpers import guarded_loop, policy_and_reference, rollout

    out = sys.argv[1]
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    policy, reference = policy_and_reference(0)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    optimizer = torch.optim.Adam(policy.parameters(), lr=0.1)
    engine, engine_optimizer, _, _ = deepspeed.initialize(model=policy, optimizer=optimizer, config=config)

    def digest():
        """The gathered parameters (the same on every rank) and this rank's fp32 partitions and Adam state."""
        full = hashlib.sha256()
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
            for name, parameter in engine.module.named_parameters():
                full.update(name.encode())
                full.update(parameter.detach().numpy().tobytes())
        local = hashlib.sha256()
        for flat in engine_optimizer.fp32_partitioned_groups_flat:
            local.update(flat.detach().numpy().tobytes())
        for state in engine_optimizer.optimizer.state.values():
            for key, value in sorted(state.items()):
                local.update(key.encode())
                local.update(torch.as_tensor(value).numpy().tobytes())
        parts = [None] * dist.get_world_size()
        dist.all_gather_object(parts, local.hexdigest())
        return full.hexdigest() + ":" + ":".join(parts)

    torch.manual_seed(1000 * (rank + 1))  # rank-local sampling
    beta = [0.02]
    loop, manager = guarded_loop(out, beta)
    loop.save_start(engine, optimizer=engine_optimizer)
    steps, digests, after_restore, anchored = {}, {"0": digest()}, {}, {}
    for step in range(1, 41):
        loss, observation = rollout(engine, reference, step, rank, beta[0])
        engine.backward(loss)
        engine.step()
        applied = loop.step(observation, model=engine, optimizer=engine_optimizer, reference=reference)
        steps[str(step)] = {"action": applied.action, "beta": beta[0]}
        digests[str(step)] = digest()
        if applied.rolled_back_to is not None:
            after_restore[str(step)] = {"restored": applied.rolled_back_to, "digest": digests[str(step)]}
            if applied.reanchored:
                with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
                    same = all(
                        torch.equal(a, b)
                        for a, b in zip(engine.module.parameters(), reference.parameters(), strict=True)
                    )
                anchored[str(step)] = same
        if applied.stop:
            break
    from loopguard import ConfigError

    try:  # the partitioned module alone (not its engine) cannot be saved: refused before anything is written
        manager.save(1000, engine.module)
        refused = None
    except ConfigError as error:
        refused = str(error)
    record = {
        "refused": refused,
        "rank": rank,
        "world": dist.get_world_size(),
        "steps": steps,
        "digests": digests,
        "after_restore": after_restore,
        "anchored": anchored,
        "rollbacks": loop.rollbacks,
        "saved": list(manager.steps()),
    }
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    from launch_helpers import leave

    main()
    leave()  # the result is written: skip the exit-time teardown that can abort a finished rank
