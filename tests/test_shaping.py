"""Tests for loopguard.shaping: bounded, strictly increasing shaping that keeps the raw reward visible."""

import asyncio
import functools
import inspect
import itertools
import math
import re
import subprocess
import sys
import threading

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError
from loopguard.shaping import (
    MAX_SENTINEL_LENGTH,
    MAX_SENTINELS,
    ShapingConfig,
    ShapingRecord,
    shape_reward,
)

# --------------------------------------------------------------------------------------------------
# helpers written for the tests (independent of the code under test)


def constant_reward(value=1.0):
    def reward(prompts, completions, **kwargs):
        """Constant reward."""
        return [value] * len(completions)

    return reward


def ones(prompts, completions, **kwargs):
    """Give every completion reward 1."""
    return [1.0] * len(completions)


def words(count, word="w"):
    return " ".join([word] * count)


def ref_length_penalty(length, target, scale, strength):
    excess = max(0.0, length - target)
    return strength * excess / (excess + scale)


def ref_repetition_rate(tokens, n):
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    if not grams:
        return 0.0
    seen, repeats = set(), 0
    for gram in grams:
        if gram in seen:
            repeats += 1
        seen.add(gram)
    return repeats / len(grams)


def ref_sentinel_count(text, sentinels):
    total = 0
    for sentinel in sentinels:
        start = 0
        while True:
            found = text.find(sentinel, start)
            if found < 0:
                break
            total += 1
            start = found + len(sentinel)
    return total


def group_zscore(values):
    values = np.asarray(values, dtype=float)
    return (values - values.mean()) / (values.std() + 1e-4)


def call(shaped, completions, **kwargs):
    return shaped(prompts=["p"] * len(completions), completions=completions, **kwargs)


# --------------------------------------------------------------------------------------------------
# reference values


def test_length_penalty_hand_computed():
    shaped = shape_reward(ones, "length", 0.5, target_length=4)  # scale defaults to 4
    result = call(shaped, [words(2), words(4), words(8), words(12)])
    # excess 0, 0, 4, 8 -> 0, 0, 0.5*4/8 = 0.25, 0.5*8/12 = 1/3
    assert result == pytest.approx([1.0, 1.0, 0.75, 1 - 1 / 3])
    assert shaped.shaping.scale == 4.0


def test_length_penalty_matches_reference_on_random_lengths():
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 300, size=40).tolist()
    shaped = shape_reward(constant_reward(2.0), "length", 0.7, target_length=50, scale=20.0)
    result = call(shaped, [words(n) for n in lengths])
    expected = [2.0 - ref_length_penalty(n, 50, 20.0, 0.7) for n in lengths]
    assert result == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_target_length_zero_defaults_scale_to_one():
    shaped = shape_reward(ones, "length", 1.0, target_length=0)
    assert shaped.shaping.scale == 1.0
    assert call(shaped, ["", "a", "a b a"]) == pytest.approx([1.0, 0.5, 0.25])


def test_repetition_penalty_matches_naive_reference():
    rng = np.random.default_rng(1)
    texts = [" ".join(rng.choice(list("abc"), size=int(rng.integers(0, 25)))) for _ in range(30)]
    texts += ["x y " * 50, "a b c d e f", ""]
    for n in (1, 2, 3):
        shaped = shape_reward(ones, "repetition", 0.5, n=n)
        result = call(shaped, texts)
        expected = [1.0 - 0.5 * ref_repetition_rate(text.split(), n) for text in texts]
        assert result == pytest.approx(expected, abs=1e-12)


def test_repetition_hand_computed():
    shaped = shape_reward(ones, "repetition", 1.0)  # bigrams
    # "a b a b": ab, ba, ab -> 1 repeat of 3
    assert call(shaped, ["a b a b", "a b c"]) == pytest.approx([1 - 1 / 3, 1.0])
    assert shaped.shaping.n == 2


def test_sentinel_hand_computed():
    shaped = shape_reward(ones, "sentinel", 1.0, sentinels=("<think></think>", "As an AI"))
    texts = ["fine", "<think></think>", "<think></think><think></think> As an AI", "as an ai"]
    assert call(shaped, texts) == pytest.approx([1.0, 0.5, 0.25, 1.0])  # counts 0, 1, 3, 0 (case-sensitive)
    assert shaped.last_call.features == (0.0, 1.0, 3.0, 0.0)
    assert shaped.last_call.measure == "occurrences"


