"""``Observation`` fields given real torch tensors and numpy arrays of every shape a trainer might hand over.

Each field either accepts the value when it is unambiguous (a 0-d or one-element scalar, a numpy array of
strings) or raises a loopguard error naming the field and the expected shape: never torch's or numpy's raw
``RuntimeError`` / ``ValueError``, never a silently dropped mask. Also: the ``group_sizes`` field for
ragged prompt groups, and the collapse detector reading it.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from loopguard import Observation
from loopguard.detectors import Collapse, StepData
from loopguard.exceptions import ConfigError, InputError, LoopguardTypeError
from loopguard.signals import group_reward_std, zero_std_group_fraction

torch = pytest.importorskip("torch", reason="torch is part of the `hf` extra")

REWARDS = [1.0, 0.0, 1.0, 0.5]


def observe(**fields: Any) -> Observation:
    step = fields.pop("step", 0)
    rewards = fields.pop("rewards", REWARDS)
    return Observation(step, rewards, **fields)


# ------------------------------------------------------------------------------------ accepted scalars


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("kl", torch.tensor(0.25), 0.25),
        ("kl", torch.tensor([0.25]), 0.25),
        ("kl", torch.tensor([[0.25]], dtype=torch.float64, requires_grad=True), 0.25),
        ("kl", torch.tensor(0.25, dtype=torch.bfloat16), 0.25),
        ("kl", np.array([0.25]), 0.25),
        ("kl", np.float32(0.25), 0.25),
        ("kl", torch.tensor(2), 2.0),
        ("entropy", np.array([[1.5]]), 1.5),
        ("entropy", torch.tensor([1.5], dtype=torch.float16), 1.5),
        ("beta", torch.tensor(0.04, dtype=torch.float64), 0.04),
        ("beta", np.array([0.04]), 0.04),
        ("group_size", np.int64(2), 2),
        ("group_size", torch.tensor(2), 2),
        ("group_size", torch.tensor([2]), 2),
        ("group_size", np.array(2), 2),
        ("step", torch.tensor(7), 7),
        ("step", np.int32(7), 7),
        ("step", np.array([7]), 7),
    ],
)
def test_scalar_fields_accept_zero_d_and_one_element_tensors(field, value, expected):
    observation = observe(**{field: value})
    got = getattr(observation, field)
    assert got == expected
    assert type(got) is type(expected)


@pytest.mark.parametrize(
    ("field", "value", "error", "message"),
    [
        ("kl", torch.tensor([0.1, 0.2]), InputError, "`kl` must be a single number (a 0-d or one-element array or tensor), got shape (2,)."),
        ("kl", np.array([[0.1, 0.2]]), InputError, "`kl` must be a single number (a 0-d or one-element array or tensor), got shape (1, 2)."),
        ("entropy", np.array([]), InputError, "`entropy` must be a single number (a 0-d or one-element array or tensor), got shape (0,)."),
        ("beta", torch.tensor([]), InputError, "`beta` must be a single number (a 0-d or one-element array or tensor), got shape (0,)."),
        ("beta", torch.tensor([0.1, 0.2]), InputError, "`beta` must be a single number (a 0-d or one-element array or tensor), got shape (2,)."),
        ("group_size", torch.tensor([2, 2]), InputError, "`group_size` must be a single number (a 0-d or one-element array or tensor), got shape (2,)."),
        ("step", torch.tensor([3, 4]), InputError, "`step` must be a single number (a 0-d or one-element array or tensor), got shape (2,)."),
        ("step", torch.tensor(3.0), LoopguardTypeError, "`step` must be an integer, got 3.0 of type float."),
        ("group_size", torch.tensor(2.0), LoopguardTypeError, "`group_size` must be an integer, got 2.0 of type float."),
        ("group_size", torch.tensor(True), LoopguardTypeError, "`group_size` must be an integer (not bool), got True."),
        ("kl", torch.tensor(True), LoopguardTypeError, "`kl` must be a real number (not bool), got True."),
        ("kl", torch.tensor(float("nan")), InputError, "`kl` must be finite, got nan."),
        ("kl", torch.tensor(1.0 + 1.0j), LoopguardTypeError, "`kl` must be a real number, got (1+1j) of type complex."),
        ("kl", np.array(["0.1"]), LoopguardTypeError, "`kl` must be a real number, got '0.1' of type str."),
        ("kl", torch.tensor(0.1, device="meta"), InputError, "`kl` is on the meta device (it holds no data, only a shape)"),
        ("kl", np.ma.masked, InputError, "`kl` must have no masked elements"),
        ("kl", np.ma.array([0.1], mask=[True]), InputError, "`kl` must have no masked elements"),
        ("beta", torch.tensor(0.0), InputError, "`beta` must be > 0"),
        ("entropy", torch.tensor(-1.0), InputError, "`entropy` must be >= 0, got -1.0."),
        ("group_size", torch.tensor(1), ConfigError, "`group_size` must be in [2, 100000], got 1."),
    ],
)  # fmt: skip
def test_scalar_fields_refuse_ambiguous_arrays(field, value, error, message):
    with pytest.raises(error, match=re.escape(message)):
        observe(**{field: value})


# -------------------------------------------------------------------------------------- array fields


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"rewards": torch.tensor([[1.0], [0.0], [1.0], [0.5]])}, InputError, "`rewards` must be a 1-D array shaped [B] (one entry per completion; flatten a [B, 1] column with .reshape(-1)), got shape (4, 1)."),
        ({"rewards": np.array([REWARDS])}, InputError, "`rewards` must be a 1-D array shaped [B]"),
        ({"rewards": torch.tensor(1.0)}, InputError, "`rewards` must be a 1-D array shaped [B]"),
        ({"rewards": torch.zeros(4, device="meta")}, InputError, "`rewards` is on the meta device (it holds no data, only a shape), got a tensor of shape (4,) on 'meta'"),
        ({"rewards": np.ma.array(REWARDS, mask=[0, 1, 0, 0])}, InputError, "`rewards` must have no masked elements"),
        ({"lengths": np.array([[1, 2, 3, 4]])}, InputError, "`lengths` must be a 1-D array shaped [B]"),
        ({"lengths": torch.tensor([[1], [2], [3], [4]])}, InputError, "`lengths` must be a 1-D array shaped [B]"),
        ({"lengths": torch.tensor([1.0, 2.0, 3.0, 4.0])}, LoopguardTypeError, "`lengths` must hold integers, got dtype float32."),
        ({"completion_ids": np.zeros((4, 2, 2), dtype=np.int64)}, InputError, "`completion_ids` must be a 2-D array of token ids or a list of sequences (shaped [B, L]), got shape (4, 2, 2)."),
        ({"completion_ids": torch.zeros((4, 2, 2), dtype=torch.long)}, InputError, "`completion_ids` must be a 2-D array of token ids or a list of sequences (shaped [B, L]), got shape (4, 2, 2)."),
        ({"completion_ids": [torch.zeros((2, 2), dtype=torch.long)] * 4}, InputError, "`completion_ids[0]` must be a 1-D sequence of token ids, got shape (2, 2)."),
        ({"completion_ids": torch.zeros((4, 3), dtype=torch.long, device="meta")}, InputError, "`completion_ids` is on the meta device"),
        ({"ensemble_scores": np.array(REWARDS)}, InputError, "`ensemble_scores` must be a 2-D array shaped [K, B] (K reward models x B completions; wrap one model's scores as [scores]), got shape (4,)."),
        ({"ensemble_scores": torch.zeros(2, 4, 1)}, InputError, "`ensemble_scores` must be a 2-D array shaped [K, B]"),
        ({"ensemble_scores": torch.zeros(2, 3)}, InputError, "`ensemble_scores` must have one entry per reward (4), got 3."),
        ({"embeddings": np.zeros(4)}, InputError, "`embeddings` must be a 2-D array shaped [N, D] (one row per response), got shape (4,)."),
        ({"embeddings": torch.zeros(4, 2, 2)}, InputError, "`embeddings` must be a 2-D array shaped [N, D] (one row per response), got shape (4, 2, 2)."),
        ({"reference_embeddings": torch.zeros(3)}, InputError, "`reference_embeddings` must be a 2-D array shaped [M, D] (one row per response), got shape (3,)."),
        ({"gold": [1.0], "gold_indices": np.array([0.0])}, LoopguardTypeError, "`gold_indices` must hold integers, got dtype float64."),
        ({"gold": [1.0], "gold_indices": torch.tensor([0.0])}, LoopguardTypeError, "`gold_indices` must hold integers, got dtype float32."),
        ({"gold": [1.0, 2.0], "gold_indices": np.array([[0, 1]])}, InputError, "`gold_indices` must be a 1-D array shaped [G] (batch positions of `gold`), got shape (1, 2)."),
        ({"gold": np.array([REWARDS])}, InputError, "`gold` must be a 1-D array shaped [G] (one score per audited completion), got shape (1, 4)."),
        ({"gold": [1.0], "gold_indices": [2**63]}, InputError, "`gold_indices` must fit in int64, got 9223372036854775808."),
        ({"gold": [1.0, 2.0], "gold_indices": [2**63, -1]}, InputError, "`gold_indices` must hold integers that fit in int64 ([-2**63, 2**63 - 1]), got 9223372036854775808 at index (0,)."),
        ({"completions": np.array([["a", "b"], ["c", "d"]])}, InputError, "`completions` must be a 1-D list of strings (one per completion), got an array shaped (2, 2)."),
        ({"completions": torch.tensor([1, 2, 3, 4])}, LoopguardTypeError, "`completions` must be a list of strings"),
    ],
)  # fmt: skip
def test_array_fields_name_the_field_and_the_expected_shape(fields, error, message):
    with pytest.raises(error, match=re.escape(message)):
        observe(**fields)


def test_array_fields_accept_tensors_of_any_kind():
    observation = observe(
        rewards=torch.tensor(REWARDS, requires_grad=True),
        completions=np.array(["a b", "b c", "c d", "d e"]),
        completion_ids=torch.tensor([[1, 2], [3, 4], [5, 6], [2**63 - 1, 0]]),
        lengths=torch.tensor([2, 2, 2, 2]).expand(4),
        ensemble_scores=torch.tensor([REWARDS, REWARDS], dtype=torch.bfloat16),
        embeddings=torch.ones(4, 3).t().contiguous().t(),
        gold=np.ma.array([1.0, 0.5]),  # a masked array with nothing masked
        gold_indices=torch.tensor([0, 3]),
        prompts=np.array(["p", "p", "q", "q"], dtype=object),
        kl=torch.tensor(0.01),
    )
    np.testing.assert_array_equal(observation.rewards, REWARDS)
    assert observation.completions == ("a b", "b c", "c d", "d e")
    assert observation.completion_ids is not None
    assert observation.completion_ids.tokens[-2] == 2**63 - 1
    assert observation.lengths is not None
    assert observation.lengths.tolist() == [2, 2, 2, 2]
    assert observation.ensemble_scores is not None
    assert observation.ensemble_scores.dtype == np.float64
    assert observation.gold_indices is not None
    assert observation.gold_indices.tolist() == [0, 3]
    assert observation.kl == pytest.approx(0.01)


# ----------------------------------------------------------------------------------------- group_sizes


def test_group_sizes_accepts_sequences_arrays_and_tensors():
    for sizes in ([3, 1], (3, 1), np.array([3, 1]), torch.tensor([3, 1])):
        observation = observe(group_sizes=sizes)
        assert observation.group_sizes == (3, 1)
        assert observation.group_size is None
    assert observe(group_size=2).group_sizes is None


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"group_sizes": [2, 1]}, InputError, "`group_sizes` must add up to the number of rewards (4), got 3 in 2 groups."),
        ({"group_sizes": [5]}, InputError, "`group_sizes` must add up to the number of rewards (4), got a group of 5."),
        ({"group_sizes": [4, 0]}, InputError, "`group_sizes` must be >= 1, got 0 at index (1,)."),
        ({"group_sizes": [2.0, 2.0]}, LoopguardTypeError, "`group_sizes` must hold integers, got dtype float64."),
        ({"group_sizes": [[2, 2]]}, InputError, "`group_sizes` must be a 1-D array shaped [G] (one size per group), got shape (1, 2)."),
        ({"group_sizes": []}, InputError, "`group_sizes` must not be empty, got shape (0,)."),
        ({"group_sizes": 4}, InputError, "`group_sizes` must be a 1-D array shaped [G] (one size per group), got shape ()."),
        ({"group_sizes": torch.tensor([2, 2], device="meta")}, InputError, "`group_sizes` is on the meta device"),
        ({"group_sizes": [2, 2], "group_size": 2}, InputError, "`group_sizes` must not be given together with `group_size` (pass one: `group_size` for equal groups, `group_sizes` for ragged ones), got group_size=2 and group_sizes=(2, 2)."),
    ],
)  # fmt: skip
def test_group_sizes_errors(fields, error, message):
    with pytest.raises(error, match=re.escape(message)):
        observe(**fields)


def _measure(observation: Observation) -> dict[str, float] | None:
    return Collapse().measure(StepData(observation, warmup_steps=5), {})


def test_collapse_uses_ragged_groups_and_leaves_singletons_out():
    rewards = [1.0, 0.0, 1.0, 7.0, 2.0, 2.0, 3.0]
    raw = _measure(Observation(1, rewards, group_sizes=[3, 1, 2, 1], entropy=torch.tensor(0.7)))
    assert raw is not None
    expected_std = float(np.mean(group_reward_std(rewards, [3, 1, 2, 1], ddof=0)))
    assert raw["group_std"] == pytest.approx(expected_std) == pytest.approx(np.mean([np.std([1, 0, 1]), 0.0]))
    assert raw["zero_std_groups"] == zero_std_group_fraction(rewards, [3, 1, 2, 1]) == 0.5
    assert raw["entropy"] == pytest.approx(0.7)


def test_collapse_equal_ragged_sizes_match_group_size():
    rewards = np.random.default_rng(3).normal(size=12)
    assert _measure(Observation(1, rewards, group_sizes=[4, 4, 4])) == _measure(
        Observation(1, rewards, group_size=4)
    )


def test_collapse_skips_a_step_without_a_group_of_two():
    assert _measure(Observation(1, [1.0, 0.0, 2.0], group_sizes=[1, 1, 1])) is None
    assert _measure(Observation(1, [1.0, 0.0, 2.0])) is None  # no group information, as before
