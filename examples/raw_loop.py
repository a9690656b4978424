"""A plain PyTorch policy-gradient loop with a KL penalty, guarded by loopguard (no trainer library).

Run:  python examples/raw_loop.py

The policy writes 8-token "completions" over an 8-word vocabulary (a learnable logits table, one row per
position); the reference policy is its frozen start. The gold objective pays for distinct words. From step
``BUG_STEP`` the proxy reward also pays 0.5 per ``x`` (a reward-model bug), and an unguarded policy collapses
onto ``"x x x x x x x x"``. The guarded arm runs the same loop with
:class:`loopguard.adapters.loop.LoopGuard`: each step it builds an :class:`~loopguard.Observation`, and
the Guard raises the loop's beta, rolls back to the last good checkpoint (an in-memory
:class:`~loopguard.checkpoint.CheckpointManager` that the LoopGuard fills every ``SAVE_EVERY`` steps while
the run is healthy), and stops when the hack persists. For several processes,
see ``examples/accelerate_loop.py`` (the same loop under Accelerate, one decision on every rank).
"""

from __future__ import annotations

import torch

from loopguard import EscalationLadder, Guard, Observation
from loopguard.adapters.loop import LoopGuard
from loopguard.checkpoint import CheckpointManager

WORDS = ["a", "b", "c", "d", "e", "f", "g", "x"]
LENGTH, BATCH, GROUP = 8, 32, 8
BUG_STEP, STEPS, SAVE_EVERY, LR = 30, 120, 5, 0.05
X = WORDS.index("x")


class Policy(torch.nn.Module):
    """Independent categorical choices per position (a logits table)."""

    def __init__(self) -> None:
        """Uniform logits."""
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(LENGTH, len(WORDS)))


def gold(ids: torch.Tensor) -> torch.Tensor:
    return torch.tensor([len(set(row.tolist())) / LENGTH for row in ids])


def proxy(ids: torch.Tensor, step: int) -> torch.Tensor:
    bonus = 0.5 if step >= BUG_STEP else 0.0
    return gold(ids) + bonus * (ids == X).sum(dim=1).float()


def run(guarded: bool, seed: int = 0) -> dict[str, object]:
    """Train one arm; returns the final gold and proxy rewards, the beta trace and what the guard did."""
    torch.manual_seed(seed)
    policy, reference = Policy(), Policy()
    reference.load_state_dict(policy.state_dict())
    optimizer = torch.optim.Adam(policy.parameters(), lr=LR)
    beta = [0.02]
    manager = CheckpointManager(in_memory=True, keep_last=3)
    loop = LoopGuard(
        Guard(
            mode="kl_control",
            warmup_steps=10,
            beta=beta[0],
            ladder=EscalationLadder(
                rollback_patience=10, stop_patience=10, max_rollbacks=1, cooldown_steps=20
            ),
        ),
        set_beta=lambda value: beta.__setitem__(0, value),
        checkpoint=manager,
        checkpoint_every=SAVE_EVERY,  # saved while healthy, marked good once the Guard confirms it
    )
    stopped_at = None
    betas = []
    for step in range(1, STEPS + 1):
        dist = torch.distributions.Categorical(logits=policy.logits)
        ids = dist.sample((BATCH,))  # [BATCH, LENGTH]
        rewards = proxy(ids, step)
        grouped = rewards.view(-1, GROUP)
        advantages = (grouped - grouped.mean(dim=1, keepdim=True)).view(-1)
        log_probs = dist.log_prob(ids).sum(dim=1)
        ref_log = torch.log_softmax(reference.logits, dim=-1)
        own_log = torch.log_softmax(policy.logits, dim=-1)
        kl = (
            own_log.exp() * (own_log - ref_log)
        ).sum()  # exact KL(policy || reference), summed over positions
        loss = -(advantages * log_probs).mean() + beta[0] * kl
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        betas.append(beta[0])
        if not guarded:
            continue
        observation = Observation(
            step,
            rewards.tolist(),
            completions=[" ".join(WORDS[i] for i in row) for row in ids.tolist()],
            completion_ids=ids.tolist(),
            group_size=GROUP,
            kl=float(kl.detach()),
            beta=beta[0],
        )
        applied = loop.step(observation, model=policy, optimizer=optimizer)  # decides, applies, saves
        if applied.stop:
            stopped_at = step
            break
    with torch.no_grad():
        ids = torch.distributions.Categorical(logits=policy.logits).sample((256,))
    return {
        "gold": float(gold(ids).mean()),
        "proxy": float(proxy(ids, STEPS).mean()),
        "x_share": float((ids == X).float().mean()),
        "betas": betas,
        "rollbacks": loop.rollbacks,
        "stopped_at": stopped_at,
        "restored_at_stop": None if stopped_at is None else applied.rolled_back_to,
    }


def main() -> None:
    torch.set_num_threads(1)
    plain, guarded = run(guarded=False), run(guarded=True)
    print(f"reward bug from step {BUG_STEP}; {STEPS} steps at most")
    print(f"{'arm':<10}{'gold':>8}{'proxy':>8}{'x share':>9}  what happened")
    print(
        f"{'plain':<10}{plain['gold']:>8.3f}{plain['proxy']:>8.3f}{plain['x_share']:>9.2f}  trained all steps"
    )
    events = [f"rolled back at step {r['step']} to step {r['restored_step']}" for r in guarded["rollbacks"]]
    if guarded["stopped_at"] is not None:
        events.append(
            f"stopped at step {guarded['stopped_at']} with step {guarded['restored_at_stop']}'s weights"
        )
    events.append(f"beta {guarded['betas'][0]:.3g} -> max {max(guarded['betas']):.3g}")
    print(
        f"{'guarded':<10}{guarded['gold']:>8.3f}{guarded['proxy']:>8.3f}{guarded['x_share']:>9.2f}  "
        + "; ".join(events)
    )


if __name__ == "__main__":
    main()
