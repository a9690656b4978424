"""RewardHackMitigator on TRL's real GRPOTrainer (tiny GPT-2 from a config, CPU, no hub).

The hack is real: the proxy reward starts paying for the word ``x`` at a given step (see conftest's echo
hack) and the policy learns to repeat it within about ten steps. Nothing in the Guard's input is simulated:
it reads the completions, rewards, KL and entropy the trainer computed.
"""

import json
import logging
import math
import re
import warnings
import zlib

import numpy as np
import pytest
import torch
import transformers
from adapter_helpers import Spy, decisions, grpo_trainer, make_echo_reward
from transformers import TrainerCallback

from loopguard import (
    BangBang,
    EscalationLadder,
    Guard,
    Observation,
    RewardHackMitigator,
    StateError,
    shape_reward,
)
from loopguard.adapters._console import progress_bar
from loopguard.checkpoint import CheckpointManager
from loopguard.detectors import RMEnsemble


def _records(output_dir):
    return decisions(output_dir)


class Tracker(TrainerCallback):
    """Stands for transformers' TrackioCallback, whose ``_trackio`` is the trackio module: records its alerts.

    (trackio and W&B cannot run in this offline test environment; loopguard calls exactly this interface,
    ``alert(title=..., text=..., level=AlertLevel.WARN)``, which both libraries document.)
    """

    class AlertLevel:
        WARN = "warn-level"

    def __init__(self):
        self.alerts = []
        self._trackio = self

    def alert(self, *, title, text, level):
        self.alerts.append((title, text, level))


class LoopguardLines(logging.Handler):
    """Collects what the ``loopguard`` logger lets through while training runs: ``(level, message)`` pairs."""

    def __init__(self):
        super().__init__(level=logging.NOTSET)
        self.records = []

    @property
    def messages(self):
        return [message for _level, message in self.records]

    def emit(self, record):
        self.records.append((record.levelno, record.getMessage()))

    def __enter__(self):
        logging.getLogger("loopguard").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("loopguard").removeHandler(self)