def test_sentinel_counts_match_reference():
    rng = np.random.default_rng(2)
    sentinels = ("aa", "ab", "b")
    texts = ["".join(rng.choice(list("ab "), size=int(rng.integers(0, 30)))) for _ in range(50)]
    shaped = shape_reward(ones, "sentinel", 2.0, sentinels=sentinels)
    call(shaped, texts)
    expected = [float(ref_sentinel_count(text, sentinels)) for text in texts]
    assert shaped.last_call.features == tuple(expected)
    assert shaped.last_call.penalties == pytest.approx([2.0 * c / (c + 1) for c in expected])


def test_sentinel_list_is_accepted_and_stored_as_tuple():
    shaped = shape_reward(ones, "sentinel", 1.0, sentinels=["<x>"])
    assert shaped.shaping.sentinels == ("<x>",)


def test_config_penalty_hand_computed():
    config = ShapingConfig(kind="length", strength=1.0, target_length=10, scale=10.0, unit="auto")
    np.testing.assert_allclose(config.penalty([0, 10, 20, 40]), [0.0, 0.0, 0.5, 0.75])
    repetition = ShapingConfig(kind="repetition", strength=0.4, n=2, unit="words")
    np.testing.assert_allclose(repetition.penalty([0.0, 0.5, 1.0]), [0.0, 0.2, 0.4])
    assert config.penalty([]).shape == (0,)


# --------------------------------------------------------------------------------------------------
# properties: bounds and strict monotonicity


@settings(max_examples=50, deadline=None)
@given(
    target=st.integers(0, 1000),
    scale=st.floats(1.0, 1e4),
    strength=st.floats(1e-3, 1e3),
    a=st.integers(0, 1_000_000),
    b=st.integers(0, 1_000_000),
)
def test_length_penalty_bounded_and_strictly_increasing(target, scale, strength, a, b):
    config = ShapingConfig(kind="length", strength=strength, target_length=target, scale=scale, unit="auto")
    lo, hi = sorted((a, b))
    p_lo, p_hi = config.penalty([lo, hi])
    assert 0.0 <= p_lo <= strength
    assert 0.0 <= p_hi <= strength
    assert not math.isnan(p_lo)
    assert not math.isnan(p_hi)
    if hi <= target:
        assert p_lo == p_hi == 0.0
    elif lo < hi:
        assert p_hi > p_lo  # strictly increasing above the target: no flat region
    if lo > target:
        assert p_lo > 0.0


@settings(max_examples=50, deadline=None)
@given(strength=st.floats(1e-3, 1e3), a=st.integers(0, 10**6), b=st.integers(0, 10**6))
def test_sentinel_penalty_bounded_and_strictly_increasing(strength, a, b):
    config = ShapingConfig(kind="sentinel", strength=strength, sentinels=("s",))
    lo, hi = sorted((a, b))
    p_lo, p_hi = config.penalty([lo, hi])
    assert 0.0 <= p_lo <= p_hi < strength
    if lo < hi:
        assert p_hi > p_lo
    assert (p_lo == 0.0) == (lo == 0)


@settings(max_examples=50, deadline=None)
@given(strength=st.floats(1e-3, 1e3), a=st.floats(0.0, 1.0), b=st.floats(0.0, 1.0))
def test_repetition_penalty_bounded_and_strictly_increasing_in_rate(strength, a, b):
    config = ShapingConfig(kind="repetition", strength=strength, n=2, unit="auto")
    lo, hi = sorted((a, b))
    p_lo, p_hi = config.penalty([lo, hi])
    assert 0.0 <= p_lo <= p_hi <= strength * (1 + 1e-12)
    if lo < hi:
        assert p_hi > p_lo


word_lists = st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=30)


@settings(max_examples=50, deadline=None)
@given(
    texts=st.lists(word_lists, min_size=1, max_size=8),
    raw=st.floats(-10, 10),
    strength=st.floats(0.01, 5.0),
    kind=st.sampled_from(["length", "repetition", "sentinel"]),
)
def test_wrapper_penalty_in_bounds_and_matches_shaped(texts, raw, strength, kind):
    extra = {"length": {"target_length": 5}, "repetition": {}, "sentinel": {"sentinels": ("a b",)}}[kind]
    shaped = shape_reward(constant_reward(raw), kind, strength, **extra)
    result = call(shaped, [" ".join(t) for t in texts])
    record = shaped.last_call
    for value, penalty in zip(result, record.penalties, strict=True):
        assert 0.0 <= penalty <= strength
        assert value == pytest.approx(raw - penalty)
        assert not math.isnan(value)
    assert record.raw == (raw,) * len(texts)


# --------------------------------------------------------------------------------------------------
# the saturation regression (the predecessor's penalty was flat beyond 32 words)


