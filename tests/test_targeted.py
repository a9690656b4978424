import json
import re

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopguard import ConfigError, InputError, LoopguardTypeError, StateError
from loopguard.signals import as_token_batch
from loopguard.signals._repetition import repetition_rates, row_repetition_rates
from loopguard.signals._sequences import MAX_TOKENS_PER_TRAJECTORY, MAX_TRAJECTORIES, plain_id_rows
from loopguard.targeted import (
    MAX_TARGETS,
    PriceEvidence,
    Target,
    TargetedPenalty,
    f_survival,
    premium,
    price,
)


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


@pytest.mark.parametrize(
    "target",
    [
        Target(kind="tokens", token=5, rate=0.5, source="takeover"),
        Target(kind="presence", token=7, rate=0.25, source="judge_gap"),
        Target(kind="length", threshold=4.0, rate=0.3, source="length"),
        Target(kind="repetition", n=2, rate=1.5, source="repetition"),
    ],
)
def test_a_targets_dict_holds_every_field_in_order(target):
    # Target.to_dict writes its fields out by hand (a Guard does it every step): a field added to the class and
    # not to the dict would be lost from the state, so the dict must be what attrs reads off the class
    assert list(target.to_dict().items()) == list(attrs.asdict(target).items())
    assert Target(**target.to_dict()) == target


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


def test_presence_is_whether_a_completion_holds_the_token_at_all():
    ids = [[5, 5, 5, 1], [1, 2], [5, 1]]
    holding = Target(kind="presence", token=5, rate=0.25, source="takeover")
    assert TargetedPenalty((holding,))(ids).tolist() == [0.25, 0.0, 0.25]
    assert holding.describe() == "a completion holding token 5 costs 0.25 (from takeover)"
    counted = Target(kind="tokens", token=5, rate=0.25, source="takeover")
    assert holding.key != counted.key  # two features of one token, priced apart
    with pytest.raises(ConfigError, match=re.escape("`Target.token` must be set for kind 'presence'")):
        Target(kind="presence", rate=1.0, source="takeover")


def _groups_centred(values, size):
    values = np.asarray(values, dtype=float)
    shape = (-1, size, *values.shape[1:])
    return (values.reshape(shape) - values.reshape(shape).mean(axis=1, keepdims=True)).reshape(values.shape)


def _by_hand(features, rewards, size):
    """The within-group least-squares premium (numpy's lstsq, minimum norm) and its F test's p-value."""
    from scipy.stats import f

    x, r = _groups_centred(features, size), _groups_centred(rewards, size)
    fit, _, rank, _ = np.linalg.lstsq(x, r, rcond=None)
    residual = float(((r - x @ fit) ** 2).sum())
    dof = len(r) - len(r) // size - rank
    return fit, f.sf(((r**2).sum() - residual) / rank / (residual / dof), rank, dof)


def test_pooled_evidence_is_one_least_squares_fit_on_all_its_batches():
    rng = np.random.default_rng(4)
    targets = [
        Target(kind="tokens", token=5, rate=0.0, source="takeover"),
        Target(kind="presence", token=5, rate=0.0, source="takeover"),
    ]
    batches, rewards, features = [], [], []
    for _ in range(3):
        ids = [[5] * int(k) + [1, 2] for k in rng.integers(0, 4, size=16)]
        counts = np.array([row.count(5) for row in ids], dtype=float)
        held = np.minimum(counts, 1.0)
        batches.append(as_token_batch("ids", ids))
        rewards.append(rng.normal(0, 0.2, size=16) + 0.3 * held)  # paid once for holding the token
        features.append(np.stack([counts, held], axis=1))
    evidence = PriceEvidence.of(targets)
    for batch, paid in zip(batches, rewards, strict=True):
        evidence = evidence.add(targets, batch, paid, 4)
    assert (evidence.rows, evidence.groups, evidence.batches) == (48, 12, 3)
    fit, p_value = _by_hand(np.concatenate(features), np.concatenate(rewards), 4)
    assert p_value < 0.05
    priced = {target.kind: target.rate for target in evidence.price()}
    kinds = ("tokens", "presence")
    assert priced == pytest.approx({kind: 2.0 * v for kind, v in zip(kinds, fit, strict=True) if v > 0})
    assert priced["presence"] == pytest.approx(2 * 0.3, abs=0.25)  # the pay is for holding it
    # one batch: the single-batch price is the same arithmetic
    alone = price(targets, batches[0], rewards[0], 4)
    fit, p_value = _by_hand(features[0], rewards[0], 4)
    expected = {kind: 2.0 * v for kind, v in zip(kinds, fit, strict=True) if v > 0}
    assert ({t.kind: t.rate for t in alone} if alone else {}) == (pytest.approx(expected) if p_value < 0.05 else {})


def test_features_that_always_occur_together_share_one_premium():
    ids = [[5], [1], [5], [2], [5], [3], [5], [4]]  # each holds 5 at most once: count == presence
    targets = [
        Target(kind="tokens", token=5, rate=0.0, source="takeover"),
        Target(kind="presence", token=5, rate=0.0, source="takeover"),
    ]
    rewards = [1.0, 0.0, 1.1, 0.1, 0.9, 0.0, 1.0, 0.05]
    priced = PriceEvidence.of(targets).add(targets, as_token_batch("ids", ids), rewards, 2).price()
    assert [t.kind for t in priced] == ["tokens", "presence"]
    assert priced[0].rate == pytest.approx(priced[1].rate)  # the minimum-norm split
    assert TargetedPenalty(priced)([[5], [1]])[0] == pytest.approx(2 * np.mean([1.0, 1.0, 0.9, 0.95]))  # within-pair gaps


