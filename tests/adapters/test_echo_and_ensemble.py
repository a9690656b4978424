"""EchoTrapCallback on a real GRPO run, and signals built from the trainer's own reward functions."""

import json
import logging

import numpy as np
import pytest
from adapter_helpers import Spy, decisions, grpo_trainer, make_echo_reward

from loopguard import (
    EchoTrapCallback,
    EscalationLadder,
    GoldAudit,
    Guard,
    JudgeGap,
    RewardHackMitigator,
    RMEnsemble,
)
from loopguard.adapters.hf_trainer import EchoTrapCallback as Direct
from loopguard.detectors import DEFAULT_SIGNALS


def test_echo_trap_halts_a_real_echo_trap(model_dir, tokenizer, tmp_path):
    echo = EchoTrapCallback(threshold=0.6, halt=True)
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(4)], max_steps=60)
    trainer.add_callback(echo)
    spy = Spy()
    trainer.add_callback(spy)
    trainer.train()

    step, rate, verdict = echo.last
    assert verdict == "TRAP"
    assert rate >= 0.6
    assert trainer.state.global_step == step < 60  # halted at the first TRAP
    codes = [logs["loopguard/echo/verdict"] for logs in spy.logs if "loss" in logs]
    assert codes[-1] == 2.0
    assert codes[0] == 0.0
    assert Direct is EchoTrapCallback


def test_echo_trap_without_halt_only_reports(model_dir, tokenizer, tmp_path):
    echo = EchoTrapCallback(threshold=0.6, halt=False, n=2)
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(4)], max_steps=25)
    trainer.add_callback(echo)
    trainer.train()
    assert trainer.state.global_step == 25
    assert echo.last[2] == "TRAP"


def test_rm_ensemble_from_the_trainers_reward_functions_with_a_watched_member(model_dir, tokenizer, tmp_path):
    # Two reward functions; the second has weight 0 in training (watched, not trained on). They agree until
    # the proxy's bug appears at step 8, then disagree on every "x" the policy writes.
    def judge(completions, **kwargs):
        return [len(set(text.split())) / 8 for text in completions]

    proxy = make_echo_reward(8)
    mitigator = RewardHackMitigator(
        guard=Guard([RMEnsemble(members=("echo_reward", "judge"))], mode="log_only", warmup_steps=4)
    )
    trainer = grpo_trainer(
        model_dir, tokenizer, tmp_path, [proxy, judge], max_steps=30, reward_weights=[1.0, 0.0]
    )
    trainer.add_callback(mitigator)
    trainer.train()

    records = decisions(tmp_path)
    disagreement = [r["signals"].get("rm_ensemble.disagreement") for r in records]
    assert all(value is not None for value in disagreement)
    assert max(disagreement[:7]) < 1e-9  # identical members before the bug
    assert max(disagreement[-5:]) > 0.1
    assert records[-1]["verdict"] == "HACK"
    # the proxy fed to the Guard is TRL's weighted sum: the watched judge contributes nothing
    assert records[-1]["reward_mean"] == pytest.approx(np.mean(list(trainer._logs["rewards"]["echo_reward"])))


def test_gold_audit_with_a_judge(model_dir, tokenizer, tmp_path):
    calls = []

    def gold_fn(prompts, completions):
        calls.append(len(completions))
        return [len(set(text.split())) / 8 for text in completions]

    mitigator = RewardHackMitigator(
        guard=Guard(
            ["repetition", GoldAudit(gold_fn=gold_fn, every=2, sample_size=8)],
            mode="log_only",
            warmup_steps=4,
        )
    )
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(6)], max_steps=30)
    trainer.add_callback(mitigator)
    trainer.train()
    assert calls
    assert set(calls) == {8}
    assert len(calls) == 15
    records = decisions(tmp_path)
    assert records[-1]["signals"]["gold"] >= 0.3  # gold fell while the proxy rose


class _Lines(logging.Handler):
    """The loopguard logger's lines."""

    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def lines():
    handler = _Lines()
    logger = logging.getLogger("loopguard")
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)


def test_the_one_liner_reads_watched_reward_functions_as_judges(model_dir, tokenizer, tmp_path, lines):
    # the reward pays for every "x" from step 8; the watched judge (weight 0) does not
    def judge(completions, **kwargs):
        return [len(set(text.split())) / 8 for text in completions]

    mitigator = RewardHackMitigator()
    trainer = grpo_trainer(
        model_dir, tokenizer, tmp_path, [make_echo_reward(8), judge], max_steps=24, reward_weights=[1.0, 0.0],
        log_level="info",
    )  # fmt: skip
    trainer.add_callback(mitigator)
    trainer.train()

    detector = next(d for d in mitigator.guard.detectors if isinstance(d, JudgeGap))
    assert detector.members == ("echo_reward", "judge")
    assert [d.name for d in mitigator.guard.detectors] == [*DEFAULT_SIGNALS, "judge_gap", "takeover"]
    assert any("reading the watched reward functions judge (weight 0) as judges of echo_reward" in line for line in lines)
    records = decisions(tmp_path)
    # the judges the reference sample settled: said once, on the console and in the log, on the same step
    said = [line for line in lines if line.startswith("loopguard: step") and "judge_gap: on the reference" in line]
    noted = [(r["step"], note) for r in records for note in (r.get("extra") or {}).get("notes", [])]
    noted = [(step, note) for step, note in noted if note.startswith("judge_gap:")]
    assert len(said) == 1, said
    assert len(noted) == 1, noted
    assert said[0] == f"loopguard: step {noted[0][0]}: {noted[0][1]}."
    assert "correlates with echo_reward" in said[0]
    assert "judge (" in said[0]
    # and the end-of-run summary (what `loopguard report` prints) lists it with its step
    summary = next(line for line in lines if line.startswith("loopguard summary:"))
    assert "\nNotes:\n" in summary
    assert f"\n  - step {noted[0][0]}: {noted[0][1]}\n" in summary
    gap = {r["step"]: r["signals"].get("judge_gap.gap") for r in records}
    before = [value for step, value in gap.items() if step < 8 and value is not None]
    assert before  # read after the reference sample (3 steps) and the window (2)
    assert max(before) < 0.2  # the reward and its judge agree before the flaw
    after = [value for step, value in gap.items() if step >= 8 and value is not None]
    assert max(after) >= 0.4  # HACK level: the reward pays for what the judge does not confirm