def test_long_completions_get_meaningfully_different_penalties():
    shaped = shape_reward(ones, "length", 0.5, target_length=50)
    call(shaped, [words(100), words(400)])
    p100, p400 = shaped.last_call.penalties
    assert p400 - p100 >= 0.25 * 0.5  # 0.5 * 350/400 - 0.5 * 50/100 = 0.1875


def test_group_normalisation_keeps_shorter_above_longer():
    lengths = [10, 30, 50, 80, 100, 200, 400, 800]  # a GRPO group of 8, equal raw rewards
    completions = [words(n) for n in lengths]
    shaped = shape_reward(ones, "length", 0.5, target_length=50)
    z = dict(zip(lengths, group_zscore(call(shaped, completions)), strict=True))

    assert z[10] == z[30] == z[50]  # no penalty at or below the target
    above = [z[n] for n in lengths if n >= 50]
    assert all(a > b for a, b in itertools.pairwise(above))  # strictly ordered past the target
    assert z[100] - z[400] > 0.5  # a real advantage gap, not a rounding artefact

    # The predecessor's map (linear up to 32 words, then flat) loses exactly this ordering.
    saturating = [1.0 - 0.5 * min(n, 32) / 32 for n in lengths]
    z_old = dict(zip(lengths, group_zscore(saturating), strict=True))
    assert z_old[100] == z_old[400] == z_old[800]


def test_group_normalisation_orders_sentinel_counts():
    shaped = shape_reward(ones, "sentinel", 0.5, sentinels=("<x>",))
    completions = ["<x>" * c for c in (0, 1, 2, 4, 8, 16, 32, 64)]
    z = group_zscore(call(shaped, completions))
    assert all(a > b for a, b in itertools.pairwise(z))


# --------------------------------------------------------------------------------------------------
# identity: name, docs, async-ness (with TRL's own helper functions, read from its installed source)


def _trl_helpers():
    """TRL's own reward-function naming and async detection (the rules the wrapper must satisfy).

    TRL 1.9 added ``get_callable_name`` / ``is_async_callable`` (huggingface/trl#6313: partials and callable
    instances); before, GRPOTrainer named a reward function by its ``__name__`` and found async ones with
    ``inspect.iscoroutinefunction``, which the wrapper must satisfy just the same.
    """
    utils = pytest.importorskip("trl.trainer.utils", reason="trl is part of the `hf` extra")
    name = getattr(utils, "get_callable_name", None) or (lambda fn: fn.__name__)
    return name, getattr(utils, "is_async_callable", None) or inspect.iscoroutinefunction


def test_name_doc_and_wrapped_are_preserved():
    get_callable_name, is_async_callable = _trl_helpers()
    shaped = shape_reward(ones, "length", 0.5, target_length=3)
    assert shaped.__name__ == "ones"
    assert shaped.__qualname__ == ones.__qualname__
    assert shaped.__doc__ == "Give every completion reward 1."
    assert shaped.__module__ == ones.__module__
    assert shaped.__wrapped__ is ones
    assert shaped.unshaped is ones
    assert get_callable_name(shaped) == "ones"
    assert not is_async_callable(shaped)
    assert not inspect.iscoroutinefunction(shaped)


def test_partial_and_callable_instance_names_follow_trl():
    get_callable_name, _ = _trl_helpers()

    def scaled(prompts, completions, factor, **kwargs):
        return [factor] * len(completions)

    class Judge:
        """A callable judge."""

        def __call__(self, prompts, completions, **kwargs):
            return [0.0] * len(completions)

    names_any_callable = hasattr(pytest.importorskip("trl.trainer.utils"), "get_callable_name")  # TRL 1.9+
    for fn, name in ((functools.partial(scaled, factor=2.0), "scaled"), (Judge(), "Judge")):
        shaped = shape_reward(fn, "sentinel", 0.5, sentinels=("x",))
        assert shaped.__name__ == name
        assert get_callable_name(shaped) == name  # before TRL 1.9 only the wrapper has a name TRL can read
        if names_any_callable:
            assert get_callable_name(fn) == name  # TRL 1.9+ names the bare callable the same way
    assert shape_reward(Judge(), "sentinel", 0.5, sentinels=("x",)).__doc__ == "A callable judge."
    assert call(
        shape_reward(functools.partial(scaled, factor=2.0), "sentinel", 1.0, sentinels=("x",)), ["x"]
    ) == [1.5]


async def async_ones(prompts, completions, **kwargs):
    """Async reward."""
    await asyncio.sleep(0)
    return [1.0] * len(completions)


