"""What the FSDP2 and DeepSpeed workers share: the policy, the guarded loop and one REINFORCE step.

The policy is a logits table per position, mixed by a linear layer that starts as the identity (two modules,
so FSDP2 shards two units). Each rank samples its own batch; from ``BUG_STEP`` the reward pays 5 per ``x`` in
rank 1's data only, so only the rank synchronisation tells rank 0 about the hack.
"""

from __future__ import annotations

import os

import torch

WORDS, LENGTH, BATCH, GROUP, X = 8, 8, 16, 8, 7
BUG_STEP = 6
POSITIONS = torch.arange(LENGTH)


class Policy(torch.nn.Module):
    """Log-probabilities per position: ``log_softmax(mix(logits[positions]))``."""

    def __init__(self) -> None:
        """Uniform logits; the mix starts as the identity."""
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(LENGTH, WORDS))
        self.mix = torch.nn.Linear(WORDS, WORDS)
        with torch.no_grad():
            self.mix.weight.copy_(torch.eye(WORDS))
            self.mix.bias.zero_()

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        """Log-probabilities of each word at each position."""
        return torch.log_softmax(self.mix(self.logits[positions]), dim=-1)


def policy_and_reference(seed: int = 0) -> tuple[Policy, Policy]:
    """A policy and a frozen copy of it (the KL reference)."""
    torch.manual_seed(seed)
    policy, reference = Policy(), Policy()
    reference.load_state_dict(policy.state_dict())
    reference.requires_grad_(False)
    return policy, reference


def guarded_loop(out: str, beta: list[float]):
    """A LoopGuard that saves every 2 steps into ``out/checkpoints``, rolls back once, then stops."""
    from loopguard import EscalationLadder, Guard
    from loopguard.adapters.loop import LoopGuard
    from loopguard.checkpoint import CheckpointManager

    manager = CheckpointManager(os.path.join(out, "checkpoints"), keep_last=3)
    ladder = EscalationLadder(rollback_patience=3, stop_patience=3, max_rollbacks=1, cooldown_steps=6)
    loop = LoopGuard(
        Guard(mode="kl_control", warmup_steps=4, beta=beta[0], ladder=ladder),
        set_beta=lambda value: beta.__setitem__(0, value),
        checkpoint=manager,
        checkpoint_every=2,
    )
    return loop, manager


def rollout(policy, reference: Policy, step: int, rank: int, beta: float):
    """Sample this rank's batch; return the REINFORCE + KL loss (to back-propagate) and the Observation."""
    from loopguard import Observation

    log_probs = policy(POSITIONS)
    sampler = torch.distributions.Categorical(logits=log_probs)
    ids = sampler.sample((BATCH,))
    gold = torch.tensor([len(set(row.tolist())) / LENGTH for row in ids])
    bugged = step >= BUG_STEP and rank == 1
    rewards = gold + (5.0 if bugged else 0.0) * (ids == X).sum(dim=1).float()
    grouped = rewards.view(-1, GROUP)
    advantages = (grouped - grouped.mean(dim=1, keepdim=True)).view(-1)
    kl = (log_probs.exp() * (log_probs - reference(POSITIONS))).sum()
    loss = -(advantages * sampler.log_prob(ids).sum(dim=1)).mean() + beta * kl
    observation = Observation(
        step,
        rewards.tolist(),
        completions=[" ".join("abcdefgx"[i] for i in row) for row in ids.tolist()],
        completion_ids=ids.tolist(),
        group_size=GROUP,
        kl=float(kl.detach()),
        beta=beta,
    )
    return loss, observation