def test_add_callback_kl_control_raises_beta_after_the_trip_and_relaxes_after_it_clears(
    model_dir, tokenizer, tmp_path
):
    # The reward bug is live for steps [12, 24): long enough for the policy to collapse into "x x x ...".
    # The run reports to TensorBoard and shows its progress bar, as a user's run does.
    mitigator = RewardHackMitigator(
        guard=Guard(mode="kl_control", controller=BangBang(gain=3.0, memory_half_life=0), warmup_steps=6)
    )
    trainer = grpo_trainer(
        model_dir,
        tokenizer,
        tmp_path,
        [make_echo_reward(12, 24)],
        max_steps=60,
        beta=0.05,
        report_to=["tensorboard"],
        logging_steps=5,
        disable_tqdm=False,
        log_level="info",  # these tests silence transformers (adapter_helpers); this run asks for INFO
    )
    spy = Spy(probe=lambda t, _state: progress_bar(t).postfix)
    spy.trainer = trainer
    trainer.add_callback(mitigator)  # exactly the line users write: no trainer= argument
    trainer.add_callback(spy)
    verbosity = transformers.logging.get_verbosity()
    try:
        with LoopguardLines() as lines:
            trainer.train()
    finally:
        transformers.logging.set_verbosity(verbosity)  # the trainer set transformers' verbosity to INFO

    assert mitigator.trainer is trainer
    records = _records(tmp_path)
    assert [r["step"] for r in records] == list(range(1, 61))  # one decision per generation batch
    first_hack = next(r["step"] for r in records if r["verdict"] == "HACK")
    first_raise = next(r["step"] for r in records if r["action"] == "raise_beta")
    assert 12 < first_hack <= first_raise  # nothing before the bug; beta rises only after the trip
    peak = max(spy.betas.values())
    assert peak >= 0.5  # 0.05 * 3^k up to the 1.0 ceiling
    last_hack = max(r["step"] for r in records if r["verdict"] == "HACK")
    assert last_hack < 45  # the echo trap cleared after the bug went away
    lowered = [r["step"] for r in records if r["action"] == "lower_beta"]
    assert lowered
    assert min(lowered) > last_hack
    assert trainer.beta == pytest.approx(0.05)  # relaxed back to the user's beta, never below
    assert min(spy.betas.values()) == pytest.approx(0.05)
    for r in records:  # the decision was applied to the trainer at the step it was taken
        assert spy.betas[r["step"]] == pytest.approx(r["beta_after"])
    raise_record = next(r for r in records if r["action"] == "raise_beta")
    # the first raise is sized from the step's KL (GRPO normalises advantages: scale 1), not one gain step
    text = raise_record["explanation"]
    kl = float(re.search(r"at the measured KL ([0-9.e-]+) nats/token", text).group(1))
    assert raise_record["beta_after"] == pytest.approx(min(1.0, max(0.15, 0.5 / math.sqrt(2 * kl))), rel=1e-3)
    assert "Raised beta 0.05 -> " in text

    # What the run showed: a status line at the end of the warm-up and at each verdict change (WARN and HACK
    # as warnings), the verdict in the progress bar, an end-of-run summary.
    assert lines.messages[0].startswith("loopguard: watching repetition, diversity, length")
    judged = next(r["step"] for r in records if "warming up" not in r["explanation"])
    assert (logging.INFO, f"loopguard: warm-up done, judging from step {judged}: OK.") in lines.records
    first_alarm = next(r for r in records if r["verdict"] != "OK" and r["step"] >= judged)
    prefix = f"loopguard: step {first_alarm['step']}: OK -> {first_alarm['verdict']} (vote "
    assert any(level == logging.WARNING and m.startswith(prefix) for level, m in lines.records), (
        lines.messages
    )
    raised = next(m for m in lines.messages if m.startswith(f"loopguard: step {first_raise}: "))
    assert raised.endswith(f"raised beta 0.05 -> {raise_record['beta_after']:.3g}")
    raises = sum(r["action"] == "raise_beta" for r in records)
    assert sum("raised beta" in m for m in lines.messages) < raises  # a line per run of raises, not per raise
    assert len(lines.records) < 15, lines.messages  # 60 steps: a few lines, not one per step
    postfix = f"loopguard {raise_record['verdict']} beta={raise_record['beta_after']:.3g}"
    assert spy.probes[first_raise] == postfix
    assert spy.probes[3] == "loopguard warming up beta=0.05"
    level, summary = lines.records[-1]
    assert level == logging.WARNING  # the run reached HACK
    assert summary.startswith(
        f"loopguard summary:\nMitigation log (run {mitigator.run_id}): 60 steps observed"
    )
    assert f"HACK first at step {first_hack}" in summary
    assert logging.getLogger("loopguard").level == logging.NOTSET  # no logger configuration was changed

    # TensorBoard got the loopguard/* scalars and the status lines as text, at the logging steps
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = list(tmp_path.rglob("events.out.tfevents.*"))
    board = EventAccumulator(str(events.parent), size_guidance={"scalars": 0, "tensors": 0})
    board.Reload()
    assert sorted({e.step for e in board.Scalars("train/loopguard/beta")}) == list(range(5, 61, 5))
    assert max(e.value for e in board.Scalars("train/loopguard/verdict")) == 2.0
    statuses = {
        e.step: e.tensor_proto.string_val[0].decode()
        for e in board.Tensors("train/loopguard/status/text_summary")
    }
    assert any("-> HACK" in text for text in statuses.values()), statuses
    assert f"step {judged}: warm-up done, OK" in statuses[5 * math.ceil(judged / 5)]
    assert max(len(text) for text in statuses.values()) <= 100  # transformers prints no longer string


def test_log_only_never_changes_beta_and_log_level_error_silences_it(model_dir, tokenizer, tmp_path):
    mitigator = RewardHackMitigator(guard=Guard(mode="log_only", warmup_steps=6), alerts=False)
    tracker = Tracker()
    trainer = grpo_trainer(
        model_dir,
        tokenizer,
        tmp_path,
        [make_echo_reward(10)],
        max_steps=30,
        log_level="error",
        callbacks=[tracker],
    )
    spy = Spy()
    spy.trainer = trainer
    trainer.add_callback(mitigator)
    trainer.add_callback(spy)
    with LoopguardLines() as lines:
        trainer.train()
    assert lines.records == []  # the run read HACK (below), and log_level="error" kept every line back
    assert tracker.alerts == []  # alerts=False

    records = _records(tmp_path)
    assert any(r["verdict"] == "HACK" for r in records)  # it saw the hack ...
    assert {r["action"] for r in records} == {"none"}  # ... and did nothing about it
    assert set(spy.betas.values()) == {0.01}
    assert trainer.beta == 0.01
    assert {r["beta_after"] for r in records} == {0.01}
    # the trainer's own per-step numbers are recorded next to each decision
    reported = records[-1]["extra"]["adapter"]["trainer_metrics"]
    assert {"reward_std", "frac_reward_zero_std", "completions/clipped_ratio"} <= set(reported)


