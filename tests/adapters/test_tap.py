"""loopguard.tap: same behaviour and name as the wrapped reward function, sync or async, calls recorded."""

import asyncio
import functools
import inspect
import warnings

import pytest
import torch

import loopguard
from loopguard import LoopguardTypeError, shape_reward, tap
from loopguard.adapters import TapRecord


def correct(prompts, completions, **kwargs):
    """Pays 1 for a 4."""
    return [float("4" in text) for text in completions]


def test_keeps_name_and_behaviour_and_records_the_call():
    tapped = tap(correct)
    assert tapped.__name__ == "correct"
    assert tapped.__doc__ == correct.__doc__
    assert tapped.tapped is correct
    state = type("State", (), {"global_step": 7})()
    out = tapped(
        prompts=["2+2="] * 2, completions=["4", "5"], completion_ids=[[9], [10]], trainer_state=state
    )
    assert out == [1.0, 0.0]
    (record,) = tapped.records()
    assert record == TapRecord(
        index=1,
        global_step=7,
        prompts=("2+2=", "2+2="),
        completions=("4", "5"),
        completion_ids=((9,), (10,)),
        rewards=(1.0, 0.0),
        unshaped=None,
    )
    tapped(["q"], ["4"])  # positional call: prompts, completions
    assert [r.index for r in tapped.records(after=1)] == [2]
    tapped.clear()
    assert tapped.records() == []


def test_async_functions_stay_async():
    async def judge(prompts, completions, **kwargs):
        return [0.5 for _ in completions]

    tapped = tap(judge)
    assert inspect.iscoroutinefunction(tapped)
    assert asyncio.run(tapped(prompts=["p"], completions=["c"])) == [0.5]
    assert tapped.records()[0].rewards == (0.5,)


def test_partials_and_callable_instances_are_named_like_trl_names_them():
    class Judge:
        def __call__(self, prompts, completions, **kwargs):
            return [None, float("nan")]

    assert tap(functools.partial(correct)).__name__ == "correct"
    tapped = tap(Judge())
    assert tapped.__name__ == "Judge"
    assert tapped(prompts=["a", "b"], completions=["x", "y"]) == [
        None,
        pytest.approx(float("nan"), nan_ok=True),
    ]
    assert tapped.records()[0].rewards == (None, None)  # None and NaN are "not applicable"


def test_chat_completions_are_recorded_as_text():
    tapped = tap(correct)
    tapped(
        prompts=[[{"role": "user", "content": "2+2?"}]],
        completions=[[{"role": "assistant", "content": "4"}]],
    )
    record = tapped.records()[0]
    assert record.prompts == ("2+2?",)
    assert record.completions == ("4",)


def test_a_shaped_reward_records_its_unshaped_rewards():
    def length(prompts, completions, **kwargs):
        return [float(len(text.split())) for text in completions]

    tapped = tap(shape_reward(length, "length", 0.5, target_length=1))
    shaped = tapped(prompts=["p", "p"], completions=["a", "a b c"])
    record = tapped.records()[0]
    assert record.rewards == tuple(shaped)
    assert record.unshaped == (1.0, 3.0)
    assert record.proxy() == (1.0, 3.0)


def test_recording_never_breaks_the_reward_call():
    def odd(prompts, completions, **kwargs):
        return ["high", "low"]  # not numbers: the tap cannot record them, the trainer will complain itself

    tapped = tap(odd)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tapped(prompts=["a", "b"], completions=["x", "y"]) == ["high", "low"]
        tapped(prompts=["a", "b"], completions=["x", "y"])
    assert len([w for w in caught if "could not record a call" in str(w.message)]) == 1
    assert tapped.records() == []


def test_keeps_only_the_most_recent_calls():
    tapped = tap(correct, max_calls=2)
    for _ in range(5):
        tapped(prompts=["p"], completions=["4"])
    assert [r.index for r in tapped.records()] == [4, 5]


def test_rejects_what_it_cannot_tap():
    with pytest.raises(LoopguardTypeError, match="`reward_fn` must be callable"):
        tap("correct")
    with pytest.raises(LoopguardTypeError, match="got a torch module"):
        tap(torch.nn.Linear(2, 1))
    with pytest.raises(LoopguardTypeError, match="`max_calls` must be an integer"):
        tap(correct, max_calls=True)
    assert loopguard.tap is tap