def test_async_function_gives_async_wrapper():
    _, is_async_callable = _trl_helpers()
    shaped = shape_reward(async_ones, "length", 0.5, target_length=2)
    assert inspect.iscoroutinefunction(shaped)
    assert is_async_callable(shaped)
    assert shaped.__name__ == "async_ones"
    assert shaped.__doc__ == "Async reward."
    result = asyncio.run(shaped(prompts=["p", "p"], completions=["a b", "a b c d"]))
    assert result == pytest.approx([1.0, 0.75])
    assert shaped.last_call.raw == (1.0, 1.0)


def test_async_partial_and_async_callable_instance_give_async_wrappers():
    class AsyncJudge:
        async def __call__(self, prompts, completions, **kwargs):
            return [2.0] * len(completions)

    for fn in (functools.partial(async_ones), AsyncJudge()):
        shaped = shape_reward(fn, "sentinel", 1.0, sentinels=("!",))
        assert inspect.iscoroutinefunction(shaped)
        result = asyncio.run(shaped(prompts=["p"], completions=["!"]))
        assert result == [shaped.last_call.raw[0] - 0.5]


# --------------------------------------------------------------------------------------------------
# None / non-finite passthrough


def test_none_rewards_pass_through_without_penalty():
    def sometimes(prompts, completions, **kwargs):
        return [None, 1.0, None]

    shaped = shape_reward(sometimes, "length", 0.5, target_length=1)
    result = call(shaped, [words(10), words(10), "a"])
    assert result[0] is None
    assert result[2] is None
    assert result[1] == pytest.approx(1.0 - 0.5 * 9 / 10)
    assert shaped.last_call.penalties == (None, pytest.approx(0.45), None)
    np.testing.assert_array_equal(np.isnan(shaped.last_call.raw_rewards()), [True, False, True])


def test_nan_and_inf_rewards_pass_through_unchanged():
    def odd(prompts, completions, **kwargs):
        return [math.nan, math.inf, -math.inf]

    shaped = shape_reward(odd, "sentinel", 1.0, sentinels=("x",))
    result = call(shaped, ["x", "x", "x"])
    assert math.isnan(result[0])
    assert result[1] == math.inf
    assert result[2] == -math.inf
    assert shaped.last_call.penalties == (None, None, None)


def test_numpy_outputs_are_accepted():
    def array_reward(prompts, completions, **kwargs):
        return np.array([1.0, 2.0], dtype=np.float32)

    def scalar_list(prompts, completions, **kwargs):
        return [np.float64(1.0), np.int64(3)]

    shaped = shape_reward(array_reward, "sentinel", 1.0, sentinels=("x",))
    assert call(shaped, ["x", ""]) == pytest.approx([0.5, 2.0])
    assert all(type(v) is float for v in shaped.last_call.raw)
    assert call(shape_reward(scalar_list, "sentinel", 1.0, sentinels=("x",)), ["", "x"]) == [1.0, 2.5]


def test_empty_batch_returns_empty_list():
    shaped = shape_reward(ones, "repetition", 0.5)
    assert shaped(prompts=[], completions=[]) == []
    assert shaped.last_call.features == ()


# --------------------------------------------------------------------------------------------------
# conversational completions and token ids


def test_conversational_completions_use_assistant_content():
    completions = [
        [{"role": "assistant", "content": "a b c d e f"}],
        [
            {"role": "assistant", "content": "a b", "tool_calls": []},
            {"role": "tool", "content": "x " * 100},
            {"role": "assistant", "content": "c d"},
        ],
        [{"role": "assistant", "content": None}],
        [{"role": "assistant", "content": [{"type": "text", "text": "a b c"}, {"type": "image"}]}],
        [{}],
    ]
    shaped = shape_reward(ones, "length", 1.0, target_length=2, scale=2.0)
    call(shaped, completions)
    assert shaped.last_call.features == (6.0, 4.0, 0.0, 3.0, 0.0)
    assert shaped.last_call.measure == "words"

    sentinel = shape_reward(ones, "sentinel", 1.0, sentinels=("b\nc", "x"))
    call(sentinel, completions)
    # assistant messages are joined by a newline ("a b" + "c d" holds "b\nc"); the tool's "x"s do not count
    assert sentinel.last_call.features == (0.0, 1.0, 0.0, 0.0, 0.0)