def test_each_generation_batch_is_observed_once(model_dir, tokenizer, tmp_path):
    # num_iterations=2: TRL generates on steps 1, 3, 5, ... and reuses each batch for a second update.
    # log_only also runs on GRPO's default beta of 0 (there is no KL term to control).
    mitigator = RewardHackMitigator(guard=Guard(mode="log_only", warmup_steps=3))
    trainer = grpo_trainer(
        model_dir, tokenizer, tmp_path, [make_echo_reward(10**9)], max_steps=10, num_iterations=2, beta=0.0
    )
    trainer.add_callback(mitigator)
    trainer.train()
    assert [r["step"] for r in _records(tmp_path)] == [1, 3, 5, 7, 9]
    assert mitigator.guard.state_dict()["seen"] == 5


def test_loopguard_metrics_reach_every_log_before_the_reporters(model_dir, tokenizer, tmp_path):
    reporter = Spy()  # stands for TensorBoard / W&B: registered at construction, i.e. before the mitigator
    trainer = grpo_trainer(
        model_dir,
        tokenizer,
        tmp_path,
        [make_echo_reward(8)],
        max_steps=12,
        logging_steps=3,
        callbacks=[reporter],
    )
    mitigator = RewardHackMitigator(guard=Guard(mode="kl_control", warmup_steps=3))
    trainer.add_callback(mitigator)
    trainer.train()

    train_logs = [logs for logs in reporter.logs if "loss" in logs]
    assert len(train_logs) == 4  # logging steps 3, 6, 9, 12
    expected = {
        "loopguard/beta",
        "loopguard/verdict",
        "loopguard/vote",
        "loopguard/action",
        "loopguard/warming_up",
        "loopguard/rollbacks",
        "loopguard/score/repetition",
    }
    for logs in train_logs:
        assert expected <= set(logs), sorted(expected - set(logs))
        # a score is there once its signal measured something: diversity needs the warm-up's baseline
        assert ("loopguard/score/diversity" in logs) == (logs["loopguard/warming_up"] == 0.0)
        assert logs["loopguard/verdict"] in (0.0, 1.0, 2.0)
        assert logs["loopguard/action"] in (0.0, 1.0, 2.0, 3.0, 4.0)
    assert train_logs[-1]["loopguard/beta"] == trainer.beta
    assert train_logs[0]["loopguard/warming_up"] == 1.0  # step 3 is the last of 3 warm-up batches
    assert train_logs[-1]["loopguard/warming_up"] == 0.0
    history = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert all("loopguard/vote" in entry for entry in history)  # trainer_state.json keeps them too


def test_the_guard_scores_the_unshaped_reward(model_dir, tokenizer, tmp_path):
    def proxy(completions, **kwargs):
        return [float(len(text.split())) for text in completions]

    shaped = shape_reward(proxy, "length", 0.5, target_length=2)
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [shaped], max_steps=4)
    trainer.add_callback(RewardHackMitigator(guard=Guard(mode="log_only", warmup_steps=3)))
    trainer.train()
    shaped_means = [sum(values) / len(values) for values in [list(trainer._logs["rewards"]["proxy"])]]
    records = _records(tmp_path)
    logged = [entry for entry in trainer.state.log_history if "proxy/unshaped_mean" in entry]
    assert len(records) == len(logged) == 4
    for record, entry in zip(records, logged, strict=True):
        # the Guard scores the unshaped word count the shaping wrapper logged, not the shaped reward...
        assert record["reward_mean"] == pytest.approx(entry["proxy/unshaped_mean"])
        # ...and measures lengths on the trainer's own token ids (EOS included), as TRL's length metric does
        assert record["length_mean"] == pytest.approx(entry["completions/mean_length"])
    assert shaped_means[0] < records[-1]["reward_mean"]  # what TRL trained on was lower: the penalty