def test_a_newly_named_candidate_starts_the_evidence_again_and_a_known_one_pools():
    batch = as_token_batch("ids", [[5, 1], [1], [6, 5], [2], [5], [6]])
    five = Target(kind="tokens", token=5, rate=0.0, source="takeover")
    six = Target(kind="tokens", token=6, rate=0.0, source="takeover")
    rewards = [1.0, 0.0, 1.2, 0.1, 0.9, 0.2]
    evidence = PriceEvidence.of([five]).add([five], batch, rewards, 2).add([five], batch, rewards, 2)
    assert evidence.batches == 2
    restarted = evidence.add([six], batch, rewards, 2)
    assert [t.key for t in restarted.targets] == [five.key, six.key]
    assert restarted.batches == 1  # six was not measured on the earlier batches
    assert restarted.add([], batch, rewards, 2).batches == 2
    full = PriceEvidence.of([Target(kind="tokens", token=i, rate=0.0, source="x") for i in range(40)])
    assert len(full.targets) == MAX_TARGETS
    assert full.add([six], batch, rewards, 2).targets == full.targets  # no room: the new one waits


def test_pooled_evidence_round_trips_through_json_and_bad_fields_are_named():
    target = Target(kind="presence", token=5, rate=0.0, source="takeover")
    evidence = PriceEvidence.of([target]).add([target], as_token_batch("ids", [[5], [1], [5], [2]]), [1, 0, 1, 0], 2)
    payload = json.loads(json.dumps(evidence.to_dict()))
    assert PriceEvidence.from_dict(payload) == evidence
    with pytest.raises(StateError, match=re.escape("`state['xx'][0]` must have at most 1 items, got 2")):
        PriceEvidence.from_dict({**payload, "xx": [[1.0, 2.0]]})
    with pytest.raises(StateError, match=re.escape("`state['rr']` must be >= 0")):
        PriceEvidence.from_dict({**payload, "rr": -1.0})
    with pytest.raises(StateError, match="`groups` must be at most `rows`"):
        PriceEvidence.from_dict({**payload, "groups": 9})
    with pytest.raises(StateError, match=re.escape("must be 'loopguard.PriceEvidence'")):
        PriceEvidence.from_dict({**payload, "kind": "loopguard.TargetedPenalty"})


_TARGETS = st.lists(
    st.one_of(
        st.builds(Target, kind=st.sampled_from(["tokens", "presence"]), token=st.integers(0, 6),
                  rate=st.floats(0.0, 2.0), source=st.just("t")),
        st.builds(Target, kind=st.just("length"), threshold=st.floats(0.0, 12.0), rate=st.floats(0.0, 2.0),
                  source=st.just("t")),
        st.builds(Target, kind=st.just("repetition"), n=st.integers(1, 4), rate=st.floats(0.0, 2.0),
                  source=st.just("t")),
    ),
    min_size=1,
    max_size=4,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(0, 6), max_size=14), min_size=1, max_size=10),
    targets=_TARGETS,
    as_tuples=st.booleans(),
)
def test_plain_id_rows_are_penalised_exactly_as_their_batch(rows, targets, as_tuples):
    # TRL hands the reward function lists of Python ints: the penalty reads them as they are (no batch is
    # built), and must give the bits the batch gives
    if as_tuples:
        rows = [tuple(row) for row in rows]
    assert plain_id_rows(rows) is rows
    penalty = TargetedPenalty(tuple(targets))
    read = penalty(rows)
    assert read.dtype == np.float64
    assert read.tobytes() == penalty(as_token_batch("completion_ids", rows)).tobytes()
    n = next((t.n for t in targets if t.kind == "repetition"), 2)
    assert row_repetition_rates(rows, n).tobytes() == repetition_rates(as_token_batch("x", rows), n).tobytes()


@pytest.mark.parametrize(
    "ids",
    [
        [],
        [[1, 2], [True]],
        [[1, -100]],
        [[1, 2**63]],
        [[np.int64(3)]],
        [np.array([1, 2])],
        ["a b"],
        ([1, 2],),  # a tuple of lists is taken; see below
    ],
)
def test_ids_that_are_not_plain_rows_take_the_batch_path_and_its_errors(ids):
    penalty = TargetedPenalty((Target(kind="tokens", token=1, rate=1.0, source="t"),))
    if isinstance(ids, tuple):
        assert plain_id_rows(ids) is ids
        assert penalty(ids).tolist() == [1.0]
        return
    assert plain_id_rows(ids) is None
    try:
        expected = penalty(as_token_batch("completion_ids", ids))
    except (InputError, LoopguardTypeError) as error:
        with pytest.raises(type(error), match=re.escape(str(error))):
            penalty(ids)
    else:
        assert penalty(ids).tobytes() == expected.tobytes()


def test_rows_past_the_caps_are_not_plain():
    assert plain_id_rows([[]] * MAX_TRAJECTORIES) is not None
    assert plain_id_rows([[]] * (MAX_TRAJECTORIES + 1)) is None  # as_token_batch names the cap
    assert plain_id_rows([[0] * (MAX_TOKENS_PER_TRAJECTORY + 1)]) is None
