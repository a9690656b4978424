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

WORDS = 8
LENGTH, BATCH, GROUP, X = 8, 16, 8, 7
BUG_STEP = 6


def main():
    """Run one rank (imports here: pytest's doctest collection imports this file without running it)."""
    import torch

    torch.set_num_threads(1)
    import deepspeed
    import torch.distributed as dist

    from loopguard import EscalationLadder, Guard, Observation
    from loopguard.adapters.loop import LoopGuard
    from loopguard.checkpoint import CheckpointManager

    out = sys.argv[1]
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()

    class Policy(torch.nn.Module):
        """A logits table per position, mixed by a linear layer that starts as the identity."""

        def __init__(self) -> None:
            super().__init__()
            self.logits = torch.nn.Parameter(torch.zeros(LENGTH, WORDS))
            self.mix = torch.nn.Linear(WORDS, WORDS)
            with torch.no_grad():
                self.mix.weight.copy_(torch.eye(WORDS))
                self.mix.bias.zero_()

        def forward(self, positions: torch.Tensor) -> torch.Tensor:
            return torch.log_softmax(self.mix(self.logits[positions]), dim=-1)

    torch.manual_seed(0)
    policy = Policy()
    reference = Policy()
    reference.load_state_dict(policy.state_dict())
    reference.requires_grad_(False)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    optimizer = torch.optim.Adam(policy.parameters(), lr=0.1)
    engine, engine_optimizer, _, _ = deepspeed.initialize(model=policy, optimizer=optimizer, config=config)
    positions = torch.arange(LENGTH)

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
    manager = CheckpointManager(os.path.join(out, "checkpoints"), keep_last=3)
    ladder = EscalationLadder(rollback_patience=3, stop_patience=3, max_rollbacks=1, cooldown_steps=6)
    loop = LoopGuard(
        Guard(mode="kl_control", warmup_steps=4, beta=beta[0], ladder=ladder),
        set_beta=lambda value: beta.__setitem__(0, value),
        checkpoint=manager,
        checkpoint_every=2,
    )
    loop.save_start(engine, optimizer=engine_optimizer)
    steps, digests, after_restore, anchored = {}, {"0": digest()}, {}, {}
    for step in range(1, 41):
        log_probs = engine(positions)
        sampler = torch.distributions.Categorical(logits=log_probs)
        ids = sampler.sample((BATCH,))
        gold = torch.tensor([len(set(row.tolist())) / LENGTH for row in ids])
        bugged = step >= BUG_STEP and rank == 1
        rewards = gold + (5.0 if bugged else 0.0) * (ids == X).sum(dim=1).float()
        grouped = rewards.view(-1, GROUP)
        advantages = (grouped - grouped.mean(dim=1, keepdim=True)).view(-1)
        kl = (log_probs.exp() * (log_probs - reference(positions))).sum()
        loss = -(advantages * sampler.log_prob(ids).sum(dim=1)).mean() + beta[0] * kl
        engine.backward(loss)
        engine.step()
        observation = Observation(
            step,
            rewards.tolist(),
            completions=[" ".join("abcdefgx"[i] for i in row) for row in ids.tolist()],
            completion_ids=ids.tolist(),
            group_size=GROUP,
            kl=float(kl.detach()),
            beta=beta[0],
        )
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
    main()