def test_the_guard_reads_the_trainers_own_token_ids_truncated_completions_included(
    model_dir, tokenizer, tmp_path
):
    # TRL zeroes the whole mask of a truncated completion when asked to; the Guard still counts its tokens
    trainer = grpo_trainer(
        model_dir,
        tokenizer,
        tmp_path,
        [make_echo_reward(10**9)],
        max_steps=3,
        mask_truncated_completions=True,
    )
    trainer.add_callback(RewardHackMitigator(guard=Guard(mode="log_only", warmup_steps=3)))
    trainer.train()
    records = _records(tmp_path)
    logged = [entry for entry in trainer.state.log_history if "completions/mean_length" in entry]
    assert len(records) == len(logged) == 3
    assert any(entry["completions/clipped_ratio"] > 0 for entry in logged)  # some rows were truncated
    for record, entry in zip(records, logged, strict=True):
        assert record["length_mean"] == pytest.approx(entry["completions/mean_length"])
        assert not any("encoded from the texts" in note for note in record.get("batch_notes", []))


def test_bind_and_trainer_argument(model_dir, tokenizer, tmp_path):
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(10**9)], max_steps=2)
    mitigator = RewardHackMitigator(guard=Guard(mode="log_only", warmup_steps=3), trainer=trainer)
    assert mitigator.trainer is trainer
    trainer.add_callback(mitigator)
    trainer.train()
    assert trainer.callback_handler.callbacks[0] is mitigator  # moved before the reporting callbacks
    assert len(_records(tmp_path)) == 2
    other = RewardHackMitigator(mode="log_only").bind(trainer)
    assert other.trainer is trainer


def test_pid_lagrangian_rollback_restores_exact_tensors_then_stops_after_max_rollbacks(
    model_dir, tokenizer, tmp_path
):
    def snapshot(trainer, state):
        return {
            "weights": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
            "buffer_dropped": trainer._buffered_inputs is None,
        }

    mitigator = RewardHackMitigator(
        guard=Guard(
            mode="pid_lagrangian",
            ladder=EscalationLadder(rollback_patience=2, stop_patience=2, max_rollbacks=1, cooldown_steps=0),
            warmup_steps=4,
        ),
        checkpoint=tmp_path / "rollback",
        checkpoint_every=2,
    )
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(8)], max_steps=60)
    spy = Spy(probe=snapshot)
    spy.trainer = trainer
    trainer.add_callback(mitigator)
    trainer.add_callback(spy)
    trainer.train()

    records = _records(tmp_path)
    rollback = next(r for r in records if r["action"] == "rollback")
    restored = rollback["extra"]["adapter"]["rolled_back_to"]
    assert restored < rollback["step"]
    assert restored % 2 == 0
    assert mitigator.rollbacks == [{"step": rollback["step"], "restored_step": restored}]
    # the weights right after the rollback are the checkpoint's, tensor for tensor
    after = spy.probes[rollback["step"]]
    saved = spy.probes[restored]["weights"]
    assert after["weights"].keys() == saved.keys()
    assert all(torch.equal(after["weights"][k], saved[k]) for k in saved)
    assert after["buffer_dropped"]  # the next batch is generated by the restored policy
    # ... and the rollback checkpoint on disk holds the mitigator's state
    manager = CheckpointManager(tmp_path / "rollback")
    assert restored in manager.steps()

    stop = records[-1]
    assert stop["action"] == "stop"
    assert trainer.state.global_step == stop["step"] < 60
    assert "rollback budget is used up (1 of 1)" in stop["explanation"]
    assert "What you can change" in stop["explanation"]
    # restore_on_stop: the trainer ends with a good checkpoint's weights, not the hacked ones
    at_stop = stop["extra"]["adapter"]["restored_at_stop"]
    final = trainer.model.state_dict()
    assert all(torch.equal(final[k], spy.probes[at_stop]["weights"][k]) for k in final)


