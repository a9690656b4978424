"""One rank of the 2-process FSDP2 test: a policy sharded with ``fully_shard``, guarded by LoopGuard.

Usage: ``python -m torch.distributed.run --standalone --nproc_per_node 2 fsdp2_rank_worker.py OUT MODE``.

``MODE`` is ``train`` (REINFORCE with a KL penalty; from ``BUG_STEP`` the reward pays for the word ``x`` in rank
1's data only; LoopGuard saves sharded checkpoints through CheckpointManager, rolls back on a decision taken
alike on both ranks, and stops), ``kill`` (two saves: the second one loses rank 1 to SIGKILL after its shards
are written, before the checkpoint is committed) or ``tamper`` (a restore to a checkpoint saved before the
first optimizer step, one with each rank's RNG states, then a byte of rank 1's shard file changes: the
restore must fail on both ranks and change nothing).

Each rank writes ``rank<R>.json``: per-step actions and betas, the rollbacks, and SHA-256 digests of the full
(gathered) parameters and optimizer state after every step and after every restore.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys


def main():
    """Run one rank (imports here: pytest's doctest collection imports this file without running it)."""
    import torch
    import torch.distributed as dist
    from sharded_helpers import POSITIONS, guarded_loop, policy_and_reference, rollout
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict
    from torch.distributed.fsdp import fully_shard

    from loopguard.checkpoint import CheckpointManager

    torch.set_num_threads(1)
    out, mode = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def build(seed):
        policy, reference = policy_and_reference(seed)
        fully_shard(policy.mix)
        fully_shard(policy)
        optimizer = torch.optim.Adam(policy.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1.0 + 0.01 * step))
        return policy, reference, optimizer, scheduler

    def digest(model, optimizer):
        """SHA-256 of the full parameters and optimizer state, gathered from both ranks (a collective).

        With an optimizer that has taken no step, DCP's get_state_dict first gives it state (a zero-gradient
        step); ``optimizer=None`` digests the parameters alone and leaves the optimizer as it is.
        """
        options = StateDictOptions(full_state_dict=True, cpu_offload=False)
        if optimizer is None:
            model_state, optim_state = get_model_state_dict(model, options=options), None
        else:
            model_state, optim_state = get_state_dict(model, optimizer, options=options)
        hasher = hashlib.sha256()
        for name, tensor in sorted(model_state.items()):
            hasher.update(name.encode())
            hasher.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        if optim_state is None:
            return hasher.hexdigest()
        for name, entries in sorted(optim_state["state"].items()):
            for key, value in sorted(entries.items()):
                hasher.update(f"{name}.{key}".encode())
                hasher.update(torch.as_tensor(value).detach().cpu().contiguous().numpy().tobytes())
        hasher.update(json.dumps(optim_state["param_groups"], sort_keys=True, default=str).encode())
        return hasher.hexdigest()

    store = os.path.join(out, "checkpoints")
    if mode == "kill":
        policy, _, optimizer, _ = build(0)
        manager = CheckpointManager(store, keep_last=None)
        for step in (2, 4):
            policy(POSITIONS).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            if step == 4 and rank == 1:
                from loopguard.checkpoint import _sharded

                def die(*_args, **_kwargs):
                    os.kill(os.getpid(), signal.SIGKILL)  # its shards are on disk, nothing is committed

                _sharded.hash_own_files = die
            manager.save(step, policy, optimizer)
            if rank == 0:
                manager.mark_good(step)
        return

    if mode == "tamper":
        from loopguard.checkpoint import CheckpointError

        policy, _, optimizer, scheduler = build(0)
        manager = CheckpointManager(store, keep_last=None)
        initial = digest(policy, None)
        manager.save(0, policy, optimizer, scheduler)  # before the first step: Adam holds no state yet
        policy(POSITIONS).sum().backward()
        optimizer.step()
        scheduler.step()
        manager.save(2, policy, optimizer, scheduler)  # with each rank's RNG states
        saved = digest(policy, optimizer)
        draw = torch.rand(3).tolist()  # what this rank's generator gives right after the save
        manager.restore(0, policy, optimizer, scheduler, rng=False)
        back_to_start = not optimizer.state and digest(policy, None) == initial
        manager.restore(2, policy, optimizer, scheduler, rng=True)
        restored = digest(policy, optimizer) == saved and torch.rand(3).tolist() == draw
        dist.barrier()
        if rank == 0:  # one byte of rank 1's shard file changes on disk
            path = os.path.join(store, "step-00000002", "__1_0.distcp")
            with open(path, "r+b") as handle:
                handle.seek(os.path.getsize(path) // 2)
                byte = handle.read(1)
                handle.seek(-1, os.SEEK_CUR)
                handle.write(bytes([byte[0] ^ 0xFF]))
        dist.barrier()
        policy(POSITIONS).sum().backward()
        optimizer.step()
        live = digest(policy, optimizer)
        try:
            manager.restore(2, policy, optimizer, rng=False)
            error = None
        except CheckpointError as caught:
            error = str(caught)
        from torch.distributed.fsdp import FullyShardedDataParallel

        from loopguard import ConfigError, Guard
        from loopguard.adapters.loop import LoopGuard

        try:  # FSDP1: flattened, sharded optimizer state that one process cannot save; refused on every rank
            wrapped = FullyShardedDataParallel(torch.nn.Linear(4, 4), device_id=torch.device("cpu"))
            LoopGuard(Guard(), checkpoint=manager, checkpoint_every=2).save_start(wrapped)
            fsdp1 = None
        except ConfigError as refused:
            fsdp1 = str(refused)
        try:  # one store per process, saved by rank 0 only: no rank could ever roll back
            LoopGuard(Guard(), checkpoint=CheckpointManager(in_memory=True))
            in_memory = None
        except ConfigError as refused:
            in_memory = str(refused)
        record = {
            "rank": rank,
            "error": error,
            "in_memory": in_memory,
            "fsdp1": fsdp1,
            "unchanged": digest(policy, optimizer) == live,
            "back_to_start": back_to_start,
            "restored": restored,
            "lr": scheduler.get_last_lr(),
        }
        with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
            json.dump(record, handle)
        dist.destroy_process_group()
        return

    policy, reference, optimizer, scheduler = build(0)
    torch.manual_seed(1000 * (rank + 1))  # rank-local sampling
    beta = [0.02]
    loop, manager = guarded_loop(out, beta)
    loop.save_start(policy, optimizer=optimizer, scheduler=scheduler)
    steps, digests, after_restore = {}, {"0": digest(policy, optimizer)}, {}
    for step in range(1, 41):
        loss, observation = rollout(policy, reference, step, rank, beta[0])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        applied = loop.step(observation, model=policy, optimizer=optimizer, scheduler=scheduler)
        steps[str(step)] = {
            "action": applied.action,
            "beta": beta[0],
            "verdict": str(getattr(loop.last_decision, "verdict", None)),
        }
        digests[str(step)] = digest(policy, optimizer)
        if applied.rolled_back_to is not None:
            after_restore[str(step)] = {"restored": applied.rolled_back_to, "digest": digests[str(step)]}
        if applied.stop:
            break
    record = {
        "rank": rank,
        "world": dist.get_world_size(),
        "steps": steps,
        "digests": digests,
        "after_restore": after_restore,
        "rollbacks": loop.rollbacks,
        "saved": list(manager.steps()),
        "lr": scheduler.get_last_lr(),
    }
    with open(os.path.join(out, f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    from launch_helpers import leave

    main()
    leave()  # the result is written: skip the exit-time teardown that can abort a finished rank