def test_completion_ids_measure_tokens():
    shaped = shape_reward(ones, "length", 0.5, target_length=3)
    result = call(shaped, ["one word", "two words"], completion_ids=[[1, 2, 3, 4, 5, 6], [7, 8]])
    assert shaped.last_call.measure == "tokens"
    assert shaped.last_call.features == (6.0, 2.0)
    assert result == pytest.approx([1.0 - 0.5 * 3 / 6, 1.0])


def test_completion_ids_as_2d_array_and_repetition_on_tokens():
    shaped = shape_reward(ones, "repetition", 1.0)
    ids = np.array([[5, 6, 5, 6, 5, 6], [1, 2, 3, 4, 5, 6]])
    call(shaped, ["unrelated text", "unrelated text"], completion_ids=ids)
    expected = [ref_repetition_rate(row.tolist(), 2) for row in ids]
    assert shaped.last_call.features == pytest.approx(expected)
    assert shaped.last_call.measure == "tokens"


def test_unit_words_ignores_ids_and_unit_tokens_requires_them():
    by_words = shape_reward(ones, "length", 0.5, target_length=1, unit="words")
    call(by_words, ["a b c"], completion_ids=[[1]])
    assert by_words.last_call.features == (3.0,)
    assert by_words.last_call.measure == "words"

    by_tokens = shape_reward(ones, "length", 0.5, target_length=1, unit="tokens")
    with pytest.raises(
        InputError, match=re.escape("`completion_ids` must be passed when `unit` is 'tokens', got None.")
    ):
        call(by_tokens, ["a b c"])
    with pytest.raises(
        InputError, match=re.escape("`completion_ids` must be passed when `unit` is 'tokens'")
    ):
        call(by_tokens, ["a b c"], completion_ids=None)


# --------------------------------------------------------------------------------------------------
# observability


def test_last_call_record_and_call_index():
    class State:
        global_step = 7

    shaped = shape_reward(constant_reward(3.0), "length", 1.0, target_length=1)
    assert shaped.last_call is None
    call(shaped, ["a b"])
    first = shaped.last_call
    assert isinstance(first, ShapingRecord)
    assert first.call_index == 1
    assert first.global_step is None
    call(shaped, ["a b c", "a"], trainer_state=State())
    second = shaped.last_call
    assert second.call_index == 2
    assert second.global_step == 7
    assert second.kind == "length"
    assert second.raw == (3.0, 3.0)
    assert second.penalties == pytest.approx((2 / 3, 0.0))
    assert second.shaped == pytest.approx((3.0 - 2 / 3, 3.0))
    assert first.raw == (3.0,)  # old records are immutable values
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        second.raw = ()


def test_trainer_log_callbacks_receive_unshaped_rewards():
    metrics, columns = [], []

    def reward(prompts, completions, **kwargs):
        return [1.0, None, 0.0]

    shaped = shape_reward(reward, "sentinel", 1.0, sentinels=("!",))
    call(
        shaped,
        ["!", "!", ""],
        log_metric=lambda n, v: metrics.append((n, v)),
        log_extra=lambda c, v: columns.append((c, v)),
    )
    assert columns == [("reward/unshaped", [1.0, None, 0.0]), ("reward/penalty", [0.5, None, 0.0])]
    assert metrics == [("reward/unshaped_mean", 0.5), ("reward/penalty_mean", 0.25)]

    quiet = shape_reward(reward, "sentinel", 1.0, sentinels=("!",), log_to_trainer=False)
    metrics.clear()
    columns.clear()
    call(
        quiet,
        ["!", "!", ""],
        log_metric=lambda n, v: metrics.append((n, v)),
        log_extra=lambda c, v: columns.append((c, v)),
    )
    assert metrics == []
    assert columns == []


def test_stacked_shaping_composes_penalties():
    inner = shape_reward(ones, "sentinel", 0.5, sentinels=("!",))
    outer = shape_reward(inner, "length", 0.5, target_length=1)
    assert outer.__name__ == "ones"
    assert outer.unshaped is inner
    result = call(outer, ["! b c"])  # 1 sentinel, 3 words (excess 2, scale 1)
    assert inner.last_call.raw == (1.0,)
    assert outer.last_call.raw == (0.75,)
    assert result == pytest.approx([0.75 - 0.5 * 2 / 3])


def test_concurrent_calls_publish_complete_records():
    shaped = shape_reward(ones, "length", 0.5, target_length=1)
    errors = []

    def worker(size):
        try:
            for _ in range(20):
                call(shaped, [words(size)] * size)
        except Exception as error:  # pragma: no cover - surfaced by the assertion below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(size,)) for size in (1, 2, 3, 4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    record = shaped.last_call
    assert record.call_index == 80
    size = len(record.raw)
    assert record.features == (float(size),) * size  # one call's data, not a mix


