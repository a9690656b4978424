"""Finding the trainer a callback was added to, and moving first among callbacks, on a real Trainer."""

import gc

import pytest
from adapter_helpers import fresh_model
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from loopguard import ConfigError, RewardHackMitigator
from loopguard.adapters._binding import find_trainer, move_first


@pytest.fixture
def trainer(model_dir, tmp_path):
    return Trainer(
        model=fresh_model(model_dir),
        args=TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], disable_tqdm=True),
    )


def test_garbage_collector_fallback_finds_the_trainer_outside_its_frames(trainer):
    callback = TrainerCallback()
    trainer.add_callback(callback)
    found, resume = find_trainer(callback)  # no trainer frame on this stack: the referrers path
    assert found is trainer
    assert resume is None
    loose = TrainerCallback()
    assert find_trainer(loose) == (None, None)  # never guessed


def test_a_callback_nobody_holds_is_a_configuration_error(tmp_path):
    mitigator = RewardHackMitigator(mode="log_only")
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    gc.collect()
    with pytest.raises(
        ConfigError, match=r"could not find the trainer .* pass trainer=\.\.\. or call \.bind"
    ):
        mitigator.on_train_begin(args, TrainerState(), TrainerControl())


def test_bound_to_a_trainer_that_does_not_hold_it(trainer, tmp_path):
    mitigator = RewardHackMitigator(mode="log_only").bind(trainer)
    with pytest.raises(ConfigError, match="whose callbacks do not include it"):
        mitigator.on_train_begin(trainer.args, TrainerState(), TrainerControl())


def test_moving_first_inside_an_event_calls_every_callback_once(trainer):
    calls = []

    class Counter(TrainerCallback):
        def __init__(self, name):
            self.name = name

        def on_train_begin(self, args, state, control, **kwargs):
            calls.append(self.name)

    class MovesFirst(Counter):
        def on_train_begin(self, args, state, control, **kwargs):
            calls.append(self.name)
            move_first(trainer, self)

    for callback in (Counter("a"), MovesFirst("me"), Counter("b")):
        trainer.add_callback(callback)
    trainer.callback_handler.on_train_begin(trainer.args, TrainerState(), TrainerControl())
    assert sorted(calls) == sorted(["a", "me", "b"])
    assert len(calls) == 3
    assert trainer.callback_handler.callbacks[0].name == "me"
