"""A raw Accelerate policy-gradient loop with a KL penalty, guarded by loopguard on every rank alike.

Run:  python examples/accelerate_loop.py                       (one process)
      accelerate launch --cpu --num_processes 2 examples/accelerate_loop.py
      python -m torch.distributed.run --nproc_per_node 2 examples/accelerate_loop.py

The policy (a logits table over 8 words at 8 positions, wrapped in DDP by ``accelerator.prepare``) is
trained with REINFORCE and a KL penalty to its frozen start. Each rank samples its own batch, so each rank's
observation is rank-local. From step ``bug_step`` the proxy reward pays ``bonus`` (0.5) per ``x`` (a
reward-model bug); ``--hack-rank R`` confines the bug to rank R's data (the others stay healthy). loopguard's
:class:`~loopguard.adapters.loop.LoopGuard` reduces the decision across ranks (severity by max), so every rank
raises beta, rolls back (a :class:`~loopguard.checkpoint.CheckpointManager` on a shared folder, saved by the
main process, restored on every rank behind barriers) and stops at the same step. The guard's state is saved
with ``accelerator.save_state`` as JSON (:func:`~loopguard.adapters.accelerate_hooks.register_state`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile

import torch
from accelerate import Accelerator

from loopguard import EscalationLadder, Guard, Observation
from loopguard.adapters.accelerate_hooks import rank_sync, read_state, register_state
from loopguard.adapters.loop import LoopGuard
from loopguard.checkpoint import CheckpointManager

WORDS = ["a", "b", "c", "d", "e", "f", "g", "x"]
LENGTH, BATCH, GROUP, X = 8, 16, 8, 7


class Policy(torch.nn.Module):
    """Independent categorical choices per position (a logits table)."""

    def __init__(self) -> None:
        """Uniform logits."""
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(LENGTH, len(WORDS)))

    def forward(self) -> torch.Tensor:
        """Log-probabilities per position (called through DDP, so gradients are averaged across ranks)."""
        return torch.log_softmax(self.logits, dim=-1)


def gold(ids: torch.Tensor) -> torch.Tensor:
    return torch.tensor([len(set(row.tolist())) / LENGTH for row in ids])


def digest(module: torch.nn.Module) -> str:
    hasher = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        hasher.update(name.encode())
        hasher.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return hasher.hexdigest()


def run(
    folder: str,
    *,
    steps: int = 80,
    bug_step: int = 25,
    hack_rank: int | None = None,
    save_every: int = 5,
    warmup: int = 10,
    patience: int = 5,
    bonus: float = 0.5,
    lr: float = 0.05,
    seed: int = 0,
) -> dict[str, object]:
    """Train; returns per-step actions and betas, the rollbacks, parameter digests and the saved state."""
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    rank = accelerator.process_index
    torch.manual_seed(seed)
    policy, reference = Policy(), Policy()
    reference.load_state_dict(policy.state_dict())
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    policy, optimizer = accelerator.prepare(policy, optimizer)
    inner, inner_optimizer = accelerator.unwrap_model(policy), optimizer.optimizer
    torch.manual_seed(seed + 1000 * (rank + 1))  # rank-local sampling
    beta = [0.02]
    manager = CheckpointManager(os.path.join(folder, "checkpoints"), keep_last=3)
    loop = LoopGuard(
        Guard(
            mode="kl_control",
            warmup_steps=warmup,
            beta=beta[0],
            ladder=EscalationLadder(
                rollback_patience=patience,
                stop_patience=patience,
                max_rollbacks=1,
                cooldown_steps=2 * patience,
            ),
        ),
        set_beta=lambda value: beta.__setitem__(0, value),
        checkpoint=manager,
        checkpoint_every=save_every,  # saved by the main process while healthy, confirmed by the Guard
        sync=rank_sync(accelerator),
    )
    register_state(accelerator, loop)
    steps_log: dict[str, dict[str, object]] = {}
    after_rollback: dict[str, str] = {}
    checkpoint: str | None = None
    for step in range(1, steps + 1):
        log_probs_table = policy()
        dist = torch.distributions.Categorical(logits=log_probs_table)
        ids = dist.sample((BATCH,))
        bugged = step >= bug_step and (hack_rank is None or hack_rank == rank)
        rewards = gold(ids) + (bonus if bugged else 0.0) * (ids == X).sum(dim=1).float()
        grouped = rewards.view(-1, GROUP)
        advantages = (grouped - grouped.mean(dim=1, keepdim=True)).view(-1)
        ref_log = torch.log_softmax(reference.logits, dim=-1)
        kl = (log_probs_table.exp() * (log_probs_table - ref_log)).sum()
        loss = -(advantages * dist.log_prob(ids).sum(dim=1)).mean() + beta[0] * kl
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
        observation = Observation(
            step,
            rewards.tolist(),
            completions=[" ".join(WORDS[i] for i in row) for row in ids.tolist()],
            completion_ids=ids.tolist(),
            group_size=GROUP,
            kl=float(accelerator.reduce(kl.detach(), "mean")),  # a statistic: reduced by mean
            beta=beta[0],
        )
        applied = loop.step(observation, model=inner, optimizer=inner_optimizer)  # decides, applies, saves
        steps_log[str(step)] = {"action": applied.action, "beta": beta[0]}
        if applied.rolled_back_to is not None:
            after_rollback[str(step)] = digest(inner)
            if checkpoint is None:  # the first rollback's checkpoint, read now (keep_last may prune it)
                named = Policy()
                manager.restore(applied.rolled_back_to, named, rng=False)
                checkpoint = digest(named)
        if applied.stop:
            break
    state_dir = os.path.join(folder, "state")
    accelerator.save_state(state_dir)
    accelerator.wait_for_everyone()
    before = loop.state_dict()
    loop.rollbacks = []  # forget, then read back what save_state wrote
    accelerator.load_state(state_dir)  # every rank reads the JSON back
    record: dict[str, object] = dict(
        steps=steps_log,
        after_rollback=after_rollback,
        rank=rank,
        world=accelerator.num_processes,
        rollbacks=loop.rollbacks,
        final=digest(inner),
        gold=float(gold(torch.distributions.Categorical(logits=inner.logits).sample((256,))).mean()),
        state_round_trip=loop.state_dict() == before == read_state(state_dir),
        collectives=loop.sync.collectives,
    )
    if checkpoint is not None:
        record["checkpoint"] = checkpoint
    accelerator.end_training()
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default=None, help="shared output folder (default: a temp folder)")
    parser.add_argument("--hack-rank", type=int, default=None, help="confine the reward bug to this rank")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--json", action="store_true", help="write rank<R>.json into the folder")
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = args.folder or tempfile.mkdtemp(prefix="loopguard-accelerate-")
    record = run(folder, steps=args.steps, hack_rank=args.hack_rank)
    if args.json:
        with open(os.path.join(folder, f"rank{record['rank']}.json"), "w", encoding="utf-8") as handle:
            json.dump(record, handle)
    if record["rank"] == 0:
        events = [
            f"rolled back at step {r['step']} to step {r['restored_step']}" for r in record["rollbacks"]
        ]
        steps = record["steps"]
        last = max(steps, key=int)
        print(
            f"{record['world']} process(es), {last} steps: final beta {steps[last]['beta']:.3g}, "
            f"gold {record['gold']:.3f}; " + ("; ".join(events) or "no rollback")
        )


if __name__ == "__main__":
    main()
