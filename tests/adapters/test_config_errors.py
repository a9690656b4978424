"""Configuration errors fail fast: at construction, or at the start of training before the first step."""

import copy
import re

import pytest
from adapter_helpers import grpo_trainer, make_echo_reward

import loopguard
from loopguard import (
    CheckpointError,
    ConfigError,
    EscalationLadder,
    GoldAudit,
    Guard,
    InfoRM,
    LoopguardTypeError,
    RewardHackMitigator,
    RLCheckpointCallback,
)


def test_beta_zero_without_a_reference_model_fails_at_train_start(model_dir, tokenizer, tmp_path):
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(5)], beta=0.0, max_steps=3)
    assert trainer.ref_model is None  # TRL builds no reference model when beta == 0
    trainer.add_callback(RewardHackMitigator(mode="kl_control"))
    with pytest.raises(ConfigError, match=r"no reference model .* Start with a small beta such as 1e-3"):
        trainer.train()
    assert trainer.state.global_step == 0


@pytest.mark.parametrize("mode", ["pid_lagrangian", "adaptive_kl"])
def test_every_kl_changing_mode_refuses_beta_zero(model_dir, tokenizer, tmp_path, mode):
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(5)], beta=0.0, max_steps=3)
    trainer.add_callback(RewardHackMitigator(mode=mode))
    with pytest.raises(ConfigError, match=r"trainer\.beta is 0\.0"):
        trainer.train()


def test_info_rm_without_embeddings():
    with pytest.raises(ConfigError, match="signal 'info_rm' needs embeddings"):
        RewardHackMitigator(guard=Guard(["repetition", "info_rm"]))
    with pytest.raises(ConfigError, match=r"pass InfoRM\(embed_fn=\.\.\.\)"):
        RewardHackMitigator(guard=Guard([InfoRM(from_observations=True)]))


def test_gold_without_a_judge():
    with pytest.raises(ConfigError, match=r"pass GoldAudit\(gold_fn=\.\.\.\)"):
        RewardHackMitigator(guard=Guard([GoldAudit()]))


def test_unknown_signal():
    with pytest.raises(ConfigError, match=r"`signals` must name known signals .*got 'sentiment'"):
        RewardHackMitigator(guard=Guard(["sentiment"]))


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: RewardHackMitigator(guard=Guard(warmup_steps=True)),
            "`warmup_steps` must be an integer (not bool), got True.",
        ),
        (
            lambda: RewardHackMitigator(checkpoint_every=True),
            "`checkpoint_every` must be an integer (not bool), got True.",
        ),
        (
            lambda: RewardHackMitigator(group_size=False),
            "`group_size` must be an integer (not bool), got False.",
        ),
        (
            lambda: RewardHackMitigator(guard=Guard(halt_on_hack=1)),
            "`halt_on_hack` must be a bool, got 1 of type int.",
        ),
        (
            lambda: RewardHackMitigator(guard=Guard(ladder=1)),
            "`ladder` must be an EscalationLadder or None, got int.",
        ),
    ],
)
def test_bool_for_a_number_and_number_for_a_bool(build, message):
    with pytest.raises(LoopguardTypeError) as error:
        build()
    assert str(error.value) == message


def test_the_one_liner_protects_with_its_own_run_scoped_store(model_dir, tokenizer, tmp_path):
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(5)], max_steps=2)
    mitigator = RewardHackMitigator()
    trainer.add_callback(mitigator)
    trainer.train()
    ladder = mitigator.guard.ladder
    assert ladder == EscalationLadder()  # rollback, targeted penalty and stop, with their defaults
    assert ladder.targeted
    assert ladder.reanchor
    store = mitigator.checkpoints
    assert store.in_memory  # a tiny model in one process: its checkpoints live in memory
    assert store.good_steps() == (0,)  # the starting policy, the target of a flaw present from step 0
    # only what a rollback restores: no RNG states and no mitigator state, which only a resume would read
    restored = store.restore(0, copy.deepcopy(trainer.model), rng=False)
    assert restored.step == 0
    assert restored.extra_state is None
    with pytest.raises(CheckpointError, match=re.escape("has no RNG state (saved with rng=False)")):
        store.restore(0, copy.deepcopy(trainer.model))
    assert getattr(trainer.reward_funcs[0], "__loopguard_penalised__", False)  # ready for the targeted rung
    assert trainer.reward_funcs[0].__name__ == "echo_reward"
    assert mitigator.guard.trainer_advantage_scale == 1.0  # GRPO normalises its advantages


def test_beta_only_control_is_an_explicit_opt_out(tmp_path):
    assert RewardHackMitigator(rollback=False).guard.ladder is None
    assert RewardHackMitigator(mode="pid_lagrangian", rollback=False).guard.ladder is None
    assert RewardHackMitigator(mode="log_only").guard.ladder is None
    with pytest.raises(ConfigError, match=re.escape("`rollback` must be None when a guard is given")):
        RewardHackMitigator(guard=Guard(), rollback=False)
    with pytest.raises(LoopguardTypeError, match=re.escape("`rollback` must be a bool, got 1 of type int.")):
        RewardHackMitigator(rollback=1)


def test_rollback_with_an_rl_checkpoint_callback_is_a_source(model_dir, tokenizer, tmp_path):
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(5)], max_steps=2)
    mitigator = RewardHackMitigator(guard=Guard(ladder=EscalationLadder(), warmup_steps=3))
    trainer.add_callback(mitigator)
    trainer.add_callback(RLCheckpointCallback(save_every_steps=1, directory=tmp_path / "store"))
    trainer.train()
    assert mitigator.checkpoints.directory == (tmp_path / "store").resolve()