def test_no_judges_without_a_single_trained_function(model_dir, tokenizer, tmp_path, lines):
    def judge(completions, **kwargs):
        return [len(set(text.split())) / 8 for text in completions]

    def second(completions, **kwargs):
        return [0.1 * len(text.split()) for text in completions]

    trained_both = RewardHackMitigator()
    trainer = grpo_trainer(
        model_dir, tokenizer, tmp_path / "a", [make_echo_reward(8), judge], max_steps=1, reward_weights=[1.0, 1.0],
        log_level="info",
    )  # fmt: skip
    trainer.add_callback(trained_both)
    trainer.train()
    assert [d.name for d in trained_both.guard.detectors] == [*DEFAULT_SIGNALS, "takeover"]  # nothing watched

    two_trained = RewardHackMitigator()
    trainer = grpo_trainer(
        model_dir, tokenizer, tmp_path / "b", [make_echo_reward(8), second, judge], max_steps=1,
        reward_weights=[1.0, 0.5, 0.0], log_level="info",
    )  # fmt: skip
    trainer.add_callback(two_trained)
    trainer.train()
    assert [d.name for d in two_trained.guard.detectors] == [*DEFAULT_SIGNALS, "takeover"]
    assert any(
        "watched reward functions (judge; weight 0) are not read as judges: the trainer trains on 2" in line
        for line in lines
    )


def test_the_one_liners_judges_resume_with_their_reference_sample(model_dir, tokenizer, tmp_path):
    def judge(completions, **kwargs):
        return [len(set(text.split())) / 8 for text in completions]

    def run(max_steps, **overrides):
        mitigator = RewardHackMitigator()
        trainer = grpo_trainer(
            model_dir, tokenizer, tmp_path, [make_echo_reward(100), judge], max_steps=max_steps,
            reward_weights=[1.0, 0.0], **overrides,
        )  # fmt: skip
        trainer.add_callback(mitigator)
        return mitigator, trainer

    _, trainer = run(8, save_strategy="steps", save_steps=8)
    trainer.train()
    saved = json.loads((tmp_path / "checkpoint-8" / "loopguard_state.json").read_text())
    memory = saved["guard"]["detectors"]["judge_gap"]["memory"]
    assert memory["frozen"]  # the reference sample (3 batches of 16) was closed and saved
    assert len(memory["reference"][0]) == 48

    second, resumed = run(10, save_strategy="no")
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-8"))
    assert [d.name for d in second.guard.detectors][-2:] == ["judge_gap", "takeover"]
    after = second.guard.state_dict()
    assert after["seen"] == saved["guard"]["seen"] + 2
    assert after["detectors"]["judge_gap"]["memory"]["reference"] == memory["reference"]  # not learnt again


def test_a_run_saved_without_judges_resumes_as_it_was_saved(model_dir, tokenizer, tmp_path, lines):
    # a checkpoint whose Guard had no judges (the run had no watched function then); a watched one added on
    # resume does not change the Guard under the saved state
    def judge(completions, **kwargs):
        return [len(set(text.split())) / 8 for text in completions]

    trainer = grpo_trainer(
        model_dir, tokenizer, tmp_path, [make_echo_reward(100)], max_steps=4, save_strategy="steps", save_steps=4
    )
    trainer.add_callback(RewardHackMitigator())
    trainer.train()

    mitigator = RewardHackMitigator()
    resumed = grpo_trainer(
        model_dir, tokenizer, tmp_path, [make_echo_reward(100), judge], max_steps=5, reward_weights=[1.0, 0.0],
        save_strategy="no", log_level="info",
    )  # fmt: skip
    resumed.add_callback(mitigator)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert [d.name for d in mitigator.guard.detectors] == [*DEFAULT_SIGNALS, "takeover"]
    assert mitigator.guard.seen == 5  # the saved state was restored, and the run went on from it
    assert any("the state being resumed was saved without judges" in line for line in lines)


def test_a_one_liner_state_saved_without_the_unscored_takeover_resumes_as_it_was_saved(
    model_dir, tokenizer, tmp_path, lines
):
    # the one-liner of an earlier loopguard: the default signals and the default ladder, nothing that names
    # n-grams for the targeted rung; the bare one-liner resumes its checkpoint as it was saved
    trainer = grpo_trainer(
        model_dir, tokenizer, tmp_path, [make_echo_reward(100)], max_steps=4, save_strategy="steps", save_steps=4
    )
    trainer.add_callback(RewardHackMitigator(guard=Guard(mode="kl_control", ladder=EscalationLadder())))
    trainer.train()

    mitigator = RewardHackMitigator()
    resumed = grpo_trainer(
        model_dir, tokenizer, tmp_path, [make_echo_reward(100)], max_steps=5, save_strategy="no", log_level="info"
    )
    resumed.add_callback(mitigator)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert [d.name for d in mitigator.guard.detectors] == list(DEFAULT_SIGNALS)
    assert mitigator.guard.seen == 5
    assert mitigator.guard.ladder is not None
    assert any("saved without the unscored takeover" in line for line in lines)