def test_resume_from_checkpoint_restores_the_guard_state(model_dir, tokenizer, tmp_path):
    def make():
        return RewardHackMitigator(
            guard=Guard(mode="kl_control", controller=BangBang(gain=3.0), warmup_steps=4)
        )

    first = make()
    trainer = grpo_trainer(
        model_dir,
        tokenizer,
        tmp_path,
        [make_echo_reward(6)],
        max_steps=20,
        save_strategy="steps",
        save_steps=20,
    )
    trainer.add_callback(first)
    trainer.train()
    saved = json.loads((tmp_path / "checkpoint-20" / "loopguard_state.json").read_text())
    assert saved["beta"] == trainer.beta > 0.01  # the hack tripped and beta was raised before the save
    assert saved["guard"] == first.guard.state_dict()

    second = make()
    spy = Spy(probe=lambda t, s: second.guard.state_dict())
    resumed = grpo_trainer(
        model_dir, tokenizer, tmp_path, [make_echo_reward(6)], max_steps=22, save_strategy="no"
    )
    spy.trainer = resumed
    resumed.add_callback(second)
    resumed.add_callback(spy)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-20"))
    assert spy.begin == {"beta": saved["beta"], "step": 20}  # the same beta from the first step on
    state_after_21 = spy.probes[21]
    assert state_after_21["seen"] == saved["guard"]["seen"] + 1  # counters continued, not restarted
    assert (
        state_after_21["detectors"]["repetition"]["baseline"]
        == saved["guard"]["detectors"]["repetition"]["baseline"]
    )


def _tripped_mitigator():
    """A mitigator (no trainer) whose Guard is in a hack episode that began at step 6.

    The loop starts at step 5; the median of the last three scores crosses the HACK level one step later.
    """
    mitigator = RewardHackMitigator(guard=Guard(mode="log_only", warmup_steps=3))
    for step in range(8):
        completions = ["x y " * 6] * 8 if step >= 5 else [f"w{step} w{i} w{i + 1} w{i + 2}" for i in range(8)]
        rewards = [2.0 + 0.1 * i for i in range(8)] if step >= 5 else [0.1 * (i % 4) for i in range(8)]
        mitigator.guard.step(Observation(step, rewards, completions=completions, group_size=4))
    assert mitigator.guard.onset == 6
    return mitigator


def test_the_mitigator_state_keeps_the_onset_in_the_guard():
    state = json.loads(json.dumps(_tripped_mitigator().state_dict()))
    assert state["version"] == 3
    assert set(state) == {"kind", "version", "mode", "beta", "guard", "rollbacks", "run"}
    assert state["guard"]["episode"]["onset"] == 6
    twin = RewardHackMitigator(guard=Guard(mode="log_only", warmup_steps=3))
    twin.load_state_dict(state)
    assert twin.guard.onset == 6


def test_a_version_2_mitigator_state_still_loads_and_gives_its_onset_to_the_guard():
    state = json.loads(json.dumps(_tripped_mitigator().state_dict()))
    guard_state = {
        key: value
        for key, value in state["guard"].items()
        if key not in ("episode", "reference_batches", "penalty", "candidates", "ceiling_steps", "pricing")
    }
    guard_state["config"] = {
        key: value for key, value in guard_state["config"].items() if key != "reference_steps"
    }
    guard_state["detectors"] = {
        name: {key: value for key, value in memory.items() if key not in ("reference", "evidence")}
        for name, memory in guard_state["detectors"].items()
    }
    old = {**state, "version": 2, "onset": 4, "guard": {**guard_state, "version": 1}}  # as loopguard wrote it
    twin = RewardHackMitigator(guard=Guard(mode="log_only", warmup_steps=3))
    twin.load_state_dict(old)
    assert twin.guard.onset == 4
    assert twin.state_dict()["version"] == 3
    assert "onset" not in twin.state_dict()
    assert twin.state_dict()["guard"]["episode"]["onset"] == 4
    with pytest.raises(StateError, match=re.escape("got missing ['onset'], unexpected []")):
        RewardHackMitigator(guard=Guard(mode="log_only", warmup_steps=3)).load_state_dict(
            {**state, "version": 2}
        )
    with pytest.raises(StateError, match=re.escape("unexpected ['onset']")):
        RewardHackMitigator(guard=Guard(mode="log_only", warmup_steps=3)).load_state_dict(
            {**state, "onset": 4}
        )


