import json
import re

import numpy as np
import pytest

from loopguard import ConfigError, StateError
from loopguard.signals import as_token_batch
from loopguard.targeted import MAX_TARGETS, Target, TargetedPenalty, f_survival, premium, price


def test_each_kind_measures_its_feature_by_hand():
    ids = [[5, 5, 5, 1], [1, 2], [5, 1, 5, 1, 5, 1]]
    tokens = Target(kind="tokens", token=5, rate=0.25, source="takeover")
    length = Target(kind="length", threshold=3, rate=0.1, source="length")
    repetition = Target(kind="repetition", n=2, rate=1.0, source="repetition")
    assert TargetedPenalty((tokens,))(ids).tolist() == [0.75, 0.0, 0.75]
    assert TargetedPenalty((length,))(ids).tolist() == pytest.approx([0.1, 0.0, 0.3])
    # bigrams of row 0: (5,5) (5,5) (5,1): 1 repeat of 3; row 2: (5,1) (1,5) (5,1) (1,5) (5,1): 3 of 5
    assert TargetedPenalty((repetition,))(ids).tolist() == pytest.approx([1 / 3, 0.0, 3 / 5])
    both = TargetedPenalty((tokens, length))(ids)
    assert both.tolist() == pytest.approx([0.85, 0.0, 1.05])


def test_premium_is_the_within_group_slope_of_reward_on_the_feature():
    # group 1: rewards 1, 3 at feature 0, 2 -> slope 1; group 2: constant feature contributes nothing
    assert premium([1.0, 3.0, 5.0, 9.0], np.array([0.0, 2.0, 1.0, 1.0]), 2) == pytest.approx(1.0)
    # a prompt effect (group 2 pays 10 more) does not leak into the slope
    assert premium([0.0, 1.0, 10.0, 11.0], np.array([0.0, 1.0, 0.0, 1.0]), 2) == pytest.approx(1.0)
    assert premium([0.0, 1.0, 10.0, 11.0], np.array([0.0, 1.0, 0.0, 1.0]), None) == pytest.approx(1.0)
    assert premium([0.0, 1.0], np.array([1.0, 1.0]), 2) is None  # nothing varies: nothing to measure


def test_merged_adds_new_features_and_never_lowers_a_rate():
    a = Target(kind="tokens", token=5, rate=0.5, source="takeover")
    penalty = TargetedPenalty((a,)).merged(
        [
            Target(kind="tokens", token=5, rate=0.2, source="takeover"),
            Target(kind="tokens", token=6, rate=0.1, source="takeover"),
        ]
    )
    assert [(t.token, t.rate) for t in penalty.targets] == [(5, 0.5), (6, 0.1)]
    raised = penalty.merged([Target(kind="tokens", token=5, rate=0.9, source="takeover")])
    assert [(t.token, t.rate) for t in raised.targets] == [(5, 0.9), (6, 0.1)]
    full = TargetedPenalty(()).merged(
        [Target(kind="tokens", token=i, rate=1.0, source="x") for i in range(40)]
    )
    assert len(full.targets) == MAX_TARGETS


def test_state_round_trips_through_json_and_bad_fields_are_named():
    penalty = TargetedPenalty(
        (
            Target(kind="tokens", token=5, rate=0.5, source="takeover"),
            Target(kind="length", threshold=4.0, rate=0.3, source="length"),
        )
    )
    payload = json.loads(json.dumps(penalty.to_dict()))
    assert TargetedPenalty.from_dict(payload) == penalty
    payload["targets"][1]["rate"] = -1.0
    with pytest.raises(StateError, match=re.escape("`state['targets'][1]['rate']` must be >= 0")):
        TargetedPenalty.from_dict(payload)
    payload["targets"][1]["rate"] = 0.3
    payload["targets"][0]["kind"] = "words"
    with pytest.raises(StateError, match=re.escape("`state['targets'][0]['kind']` must be one of tokens")):
        TargetedPenalty.from_dict(payload)
    with pytest.raises(StateError, match=re.escape("must be 'loopguard.TargetedPenalty'")):
        TargetedPenalty.from_dict({"kind": "x", "version": 1, "targets": []})


def test_a_target_takes_exactly_its_own_parameter():
    with pytest.raises(
        ConfigError, match=re.escape("`Target.token` must be set for kind 'tokens', got None.")
    ):
        Target(kind="tokens", rate=1.0, source="takeover")
    with pytest.raises(ConfigError, match=re.escape("`Target.n` must be None for kind 'length', got 2.")):
        Target(kind="length", threshold=3.0, n=2, rate=1.0, source="length")
    with pytest.raises(ConfigError, match="rate"):
        Target(kind="tokens", token=1, rate=-0.5, source="takeover")


def test_f_survival_matches_scipy():
    from scipy.stats import f

    for x in (0.0, 0.01, 0.3, 1.0, 2.5, 4.0, 10.0, 50.0, 300.0):
        for d1 in (1, 2, 3, 5, 16):
            for d2 in (1, 2, 5, 9, 30, 200):
                assert f_survival(x, d1, d2) == pytest.approx(f.sf(x, d1, d2), abs=1e-12)


def test_price_needs_the_reward_to_pay_beyond_noise():
    rng = np.random.default_rng(0)
    ids = [[5] * int(k) + [1, 2] for k in rng.integers(0, 3, size=32)]
    batch = as_token_batch("ids", ids)
    target = Target(kind="tokens", token=5, rate=0.0, source="takeover")
    counts = np.array([row.count(5) for row in ids], dtype=float)
    noise = rng.normal(0, 0.2, size=32)
    paid = price([target], batch, noise + 0.3 * counts, 4)
    assert [t.token for t in paid] == [5]
    assert paid[0].rate == pytest.approx(2 * 0.3, rel=0.3)
    assert price([target], batch, noise, 4) == []  # noise alone is not a premium
    assert price([target], as_token_batch("ids", [[5], [5], [5], [5]]), [1.0, 0.0, 1.0, 0.0], 2) is None