# --------------------------------------------------------------------------------------------------
# called exactly the way TRL 1.16's GRPOTrainer._calculate_rewards calls reward functions


def _call_like_trl(reward_func, inputs, prompts, completions, completion_ids_list, state):
    """Mirror of grpo_trainer._calculate_rewards for one custom (non-Module) reward function."""
    keys = [key for key in inputs[0] if key not in ["prompt", "completion", "completion_ids"]]
    reward_kwargs = {key: [example[key] for example in inputs] for key in keys}
    reward_kwargs["trainer_state"] = state
    pending_extra, pending_metrics = {}, {}
    reward_kwargs["log_extra"] = lambda column, values: pending_extra.setdefault(column, []).extend(values)
    reward_kwargs["log_metric"] = lambda name, value: pending_metrics.setdefault(name, []).append(value)
    if inspect.iscoroutinefunction(reward_func):
        output = asyncio.run(
            reward_func(
                prompts=prompts, completions=completions, completion_ids=completion_ids_list, **reward_kwargs
            )
        )
    else:
        output = reward_func(
            prompts=prompts, completions=completions, completion_ids=completion_ids_list, **reward_kwargs
        )
    output = [reward if reward is not None else math.nan for reward in output]
    assert len(output) == len(prompts)
    return np.asarray(output, dtype=np.float32), pending_extra, pending_metrics


@pytest.mark.parametrize("use_async", [False, True])
def test_called_like_trl_grpo_trainer(use_async):
    seen = {}

    def accuracy(
        prompts, completions, completion_ids, solution, trainer_state, log_extra, log_metric, **kwargs
    ):
        seen.update(solution=solution, step=trainer_state.global_step, ids=completion_ids)
        return [
            1.0 if c[0]["content"].startswith(s) else 0.0 for c, s in zip(completions, solution, strict=True)
        ]

    async def async_accuracy(**kwargs):
        return accuracy(**kwargs)

    class State:
        global_step = 3

    fn = async_accuracy if use_async else accuracy
    shaped = shape_reward(fn, "length", 0.5, target_length=2)
    prompts = [[{"role": "user", "content": "2+2?"}]] * 2
    completions = [
        [{"role": "assistant", "content": "4"}],
        [{"role": "assistant", "content": "4 because 2+2 is 4"}],
    ]
    completion_ids = [[11, 2], [11, 5, 6, 7, 8, 9]]
    inputs = [{"prompt": prompts[0], "solution": "4"}, {"prompt": prompts[1], "solution": "4"}]

    rewards, extra, metrics = _call_like_trl(shaped, inputs, prompts, completions, completion_ids, State())
    np.testing.assert_allclose(rewards, [1.0, 1.0 - 0.5 * 4 / 6], rtol=1e-6)
    assert seen == {"solution": ["4", "4"], "step": 3, "ids": completion_ids}
    assert shaped.last_call.raw == (1.0, 1.0)
    assert shaped.last_call.global_step == 3
    name = "async_accuracy" if use_async else "accuracy"
    assert extra[f"{name}/unshaped"] == [1.0, 1.0]
    assert metrics[f"{name}/unshaped_mean"] == [1.0]


# --------------------------------------------------------------------------------------------------
# bad input: configuration


