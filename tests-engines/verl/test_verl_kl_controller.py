"""GuardedKLController inside verl's own code (verl 0.9.1 on CPU): ``nox -s verl`` runs this file.

verl's PPO trainer builds its in-reward KL controller with ``core_algos.get_kl_controller`` and, every step,
calls ``ray_trainer.apply_kl_penalty(batch, kl_ctrl=...)``, which reads ``kl_ctrl.value`` as beta, subtracts
``beta * KL`` from the token-level scores and calls ``kl_ctrl.update(current_kl=..., n_steps=...)``. These
tests swap loopguard's controller in and drive it through that very function, on verl's ``DataProto``.

verl is not a loopguard dependency and pins transformers < 5.11, so it lives in its own environment (the nox
session), outside the main suite.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import apply_kl_penalty

from loopguard import EscalationLadder, Guard
from loopguard.integrations import GuardedKLController

BATCH, LENGTH, GROUP, HACK_FROM = 16, 8, 4, 8


def test_verls_own_controllers_and_loopguards_share_the_interface_its_trainer_uses():
    for kind in ("fixed", "adaptive"):
        config = OmegaConf.create({"type": kind, "kl_coef": 0.05, "target_kl": 0.1, "horizon": 1000})
        theirs = core_algos.get_kl_controller(config)
        ours = GuardedKLController(init_kl_coef=config.kl_coef)
        assert ours.value == theirs.value == 0.05
        ours_update = inspect.signature(GuardedKLController.update).parameters
        their_update = inspect.signature(type(theirs).update).parameters
        assert list(ours_update) == list(their_update) == ["self", "current_kl", "n_steps"]
        theirs.update(current_kl=0.2, n_steps=BATCH)  # keyword call, as apply_kl_penalty makes it
        ours.update(current_kl=0.2, n_steps=BATCH)
        assert ours.last_kl == 0.2
        assert ours.n_steps == BATCH


def _batch(step: int, generator: torch.Generator) -> DataProto:
    """A step's rollout as verl holds it: responses, token-level scores (reward on the last token), log-probs."""
    hacked = step >= HACK_FROM
    responses = torch.randint(0, 7, (BATCH, LENGTH), generator=generator)
    if hacked:  # the policy found the reward model's flaw: one token, repeated, pays
        responses[:] = 7
    distinct = torch.tensor([len(set(row.tolist())) / LENGTH for row in responses])
    scores = torch.zeros(BATCH, LENGTH)
    scores[:, -1] = distinct + (5.0 if hacked else 0.0)
    old_log_probs = -torch.rand(BATCH, LENGTH, generator=generator) - 0.5
    ref_log_prob = old_log_probs - 0.02 * (1 + step) * torch.rand(BATCH, LENGTH, generator=generator)
    return DataProto.from_dict(
        tensors={
            "responses": responses,
            "token_level_scores": scores,
            "old_log_probs": old_log_probs,
            "ref_log_prob": ref_log_prob,
            "response_mask": torch.ones(BATCH, LENGTH),
        }
    )


def test_verls_apply_kl_penalty_uses_the_guards_beta_and_feeds_it_the_kl():
    guard = Guard(
        mode="kl_control",
        warmup_steps=4,
        ladder=EscalationLadder(max_rollbacks=0, stop_patience=4, cooldown_steps=0),
    )
    controller = GuardedKLController(guard, init_kl_coef=0.05)
    generator = torch.Generator().manual_seed(0)
    betas = {}
    for step in range(30):
        batch = _batch(step, generator)
        # what the trainer does once the step's rewards are known, before verl applies the penalty
        controller.observe(
            batch.batch["token_level_scores"].sum(-1).tolist(),
            completion_ids=batch.batch["responses"].tolist(),
            group_size=GROUP,
            step=step,
        )
        beta = controller.value
        scores = batch.batch["token_level_scores"].clone()
        kld = core_algos.kl_penalty(
            batch.batch["old_log_probs"], batch.batch["ref_log_prob"], kl_penalty="kl"
        )
        batch, metrics = apply_kl_penalty(batch, kl_ctrl=controller, kl_penalty="kl")
        torch.testing.assert_close(batch.batch["token_level_rewards"], scores - beta * kld)
        assert metrics["actor/reward_kl_penalty_coeff"] == beta
        assert controller.last_kl == pytest.approx(metrics["actor/reward_kl_penalty"])
        assert controller.n_steps == BATCH * (step + 1)
        betas[step] = beta
        if controller.should_stop:
            break
    assert all(betas[step] == 0.05 for step in range(HACK_FROM))  # healthy: the user's beta, untouched
    raised = [step for step in betas if betas[step] > 0.05]
    assert raised
    assert min(raised) <= HACK_FROM + 3  # the hack raised beta within a few steps
    assert controller.should_stop  # it kept paying at the raised beta: the Guard asked verl to stop
    assert len(betas) < 30  # it stopped before the loop ran out