def test_the_one_liner_prices_the_echo_penalises_it_and_rolls_back_with_a_re_anchored_reference(
    model_dir, tokenizer, tmp_path
):
    """The echo bonus pays from step 0: the default ladder switches a targeted penalty on, the trained reward
    drops below the raw one the Guard keeps reading, and the rollback re-anchors TRL's reference model."""
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [make_echo_reward(0)], max_steps=22, beta=0.01)
    mitigator = RewardHackMitigator()
    trained = []
    spy = Spy(probe=lambda t, _state: float(np.mean(t._logs["rewards"]["echo_reward"])))
    spy.trainer = trainer
    tracker = Tracker()
    trainer.add_callback(mitigator)
    trainer.add_callback(spy)
    trainer.add_callback(tracker)
    trainer.train()
    records = _records(tmp_path)
    # the tracker was alerted at the first HACK of the episode and at the rollback, with the explanations
    first_hack = next(r for r in records if r["verdict"] == "HACK")
    rolled = next(r for r in records if r["action"] == "rollback")
    hack_alerts = [a for a in tracker.alerts if a[0] == f"loopguard: HACK at step {first_hack['step']}"]
    assert hack_alerts == [(hack_alerts[0][0], first_hack["explanation"], "warn-level")]
    assert (
        f"loopguard: rollback at step {rolled['step']}",
        rolled["explanation"],
        "warn-level",
    ) in tracker.alerts
    shaped = next(r for r in records if "Targeted penalty on the trained reward" in r["explanation"])
    penalty = mitigator.guard.penalty
    assert penalty is not None
    assert shaped["step"] < 15  # after shape_patience hacking steps, long before the rollback
    # the explanation quotes each token it charges as the trainer's tokenizer writes it
    charged = sorted({t.token for t in penalty.targets if t.token is not None})
    assert charged
    for token in charged:
        assert f"token {token} {json.dumps(tokenizer.decode([token]), ensure_ascii=False)} " in shaped["explanation"]
    for record in records:
        if record["step"] > shaped["step"]:
            trained.append(
                record["reward_mean"] - spy.probes[record["step"]]
            )  # the Guard reads the raw reward
    assert min(trained) >= -1e-6  # the penalty only ever lowers the trained reward
    assert max(trained) > 0.5  # and while the echo lasts, by a lot
    assert trainer.reward_funcs[0].loopguard_seconds > 0.0  # its own time in TRL's reward step, for benchmarks
    rollback = next(r for r in records if r["action"] == "rollback")
    assert (
        rollback["extra"]["adapter"]["rolled_back_to"] == 0
    )  # the starting policy: the flaw paid from step 0
    assert rollback["extra"]["adapter"]["reanchored"] is True
    assert "The restored policy becomes the KL reference." in rollback["explanation"]


def test_the_guard_scores_the_unshaped_reward_when_the_ladder_wraps_a_shaped_one(
    model_dir, tokenizer, tmp_path
):
    def proxy(completions, **kwargs):
        return [float(len(text.split())) for text in completions]

    shaped = shape_reward(proxy, "length", 0.5, target_length=2)
    trainer = grpo_trainer(model_dir, tokenizer, tmp_path, [shaped], max_steps=3)
    trainer.add_callback(RewardHackMitigator(guard=Guard(ladder=EscalationLadder(), warmup_steps=3)))
    trainer.train()
    assert getattr(trainer.reward_funcs[0], "__loopguard_penalised__", False)
    logged = [
        entry["proxy/unshaped_mean"] for entry in trainer.state.log_history if "proxy/unshaped_mean" in entry
    ]
    records = _records(tmp_path)
    assert len(records) == len(logged) == 3
    for record, unshaped in zip(records, logged, strict=True):  # the raw word count, not the penalised reward
        assert record["reward_mean"] == pytest.approx(unshaped)


