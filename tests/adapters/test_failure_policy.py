"""Never silently off (real TRL GRPO trainers): what keeps loopguard from working stops the run at its start,
naming the file or setting; a failure while training runs is loud every time, or fatal with on_error="raise".
"""

import json
import os
import re
import shutil
import warnings

import pytest
from adapter_helpers import Spy, grpo_trainer, make_echo_reward

from loopguard import (
    CheckpointError,
    ConfigError,
    EscalationLadder,
    Guard,
    RewardHackMitigator,
    RLCheckpointCallback,
    read_mitigation_log,
)

SETTER_DOWN = "the cluster's parameter server is down"


def _broken_setter(value):
    raise RuntimeError(SETTER_DOWN)


def test_a_run_time_failure_is_loud_at_every_step_and_training_continues(model_dir, tokenizer, tmp_path):
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(6)], max_steps=24)
    mitigator = RewardHackMitigator(
        guard=Guard(mode="kl_control", warmup_steps=3), coefficient=(lambda: trainer.beta, _broken_setter)
    )
    reporter = Spy()
    trainer.add_callback(mitigator)
    trainer.add_callback(reporter)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # Python's default filter: a repeated identical message shows once
        trainer.train()

    assert trainer.state.global_step == 24  # training went on
    ours = [str(w.message) for w in caught if "RewardHackMitigator.on_step_end failed" in str(w.message)]
    failed_steps = [int(re.search(r"failed at step (\d+)", text).group(1)) for text in ours]
    assert len(ours) == mitigator.errors >= 5  # every failure, not the first one only
    assert failed_steps == sorted(set(failed_steps))
    assert all(SETTER_DOWN in text for text in ours)
    errors = [r for r in read_mitigation_log(tmp_path / "mitigation_log.jsonl") if r["event"] == "error"]
    assert [r["step"] for r in errors] == failed_steps  # a durable record of each
    assert all(SETTER_DOWN in r["explanation"] and r["run"] == mitigator.run_id for r in errors)
    by_step = {entry["step"]: entry for entry in trainer.state.log_history if "loss" in entry}
    assert {step: by_step[step]["loopguard/active"] for step in failed_steps} == dict.fromkeys(failed_steps, 0.0)
    assert by_step[1]["loopguard/active"] == 1.0
    assert by_step[1]["loopguard/errors"] == 0.0
    assert by_step[24]["loopguard/errors"] == float(len(failed_steps))
    assert any(logs.get("loopguard/active") == 0.0 for logs in reporter.logs)  # reporters see it too


def test_on_error_raise_makes_a_run_time_failure_fatal(model_dir, tokenizer, tmp_path):
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(6)], max_steps=24)
    trainer.add_callback(
        RewardHackMitigator(
            guard=Guard(mode="kl_control", warmup_steps=3, on_error="raise"),
            coefficient=(lambda: trainer.beta, _broken_setter),
            on_error="raise",
        )
    )
    with pytest.raises(RuntimeError, match=SETTER_DOWN):
        trainer.train()
    assert 6 <= trainer.state.global_step < 24
    with pytest.raises(ConfigError, match=re.escape("`on_error` must be one of")):
        RewardHackMitigator(on_error="ignore")


def _saved_run(model_dir, tokenizer, output_dir):
    """A 6-step run that saves checkpoint-6 with loopguard's state in it."""
    trainer = grpo_trainer(
        model_dir, tokenizer, output_dir, [make_echo_reward(10**9)], max_steps=6, save_strategy="steps", save_steps=6
    )
    trainer.add_callback(RewardHackMitigator(guard=Guard(mode="kl_control", warmup_steps=3)))
    trainer.train()
    return output_dir / "checkpoint-6"


def _with_onset(state, onset):
    """The mitigator state with the Guard's hack onset replaced."""
    state["guard"]["episode"]["onset"] = onset
    return state


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda path: path.write_text(path.read_text()[:200]), "is not a valid saved state"),
        (
            lambda path: path.write_text(json.dumps(_with_onset(json.loads(path.read_text()), "soon"))),
            "`state['episode']['onset']` must be an integer",  # the Guard names its own fields
        ),
        (
            lambda path: path.write_text(path.read_text().replace('"vote": 0.0', '"vote": NaN', 1)),
            "NaN is not JSON",
        ),
        (lambda path: (path.unlink(), os.mkfifo(path)), "is not a regular file"),
    ],
    ids=["truncated", "bad-field", "nan", "fifo"],
)
def test_a_bad_resume_state_stops_the_run_at_its_start_naming_the_file(
    model_dir, tokenizer, tmp_path, damage, reason
):
    folder = _saved_run(model_dir, tokenizer, tmp_path)
    state_file = folder / "loopguard_state.json"
    assert '"vote": 0.0' in state_file.read_text() or reason != "NaN is not JSON"
    damage(state_file)
    resumed = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(10**9)], max_steps=9)
    resumed.add_callback(RewardHackMitigator(guard=Guard(mode="kl_control", warmup_steps=3)))
    with pytest.raises(ConfigError) as info:
        resumed.train(resume_from_checkpoint=str(folder))
    message = str(info.value)
    assert f"loopguard cannot resume from {state_file}" in message
    assert reason in message
    assert f"delete {state_file} to start the Guard fresh" in message
    assert resumed.state.global_step == 6  # not one step was trained without the guard


def test_an_unreadable_store_stops_the_run_at_its_start(model_dir, tokenizer, tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / "good.json").write_text("{not json")
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(10**9)], max_steps=3)
    trainer.add_callback(
        RewardHackMitigator(
            guard=Guard(mode="kl_control", ladder=EscalationLadder(), warmup_steps=3), checkpoint=store
        )
    )
    with pytest.raises(CheckpointError, match=re.escape(f"{store / 'good.json'} is malformed")):
        trainer.train()
    assert trainer.state.global_step == 0


def test_any_exception_at_the_start_of_training_stops_it_with_a_loopguard_error(model_dir, tokenizer, tmp_path):
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(10**9)], max_steps=3)

    def unreadable():
        raise OSError("the coefficient's shared memory segment is gone")

    trainer.add_callback(RewardHackMitigator(mode="kl_control", coefficient=(unreadable, _broken_setter)))
    with pytest.raises(ConfigError, match=re.escape("RewardHackMitigator could not start")) as info:
        trainer.train()
    assert "shared memory segment is gone" in str(info.value)
    assert trainer.state.global_step == 0


def test_a_failing_checkpoint_save_is_loud_every_time(model_dir, tokenizer, tmp_path):
    store = tmp_path / "store"

    class BreakTheStore(Spy):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:  # the disk under the store goes away: a file where it was
                shutil.rmtree(store)
                store.write_text("not a directory any more")

    checkpoints = RLCheckpointCallback(save_every_steps=2, directory=store)
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(10**9)], max_steps=10)
    trainer.add_callback(BreakTheStore())
    trainer.add_callback(checkpoints)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        trainer.train()
    ours = [str(w.message) for w in caught if "RLCheckpointCallback.on_step_end failed" in str(w.message)]
    assert [int(re.search(r"at step (\d+)", m).group(1)) for m in ours] == [4, 6, 8, 10]
    assert checkpoints.errors == 4
    by_step = {e["step"]: e for e in trainer.state.log_history if "loss" in e}
    assert [by_step[s]["loopguard/checkpoint/active"] for s in (2, 3, 4, 5, 6)] == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert not (tmp_path / "mitigation_log.jsonl").exists()  # no mitigator here: the callback stood alone