def test_other_configuration_errors(tmp_path):
    with pytest.raises(ConfigError, match="`checkpoint` is only used for rollbacks"):
        RewardHackMitigator(checkpoint=tmp_path, rollback=False)
    with pytest.raises(ConfigError, match="`checkpoint` is only used for rollbacks"):
        RewardHackMitigator(checkpoint=tmp_path, guard=Guard())
    with pytest.raises(ConfigError, match="`checkpoint` is only used for rollbacks"):
        RewardHackMitigator(checkpoint=tmp_path, guard=Guard(ladder=EscalationLadder(max_rollbacks=0)))
    with pytest.raises(ConfigError, match="`controller` must be None with mode='log_only'"):
        RewardHackMitigator(guard=Guard(mode="log_only", controller=loopguard.BangBang()))
    with pytest.raises(ConfigError, match="`ladder` must be None with mode='log_only'"):
        RewardHackMitigator(guard=Guard(mode="log_only", ladder=EscalationLadder()))
    with pytest.raises(LoopguardTypeError, match=r"`taps\[0\]` must be wrapped with loopguard.tap"):
        RewardHackMitigator(taps=[lambda prompts, completions, **kw: [0.0]])
    with pytest.raises(LoopguardTypeError, match="`coefficient` must be"):
        RewardHackMitigator(coefficient=("kl_coef", 0.1))
    with pytest.raises(LoopguardTypeError, match="`checkpoint` must be a CheckpointManager or a directory"):
        RewardHackMitigator(checkpoint=3, guard=Guard(ladder=EscalationLadder()))


def test_mode_and_guard_are_exclusive():
    with pytest.raises(ConfigError, match=r"^`mode` must be None when a guard is given") as error:
        RewardHackMitigator(mode="log_only", guard=Guard(mode="log_only"))
    assert "configure the mode on the Guard" in str(error.value)
    with pytest.raises(ConfigError, match="`mode`"):
        RewardHackMitigator("kl_control", guard=Guard())


def test_guard_must_be_a_guard():
    with pytest.raises(LoopguardTypeError, match=r"^`guard` must be a loopguard\.Guard, got "):
        RewardHackMitigator(guard="x")
    with pytest.raises(LoopguardTypeError, match="`guard`"):
        RewardHackMitigator(guard={"mode": "log_only"})


def test_unknown_ensemble_members_fail_at_train_start(model_dir, tokenizer, tmp_path):
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(5)], max_steps=2)
    trainer.add_callback(
        RewardHackMitigator(guard=Guard([loopguard.RMEnsemble(members=("echo_reward", "judge"))]))
    )
    with pytest.raises(
        ConfigError, match=r"must name reward functions of the trainer \(echo_reward\).*'judge'"
    ):
        trainer.train()


def test_an_ensemble_and_judges_over_different_functions_fail_at_train_start(model_dir, tokenizer, tmp_path):
    def judge(completions, **kwargs):
        return [0.0 for _ in completions]

    trainer = grpo_trainer(
        model_dir, tokenizer, tmp_path, [make_echo_reward(5), judge], max_steps=2, reward_weights=[1.0, 0.0]
    )
    guard = Guard([loopguard.RMEnsemble(members=("echo_reward", "judge")), loopguard.JudgeGap(members=2)])
    trainer.add_callback(RewardHackMitigator(guard=guard))
    with pytest.raises(
        ConfigError, match=r"must name the same reward functions .* got \('echo_reward', 'judge'\) and 2"
    ):
        trainer.train()
    unknown = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(5)], max_steps=2)
    unknown.add_callback(
        RewardHackMitigator(guard=Guard([loopguard.JudgeGap(members=("echo_reward", "judge"))]))
    )
    with pytest.raises(
        ConfigError, match=r"^`JudgeGap\(members=...\)` must name reward functions of the trainer"
    ):
        unknown.train()


def test_the_own_store_rule_memory_for_one_small_process_disk_otherwise(tmp_path, monkeypatch):
    import torch

    from loopguard.adapters import _respond

    model = torch.nn.Linear(10, 10)  # 110 float32 parameters: 440 bytes, plus 880 bytes of Adam moments
    assert _respond.checkpoint_bytes(model) == 110 * 4 * 3
    frozen = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 2)).to(torch.bfloat16)
    frozen[0].requires_grad_(False)  # saved, no moments; the trained layer's moments are bfloat16 too
    assert _respond.checkpoint_bytes(frozen) == 110 * 2 + 22 * 2 * 3
    manager, why = _respond.default_manager(model, world_size=1, directory=str(tmp_path / "store"))
    assert manager.in_memory
    assert "in memory" in why
    manager, why = _respond.default_manager(model, world_size=2, directory=str(tmp_path / "store"))
    assert not manager.in_memory  # several processes must all read what a rollback restores
    assert "several processes" in why
    monkeypatch.setattr(_respond, "IN_MEMORY_LIMIT", 3 * 1320 - 1)  # 3 checkpoints no longer fit
    manager, why = _respond.default_manager(model, world_size=1, directory=str(tmp_path / "other"))
    assert not manager.in_memory
    assert "on disk" in why


def test_a_shaped_reward_that_hides_its_raw_reward_fails_at_train_start(model_dir, tokenizer, tmp_path):
    shaped = loopguard.shape_reward(make_echo_reward(5), "length", 0.5, target_length=2, log_to_trainer=False)
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [shaped], max_steps=3)
    trainer.add_callback(RewardHackMitigator(mode="log_only"))
    with pytest.raises(ConfigError, match=r"'echo_reward' is a shape_reward\(\.\.\., log_to_trainer=False\)"):
        trainer.train()
    assert trainer.state.global_step == 0