class _ReferenceProbe(TrainerCallback):
    """Added after the mitigator: TRL's PEFT reference (the "ref" adapter) against the base model and the
    policy's adapter, at train start and after every rollback."""

    def __init__(self, mitigator):
        self.mitigator, self.trainer = mitigator, None
        self.start = None
        self.after_rollback = []

    def _logits(self, adapter):
        from trl.trainer.utils import use_adapter

        model = self.trainer.model
        ids = torch.tensor([[3, 4, 5, 6, 7]])
        training = model.training
        model.eval()  # no dropout: two forwards of the same weights give the same logits
        try:
            with torch.no_grad(), use_adapter(model, adapter):
                return model(input_ids=ids).logits
        finally:
            model.train(training)

    def on_train_begin(self, args, state, control, **kwargs):
        model = self.trainer.model
        self.start = {
            "adapters": list(model.peft_config),
            "reference_is_base": torch.equal(self._logits("ref"), self._logits(None)),
            "ref_trainable": any(p.requires_grad for n, p in model.named_parameters() if ".ref." in n),
        }

    def on_step_end(self, args, state, control, **kwargs):
        rollbacks = self.mitigator.rollbacks
        if rollbacks and rollbacks[-1]["step"] == state.global_step:
            params = dict(self.trainer.model.named_parameters())
            pairs = [
                (p, params[n.replace(".default.", ".ref.")]) for n, p in params.items() if ".default." in n
            ]
            self.after_rollback.append(
                {
                    "ref_equals_policy_adapter": all(torch.equal(a, b) for a, b in pairs),
                    "reference_is_policy": torch.equal(self._logits("ref"), self._logits("default")),
                    "reference_is_base": torch.equal(self._logits("ref"), self._logits(None)),
                }
            )


def test_a_lora_policys_rollback_re_anchors_trls_reference_adapter(model_dir, tokenizer, tmp_path):
    """TRL reads a PEFT policy's reference from its "ref" adapter when it has one, else from the base model.
    The mitigator adds a "ref" adapter equal to the base at train start and copies the restored adapter
    into it at a rollback: the reference becomes the restored policy, as TRL's ref_model does for a full one.
    (The hack is the proxy parting from a second reward model from step 6, so the rollback does not wait
    for a LoRA policy to learn an echo.)"""
    peft = pytest.importorskip("peft")
    from adapter_helpers import fresh_model, gold, grpo_config, prompts_dataset
    from trl import GRPOTrainer

    def judge(completions, **kwargs):
        return gold(completions)

    def proxy(completions, trainer_state=None, **kwargs):
        step = 0 if trainer_state is None else trainer_state.global_step
        scores = gold(completions)
        if step < 6:
            return scores
        return [
            score + 2.0 * (zlib.crc32(text.encode()) % 7) / 7.0
            for score, text in zip(scores, completions, strict=True)
        ]

    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], task_type="CAUSAL_LM")
    trainer = GRPOTrainer(
        model=fresh_model(model_dir),
        reward_funcs=[proxy, judge],
        args=grpo_config(tmp_path, max_steps=14, beta=0.01, learning_rate=0.1, reward_weights=[1.0, 0.0]),
        train_dataset=prompts_dataset(),
        processing_class=tokenizer,
        peft_config=lora,
    )
    ladder = EscalationLadder(rollback_patience=2, max_rollbacks=1, cooldown_steps=50, stop_patience=50)
    guard = Guard([RMEnsemble(members=("proxy", "judge"))], mode="kl_control", ladder=ladder, warmup_steps=3)
    mitigator = RewardHackMitigator(guard=guard, checkpoint_every=2)
    probe = _ReferenceProbe(mitigator)
    probe.trainer = trainer
    trainer.add_callback(mitigator)
    trainer.add_callback(probe)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    assert not [w for w in caught if "no separate reference model" in str(w.message)]
    assert probe.start == {"adapters": ["default", "ref"], "reference_is_base": True, "ref_trainable": False}
    records = _records(tmp_path)
    (rollback,) = [r for r in records if r["action"] == "rollback"]
    assert rollback["extra"]["adapter"]["rolled_back_to"] > 0
    assert rollback["extra"]["adapter"]["reanchored"] is True
    (after,) = probe.after_rollback
    assert after["ref_equals_policy_adapter"]
    assert after["reference_is_policy"]
    assert not after["reference_is_base"]  # the restored adapter had trained: the reference really moved
    assert list(trainer.model.peft_config) == ["default"]  # the adapter it added is gone when training ends