def msg(text):
    return re.escape(text)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"kind": "size"},
            ConfigError,
            "`kind` must be one of 'length', 'repetition', 'sentinel', got 'size'.",
        ),
        ({"kind": 1}, LoopguardTypeError, "`kind` must be a name string, got 1 of type int."),
        ({"strength": True}, LoopguardTypeError, "`strength` must be a real number (not bool), got True."),
        ({"strength": math.nan}, ConfigError, "`strength` must be finite, got nan."),
        ({"strength": math.inf}, ConfigError, "`strength` must be finite, got inf."),
        ({"strength": 0}, ConfigError, "`strength` must be > 0, got 0.0."),
        ({"strength": -1.0}, ConfigError, "`strength` must be > 0, got -1.0."),
        ({"strength": "1"}, LoopguardTypeError, "`strength` must be a real number, got '1' of type str."),
        ({"kind": "length"}, ConfigError, "`target_length` must be given when `kind` is 'length', got None."),
        (
            {"kind": "length", "target_length": 2.0},
            LoopguardTypeError,
            "`target_length` must be an integer, got 2.0 of type float.",
        ),
        (
            {"kind": "length", "target_length": True},
            LoopguardTypeError,
            "`target_length` must be an integer (not bool)",
        ),
        (
            {"kind": "length", "target_length": -1},
            ConfigError,
            "`target_length` must be in [0, 1000000], got -1.",
        ),
        ({"kind": "length", "target_length": 5, "scale": 0.5}, ConfigError, "`scale` must be >= 1, got 0.5."),
        (
            {"kind": "length", "target_length": 5, "scale": math.inf},
            ConfigError,
            "`scale` must be finite, got inf.",
        ),
        (
            {"kind": "length", "target_length": 5, "unit": "chars"},
            ConfigError,
            "`unit` must be one of 'auto', 'tokens', 'words', got 'chars'.",
        ),
        (
            {"kind": "length", "target_length": 5, "n": 3},
            ConfigError,
            "`n` must be None when `kind` is 'length' (it only applies to 'repetition'), got 3.",
        ),
        (
            {"kind": "length", "target_length": 5, "sentinels": ("x",)},
            ConfigError,
            "`sentinels` must be None when `kind` is 'length' (it only applies to 'sentinel'), got ('x',).",
        ),
        (
            {"kind": "repetition", "scale": 2.0},
            ConfigError,
            "`scale` must be None when `kind` is 'repetition' (it only applies to 'length'), got 2.0.",
        ),
        ({"kind": "repetition", "n": 0}, ConfigError, "`n` must be in [1, 32], got 0."),
        ({"kind": "repetition", "n": 33}, ConfigError, "`n` must be in [1, 32], got 33."),
        (
            {"kind": "repetition", "n": True},
            LoopguardTypeError,
            "`n` must be an integer (not bool), got True.",
        ),
        (
            {"kind": "sentinel", "unit": "words", "sentinels": ("x",)},
            ConfigError,
            "`unit` must be None when `kind` is 'sentinel' (it only applies to 'length' and 'repetition'), "
            "got 'words'.",
        ),
        ({"kind": "sentinel"}, ConfigError, "`sentinels` must be given when `kind` is 'sentinel', got None."),
        (
            {"kind": "sentinel", "sentinels": "<think>"},
            LoopguardTypeError,
            "`sentinels` must be a tuple of strings, got '<think>' of type str.",
        ),
        (
            {"kind": "sentinel", "sentinels": ()},
            ConfigError,
            "`sentinels` must hold at least one string, got ().",
        ),
        (
            {"kind": "sentinel", "sentinels": ("",)},
            ConfigError,
            "`sentinels[0]` must be a non-empty string, got ''.",
        ),
        (
            {"kind": "sentinel", "sentinels": ("ok", "a\x00b")},
            ConfigError,
            "`sentinels[1]` must not contain null bytes, got 'a\\x00b'.",
        ),
        (
            {"kind": "sentinel", "sentinels": ("x" * (MAX_SENTINEL_LENGTH + 1),)},
            ConfigError,
            f"`sentinels[0]` must be at most 256 characters, got {MAX_SENTINEL_LENGTH + 1} characters.",
        ),
        (
            {"kind": "sentinel", "sentinels": tuple(f"s{i}" for i in range(MAX_SENTINELS + 1))},
            ConfigError,
            "`sentinels` must hold at most 64 strings (DoS cap), got 65.",
        ),
        (
            {"kind": "sentinel", "sentinels": ("x", "y", "x")},
            ConfigError,
            "`sentinels[2]` must not repeat an earlier sentinel (it would count twice), got 'x'.",
        ),
        (
            {"kind": "sentinel", "sentinels": ("x", 3)},
            LoopguardTypeError,
            "`sentinels[1]` must be a string, got 3 of type int.",
        ),
        (
            {"kind": "sentinel", "sentinels": ("x",), "log_to_trainer": 1},
            LoopguardTypeError,
            "`log_to_trainer` must be a bool, got 1 of type int.",
        ),
    ],
)
def test_bad_configuration(kwargs, error, message):
    with pytest.raises(error, match=msg(message)):
        shape_reward(ones, **kwargs)


def test_bad_fn():
    with pytest.raises(LoopguardTypeError, match=msg("`fn` must be callable, got 3 of type int.")):
        shape_reward(3, "sentinel", 1.0, sentinels=("x",))
    with pytest.raises(
        LoopguardTypeError, match=msg("`fn` must be callable, got 'my-org/reward-model' of type str.")
    ):
        shape_reward("my-org/reward-model", "sentinel", 1.0, sentinels=("x",))

    Module = type(
        "Module", (), {"__module__": "torch.nn.modules.module", "__call__": lambda self, **kw: None}
    )
    RewardModel = type("RewardModel", (Module,), {})
    with pytest.raises(
        LoopguardTypeError, match=msg("`fn` must be a reward function, got a torch module (RewardModel)")
    ):
        shape_reward(RewardModel(), "sentinel", 1.0, sentinels=("x",))


