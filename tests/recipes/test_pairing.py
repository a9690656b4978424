"""build_pairs against a naive reference for every pairing mode; ties dropped, margins recorded."""

import numpy as np
import pytest

from loopguard.exceptions import InputError
from loopguard.recipes import PAIRING_MODES, build_pairs


def _naive(rewards, lengths, mode, penalty):
    scores = (
        [r - penalty * n for r, n in zip(rewards, lengths, strict=False)]
        if mode == "length_penalized"
        else list(rewards)
    )
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))
    lower = [i for i in range(len(scores)) if scores[i] < scores[best]]
    if not lower:
        return None
    if mode == "max_max":
        worst = max(lower, key=lambda i: (scores[i], -i))
    elif mode == "max_random":
        return best, set(lower)
    else:
        worst = min(range(len(scores)), key=lambda i: (scores[i], i))
    return best, worst


@pytest.mark.parametrize("mode", PAIRING_MODES)
def test_modes_match_a_naive_loop(mode):
    rng = np.random.default_rng(3)
    rewards = rng.integers(0, 4, size=(30, 5)).astype(float)  # small integers: plenty of ties
    lengths = rng.integers(0, 20, size=(30, 5))
    prompts = [f"p{i}" for i in range(30)]
    completions = [[f"p{i}c{k}" for k in range(5)] for i in range(30)]
    pairs, dropped = build_pairs(
        prompts, completions, rewards, lengths, mode=mode, length_penalty=0.05, seed=1
    )
    expected = [_naive(rewards[i], lengths[i], mode, 0.05) for i in range(30)]
    assert dropped == sum(e is None for e in expected)
    kept = [(i, e) for i, e in enumerate(expected) if e is not None]
    assert len(pairs) == len(kept)
    for pair, (i, (best, worst)) in zip(pairs, kept, strict=False):
        assert pair.prompt == prompts[i]
        assert pair.chosen == completions[i][best]
        chosen_k, rejected_k = int(pair.chosen[-1]), int(pair.rejected[-1])
        if mode == "max_random":
            assert rejected_k in worst
        else:
            assert rejected_k == worst
        score = rewards[i] - (0.05 * lengths[i] if mode == "length_penalized" else 0)
        assert pair.margin == pytest.approx(score[chosen_k] - score[rejected_k])
        assert pair.margin > 0
        assert pair.chosen_reward == rewards[i][chosen_k]
        assert pair.rejected_reward == rewards[i][rejected_k]


def test_length_penalty_prefers_the_shorter_of_two_equal_rewards():
    pairs, _ = build_pairs(["q"], [["short", "long"]], [[1.0, 1.0]], [[2, 40]], mode="length_penalized")
    assert (pairs[0].chosen, pairs[0].rejected) == ("short", "long")
    assert pairs[0].margin == pytest.approx(0.38)
    assert build_pairs(["q"], [["short", "long"]], [[1.0, 1.0]], [[2, 40]])[1] == 1  # max_min: a tie


def test_min_margin_drops_near_ties():
    pairs, dropped = build_pairs(
        ["a", "b"], [["x", "y"], ["x", "y"]], [[0.0, 0.05], [0.0, 0.5]], [[1, 1], [1, 1]], min_margin=0.1
    )
    assert dropped == 1
    assert [p.prompt for p in pairs] == ["b"]


def test_shape_errors():
    with pytest.raises(InputError, match="at least 2 completions per prompt"):
        build_pairs(["a"], [["x"]], [[1.0]], [[1]])
    with pytest.raises(InputError, match="must have the same shape"):
        build_pairs(["a"], [["x", "y"]], [[1.0, 0.0]], [[1, 1, 1]])
    with pytest.raises(InputError, match="must be finite"):
        build_pairs(["a"], [["x", "y"]], [[1.0, float("nan")]], [[1, 1]])