def test_hand_built_config_is_validated():
    with pytest.raises(ConfigError, match=msg("`n` must be given when `kind` is 'repetition', got None.")):
        ShapingConfig(kind="repetition", strength=1.0, unit="auto")
    with pytest.raises(ConfigError, match=msg("`scale` must be None when `kind` is 'sentinel'")):
        ShapingConfig(kind="sentinel", strength=1.0, sentinels=("x",), scale=2.0)


def test_bad_features_for_penalty():
    config = ShapingConfig(kind="repetition", strength=1.0, n=2, unit="auto")
    with pytest.raises(InputError, match=msg("`features` must be repetition rates in [0, 1], got 1.5.")):
        config.penalty([0.5, 1.5])
    with pytest.raises(InputError, match=msg("`features` must be >= 0, got -1.0.")):
        config.penalty([-1.0])
    with pytest.raises(InputError, match=msg("`features` must be finite, got nan at index (0,).")):
        config.penalty([math.nan])
    with pytest.raises(InputError, match=msg("`features` must be a 1-D array, got shape (1, 1).")):
        config.penalty([[0.5]])


# --------------------------------------------------------------------------------------------------
# bad input: call time


def test_bad_calls():
    shaped = shape_reward(ones, "length", 0.5, target_length=2)
    with pytest.raises(
        LoopguardTypeError, match=msg("the shaped reward function 'ones' must be called with `completions=`")
    ):
        shaped(["p"], ["a"])
    with pytest.raises(
        LoopguardTypeError, match=msg("`completions` must be a list of completions, got 'a b'.")
    ):
        shaped(prompts=["p"], completions="a b")
    with pytest.raises(
        LoopguardTypeError,
        match=msg("`completions[1]` must be a string or a list of chat messages, got 3 of type int."),
    ):
        call(shaped, ["a", 3])
    with pytest.raises(
        LoopguardTypeError,
        match=msg("`completions[0][0]` must be a message dict with 'role' and 'content', got 'hi'."),
    ):
        call(shaped, [["hi"]])
    with pytest.raises(
        LoopguardTypeError,
        match=msg(
            "`completions[0][0]['content']` must be a string, a list of content blocks or None, got 5."
        ),
    ):
        call(shaped, [[{"role": "assistant", "content": 5}]])
    with pytest.raises(
        InputError, match=msg("`completion_ids` and `completions` must have the same length, got 1 and 2.")
    ):
        call(shaped, ["a", "b"], completion_ids=[[1]])
    with pytest.raises(
        LoopguardTypeError, match=msg("`completion_ids` must hold token-id sequences, got strings.")
    ):
        call(shaped, ["a"], completion_ids=["a"])
    with pytest.raises(
        InputError,
        match=msg("`completion_ids` must hold token ids >= 0 (strip padding first), got -100 in row 0."),
    ):
        call(shaped, ["a"], completion_ids=[[5, -100]])


@pytest.mark.parametrize(
    ("output", "error", "message"),
    [
        ([1.0], InputError, "`fn` must return one reward per completion, got 1 for 2 completions."),
        (
            [True, 1.0],
            LoopguardTypeError,
            "`fn` must return real numbers or None, got True (bool) at index 0.",
        ),
        ([1.0, "1"], LoopguardTypeError, "`fn` must return real numbers or None, got '1' at index 1."),
        (None, LoopguardTypeError, "`fn` must return a sequence of rewards (one per completion), got None."),
        (1.0, LoopguardTypeError, "`fn` must return a sequence of rewards (one per completion), got 1.0."),
    ],
)
def test_bad_reward_outputs(output, error, message):
    shaped = shape_reward(lambda **kwargs: output, "sentinel", 1.0, sentinels=("x",))
    with pytest.raises(error, match=msg(message)):
        call(shaped, ["a", "b"])
    assert shaped.last_call is None  # nothing half-published


def test_batch_cap(monkeypatch):
    import loopguard.shaping as shaping

    monkeypatch.setattr(shaping, "MAX_TRAJECTORIES", 3)
    shaped = shape_reward(ones, "sentinel", 1.0, sentinels=("x",))
    with pytest.raises(InputError, match=msg("`completions` must have at most 3 entries (DoS cap), got 4.")):
        call(shaped, ["a"] * 4)


def test_module_does_not_import_torch():
    code = "import sys, loopguard.shaping; print('torch' in sys.modules or 'trl' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "False"
